// Internal helpers shared by the policy-loss files: input checks, the common tail of every
// loss (rollout correction, aggregation, entropy bonus, shared metrics), clip fractions.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "rpg/algo/policy_loss.h"

namespace rpg::algo::detail {

// Shapes [B, T] agree, required tensors present, normaliser > 0, config valid.
void check_inputs(const PolicyLossInputs& in, const PolicyLossConfig& config, const char* loss_name);

// Builds the output from the per-token loss matrix pg_losses [B, T]: applies rollout
// correction weights, aggregates with the global normaliser, adds the entropy bonus and the
// metrics every loss reports (pg_loss, ppo_kl, ratio_mean, ref_kl, entropy). `metrics`
// carries the loss-specific ones (clip fractions ...). `extra_loss` (may be undefined) is a
// per-token matrix aggregated the same way and added with weight `extra_coef` (grpo's KL).
PolicyLossOutput finish(const PolicyLossInputs& in, const PolicyLossConfig& config, const at::Tensor& pg_losses,
                        std::map<std::string, at::Tensor> metrics, const at::Tensor& extra_loss = {},
                        double extra_coef = 0.0);

// Mean over valid tokens of a boolean condition, detached.
at::Tensor masked_fraction(const at::Tensor& condition, const at::Tensor& mask);

}  // namespace rpg::algo::detail
