// The authors' fork's DAPO rule (no \boxed{} fallback) against the fork's own math_dapo.py,
// called live (tests/oracles/reward_fork_cases.py, the fork from RPG_FORK_DIR), on the same
// corpus as the verl parity test; and the choice between the two rules by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "oracle_cases.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/reward/math_dapo.h"
#include "rpg/reward/registry.h"
#include "test_util.h"

namespace rpg::test {
namespace {

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

OracleResult parse(const nlohmann::json& j) {
  return {j[0].get<double>(), j[1].get<int>() != 0,
          j[2].is_null() ? std::nullopt : std::optional<std::string>(unhex(j[2].get<std::string>()))};
}

struct ForkCase {
  std::string response, ground_truth;
  OracleResult fork, fork_strict;
};

// Same seed and sizes as reward_oracle_cases(): the same pairs.
std::vector<ForkCase> fork_cases() {
  const std::filesystem::path fork_dir = RPG_FORK_DIR;
  if (!std::filesystem::exists(fork_dir / "verl/utils/reward_score/math_dapo.py"))
    throw std::runtime_error("the authors' fork is missing at " + fork_dir.string() + " (run scripts/setup.sh)");
  TempDir dir;
  auto path = dir / "cases.jsonl";
  run_oracle("reward_fork_cases.py", {fork_dir.string(), path.string(), "--seed", "20260530", "--generated", "6000",
                                      "--soup", "20000"});
  std::vector<ForkCase> out;
  std::istringstream in(rpg::read_file(path));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    out.push_back({unhex(j["r"]), unhex(j["g"]), parse(j["fork"]), parse(j["fork_strict"])});
  }
  return out;
}

std::string show(const std::optional<std::string>& s) { return s ? "'" + *s + "'" : "None"; }

TEST(RewardForkParity, ForkRuleEqualsTheForksMathDapoOnEveryPair) {
  auto cases = fork_cases();
  const auto& verl = reward_oracle_cases();
  ASSERT_EQ(cases.size(), verl.size());
  size_t bad = 0, strict_bad = 0, rules_differ = 0, boxed_only_right = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    ASSERT_EQ(c.response, verl[i].response) << "the two oracles built different corpora";
    auto d = reward::dapo_score_fork(c.response, c.ground_truth);
    if (d.score != c.fork.score || d.acc != c.fork.acc || d.pred != c.fork.pred) {
      if (++bad <= 10)
        ADD_FAILURE() << "fork math_dapo: response '" << c.response << "' gt '" << c.ground_truth << "': ours "
                      << d.score << " " << show(d.pred) << ", fork " << c.fork.score << " " << show(c.fork.pred);
    }
    auto s = reward::dapo_score_fork(c.response, c.ground_truth, true);
    strict_bad += s.score != c.fork_strict.score || s.pred != c.fork_strict.pred;
    // The two Python modules themselves disagree where only a \boxed{} answers.
    rules_differ += c.fork.score != verl[i].dapo.score || c.fork.pred != verl[i].dapo.pred;
    boxed_only_right += verl[i].dapo.acc && !c.fork.acc;
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(strict_bad, 0u);
  // The corpus separates the rules: a scorer that kept the fallback would fail above.
  EXPECT_GT(rules_differ, 100u);
  EXPECT_GT(boxed_only_right, 50u);
  std::cout << "[ figure ] " << cases.size() << " pairs; fork rule mismatches " << bad << "; fork vs verl 0.9.1 modules "
            << "differ on " << rules_differ << " (" << boxed_only_right << " boxed-only right answers: +1 verl, -1 fork)\n";
}

TEST(RewardForkParity, VariantIsChosenByName) {
  const std::string boxed = "The sum is 5, so the final answer is $\\boxed{5}$.";
  EXPECT_EQ(reward::builtin_scorers().find("aime2024")(boxed, "5").score, 1.0);  // default: verl 0.9.1
  reward::ScorerOptions fork;
  fork.dapo_variant = "math_dapo_fork";
  auto reg = reward::builtin_scorers(fork);
  for (const char* ds : {"math_dapo", "math-dapo", "aime2024", "amc23", "math_dapo_fork"}) {
    auto r = reg.find(ds)(boxed, "5");
    EXPECT_EQ(r.score, -1.0) << ds;
    EXPECT_EQ(r.pred, std::optional<std::string>("[INVALID]")) << ds;
    EXPECT_EQ(reg.find(ds)("Answer: 5", "5").score, 1.0) << ds;
  }
  EXPECT_EQ(reg.find("math_dapo_verl")(boxed, "5").score, 1.0);
  EXPECT_EQ(reward::builtin_scorers().find("math_dapo_fork")(boxed, "5").score, -1.0);
  reward::ScorerOptions bad;
  bad.dapo_variant = "math_dapo_upstream";
  try {
    reward::builtin_scorers(bad);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("dapo_variant"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace rpg::test
