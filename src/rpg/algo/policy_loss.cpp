#include "rpg/algo/policy_loss.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "rpg/algo/loss_util.h"

namespace rpg::algo {

// The losses are defined in losses_ppo.cpp (the PPO family, grpo*, gspo, cispo) and
// losses_rpg.cpp (rpg, rpg_reinforce); adding one = its function + one registry line below.
PolicyLossOutput ppo_clip_loss(const PolicyLossInputs&, const PolicyLossConfig&);
PolicyLossOutput grpo_loss(const PolicyLossInputs&, const PolicyLossConfig&);
PolicyLossOutput grpo_corrected_loss(const PolicyLossInputs&, const PolicyLossConfig&);
PolicyLossOutput gspo_loss(const PolicyLossInputs&, const PolicyLossConfig&);
PolicyLossOutput cispo_loss(const PolicyLossInputs&, const PolicyLossConfig&);
PolicyLossOutput rpg_loss(const PolicyLossInputs&, const PolicyLossConfig&);
PolicyLossOutput rpg_reinforce_loss(const PolicyLossInputs&, const PolicyLossConfig&);

namespace {

constexpr bool kRef = true, kOwnKl = true;

void register_policy_losses(Registry<PolicyLossEntry>& r) {
  r.add("ppo", {ppo_clip_loss, !kRef, "PPO clip (eps_low/eps_high) with dual-clip c"});
  r.add("vanilla", {ppo_clip_loss, !kRef, "verl's name of ppo (actor.policy_loss default)"});
  r.add("dapo", {ppo_clip_loss, !kRef, "ppo; DAPO is clip-higher + token-mean + dynamic sampling"});
  r.add("rfpp", {ppo_clip_loss, !kRef, "ppo; REINFORCE++ is its advantage + KL in the reward"});
  r.add("rfppb", {ppo_clip_loss, !kRef, "ppo; REINFORCE++-baseline"});
  r.add("rloo", {ppo_clip_loss, !kRef, "ppo; RLOO is its advantage estimator"});
  r.add("grpo", {grpo_loss, kRef, "ppo + beta * k3(pi_ref/pi_theta), no importance weight (Sec. 2.2)", kOwnKl});
  r.add("grpo_corrected", {grpo_corrected_loss, kRef, "ppo + beta * w * k3(pi_ref/pi_theta) (Sec. 2.2)", kOwnKl});
  r.add("gspo", {gspo_loss, !kRef, "sequence-level importance ratio (Zheng et al. 2025)"});
  r.add("cispo", {cispo_loss, !kRef, "clipped stop-gradient IS weight x log-prob (MiniMax-M1)"});
  r.add("rpg", {rpg_loss, !kRef, "fully differentiable RPG surrogate, KL to pi_old (Tables 1, 4; Alg. 1)", kOwnKl});
  r.add("rpg_reinforce",
        {rpg_reinforce_loss, !kRef, "REINFORCE-style RPG surrogate, KL to pi_old (Table 2; Alg. 2)", kOwnKl});
}

}  // namespace

const Registry<PolicyLossEntry>& policy_loss_registry() {
  static const Registry<PolicyLossEntry> registry = [] {
    Registry<PolicyLossEntry> r("policy_loss");
    register_policy_losses(r);
    return r;
  }();
  return registry;
}

std::vector<std::string> policy_loss_names() { return policy_loss_registry().names(); }

PolicyLossOutput compute_policy_loss(std::string_view name, const PolicyLossInputs& inputs,
                                     const PolicyLossConfig& config) {
  return policy_loss_registry().get(name).fn(inputs, config);
}

void validate(const PolicyLossConfig& c) {
  if (!(c.clip_ratio_low >= 0 && c.clip_ratio_low < 1))
    throw ValueError(str("clip_ratio_low: got ", c.clip_ratio_low, ", expected in [0, 1)"));
  if (!(c.clip_ratio_high >= 0))
    throw ValueError(str("clip_ratio_high: got ", c.clip_ratio_high, ", expected >= 0"));
  if (!(c.clip_ratio_c > 1))
    throw ValueError(str("clip_ratio_c: got ", c.clip_ratio_c, ", expected > 1 (dual-clip bound)"));
  if (!(c.kl_coef >= 0) || !std::isfinite(c.kl_coef))
    throw ValueError(str("kl_coef: got ", c.kl_coef, ", expected a finite value >= 0"));
  if (!(c.old_mass > 0) || !std::isfinite(c.old_mass))
    throw ValueError(str("old_mass: got ", c.old_mass, ", expected a finite value > 0"));
  if (c.old_mass != 1.0 && !is_unnormalized(c.kl))
    throw ValueError(str("old_mass: got ", c.old_mass, " but kl '", to_string(c.kl),
                         "' is normalized (only ufkl/urkl take a mass Z_old != 1)"));
  if (!std::isfinite(c.entropy_coeff))
    throw ValueError(str("entropy_coeff: got ", c.entropy_coeff));
  if (c.rollout_correction != RolloutCorrection::None && !(c.rollout_correction_cap > 0))
    throw ValueError(str("rollout_correction_cap: got ", c.rollout_correction_cap, ", expected > 0"));
}

namespace detail {

void check_inputs(const PolicyLossInputs& in, const PolicyLossConfig& config, const char* loss_name) {
  validate(config);
  auto need = [&](const at::Tensor& t, const char* field) {
    if (!t.defined()) throw ValueError(str(loss_name, ": ", field, " is required"));
    if (t.dim() != 2) throw ValueError(str(loss_name, ": ", field, " must be [B, T], got ", t.sizes()));
  };
  need(in.log_probs, "log_probs");
  need(in.old_log_probs, "old_log_probs");
  need(in.advantages, "advantages");
  need(in.response_mask, "response_mask");
  auto shape = in.log_probs.sizes();
  auto same = [&](const at::Tensor& t, const char* field) {
    if (t.defined() && t.sizes() != shape)
      throw ValueError(str(loss_name, ": ", field, " ", t.sizes(), " differs from log_probs ", shape));
  };
  same(in.old_log_probs, "old_log_probs");
  same(in.advantages, "advantages");
  same(in.response_mask, "response_mask");
  same(in.ref_log_probs, "ref_log_probs");
  same(in.rollout_log_probs, "rollout_log_probs");
  same(in.entropy, "entropy");
  if (!(in.normaliser > 0))
    throw ValueError(str(loss_name, ": normaliser must be > 0 (the mini-batch's token or sequence count), got ",
                         in.normaliser));
}

at::Tensor masked_fraction(const at::Tensor& condition, const at::Tensor& mask) {
  return masked_mean(condition.to(at::kFloat).to(mask.device()), mask.to(at::kFloat)).detach();
}

PolicyLossOutput finish(const PolicyLossInputs& in, const PolicyLossConfig& config, const at::Tensor& pg_losses,
                        std::map<std::string, at::Tensor> metrics, const at::Tensor& extra_loss,
                        double extra_coef) {
  const auto& mask = in.response_mask;
  at::Tensor losses = pg_losses;
  at::Tensor extra = extra_loss;
  if (config.rollout_correction != RolloutCorrection::None) {
    auto rho = rollout_correction_weights(in.old_log_probs, in.rollout_log_probs, mask, config.rollout_correction,
                                          config.rollout_correction_cap);
    losses = losses * rho;
    if (extra.defined()) extra = extra * rho;
    metrics["actor/rollout_is_mean"] = masked_mean(rho, mask).detach();
  }
  auto agg = [&](const at::Tensor& m) {
    return agg_loss(m, mask, config.loss_agg_mode, in.normaliser, config.loss_scale_factor);
  };
  at::Tensor pg_loss = agg(losses);
  at::Tensor loss = pg_loss;
  metrics["actor/pg_loss"] = pg_loss.detach();
  if (extra.defined()) {
    auto extra_agg = agg(extra);
    loss = loss + extra_coef * extra_agg;
    metrics["actor/kl_loss"] = extra_agg.detach();
    metrics["actor/kl_coef"] = at::scalar_tensor(extra_coef, pg_losses.options().dtype(at::kDouble));
  }
  if (in.entropy.defined()) {
    auto ent = agg(in.entropy);
    if (config.entropy_coeff != 0) loss = loss - config.entropy_coeff * ent;
    metrics["actor/entropy"] = masked_mean(in.entropy.detach(), mask);
  }
  {
    at::NoGradGuard no_grad;
    auto log_ratio = clamped_log_ratio(in.log_probs.detach(), in.old_log_probs.detach());
    metrics["actor/ppo_kl"] = masked_mean(-log_ratio, mask);
    metrics["actor/ratio_mean"] = masked_mean(at::exp(log_ratio), mask);
    if (in.ref_log_probs.defined())
      metrics["actor/ref_kl"] =
          masked_mean(kl_estimate(in.log_probs.detach(), in.ref_log_probs.detach(), KlEstimator::K3), mask);
    for (const char* key : {"actor/pg_clipfrac", "actor/pg_clipfrac_upper", "actor/pg_clipfrac_lower"})
      if (!metrics.count(key)) metrics[key] = at::zeros({}, pg_losses.options().dtype(at::kFloat));
  }
  return {loss, std::move(metrics)};
}

}  // namespace detail
}  // namespace rpg::algo
