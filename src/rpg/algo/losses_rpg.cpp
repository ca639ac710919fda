// RPG: KL-regularised policy-gradient surrogates whose gradient is exactly -grad J for
//   J(theta) = E_{pi_theta}[R] - beta * Div(pi_theta, pi_old),
// sampling x ~ pi_old (normalised: pi_old / Z_old), w = pi_theta / pi_old per token.
//
// rpg            fully differentiable surrogates (Table 1, Table 4); with clip: Algorithm 1.
// rpg_reinforce  REINFORCE-style, weight under stop-gradient (Table 2, Appendix F); with
//                clip: Algorithm 2 (RPG-REINFORCE with RPG-Style Clip).
// The advantages input plays R(x) - b (a baseline b independent of x keeps the gradient
// unbiased because sum_x grad pi_theta(x) = 0).
#include <ATen/ATen.h>

#include "rpg/algo/loss_util.h"
#include "rpg/algo/policy_loss.h"

namespace rpg::algo {

namespace {

using detail::masked_fraction;

struct Terms {
  at::Tensor log_w;  // [B, T] log pi_theta - log pi_old (differentiable, clamped to +-20)
  at::Tensor w;      // [B, T] exp(log_w)
  at::Tensor A;      // [B, T] advantages, no gradient
  double beta = 0;
  double Z = 1;      // Z_old for the unnormalised divergences, 1 otherwise
};

Terms make_terms(const PolicyLossInputs& in, const PolicyLossConfig& c) {
  Terms t;
  t.log_w = clamped_log_ratio(in.log_probs, in.old_log_probs);
  t.w = at::exp(t.log_w);
  t.A = in.advantages.detach();
  t.beta = c.kl_coef;
  t.Z = is_unnormalized(c.kl) ? c.old_mass : 1.0;
  return t;
}

// Per-token estimate of Div(pi_theta, pi_old) whose expectation under x ~ pi_old / Z_old is the
// divergence itself (Appendix D for the k3 forms). Detached: a metric.
at::Tensor divergence_estimate(const Terms& t, Divergence kl) {
  auto lw = t.log_w.detach();
  auto w = t.w.detach();
  switch (kl) {
    case Divergence::FKL: return -lw;
    case Divergence::RKL: return w * lw;
    case Divergence::UFKL: return t.Z * (w - lw - 1);
    case Divergence::URKL: return t.Z * (w * lw - w + 1);
  }
  return lw;
}

// Table 1 (UFKL, URKL) and Table 4 (FKL, RKL) per-sample losses. Two constant shifts that
// leave the gradient unchanged make each loss's expectation the objective's value:
// FKL uses -beta*log w (= -beta*log pi_theta + const), URKL adds +beta (mass correction).
at::Tensor differentiable_loss(const Terms& t, Divergence kl) {
  const auto& w = t.w;
  const auto& lw = t.log_w;
  switch (kl) {
    case Divergence::FKL: return -w * t.A - t.beta * lw;
    case Divergence::RKL: return w * (-t.A + t.beta * lw);
    case Divergence::UFKL: return t.Z * (-w * t.A + t.beta * (w - lw - 1));
    case Divergence::URKL: return t.Z * (-w * t.A + t.beta * (w * lw - w + 1));
  }
  throw ValueError("rpg: invalid kl");
}

// Regularised advantage A-hat of Algorithm 1, differentiable through w. RKL and URKL are the
// paper's (Section 3.3): A - beta(log w + 1) and A - beta log w; -w*A-hat then differs from
// the Table loss by beta*w, whose expected gradient sum_x grad pi_theta(x) is zero. For FKL
// and UFKL the gradient weight over w (A + beta/w, A - beta(1 - 1/w)) would lose the KL
// gradient once differentiated through w, so A-hat is defined by -w*A-hat = Table loss.
at::Tensor regularized_advantage(const Terms& t, Divergence kl) {
  const auto& w = t.w;
  const auto& lw = t.log_w;
  switch (kl) {
    case Divergence::FKL: return t.A + t.beta * lw / w;
    case Divergence::RKL: return t.A - t.beta * (lw + 1);
    case Divergence::UFKL: return t.A - t.beta * (w - lw - 1) / w;
    case Divergence::URKL: return t.A - t.beta * lw;
  }
  throw ValueError("rpg: invalid kl");
}

// Table 2 / Appendix F: the weight of grad log pi_theta in grad J, split as
// Weight = Z * (w * A + C_KL); returns C_KL (detached by the caller).
at::Tensor kl_component(const Terms& t, Divergence kl) {
  auto w = t.w.detach();
  auto lw = t.log_w.detach();
  switch (kl) {
    case Divergence::FKL: return at::full_like(w, t.beta);       // w A + beta
    case Divergence::RKL: return -t.beta * w * (lw + 1);           // w (A - beta log w - beta)
    case Divergence::UFKL: return -t.beta * (w - 1);               // Z (w A - beta (w - 1))
    case Divergence::URKL: return -t.beta * w * lw;                // Z w (A - beta log w)
  }
  throw ValueError("rpg_reinforce: invalid kl");
}

}  // namespace

PolicyLossOutput rpg_loss(const PolicyLossInputs& in, const PolicyLossConfig& c) {
  detail::check_inputs(in, c, "rpg");
  auto t = make_terms(in, c);
  std::map<std::string, at::Tensor> metrics;
  metrics["actor/rpg_kl"] = masked_mean(divergence_estimate(t, c.kl), in.response_mask);
  if (!c.clip) return detail::finish(in, c, differentiable_loss(t, c.kl), std::move(metrics));

  // Algorithm 1 (lines 13-23): clip w, not A-hat; gradient through A-hat survives clipping.
  auto A_hat = regularized_advantage(t, c.kl);
  auto negative = A_hat.detach() < 0;
  auto w_clipped = at::clamp(t.w, 1.0 - c.clip_ratio_low, 1.0 + c.clip_ratio_high);
  auto term1 = -t.w * A_hat;
  auto term2 = -w_clipped * A_hat;
  auto l_clip = at::maximum(term1, term2);
  auto lower_bound = -c.clip_ratio_c * A_hat;
  auto losses = t.Z * at::where(negative, at::minimum(l_clip, lower_bound), l_clip);
  const auto& mask = in.response_mask;
  auto clipped = term2.detach() > term1.detach();
  metrics["actor/pg_clipfrac"] = masked_fraction(clipped, mask);
  metrics["actor/pg_clipfrac_upper"] = masked_fraction(clipped & ~negative, mask);
  metrics["actor/pg_clipfrac_lower"] = masked_fraction((l_clip.detach() > lower_bound.detach()) & negative, mask);
  return detail::finish(in, c, losses, std::move(metrics));
}

PolicyLossOutput rpg_reinforce_loss(const PolicyLossInputs& in, const PolicyLossConfig& c) {
  detail::check_inputs(in, c, "rpg_reinforce");
  auto t = make_terms(in, c);
  const auto& mask = in.response_mask;
  std::map<std::string, at::Tensor> metrics;
  metrics["actor/rpg_kl"] = masked_mean(divergence_estimate(t, c.kl), mask);
  auto C = kl_component(t, c.kl);
  auto w = t.w.detach();
  if (!c.clip) {
    // L = -SG(Weight) log pi_theta (Eq. F.1).
    auto weight = t.Z * (w * t.A + C);
    return detail::finish(in, c, -weight * in.log_probs, std::move(metrics));
  }

  // Algorithm 2, line by line. l = -log pi_theta keeps the gradient; l_sg does not.
  auto l = -in.log_probs;
  auto l_sg = l.detach();
  const double w_high = 1.0 + c.clip_ratio_high;
  const double w_low = 1.0 - c.clip_ratio_low;
  const double cc = c.clip_ratio_c;
  auto A_eff = t.A + C / w;                                      // line 14: A' = A_R + SG(C)/SG(w)
  auto psi = A_eff * l;                                          // line 15
  auto grad_branch = psi * w;                                    // lines 19, 32: psi * SG(w)
  auto high = (t.A + C / w_high) * l_sg * w_high;                // lines 21-23
  auto low = (t.A + C / w_low) * l_sg * w_low;                   // lines 28-30
  auto dual = t.A * l_sg * cc + C * l_sg;                        // line 34
  auto nonneg = psi.detach() >= 0;                               // line 16
  auto positive_case = at::where(w < w_high, grad_branch, high);  // lines 18-24
  auto negative_case = at::where(w <= w_low, low, at::where(w < cc, grad_branch, dual));  // lines 27-35
  auto losses = t.Z * at::where(nonneg, positive_case, negative_case);
  auto upper = nonneg & (w >= w_high);
  auto lower = ~nonneg & (w <= w_low);
  metrics["actor/pg_clipfrac"] = masked_fraction(upper | lower, mask);
  metrics["actor/pg_clipfrac_upper"] = masked_fraction(upper, mask);
  metrics["actor/pg_clipfrac_lower"] = masked_fraction(~nonneg & (w > w_low) & (w >= cc), mask);
  return detail::finish(in, c, losses, std::move(metrics));
}

}  // namespace rpg::algo
