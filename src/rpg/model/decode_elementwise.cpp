#include "rpg/model/decode_elementwise.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>

#include "rpg/core/cpu_clones.h"
#include "rpg/core/fast_exp.h"

// at::parallel_for's OpenMP region is compiled into this file (src/rpg/model/CMakeLists.txt).
#if !defined(_OPENMP)
#error "this kernel file must be compiled with -fopenmp"
#endif

namespace rpg::model::detail {
namespace {

// Fixed 16-lane loops and a scalar tail: GCC's -O2 vectorizer (its very-cheap cost model)
// takes these, not a loop of unknown trip count.
constexpr int64_t kLanes = 16;

RPG_CPU_CLONES void rms_norm_f32(const float* __restrict x, const float* __restrict w, float* __restrict y,
                                 int64_t rows, int64_t C, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    float acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= C; i += kLanes)
      for (int64_t j = 0; j < kLanes; ++j) acc[j] += xr[i + j] * xr[i + j];
    float sum = 0.0f;
    for (int64_t j = 0; j < kLanes; ++j) sum += acc[j];
    for (; i < C; ++i) sum += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(C) + eps);
    int64_t k = 0;
    for (; k + kLanes <= C; k += kLanes)
      for (int64_t j = 0; j < kLanes; ++j) yr[k + j] = w[k + j] * (xr[k + j] * inv);
    for (; k < C; ++k) yr[k] = w[k] * (xr[k] * inv);
  }
}

// y[i] = x[i] * c[i] + partner[i] * s[i] for i < n.
inline __attribute__((always_inline)) void rotate(const float* __restrict x, const float* __restrict partner,
                                                  const float* __restrict c, const float* __restrict s,
                                                  float* __restrict y, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) y[i + j] = x[i + j] * c[i + j] + partner[i + j] * s[i + j];
  for (; i < n; ++i) y[i] = x[i] * c[i] + partner[i] * s[i];
}

RPG_CPU_CLONES void rope_f32(const float* __restrict x, const float* __restrict cos, const float* __restrict sin,
                             float* __restrict y, int64_t positions, int64_t H, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t p = 0; p < positions; ++p) {
    const float* c = cos + p * D;
    const float* s = sin + p * D;
    for (int64_t h = 0; h < H; ++h) {
      const float* xh = x + (p * H + h) * D;
      float* yh = y + (p * H + h) * D;
      rotate(xh, xh + half, c, s, yh, half);
      rotate(xh + half, xh, c + half, s + half, yh + half, half);
    }
  }
}

// Rows (of `width` elements) per task: below ~16k elements a step's kernel runs on the calling
// thread (the threads' start costs more than the pass). Above, both threads take a share, so
// that no thread spins idle at its barrier beside a serial pass: on the shared VMs that spin
// sometimes slowed the serial pass itself 3-4x (swiglu at 64 rows: 93 ms or 229-268 ms per
// 64-token rollout, between runs of one binary).
int64_t grain(int64_t width) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, width)); }

}  // namespace

// y = silu(g) * u = g * u / (1 + exp(-g)), with exp taken at -|g| only (no overflow):
// exp(-g) = e for g >= 0, and 1 / e below.
RPG_CPU_CLONES void swiglu_span(const float* __restrict g, const float* __restrict u, float* __restrict y, int64_t n) {
  auto one = [](float gi, float ui) {
    const float e = exp_nonpositive(gi >= 0.0f ? -gi : gi);
    const float sig = gi >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
    return gi * sig * ui;
  };
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) y[i + j] = one(g[i + j], u[i + j]);
  for (; i < n; ++i) y[i] = one(g[i], u[i]);
}

bool decode_elementwise_applies(const at::Tensor& x) {
  return x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous() && !c10::GradMode::is_enabled();
}

at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(decode_elementwise_applies(x) && weight.scalar_type() == at::kFloat && weight.is_contiguous() &&
                  weight.dim() == 1 && x.dim() >= 1 && x.size(-1) == weight.size(0),
              "rms_norm_rows: contiguous float32 CPU x [..., C] and weight [C]");
  RECORD_FUNCTION("rpg::rms_norm_rows", std::vector<c10::IValue>());
  at::Tensor y = at::empty_like(x);
  const int64_t C = x.size(-1);
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, x.numel() / C, grain(C), [&](int64_t b, int64_t e) {
    rms_norm_f32(xp + b * C, weight.data_ptr<float>(), yp + b * C, e - b, C, static_cast<float>(eps));
  });
  return y;
}

at::Tensor rope_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(decode_elementwise_applies(x) && x.dim() == 4 && x.size(-1) % 2 == 0 && cos.is_contiguous() &&
                  sin.is_contiguous() && cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat &&
                  cos.dim() == 4 && cos.size(0) == x.size(0) && cos.size(1) == x.size(1) && cos.size(2) == 1 &&
                  cos.size(3) == x.size(3) && sin.sizes() == cos.sizes(),
              "rope_rows: contiguous float32 CPU x [B, T, H, D] and cos, sin [B, T, 1, D]");
  RECORD_FUNCTION("rpg::rope_rows", std::vector<c10::IValue>());
  at::Tensor y = at::empty_like(x);
  const int64_t H = x.size(2), D = x.size(3);
  const float *xp = x.data_ptr<float>(), *cp = cos.data_ptr<float>(), *sp = sin.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, x.size(0) * x.size(1), grain(H * D), [&](int64_t b, int64_t e) {
    rope_f32(xp + b * H * D, cp + b * D, sp + b * D, yp + b * H * D, e - b, H, D);
  });
  return y;
}

at::Tensor swiglu_rows(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(decode_elementwise_applies(gate) && decode_elementwise_applies(up) && gate.sizes() == up.sizes(),
              "swiglu_rows: contiguous float32 CPU gate and up of one shape");
  RECORD_FUNCTION("rpg::swiglu_rows", std::vector<c10::IValue>());
  at::Tensor y = at::empty_like(gate);
  const float *g = gate.data_ptr<float>(), *u = up.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, gate.numel() / kLanes, grain(kLanes), [&](int64_t b, int64_t e) {
    // Blocks of 16 elements; the last task also takes the tail.
    const int64_t end = e == gate.numel() / kLanes ? gate.numel() : e * kLanes;
    swiglu_span(g + b * kLanes, u + b * kLanes, yp + b * kLanes, end - b * kLanes);
  });
  return y;
}

}  // namespace rpg::model::detail
