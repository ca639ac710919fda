// Divergences, per-token KL estimators and importance-ratio helpers (paper Sections 2-3,
// Appendix D). All functions are elementwise on [B, T] log-prob tensors and differentiable.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <string_view>

namespace rpg::algo {

// The four regularisers of the paper, between the trained policy pi_theta and pi_old:
//   FKL  = KL(pi_old || pi_theta)            (Appendix E.1)
//   RKL  = KL(pi_theta || pi_old)            (Appendix E.2)
//   UFKL = UKL(pi_old || pi_theta)           (Definition 3.1, pi_old may have mass Z_old != 1)
//   URKL = UKL(pi_theta || pi_old)           (Definition 3.4)
enum class Divergence { FKL, RKL, UFKL, URKL };

Divergence parse_divergence(std::string_view name);  // "fkl" | "rkl" | "ufkl" | "urkl"
std::string to_string(Divergence d);
bool is_unnormalized(Divergence d);

// Per-sample estimators of KL(p || q) for a sample drawn from p, from log p and log q.
enum class KlEstimator {
  K1,        // "k1" / "kl": log p - log q
  Abs,       // "abs": |log p - log q|
  K2,        // "k2" / "mse": (log p - log q)^2 / 2
  K3,        // "k3": k3(q/p) = q/p - 1 - log(q/p), exact (Schulman 2020; = UKL, Appendix D)
  LowVarKl,  // "low_var_kl": verl's k3 with the log-ratio clamped to [-20, 20] and the value to [-10, 10]
};

KlEstimator parse_kl_estimator(std::string_view name);
std::string to_string(KlEstimator e);

// k3(y) = y - 1 - log y, evaluated from log y (stable for large |log y|).
at::Tensor k3_from_log(const at::Tensor& log_y);

// Elementwise estimate of KL(p || q) from log p, log q. [B, T] -> [B, T].
at::Tensor kl_estimate(const at::Tensor& log_p, const at::Tensor& log_q, KlEstimator estimator);

// REINFORCE++ / PPO-RLHF reward shaping: r'_t = r_t - beta * KL_est(pi_old || pi_ref)_t on
// response tokens (Appendix C.2), returning token_level_rewards [B, T]. No gradient.
at::Tensor apply_kl_penalty(const at::Tensor& token_level_scores, const at::Tensor& old_log_probs,
                            const at::Tensor& ref_log_probs, const at::Tensor& response_mask,
                            double beta, KlEstimator estimator);

// log(pi_theta / pi_old) clamped to [-20, 20] (as verl) before exp, so a diverged token
// cannot overflow the weight; the clamp never binds in sane training.
at::Tensor clamped_log_ratio(const at::Tensor& log_probs, const at::Tensor& old_log_probs);

// Rollout correction: the sampling engine's log-probs (rollout_log_probs) differ from the
// trainer's recomputation of the same policy (old_log_probs). Truncated importance sampling
// reweights each token's loss by rho = min(pi_old / pi_rollout, cap), with no gradient.
enum class RolloutCorrection {
  None,      // "none"
  Token,     // "token": rho_t per token
  Sequence,  // "sequence": rho = prod_t rho_t per row (same weight on every token of the row)
};

RolloutCorrection parse_rollout_correction(std::string_view name);
std::string to_string(RolloutCorrection r);

// Detached weights [B, T] (1 on padding). cap > 0.
at::Tensor rollout_correction_weights(const at::Tensor& old_log_probs, const at::Tensor& rollout_log_probs,
                                      const at::Tensor& response_mask, RolloutCorrection mode, double cap);

}  // namespace rpg::algo
