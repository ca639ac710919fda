// A reward service over HTTP (reward_model.url, `rpg eval --reward-url`): each batch of
// responses is POSTed as JSON
//   [{"data_source": ..., "solution_str": ..., "ground_truth": ..., "extra_info": {...}|null}, ...]
// and answered with one entry per response, in order: a number, or an object with a numeric
// "score" (optional "acc" (bool or number) and "pred" (string); other numeric keys become
// RewardScores::extra). libcurl does the HTTP (keep-alive connections reused across
// batches and steps).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "rpg/reward/scorer.h"

namespace rpg::reward {

struct HttpRewardOptions {
  std::string url;                 // http://host:port/path (reward_model.url)
  int64_t batch_size = 64;         // responses per POST
  int64_t max_concurrency = 4;     // POSTs in flight at once (reward_model.num_workers)
  double timeout_s = 10.0;         // a POST not answered within this is abandoned (no retry):
                                   // each of its responses scores timeout_score and counts in timeouts
  double timeout_score = 0.0;
  int64_t max_retries = 3;         // connection errors (refused, reset, closed without a reply)
                                   // are retried with exponential backoff, then an IoError
  double retry_backoff_s = 0.2;    // first backoff; doubles per retry
};

// Throws ValueError for an invalid option (empty / non-http URL, batch_size < 1, ...).
std::unique_ptr<RewardScorer> make_http_scorer(const HttpRewardOptions& options);

}  // namespace rpg::reward
