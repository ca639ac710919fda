// Advantage estimators: one signature, one registry. All take AdvantageInputs and return
// advantages (and returns) [B, T], zero on padding, computed without gradient on the full
// batch before it is split into micro-batches (group statistics need whole groups).
//
//   registered name  advantage of row i in prompt group g (s_i = sum_t token_level_rewards)
//   grpo             (s_i - mean_g) / (std_g + epsilon), std unbiased (Shao et al. 2024)
//   drgrpo           s_i - mean_g: GRPO without std normalisation (Dr.GRPO, Liu et al. 2025)
//   rpg              s_i - mean_g: the paper's group-mean baseline (Appendix G)
//   rpg_batch        s_i - mean over the batch: the paper's batch-mean baseline (Algorithm 1, l.6)
//   rloo             n/(n-1) (s_i - mean_g): leave-one-out baseline (Ahmadian et al. 2024)
//   rfpp             discounted return-to-go of token rewards, whitened over the batch (REINFORCE++)
//   rfppb            s_i - mean_g broadcast to tokens, then whitened over the batch (REINFORCE++-baseline)
//   reinforce_plus_plus, reinforce_plus_plus_baseline: verl's names of rfpp, rfppb
// Singleton groups use mean 0 (and std 1), as verl.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <string_view>
#include <vector>

#include "rpg/algo/registry.h"

namespace rpg::algo {

struct AdvantageInputs {
  at::Tensor token_level_rewards;  // [B, T] reward per response token (outcome: on the last one)
  at::Tensor response_mask;        // [B, T] 1 on response tokens
  at::Tensor group_index;          // [B] integer id of the prompt group of each row
  double gamma = 1.0;              // discount for token-level returns (rfpp)
  double epsilon = 1e-6;           // std floor (grpo)
  bool norm_adv_by_std_in_grpo = true;  // grpo: false = Dr.GRPO (same as drgrpo), verl's switch
};

struct AdvantageOutput {
  at::Tensor advantages;  // [B, T]
  at::Tensor returns;     // [B, T]
};

using AdvantageFn = AdvantageOutput (*)(const AdvantageInputs&);

const Registry<AdvantageFn>& advantage_registry();
std::vector<std::string> advantage_names();

// Looks the estimator up by name (ValueError listing the valid names) and runs it.
AdvantageOutput compute_advantage(std::string_view name, const AdvantageInputs& inputs);

}  // namespace rpg::algo
