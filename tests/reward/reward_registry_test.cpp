// The scorer registry (dispatch by data_source, errors), batched multi-threaded scoring and
// DAPO overlong shaping. Expected scores come from verl (the oracle corpus) or are computed
// by hand from the closed form.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "oracle_cases.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/reward/overlong.h"
#include "rpg/reward/registry.h"
#include "test_util.h"

namespace rpg::test {
namespace {

using reward::ScoreRequest;

// A smaller corpus than the parity test's (this binary's tests run as separate processes).
const std::vector<OracleCase>& cases_for_dispatch() {
  static const std::vector<OracleCase> cases = load_reward_oracle_cases(2000, 0, 2000);
  return cases;
}

TEST(RewardRegistry, UnknownDataSourceListsTheKnownOnes) {
  auto reg = reward::builtin_scorers();
  try {
    reg.find("openai/gsm8k");
    FAIL() << "no error";
  } catch (const ValueError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'openai/gsm8k'"), std::string::npos) << m;
    for (const char* k : {"math-dapo", "math_dapo", "aime*", "amc*", "lighteval/MATH"})
      EXPECT_NE(m.find(k), std::string::npos) << k << " missing from: " << m;
  }
  EXPECT_FALSE(reg.contains("ai"));
  EXPECT_FALSE(reg.contains("Math_dapo"));
  EXPECT_TRUE(reg.contains("aime"));
}

// docs/rewards.md's data_source table lists every key the registry holds (the "how to add a
// scorer" step of docs/architecture.md), in both DAPO variants.
TEST(RewardRegistry, EveryDataSourceIsDocumented) {
  const std::string doc = read_file(source_dir() / "docs" / "rewards.md");
  ASSERT_FALSE(doc.empty()) << "docs/rewards.md";
  for (const char* variant : {"math_dapo", "math_dapo_fork"}) {
    reward::ScorerOptions options;
    options.dapo_variant = variant;
    const auto entries = reward::builtin_scorers(options).entries();
    ASSERT_GE(entries.size(), 5u);
    for (const auto& [key, description] : entries) {
      EXPECT_NE(doc.find("`" + key + "`"), std::string::npos) << "docs/rewards.md does not list data_source " << key;
      EXPECT_FALSE(description.empty()) << key;
    }
  }
  for (const auto& v : reward::dapo_variant_names())
    EXPECT_NE(doc.find("`" + v + "`"), std::string::npos) << "docs/rewards.md does not name dapo_variant " << v;
}

TEST(RewardRegistry, DuplicateOrEmptyRegistrationIsAnError) {
  reward::ScorerRegistry reg;
  reward::register_builtin_scorers(reg);
  EXPECT_THROW(reward::register_builtin_scorers(reg), ValueError);
  EXPECT_THROW(reg.add("aime*", "again", [](std::string_view, std::string_view) { return reward::ScoreResult{}; }),
               ValueError);
  EXPECT_THROW(reg.add("", "empty", [](std::string_view, std::string_view) { return reward::ScoreResult{}; }), ValueError);
  EXPECT_THROW(reg.add("x", "no fn", nullptr), ValueError);
}

TEST(RewardRegistry, ExactKeyBeatsPrefixAndLongerPrefixBeatsShorter) {
  reward::ScorerRegistry reg;
  auto constant = [](double v) { return [v](std::string_view, std::string_view) { return reward::ScoreResult{v, false, {}}; }; };
  reg.add("a*", "", constant(1));
  reg.add("ab*", "", constant(2));
  reg.add("abc", "", constant(3));
  auto score_of = [&](const char* ds) { return reg.find(ds)("", "").score; };
  EXPECT_EQ(score_of("a"), 1);
  EXPECT_EQ(score_of("axe"), 1);
  EXPECT_EQ(score_of("abz"), 2);
  EXPECT_EQ(score_of("abc"), 3);
  EXPECT_EQ(score_of("abcd"), 2);
  EXPECT_THROW(reg.find("b"), ValueError);
}

void check_dispatch() {
  auto reg = reward::builtin_scorers();
  const auto& cases = cases_for_dispatch();
  const char* dapo_sources[] = {"math-dapo", "math_dapo", "aime2024", "aime2025", "aime", "amc_23", "amc23", "math"};
  for (const char* ds : dapo_sources) {
    const auto& fn = reg.find(ds);
    for (size_t i = 0; i < cases.size(); i += 7) {
      auto r = fn(cases[i].response, cases[i].ground_truth);
      ASSERT_EQ(r.score, cases[i].dapo.score) << ds << " case " << i;
      ASSERT_EQ(r.pred, cases[i].dapo.pred) << ds << " case " << i;
    }
  }
  for (const char* ds : {"lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"}) {
    const auto& fn = reg.find(ds);
    for (size_t i = 0; i < cases.size(); i += 7) ASSERT_EQ(fn(cases[i].response, cases[i].ground_truth).score, cases[i].light_score);
  }
}

void check_strict_option() {
  auto reg = reward::builtin_scorers({.strict_box_verify = true});
  const auto& fn = reg.find("aime2024");
  for (const auto& c : cases_for_dispatch()) {
    auto r = fn(c.response, c.ground_truth);
    ASSERT_EQ(r.score, c.strict.score);
    ASSERT_EQ(r.pred, c.strict.pred);
  }
}

void check_batch() {
  auto reg = reward::builtin_scorers();
  const auto& cases = cases_for_dispatch();
  const char* sources[] = {"math_dapo", "aime2025", "amc_23", "lighteval/MATH"};
  std::vector<ScoreRequest> reqs;
  for (size_t i = 0; i < cases.size(); ++i) reqs.push_back({sources[i % 4], cases[i].response, cases[i].ground_truth});
  for (int threads : {1, 4, 0}) {
    auto results = reward::score_batch(reg, reqs, threads);
    ASSERT_EQ(results.size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      double want = i % 4 == 3 ? cases[i].light_score : cases[i].dapo.score;
      ASSERT_EQ(results[i].score, want) << "threads " << threads << " case " << i;
    }
  }
  reqs.push_back({"gsm8k", "x", "y"});
  EXPECT_THROW(reward::score_batch(reg, reqs, 4), ValueError);
  EXPECT_TRUE(reward::score_batch(reg, std::span<const ScoreRequest>(), 4).empty());
}

// One test (one oracle run under CTest): dispatch by data_source, the strict-box option, and
// batched multi-threaded scoring all give verl's scores.
TEST(RewardRegistry, DispatchStrictOptionAndBatchEqualVerl) {
  check_dispatch();
  check_strict_option();
  check_batch();
}

TEST(RewardOverlong, PenaltyMatchesTheClosedForm) {
  reward::OverlongConfig c{.enable = true, .len = 512, .penalty_factor = 1.0, .max_response_length = 1024};
  // expected length 512: no penalty up to it, then a linear ramp to -factor at 1024.
  EXPECT_EQ(reward::overlong_penalty(c, 0), 0.0);
  EXPECT_EQ(reward::overlong_penalty(c, 512), 0.0);
  EXPECT_DOUBLE_EQ(reward::overlong_penalty(c, 600), -88.0 / 512.0);
  EXPECT_DOUBLE_EQ(reward::overlong_penalty(c, 768), -0.5);
  EXPECT_DOUBLE_EQ(reward::overlong_penalty(c, 1024), -1.0);
  c.penalty_factor = 0.5;
  EXPECT_DOUBLE_EQ(reward::overlong_penalty(c, 768), -0.25);
  std::vector<int64_t> lengths = {100, 768, 1024};
  std::vector<double> scores = {1.0, 1.0, -1.0};
  reward::apply_overlong_penalty(c, lengths, scores);
  EXPECT_DOUBLE_EQ(scores[0], 1.0);
  EXPECT_DOUBLE_EQ(scores[1], 0.75);
  EXPECT_DOUBLE_EQ(scores[2], -1.5);
  c.enable = false;
  EXPECT_EQ(reward::overlong_penalty(c, 1024), 0.0);
}

TEST(RewardOverlong, InvalidConfigNamesTheField) {
  reward::OverlongConfig c{.enable = true, .len = 0, .penalty_factor = 1.0, .max_response_length = 1024};
  try {
    reward::validate(c);
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("overlong_buffer.len"), std::string::npos);
  }
  c.len = 2048;
  EXPECT_THROW(reward::validate(c), ValueError);
  std::vector<int64_t> lengths = {1};
  std::vector<double> scores = {1.0, 2.0};
  c.len = 512;
  EXPECT_THROW(reward::apply_overlong_penalty(c, lengths, scores), ValueError);
}

}  // namespace
}  // namespace rpg::test
