// The trainer tests' learnable task: 8 prompts "Write a word number i" (data source
// "letters", ground truth "e") and a reward that a random tiny model can raise.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "rpg/data/dataset.h"
#include "rpg/reward/registry.h"

namespace rpg::train::test_task {

// Writes the 8 prompts to `file` (Parquet, the paper's schema).
inline void write_letters_data(const std::filesystem::path& file) {
  std::vector<data::Row> rows;
  for (int i = 0; i < 8; ++i) {
    data::Row r;
    r.data_source = "letters";
    r.prompt = {{"Write a word number " + std::to_string(i), "user"}};
    r.reward_model.ground_truth = "e";
    rows.push_back(r);
  }
  data::write_parquet(file, rows);
}

// The fraction of the response's characters that are the ground-truth letter, scaled to
// [-1, 1]: varied within every group, and learnable by a random model.
inline reward::ScorerRegistry letters_scorers() {
  reward::ScorerRegistry r;
  r.add("letters", "test: frequency of one letter", [](std::string_view response, std::string_view gt) {
    double hits = 0;
    for (char c : response) hits += c == gt[0];
    reward::ScoreResult s;
    s.score = response.empty() ? -1.0 : 2.0 * hits / static_cast<double>(response.size()) - 1.0;
    s.acc = hits > 0;
    return s;
  });
  return r;
}

}  // namespace rpg::train::test_task
