// Internal: what the fused elementwise passes (decode_elementwise.cpp, fused_elementwise.cpp)
// share: fp32 / bf16 element access, transformers' bf16 rounding points, the 16-lane loop shape,
// RoPE's rotation and the rows per parallel task. Include only from -fopenmp kernel files.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "rpg/model/cpu_kernels.h"

namespace rpg::model::detail::loops {

// Fixed 16-lane loops and a scalar tail: GCC's -O2 vectorizer (its very-cheap cost model)
// takes these, not a loop of unknown trip count.
constexpr int64_t kLanes = 16;

// Elements as the loops see them: fp32 as is, bf16 (its bits, uint16_t) widened exactly and
// stored back rounded (cpu_kernels.h). round_to<T>(v): v as T would hold it, where an ATen op on
// T tensors rounds its result.
// (Every helper here is always_inline: called, not inlined, from the CPU clones, it kept GCC
// from vectorising their loops.)
#define RPG_INLINE inline __attribute__((always_inline))
#define RPG_INLINE_LAMBDA __attribute__((always_inline))
RPG_INLINE float load(float x) { return x; }
RPG_INLINE float load(uint16_t h) { return bf16_to_float(h); }
RPG_INLINE void store(float* y, float v) { *y = v; }
RPG_INLINE void store(uint16_t* y, float v) { *y = float_to_bf16(v); }
template <class T>
RPG_INLINE float round_to(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    T t;
    store(&t, v);
    return load(t);
  }
}

// RMSNorm's last step on one row: y = w * (x * inv), inv = rsqrt(mean(x^2) + eps); bf16:
// transformers' rounding points, each where its ATen form rounds a bf16 tensor (x * inv
// rounded, then times the weight).
template <class T>
RPG_INLINE void scale_row(const T* __restrict x, const T* __restrict w, T* __restrict y, int64_t C, float inv) {
  int64_t k = 0;
  for (; k + kLanes <= C; k += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) store(y + k + j, load(w[k + j]) * round_to<T>(load(x[k + j]) * inv));
  for (; k < C; ++k) store(y + k, load(w[k]) * round_to<T>(load(x[k]) * inv));
}

// y[i] = x[i] * c[i] + partner[i] * s[i] for i < n (bf16: each product rounded, then the sum,
// as t * cos + swap_halves(t) * sin rounds them: the same bits as those ATen ops).
template <class T>
RPG_INLINE void rotate(const T* __restrict x, const T* __restrict partner, const T* __restrict c,
                       const T* __restrict s, T* __restrict y, int64_t n) {
  auto one = [](T xi, T pi, T ci, T si) RPG_INLINE_LAMBDA {
    return round_to<T>(load(xi) * load(ci)) + round_to<T>(load(pi) * load(si));
  };
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) store(y + i + j, one(x[i + j], partner[i + j], c[i + j], s[i + j]));
  for (; i < n; ++i) store(y + i, one(x[i], partner[i], c[i], s[i]));
}

// One head row of D elements rotated: both halves, each with its partner in the other half.
template <class T>
RPG_INLINE void rotate_head(const T* x, const T* c, const T* s, T* y, int64_t D) {
  const int64_t half = D / 2;
  rotate(x, x + half, c, s, y, half);
  rotate(x + half, x, c + half, s + half, y + half, half);
}

// Rows (of `width` elements) per task: below ~16k elements a step's kernel runs on the calling
// thread (the threads' start costs more than the pass). Above, both threads take a share, so
// that no thread spins idle at its barrier beside a serial pass: on the shared VMs that spin
// sometimes slowed the serial pass itself 3-4x (swiglu at 64 rows: 93 ms or 229-268 ms per
// 64-token rollout, between runs of one binary).
inline int64_t grain(int64_t width) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, width)); }

// f(pointer) with x's data as float or as bf16 bits (uint16_t).
template <typename F>
void with_elements(const at::Tensor& x, const F& f) {
  if (x.scalar_type() == at::kFloat) f(x.data_ptr<float>());
  else f(reinterpret_cast<uint16_t*>(x.data_ptr<c10::BFloat16>()));
}
template <class T>
const T* elements(const at::Tensor& x) {
  if constexpr (std::is_same_v<T, float>) return x.data_ptr<float>();
  else return reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>());
}

}  // namespace rpg::model::detail::loops
