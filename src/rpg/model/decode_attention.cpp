#include "rpg/model/decode_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "rpg/core/fast_exp.h"
#include "rpg/core/log.h"
#include "rpg/model/cpu_kernels.h"

// at::parallel_for's OpenMP region is compiled into this file: without -fopenmp it runs on one
// thread, silently (src/rpg/model/CMakeLists.txt).
#if !defined(_OPENMP)
#error "this kernel file must be compiled with -fopenmp"
#endif

namespace rpg::model {
namespace {

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return std::bit_cast<float>(static_cast<uint32_t>(x.x) << 16); }

// Both loops run along contiguous memory with one multiplier per row (an AXPY), so they
// vectorise without reductions: the keys are stored dimension-major (kt: D rows of the
// positions), the values position-major.

// y[0, n) += a * x[0, n): in blocks of 16 (one AVX-512 register, two AVX2 ones; a fixed
// trip count is what -O2's cheap vectoriser accepts), then the tail.
constexpr int64_t kLanes = 16;
template <class T>
inline __attribute__((always_inline)) void axpy(float a, const T* __restrict x, float* __restrict y, int64_t n) {
  const int64_t nv = n / kLanes * kLanes;
  for (int64_t b = 0; b < nv; b += kLanes)
    for (int64_t t = 0; t < kLanes; ++t) y[b + t] += a * to_float(x[b + t]);
  for (int64_t t = nv; t < n; ++t) y[t] += a * to_float(x[t]);
}

// Scores of one (row, KV head) over a run of its keys: s[i * L + j] = scale * q_i . k_j for the
// rep query heads i and keys j < n_keys (kt: D rows of `stride` positions). Each score is its
// own chain over d, so a row's keys may be taken in runs from different places (a shared
// prefix, then its own slot) with the same result.
// Cache lines of [p, p + bytes) requested ahead of use: the next item's keys or values,
// while this item's are computed on (the K/V cache is read from memory once per step, in
// short rows the hardware prefetcher does not follow far enough).
// Locality 2 (T1, into L2 only): for runs requested well ahead of use.
template <int Locality = 3>
inline __attribute__((always_inline)) void prefetch(const void* p, int64_t bytes) {
  if (!p) return;
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(static_cast<const char*>(p) + off, 0, Locality);
}

template <class T>
inline __attribute__((always_inline)) void scores_item(const float* __restrict q, const T* __restrict kt,
                                                       int64_t stride, int64_t n_keys, int64_t L, int64_t rep,
                                                       int64_t D, float scale, float* __restrict s,
                                                       const T* next_kt, int64_t next_n) {
  for (int64_t i = 0; i < rep; ++i)
    for (int64_t j = 0; j < n_keys; ++j) s[i * L + j] = 0;
  for (int64_t d = 0; d < D; ++d) {
    prefetch(next_kt ? next_kt + d * stride : nullptr, next_n * static_cast<int64_t>(sizeof(T)));
    const T* __restrict row = kt + d * stride;
    for (int64_t i = 0; i < rep; ++i) {
      axpy(q[i * D + d] * scale, row, s + i * L, n_keys);
    }
  }
}

// acc_i += sum_j p[i * L + j] v_j over j < n_keys for the rep heads, in key order, in fp32
// (acc: rep x D; a run of keys continues the sums of the runs before it).
template <class T>
inline __attribute__((always_inline)) void values_item(const float* __restrict p, const T* __restrict v,
                                                       int64_t n_keys, int64_t L, int64_t rep, int64_t D,
                                                       float* __restrict acc, const T* next_v, int64_t next_n) {
  // The next item's values, spread over this item's keys.
  const int64_t ahead = next_v && n_keys > 0 ? (next_n * D * static_cast<int64_t>(sizeof(T)) + n_keys - 1) / n_keys : 0;
  for (int64_t j = 0; j < n_keys; ++j) {
    if (next_v) prefetch(reinterpret_cast<const char*>(next_v) + j * ahead, ahead);
    const T* __restrict vj = v + j * D;
    for (int64_t i = 0; i < rep; ++i) {
      axpy(p[i * L + j], vj, acc + i * D, D);
    }
  }
}

// The per-CPU builds: the compiler makes AVX-512, AVX2 and baseline versions of each and
// picks one at load time (the binaries are built without -march).
#define RPG_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

RPG_CPU_CLONES void scores_f32(const float* q, const float* kt, int64_t stride, int64_t n, int64_t L, int64_t rep,
                               int64_t D, float scale, float* s, const float* next_kt, int64_t next_n) {
  scores_item(q, kt, stride, n, L, rep, D, scale, s, next_kt, next_n);
}
RPG_CPU_CLONES void scores_bf16(const float* q, const c10::BFloat16* kt, int64_t stride, int64_t n, int64_t L,
                                int64_t rep, int64_t D, float scale, float* s, const c10::BFloat16* next_kt,
                                int64_t next_n) {
  scores_item(q, kt, stride, n, L, rep, D, scale, s, next_kt, next_n);
}
RPG_CPU_CLONES void values_f32(const float* p, const float* v, int64_t n, int64_t L, int64_t rep, int64_t D,
                               float* acc, const float* next_v, int64_t next_n) {
  values_item(p, v, n, L, rep, D, acc, next_v, next_n);
}
RPG_CPU_CLONES void values_bf16(const float* p, const c10::BFloat16* v, int64_t n, int64_t L, int64_t rep,
                                int64_t D, float* acc, const c10::BFloat16* next_v, int64_t next_n) {
  values_item(p, v, n, L, rep, D, acc, next_v, next_n);
}

// softmax in place over s[0, n): exp(s - max) / sum, in fixed blocks of 16 lanes so that each
// CPU build vectorises it (core/fast_exp.h); the max and the sum keep 16 lanes, reduced at the end.
RPG_CPU_CLONES void softmax_row(float* __restrict s, int64_t n) {
  const int64_t nv = n / kLanes * kLanes;
  float lane[kLanes];
  for (int64_t t = 0; t < kLanes; ++t) lane[t] = -std::numeric_limits<float>::infinity();
  for (int64_t b = 0; b < nv; b += kLanes)
    for (int64_t t = 0; t < kLanes; ++t) lane[t] = lane[t] > s[b + t] ? lane[t] : s[b + t];  // vectorises
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < kLanes; ++t) m = std::max(m, lane[t]);
  for (int64_t j = nv; j < n; ++j) m = std::max(m, s[j]);
  auto exp_shifted = [m](float x) { return exp_nonpositive(x - m); };
  for (int64_t t = 0; t < kLanes; ++t) lane[t] = 0;
  for (int64_t b = 0; b < nv; b += kLanes)
    for (int64_t t = 0; t < kLanes; ++t) {
      const float e = exp_shifted(s[b + t]);
      s[b + t] = e;
      lane[t] += e;
    }
  float sum = 0;
  for (int64_t t = 0; t < kLanes; ++t) sum += lane[t];
  for (int64_t j = nv; j < n; ++j) {
    s[j] = exp_shifted(s[j]);
    sum += s[j];
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) s[j] *= inv;
}

// AVX-512, fp32: the same sums in the same order (an FMA chain over d per score, over keys
// per output), blocked for registers. The AXPY forms above read and write a row of scores per
// key dimension: with grouped-query attention (7 query heads per KV head in Qwen2.5) that
// traffic, not the cache, set their speed (13 GB/s of K/V on the Zen 4 VM). Here a block of
// 32 keys x up to 4 heads stays in 8 registers over all of D, and each key row is read once
// per block of heads, from L1 after the first.
#define RPG_FMA2(h)                                         \
  {                                                         \
    const __m512 qb = _mm512_set1_ps(qs[(h) * D + d]);      \
    a##h##0 = _mm512_fmadd_ps(qb, k0, a##h##0);             \
    a##h##1 = _mm512_fmadd_ps(qb, k1, a##h##1);             \
  }
#define RPG_STORE2(h)                                                 \
  {                                                                   \
    _mm512_mask_storeu_ps(s + (h) * L + j0, m0, a##h##0);             \
    _mm512_mask_storeu_ps(s + (h) * L + j0 + 16, m1, a##h##1);        \
  }
template <int NH, bool Ahead>
__attribute__((target("avx512f"))) void scores_block512(const float* __restrict qs, int64_t D,
                                                        const float* __restrict kt, int64_t stride, int64_t j0,
                                                        __mmask16 m0, __mmask16 m1, float* __restrict s, int64_t L) {
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
  for (int64_t d = 0; d < D; ++d) {
    const float* row = kt + d * stride + j0;
    if constexpr (Ahead) {  // this row's block two ahead: D rows are too many streams for the
      __builtin_prefetch(row + 64);  // hardware prefetcher
      __builtin_prefetch(row + 80);
    }
    const __m512 k0 = _mm512_maskz_loadu_ps(m0, row), k1 = _mm512_maskz_loadu_ps(m1, row + 16);
    RPG_FMA2(0)
    if constexpr (NH > 1) RPG_FMA2(1)
    if constexpr (NH > 2) RPG_FMA2(2)
    if constexpr (NH > 3) RPG_FMA2(3)
  }
  RPG_STORE2(0)
  if constexpr (NH > 1) RPG_STORE2(1)
  if constexpr (NH > 2) RPG_STORE2(2)
  if constexpr (NH > 3) RPG_STORE2(3)
}
#undef RPG_FMA2
#undef RPG_STORE2

// acc[h][c0, c0 + 64) += sum over keys [j_begin, j_end) of p[h][j] v[j][c0, c0 + 64), for NH
// heads; mk masks the 4 vectors of the chunk against D.
#define RPG_ACC_LOAD(h)                                            \
  a##h##0 = _mm512_maskz_loadu_ps(mk[0], acc + (h) * D + c0);       \
  a##h##1 = _mm512_maskz_loadu_ps(mk[1], acc + (h) * D + c0 + 16);  \
  a##h##2 = _mm512_maskz_loadu_ps(mk[2], acc + (h) * D + c0 + 32);  \
  a##h##3 = _mm512_maskz_loadu_ps(mk[3], acc + (h) * D + c0 + 48);
#define RPG_ACC_FMA(h)                                      \
  {                                                         \
    const __m512 pb = _mm512_set1_ps(p[(h) * L + j]);       \
    a##h##0 = _mm512_fmadd_ps(pb, v0, a##h##0);             \
    a##h##1 = _mm512_fmadd_ps(pb, v1, a##h##1);             \
    a##h##2 = _mm512_fmadd_ps(pb, v2, a##h##2);             \
    a##h##3 = _mm512_fmadd_ps(pb, v3, a##h##3);             \
  }
#define RPG_ACC_STORE(h)                                              \
  _mm512_mask_storeu_ps(acc + (h) * D + c0, mk[0], a##h##0);          \
  _mm512_mask_storeu_ps(acc + (h) * D + c0 + 16, mk[1], a##h##1);     \
  _mm512_mask_storeu_ps(acc + (h) * D + c0 + 32, mk[2], a##h##2);     \
  _mm512_mask_storeu_ps(acc + (h) * D + c0 + 48, mk[3], a##h##3);
template <int NH>
__attribute__((target("avx512f"))) void values_block512(const float* __restrict p, int64_t L,
                                                        const float* __restrict v, int64_t D, int64_t c0,
                                                        const __mmask16* mk, int64_t j_begin, int64_t j_end,
                                                        float* __restrict acc) {
  __m512 a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33;
  a10 = a11 = a12 = a13 = a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = _mm512_setzero_ps();
  RPG_ACC_LOAD(0)
  if constexpr (NH > 1) { RPG_ACC_LOAD(1) }
  if constexpr (NH > 2) { RPG_ACC_LOAD(2) }
  if constexpr (NH > 3) { RPG_ACC_LOAD(3) }
  for (int64_t j = j_begin; j < j_end; ++j) {
    const float* vj = v + j * D + c0;
    const __m512 v0 = _mm512_maskz_loadu_ps(mk[0], vj), v1 = _mm512_maskz_loadu_ps(mk[1], vj + 16);
    const __m512 v2 = _mm512_maskz_loadu_ps(mk[2], vj + 32), v3 = _mm512_maskz_loadu_ps(mk[3], vj + 48);
    RPG_ACC_FMA(0)
    if constexpr (NH > 1) RPG_ACC_FMA(1)
    if constexpr (NH > 2) RPG_ACC_FMA(2)
    if constexpr (NH > 3) RPG_ACC_FMA(3)
  }
  RPG_ACC_STORE(0)
  if constexpr (NH > 1) { RPG_ACC_STORE(1) }
  if constexpr (NH > 2) { RPG_ACC_STORE(2) }
  if constexpr (NH > 3) { RPG_ACC_STORE(3) }
}
#undef RPG_ACC_LOAD
#undef RPG_ACC_FMA
#undef RPG_ACC_STORE

__mmask16 lanes_mask(int64_t n) {  // the first min(n, 16) lanes (none for n <= 0)
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1);
}

// One (row, KV head) item's run of keys: scores s [rep, L] at j < n_keys from the scaled queries
// qs [rep, D] and keys kt (D rows of `stride` positions).
// The next item's keys (next_kt, next_n of them) are prefetched a share per block, as the
// generic form does: with short items (a few hundred keys, many sequences) the start of each
// item would otherwise wait on memory.
void scores_item512(const float* qs, const float* kt, int64_t stride, int64_t n_keys, int64_t L, int64_t rep,
                    int64_t D, float* s, const float* next_kt, int64_t next_n) {
  const int64_t blocks = (n_keys + 31) / 32;
  for (int64_t j0 = 0; j0 < n_keys; j0 += 32) {
    if (next_kt)
      for (int64_t d = j0 / 32 * D / blocks; d < (j0 / 32 + 1) * D / blocks; ++d)
        prefetch(next_kt + d * stride, next_n * static_cast<int64_t>(sizeof(float)));
    const __mmask16 m0 = lanes_mask(n_keys - j0), m1 = lanes_mask(n_keys - j0 - 16);
    const bool ahead = j0 + 64 < n_keys;
    for (int64_t h0 = 0; h0 < rep; h0 += 4)
      detail::with_count<4>(rep - h0, [&](auto nh) {
        if (ahead) scores_block512<decltype(nh)::value, true>(qs + h0 * D, D, kt, stride, j0, m0, m1, s + h0 * L, L);
        else scores_block512<decltype(nh)::value, false>(qs + h0 * D, D, kt, stride, j0, m0, m1, s + h0 * L, L);
      });
  }
}

// acc [rep, D] += p [rep, L] . v [n_keys, D], keys in tiles of 64 (a tile of values stays in L1
// while every block of heads reads it).
void values_item512(const float* p, const float* v, int64_t n_keys, int64_t L, int64_t rep, int64_t D,
                    float* acc, const float* next_v, int64_t next_n) {
  const int64_t tiles = (n_keys + 63) / 64;
  const int64_t share = (next_n * D * static_cast<int64_t>(sizeof(float)) + tiles - 1) / tiles;  // bytes per tile
  for (int64_t t0 = 0; t0 < n_keys; t0 += 64) {
    const int64_t t1 = std::min(n_keys, t0 + 64);
    if (next_v) prefetch(reinterpret_cast<const char*>(next_v) + t0 / 64 * share, share);
    for (int64_t c0 = 0; c0 < D; c0 += 64) {
      const __mmask16 mk[4] = {lanes_mask(D - c0), lanes_mask(D - c0 - 16), lanes_mask(D - c0 - 32),
                               lanes_mask(D - c0 - 48)};
      for (int64_t h0 = 0; h0 < rep; h0 += 4)
        detail::with_count<4>(rep - h0, [&](auto nh) {
          values_block512<decltype(nh)::value>(p + h0 * L, L, v, D, c0, mk, t0, t1, acc + h0 * D);
        });
    }
  }
}

// Rows sharing a prompt, AVX-512, fp32: up to 12 query vectors (the heads of several rows) at
// once against one block of the prompt's keys or values, so each key row is loaded once per
// 12 queries instead of once per row's heads. The same FMA chains again (over d per score,
// over keys per output), so the same bits as the forms above.
// One kernel for both: two vectors per query (a_i_0, a_i_1), and per step idx one number of each
// query's row src[i][idx] broadcast against the same two vectors x[idx * x_step, + 32) (masked
// by m0, m1); the result stored at dst[i] + off, or added to what is there (Accumulate).
//   scores: src = scaled queries [D], x = keys from j0 (D rows of `stride`), dst = score rows at j0;
//   values: src = probability rows, x = value rows at column c0 (stride D), dst = acc rows at c0.
#define RPG_Q12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define RPG_DECL(i) __m512 a##i##_0 = _mm512_setzero_ps(), a##i##_1 = a##i##_0;
#define RPG_FMA_PAIR(i)                                       \
  if constexpr (NQ > (i)) {                                   \
    const __m512 b = _mm512_set1_ps(src[i][idx]);             \
    a##i##_0 = _mm512_fmadd_ps(b, x0, a##i##_0);              \
    a##i##_1 = _mm512_fmadd_ps(b, x1, a##i##_1);              \
  }
#define RPG_LOAD_PAIR(i)                                      \
  if constexpr (NQ > (i)) {                                   \
    a##i##_0 = _mm512_maskz_loadu_ps(m0, dst[i] + off);       \
    a##i##_1 = _mm512_maskz_loadu_ps(m1, dst[i] + off + 16);  \
  }
#define RPG_STORE_PAIR(i)                                     \
  if constexpr (NQ > (i)) {                                   \
    _mm512_mask_storeu_ps(dst[i] + off, m0, a##i##_0);        \
    _mm512_mask_storeu_ps(dst[i] + off + 16, m1, a##i##_1);   \
  }
template <int NQ, bool Accumulate>
__attribute__((target("avx512f"))) void rank1_multi512(const float* const* src, const float* __restrict x,
                                                       int64_t x_step, int64_t count, __mmask16 m0, __mmask16 m1,
                                                       float* const* dst, int64_t off) {
  RPG_Q12(RPG_DECL)
  if constexpr (Accumulate) { RPG_Q12(RPG_LOAD_PAIR) }
  for (int64_t idx = 0; idx < count; ++idx) {
    const float* xi = x + idx * x_step;
    const __m512 x0 = _mm512_maskz_loadu_ps(m0, xi), x1 = _mm512_maskz_loadu_ps(m1, xi + 16);
    RPG_Q12(RPG_FMA_PAIR)
  }
  RPG_Q12(RPG_STORE_PAIR)
}
#undef RPG_Q12
#undef RPG_DECL
#undef RPG_FMA_PAIR
#undef RPG_LOAD_PAIR
#undef RPG_STORE_PAIR

constexpr int64_t kMultiQueries = 12;

// The scores of `nq` queries (q[i] [D], scaled) over the keys [0, n) of kt (D rows of `stride`)
// into s[i][0, n); then, once softmaxed, the same queries' weighted sums of v [n, D] added to
// acc[i] [D].
void prompt_scores512(const float* const* q, int64_t nq, int64_t D, const float* kt, int64_t stride, int64_t n,
                      float* const* s) {
  for (int64_t j0 = 0; j0 < n; j0 += 32) {
    const __mmask16 m0 = lanes_mask(n - j0), m1 = lanes_mask(n - j0 - 16);
    for (int64_t i0 = 0; i0 < nq; i0 += kMultiQueries)
      detail::with_count<kMultiQueries>(std::min(kMultiQueries, nq - i0), [&](auto c) {
        rank1_multi512<decltype(c)::value, false>(q + i0, kt + j0, stride, D, m0, m1, s + i0, j0);
      });
  }
}
void prompt_values512(const float* const* p, int64_t nq, int64_t D, const float* v, int64_t n, float* const* acc) {
  for (int64_t i0 = 0; i0 < nq; i0 += kMultiQueries)
    for (int64_t c0 = 0; c0 < D; c0 += 32)
      detail::with_count<kMultiQueries>(std::min(kMultiQueries, nq - i0), [&](auto c) {
        rank1_multi512<decltype(c)::value, true>(p + i0, v + c0, D, n, lanes_mask(D - c0), lanes_mask(D - c0 - 16),
                                                 acc + i0, c0);
      });
}

// kAuto's choice: the AVX-512 form where the CPU has it; RPG_DECODE_ATTENTION=generic keeps
// the generic one (benchmarks compare the two with it).
bool auto_uses_avx512() {
  static const bool use = [] {
    const char* env = std::getenv("RPG_DECODE_ATTENTION");
    const std::string want = env ? env : "";
    if (!want.empty() && want != "generic" && want != "avx512")
      log_warn("RPG_DECODE_ATTENTION=" + want + ": expected generic or avx512; ignored");
    return want != "generic" && detail::cpu_has_avx512f();
  }();
  return use;
}

// One run of an item's keys, [j0, j1): where they are read and which scores they fill.
template <class T>
struct KeyRun {
  const T* k = nullptr;  // the run's first key (dimension-major: D rows of the cache's capacity)
  const T* v = nullptr;  // the run's first value row
  int64_t j0 = 0, j1 = 0;
};

template <class T>
at::Tensor run(const at::Tensor& q, const at::Tensor& kt_cache, const at::Tensor& v_cache, const at::Tensor& slots,
               const at::Tensor& positions, const SharedPrefix& prefix, bool avx512) {
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2), Hkv = v_cache.size(1), cap = v_cache.size(2);
  const int64_t rep = H / Hkv;
  const at::Tensor qf = q.to(at::kFloat).contiguous();
  const at::Tensor slot_c = slots.to(at::kCPU, at::kLong).contiguous(), pos_c = positions.to(at::kCPU, at::kLong).contiguous();
  const int64_t* slot = slot_c.data_ptr<int64_t>();
  const int64_t* pos = pos_c.data_ptr<int64_t>();
  const bool shared = prefix.slots.defined();
  at::Tensor pslot_c, plen_c;
  if (shared) {
    pslot_c = prefix.slots.to(at::kCPU, at::kLong).contiguous();
    plen_c = prefix.lengths.to(at::kCPU, at::kLong).contiguous();
  }
  const int64_t* pslot = shared ? pslot_c.data_ptr<int64_t>() : nullptr;
  const int64_t* plen = shared ? plen_c.data_ptr<int64_t>() : nullptr;
  int64_t L = 1;
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(pos[r] >= 0 && pos[r] < cap && slot[r] >= 0 && slot[r] < v_cache.size(0),
                "decode_attention: row ", r, " slot ", slot[r], " position ", pos[r], " outside the cache");
    TORCH_CHECK(!shared || (plen[r] >= 0 && plen[r] <= pos[r] + 1 && pslot[r] >= 0 && pslot[r] < v_cache.size(0)),
                "decode_attention: row ", r, " prefix of ", shared ? plen[r] : 0, " keys in slot ",
                shared ? pslot[r] : 0, " outside the cache or past the row's keys");
    L = std::max(L, pos[r] + 1);
  }
  // Rows reading one prefix slot are taken one after another (a stable order by that slot), so
  // the prefix comes from memory once and from the caches for the others.
  std::vector<int64_t> order(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) order[static_cast<size_t>(r)] = r;
  if (shared)
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return (plen[a] > 0 ? pslot[a] : -1) < (plen[b] > 0 ? pslot[b] : -1);
    });
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float* qp = qf.data_ptr<float>();
  const T* kp = kt_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  at::Tensor out = at::empty({R, H * D}, q.options());
  T* op = out.data_ptr<T>();
  const int64_t head_stride = cap * D;  // one (slot, KV head)'s keys or values
  // An item's (a row's and a KV head's, at it = r * Hkv + g) runs of keys: the shared prefix,
  // then the rest from its own slot.
  auto runs = [&](int64_t it) {
    const int64_t r = it / Hkv, g = it % Hkv, n = pos[r] + 1, p = shared ? plen[r] : 0;
    auto at_slot = [&](int64_t s, int64_t j0, int64_t j1) {
      const int64_t base = (s * Hkv + g) * head_stride;
      return KeyRun<T>{kp + base + j0, vp + base + j0 * D, j0, j1};
    };
    return std::array<KeyRun<T>, 2>{at_slot(p > 0 ? pslot[r] : slot[r], 0, p), at_slot(slot[r], p, n)};
  };

  // One (row, KV head) item in one pass while its scores are in L1: scores, softmax, weighted values.
  auto one_item = [&](int64_t it, const KeyRun<T>& next, float* s, float* qs, float* acc) {
    const int64_t r = it / Hkv, g = it % Hkv, n = pos[r] + 1, next_n = next.j1 - next.j0;
    const float* qi = qp + (r * H + g * rep) * D;
    const auto item_runs = runs(it);
    if (avx512)
      for (int64_t x = 0; x < rep * D; ++x) qs[x] = qi[x] * scale;
    for (const KeyRun<T>& run : item_runs) {
      if (run.j1 == run.j0) continue;
      if constexpr (std::is_same_v<T, float>) {
        if (avx512) scores_item512(qs, run.k, cap, run.j1 - run.j0, L, rep, D, s + run.j0, next.k, next_n);
        else scores_f32(qi, run.k, cap, run.j1 - run.j0, L, rep, D, scale, s + run.j0, next.k, next_n);
      } else {
        scores_bf16(qi, run.k, cap, run.j1 - run.j0, L, rep, D, scale, s + run.j0, next.k, next_n);
      }
    }
    for (int64_t i = 0; i < rep; ++i) softmax_row(s + i * L, n);
    std::fill(acc, acc + rep * D, 0.0f);
    const T* next_v = next_n > 0 ? next.v : nullptr;
    for (const KeyRun<T>& run : item_runs) {
      if (run.j1 == run.j0) continue;
      if constexpr (std::is_same_v<T, float>) {
        if (avx512) values_item512(s + run.j0, run.v, run.j1 - run.j0, L, rep, D, acc, next_v, next_n);
        else values_f32(s + run.j0, run.v, run.j1 - run.j0, L, rep, D, acc, next_v, next_n);
      } else {
        values_bf16(s + run.j0, run.v, run.j1 - run.j0, L, rep, D, acc, next_v, next_n);
      }
    }
    T* o = op + (r * H + g * rep) * D;
    for (int64_t x = 0; x < rep * D; ++x) o[x] = static_cast<T>(acc[x]);
  };
  // Tasks: a KV head of a chunk of consecutive rows (in `order`). The AVX-512 fp32 form takes up
  // to kChunk rows sharing a prompt together (their queries against each block of the prompt's
  // keys and values at once, prompt_scores512 / prompt_values512); otherwise a chunk is one row.
  constexpr int64_t kChunk = 4;
  std::vector<std::pair<int64_t, int64_t>> chunks;  // [begin, end) in order
  for (int64_t k = 0; k < R;) {
    int64_t e = k + 1;
    if constexpr (std::is_same_v<T, float>) {
      const int64_t r0 = order[static_cast<size_t>(k)];
      if (avx512 && shared && plen[r0] > 0)
        while (e < R && e - k < kChunk && plen[order[static_cast<size_t>(e)]] > 0 &&
               pslot[order[static_cast<size_t>(e)]] == pslot[r0])
          ++e;
    }
    chunks.emplace_back(k, e);
    k = e;
  }
  const int64_t tasks = static_cast<int64_t>(chunks.size()) * Hkv;
  at::parallel_for(0, tasks, 1, [&](int64_t b, int64_t e) {
    const size_t per_row = static_cast<size_t>(rep * D);
    std::vector<float> qs(kChunk * per_row), acc(kChunk * per_row), scores(static_cast<size_t>(kChunk * rep * L));
    std::vector<const float*> qv(static_cast<size_t>(kChunk * rep));
    std::vector<float*> sv(static_cast<size_t>(kChunk * rep)), av(static_cast<size_t>(kChunk * rep));
    for (int64_t t = b; t < e; ++t) {
      const auto [c0, c1] = chunks[static_cast<size_t>(t / Hkv)];
      const int64_t g = t % Hkv, nr = c1 - c0;
      if (nr == 1) {
        const int64_t it = order[static_cast<size_t>(c0)] * Hkv + g;
        KeyRun<T> next{};
        if (t + 1 < e) {
          const int64_t d0 = chunks[static_cast<size_t>((t + 1) / Hkv)].first;
          const auto r = runs(order[static_cast<size_t>(d0)] * Hkv + (t + 1) % Hkv);
          next = r[1].j1 > r[1].j0 ? r[1] : r[0];
        }
        one_item(it, next, scores.data(), qs.data(), acc.data());
        continue;
      }
      if constexpr (std::is_same_v<T, float>) {
        // The prompt's keys [0, P) from the first row's prefix slot, P the shortest of the chunk's
        // prefixes (a row's own slot holds the same values up to its own).
        int64_t P = std::numeric_limits<int64_t>::max();
        for (int64_t k = c0; k < c1; ++k) P = std::min(P, plen[order[static_cast<size_t>(k)]]);
        const int64_t ps = pslot[order[static_cast<size_t>(c0)]], nq = nr * rep;
        for (int64_t i = 0; i < nr; ++i) {
          const int64_t r = order[static_cast<size_t>(c0 + i)];
          const float* qi = qp + (r * H + g * rep) * D;
          for (int64_t x = 0; x < rep * D; ++x) qs[static_cast<size_t>(i * rep * D + x)] = qi[x] * scale;
          for (int64_t h = 0; h < rep; ++h) {
            qv[static_cast<size_t>(i * rep + h)] = qs.data() + (i * rep + h) * D;
            sv[static_cast<size_t>(i * rep + h)] = scores.data() + (i * rep + h) * L;
            av[static_cast<size_t>(i * rep + h)] = acc.data() + (i * rep + h) * D;
          }
        }
        // The rows' own keys and values (in memory since an earlier step) requested into L2
        // now, to arrive while the prompt's part is computed.
        for (int64_t i = 0; i < nr; ++i) {
          const int64_t r = order[static_cast<size_t>(c0 + i)], n = pos[r] + 1;
          if (n <= P) continue;
          const int64_t own = (slot[r] * Hkv + g) * head_stride;
          for (int64_t d = 0; d < D; ++d) prefetch<2>(kp + own + d * cap + P, (n - P) * 4);
          prefetch<2>(vp + own + P * D, (n - P) * D * 4);
        }
        const int64_t prompt = (ps * Hkv + g) * head_stride;
        prompt_scores512(qv.data(), nq, D, kp + prompt, cap, P, sv.data());
        for (int64_t i = 0; i < nr; ++i) {  // each row's own keys after the prompt, then its softmax
          const int64_t r = order[static_cast<size_t>(c0 + i)], n = pos[r] + 1;
          const int64_t own = (slot[r] * Hkv + g) * head_stride;
          if (n > P) scores_item512(qv[static_cast<size_t>(i * rep)], kp + own + P, cap, n - P, L, rep, D,
                                    sv[static_cast<size_t>(i * rep)] + P, nullptr, 0);
          for (int64_t h = 0; h < rep; ++h) softmax_row(sv[static_cast<size_t>(i * rep + h)], n);
        }
        std::fill(acc.begin(), acc.begin() + static_cast<int64_t>(nq * D), 0.0f);
        prompt_values512(sv.data(), nq, D, vp + prompt, P, av.data());
        for (int64_t i = 0; i < nr; ++i) {
          const int64_t r = order[static_cast<size_t>(c0 + i)], n = pos[r] + 1;
          const int64_t own = (slot[r] * Hkv + g) * head_stride;
          if (n > P) values_item512(sv[static_cast<size_t>(i * rep)] + P, vp + own + P * D, n - P, L, rep, D,
                                    av[static_cast<size_t>(i * rep)], nullptr, 0);
          T* o = op + (r * H + g * rep) * D;
          for (int64_t x = 0; x < rep * D; ++x) o[x] = acc[static_cast<size_t>(i * rep * D + x)];
        }
      }
    }
  });
  return out;
}

}  // namespace

void write_decode_kv(at::Tensor& kt_cache, at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& slots, const at::Tensor& positions) {
  const int64_t R = slots.numel(), Hkv = v_cache.size(1), cap = v_cache.size(2), D = v_cache.size(3);
  TORCH_CHECK(kt_cache.is_contiguous() && v_cache.is_contiguous() && k.is_contiguous() && v.is_contiguous() &&
                  k.numel() == R * Hkv * D && v.numel() == R * Hkv * D && positions.numel() == R &&
                  k.scalar_type() == v_cache.scalar_type() && v.scalar_type() == v_cache.scalar_type() &&
                  kt_cache.scalar_type() == v_cache.scalar_type() && decode_attention_supports(k.scalar_type(), k.device()),
              "write_decode_kv: contiguous k and v [R, Hkv, D] in the caches' dtype");
  RECORD_FUNCTION("rpg::write_decode_kv", std::vector<c10::IValue>());  // a row of bench/roofline's --ops
  const at::Tensor slot_c = slots.to(at::kCPU, at::kLong).contiguous(), pos_c = positions.to(at::kCPU, at::kLong).contiguous();
  const int64_t* slot = slot_c.data_ptr<int64_t>();
  const int64_t* pos = pos_c.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r)
    TORCH_CHECK(pos[r] >= 0 && pos[r] < cap && slot[r] >= 0 && slot[r] < v_cache.size(0), "write_decode_kv: row ", r,
                " slot ", slot[r], " position ", pos[r], " outside the cache");
  const size_t bytes = static_cast<size_t>(D) * v_cache.element_size();
  auto* kt = static_cast<char*>(kt_cache.data_ptr());
  auto* vc = static_cast<char*>(v_cache.data_ptr());
  const auto* kp = static_cast<const char*>(k.data_ptr());
  const auto* vp = static_cast<const char*>(v.data_ptr());
  const int64_t es = v_cache.element_size();
  // A key is D scattered elements (one cache line each, dimension-major): the lines of the next
  // few (row, KV head)s are requested for writing while this one's are written, and the threads
  // split the rows, so that many of these misses are in flight at once (at 64 rows, 274 ms
  // per 63 steps on one thread without requests, 189 with one ahead, 148 with four).
  auto head_of = [&](int64_t it) { return (slot[it / Hkv] * Hkv + it % Hkv) * cap * D; };
  constexpr int64_t kAhead = 4;  // (row, KV head)s requested ahead of the one written
  at::parallel_for(0, R * Hkv, 16, [&](int64_t b, int64_t e) {
    auto request = [&](int64_t it) {
      if (it >= e) return;
      const int64_t at_pos = head_of(it) + pos[it / Hkv];
      for (int64_t d = 0; d < D; ++d) __builtin_prefetch(kt + (at_pos + d * cap) * es, 1);
    };
    for (int64_t it = b; it < b + kAhead - 1; ++it) request(it);
    for (int64_t it = b; it < e; ++it) {
      request(it + kAhead - 1);
      const int64_t head = head_of(it), row = it * D;
      std::memcpy(vc + (head + pos[it / Hkv] * D) * es, vp + row * es, bytes);
      for (int64_t d = 0; d < D; ++d)
        std::memcpy(kt + (head + d * cap + pos[it / Hkv]) * es, kp + (row + d) * es, static_cast<size_t>(es));
    }
  });
}

bool decode_attention_supports(at::ScalarType dtype, c10::Device device) {
  return device.is_cpu() && (dtype == at::kFloat || dtype == at::kBFloat16);
}

namespace detail {

bool attention_kernel_available(AttentionKernel kernel) {
  return kernel != AttentionKernel::kAvx512 || detail::cpu_has_avx512f();
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& kt_cache, const at::Tensor& v_cache,
                            const at::Tensor& slots, const at::Tensor& positions, const SharedPrefix& prefix,
                            AttentionKernel kernel) {
  TORCH_CHECK(q.dim() == 3 && v_cache.dim() == 4 && kt_cache.sizes() == v_cache.transpose(2, 3).sizes() &&
                  kt_cache.is_contiguous() && v_cache.is_contiguous() && q.size(2) == v_cache.size(3) &&
                  q.size(1) % v_cache.size(1) == 0 && slots.numel() == q.size(0) && positions.numel() == q.size(0),
              "decode_attention: q [R, H, D], contiguous caches kt [S, Hkv, D, capacity] and v [S, Hkv, capacity, D], "
              "slots and positions [R]");
  TORCH_CHECK(prefix.slots.defined() == prefix.lengths.defined() &&
                  (!prefix.slots.defined() ||
                   (prefix.slots.numel() == q.size(0) && prefix.lengths.numel() == q.size(0))),
              "decode_attention: prefix slots and lengths [R], both or neither");
  TORCH_CHECK(q.scalar_type() == kt_cache.scalar_type() && kt_cache.scalar_type() == v_cache.scalar_type() &&
                  decode_attention_supports(q.scalar_type(), q.device()),
              "decode_attention: CPU float32 or bfloat16, the same for q and the caches");
  RECORD_FUNCTION("rpg::decode_attention", std::vector<c10::IValue>());  // a row of bench/roofline's --ops
  TORCH_CHECK(attention_kernel_available(kernel), "decode_attention: this CPU has no AVX-512F");
  // kAuto: the blocked form where a KV head serves 4 or more query heads, or 3 when rows share
  // a prompt (its keys then come from the caches, where the blocked form is faster; the two
  // forms give the same bits). Per call, on the Zen 4 VM: Qwen2.5-0.5B's shape (7 per KV head)
  // 8 sequences at 256 / 1024 / 2048 keys 0.137 / 0.454 / 0.77 ms against the generic form's
  // 0.155 / 0.682 / 1.24; SmolLM2's (3 per KV head) equal at 2048 keys (2.29 / 2.36 ms), 22 %
  // slower with 64 sequences of ~130 keys each from memory, and 0.35 against 0.50 ms with those
  // 64 sharing a 128-token prompt.
  const int64_t rep = q.size(1) / v_cache.size(1);
  const bool avx512 = kernel == AttentionKernel::kAvx512 ||
                      (kernel == AttentionKernel::kAuto && (rep >= 4 || (rep >= 3 && prefix.slots.defined())) &&
                       auto_uses_avx512());
  if (q.scalar_type() == at::kFloat) return run<float>(q, kt_cache, v_cache, slots, positions, prefix, avx512);
  return run<c10::BFloat16>(q, kt_cache, v_cache, slots, positions, prefix, false);
}

}  // namespace detail

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& kt_cache, const at::Tensor& v_cache,
                            const at::Tensor& slots, const at::Tensor& positions, const SharedPrefix& prefix) {
  return detail::decode_attention(q, kt_cache, v_cache, slots, positions, prefix, detail::AttentionKernel::kAuto);
}

}  // namespace rpg::model
