// The DAPO math reward (data sources math-dapo / math_dapo / aime* / amc*): the answer after
// the last "Answer:" line, normalised (Minerva / lm-eval-harness rules: units, \text{},
// \boxed{}, dollars, spaces, thousands separators, \frac / \sqrt shorthand...), compared
// with the normalised ground truth; falls back to the last \boxed{} of the final 100
// characters when there is no "Answer:" (verl 0.9.1; the authors' fork has no fallback:
// dapo_score_fork). Score +1 / -1, acc 0/1.
//
// Behaviour is that of verl.utils.reward_score.math_dapo.compute_score (verl 0.9.1),
// character for character: strings are handled as Python `str` (code points), and a
// byte that is not valid UTF-8 counts as one character (see text.h). Every function runs
// in time linear in its input (the response is cut to its last 300 characters first).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "rpg/reward/score.h"

namespace rpg::reward {

// normalize_final_answer of math_dapo.
std::string dapo_normalize(std::string_view answer);

// The text captured by the last match of (?i)Answer\s*:\s*([^\n]+), or nullopt.
std::optional<std::string> dapo_extract_answer(std::string_view response);

// The last "\boxed{...}" with balanced braces (including "\boxed{" and the closing "}"),
// or nullopt when there is none or it never closes.
std::optional<std::string> last_boxed_only_string(std::string_view text);

// compute_score(response, ground_truth, strict_box_verify). In strict-box mode the
// prediction is the raw content of the last \boxed{} in the final 100 characters, compared
// with the raw ground truth; pred is nullopt when there is no box.
ScoreResult dapo_score(std::string_view response, std::string_view ground_truth, bool strict_box = false);

// The authors' fork's math_dapo.compute_score (complex-reasoning/RPG @ ec8e30bd): the same
// rule WITHOUT the \boxed{} fallback. A response that only boxes its answer (what Qwen-Math
// models do by default) has pred "[INVALID]" and scores -1 here, +1 with dapo_score when the
// box is right. Strict-box mode is identical to dapo_score's.
ScoreResult dapo_score_fork(std::string_view response, std::string_view ground_truth, bool strict_box = false);

}  // namespace rpg::reward
