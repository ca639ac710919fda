// Reward scorers chosen by data_source. One signature for every scorer,
//   score(response_text, ground_truth) -> {score, acc, pred},
// one registry filled by one explicit function (register_builtin_scorers), one dispatch
// path. A key ending in '*' matches every data_source with that prefix ("aime*"); an exact
// key wins over a prefix, a longer prefix over a shorter one. An unknown data_source is a
// ValueError that lists the known keys.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rpg/reward/score.h"
#include "rpg/reward/scorer.h"

namespace rpg::reward {

using ScoreFn = std::function<ScoreResult(std::string_view response, std::string_view ground_truth)>;

// Options of the built-in scorers.
struct ScorerOptions {
  bool strict_box_verify = false;  // DAPO: judge only the last \boxed{} of the final 100 characters
  // Which DAPO rule the math-dapo / aime* / amc* data sources use (dapo_variant_names()):
  //   "math_dapo"       verl 0.9.1: last "Answer:" line, else the last \boxed{} (the default)
  //   "math_dapo_fork"  the authors' fork (ec8e30bd): "Answer:" only, no \boxed{} fallback
  std::string dapo_variant = "math_dapo";
};

// The valid ScorerOptions::dapo_variant values.
std::vector<std::string> dapo_variant_names();

class ScorerRegistry {
 public:
  // `key` is an exact data_source or a prefix followed by '*'. Duplicate keys are a ValueError.
  void add(std::string key, std::string description, ScoreFn fn);
  // The scorer of `data_source`; ValueError listing the known keys when none matches.
  const ScoreFn& find(std::string_view data_source) const;
  bool contains(std::string_view data_source) const;
  // Registered keys in registration order, with their descriptions.
  std::vector<std::pair<std::string, std::string>> entries() const;

 private:
  struct Entry {
    std::string key, description;
    ScoreFn fn;
  };
  const Entry* match(std::string_view data_source) const;
  std::vector<Entry> entries_;
};

// The one registration function: math-dapo / math_dapo / math / math_dapo_reasoning /
// aime* / amc* -> the DAPO rule of options.dapo_variant (ValueError naming dapo_variant when
// unknown); math_dapo_fork / math_dapo_verl -> that variant whatever the option; lighteval/MATH, DigitalLearningGmbH/MATH-lighteval,
// HuggingFaceH4/MATH-500 -> the lighteval boxed rule.
void register_builtin_scorers(ScorerRegistry& registry, const ScorerOptions& options = {});
ScorerRegistry builtin_scorers(const ScorerOptions& options = {});

// Scores every request with `threads` worker threads (0: hardware concurrency). Results are
// in request order. Every data_source is resolved before any work starts, so an unknown one
// fails the whole batch with a ValueError.
std::vector<ScoreResult> score_batch(const ScorerRegistry& registry, std::span<const ScoreRequest> requests,
                                     int threads = 0);

}  // namespace rpg::reward
