// mean@k / pass@k / maj@k / best@k / worst@k against closed forms computed by hand and
// against an independent Python computation and verl's process_validation_metrics (live).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/eval/metrics.h"
#include "test_util.h"

namespace rpg::test {
namespace {

using eval::pass_at_k;

TEST(EvalPassAtK, EqualsTheClosedFormOnHandComputedCases) {
  // 1 - C(n-c, k) / C(n, k), worked out by hand.
  EXPECT_DOUBLE_EQ(pass_at_k(5, 2, 1), 2.0 / 5.0);
  EXPECT_DOUBLE_EQ(pass_at_k(5, 2, 2), 1.0 - 3.0 / 10.0);        // C(3,2)=3, C(5,2)=10
  EXPECT_DOUBLE_EQ(pass_at_k(5, 2, 3), 1.0 - 1.0 / 10.0);        // C(3,3)=1, C(5,3)=10
  EXPECT_DOUBLE_EQ(pass_at_k(5, 2, 4), 1.0);                     // C(3,4)=0
  EXPECT_DOUBLE_EQ(pass_at_k(4, 0, 2), 0.0);
  EXPECT_DOUBLE_EQ(pass_at_k(4, 4, 1), 1.0);
  EXPECT_DOUBLE_EQ(pass_at_k(10, 3, 1), 0.3);
  EXPECT_NEAR(pass_at_k(32, 5, 4), 1.0 - 17550.0 / 35960.0, 1e-15);  // C(27,4)=17550, C(32,4)=35960
  EXPECT_NEAR(pass_at_k(16, 1, 8), 0.5, 1e-15);                      // C(15,8)/C(16,8) = 8/16
  EXPECT_NEAR(pass_at_k(1000, 1, 1), 0.001, 1e-15);
  EXPECT_NEAR(pass_at_k(100, 50, 50), 1.0 - 1.0 / 100891344545564193334812497256.0, 1e-15);  // C(100,50)
  EXPECT_THROW(pass_at_k(4, 5, 1), ValueError);
  EXPECT_THROW(pass_at_k(4, 1, 0), ValueError);
  EXPECT_THROW(pass_at_k(4, 1, 5), ValueError);
}

TEST(EvalMajority, FollowsVerlsTieBreakAndFirstValue) {
  std::vector<double> v = {0.9, 0.8, 0.7};
  std::vector<std::string> p = {"A", "B", "A"};
  EXPECT_EQ(eval::majority_value(v, p), 0.9);  // verl's docstring example
  std::vector<double> v2 = {0, 1, 1, 0};
  std::vector<std::string> p2 = {"x", "y", "y", "x"};  // tie: the first seen wins
  EXPECT_EQ(eval::majority_value(v2, p2), 0.0);
  EXPECT_THROW(eval::majority_value(v, p2), ValueError);
}

TEST(EvalMajority, BootstrapOfOnePredictionIsTheValueOfARandomDraw) {
  // With one prediction the vote returns the first drawn response's value: a uniform draw,
  // so mean 1/4 and std sqrt(3)/4 for {1, 0, 0, 0}, up to the bootstrap's sampling error.
  std::vector<double> v = {1, 0, 0, 0};
  std::vector<std::string> p(4, "x");
  auto m = eval::majority_of_k(v, p, 3, 20000, 7);
  EXPECT_NEAR(m.mean, 0.25, 0.01);
  EXPECT_NEAR(m.std, std::sqrt(3.0) / 4.0, 0.01);
  auto again = eval::majority_of_k(v, p, 3, 20000, 7);
  EXPECT_EQ(m.mean, again.mean);  // seeded: reproducible
  // k = 1: the vote is the single draw, so the mean is the mean of the values.
  std::vector<double> v2 = {1, 1, 1, 0};
  std::vector<std::string> p2 = {"A", "A", "A", "B"};
  auto m2 = eval::majority_of_k(v2, p2, 1, 20000, 1);
  EXPECT_NEAR(m2.mean, 0.75, 0.01);
  EXPECT_THROW(eval::majority_of_k(v2, p, 0), ValueError);
}

TEST(EvalBestOfK, BinaryValuesGiveOneMinusMissProbability) {
  std::vector<double> v = {1, 0, 0, 0};  // p = 1/4
  auto b = eval::best_of_k(v, 2);
  EXPECT_DOUBLE_EQ(b.mean, 1.0 - 0.75 * 0.75);
  EXPECT_DOUBLE_EQ(b.std, std::sqrt(b.mean * (1 - b.mean)));
  auto w = eval::best_of_k(v, 2, /*min=*/true);
  EXPECT_DOUBLE_EQ(w.mean, 0.25 * 0.25);
  EXPECT_EQ(eval::bootstrap_sizes(32), (std::vector<int64_t>{2, 4, 8, 16, 32}));
  EXPECT_EQ(eval::bootstrap_sizes(5), (std::vector<int64_t>{2, 4, 5}));
  EXPECT_EQ(eval::pass_sizes(32), (std::vector<int64_t>{1, 2, 4, 8, 16, 32}));
  EXPECT_TRUE(eval::bootstrap_sizes(1).empty());
}

std::vector<eval::ScoredResponse> random_responses(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<eval::ScoredResponse> out;
  const char* sources[] = {"aime2024", "amc_23", "math_dapo"};
  const int sizes[] = {1, 4, 5, 8, 16, 32};
  for (int s = 0; s < 3; ++s) {
    for (int q = 0; q < 25; ++q) {
      int n = s == 0 ? 32 : sizes[rng() % 6];
      double p = std::uniform_real_distribution<double>(0, 1)(rng);
      for (int i = 0; i < n; ++i) {
        eval::ScoredResponse r;
        r.data_source = sources[s];
        r.problem = "problem " + std::to_string(q);
        r.acc = std::uniform_real_distribution<double>(0, 1)(rng) < p;
        r.score = (r.acc ? 1.0 : -1.0) - (rng() % 4 == 0 ? 0.25 * static_cast<double>(rng() % 4) : 0.0);
        r.pred = std::string(1, static_cast<char>('A' + rng() % (1 + q % 5)));
        out.push_back(r);
      }
    }
  }
  return out;
}

TEST(EvalMetrics, EqualAnIndependentPythonComputationAndVerl) {
  auto responses = random_responses(2026);
  nlohmann::json in = nlohmann::json::array();
  for (const auto& r : responses)
    in.push_back({{"data_source", r.data_source}, {"problem", r.problem}, {"score", r.score}, {"acc", r.acc}, {"pred", *r.pred}});
  TempDir dir;
  write_file_atomic(dir / "in.json", in.dump());
  run_oracle("eval_metrics.py", {(dir / "in.json").string(), (dir / "out.json").string()});
  auto oracle = nlohmann::json::parse(read_file(dir / "out.json"));
  auto ours = eval::compute_metrics(responses);

  ASSERT_EQ(ours.size(), oracle["exact"].size());
  size_t compared = 0, compared_verl = 0;
  for (const auto& [source, metrics] : ours) {
    const auto& exact = oracle["exact"][source];
    size_t bootstrapped = 0;
    for (const auto& [name, value] : metrics) {
      if (name.find("/maj@") != std::string::npos && (name.ends_with("/mean") || name.ends_with("/std"))) {
        ++bootstrapped;  // a bootstrap on both sides: compared with verl's below
        continue;
      }
      ASSERT_TRUE(exact.contains(name)) << source << " " << name;
      EXPECT_NEAR(value, exact[name].get<double>(), 1e-12) << source << " " << name;
      ++compared;
    }
    EXPECT_EQ(metrics.size() - bootstrapped, exact.size()) << source;
    // verl: mean@n / std@n exactly; its bootstrap estimates of best / worst within their
    // sampling error (1000 resamples per problem, averaged over the problems).
    for (const auto& [name, v] : oracle["verl"][source].items()) {
      double theirs = v.get<double>();
      if (name.find("/mean@") != std::string::npos || name.find("/std@") != std::string::npos) {
        ASSERT_TRUE(metrics.count(name)) << name;
        EXPECT_NEAR(metrics.at(name), theirs, 1e-12) << source << " " << name;
        ++compared_verl;
      } else if (name.find("best@") != std::string::npos || name.find("worst@") != std::string::npos ||
                 name.find("maj@") != std::string::npos) {
        ASSERT_TRUE(metrics.count(name)) << name;
        double tol = name.ends_with("/mean") ? 0.02 : 0.03;
        EXPECT_NEAR(metrics.at(name), theirs, tol) << source << " " << name;
        ++compared_verl;
      }
    }
  }
  EXPECT_GT(compared, 200u);
  EXPECT_GT(compared_verl, 100u);
  EXPECT_EQ(ours["aime2024"]["num_problems"], 25);
  EXPECT_EQ(ours["aime2024"]["num_responses"], 25 * 32);
  EXPECT_TRUE(ours["aime2024"].count("acc/pass@32"));
  EXPECT_TRUE(ours["aime2024"].count("acc/maj@32"));
  EXPECT_TRUE(ours["aime2024"].count("acc/maj@4/mean"));
}

TEST(EvalMetrics, MajorityNeedsEveryPrediction) {
  std::vector<eval::ScoredResponse> rs(4);
  for (size_t i = 0; i < rs.size(); ++i) rs[i] = {"d", "p", 1.0, i % 2 == 0, std::string("x"), std::nullopt};
  rs[3].pred.reset();
  auto t = eval::compute_metrics(rs);
  EXPECT_FALSE(t["d"].count("acc/maj@4"));
  EXPECT_DOUBLE_EQ(t["d"]["acc/mean@4"], 0.5);
  EXPECT_DOUBLE_EQ(t["d"]["acc/pass@2"], 1.0 - 1.0 / 6.0);  // C(2,2)/C(4,2)
}

}  // namespace
}  // namespace rpg::test
