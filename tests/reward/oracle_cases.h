// The reward oracle's corpus: (response, ground truth) pairs scored live by verl
// (tests/oracles/reward_cases.py), loaded once per test binary.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace rpg::test {

struct OracleResult {
  double score = 0;
  bool acc = false;
  std::optional<std::string> pred;
};

struct OracleCase {
  std::string response, ground_truth;
  OracleResult dapo, strict;    // math_dapo.compute_score, default / strict_box_verify
  double light_score = 0;       // math_reward.compute_score
  std::optional<std::string> light_pred;
  std::optional<bool> math_verify;  // math-verify's verdict (subset only)
};

// Runs the oracle: the hand-written cases, `generated` answer-line variations, `soup` random
// token sequences; math-verify verdicts for the first `math_verify` cases.
std::vector<OracleCase> load_reward_oracle_cases(int generated, int math_verify, int soup);
// The shared corpus (hand-written + 6,000 generated + 20,000 token-soup pairs), loaded once
// per process.
const std::vector<OracleCase>& reward_oracle_cases();

}  // namespace rpg::test
