#include "rpg/rollout/sampler.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <bit>
#include <functional>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

#include "rpg/core/cpu_clones.h"
#include "rpg/core/error.h"
#include "rpg/core/fast_exp.h"
#include "rpg/core/log.h"

// at::parallel_for's OpenMP region is compiled into this file (src/rpg/rollout/CMakeLists.txt).
#if !defined(_OPENMP)
#error "this file must be compiled with -fopenmp"
#endif

namespace rpg::rollout {
namespace {

// Sampling fp32 logits on the CPU, a row per task. Plain (no top-k or top-p): the row's
// max, its exp(z - max) and their sums in blocks of 16 tokens (float64), then the block and
// the token where the running sum first exceeds u * total. Same rule as the general path
// below (the CDF inverted in token-id order; a token of probability 0 is never chosen), with
// fp32 exponentials: one pass over the vocabulary instead of a float64 copy, softmax, cumsum,
// searchsorted and a log_softmax (6 ms a step at 64 rows x 49152 on the Zen 4 VM).
constexpr int64_t kBlock = 16;

// z[j] = x[j] / t; returns their max (16 lanes of max, reduced at the end).
RPG_CPU_CLONES float scaled_max(const float* __restrict x, float* __restrict z, int64_t V, float t) {
  float lane[kBlock];
  for (int64_t i = 0; i < kBlock; ++i) lane[i] = -std::numeric_limits<float>::infinity();
  const int64_t full = V / kBlock * kBlock;
  for (int64_t b = 0; b < full; b += kBlock)
    for (int64_t i = 0; i < kBlock; ++i) {
      const float v = x[b + i] / t;
      z[b + i] = v;
      lane[i] = lane[i] > v ? lane[i] : v;  // vmaxps' own rule: vectorises where std::max does not
    }
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = full; j < V; ++j) {
    z[j] = x[j] / t;
    m = std::max(m, z[j]);
  }
  for (int64_t i = 0; i < kBlock; ++i) m = std::max(m, lane[i]);
  return m;
}

// The float64 sum of a block of kBlock tokens: a fixed tree of depth 4 (not a chain of 16
// dependent adds, which set these passes' speed).
[[gnu::always_inline]] inline double block_sum_of(const float* zb) {
  double half[8], quarter[4];
  for (int64_t t = 0; t < 8; ++t) half[t] = static_cast<double>(zb[t]) + static_cast<double>(zb[t + 8]);
  for (int64_t t = 0; t < 4; ++t) quarter[t] = half[t] + half[t + 4];
  return (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
}

// The last, partial block's sum (in token order).
double tail_sum(const float* z, int64_t from, int64_t V) {
  double sum = 0;
  for (int64_t j = from; j < V; ++j) sum += z[j];
  return sum;
}

// z[j] = exp(z[j] - m) and the sums of its blocks of kBlock tokens (float64, in token order).
RPG_CPU_CLONES void exp_and_block_sums(float* __restrict z, int64_t V, float m, double* __restrict sums) {
  const int64_t full = V / kBlock;
  for (int64_t k = 0; k < full; ++k) {
    float* zb = z + k * kBlock;
    for (int64_t t = 0; t < kBlock; ++t) zb[t] = exp_nonpositive(zb[t] - m);
    sums[k] = block_sum_of(zb);
  }
  if (full * kBlock < V) {
    for (int64_t j = full * kBlock; j < V; ++j) z[j] = exp_nonpositive(z[j] - m);
    sums[full] = tail_sum(z, full * kBlock, V);
  }
}

// The block sums of e after top-k set some of it to 0.
RPG_CPU_CLONES void block_sums(const float* __restrict z, int64_t V, double* __restrict sums) {
  const int64_t full = V / kBlock;
  for (int64_t k = 0; k < full; ++k) sums[k] = block_sum_of(z + k * kBlock);
  if (full * kBlock < V) sums[full] = tail_sum(z, full * kBlock, V);
}

// The first token, in token-id order, where the running sum of e (its blocks' sums given)
// exceeds target; the last one of positive weight should rounding keep the sum at or below
// it (0 only for a row of NaN).
int64_t invert_cdf(const float* e, const double* block_sum, int64_t V, double target) {
  const int64_t blocks = (V + kBlock - 1) / kBlock;
  double running = 0;
  int64_t k = 0;
  while (k + 1 < blocks && running + block_sum[k] <= target) running += block_sum[k++];
  int64_t last_positive = -1;
  for (int64_t j = k * kBlock; j < std::min(V, (k + 1) * kBlock); ++j) {
    if (e[j] <= 0) continue;
    last_positive = j;
    running += e[j];
    if (running > target) return j;
  }
  return std::max<int64_t>(last_positive, 0);
}

// Top-k and top-p on the CPU without sorting the vocabulary (a float64 sort of 64 rows x
// 151936 tokens took 564 ms on the Zen 4 VM, more than a decode step of a 0.5B model). Per row:
// the plain path's exponentials e_j = exp(z_j - max) and their sum (the unfiltered
// log-prob's normaliser); top-k's k-th largest z from a heap of k (ties with it kept, as
// Hugging Face's TopKLogitsWarper); top-p's boundary from a histogram of the kept e_j by their
// float exponent and top 3 mantissa bits (every token in a higher bucket comes first in the
// descending order, so only the bucket the mass p * total crosses is sorted); then the CDF of
// the kept tokens inverted in token-id order. The same rule as sampling_probs() (keep a token
// when the mass strictly before it, in descending order with ties by token id, is < p) on fp32
// exponentials with float64 sums, as the plain path. Top-p reads only its candidates after the
// exponentials: the tokens above a cut-off that the boundary cannot lie below, found through
// the block sums (313 of 49152 on average in SmolLM2's rows of word problems at top_p 0.7,
// 1161 at 0.95). Its histogram, crossing bucket and inversion were three scalar passes over the
// vocabulary, 4 % of a top-p rollout's time.
constexpr int64_t kBuckets = 2048;  // float bits >> 20: sign, 8 exponent bits, 3 mantissa bits

int64_t bucket_of(float e) { return std::min<int64_t>(std::bit_cast<uint32_t>(e) >> 20, kBuckets - 1); }

// The ids j with e_j > 0 and e_j >= cutoff, ascending, into ids; returns how many. A block whose
// sum is below the cut-off holds no such token (e >= 0, and a rounded sum of non-negative terms
// is at least its largest term) and is passed over unread.
int64_t tokens_at_or_above(const float* z, int64_t V, float cutoff, const double* block_sum, int64_t* ids) {
  int64_t count = 0;
  for (int64_t k = 0; k * kBlock < V; ++k) {
    if (block_sum[k] < cutoff) continue;
    for (int64_t j = k * kBlock; j < std::min(V, (k + 1) * kBlock); ++j)
      if (z[j] > 0 && z[j] >= cutoff) ids[count++] = j;
  }
  return count;
}

// Top-p's inversion over its candidates (ids ascending), of which it keeps those with e >
// boundary_e, or e == boundary_e and id <= boundary_id: the first kept token where the running
// sum of kept e exceeds u times their total; the last kept one should rounding keep the sum at
// or below it (0 where none is kept: a row of NaN).
int64_t invert_kept_cdf(const float* e, const int64_t* candidates, int64_t count, float boundary_e, int64_t boundary_id,
                        double u) {
  auto kept = [&](int64_t j) { return e[j] > boundary_e || (e[j] == boundary_e && j <= boundary_id); };
  double total = 0;
  for (int64_t i = 0; i < count; ++i)
    if (kept(candidates[i])) total += e[candidates[i]];
  const double target = u * total;
  double running = 0;
  int64_t last_kept = -1;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t j = candidates[i];
    if (!kept(j)) continue;
    last_kept = j;
    running += e[j];
    if (running > target) return j;
  }
  return std::max<int64_t>(last_kept, 0);
}

// The k-th largest of z[0..V) (0 < k < V).
float kth_largest(const float* z, int64_t V, int64_t k, std::vector<float>& scratch) {
  if (k > 1024) {  // a heap's log k per insertion no longer pays: select in place on a copy
    scratch.assign(z, z + V);
    std::nth_element(scratch.begin(), scratch.begin() + (k - 1), scratch.end(), std::greater<float>());
    return scratch[static_cast<size_t>(k - 1)];
  }
  scratch.assign(z, z + k);
  std::make_heap(scratch.begin(), scratch.end(), std::greater<float>());  // min-heap of the k largest so far
  for (int64_t j = k; j < V; ++j)
    if (z[j] > scratch.front()) {
      std::pop_heap(scratch.begin(), scratch.end(), std::greater<float>());
      scratch.back() = z[j];
      std::push_heap(scratch.begin(), scratch.end(), std::greater<float>());
    }
  return scratch.front();
}

// One CPU pass structure for every row: plain sampling (above), and with top-k / top-p the
// filters below between the exponentials and the inversion.
SampledTokens sample_cpu(const at::Tensor& logits, const SamplingParams& params, const at::Tensor& uniforms) {
  RECORD_FUNCTION("rpg::sample_cpu", std::vector<c10::IValue>());  // a row of bench/roofline's --ops
  const at::Tensor x = logits.to(at::kFloat).contiguous();
  const at::Tensor u = uniforms.contiguous();
  const int64_t N = x.size(0), V = x.size(1), blocks = (V + kBlock - 1) / kBlock;
  at::Tensor ids = at::empty({N}, at::kLong), log_probs = at::empty({N}, at::kFloat);
  const float* xp = x.data_ptr<float>();
  const double* up = u.data_ptr<double>();
  int64_t* idp = ids.data_ptr<int64_t>();
  float* lpp = log_probs.data_ptr<float>();
  const float t = static_cast<float>(params.temperature);  // as logits32 / T divides: by the float
  const bool top_k = params.top_k > 0 && params.top_k < V, top_p = params.top_p < 1.0;
  at::parallel_for(0, N, 1, [&](int64_t b, int64_t e) {
    std::vector<float> z(static_cast<size_t>(V)), scratch;
    std::vector<double> block_sum(static_cast<size_t>(blocks)), bucket_sum;
    std::vector<int64_t> candidates(top_p ? static_cast<size_t>(V) : 0);  // top-p's histogram's tokens
    std::vector<std::pair<float, int64_t>> crossing;  // top-p's boundary bucket's tokens
    for (int64_t r = b; r < e; ++r) {
      const float* row = xp + r * V;
      const float m = scaled_max(row, z.data(), V, t);
      const float kth = top_k ? kth_largest(z.data(), V, params.top_k, scratch) : -std::numeric_limits<float>::infinity();
      exp_and_block_sums(z.data(), V, m, block_sum.data());  // z becomes e = exp(z - m)
      double total = 0;  // the unfiltered normaliser (the log-prob's)
      for (double sum : block_sum) total += sum;
      const float log_total = static_cast<float>(std::log(total));
      double kept_sum = total;
      if (top_k) {  // outside top-k (z below the k-th z): weight 0 from here on
        for (int64_t j = 0; j < V; ++j)
          if (row[j] / t < kth) z[static_cast<size_t>(j)] = 0;
        block_sums(z.data(), V, block_sum.data());
        kept_sum = 0;
        for (double sum : block_sum) kept_sum += sum;
      }
      if (top_p) {
        // Kept: e > 0, and at or before the boundary token in the order e desc, then id asc.
        const double need = params.top_p * kept_sum;
        // The histogram's tokens: those with e >= cutoff, a power of 2 (a bucket's lower edge)
        // so low that the tokens under it, V at most, hold less than kept_sum - need (with a
        // margin far above float64 rounding). Then the boundary's bucket is at or above it, and
        // every bucket there has the sum that the full histogram gives it. Where no normal
        // float is that low, every e > 0 (0). For a language model's row most tokens lie below.
        const double room = kept_sum - need * (1 + 1e-9);
        float cutoff = 0;
        if (room > 0) {
          int exponent = 0;
          std::frexp(room / static_cast<double>(V), &exponent);  // room / V in [2^(exponent-1), 2^exponent)
          if (exponent - 1 >= std::numeric_limits<float>::min_exponent - 1) cutoff = std::ldexp(1.0f, exponent - 1);
        }
        int64_t count = tokens_at_or_above(z.data(), V, cutoff, block_sum.data(), candidates.data());
        bucket_sum.assign(static_cast<size_t>(kBuckets), 0.0);
        for (int64_t i = 0; i < count; ++i) {
          const float ej = z[static_cast<size_t>(candidates[static_cast<size_t>(i)])];
          bucket_sum[static_cast<size_t>(bucket_of(ej))] += ej;
        }
        int64_t boundary_bucket = -1, boundary_id = V;
        float boundary_e = 0;
        double before = 0;  // the mass of the buckets above
        for (int64_t k = kBuckets - 1; k >= 0; --k) {  // none when rounding keeps the sum below need: all kept
          const double in_bucket = bucket_sum[static_cast<size_t>(k)];
          if (in_bucket > 0 && before + in_bucket >= need) {
            boundary_bucket = k;
            break;
          }
          before += in_bucket;
        }
        if (boundary_bucket < 0 && cutoff > 0)  // unreachable by the margin; all kept then, below the cut-off too
          count = tokens_at_or_above(z.data(), V, 0, block_sum.data(), candidates.data());
        if (boundary_bucket >= 0) {
          crossing.clear();
          for (int64_t i = 0; i < count; ++i) {
            const int64_t j = candidates[static_cast<size_t>(i)];
            const float ej = z[static_cast<size_t>(j)];
            if (bucket_of(ej) == boundary_bucket) crossing.emplace_back(ej, j);
          }
          std::sort(crossing.begin(), crossing.end(), [](const auto& a, const auto& c) {
            return a.first > c.first || (a.first == c.first && a.second < c.second);
          });
          // Keep while the mass strictly before is < need (it is at the bucket's first token).
          for (const auto& [ej, j] : crossing) {
            if (before >= need) break;
            boundary_e = ej;
            boundary_id = j;
            before += ej;
          }
        }
        // Buckets rise with e, so a token of a higher bucket has e > boundary_e: one comparison
        // decides (without a boundary, boundary_e = 0 and boundary_id = V keep every e > 0).
        // Every kept token is a candidate: the CDF is inverted over those alone.
        idp[r] = invert_kept_cdf(z.data(), candidates.data(), count, boundary_e, boundary_id, up[r]);
      } else {
        idp[r] = invert_cdf(z.data(), block_sum.data(), V, up[r] * kept_sum);
      }
      lpp[r] = row[idp[r]] / t - m - log_total;
    }
  });
  return {ids, log_probs};
}

}  // namespace

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
  SampledTokens out;
  if (params.temperature == 0.0) {
    const at::Tensor logits32 = logits.to(at::kFloat);
    out.ids = logits32.argmax(1);
    out.log_probs = at::log_softmax(logits32, 1).gather(1, out.ids.unsqueeze(1)).squeeze(1);
    return out;
  }
  TORCH_CHECK(uniforms.dim() == 1 && uniforms.size(0) == rows && uniforms.scalar_type() == at::kDouble &&
                  uniforms.device() == logits.device(),
              "sample_tokens: uniforms must be float64 [N] on the logits' device");
  // RPG_SAMPLER=torch: CPU rows take the tensor operations below, which a GPU runs (CTest's
  // rollout_sampler.torch and rollout_decode.sdpa; benchmarks compare the two).
  static const bool torch_ops = [] {
    const char* env = std::getenv("RPG_SAMPLER");
    const std::string want = env ? env : "";
    if (!want.empty() && want != "torch" && want != "cpu")
      log_warn("RPG_SAMPLER=" + want + ": expected torch or cpu; ignored");
    return want == "torch";
  }();
  if (logits.device().is_cpu() && !torch_ops) return sample_cpu(logits, params, uniforms);
  // Converted here, not above: sample_cpu converts bf16 logits itself (a [64, 49152] copy each
  // step was made twice).
  const at::Tensor logits32 = logits.to(at::kFloat);
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
