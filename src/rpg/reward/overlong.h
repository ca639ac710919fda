// DAPO overlong reward shaping, a step separate from scoring: a response whose length
// L (tokens) falls in the last `len` tokens before `max_response_length` gets
//   penalty = min(-(L - (max_response_length - len)) / len * penalty_factor, 0)
// added to its score (verl's DAPORewardManager overlong_buffer: len, penalty_factor).
#pragma once

#include <cstdint>
#include <span>

namespace rpg::reward {

struct OverlongConfig {
  bool enable = false;              // apply the penalty at all
  int64_t len = 512;                // overlong_buffer.len: tokens before the maximum where the penalty ramps up (> 0)
  double penalty_factor = 1.0;      // penalty at (and beyond) the maximum length
  int64_t max_response_length = 0;  // the rollout's maximum response length (>= len)
};

// Throws ValueError naming the field when an enabled config is invalid.
void validate(const OverlongConfig& config);

// The (non-positive) penalty for one response of `response_length` tokens; 0 when disabled.
double overlong_penalty(const OverlongConfig& config, int64_t response_length);

// scores[i] += overlong_penalty(config, lengths[i]). Sizes must match (ValueError).
void apply_overlong_penalty(const OverlongConfig& config, std::span<const int64_t> lengths, std::span<double> scores);

}  // namespace rpg::reward
