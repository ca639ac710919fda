// Clip behaviour of PPO dual-clip, RPG-Style Clip (Algorithm 1) and RPG-REINFORCE with
// RPG-Style Clip (Algorithm 2) on one token: for w below 1 - eps_low, inside the band, above
// 1 + eps_high and above c, with positive and negative advantages, the gradient is exactly
// zero where the algorithm stops it and equals the unclipped gradient where it flows.
#include <gtest/gtest.h>

#include <cmath>

#include "algo_test_util.h"
#include "rpg/algo/policy_loss.h"

namespace rpg::algo {
namespace {

constexpr double kOldProb = 0.2;  // pi_old(token); pi_theta = w * 0.2 <= 0.8 stays a probability
constexpr double kEpsLow = 0.2, kEpsHigh = 0.28, kC = 3.0;
const double kWs[] = {0.5, 1.0, 1.5, 4.0};

enum class Region { BelowLow, Band, AboveHigh, AboveC };
Region region_of(double w) {
  if (w <= 1 - kEpsLow) return Region::BelowLow;
  if (w < 1 + kEpsHigh) return Region::Band;
  if (w < kC) return Region::AboveHigh;
  return Region::AboveC;
}

// Where PPO dual-clip (and Algorithms 1-2) let the gradient through w flow.
bool flows(Region r, bool positive_advantage) {
  if (positive_advantage) return r == Region::BelowLow || r == Region::Band;
  return r == Region::Band || r == Region::AboveHigh;
}

struct Token {
  at::Tensor theta;  // log pi_theta(token), requires grad
  PolicyLossInputs in;
};

Token token(double w, double advantage) {
  Token t;
  t.theta = at::scalar_tensor(std::log(w * kOldProb), at::kDouble).requires_grad_(true);
  t.in.log_probs = t.theta.view({1, 1});
  t.in.old_log_probs = at::full({1, 1}, std::log(kOldProb), at::kDouble);
  t.in.advantages = at::full({1, 1}, advantage, at::kDouble);
  t.in.response_mask = at::ones({1, 1}, at::kDouble);
  t.in.normaliser = 1.0;
  return t;
}

PolicyLossConfig clip_config(bool clip, Divergence kl = Divergence::URKL, double beta = 0.0) {
  PolicyLossConfig c;
  c.clip_ratio_low = kEpsLow;
  c.clip_ratio_high = kEpsHigh;
  c.clip_ratio_c = kC;
  c.clip = clip;
  c.kl = kl;
  c.kl_coef = beta;
  return c;
}

double grad(const std::string& loss, double w, double adv, const PolicyLossConfig& c) {
  auto t = token(w, adv);
  return test::grad_of(compute_policy_loss(loss, t.in, c).loss, t.theta).item<double>();
}

TEST(ClipBehaviour, PpoDualClip) {
  for (double adv : {1.0, -1.0})
    for (double w : kWs) {
      double g = grad("ppo", w, adv, clip_config(true));
      // d(-A w)/d log pi_theta = -A w.
      double expected = flows(region_of(w), adv > 0) ? -adv * w : 0.0;
      EXPECT_NEAR(g, expected, 1e-12) << "w=" << w << " A=" << adv;
      if (expected == 0.0) {
        EXPECT_EQ(g, 0.0) << "w=" << w << " A=" << adv;
      }
    }
}

TEST(ClipBehaviour, RpgAlgorithm1WithoutKlIsPpo) {
  for (auto kl : {Divergence::FKL, Divergence::RKL, Divergence::UFKL, Divergence::URKL})
    for (double adv : {1.0, -1.0})
      for (double w : kWs) {
        double g = grad("rpg", w, adv, clip_config(true, kl));
        double unclipped = grad("rpg", w, adv, clip_config(false, kl));
        EXPECT_NEAR(unclipped, -adv * w, 1e-12);
        if (flows(region_of(w), adv > 0)) {
          EXPECT_NEAR(g, unclipped, 1e-12) << to_string(kl) << " w=" << w << " A=" << adv;
        } else {
          EXPECT_EQ(g, 0.0) << to_string(kl) << " w=" << w << " A=" << adv;
        }
      }
}

// Algorithm 1 with beta > 0: the clip stops the gradient through w; A-hat keeps its own
// (Figure 2: "Grad = 0 (w.r.t. w)"). A-hat as defined in Section 3.3 (RKL, URKL) and by
// -w A-hat = Table 1/4 loss (FKL, UFKL), written here from the formulas.
at::Tensor a_hat(Divergence kl, const at::Tensor& log_w, double A, double beta) {
  auto w = log_w.exp();
  switch (kl) {
    case Divergence::FKL: return A + beta * log_w / w;
    case Divergence::RKL: return A - beta * (log_w + 1);
    case Divergence::UFKL: return A - beta * (w - log_w - 1) / w;
    case Divergence::URKL: return A - beta * log_w;
  }
  return log_w;
}

TEST(ClipBehaviour, RpgAlgorithm1WithKl) {
  const double beta = 0.05;
  for (auto kl : {Divergence::FKL, Divergence::RKL, Divergence::UFKL, Divergence::URKL})
    for (double adv : {1.0, -1.0})
      for (double w : kWs) {
        double g = grad("rpg", w, adv, clip_config(true, kl, beta));
        auto t = token(w, adv);
        auto log_w = t.theta - std::log(kOldProb);
        auto ah = a_hat(kl, log_w, adv, beta);
        bool positive = ah.item<double>() >= 0;
        ASSERT_EQ(positive, adv > 0);  // beta small: A-hat keeps the sign of A here
        auto r = region_of(w);
        at::Tensor expected_loss;
        if (flows(r, positive)) {
          expected_loss = -log_w.exp() * ah;
        } else if (!positive && r == Region::AboveC) {
          expected_loss = -kC * ah;
        } else {
          double w_clipped = std::min(std::max(w, 1 - kEpsLow), 1 + kEpsHigh);
          expected_loss = -w_clipped * ah;
        }
        double expected = test::grad_of(expected_loss, t.theta).item<double>();
        EXPECT_NEAR(g, expected, 1e-12) << to_string(kl) << " w=" << w << " A=" << adv;
      }
}

TEST(ClipBehaviour, RpgReinforceAlgorithm2) {
  for (double beta : {0.0, 0.05})
    for (auto kl : {Divergence::FKL, Divergence::RKL, Divergence::UFKL, Divergence::URKL})
      for (double adv : {1.0, -1.0})
        for (double w : kWs) {
          double g = grad("rpg_reinforce", w, adv, clip_config(true, kl, beta));
          double unclipped = grad("rpg_reinforce", w, adv, clip_config(false, kl, beta));
          // Table 2 / Appendix F weight of grad log pi: -grad L = Weight; beta = 0 -> w A.
          if (beta == 0.0) {
            EXPECT_NEAR(unclipped, -adv * w, 1e-12);
          }
          if (flows(region_of(w), adv > 0)) {
            EXPECT_NEAR(g, unclipped, 1e-12) << to_string(kl) << " beta=" << beta << " w=" << w << " A=" << adv;
          } else {
            EXPECT_EQ(g, 0.0) << to_string(kl) << " beta=" << beta << " w=" << w << " A=" << adv;
          }
        }
}

// Algorithm 2 branches on psi = A' * l, not on A: with l = -log pi > 0 the sign of psi is the
// sign of the effective advantage A' = A + C_KL / w, which the KL term can flip.
TEST(ClipBehaviour, RpgReinforceBranchesOnEffectiveAdvantage) {
  // URKL: C_KL = -beta w log w; at w = 1.5, A = 0.01, beta = 0.3: A' = 0.01 - 0.3 log 1.5 < 0,
  // so the token is in the negative branch where w = 1.5 (< c) still flows.
  double g = grad("rpg_reinforce", 1.5, 0.01, clip_config(true, Divergence::URKL, 0.3));
  double unclipped = grad("rpg_reinforce", 1.5, 0.01, clip_config(false, Divergence::URKL, 0.3));
  EXPECT_NE(g, 0.0);
  EXPECT_NEAR(g, unclipped, 1e-12);
  // Same w with A' > 0 is clipped (w >= 1 + eps_high).
  EXPECT_EQ(grad("rpg_reinforce", 1.5, 1.0, clip_config(true, Divergence::URKL, 0.3)), 0.0);
}

TEST(ClipBehaviour, ClipFractionsCountEachRegion) {
  // One row per (w, A) pair: 4 w values x 2 signs = 8 tokens.
  std::vector<double> ws, as;
  for (double a : {1.0, -1.0})
    for (double w : kWs) {
      ws.push_back(w);
      as.push_back(a);
    }
  auto w = at::tensor(ws, at::kDouble).view({1, 8});
  PolicyLossInputs in;
  in.old_log_probs = at::full({1, 8}, std::log(kOldProb), at::kDouble);
  in.log_probs = (w * kOldProb).log();
  in.advantages = at::tensor(as, at::kDouble).view({1, 8});
  in.response_mask = at::ones({1, 8}, at::kDouble);
  in.normaliser = 8;
  for (const char* loss : {"ppo", "rpg", "rpg_reinforce"}) {
    auto out = compute_policy_loss(loss, in, clip_config(true));
    // upper: A>0 with w in {1.5, 4}; low: A<0 with w = 0.5; dual: A<0 with w = 4.
    EXPECT_NEAR(out.metrics.at("actor/pg_clipfrac_upper").item<double>(), 2.0 / 8, 1e-6) << loss;
    EXPECT_NEAR(out.metrics.at("actor/pg_clipfrac").item<double>(), 3.0 / 8, 1e-6) << loss;
    EXPECT_NEAR(out.metrics.at("actor/pg_clipfrac_lower").item<double>(), 1.0 / 8, 1e-6) << loss;
  }
}

}  // namespace
}  // namespace rpg::algo
