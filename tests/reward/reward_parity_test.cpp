// Parity of our math scorers with verl's, called live on a corpus of thousands of
// (response, ground truth) pairs: every score, acc and pred must be identical.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "oracle_cases.h"
#include "rpg/core/io.h"
#include "rpg/reward/math_dapo.h"
#include "rpg/reward/math_lighteval.h"
#include "test_util.h"

namespace rpg::test {
namespace {

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

std::optional<std::string> opt_hex(const nlohmann::json& j) {
  if (j.is_null()) return std::nullopt;
  return unhex(j.get<std::string>());
}

OracleResult parse_result(const nlohmann::json& j) {
  return {j[0].get<double>(), j[1].get<int>() != 0, opt_hex(j[2])};
}

std::string show(const std::optional<std::string>& s) { return s ? "'" + *s + "'" : "None"; }

}  // namespace

std::vector<OracleCase> load_reward_oracle_cases(int generated, int math_verify) {
  TempDir dir;
  auto path = dir / "cases.jsonl";
  run_oracle("reward_cases.py", {path.string(), "--seed", "20260530", "--generated", std::to_string(generated),
                                 "--math-verify", std::to_string(math_verify)});
  std::vector<OracleCase> out;
  std::istringstream in(rpg::read_file(path));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    OracleCase c;
    c.response = unhex(j["r"]);
    c.ground_truth = unhex(j["g"]);
    c.dapo = parse_result(j["dapo"]);
    c.strict = parse_result(j["strict"]);
    c.light_score = j["light"][0].get<double>();
    c.light_pred = opt_hex(j["light"][1]);
    if (!j["mv"].is_null()) c.math_verify = j["mv"].get<int>() != 0;
    out.push_back(std::move(c));
  }
  return out;
}

const std::vector<OracleCase>& reward_oracle_cases() {
  static const std::vector<OracleCase> cases = load_reward_oracle_cases(6000, 0);
  return cases;
}

namespace {

TEST(RewardParity, CorpusIsLargeAndCoversBothOutcomes) {
  const auto& cases = reward_oracle_cases();
  ASSERT_GE(cases.size(), 6000u);
  size_t correct = 0, invalid = 0, strict_hits = 0;
  for (const auto& c : cases) {
    correct += c.dapo.acc;
    invalid += c.dapo.pred == std::optional<std::string>("[INVALID]");
    strict_hits += c.strict.acc;
  }
  // The generator must exercise right, wrong, missing and boxed answers in bulk.
  EXPECT_GT(correct, cases.size() / 5);
  EXPECT_GT(cases.size() - correct, cases.size() / 5);
  EXPECT_GT(invalid, 50u);
  EXPECT_GT(strict_hits, 50u);
}

TEST(RewardParity, DapoEqualsVerlMathDapoOnEveryPair) {
  size_t mismatches = 0;
  for (const auto& c : reward_oracle_cases()) {
    auto ours = reward::dapo_score(c.response, c.ground_truth);
    if (ours.score != c.dapo.score || ours.acc != c.dapo.acc || ours.pred != c.dapo.pred) {
      if (++mismatches <= 20)
        ADD_FAILURE() << "response '" << c.response << "' gt '" << c.ground_truth << "': ours " << ours.score << " "
                      << show(ours.pred) << ", verl " << c.dapo.score << " " << show(c.dapo.pred);
    }
  }
  EXPECT_EQ(mismatches, 0u) << "of " << reward_oracle_cases().size();
}

TEST(RewardParity, DapoStrictBoxEqualsVerlOnEveryPair) {
  size_t mismatches = 0;
  for (const auto& c : reward_oracle_cases()) {
    auto ours = reward::dapo_score(c.response, c.ground_truth, /*strict_box=*/true);
    if (ours.score != c.strict.score || ours.acc != c.strict.acc || ours.pred != c.strict.pred) {
      if (++mismatches <= 20)
        ADD_FAILURE() << "response '" << c.response << "' gt '" << c.ground_truth << "': ours " << ours.score << " "
                      << show(ours.pred) << ", verl " << c.strict.score << " " << show(c.strict.pred);
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(RewardParity, LightevalEqualsVerlMathRewardOnEveryPair) {
  size_t mismatches = 0, hits = 0;
  for (const auto& c : reward_oracle_cases()) {
    auto ours = reward::lighteval_score(c.response, c.ground_truth);
    hits += c.light_score == 1.0;
    if (ours.score != c.light_score || ours.acc != (c.light_score == 1.0) || ours.pred != c.light_pred) {
      if (++mismatches <= 20)
        ADD_FAILURE() << "response '" << c.response << "' gt '" << c.ground_truth << "': ours " << ours.score << " "
                      << show(ours.pred) << ", verl " << c.light_score << " " << show(c.light_pred);
    }
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(hits, 100u);
}

TEST(RewardParity, AgreementWithMathVerifyIsReported) {
  size_t n = 0, agree = 0;
  for (const auto& c : load_reward_oracle_cases(1000, 1000)) {
    if (!c.math_verify) continue;
    ++n;
    agree += reward::dapo_score(c.response, c.ground_truth).acc == *c.math_verify;
  }
  ASSERT_GT(n, 900u);
  std::cout << "[ figure ] DAPO rule vs math-verify: " << agree << "/" << n << " = " << 100.0 * agree / n
            << "% agreement\n";
}

}  // namespace
}  // namespace rpg::test
