#include "rpg/rollout/sampler.h"

#include <ATen/ATen.h>

#include <cmath>

#include "rpg/core/error.h"

namespace rpg::rollout {

void SamplingParams::validate() const {
  if (!(temperature >= 0.0) || !std::isfinite(temperature))
    throw ValueError(str("temperature: must be >= 0, got ", temperature));
  if (!(top_p > 0.0 && top_p <= 1.0)) throw ValueError(str("top_p: must be in (0, 1], got ", top_p));
  if (top_k == 0 || top_k < -1) throw ValueError(str("top_k: must be -1 (all) or >= 1, got ", top_k));
  if (max_new_tokens <= 0) throw ValueError(str("max_new_tokens: must be >= 1, got ", max_new_tokens));
  if (n < 1) throw ValueError(str("n: must be >= 1, got ", n));
}

at::Tensor sampling_probs(const at::Tensor& logits, const SamplingParams& params) {
  TORCH_CHECK(logits.dim() == 2, "sampling_probs: logits must be [N, V]");
  TORCH_CHECK(params.temperature > 0, "sampling_probs: temperature must be > 0");
  // Dividing by 1 is exact: skipped (a full pass over [N, V] per step).
  at::Tensor x = params.temperature == 1.0 ? logits.to(at::kDouble) : logits.to(at::kDouble) / params.temperature;
  const int64_t vocab = x.size(1);
  if (params.top_k > 0 && params.top_k < vocab) {
    // Ties with the k-th value are kept, as in Hugging Face's TopKLogitsWarper.
    at::Tensor kth = std::get<0>(x.topk(params.top_k, /*dim=*/1)).narrow(1, params.top_k - 1, 1);
    x = x.masked_fill(x < kth, -INFINITY);
  }
  at::Tensor probs = at::softmax(x, 1);
  if (params.top_p < 1.0) {
    auto [sorted, order] = probs.sort(/*stable=*/true, /*dim=*/1, /*descending=*/true);
    // Keep a token when the mass strictly before it (in descending order) is < top_p:
    // the smallest prefix reaching top_p, and always the most likely token.
    at::Tensor before = sorted.cumsum(1) - sorted;
    at::Tensor keep_sorted = before < params.top_p;
    keep_sorted.select(1, 0).fill_(true);
    at::Tensor keep = at::zeros_like(keep_sorted).scatter_(1, order, keep_sorted);
    probs = probs * keep;
    probs = probs / probs.sum(1, /*keepdim=*/true);
  }
  return probs;
}

SampledTokens sample_tokens(const at::Tensor& logits, const SamplingParams& params, const std::vector<double>& uniforms) {
  if (params.temperature == 0.0) return sample_tokens_on_device(logits, params, at::Tensor());
  TORCH_CHECK(static_cast<int64_t>(uniforms.size()) == logits.size(0), "sample_tokens: one uniform per row");
  return sample_tokens_on_device(logits, params, at::tensor(uniforms, at::kDouble).to(logits.device()));
}

SampledTokens sample_tokens_on_device(const at::Tensor& logits, const SamplingParams& params, const at::Tensor& uniforms) {
  TORCH_CHECK(logits.dim() == 2, "sample_tokens: logits must be [N, V]");
  const int64_t rows = logits.size(0);
  at::Tensor logits32 = logits.to(at::kFloat);
  SampledTokens out;
  if (params.temperature == 0.0) {
    out.ids = logits32.argmax(1);
    out.log_probs = at::log_softmax(logits32, 1).gather(1, out.ids.unsqueeze(1)).squeeze(1);
    return out;
  }
  TORCH_CHECK(uniforms.dim() == 1 && uniforms.size(0) == rows && uniforms.scalar_type() == at::kDouble &&
                  uniforms.device() == logits.device(),
              "sample_tokens: uniforms must be float64 [N] on the logits' device");
  at::Tensor probs = sampling_probs(logits, params);
  at::Tensor cdf = probs.cumsum(1);
  at::Tensor u = uniforms.unsqueeze(1) * cdf.narrow(1, cdf.size(1) - 1, 1);
  // First token whose CDF exceeds u: zero-probability tokens (flat CDF) are never chosen.
  out.ids = at::searchsorted(cdf, u, /*out_int32=*/false, /*right=*/true).squeeze(1).clamp_max(cdf.size(1) - 1);
  out.log_probs = at::log_softmax(params.temperature == 1.0 ? logits32 : logits32 / params.temperature, 1)
                      .gather(1, out.ids.unsqueeze(1))
                      .squeeze(1);
  return out;
}

}  // namespace rpg::rollout
