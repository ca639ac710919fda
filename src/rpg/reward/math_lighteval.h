// The lighteval/MATH boxed-answer reward (data sources lighteval/MATH,
// DigitalLearningGmbH/MATH-lighteval, HuggingFaceH4/MATH-500): the content of the last
// \boxed{...} (or "\boxed " up to the next "$", or \fbox), compared with the ground truth
// after the Hendrycks MATH string normalisation (strip_string: \left/\right, tfrac/dfrac,
// degrees, \$, units after "\text{ ", percent, leading zeros of decimals, "k = ",
// \sqrt / \frac shorthand, spaces, 0.5 and a/b -> \frac). Score 1 / 0.
//
// Behaviour is that of verl.utils.reward_score.math_reward.compute_score (verl 0.9.1),
// including where that code raises internally (then the raw strings are compared, or the
// score is 0), with strings handled as Python `str` (see text.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "rpg/reward/score.h"

namespace rpg::reward {

// strip_string of the Hendrycks MATH normaliser; nullopt where the Python code raises.
std::optional<std::string> lighteval_strip_string(std::string_view s);

// is_equiv(a, b): strip_string on both sides, raw comparison when normalisation raises.
bool lighteval_is_equiv(std::string_view a, std::string_view b);

// compute_score(response, ground_truth); pred is the boxed content (nullopt when none).
ScoreResult lighteval_score(std::string_view response, std::string_view ground_truth);

}  // namespace rpg::reward
