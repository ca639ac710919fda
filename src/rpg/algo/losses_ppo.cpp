// The baselines' policy losses: PPO clip with clip-higher and dual-clip (GRPO, DAPO,
// REINFORCE++, RLOO all train with it), GRPO's KL term as published and corrected,
// GSPO and CISPO.
#include <ATen/ATen.h>

#include "rpg/algo/loss_util.h"
#include "rpg/algo/policy_loss.h"

namespace rpg::algo {

namespace {

using detail::masked_fraction;

// Dual-clip PPO (Schulman et al. 2017 Eq. C.3 with separate eps_low / eps_high as in DAPO,
// and the bound c for negative advantages of Ye et al. 2020). Per-token loss [B, T].
at::Tensor ppo_clip_matrix(const PolicyLossInputs& in, const PolicyLossConfig& c,
                           std::map<std::string, at::Tensor>& metrics) {
  const auto& A = in.advantages;
  auto ratio = at::exp(clamped_log_ratio(in.log_probs, in.old_log_probs));
  auto unclipped = -A * ratio;
  auto clipped = -A * at::clamp(ratio, 1.0 - c.clip_ratio_low, 1.0 + c.clip_ratio_high);
  auto trust_region = at::maximum(unclipped, clipped);
  auto dual = -A * c.clip_ratio_c;
  auto negative = A < 0;
  auto losses = at::where(negative, at::minimum(dual, trust_region), trust_region);
  const auto& mask = in.response_mask;
  metrics["actor/pg_clipfrac"] = masked_fraction(clipped > unclipped, mask);
  metrics["actor/pg_clipfrac_upper"] = masked_fraction((clipped > unclipped) & ~negative, mask);
  metrics["actor/pg_clipfrac_lower"] = masked_fraction((trust_region > dual) & negative, mask);
  return losses;
}

PolicyLossOutput grpo_common(const PolicyLossInputs& in, const PolicyLossConfig& c, bool corrected,
                             const char* name) {
  detail::check_inputs(in, c, name);
  std::map<std::string, at::Tensor> metrics;
  auto losses = ppo_clip_matrix(in, c, metrics);
  if (c.kl_coef == 0 && !in.ref_log_probs.defined()) return detail::finish(in, c, losses, std::move(metrics));
  if (!in.ref_log_probs.defined())
    throw ValueError(str(name, ": kl_coef = ", c.kl_coef, " needs ref_log_probs"));
  // Published GRPO: k3(pi_ref / pi_theta) per sampled token, as if the token came from
  // pi_theta. Samples come from pi_old, so the unbiased estimator of UKL(pi_theta || pi_ref)
  // multiplies by w = pi_theta / pi_old (Section 2.2); w stays differentiable.
  auto kl = kl_estimate(in.log_probs, in.ref_log_probs, c.kl_loss_type);
  if (corrected) kl = at::exp(clamped_log_ratio(in.log_probs, in.old_log_probs)) * kl;
  return detail::finish(in, c, losses, std::move(metrics), kl, c.kl_coef);
}

}  // namespace

PolicyLossOutput ppo_clip_loss(const PolicyLossInputs& in, const PolicyLossConfig& c) {
  detail::check_inputs(in, c, "ppo");
  std::map<std::string, at::Tensor> metrics;
  auto losses = ppo_clip_matrix(in, c, metrics);
  return detail::finish(in, c, losses, std::move(metrics));
}

PolicyLossOutput grpo_loss(const PolicyLossInputs& in, const PolicyLossConfig& c) {
  return grpo_common(in, c, /*corrected=*/false, "grpo");
}

PolicyLossOutput grpo_corrected_loss(const PolicyLossInputs& in, const PolicyLossConfig& c) {
  return grpo_common(in, c, /*corrected=*/true, "grpo_corrected");
}

// GSPO: one importance ratio per sequence, s_i = exp(mean_t log w_it), applied to every
// token with a straight-through token gradient: log s_it = sg(log s_i) + log p_it - sg(log p_it).
PolicyLossOutput gspo_loss(const PolicyLossInputs& in, const PolicyLossConfig& c) {
  detail::check_inputs(in, c, "gspo");
  const auto& mask = in.response_mask;
  auto m = mask.to(in.log_probs.scalar_type());
  auto log_ratio = in.log_probs - in.old_log_probs;
  auto lengths = m.sum(1).clamp_min(1.0);
  auto seq_log_ratio = at::where(mask != 0, log_ratio, at::zeros_like(log_ratio)).sum(1) / lengths;
  auto log_s = in.log_probs - in.log_probs.detach() + seq_log_ratio.detach().unsqueeze(-1);
  auto s = at::exp(at::clamp_max(log_s, 10.0));
  const auto& A = in.advantages;
  auto unclipped = -A * s;
  auto clipped = -A * at::clamp(s, 1.0 - c.clip_ratio_low, 1.0 + c.clip_ratio_high);
  auto losses = at::maximum(unclipped, clipped);
  std::map<std::string, at::Tensor> metrics;
  metrics["actor/pg_clipfrac"] = masked_fraction(clipped > unclipped, mask);
  metrics["actor/pg_clipfrac_upper"] = masked_fraction((clipped > unclipped) & (A >= 0), mask);
  return detail::finish(in, c, losses, std::move(metrics));
}

// CISPO: loss = -sg(clip(w, 1-eps_low, 1+eps_high)) * A * log pi_theta. Every token keeps
// a gradient (only its weight is clipped), unlike PPO where clipped tokens drop out.
PolicyLossOutput cispo_loss(const PolicyLossInputs& in, const PolicyLossConfig& c) {
  detail::check_inputs(in, c, "cispo");
  auto ratio = at::exp(clamped_log_ratio(in.log_probs, in.old_log_probs));
  auto clipped = at::clamp(ratio, 1.0 - c.clip_ratio_low, 1.0 + c.clip_ratio_high).detach();
  auto losses = -clipped * in.advantages * in.log_probs;
  std::map<std::string, at::Tensor> metrics;
  metrics["actor/pg_clipfrac"] = detail::masked_fraction(ratio.detach() != clipped, in.response_mask);
  metrics["actor/pg_clipfrac_upper"] =
      detail::masked_fraction(ratio.detach() > 1.0 + c.clip_ratio_high, in.response_mask);
  return detail::finish(in, c, losses, std::move(metrics));
}

}  // namespace rpg::algo
