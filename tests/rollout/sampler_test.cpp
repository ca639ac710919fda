// The sampler against Hugging Face's logits warpers (live), and empirical frequencies of
// the draws against the warped distribution (chi-square at a fixed seed).
#include "rpg/rollout/sampler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include "rpg/core/error.h"
#include "rpg/core/rng.h"
#include "tensor_file.h"
#include "test_util.h"

namespace rpg::rollout {
namespace {

struct Case {
  double temperature, top_p;
  int64_t top_k;
};

const std::vector<Case> kCases = {{1.0, 1.0, -1}, {0.7, 1.0, 3}, {1.0, 0.9, -1}, {1.3, 0.5, 5},
                                  {1.0, 1e-9, -1}, {0.5, 0.95, 2}, {1.0, 1.0, 1}};

// Rows: random logits, plus hand-built ones with ties and a dominant token.
at::Tensor make_logits() {
  at::manual_seed(3);
  at::Tensor random = at::randn({6, 12}, at::kDouble) * 2;
  at::Tensor ties = at::tensor({0.1, 2.0, 2.0, -1.0, 5.0, 2.0, -3.0, 0.0, 0.0, 1.0, 1.0, 1.0}, at::kDouble).unsqueeze(0);
  at::Tensor peaked = at::full({1, 12}, -2.0, at::kDouble);
  peaked[0][7] = 9.0;
  return at::cat({random, ties, peaked}).to(at::kFloat).to(at::kDouble);  // fp32-representable
}

std::map<std::string, at::Tensor> hf_probs(const at::Tensor& logits) {
  test::TempDir dir;
  test::save_tensors(dir / "in.safetensors", {{"logits", logits}});
  nlohmann::json cases = nlohmann::json::array();
  for (const Case& c : kCases) cases.push_back({{"temperature", c.temperature}, {"top_k", c.top_k}, {"top_p", c.top_p}});
  test::write_text(dir / "cases.json", cases.dump());
  test::run_oracle("rollout_warpers.py", {(dir / "in.safetensors").string(), (dir / "cases.json").string(),
                                          (dir / "out.safetensors").string()});
  return test::load_tensors(dir / "out.safetensors");
}

SamplingParams params_of(const Case& c) {
  SamplingParams p;
  p.temperature = c.temperature;
  p.top_p = c.top_p;
  p.top_k = c.top_k;
  return p;
}

TEST(Sampler, FilteredDistributionMatchesHuggingFaceWarpers) {
  at::Tensor logits = make_logits();
  auto ref = hf_probs(logits);
  for (size_t j = 0; j < kCases.size(); ++j) {
    at::Tensor ours = sampling_probs(logits.to(at::kFloat), params_of(kCases[j]));
    at::Tensor theirs = ref.at(str("probs.", j));
    // Exactly the same kept set, and the same probabilities on it.
    EXPECT_TRUE(at::equal(ours > 0, theirs > 0)) << "case " << j << "\nours " << (ours > 0) << "\nHF " << (theirs > 0);
    EXPECT_LT((ours - theirs).abs().max().item<double>(), 1e-12) << "case " << j;
  }
}

TEST(Sampler, EmpiricalFrequenciesMatchTheDistribution) {
  at::Tensor logits = make_logits();
  auto ref = hf_probs(logits);
  const int draws = 40000;
  for (size_t j = 0; j < kCases.size(); ++j) {
    SamplingParams p = params_of(kCases[j]);
    for (int64_t row : {0, 6}) {
      at::Tensor rows = logits.to(at::kFloat).narrow(0, row, 1).expand({draws, -1}).contiguous();
      std::vector<double> u(draws);
      RandomStream rs(mix_key(17, j, static_cast<uint64_t>(row)));
      for (auto& x : u) x = rs.uniform();
      at::Tensor ids = sample_tokens(rows, p, u).ids;
      at::Tensor counts = at::bincount(ids, {}, logits.size(1)).to(at::kDouble);
      at::Tensor expected = ref.at(str("probs.", j))[row] * draws;
      // Never a token outside the kept set.
      EXPECT_EQ(counts.masked_select(expected == 0).sum().item<double>(), 0.0) << "case " << j;
      at::Tensor kept = expected > 0;
      int64_t dof = kept.sum().item<int64_t>() - 1;
      if (dof == 0) continue;
      double chi2 = ((counts - expected).pow(2) / expected).masked_select(kept).sum().item<double>();
      // 99.99th percentile of chi-square with <= 11 degrees of freedom is < 40.
      EXPECT_LT(chi2, 40.0) << "case " << j << " row " << row << " dof " << dof;
    }
  }
}

TEST(Sampler, PlainSamplingInvertsTheCdfOfTheFloat64Distribution) {
  // Without top-k and top-p, CPU rows take a one-pass path (fp32 exponentials, block sums).
  // Against the rule written out on sampling_probs' float64 distribution: the first token whose
  // CDF exceeds u * total; tokens of probability 0 never; the log-probs of log_softmax(x / T).
  at::manual_seed(8);
  const int64_t rows = 300, V = 1000 + 7;  // blocks of 16 and a tail
  at::Tensor logits = at::randn({rows, V}) * 3;
  logits.narrow(1, 0, 40).fill_(-std::numeric_limits<float>::infinity());  // masked tokens
  logits.narrow(1, 500, 3).fill_(-std::numeric_limits<float>::infinity());
  logits[0].fill_(0);            // flat
  logits[1][V - 1] = 40;         // one token holds almost all the mass, the last one
  std::vector<double> u(static_cast<size_t>(rows));
  RandomStream rs(mix_key(3, 1, 4));
  for (auto& x : u) x = rs.uniform();
  u[2] = 0.0;
  u[3] = std::nextafter(1.0, 0.0);
  for (double t : {1.0, 0.7}) {
    SamplingParams p;
    p.temperature = t;
    const SampledTokens s = sample_tokens(logits, p, u);
    const at::Tensor probs = sampling_probs(logits, p), cdf = probs.cumsum(1);
    const at::Tensor target = at::tensor(u, at::kDouble).unsqueeze(1) * cdf.narrow(1, V - 1, 1);
    const at::Tensor want = at::searchsorted(cdf, target, false, true).squeeze(1).clamp_max(V - 1);
    EXPECT_TRUE(at::equal(s.ids, want)) << "T " << t << ": " << (s.ids != want).sum().item<int64_t>() << " differ";
    EXPECT_TRUE(at::isfinite(logits.gather(1, s.ids.unsqueeze(1))).all().item<bool>());
    EXPECT_EQ(s.ids[2].item<int64_t>(), 40);  // u = 0: the first token of positive probability
    const at::Tensor lp = at::log_softmax(logits.to(at::kDouble) / t, 1).gather(1, s.ids.unsqueeze(1)).squeeze(1);
    EXPECT_LE((s.log_probs.to(at::kDouble) - lp).abs().max().item<double>(), 2e-6) << "T " << t;
  }
  // A row of NaN (a broken model) still names a token of the vocabulary.
  const SampledTokens nan = sample_tokens(at::full({2, V}, std::nanf("")), SamplingParams{}, {0.5, 0.999});
  EXPECT_TRUE(((nan.ids >= 0) & (nan.ids < V)).all().item<bool>());
}

TEST(Sampler, FilteredSamplingInvertsTheCdfOfTheFloat64FilteredDistribution) {
  // With top-k or top-p, CPU rows take a path without a sort of the vocabulary (a heap for the
  // k-th value, a histogram for top-p's boundary). Against the rule written out on
  // sampling_probs' float64 distribution, which equals Hugging Face's warpers (above): the
  // first token whose CDF exceeds u * total, never one outside the kept set, the log-probs of
  // the unfiltered log_softmax(x / T). Rows: random, masked tokens, a flat one (top-p's
  // boundary among equal probabilities: ties go by token id), one dominated by its last
  // token, one with the k-th value tied, and peaked ones (a nucleus of a few tokens).
  at::manual_seed(9);
  const int64_t rows = 200, V = 3000 + 7;  // blocks of 16 and a tail; k up to 2000 (the selection)
  at::Tensor logits = at::randn({rows, V}) * 3;
  logits.narrow(1, 0, 40).fill_(-std::numeric_limits<float>::infinity());
  logits[0].fill_(0);
  logits[1][V - 1] = 40;
  logits[2].narrow(0, 100, 12).fill_(9.0f);  // 12 tokens tied at the top: top-k 5 keeps all 12
  for (int64_t r = 3; r < 40; ++r) logits[r].narrow(0, 50 * r, 3).add_(12.0f + static_cast<float>(r % 5));
  // Row 40, at top_p 0.9: most tokens' e (5.85e-5) within a factor 2 above top-p's cut-off
  // (2^-15), the maximum last by id, and a block of 16 whose only live token (96) is kept: its
  // block's sum is under twice the cut-off, and only the exact block skip reads it.
  logits[40].fill_(std::log(5.85e-5f));
  logits[40].narrow(0, 0, 40).fill_(-std::numeric_limits<float>::infinity());
  logits[40].narrow(0, 97, 15).fill_(-std::numeric_limits<float>::infinity());
  logits[40][V - 7] = 0;
  std::vector<double> u(static_cast<size_t>(rows));
  RandomStream rs(mix_key(5, 2, 7));
  for (auto& x : u) x = rs.uniform();
  u[4] = 0.0;
  u[40] = 0.03;  // among row 40's small tokens, after token 96
  u[5] = std::nextafter(1.0, 0.0);
  const std::vector<Case> cases = {{1.0, 0.9, -1}, {0.7, 0.5, -1}, {1.0, 1e-9, -1}, {1.3, 1.0, 5},
                                   {0.6, 0.95, 50}, {1.0, 0.999, 2000}, {1.0, 1.0, V - 1}, {2.0, 0.3, 1},
                                   {1.0, 1 - 1e-12, -1}};  // the last: every e > 0 a candidate
  for (const Case& c : cases) {
    const SamplingParams p = params_of(c);
    const std::string what = str("T ", c.temperature, " top_p ", c.top_p, " top_k ", c.top_k);
    const SampledTokens s = sample_tokens(logits, p, u);
    const at::Tensor probs = sampling_probs(logits, p), cdf = probs.cumsum(1);
    const at::Tensor target = at::tensor(u, at::kDouble).unsqueeze(1) * cdf.narrow(1, V - 1, 1);
    const at::Tensor want = at::searchsorted(cdf, target, false, true).squeeze(1).clamp_max(V - 1);
    EXPECT_TRUE(at::equal(s.ids, want)) << what << ": " << (s.ids != want).sum().item<int64_t>() << " differ";
    EXPECT_TRUE((probs.gather(1, s.ids.unsqueeze(1)) > 0).all().item<bool>()) << what;
    const at::Tensor lp = at::log_softmax(logits.to(at::kDouble) / c.temperature, 1).gather(1, s.ids.unsqueeze(1)).squeeze(1);
    EXPECT_LE((s.log_probs.to(at::kDouble) - lp).abs().max().item<double>(), 2e-6) << what;
  }
  const SampledTokens nan = sample_tokens(at::full({2, V}, std::nanf("")), params_of({1.0, 0.9, 5}), {0.5, 0.999});
  EXPECT_TRUE(((nan.ids >= 0) & (nan.ids < V)).all().item<bool>());
}

TEST(Sampler, GreedyTakesTheFirstMaximumAndReportsItsLogProb) {
  at::Tensor logits = at::tensor({1.0f, 3.0f, 3.0f, -1.0f, 0.0f, 0.0f, 0.0f, 2.0f}).reshape({2, 4});
  SamplingParams p;
  p.temperature = 0;
  SampledTokens s = sample_tokens(logits, p, {});
  EXPECT_EQ(s.ids[0].item<int64_t>(), 1);
  EXPECT_EQ(s.ids[1].item<int64_t>(), 3);
  EXPECT_NEAR(s.log_probs[0].item<float>(), at::log_softmax(logits[0], 0)[1].item<float>(), 1e-7);
}

TEST(Sampler, LogProbsAreOfTheTemperatureScaledUnfilteredDistribution) {
  at::Tensor logits = make_logits().to(at::kFloat);
  SamplingParams p;
  p.temperature = 0.6;
  p.top_k = 2;
  std::vector<double> u(static_cast<size_t>(logits.size(0)), 0.3);
  SampledTokens s = sample_tokens(logits, p, u);
  at::Tensor expect = at::log_softmax(logits / 0.6, 1).gather(1, s.ids.unsqueeze(1)).squeeze(1);
  EXPECT_TRUE(at::allclose(s.log_probs, expect, 0, 1e-6));
}

TEST(Sampler, InvalidParametersNameTheField) {
  auto error_of = [](SamplingParams p) -> std::string {
    try {
      p.validate();
    } catch (const ValueError& e) {
      return e.what();
    }
    return "<no error>";
  };
  SamplingParams p;
  p.top_p = 0;
  EXPECT_NE(error_of(p).find("top_p: must be in (0, 1], got 0"), std::string::npos);
  p = {};
  p.top_p = 1.5;
  EXPECT_NE(error_of(p).find("top_p"), std::string::npos);
  p = {};
  p.max_new_tokens = 0;
  EXPECT_NE(error_of(p).find("max_new_tokens: must be >= 1"), std::string::npos);
  p = {};
  p.n = 0;
  EXPECT_NE(error_of(p).find("n: must be >= 1"), std::string::npos);
  p = {};
  p.top_k = 0;
  EXPECT_NE(error_of(p).find("top_k"), std::string::npos);
  p = {};
  p.temperature = -1;
  EXPECT_NE(error_of(p).find("temperature"), std::string::npos);
}

}  // namespace
}  // namespace rpg::rollout
