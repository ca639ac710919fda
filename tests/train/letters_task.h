// The trainer tests' learnable task: 8 prompts "Write a word number i" (data source
// "letters", ground truth "e") and a reward that a random tiny model can raise.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "rpg/data/dataset.h"
#include "rpg/reward/registry.h"

namespace rpg::train::test_task {

// Writes the 8 prompts to `file` (Parquet, the paper's schema); prompt i's ground truth is
// truths[i % truths.size()].
inline void write_letters_data(const std::filesystem::path& file, const std::vector<std::string>& truths = {"e"}) {
  std::vector<data::Row> rows;
  for (int i = 0; i < 8; ++i) {
    data::Row r;
    r.data_source = "letters";
    r.prompt = {{"Write a word number " + std::to_string(i), "user"}};
    r.reward_model.ground_truth = truths[static_cast<size_t>(i) % truths.size()];
    rows.push_back(r);
  }
  data::write_parquet(file, rows);
}

// The fraction of the response's characters that are the ground-truth letter, scaled to
// [-1, 1]: varied within every group, and learnable by a random model.
// never_acc_unless_e: acc stays false for ground truths other than "e" (every such group has equal
// acc, which dynamic sampling drops).
inline reward::ScorerRegistry letters_scorers(bool never_acc_unless_e = false) {
  reward::ScorerRegistry r;
  r.add("letters", "test: frequency of one letter", [never_acc_unless_e](std::string_view response, std::string_view gt) {
    double hits = 0;
    for (char c : response) hits += c == gt[0];
    reward::ScoreResult s;
    s.score = response.empty() ? -1.0 : 2.0 * hits / static_cast<double>(response.size()) - 1.0;
    s.acc = hits > 0 && (!never_acc_unless_e || gt == "e");
    return s;
  });
  return r;
}

}  // namespace rpg::train::test_task
