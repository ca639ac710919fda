#include "rpg/model/decode_elementwise.h"

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "rpg/core/cpu_clones.h"
#include "rpg/core/fast_exp.h"
#include "rpg/model/cpu_kernels.h"
#include "rpg/model/elementwise_loops.h"

// at::parallel_for's OpenMP region is compiled into this file (src/rpg/model/CMakeLists.txt).
#if !defined(_OPENMP)
#error "this kernel file must be compiled with -fopenmp"
#endif

namespace rpg::model::detail {

using namespace loops;

namespace {

template <class T>
inline __attribute__((always_inline)) void rms_norm_rows_t(const T* __restrict x, const T* __restrict w,
                                                           T* __restrict y, int64_t rows, int64_t C, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * C;
    T* yr = y + r * C;
    float acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= C; i += kLanes)
      for (int64_t j = 0; j < kLanes; ++j) acc[j] += load(xr[i + j]) * load(xr[i + j]);
    float sum = 0.0f;
    for (int64_t j = 0; j < kLanes; ++j) sum += acc[j];
    for (; i < C; ++i) sum += load(xr[i]) * load(xr[i]);
    scale_row(xr, w, yr, C, 1.0f / std::sqrt(sum / static_cast<float>(C) + eps));
  }
}
RPG_CPU_CLONES void rms_norm_f32(const float* x, const float* w, float* y, int64_t rows, int64_t C, float eps) {
  rms_norm_rows_t(x, w, y, rows, C, eps);
}
RPG_CPU_CLONES void rms_norm_bf16(const uint16_t* x, const uint16_t* w, uint16_t* y, int64_t rows, int64_t C,
                                  float eps) {
  rms_norm_rows_t(x, w, y, rows, C, eps);
}

template <class T>
inline __attribute__((always_inline)) void rope_rows_t(const T* __restrict x, const T* __restrict cos,
                                                       const T* __restrict sin, T* __restrict y, int64_t positions,
                                                       int64_t H, int64_t D) {
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t h = 0; h < H; ++h) rotate_head(x + (p * H + h) * D, cos + p * D, sin + p * D, y + (p * H + h) * D, D);
}

}  // namespace

// silu(g) = g / (1 + exp(-g)), with exp taken at -|g| only (no overflow): exp(-g) = e for
// g >= 0, and 1 / e below.
RPG_INLINE float silu(float g) {
  const float e = exp_nonpositive(g >= 0.0f ? -g : g);
  return g * (g >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e));
}

// y = silu(g) * u; bf16: silu(g) rounded, then times u (at::silu(gate) * up's rounding points).
// Three loops per block of 16 (widen, silu, multiply and store): fewer were not vectorised for
// bf16 (GCC 12: control flow in the loop).
template <class T>
RPG_INLINE void swiglu_t(const T* __restrict g, const T* __restrict u, T* __restrict y, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    float sg[kLanes];
    for (int64_t j = 0; j < kLanes; ++j) sg[j] = load(g[i + j]);
    for (int64_t j = 0; j < kLanes; ++j) sg[j] = silu(sg[j]);
    for (int64_t j = 0; j < kLanes; ++j) store(y + i + j, round_to<T>(sg[j]) * load(u[i + j]));
  }
  for (; i < n; ++i) store(y + i, round_to<T>(silu(load(g[i]))) * load(u[i]));
}
RPG_CPU_CLONES void rope_span(const float* x, const float* cos, const float* sin, float* y, int64_t positions,
                              int64_t H, int64_t D) {
  rope_rows_t(x, cos, sin, y, positions, H, D);
}
RPG_CPU_CLONES void rope_span_bf16(const uint16_t* x, const uint16_t* cos, const uint16_t* sin, uint16_t* y,
                                   int64_t positions, int64_t H, int64_t D) {
  rope_rows_t(x, cos, sin, y, positions, H, D);
}
RPG_CPU_CLONES void swiglu_span(const float* g, const float* u, float* y, int64_t n) { swiglu_t(g, u, y, n); }
RPG_CPU_CLONES void swiglu_span_bf16(const uint16_t* g, const uint16_t* u, uint16_t* y, int64_t n) {
  swiglu_t(g, u, y, n);
}
// sum_k term(k) for k < n over 16 lane sums, then the tail: the row sums' one loop shape.
template <typename Term>
RPG_INLINE float lane_sum(int64_t n, const Term& term) {
  float acc[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) acc[j] += term(k + j);
  float sum = 0.0f;
  for (int64_t j = 0; j < kLanes; ++j) sum += acc[j];
  for (; k < n; ++k) sum += term(k);
  return sum;
}

// out[r] = sum_k exp(z[r, k] - lse[r]) * z[r, k]. exp's argument is at most 0 (lse is at least
// the row's maximum).
RPG_CPU_CLONES void expected_logit_f32(const float* z, const float* lse, float* out, int64_t rows, int64_t V) {
  for (int64_t r = 0; r < rows; ++r) {
    const float *zr = z + r * V, l = lse[r];
    out[r] = lane_sum(V, [&](int64_t k) RPG_INLINE_LAMBDA { return exp_nonpositive(zr[k] - l) * zr[k]; });
  }
}

// out[r] = sum_k a[r, k] * b[r, k].
RPG_CPU_CLONES void dot_f32(const float* a, const float* b, float* out, int64_t rows, int64_t V) {
  for (int64_t r = 0; r < rows; ++r) {
    const float *ar = a + r * V, *br = b + r * V;
    out[r] = lane_sum(V, [&](int64_t k) RPG_INLINE_LAMBDA { return ar[k] * br[k]; });
  }
}

at::Tensor new_cpu_tensor(at::IntArrayRef sizes, at::ScalarType dtype) {
  return at::Tensor(at::detail::empty_cpu(sizes, dtype, /*pin_memory=*/false, std::nullopt));
}

bool decode_elementwise_applies(const at::Tensor& x) {
  return x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
         x.is_contiguous() && !c10::GradMode::is_enabled();
}

at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(decode_elementwise_applies(x) && weight.scalar_type() == x.scalar_type() && weight.is_contiguous() &&
                  weight.dim() == 1 && x.dim() >= 1 && x.size(-1) == weight.size(0),
              "rms_norm_rows: contiguous float32 or bfloat16 CPU x [..., C] and weight [C] of its dtype");
  RECORD_FUNCTION("rpg::rms_norm_rows", std::vector<c10::IValue>());
  at::Tensor y = new_cpu_tensor(x.sizes(), x.scalar_type());
  const int64_t C = x.size(-1);
  with_elements(y, [&](auto* yp) {
    using T = std::remove_pointer_t<decltype(yp)>;
    const T *xp = elements<T>(x), *wp = elements<T>(weight);
    at::parallel_for(0, x.numel() / C, grain(C), [&](int64_t b, int64_t e) {
      if constexpr (std::is_same_v<T, float>)
        rms_norm_f32(xp + b * C, wp, yp + b * C, e - b, C, static_cast<float>(eps));
      else
        rms_norm_bf16(xp + b * C, wp, yp + b * C, e - b, C, static_cast<float>(eps));
    });
  });
  return y;
}

at::Tensor rope_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(decode_elementwise_applies(x) && x.dim() == 4 && x.size(-1) % 2 == 0 && cos.is_contiguous() &&
                  sin.is_contiguous() && cos.scalar_type() == x.scalar_type() &&
                  sin.scalar_type() == x.scalar_type() &&
                  cos.dim() == 4 && cos.size(0) == x.size(0) && cos.size(1) == x.size(1) && cos.size(2) == 1 &&
                  cos.size(3) == x.size(3) && sin.sizes() == cos.sizes(),
              "rope_rows: contiguous float32 or bfloat16 CPU x [B, T, H, D] and cos, sin [B, T, 1, D] "
              "of its dtype");
  RECORD_FUNCTION("rpg::rope_rows", std::vector<c10::IValue>());
  at::Tensor y = new_cpu_tensor(x.sizes(), x.scalar_type());
  const int64_t H = x.size(2), D = x.size(3);
  with_elements(y, [&](auto* yp) {
    using T = std::remove_pointer_t<decltype(yp)>;
    const T *xp = elements<T>(x), *cp = elements<T>(cos), *sp = elements<T>(sin);
    at::parallel_for(0, x.size(0) * x.size(1), grain(H * D), [&](int64_t b, int64_t e) {
      if constexpr (std::is_same_v<T, float>)
        rope_span(xp + b * H * D, cp + b * D, sp + b * D, yp + b * H * D, e - b, H, D);
      else
        rope_span_bf16(xp + b * H * D, cp + b * D, sp + b * D, yp + b * H * D, e - b, H, D);
    });
  });
  return y;
}

at::Tensor swiglu_rows(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(decode_elementwise_applies(gate) && decode_elementwise_applies(up) && gate.sizes() == up.sizes() &&
                  gate.scalar_type() == up.scalar_type(),
              "swiglu_rows: contiguous float32 or bfloat16 CPU gate and up of one shape and dtype");
  RECORD_FUNCTION("rpg::swiglu_rows", std::vector<c10::IValue>());
  at::Tensor y = new_cpu_tensor(gate.sizes(), gate.scalar_type());
  with_elements(y, [&](auto* yp) {
    using T = std::remove_pointer_t<decltype(yp)>;
    const T *g = elements<T>(gate), *u = elements<T>(up);
    // Blocks of 16 elements, the last one partial (fewer than 16 elements are one block: they
    // were once no block at all, and left unwritten).
    at::parallel_for(0, (gate.numel() + kLanes - 1) / kLanes, grain(kLanes), [&](int64_t b, int64_t e) {
      const int64_t end = std::min(gate.numel(), e * kLanes);
      if constexpr (std::is_same_v<T, float>)
        swiglu_span(g + b * kLanes, u + b * kLanes, yp + b * kLanes, end - b * kLanes);
      else
        swiglu_span_bf16(g + b * kLanes, u + b * kLanes, yp + b * kLanes, end - b * kLanes);
    });
  });
  return y;
}

namespace {
// out [n] from fp32 rows [n, V] of `a` (and `b`): kernel(a rows, b rows or n-vector, out, rows, V).
template <typename Kernel>
at::Tensor per_row(const char* name, const at::Tensor& a, const at::Tensor& b, bool b_is_rows, const Kernel& kernel) {
  TORCH_CHECK(a.device().is_cpu() && a.scalar_type() == at::kFloat && a.dim() == 2 && a.is_contiguous() &&
                  b.device().is_cpu() && b.scalar_type() == at::kFloat && b.is_contiguous() &&
                  (b_is_rows ? b.sizes() == a.sizes() : b.dim() == 1 && b.size(0) == a.size(0)),
              name, ": contiguous float32 CPU rows [n, V] and ", b_is_rows ? "[n, V]" : "[n]");
  at::Tensor out = new_cpu_tensor({a.size(0)}, a.scalar_type());
  const int64_t V = a.size(1), stride = b_is_rows ? V : 1;
  const float *ap = a.data_ptr<float>(), *bp = b.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, a.size(0), grain(V), [&](int64_t r0, int64_t r1) {
    kernel(ap + r0 * V, bp + r0 * stride, op + r0, r1 - r0, V);
  });
  return out;
}
}  // namespace

at::Tensor expected_logit_rows(const at::Tensor& z, const at::Tensor& lse) {
  RECORD_FUNCTION("rpg::expected_logit_rows", std::vector<c10::IValue>());
  return per_row("expected_logit_rows", z, lse, false, expected_logit_f32);
}

at::Tensor dot_rows(const at::Tensor& a, const at::Tensor& b) {
  RECORD_FUNCTION("rpg::dot_rows", std::vector<c10::IValue>());
  return per_row("dot_rows", a, b, true, dot_f32);
}

}  // namespace rpg::model::detail
