#include "rpg/algo/kl.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "rpg/core/error.h"

namespace rpg::algo {

Divergence parse_divergence(std::string_view name) {
  if (name == "fkl") return Divergence::FKL;
  if (name == "rkl") return Divergence::RKL;
  if (name == "ufkl") return Divergence::UFKL;
  if (name == "urkl") return Divergence::URKL;
  throw ValueError(str("unknown kl form '", name, "'; valid: fkl, rkl, ufkl, urkl"));
}

std::string to_string(Divergence d) {
  switch (d) {
    case Divergence::FKL: return "fkl";
    case Divergence::RKL: return "rkl";
    case Divergence::UFKL: return "ufkl";
    case Divergence::URKL: return "urkl";
  }
  return "?";
}

bool is_unnormalized(Divergence d) { return d == Divergence::UFKL || d == Divergence::URKL; }

KlEstimator parse_kl_estimator(std::string_view name) {
  if (name == "k1" || name == "kl") return KlEstimator::K1;
  if (name == "abs") return KlEstimator::Abs;
  if (name == "k2" || name == "mse") return KlEstimator::K2;
  if (name == "k3") return KlEstimator::K3;
  if (name == "low_var_kl") return KlEstimator::LowVarKl;
  throw ValueError(str("unknown kl estimator '", name, "'; valid: k1 (kl), abs, k2 (mse), k3, low_var_kl"));
}

std::string to_string(KlEstimator e) {
  switch (e) {
    case KlEstimator::K1: return "k1";
    case KlEstimator::Abs: return "abs";
    case KlEstimator::K2: return "k2";
    case KlEstimator::K3: return "k3";
    case KlEstimator::LowVarKl: return "low_var_kl";
  }
  return "?";
}

at::Tensor k3_from_log(const at::Tensor& log_y) { return at::exp(log_y) - 1 - log_y; }

at::Tensor kl_estimate(const at::Tensor& log_p, const at::Tensor& log_q, KlEstimator estimator) {
  if (log_p.sizes() != log_q.sizes())
    throw ValueError(str("kl_estimate: shapes ", log_p.sizes(), " and ", log_q.sizes(), " differ"));
  switch (estimator) {
    case KlEstimator::K1: return log_p - log_q;
    case KlEstimator::Abs: return (log_p - log_q).abs();
    case KlEstimator::K2: return 0.5 * (log_p - log_q).pow(2);
    case KlEstimator::K3: return k3_from_log(log_q - log_p);
    case KlEstimator::LowVarKl: {
      auto log_y = at::clamp(log_q - log_p, -20.0, 20.0);
      return at::clamp(k3_from_log(log_y), -10.0, 10.0);
    }
  }
  throw ValueError("kl_estimate: invalid estimator");
}

at::Tensor apply_kl_penalty(const at::Tensor& token_level_scores, const at::Tensor& old_log_probs,
                            const at::Tensor& ref_log_probs, const at::Tensor& response_mask,
                            double beta, KlEstimator estimator) {
  auto kl = kl_estimate(old_log_probs.detach(), ref_log_probs.detach(), estimator);
  return token_level_scores - beta * kl * response_mask.to(kl.scalar_type());
}

at::Tensor clamped_log_ratio(const at::Tensor& log_probs, const at::Tensor& old_log_probs) {
  return at::clamp(log_probs - old_log_probs, -20.0, 20.0);
}

RolloutCorrection parse_rollout_correction(std::string_view name) {
  if (name == "none" || name.empty()) return RolloutCorrection::None;
  if (name == "token") return RolloutCorrection::Token;
  if (name == "sequence") return RolloutCorrection::Sequence;
  throw ValueError(str("unknown rollout correction '", name, "'; valid: none, token, sequence"));
}

std::string to_string(RolloutCorrection r) {
  switch (r) {
    case RolloutCorrection::None: return "none";
    case RolloutCorrection::Token: return "token";
    case RolloutCorrection::Sequence: return "sequence";
  }
  return "?";
}

at::Tensor rollout_correction_weights(const at::Tensor& old_log_probs, const at::Tensor& rollout_log_probs,
                                      const at::Tensor& response_mask, RolloutCorrection mode, double cap) {
  if (!(cap > 0)) throw ValueError(str("rollout correction cap must be > 0, got ", cap));
  if (!rollout_log_probs.defined())
    throw ValueError("rollout correction requested but rollout_log_probs is missing");
  if (rollout_log_probs.sizes() != old_log_probs.sizes())
    throw ValueError(str("rollout_log_probs ", rollout_log_probs.sizes(), " vs old_log_probs ",
                         old_log_probs.sizes()));
  at::NoGradGuard no_grad;
  auto mask = (response_mask != 0).to(old_log_probs.scalar_type());
  auto log_rho = (old_log_probs.detach() - rollout_log_probs.detach()) * mask;
  switch (mode) {
    case RolloutCorrection::None:
      return at::ones_like(old_log_probs);
    case RolloutCorrection::Token:
      return at::exp(at::clamp(log_rho, -20.0, 20.0)).clamp_max(cap);
    case RolloutCorrection::Sequence: {
      auto seq = at::exp(at::clamp(log_rho.sum(1, /*keepdim=*/true), -20.0, 20.0)).clamp_max(cap);
      return seq.expand_as(old_log_probs).clone();
    }
  }
  throw ValueError("rollout_correction_weights: invalid mode");
}

}  // namespace rpg::algo
