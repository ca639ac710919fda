// One interface for every way of scoring a batch of responses: the built-in rule scorers
// (chosen by data_source, registry.h), a user's Python function run in a pool of worker
// processes (python_pool.h, verl's custom_reward_function), and a reward service over HTTP
// (http_scorer.h, reward_model.url). The trainer and `rpg eval` see only RewardScorer;
// make_reward_scorer (reward_spec.h) picks one from the configuration.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rpg/reward/score.h"

namespace rpg::reward {

class ScorerRegistry;

struct ScoreRequest {
  std::string_view data_source;
  std::string_view response;  // verl's solution_str: the decoded response
  std::string_view ground_truth;
  std::string_view extra_info = {};  // the row's extra_info as a JSON object; empty: null
};

struct RewardScores {
  std::vector<ScoreResult> results;  // in request order
  // A dict result's other numeric keys (verl's reward_extra_info), one value per request;
  // NaN where a response's result lacks the key. Logged as reward/extra/<key>/mean.
  std::map<std::string, std::vector<double>> extra;
  int64_t timeouts = 0;  // responses scored reward_model.timeout_score because the scorer did not answer in time
};

class RewardScorer {
 public:
  virtual ~RewardScorer() = default;
  // Throws ValueError when this scorer cannot score `data_source` (the built-in rules know
  // a fixed set); called for every row before generating, so a bad dataset fails early.
  virtual void check_data_source(std::string_view data_source) const = 0;
  // Scores every request; the result is in request order. Throws on a scorer that cannot
  // answer at all (a Python function that raises, a service that refuses the request).
  virtual RewardScores score(std::span<const ScoreRequest> requests) = 0;
  // One line for logs and the run report, e.g. "custom_reward_function /x/r.py:compute_score".
  virtual std::string describe() const = 0;
};

// The built-in rule scorers of `registry`, scored with `threads` threads (0: all cores).
std::unique_ptr<RewardScorer> make_builtin_scorer(ScorerRegistry registry, int threads = 0);

}  // namespace rpg::reward
