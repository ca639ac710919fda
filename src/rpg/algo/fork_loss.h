// Fork-exact actor loss: what the authors' verl fork (complex-reasoning/RPG @ ec8e30bd)
// computes in dp_actor.update_policy, whatever kl_loss_type says:
//
//   per micro-batch  L_mb = agg_mb(ppo_dual_clip(w, A)) - entropy_coeff * agg_mb(entropy)
//                           + [use_kl_loss] kl_loss_coef * agg_mb(kl_penalty(log_prob, ref, kl_loss_type))
//   backward of      L_mb * weight_mb,  weight_mb = rows_mb / ppo_mini_batch_size (dynamic bsz)
//                                                 = 1 / (ppo_mini_batch_size // micro_batch_size)
//
// agg_mb is the fork's agg_loss over the micro-batch's OWN tokens/rows (masked_mean with
// +1e-8), so the result depends on how a mini-batch is cut into micro-batches: rpg's global
// normaliser (aggregate.h) cannot reproduce it, hence this separate path. The KL sits outside
// the PPO clip; with use_iterative_ref_model the reference is old_log_probs. None of the RPG
// surrogates of the paper is reached: the fork never calls compute_policy_loss_reinforce.
//
// kl_penalty forms (core_algos.kl_penalty), w = exp(log_prob - ref):
//   kl: log w   abs: |log w|   mse: (log w)^2/2   low_var_kl: clamp(k3(1/w), +-10) (log clamp none)
//   rpg_fkl: -log w (no clamp)          rpg_rkl: clamp(w log w)
//   rpg_ufkl: clamp(w - log w - 1)      rpg_urkl: clamp(w (log w - 1) + 1)
//   rpg_js: clamp((w log w + log w)/2)  rpg_ujs: clamp((w log w - log w)/2)
//   rpg_rf_fkl*: -1 (constant)          rpg_rf_rkl*: clamp(w (log w + 1))
//   rpg_rf_ufkl*: clamp(w - 1)          rpg_rf_urkl*: clamp(w log w)
// (rpg_rf_<kl>, _clip_hard and _clip_ppo spell the same value), clamps to [-10, 10].
// The fork's in-reward KL (rpg_ray_trainer.apply_kl_penalty) uses the same table.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <string_view>
#include <vector>

#include "rpg/algo/policy_loss.h"
#include "rpg/algo/registry.h"

namespace rpg::algo {

// One kl_penalty form: elementwise [B, T] from log_prob (differentiable) and ref_log_prob.
using ForkKlPenaltyFn = at::Tensor (*)(const at::Tensor& log_prob, const at::Tensor& ref_log_prob);

// Every kl_loss_type spelling the fork accepts ("full" raises an error in the fork as well).
const Registry<ForkKlPenaltyFn>& fork_kl_penalty_registry();
at::Tensor fork_kl_penalty(const at::Tensor& log_prob, const at::Tensor& ref_log_prob, std::string_view kl_type);

struct ForkLossConfig {
  double clip_ratio_low = 0.2;
  double clip_ratio_high = 0.2;
  double clip_ratio_c = 3.0;
  LossAggMode loss_agg_mode = LossAggMode::TokenMean;  // token-mean, seq-mean-token-sum, seq-mean-token-mean
  double entropy_coeff = 0.0;
  bool use_kl_loss = false;
  double kl_loss_coef = 0.0;
  std::string kl_loss_type = "low_var_kl";
  bool use_iterative_ref_model = false;  // ref = old_log_probs (ref_log_probs ignored)
};

// Throws ValueError naming the field (clip_ratio_c <= 1, unknown kl_loss_type, agg mode the
// fork lacks, ...).
void validate(const ForkLossConfig& config);

// The fork's per-micro-batch policy_loss (before the micro-batch weight). Inputs: log_probs,
// old_log_probs, advantages, response_mask of ONE micro-batch; ref_log_probs when
// use_kl_loss && !use_iterative_ref_model; entropy optional (0 if absent). `normaliser` is
// ignored. Metrics as the fork logs them: actor/pg_loss, actor/pg_clipfrac, actor/ppo_kl,
// actor/pg_clipfrac_lower, actor/entropy, and actor/kl_loss + actor/kl_coef with use_kl_loss.
PolicyLossOutput fork_micro_batch_loss(const PolicyLossInputs& in, const ForkLossConfig& config);

// The factor dp_actor multiplies a micro-batch's loss by before backward. mini_batch_rows is
// the actor's normalised ppo_mini_batch_size (prompts * rollout.n / data-parallel size).
double fork_micro_batch_weight(int64_t micro_batch_rows, int64_t mini_batch_rows, bool use_dynamic_bsz,
                               int64_t micro_batch_size_per_gpu);

// The micro-batch loss dp_actor calls backward() on, written as the fork writes it:
// loss * (rows / mini_batch_rows) with dynamic bsz, else loss / (mini_batch_rows // micro)
// (a division: times the reciprocal differs by an ulp when the count is not a power of two).
at::Tensor fork_weighted_micro_batch_loss(const at::Tensor& loss, int64_t micro_batch_rows, int64_t mini_batch_rows,
                                          bool use_dynamic_bsz, int64_t micro_batch_size_per_gpu);

// One mini-batch as dp_actor accumulates it: sum over micro_batches (row indices into `in`)
// of fork_micro_batch_loss * fork_micro_batch_weight. Its gradient is the one the optimizer
// step sees. Without dynamic bsz, micro-batches are consecutive slices of
// micro_batch_size_per_gpu rows (fork_fixed_micro_batches); with it, the caller passes the
// partition (the fork's rearrange_micro_batches balances tokens under ppo_max_token_len_per_gpu).
at::Tensor fork_mini_batch_loss(const PolicyLossInputs& in, const ForkLossConfig& config,
                                const std::vector<std::vector<int64_t>>& micro_batches, bool use_dynamic_bsz,
                                int64_t mini_batch_rows, int64_t micro_batch_size_per_gpu);

// mini_batch.split(micro_batch_size): consecutive slices, the last one possibly shorter.
std::vector<std::vector<int64_t>> fork_fixed_micro_batches(int64_t rows, int64_t micro_batch_size);

// The fork's use_dynamic_bsz micro-batches (verl.utils.seqlen_balancing.rearrange_micro_batches
// as of the fork, world size 1): k = ceil(sum(lengths) / max_token_len) micro-batches, the
// rows partitioned by the largest differencing method (karmarkar_karp, equal_size=False),
// each micro-batch's rows ascending, micro-batches in karmarkar_karp's order (largest sum
// first). `lengths` are the rows' attention-mask sums; the fork asserts max_token_len >=
// padded_width (ValueError here).
std::vector<std::vector<int64_t>> fork_dynamic_micro_batches(const std::vector<int64_t>& lengths,
                                                             int64_t max_token_len, int64_t padded_width);
// verl.utils.seqlen_balancing.get_seqlen_balanced_partitions: `k` partitions of the rows whose
// length sums the largest differencing method (karmarkar_karp) balances; with equal_size each
// holds rows / k rows (the fork's _balance_batch over data-parallel ranks). Each partition's
// rows ascending, partitions in karmarkar_karp's order (largest sum first).
std::vector<std::vector<int64_t>> fork_balanced_partitions(const std::vector<int64_t>& lengths, int64_t k,
                                                           bool equal_size);

}  // namespace rpg::algo
