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

std::vector<OracleCase> load_reward_oracle_cases(int generated, int math_verify, int soup) {
  TempDir dir;
  auto path = dir / "cases.jsonl";
  run_oracle("reward_cases.py", {path.string(), "--seed", "20260530", "--generated", std::to_string(generated),
                                 "--math-verify", std::to_string(math_verify), "--soup", std::to_string(soup)});
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
  static const std::vector<OracleCase> cases = load_reward_oracle_cases(6000, 0, 20000);
  return cases;
}

namespace {

// One test (one oracle run under CTest) for the three scorers on the whole corpus.
TEST(RewardParity, EveryScorerEqualsVerlOnEveryPair) {
  const auto& cases = reward_oracle_cases();
  ASSERT_GE(cases.size(), 26000u);
  // The corpus exercises right, wrong, missing and boxed answers in bulk.
  size_t correct = 0, invalid = 0, strict_hits = 0, light_hits = 0;
  for (const auto& c : cases) {
    correct += c.dapo.acc;
    invalid += c.dapo.pred == std::optional<std::string>("[INVALID]");
    strict_hits += c.strict.acc;
    light_hits += c.light_score == 1.0;
  }
  EXPECT_GT(correct, 2000u);
  EXPECT_GT(cases.size() - correct, 2000u);
  EXPECT_GT(invalid, 1000u);
  EXPECT_GT(strict_hits, 100u);
  EXPECT_GT(light_hits, 100u);

  size_t dapo_bad = 0, strict_bad = 0, light_bad = 0;
  for (const auto& c : cases) {
    auto d = reward::dapo_score(c.response, c.ground_truth);
    if (d.score != c.dapo.score || d.acc != c.dapo.acc || d.pred != c.dapo.pred) {
      if (++dapo_bad <= 10)
        ADD_FAILURE() << "math_dapo: response '" << c.response << "' gt '" << c.ground_truth << "': ours " << d.score
                      << " " << show(d.pred) << ", verl " << c.dapo.score << " " << show(c.dapo.pred);
    }
    auto s = reward::dapo_score(c.response, c.ground_truth, /*strict_box=*/true);
    if (s.score != c.strict.score || s.acc != c.strict.acc || s.pred != c.strict.pred) {
      if (++strict_bad <= 10)
        ADD_FAILURE() << "math_dapo strict: response '" << c.response << "' gt '" << c.ground_truth << "': ours "
                      << s.score << " " << show(s.pred) << ", verl " << c.strict.score << " " << show(c.strict.pred);
    }
    auto l = reward::lighteval_score(c.response, c.ground_truth);
    if (l.score != c.light_score || l.acc != (c.light_score == 1.0) || l.pred != c.light_pred) {
      if (++light_bad <= 10)
        ADD_FAILURE() << "math_reward: response '" << c.response << "' gt '" << c.ground_truth << "': ours " << l.score
                      << " " << show(l.pred) << ", verl " << c.light_score << " " << show(c.light_pred);
    }
  }
  EXPECT_EQ(dapo_bad, 0u);
  EXPECT_EQ(strict_bad, 0u);
  EXPECT_EQ(light_bad, 0u);
  std::cout << "[ figure ] " << cases.size() << " pairs; mismatches with verl: math_dapo " << dapo_bad
            << ", strict box " << strict_bad << ", lighteval " << light_bad << "\n";
}

TEST(RewardParity, AgreementWithMathVerifyIsReported) {
  size_t n = 0, agree = 0;
  for (const auto& c : load_reward_oracle_cases(1000, 1000, 0)) {
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
