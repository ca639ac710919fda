#include "rpg/reward/reward_spec.h"

#include "rpg/core/error.h"

namespace rpg::reward {

std::unique_ptr<RewardScorer> make_reward_scorer(const RewardSpec& spec, ScorerRegistry builtin) {
  if (!spec.python.path.empty() && !spec.http.url.empty())
    throw ConfigError(str("custom_reward_function.path (", spec.python.path, ") and reward_model.url (", spec.http.url,
                          ") are both set: score with one of them"));
  if (!spec.python.path.empty()) return make_python_scorer(spec.python);
  if (!spec.http.url.empty()) return make_http_scorer(spec.http);
  return make_builtin_scorer(std::move(builtin));
}

}  // namespace rpg::reward
