// `rpg data synth`: seeded, disjoint splits, balanced levels, and answers that both the real
// DAPO scorer and an independent Python evaluation (tests/oracles/data_synth_check.py) accept.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/data/dataset.h"
#include "rpg/data/prepare.h"
#include "rpg/data/synth.h"
#include "rpg/reward/registry.h"
#include "test_util.h"

namespace rpg::test {
namespace {

using data::SynthProblem;

data::SynthOptions sized(uint64_t seed, int64_t train, int64_t validation, int64_t test) {
  data::SynthOptions o;
  o.seed = seed;
  o.train = train;
  o.validation = validation;
  o.test = test;
  return o;
}

std::vector<SynthProblem> all_of(const data::SynthSplits& s) {
  std::vector<SynthProblem> all = s.train;
  all.insert(all.end(), s.validation.begin(), s.validation.end());
  all.insert(all.end(), s.test.begin(), s.test.end());
  return all;
}

std::string last_line(const std::string& text) { return text.substr(text.rfind('\n') + 1); }

// A different value in the same canonical form: 42 -> 43, -7 -> -6, 3/4 -> 4/4.
std::string perturbed(const std::string& answer) {
  const size_t slash = answer.find('/');
  if (slash == std::string::npos) return std::to_string(std::stoll(answer) + 1);
  return std::to_string(std::stoll(answer.substr(0, slash)) + 1) + answer.substr(slash);
}

TEST(Synth, SameSeedSameProblemsOtherSeedOthers) {
  const auto a = data::synth_splits(sized(11, 400, 50, 50));
  const auto b = data::synth_splits(sized(11, 400, 50, 50));
  const auto c = data::synth_splits(sized(12, 400, 50, 50));
  EXPECT_EQ(a.train, b.train);
  EXPECT_EQ(a.validation, b.validation);
  EXPECT_EQ(a.test, b.test);
  std::set<std::string> other;
  for (const auto& p : all_of(c)) other.insert(p.problem);
  int shared = 0;
  for (const auto& p : all_of(a)) shared += other.count(p.problem) ? 1 : 0;
  // Another seed may repeat a few small one-step sums, never most of the set.
  EXPECT_LT(shared, 50) << "seeds 11 and 12 share " << shared << " of 500 problems";
  EXPECT_EQ(data::synth_problem(3, 99), data::synth_problem(3, 99));
  EXPECT_NE(data::synth_problem(3, 99), data::synth_problem(3, 100));
}

// Pins the bytes a seed produces: Philox and integer arithmetic only, so this holds on every
// machine and standard library. A change here changes every synthetic dataset.
TEST(Synth, PinnedProblemsForSeedZero) {
  const auto s = data::synth_splits(sized(0, 5, 5, 5));
  std::vector<std::string> got;
  for (const auto& p : s.test) got.push_back(p.problem + " => " + p.solution);
  const std::vector<std::string> want = {
      "Evaluate 11 + 31. => 11 + 31 = 42.\nAnswer: 42",
      "Compute 1 * 3 - (1 + 12). => 1 * 3 - (1 + 12)\n= 3 - (1 + 12)\n= 3 - 13\n= -10\nAnswer: -10",
      "Solve for y: -2y + 10 = 26. => -2y + 10 = 26\nSubtract 10 from both sides: -2y = 16.\n"
      "Divide both sides by -2: y = -8.\nAnswer: -8",
      "What is the sum of the digits of 3834? => The digits of 3834 are 3, 8, 3, 4.\n3 + 8 + 3 + 4 = 18.\nAnswer: 18",
      "What is 1/2 * 1/2? Write the answer in lowest terms. => 1/2 * 1/2 = (1 * 1)/(2 * 2) = 1/4.\nAnswer: 1/4",
  };
  EXPECT_EQ(got, want);
}

TEST(Synth, SplitsAreDisjointAndSized) {
  const auto s = data::synth_splits(sized(5, 3000, 300, 300));
  ASSERT_EQ(s.train.size(), 3000u);
  ASSERT_EQ(s.validation.size(), 300u);
  ASSERT_EQ(s.test.size(), 300u);
  std::map<std::string, int> seen;
  for (const auto& p : all_of(s)) ++seen[p.problem];
  for (const auto& [problem, n] : seen) EXPECT_EQ(n, 1) << problem;
  EXPECT_EQ(seen.size(), 3600u);
  // The same equation under another variable letter is the same problem: it must not appear
  // twice either.
  std::set<std::string> equations;
  for (const auto& p : all_of(s)) {
    if (p.difficulty != 3) continue;
    std::string e = p.problem.substr(p.problem.find(':'));
    std::replace(e.begin(), e.end(), p.problem[10], 'v');
    EXPECT_TRUE(equations.insert(e).second) << p.problem;
  }
}

TEST(Synth, HeldOutSplitsDoNotDependOnTheTrainingSize) {
  const auto small = data::synth_splits(sized(8, 10, 40, 40));
  const auto large = data::synth_splits(sized(8, 2000, 40, 40));
  EXPECT_EQ(small.test, large.test);
  EXPECT_EQ(small.validation, large.validation);
  // Training slots are drawn in the same order, so the small set is the start of the large one.
  std::set<std::string> large_train;
  for (const auto& p : large.train) large_train.insert(p.problem);
  for (const auto& p : small.train) EXPECT_TRUE(large_train.count(p.problem)) << p.problem;
}

TEST(Synth, LevelsStayWithinBoundsAndAreBalanced) {
  for (auto [lo, hi] : {std::pair{1, 5}, std::pair{2, 4}, std::pair{5, 5}, std::pair{1, 1}, std::pair{0, 1}}) {
    auto o = sized(3, 997, 101, 53);
    o.min_difficulty = lo;
    o.max_difficulty = hi;
    const auto s = data::synth_splits(o);
    for (const auto* split : {&s.train, &s.validation, &s.test}) {
      std::map<int, int64_t> counts;
      for (const auto& p : *split) {
        ASSERT_GE(p.difficulty, lo);
        ASSERT_LE(p.difficulty, hi);
        ++counts[p.difficulty];
      }
      const int64_t levels = hi - lo + 1, n = static_cast<int64_t>(split->size());
      ASSERT_EQ(static_cast<int64_t>(counts.size()), levels);
      for (auto [level, count] : counts) {
        EXPECT_GE(count, n / levels) << "level " << level;
        EXPECT_LE(count, n / levels + 1) << "level " << level;
      }
    }
  }
}

// The worked solution is what SFT teaches; the DAPO rule is what RL rewards. They must agree.
TEST(Synth, DapoScorerAcceptsEveryWorkedSolutionAndRejectsAWrongAnswer) {
  const auto registry = reward::builtin_scorers();
  const auto& score = registry.find("math_dapo");
  auto o = sized(21, 4000, 500, 500);
  o.min_difficulty = 0;
  const auto s = data::synth_splits(o);
  std::map<int, int> checked;
  for (const auto& p : all_of(s)) {
    ASSERT_EQ(last_line(p.solution), "Answer: " + p.answer) << p.solution;
    auto right = score(p.solution, p.answer);
    EXPECT_EQ(right.score, 1.0) << p.problem << "\n" << p.solution;
    EXPECT_TRUE(right.acc) << p.problem;
    const std::string wrong = perturbed(p.answer);
    ASSERT_NE(wrong, p.answer);
    auto against_wrong_truth = score(p.solution, wrong);
    EXPECT_EQ(against_wrong_truth.score, -1.0) << p.problem << " vs " << wrong;
    std::string wrong_response = p.solution.substr(0, p.solution.rfind('\n') + 1) + "Answer: " + wrong;
    auto wrong_answer = score(wrong_response, p.answer);
    EXPECT_EQ(wrong_answer.score, -1.0) << p.problem << " answered " << wrong;
    EXPECT_FALSE(wrong_answer.acc);
    ++checked[p.difficulty];
  }
  EXPECT_EQ(checked.size(), 6u);
  // Negative and fractional ground truths are among those scored.
  bool negative = false, fraction = false;
  for (const auto& p : all_of(s)) negative |= p.answer[0] == '-', fraction |= p.answer.find('/') != std::string::npos;
  EXPECT_TRUE(negative);
  EXPECT_TRUE(fraction);
}

std::string with_line_replaced(std::string jsonl, size_t line, const std::function<void(nlohmann::json&)>& edit) {
  std::istringstream in(jsonl);
  std::string out, l;
  for (size_t i = 0; std::getline(in, l); ++i) {
    if (i == line) {
      auto j = nlohmann::json::parse(l);
      edit(j);
      l = j.dump();
    }
    out += l + "\n";
  }
  return out;
}

TEST(Synth, PythonOracleRederivesEveryAnswer) {
  TempDir dir;
  auto o = sized(33, 3000, 300, 300);
  o.min_difficulty = 0;
  o.max_difficulty = data::kSynthMaxDifficulty;
  const auto s = data::synth_splits(o);
  for (auto [name, split] : {std::pair{"train", &s.train}, std::pair{"validation", &s.validation},
                             std::pair{"test", &s.test}}) {
    write_file_atomic(dir / (std::string(name) + ".jsonl"), data::synth_sft_jsonl(*split));
    auto r = run_oracle("data_synth_check.py", {(dir / (std::string(name) + ".jsonl")).string()});
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["checked"], split->size());
    EXPECT_EQ(j["levels"].size(), 7u);
  }
}

// The oracle's own verdict, not a crash: it names how many problems it found wrong.
void expect_oracle_rejects(const std::filesystem::path& file, const std::string& what) {
  try {
    run_oracle("data_synth_check.py", {file.string()});
    ADD_FAILURE() << "the oracle accepted " << what;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("1 of 200 problems wrong"), std::string::npos) << what << ": " << e.what();
  }
}

// The oracle is only worth something if it catches a wrong answer at every level, even one
// whose "Answer:" line was changed consistently, and a wrong intermediate step.
TEST(Synth, PythonOracleRejectsWrongAnswersAndSteps) {
  TempDir dir;
  auto o = sized(34, 200, 10, 10);
  o.min_difficulty = 0;
  o.max_difficulty = data::kSynthMaxDifficulty;
  const auto problems = data::synth_splits(o).train;
  const std::string good = data::synth_sft_jsonl(problems);
  std::map<int, size_t> first_of_level;
  for (size_t i = 0; i < problems.size(); ++i) first_of_level.emplace(problems[i].difficulty, i);
  ASSERT_EQ(first_of_level.size(), 7u);
  const auto path = dir / "bad.jsonl";
  for (auto [level, line] : first_of_level) {
    write_file_atomic(path, with_line_replaced(good, line, [](nlohmann::json& j) {
                        const std::string wrong = perturbed(j["answer"]), response = j["response"];
                        j["answer"] = wrong;
                        j["response"] = response.substr(0, response.rfind('\n') + 1) + "Answer: " + wrong;
                      }));
    expect_oracle_rejects(path, "a wrong level-" + std::to_string(level) + " answer");
  }
  // A level-2 step that no longer equals the expression.
  const size_t two = first_of_level.at(2);
  write_file_atomic(path, with_line_replaced(good, two, [](nlohmann::json& j) {
                      std::string response = j["response"];
                      const size_t eq = response.find("\n= ");
                      response.insert(eq + 3, "1 + ");
                      j["response"] = response;
                    }));
  expect_oracle_rejects(path, "a wrong level-2 step");
  // A level-0 partial sum that is off by one (the final sum still right).
  write_file_atomic(path, with_line_replaced(good, first_of_level.at(0), [](nlohmann::json& j) {
                      std::string response = j["response"];
                      const size_t eq = response.find("\n= ") + 3;
                      const size_t end = response.find(' ', eq);
                      response.replace(eq, end - eq, std::to_string(std::stoi(response.substr(eq, end - eq)) + 1));
                      j["response"] = response;
                    }));
  expect_oracle_rejects(path, "a wrong level-0 partial sum");
  write_file_atomic(path, good);
  EXPECT_NO_THROW(run_oracle("data_synth_check.py", {path.string()}));
}

// The few-shot chat prompt of the real-model demo: a system line, two worked exchanges whose
// answers are right, then the problem; level 6 never asks the examples themselves.
TEST(Synth, FewShotPromptsAndLevelSix) {
  TempDir dir;
  auto o = sized(5, 300, 50, 100);
  o.min_difficulty = o.max_difficulty = 6;
  const auto s = data::synth_splits(o);
  data::SynthWriteOptions w;
  w.prompt_style = data::PromptStyle::kFewShot;
  data::write_synth(dir.path(), s, w);
  const auto rows = data::read_parquet(dir / "test.parquet");
  ASSERT_EQ(rows.size(), 100u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& p = rows[i].prompt;
    ASSERT_EQ(p.size(), 6u);
    const std::vector<std::string> roles = {"system", "user", "assistant", "user", "assistant", "user"};
    for (size_t k = 0; k < 6; ++k) EXPECT_EQ(p[k].role, roles[k]);
    EXPECT_EQ(p[1].content, "What is 4 + 3?");
    EXPECT_EQ(p[2].content, "Answer: 7");
    EXPECT_EQ(p[3].content, "What is 12 + 5?");
    EXPECT_EQ(p[4].content, "Answer: 17");
    EXPECT_EQ(p[5].content, s.test[i].problem);
    EXPECT_NE(p[5].content, p[1].content);
    EXPECT_NE(p[5].content, p[3].content);
    int a = 0, b = 0;
    ASSERT_EQ(std::sscanf(p[5].content.c_str(), "What is %d + %d?", &a, &b), 2) << p[5].content;
    EXPECT_EQ(rows[i].reward_model.ground_truth, std::to_string(a + b));
  }
  EXPECT_EQ(data::parse_prompt_style("dapo"), data::PromptStyle::kDapo);
  EXPECT_THROW(data::parse_prompt_style("few-shot"), ValueError);
  // 889 distinct problems: asking for nearly all of them fails with the level named.
  auto too_many = sized(5, 880, 5, 5);
  too_many.min_difficulty = too_many.max_difficulty = 6;
  EXPECT_THROW(data::synth_splits(too_many), ValueError);
}

TEST(Synth, BadOptionsAreValueErrors) {
  EXPECT_THROW(data::synth_problem(-1, 1), ValueError);
  EXPECT_THROW(data::synth_problem(7, 1), ValueError);
  auto o = sized(0, 10, 10, 10);
  o.min_difficulty = 4;
  o.max_difficulty = 3;
  EXPECT_THROW(data::synth_splits(o), ValueError);
  EXPECT_THROW(data::synth_splits(sized(0, 0, 10, 10)), ValueError);
  EXPECT_THROW(data::synth_splits(sized(0, 10, -1, 10)), ValueError);
  // Level 1 holds about 16,000 distinct problems: asking for more must fail, not hang.
  auto exhausted = sized(0, 20000, 10, 10);
  exhausted.max_difficulty = 1;
  try {
    data::synth_splits(exhausted);
    ADD_FAILURE() << "expected a ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("ran out of distinct level-1 problems"), std::string::npos) << e.what();
  }
  TempDir dir;
  data::SynthWriteOptions w;
  w.repeat_test = 0;
  EXPECT_THROW(data::write_synth(dir.path(), data::synth_splits(sized(0, 2, 2, 2)), w), ValueError);
}

TEST(Synth, WritesParquetAndSftPairsPerSplit) {
  TempDir dir;
  const auto s = data::synth_splits(sized(2, 30, 6, 7));
  data::SynthWriteOptions w;
  w.data_source = "synth_math";
  w.repeat_test = 3;
  data::write_synth(dir / "out", s, w);
  for (auto [name, split, repeat] : {std::tuple{"train", &s.train, 1}, std::tuple{"validation", &s.validation, 1},
                                     std::tuple{"test", &s.test, 3}}) {
    auto rows = data::read_parquet(dir / "out" / data::synth_parquet_name(name));
    ASSERT_EQ(rows.size(), split->size() * repeat) << name;
    for (size_t i = 0; i < rows.size(); ++i) {
      const auto& p = (*split)[i / repeat];
      EXPECT_EQ(rows[i].data_source, "synth_math");
      ASSERT_EQ(rows[i].prompt.size(), 1u);
      EXPECT_EQ(rows[i].prompt[0].role, "user");
      EXPECT_EQ(rows[i].prompt[0].content, data::apply_prompt_template(p.problem));
      EXPECT_EQ(rows[i].reward_model.ground_truth, p.answer);
      EXPECT_EQ(rows[i].extra_info.raw_problem, p.problem);
      EXPECT_EQ(rows[i].extra_info.index, static_cast<int64_t>(i % repeat));
      EXPECT_EQ(rows[i].extra_info.split, std::optional<std::string>(name));
    }
    std::istringstream in(read_file(dir / "out" / data::synth_sft_name(name)));
    std::string line;
    size_t n = 0;
    for (; std::getline(in, line); ++n) {
      auto j = nlohmann::json::parse(line);
      const auto& p = (*split)[n];
      EXPECT_EQ(j["prompt"], data::apply_prompt_template(p.problem));
      EXPECT_EQ(j["response"], p.solution);
      EXPECT_EQ(j["answer"], p.answer);
      EXPECT_EQ(j["difficulty"], p.difficulty);
    }
    EXPECT_EQ(n, split->size());
  }
}

ProcessResult rpg(std::vector<std::string> args) {
  args.insert(args.begin(), rpg_binary().string());
  return run_process(args);
}

TEST(Synth, CliWritesByteIdenticalFilesThatShowAndPyarrowRead) {
  TempDir dir;
  const std::vector<std::string> opts = {"--seed", "4", "--train", "60", "--val", "8", "--test", "9", "--repeat-test", "2",
                                         "--min-difficulty", "2", "--max-difficulty", "4"};
  for (const char* out : {"a", "b"}) {
    std::vector<std::string> args = {"data", "synth", (dir / out).string()};
    args.insert(args.end(), opts.begin(), opts.end());
    auto r = rpg(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  for (const char* split : {"train", "validation", "test"}) {
    for (const auto& file : {data::synth_parquet_name(split), data::synth_sft_name(split)})
      EXPECT_EQ(read_file(dir / "a" / file), read_file(dir / "b" / file)) << file;
  }
  auto shown = rpg({"data", "show", (dir / "a" / "test.parquet").string(), "--rows", "1"});
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_NE(shown.out.find("rows: 18 "), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("\"data_source\":\"math_dapo\""), std::string::npos) << shown.out;
  EXPECT_EQ(run_oracle("parquet_info.py", {(dir / "a" / "train.parquet").string()}).out, "60\n");
  auto oracle = run_oracle("data_synth_check.py", {(dir / "a" / "train_sft.jsonl").string()});
  EXPECT_EQ(nlohmann::json::parse(oracle.out)["levels"], nlohmann::json({{"2", 20}, {"3", 20}, {"4", 20}}));
}

TEST(Synth, CliRejectsBadArgumentsInOneLine) {
  TempDir dir;
  for (const auto& bad : std::vector<std::vector<std::string>>{{"--min-difficulty", "-1"},
                                                               {"--max-difficulty", "7"},
                                                               {"--prompt-style", "few-shot"},
                                                               {"--min-difficulty", "4", "--max-difficulty", "2"},
                                                               {"--train", "0"},
                                                               {"--repeat-test", "0"},
                                                               {"--seed", "-1"},
                                                               {"--data-source", ""}}) {
    std::vector<std::string> args = {"data", "synth", (dir / "out").string()};
    args.insert(args.end(), bad.begin(), bad.end());
    auto r = rpg(args);
    EXPECT_EQ(r.exit_code, 2) << bad[0];
    EXPECT_EQ(r.err.rfind("rpg: error: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(bad[0]), std::string::npos) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
}

}  // namespace
}  // namespace rpg::test
