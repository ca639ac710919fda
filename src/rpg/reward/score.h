// The one result type every reward scorer returns.
#pragma once

#include <optional>
#include <string>

namespace rpg::reward {

struct ScoreResult {
  double score = 0.0;               // the reward (DAPO: +1 / -1; lighteval: 1 / 0)
  bool acc = false;                 // 0/1 correctness
  std::optional<std::string> pred;  // the extracted / normalised answer, for logging and maj@k
};

}  // namespace rpg::reward
