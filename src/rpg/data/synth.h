// Synthetic math problems for the CPU demo (`rpg data synth`): a small model can learn
// them within minutes, their answers are exact, and their difficulty is graded so that RL
// has room to improve on a partly competent SFT start. Levels:
//   0  three one-digit numbers added step by step: "What is 3 + 5 + 8?" (the CPU demo's
//      level: every held-out problem is made of additions seen in training; not in the
//      default range, and it holds only 1,000 distinct problems)
//   1  one operation:            "What is 56 / 8?"
//   2  several operations with parentheses: "Compute (7 + 5) * 3 - 4."
//   3  a linear equation with an integer solution: "Solve for x: 3x + 7 = 22."
//   4  digits: "What is the sum of the digits of 37 * 41?"
//   5  fractions: "What is 2/3 + 1/4? ..." (answer in lowest terms)
//   6  a one-digit number added to a number below 100: "What is 47 + 8?" (the real-model
//      demo's level: SmolLM2-135M-Instruct answers about a fifth of them at temperature 1
//      and RL raises that within minutes; not in the default range, 889 distinct problems)
// Answers are canonical for the DAPO rule: "42", "-7", "3/4", "-5/12" (Python's
// str(fractions.Fraction)). Every worked solution ends with the line "Answer: <answer>".
// A problem is a pure function of (difficulty, key) through Philox streams and integer
// arithmetic only, so a seed gives byte-identical files on every machine.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "rpg/data/prepare.h"

namespace rpg::data {

inline constexpr int kSynthMinDifficulty = 0;
inline constexpr int kSynthMaxDifficulty = 6;
inline constexpr int kSynthDefaultMinDifficulty = 1, kSynthDefaultMaxDifficulty = 5;

struct SynthProblem {
  std::string problem;   // the question, without the prompt template
  std::string answer;    // canonical ground truth
  std::string solution;  // worked steps; the last line is "Answer: <answer>"
  int difficulty = kSynthDefaultMinDifficulty;
  bool operator==(const SynthProblem&) const = default;
};

// One problem of the given level, chosen by `key`. ValueError for a level outside 0..6.
SynthProblem synth_problem(int difficulty, uint64_t key);

struct SynthOptions {
  uint64_t seed = 0;
  int64_t train = 2000, validation = 200, test = 200;
  int min_difficulty = kSynthDefaultMinDifficulty, max_difficulty = kSynthDefaultMaxDifficulty;
};

struct SynthSplits {
  std::vector<SynthProblem> train, validation, test;
};

// The three splits, with no problem text twice anywhere. Levels min..max are balanced
// within each split (counts differ by at most one), in a seeded random order. The test
// split is drawn first, then validation, then train, so held-out problems do not change
// when only the training set is resized. ValueError for bad sizes or levels, or when the
// levels asked for do not hold enough distinct problems.
SynthSplits synth_splits(const SynthOptions& options);

struct SynthWriteOptions {
  std::string data_source = "math_dapo";
  PromptStyle prompt_style = PromptStyle::kDapo;
  int64_t repeat_test = 1;  // k: test rows per problem (extra_info.index 0..k-1, acc@k)
};

// File names inside the output directory, per split ("train", "validation", "test").
std::string synth_parquet_name(const std::string& split);  // "<split>.parquet"
std::string synth_sft_name(const std::string& split);      // "<split>_sft.jsonl"

// One JSON object per line: {"prompt", "response", "problem", "answer", "difficulty"},
// where prompt is the templated user message and response the worked solution (SFT pairs).
std::string synth_sft_jsonl(const std::vector<SynthProblem>& problems);

// Writes <split>.parquet (the paper's schema, extra_info.split set) and <split>_sft.jsonl
// for the three splits into `out_dir` (created when missing), each file atomically.
// ValueError for repeat_test < 1 or an empty data_source; IoError / FormatError from I/O.
void write_synth(const std::filesystem::path& out_dir, const SynthSplits& splits, const SynthWriteOptions& options);

}  // namespace rpg::data
