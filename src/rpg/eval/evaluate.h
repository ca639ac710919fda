// Evaluation of a policy on datasets in the paper's schema: n responses per row, scored by
// the reward registry (data_source), summarised as mean@k / pass@k / maj@k per data_source.
// Used by `rpg eval` and by the trainer's validation.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "rpg/data/dataset.h"
#include "rpg/eval/metrics.h"
#include "rpg/reward/overlong.h"
#include "rpg/reward/registry.h"
#include "rpg/rollout/engine.h"
#include "rpg/rollout/policy.h"

namespace rpg::eval {

struct EvalResult {
  MetricTable metrics;            // data_source -> metric -> value
  rollout::GenerateStats stats;   // generation throughput
  std::vector<ScoredResponse> responses;
  std::vector<std::string> texts;  // decoded responses, in the order of `responses`
  std::vector<std::string> ground_truths;  // in the order of `responses`
  std::vector<int64_t> sources;    // per response: its row (evaluate) or input line (evaluate_responses), 0-based
  int64_t reward_timeouts = 0;     // responses scored reward_model.timeout_score (custom / HTTP scorers)
};

// For people reading results: one JSON line per response of `result`, in order, with
// data_source, row (see EvalResult::sources), problem, ground_truth, response, score, acc
// and pred (the extracted prediction, null when none). Written atomically.
void write_scored_responses(const std::filesystem::path& path, const EvalResult& result);

// Prompts are rendered by rollout::render_prompt with `chat_template_kwargs` (verl's
// data.apply_chat_template_kwargs). Stop tokens of the policy are added to `sampling`. Throws ValueError for an unknown
// data_source before generating anything. With `shaping`, every response also gets its
// ScoredResponse::reward: the score plus the overlong penalty of its length (a disabled
// config: the score).
EvalResult evaluate(const rollout::Policy& policy, const std::vector<data::Row>& rows,
                    const rollout::SamplingParams& sampling, const rollout::EngineOptions& engine,
                    reward::RewardScorer& scorer, bool progress = true, bool chat_template = true,
                    const tok::ChatTemplateKwargs& chat_template_kwargs = {},
                    const std::optional<reward::OverlongConfig>& shaping = std::nullopt);

// Scores a responses file written by `rpg generate` (JSON lines with data_source,
// ground_truth, prompt and response) without generating: the same metrics as evaluate().
// Responses with the same data_source and prompt form one problem. Throws IoError /
// FormatError naming the file and line, ValueError for an unknown data_source.
EvalResult evaluate_responses(const std::filesystem::path& path, reward::RewardScorer& scorer);

// "aime2024/acc/mean@32: 0.4375" lines, sorted.
std::string format_metrics(const MetricTable& metrics);

}  // namespace rpg::eval
