// Which scorer a run uses, decided in one place for `rpg train` and `rpg eval`: a user's
// Python function (custom_reward_function.path), else a reward service (reward_model.url),
// else the built-in rule scorers chosen by data_source.
#pragma once

#include <memory>

#include "rpg/reward/http_scorer.h"
#include "rpg/reward/python_pool.h"
#include "rpg/reward/registry.h"

namespace rpg::reward {

struct RewardSpec {
  PythonRewardOptions python;  // used when python.path is set
  HttpRewardOptions http;      // used when http.url is set
};

// ConfigError when both a function and a URL are given.
std::unique_ptr<RewardScorer> make_reward_scorer(const RewardSpec& spec, ScorerRegistry builtin);

}  // namespace rpg::reward
