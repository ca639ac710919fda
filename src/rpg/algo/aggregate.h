// Masked reductions and loss aggregation over [B, T] token matrices (B rows, T tokens).
//
// The aggregated loss of a micro-batch is divided by a normaliser of the WHOLE mini-batch,
// passed in by the caller: summing the micro-batch losses then gives exactly the
// mini-batch loss, so gradient accumulation never changes the gradient (dividing by the
// micro-batch's own token count is the known accumulation bug).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <string_view>

namespace rpg::algo {

// verl's loss_agg_mode names.
enum class LossAggMode {
  TokenMean,            // "token-mean": sum over all valid tokens / global token count
  SeqMeanTokenSum,      // "seq-mean-token-sum": sum_i (sum_t l_it) / global sequence count
  SeqMeanTokenMean,     // "seq-mean-token-mean": sum_i (mean_t l_it) / global sequence count
  SeqMeanTokenSumNorm,  // "seq-mean-token-sum-norm" (Dr.GRPO): seq-mean-token-sum / constant
};

LossAggMode parse_loss_agg_mode(std::string_view name);  // ValueError listing the valid names
std::string to_string(LossAggMode mode);

// Sum of values where mask != 0; values outside the mask (even NaN) never contribute.
at::Tensor masked_sum(const at::Tensor& values, const at::Tensor& mask);
// verl's masked_mean: masked_sum / (count + 1e-8).
at::Tensor masked_mean(const at::Tensor& values, const at::Tensor& mask);
// Variance over masked elements; unbiased uses Bessel's correction (needs >= 2 elements).
at::Tensor masked_var(const at::Tensor& values, const at::Tensor& mask, bool unbiased = true);
// (values - mean) / sqrt(var + 1e-8) with masked statistics (verl's masked_whiten).
at::Tensor masked_whiten(const at::Tensor& values, const at::Tensor& mask);

// The normaliser for `mode` computed over a full mini-batch mask [B, T]: the number of valid
// tokens for token-mean, the number of sequences with at least one valid token otherwise.
// Micro-batches of one mini-batch must all receive the value computed on the whole.
double loss_normaliser(const at::Tensor& response_mask, LossAggMode mode);

// Aggregates loss_mat [B, T] under mask [B, T] into a scalar. `normaliser` as above (> 0).
// `loss_scale_factor` is Dr.GRPO's constant for seq-mean-token-sum-norm (<= 0: T, as verl;
// set it to the maximum response length so that micro-batches padded differently agree).
at::Tensor agg_loss(const at::Tensor& loss_mat, const at::Tensor& mask, LossAggMode mode,
                    double normaliser, double loss_scale_factor = 0.0);

}  // namespace rpg::algo
