#include "rpg/algo/aggregate.h"

#include <ATen/ATen.h>

#include "rpg/core/error.h"

namespace rpg::algo {

namespace {

void check_same_shape(const at::Tensor& values, const at::Tensor& mask, const char* what) {
  if (!values.defined() || !mask.defined())
    throw ValueError(str(what, ": undefined tensor"));
  if (values.sizes() != mask.sizes())
    throw ValueError(str(what, ": values ", values.sizes(), " and mask ", mask.sizes(), " differ in shape"));
}

}  // namespace

LossAggMode parse_loss_agg_mode(std::string_view name) {
  if (name == "token-mean") return LossAggMode::TokenMean;
  if (name == "seq-mean-token-sum") return LossAggMode::SeqMeanTokenSum;
  if (name == "seq-mean-token-mean") return LossAggMode::SeqMeanTokenMean;
  if (name == "seq-mean-token-sum-norm") return LossAggMode::SeqMeanTokenSumNorm;
  throw ValueError(str("unknown loss_agg_mode '", name,
                       "'; valid: token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm"));
}

std::string to_string(LossAggMode mode) {
  switch (mode) {
    case LossAggMode::TokenMean: return "token-mean";
    case LossAggMode::SeqMeanTokenSum: return "seq-mean-token-sum";
    case LossAggMode::SeqMeanTokenMean: return "seq-mean-token-mean";
    case LossAggMode::SeqMeanTokenSumNorm: return "seq-mean-token-sum-norm";
  }
  return "?";
}

at::Tensor masked_sum(const at::Tensor& values, const at::Tensor& mask) {
  check_same_shape(values, mask, "masked_sum");
  auto m = mask.to(values.scalar_type());
  // where() first: 0 * NaN is NaN, and padded positions may hold anything.
  return (at::where(mask != 0, values, at::zeros_like(values)) * m).sum();
}

at::Tensor masked_mean(const at::Tensor& values, const at::Tensor& mask) {
  return masked_sum(values, mask) / (mask.to(values.scalar_type()).sum() + 1e-8);
}

at::Tensor masked_var(const at::Tensor& values, const at::Tensor& mask, bool unbiased) {
  auto mean = masked_mean(values, mask);
  auto var = masked_mean((values - mean).pow(2), mask);
  if (unbiased) {
    double n = mask.to(at::kDouble).sum().item<double>();
    if (n < 2) throw ValueError(str("masked_var: need at least 2 valid elements, got ", n));
    var = var * (n / (n - 1));
  }
  return var;
}

at::Tensor masked_whiten(const at::Tensor& values, const at::Tensor& mask) {
  auto mean = masked_mean(values, mask);
  auto var = masked_var(values, mask, true);
  return (values - mean) * at::rsqrt(var + 1e-8);
}

double loss_normaliser(const at::Tensor& response_mask, LossAggMode mode) {
  if (!response_mask.defined() || response_mask.dim() != 2)
    throw ValueError("loss_normaliser: response_mask must be [B, T]");
  auto valid = response_mask != 0;
  if (mode == LossAggMode::TokenMean) return valid.sum().item<double>();
  return valid.any(/*dim=*/1).sum().item<double>();
}

at::Tensor agg_loss(const at::Tensor& loss_mat, const at::Tensor& mask, LossAggMode mode,
                    double normaliser, double loss_scale_factor) {
  check_same_shape(loss_mat, mask, "agg_loss");
  if (loss_mat.dim() != 2) throw ValueError(str("agg_loss: expected [B, T], got ", loss_mat.sizes()));
  if (!(normaliser > 0))
    throw ValueError(str("agg_loss: the global normaliser must be > 0 (got ", normaliser,
                         "); compute it with loss_normaliser() over the whole mini-batch"));
  auto m = mask.to(loss_mat.scalar_type());
  auto masked = at::where(mask != 0, loss_mat, at::zeros_like(loss_mat)) * m;
  switch (mode) {
    case LossAggMode::TokenMean:
      return masked.sum() / normaliser;
    case LossAggMode::SeqMeanTokenSum:
      return masked.sum() / normaliser;
    case LossAggMode::SeqMeanTokenSumNorm: {
      double horizon = loss_scale_factor > 0 ? loss_scale_factor : static_cast<double>(loss_mat.size(1));
      return masked.sum() / normaliser / horizon;
    }
    case LossAggMode::SeqMeanTokenMean: {
      auto counts = m.sum(1);
      // Fully masked rows contribute 0 (0 / 1e-8), and are not counted by loss_normaliser.
      return (masked.sum(1) / (counts + 1e-8)).sum() / normaliser;
    }
  }
  throw ValueError("agg_loss: invalid mode");
}

}  // namespace rpg::algo
