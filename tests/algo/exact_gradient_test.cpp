// The paper's central claim, checked exactly: for a categorical policy over K = 7 outcomes
// the expected gradient of each surrogate under x ~ pi_old / Z_old (a weighted sum over all
// K outcomes, no sampling) equals -grad J(theta) of J = E_{pi_theta}[R] - beta * Div, with J
// differentiated by autograd from its closed form. Also: the GRPO KL correction of
// Section 2.2, k3 = UKL (Appendix D), and a Monte-Carlo check of the same gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "algo_test_util.h"
#include "rpg/algo/kl.h"
#include "rpg/algo/policy_loss.h"

namespace rpg::algo {
namespace {

using test::grad_of;
using test::objective;
using test::one_outcome_batch;

constexpr int64_t K = 7;
constexpr double kBaseline = 0.25;  // any constant baseline leaves the expected gradient unchanged

struct Problem {
  at::Tensor theta;    // [K] logits, requires grad
  at::Tensor R;        // [K] rewards
  at::Tensor log_old;  // [K] log pi_old (mass Z)
  double Z = 1.0;
};

Problem make_problem(uint64_t seed, bool unnormalized, bool on_policy) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Problem p;
  p.theta = (at::randn({K}, gen, at::kDouble) * 0.7).requires_grad_(true);
  p.R = at::randn({K}, gen, at::kDouble);
  if (on_policy) {
    p.log_old = at::log_softmax(p.theta.detach(), 0);
  } else {
    p.log_old = at::log_softmax(at::randn({K}, gen, at::kDouble) * 0.7, 0);
    if (unnormalized) {
      p.Z = 1.7;
      p.log_old = p.log_old + std::log(p.Z);
    }
  }
  return p;
}

PolicyLossConfig make_config(Divergence kl, double beta, bool clip, double Z) {
  PolicyLossConfig c;
  c.kl = kl;
  c.kl_coef = beta;
  c.old_mass = Z;
  c.clip = clip;
  // With clip on, bounds that never bind for these w (0.05 .. 20): the clipped surrogate
  // must then still be exact.
  c.clip_ratio_low = 0.999;
  c.clip_ratio_high = 1e6;
  c.clip_ratio_c = 1e7;
  return c;
}

// sum_x pi_old(x)/Z * L(x) through the token-level API, outcome x at token position x % 3.
at::Tensor expected_surrogate(const std::string& loss, const Problem& p, const PolicyLossConfig& c) {
  auto log_p = at::log_softmax(p.theta, 0);
  auto q = (p.log_old - std::log(p.Z)).exp();
  auto adv = p.R - kBaseline;
  at::Tensor total = at::zeros({}, at::kDouble);
  for (int64_t x = 0; x < K; ++x) {
    auto in = one_outcome_batch(log_p, p.log_old, adv, x, x % 3);
    total = total + q[x] * compute_policy_loss(loss, in, c).loss;
  }
  return total;
}

// One test per (surrogate, divergence); inside: beta in {0, 0.05, 0.3}, clip off / on,
// off-policy / on-policy, three random problems.
using ExactParam = std::tuple<std::string, Divergence>;

std::string variant_name(const ::testing::TestParamInfo<ExactParam>& info) {
  return std::get<0>(info.param) + "_" + to_string(std::get<1>(info.param));
}

class ExactGradient : public ::testing::TestWithParam<ExactParam> {};

TEST_P(ExactGradient, SurrogateGradientEqualsMinusGradJ) {
  auto [loss, kl] = GetParam();
  for (double beta : {0.0, 0.05, 0.3})
    for (bool clip : {false, true})
      for (bool on_policy : {false, true})
        for (uint64_t seed : {1, 2, 3}) {
          auto p = make_problem(seed, is_unnormalized(kl), on_policy);
          auto c = make_config(kl, beta, clip, p.Z);
          auto target = -grad_of(objective(p.theta, p.R, p.log_old, kl, beta), p.theta);
          auto got = grad_of(expected_surrogate(loss, p, c), p.theta);
          double err = test::max_abs_diff(got, target);
          EXPECT_LT(err, 1e-10) << loss << " " << to_string(kl) << " beta=" << beta << " clip=" << clip
                                << " on_policy=" << on_policy << " seed=" << seed << "\n got " << got
                                << "\n want " << target;
        }
}

const auto kAllVariants =
    ::testing::Combine(::testing::Values("rpg", "rpg_reinforce"),
                       ::testing::Values(Divergence::FKL, Divergence::RKL, Divergence::UFKL, Divergence::URKL));

INSTANTIATE_TEST_SUITE_P(AllVariants, ExactGradient, kAllVariants, variant_name);

// The test must be able to fail: dropping the importance weight from the KL part (the GRPO
// mistake) or the mass Z_old breaks the equality.
TEST(ExactGradientControl, WrongMassIsDetected) {
  auto p = make_problem(5, /*unnormalized=*/true, /*on_policy=*/false);
  auto c = make_config(Divergence::UFKL, 0.3, false, /*Z=*/1.0);
  c.old_mass = 1.0;  // the caller forgot Z_old = 1.7
  auto target = -grad_of(objective(p.theta, p.R, p.log_old, Divergence::UFKL, 0.3), p.theta);
  auto got = grad_of(expected_surrogate("rpg", p, c), p.theta);
  EXPECT_GT(test::max_abs_diff(got, target), 1e-3);
}

// ---- Rollout correction combined with the RPG losses ----
// The engine samples from pi_rollout != pi_old; weighting each token by rho = pi_old/pi_rollout
// (cap not binding) makes the expected gradient under x ~ pi_rollout exact again; without the
// correction it is not.
TEST(RolloutCorrectionExact, RestoresTheGradientUnderSamplingMismatch) {
  for (const char* loss : {"rpg", "rpg_reinforce"})
    for (auto kl : {Divergence::FKL, Divergence::RKL, Divergence::UFKL, Divergence::URKL})
      for (auto mode : {RolloutCorrection::None, RolloutCorrection::Token, RolloutCorrection::Sequence}) {
        auto p = make_problem(7, /*unnormalized=*/false, /*on_policy=*/false);
        auto gen = at::make_generator<at::CPUGeneratorImpl>(8);
        auto log_r = at::log_softmax(at::randn({K}, gen, at::kDouble), 0);
        auto c = make_config(kl, 0.3, /*clip=*/false, 1.0);
        c.rollout_correction = mode;
        c.rollout_correction_cap = 1e6;
        auto log_p = at::log_softmax(p.theta, 0);
        auto adv = p.R - kBaseline;
        at::Tensor total = at::zeros({}, at::kDouble);
        for (int64_t x = 0; x < K; ++x) {
          auto in = one_outcome_batch(log_p, p.log_old, adv, x, x % 3);
          in.rollout_log_probs = in.old_log_probs + (log_r[x] - p.log_old[x]);
          total = total + log_r[x].exp() * compute_policy_loss(loss, in, c).loss;
        }
        auto target = -grad_of(objective(p.theta, p.R, p.log_old, kl, 0.3), p.theta);
        double err = test::max_abs_diff(grad_of(total, p.theta), target);
        if (mode == RolloutCorrection::None) {
          EXPECT_GT(err, 1e-3) << loss << " " << to_string(kl);
        } else {
          EXPECT_LT(err, 1e-10) << loss << " " << to_string(kl) << " " << to_string(mode);
        }
      }
}

// ---- GRPO's KL term (Section 2.2) ----

struct GrpoCase {
  at::Tensor theta, log_ref, log_old;
};

at::Tensor expected_grpo_kl(const std::string& loss, const GrpoCase& g, double beta) {
  PolicyLossConfig c;
  c.kl_coef = beta;
  c.kl_loss_type = KlEstimator::K3;
  auto log_p = at::log_softmax(g.theta, 0);
  auto q = g.log_old.exp();
  at::Tensor total = at::zeros({}, at::kDouble);
  auto zero_adv = at::zeros({K}, at::kDouble);
  for (int64_t x = 0; x < K; ++x) {
    auto in = one_outcome_batch(log_p, g.log_old, zero_adv, x, (x + 1) % 3);
    in.ref_log_probs = in.old_log_probs.detach() + (g.log_ref[x] - g.log_old[x]);  // ref at the token
    total = total + q[x] * compute_policy_loss(loss, in, c).loss;
  }
  return total;
}

TEST(GrpoKl, PublishedEstimatorIsBiasedOffPolicyCorrectedIsExact) {
  const double beta = 0.3;
  double worst_published = 0;
  for (uint64_t seed : {11, 12, 13, 14}) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    GrpoCase g;
    g.theta = (at::randn({K}, gen, at::kDouble) * 0.8).requires_grad_(true);
    g.log_ref = at::log_softmax(at::randn({K}, gen, at::kDouble), 0);
    g.log_old = at::log_softmax(at::randn({K}, gen, at::kDouble), 0);
    // Target: grad of beta * UKL(pi_theta || pi_ref) from the definition.
    auto log_p = at::log_softmax(g.theta, 0);
    auto p = log_p.exp();
    auto ukl = (p * (log_p - g.log_ref)).sum() + (g.log_ref.exp() - p).sum();
    auto target = grad_of(beta * ukl, g.theta);
    auto corrected = grad_of(expected_grpo_kl("grpo_corrected", g, beta), g.theta);
    auto published = grad_of(expected_grpo_kl("grpo", g, beta), g.theta);
    EXPECT_LT(test::max_abs_diff(corrected, target), 1e-10) << "seed " << seed;
    worst_published = std::max(worst_published, test::max_abs_diff(published, target));
  }
  EXPECT_GT(worst_published, 1e-3);
}

// Even on-policy (w = 1 in value) the published term is not the gradient of the reverse KL:
// sum_x pi_theta grad k3(pi_ref/pi_theta) = -sum_x pi_ref grad log pi_theta = grad KL(pi_ref || pi_theta),
// the forward KL; the corrected estimator keeps grad w = grad log pi_theta and stays exact.
TEST(GrpoKl, OnPolicyPublishedEstimatorFollowsForwardKl) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(21);
  GrpoCase g;
  g.theta = (at::randn({K}, gen, at::kDouble) * 0.8).requires_grad_(true);
  g.log_ref = at::log_softmax(at::randn({K}, gen, at::kDouble), 0);
  g.log_old = at::log_softmax(g.theta.detach(), 0);
  auto log_p = at::log_softmax(g.theta, 0);
  auto p = log_p.exp();
  auto ref = g.log_ref.exp();
  auto reverse = grad_of(0.3 * ((p * (log_p - g.log_ref)).sum() + (ref - p).sum()), g.theta);
  auto forward = grad_of(0.3 * (ref * (g.log_ref - log_p)).sum(), g.theta);
  auto published = grad_of(expected_grpo_kl("grpo", g, 0.3), g.theta);
  auto corrected = grad_of(expected_grpo_kl("grpo_corrected", g, 0.3), g.theta);
  EXPECT_LT(test::max_abs_diff(published, forward), 1e-10);
  EXPECT_GT(test::max_abs_diff(published, reverse), 1e-3);
  EXPECT_LT(test::max_abs_diff(corrected, reverse), 1e-10);
}

// ---- Appendix D: E_p[k3(q/p)] = UKL(p || q) and E_q[k3(p/q)] = UKL(q || p), q unnormalised ----

TEST(K3Estimator, ExpectationEqualsUnnormalizedKl) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(31);
  auto log_p = at::log_softmax(at::randn({K}, gen, at::kDouble), 0);
  auto log_q = at::log_softmax(at::randn({K}, gen, at::kDouble), 0) + std::log(0.6);
  auto p = log_p.exp(), q = log_q.exp();
  auto ukl_pq = ((p * (log_p - log_q)).sum() + (q - p).sum()).item<double>();
  auto ukl_qp = ((q * (log_q - log_p)).sum() + (p - q).sum()).item<double>();
  auto e_p = (p * kl_estimate(log_p, log_q, KlEstimator::K3)).sum().item<double>();
  // E_{x~q}[k3(p/q)] = sum q * (p/q - 1 - log(p/q)).
  auto e_q = (q * k3_from_log(log_p - log_q)).sum().item<double>();
  EXPECT_NEAR(e_p, ukl_pq, 1e-12);
  EXPECT_NEAR(e_q, ukl_qp, 1e-12);
  // k1 and k2 are not UKL for an unnormalised q: the check can tell estimators apart.
  auto e_k1 = (p * kl_estimate(log_p, log_q, KlEstimator::K1)).sum().item<double>();
  EXPECT_GT(std::abs(e_k1 - ukl_pq), 1e-3);
}

// ---- Monte-Carlo: n = 200k samples x ~ pi_old / Z, average surrogate gradient within 4 SE ----

class MonteCarlo : public ::testing::TestWithParam<ExactParam> {};

void check_monte_carlo(const std::string& loss, Divergence kl, double beta, bool clip) {
  SCOPED_TRACE(loss + " " + to_string(kl) + " beta=" + std::to_string(beta) + " clip=" + std::to_string(clip));
  const int64_t n = 200000;
  auto p = make_problem(41, is_unnormalized(kl), /*on_policy=*/false);
  auto c = make_config(kl, beta, clip, p.Z);
  auto target = -grad_of(objective(p.theta, p.R, p.log_old, kl, beta), p.theta);

  auto gen = at::make_generator<at::CPUGeneratorImpl>(42);
  auto q = (p.log_old - std::log(p.Z)).exp();
  auto xs = at::multinomial(q, n, /*replacement=*/true, gen);  // [n]
  auto log_p = at::log_softmax(p.theta, 0);
  PolicyLossInputs in;
  in.log_probs = log_p.index_select(0, xs).view({n, 1});
  in.old_log_probs = p.log_old.index_select(0, xs).view({n, 1});
  in.advantages = (p.R - kBaseline).index_select(0, xs).view({n, 1});
  in.response_mask = at::ones({n, 1}, at::kDouble);
  in.normaliser = static_cast<double>(n);
  auto mean_grad = grad_of(compute_policy_loss(loss, in, c).loss, p.theta);

  // Per-sample gradient g(x) for each outcome, and the sample variance from the counts.
  auto counts = at::bincount(xs, {}, K).to(at::kDouble);
  auto adv = p.R - kBaseline;
  std::vector<at::Tensor> g;
  for (int64_t x = 0; x < K; ++x)
    g.push_back(grad_of(compute_policy_loss(loss, one_outcome_batch(log_p, p.log_old, adv, x, 0), c).loss,
                        p.theta));
  auto G = at::stack(g);  // [K outcomes, K params]
  auto var = (counts.unsqueeze(1) * (G - mean_grad.unsqueeze(0)).pow(2)).sum(0) / (n - 1);
  auto se = (var / n).sqrt();
  auto z = ((mean_grad - target).abs() / (se + 1e-15));
  EXPECT_LT(z.max().item<double>(), 4.0) << "mean " << mean_grad << "\nexact " << target << "\nse " << se;
  // Consistency of the two computations: the batch mean is the count-weighted mean of g(x).
  EXPECT_LT(test::max_abs_diff((counts.unsqueeze(1) * G).sum(0) / n, mean_grad), 1e-10);
}

TEST_P(MonteCarlo, SampledGradientWithinFourStandardErrors) {
  for (double beta : {0.0, 0.05, 0.3})
    for (bool clip : {false, true})  // clip on: bounds that never bind (make_config)
      check_monte_carlo(std::get<0>(GetParam()), std::get<1>(GetParam()), beta, clip);
}

INSTANTIATE_TEST_SUITE_P(AllVariants, MonteCarlo, kAllVariants, variant_name);

}  // namespace
}  // namespace rpg::algo
