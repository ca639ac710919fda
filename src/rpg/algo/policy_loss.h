// Policy losses: one signature, one registry. Every loss takes PolicyLossInputs +
// PolicyLossConfig and returns the scalar loss of this micro-batch plus verl-style metrics.
//
//   registered name   what                                              paper / origin
//   ppo, vanilla      PPO clip, eps_low/eps_high + dual-clip c          (C.3), Ye et al. 2020
//   dapo, rfpp, rfppb, rloo
//                     the same PPO clip loss (these baselines differ in advantage estimator
//                     and config: DAPO clip-higher + token-mean, REINFORCE++ KL in reward)
//   grpo              PPO clip + beta * k3(pi_ref/pi_theta), no importance weight (Sec. 2.2)
//   grpo_corrected    PPO clip + beta * w * k3(pi_ref/pi_theta), w = pi_theta/pi_old (Sec. 2.2)
//   rpg               fully differentiable RPG surrogate for config.kl (Tables 1, 4) and,
//                     with config.clip, RPG-Style Clip (Sec. 3.3, Algorithm 1)
//   rpg_reinforce     REINFORCE-style RPG surrogate (Table 2, Appendix F) and, with
//                     config.clip, RPG-REINFORCE with RPG-Style Clip (Algorithm 2)
//   gspo              sequence-level importance ratio (Zheng et al. 2025)
//   cispo             clipped, stop-gradient IS weight times log-prob (MiniMax-M1 2025)
//
// See docs/algorithms.md for the formulas and the tests that prove each one.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "rpg/algo/aggregate.h"
#include "rpg/algo/kl.h"
#include "rpg/algo/registry.h"

namespace rpg::algo {

struct PolicyLossConfig {
  double clip_ratio_low = 0.2;   // eps_low  (epsilon_1): lower clip bound 1 - eps_low
  double clip_ratio_high = 0.2;  // eps_high (epsilon_2): upper clip bound 1 + eps_high (DAPO: 0.28)
  double clip_ratio_c = 3.0;     // dual-clip bound c > 1 on w for negative advantages
  bool clip = true;              // rpg / rpg_reinforce: RPG-Style Clip on (Alg. 1 / 2) or off (Tables)
  Divergence kl = Divergence::URKL;  // rpg / rpg_reinforce: the regulariser Div(pi_theta, pi_old)
  double kl_coef = 0.0;          // beta: weight of the KL term (rpg*, grpo*)
  KlEstimator kl_loss_type = KlEstimator::LowVarKl;  // grpo*: estimator of KL(pi_theta || pi_ref)
  double old_mass = 1.0;         // Z_old: total mass of pi_old for ufkl/urkl (1 for an LLM policy)
  LossAggMode loss_agg_mode = LossAggMode::TokenMean;
  double loss_scale_factor = 0.0;  // seq-mean-token-sum-norm constant (<= 0: T of the batch)
  double entropy_coeff = 0.0;    // entropy bonus: loss -= entropy_coeff * agg(entropy)
  RolloutCorrection rollout_correction = RolloutCorrection::None;
  double rollout_correction_cap = 2.0;  // truncation of the rollout IS weight
};

// Throws ValueError naming the field when a value is out of range (eps < 0, c <= 1, ...).
void validate(const PolicyLossConfig& config);

struct PolicyLossInputs {
  at::Tensor log_probs;          // [B, T] log pi_theta of the response tokens, differentiable
  at::Tensor old_log_probs;      // [B, T] log pi_old: sampling policy and RPG's regularisation target
  at::Tensor ref_log_probs;      // [B, T] optional: log pi_ref (grpo KL term, kl-to-ref metric)
  at::Tensor rollout_log_probs;  // [B, T] optional: the sampling engine's log-probs (rollout correction)
  at::Tensor advantages;         // [B, T] A (reward minus baseline), no gradient
  at::Tensor response_mask;      // [B, T] 1 on response tokens, 0 on padding
  at::Tensor entropy;            // [B, T] optional, differentiable: per-token policy entropy
  // Global normaliser of the whole mini-batch (loss_normaliser(mini_batch_mask, mode)): the
  // token count for token-mean, the sequence count for seq-mean-*. Never the micro-batch's own.
  double normaliser = 0.0;
};

// Metric keys (each a detached 0-dim tensor; averaged over this micro-batch's valid tokens):
//   actor/pg_loss            aggregated policy-gradient part of the loss (with KL term for rpg*)
//   actor/pg_clipfrac        fraction of tokens clipped at 1-eps_low or 1+eps_high (verl's key)
//   actor/pg_clipfrac_upper  ... of which at the upper bound (A >= 0, w >= 1+eps_high)
//   actor/pg_clipfrac_lower  fraction of tokens stopped by the dual clip (A < 0, w >= c) (verl's key)
//   actor/ppo_kl             mean of log pi_old - log pi_theta: approximate KL to the sampling policy
//   actor/ratio_mean         mean importance weight w = pi_theta / pi_old
//   actor/kl_loss, actor/kl_coef  grpo*: the KL-to-reference term and beta
//   actor/rpg_kl             rpg*: unbiased per-token estimate of Div(pi_theta, pi_old) (no beta)
//   actor/ref_kl             when ref_log_probs is given: mean k3 estimate of KL(pi_theta || pi_ref)
//   actor/entropy            when entropy is given: mean entropy
//   actor/rollout_is_mean    with rollout correction: mean truncated IS weight
struct PolicyLossOutput {
  at::Tensor loss;  // scalar: sum over micro-batches of a mini-batch = the mini-batch loss
  std::map<std::string, at::Tensor> metrics;
};

using PolicyLossFn = PolicyLossOutput (*)(const PolicyLossInputs&, const PolicyLossConfig&);

// A registry entry declares what its loss needs, so the trainer and the config check ask the
// entry, never the name. A bare function converts to an entry with the defaults.
struct PolicyLossEntry {
  PolicyLossFn fn = nullptr;
  // Its KL term (kl_coef > 0, i.e. use_kl_loss) is towards pi_ref: a reference model's
  // log-probs (ref_log_probs) are required.
  bool needs_reference = false;
  const char* description = "";
  // It applies config.kl_coef itself (grpo*: towards pi_ref, rpg*: towards pi_old). For the
  // others the trainer adds verl's KL loss term kl_coef * agg(kl_estimate(log_prob, pi_ref))
  // outside the loss when use_kl_loss is on (verl dp_actor), so the term is never dropped.
  bool own_kl_term = false;
  PolicyLossEntry(PolicyLossFn f, bool needs_ref = false, const char* what = "", bool own_kl = false)  // NOLINT
      : fn(f), needs_reference(needs_ref), description(what), own_kl_term(own_kl) {}
};

// The registry of every policy loss, filled once by register_policy_losses() (policy_loss.cpp).
const Registry<PolicyLossEntry>& policy_loss_registry();
std::vector<std::string> policy_loss_names();

// Looks the loss up by name (ValueError listing the valid names) and runs it.
PolicyLossOutput compute_policy_loss(std::string_view name, const PolicyLossInputs& inputs,
                                     const PolicyLossConfig& config);

}  // namespace rpg::algo
