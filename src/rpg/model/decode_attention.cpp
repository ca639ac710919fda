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
#include <type_traits>
#include <vector>

#include "rpg/core/cpu_clones.h"
#include "rpg/core/fast_exp.h"
#include "rpg/core/log.h"
#include "rpg/model/cpu_kernels.h"
#include "rpg/model/decode_elementwise.h"

// at::parallel_for's OpenMP region is compiled into this file: without -fopenmp it runs on one
// thread, silently (src/rpg/model/CMakeLists.txt).
#if !defined(_OPENMP)
#error "this kernel file must be compiled with -fopenmp"
#endif

namespace rpg::model {
namespace {

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return detail::bf16_to_float(x.x); }

// The generic forms vectorise without reductions: the keys are stored dimension-major within
// blocks of kKeyBlock positions (decode_attention.h), so a block's scores are 32 lanes summed
// over d; the values are position-major, so the weighted sum is an AXPY per key.

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

// Cache lines of [p, p + bytes) requested ahead of use: the next item's keys or values,
// while this item's are computed on (the K/V cache is read from memory once per step; with
// short items the start of each would otherwise wait on memory).
// Locality 2 (T1, into L2 only): for runs requested well ahead of use.
template <int Locality = 3>
inline __attribute__((always_inline)) void prefetch(const void* p, int64_t bytes) {
  if (!p) return;
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(static_cast<const char*>(p) + off, 0, Locality);
}

// The blocks holding keys [j0, j1) of one (slot, KV head): where they start and how many
// elements they take, from that (slot, KV head)'s first block.
struct KeySpan {
  int64_t offset, size;
};
inline KeySpan key_span(int64_t j0, int64_t j1, int64_t D) {
  const int64_t b0 = j0 / kKeyBlock;
  return {b0 * D * kKeyBlock, (key_blocks(j1) - b0) * D * kKeyBlock};
}

// Bytes to request ahead for the part of the next item read first: its first blocks of keys
// (the rest follows in order, which the hardware prefetcher keeps up with), or its values.
constexpr int64_t kAheadKeys = 4 * kKeyBlock;

// The part of `bytes` requested with block b of this item's `blocks`: an even share each.
inline __attribute__((always_inline)) void prefetch_share(const void* next, int64_t bytes, int64_t b,
                                                          int64_t blocks) {
  if (!next) return;
  const int64_t share = (bytes + blocks - 1) / blocks, off = b * share;
  if (off < bytes) prefetch(static_cast<const char*>(next) + off, std::min(share, bytes - off));
}

// Scores of one (row, KV head) over a run [j0, j1) of its keys: s[i * L + j] = scale * q_i . k_j
// for the rep query heads i (kb: the slot's blocks for this KV head). Each score is its own
// chain over d, so a row's keys may be taken in runs from different places (a shared prefix,
// then its own slot) with the same result.
template <class T>
inline __attribute__((always_inline)) void scores_item(const float* __restrict q, const T* __restrict kb,
                                                       int64_t j0, int64_t j1, int64_t L, int64_t rep, int64_t D,
                                                       float scale, float* __restrict s, const void* next,
                                                       int64_t next_bytes) {
  const int64_t b0 = j0 / kKeyBlock, b1 = key_blocks(j1);
  for (int64_t b = b0; b < b1; ++b) {
    prefetch_share(next, next_bytes, b - b0, b1 - b0);
    const int64_t lo = std::max(j0 - b * kKeyBlock, int64_t{0}), hi = std::min(j1 - b * kKeyBlock, kKeyBlock);
    const T* __restrict block = kb + b * D * kKeyBlock;
    // A whole block's lanes in registers over all of d (a block is always allocated whole;
    // lanes outside [lo, hi) are computed and not stored).
    for (int64_t i = 0; i < rep; ++i) {
      float acc[kKeyBlock] = {};
      for (int64_t d = 0; d < D; ++d) {
        const float a = q[i * D + d] * scale;
        const T* __restrict row = block + d * kKeyBlock;
        for (int64_t t = 0; t < kKeyBlock; ++t) acc[t] += a * to_float(row[t]);
      }
      for (int64_t t = lo; t < hi; ++t) s[i * L + b * kKeyBlock + t] = acc[t];
    }
  }
}

// acc_i += sum_j p[i * L + j] v_j over the run [j0, j1) for the rep heads, in key order, in
// fp32 (acc: rep x D; a run of keys continues the sums of the runs before it; v: the slot's
// values for this KV head, from position 0).
template <class T>
inline __attribute__((always_inline)) void values_item(const float* __restrict p, const T* __restrict v,
                                                       int64_t j0, int64_t j1, int64_t L, int64_t rep, int64_t D,
                                                       float* __restrict acc, const void* next, int64_t next_bytes) {
  for (int64_t j = j0; j < j1; ++j) {
    prefetch_share(next, next_bytes, j - j0, j1 - j0);
    const T* __restrict vj = v + j * D;
    for (int64_t i = 0; i < rep; ++i) axpy(p[i * L + j], vj, acc + i * D, D);
  }
}

RPG_CPU_CLONES void scores_f32(const float* q, const float* kb, int64_t j0, int64_t j1, int64_t L, int64_t rep,
                               int64_t D, float scale, float* s, const void* next, int64_t next_bytes) {
  scores_item(q, kb, j0, j1, L, rep, D, scale, s, next, next_bytes);
}
RPG_CPU_CLONES void scores_bf16(const float* q, const c10::BFloat16* kb, int64_t j0, int64_t j1, int64_t L,
                                int64_t rep, int64_t D, float scale, float* s, const void* next, int64_t next_bytes) {
  scores_item(q, kb, j0, j1, L, rep, D, scale, s, next, next_bytes);
}
RPG_CPU_CLONES void values_f32(const float* p, const float* v, int64_t j0, int64_t j1, int64_t L, int64_t rep,
                               int64_t D, float* acc, const void* next, int64_t next_bytes) {
  values_item(p, v, j0, j1, L, rep, D, acc, next, next_bytes);
}
RPG_CPU_CLONES void values_bf16(const float* p, const c10::BFloat16* v, int64_t j0, int64_t j1, int64_t L,
                                int64_t rep, int64_t D, float* acc, const void* next, int64_t next_bytes) {
  values_item(p, v, j0, j1, L, rep, D, acc, next, next_bytes);
}

// y[0, n) = a * x[0, n): a row's queries scaled once (16-lane blocks, vectorised in every build).
RPG_CPU_CLONES void scaled_copy(const float* __restrict x, float a, float* __restrict y, int64_t n) {
  const int64_t nv = n / kLanes * kLanes;
  for (int64_t b = 0; b < nv; b += kLanes)
    for (int64_t t = 0; t < kLanes; ++t) y[b + t] = a * x[b + t];
  for (int64_t t = nv; t < n; ++t) y[t] = a * x[t];
}

// o[0, n) = acc[0, n) in o's dtype.
template <class T>
inline void store_out(const float* acc, T* o, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(o, acc, static_cast<size_t>(n) * sizeof(float));
  } else {
    for (int64_t x = 0; x < n; ++x) o[x] = static_cast<T>(acc[x]);
  }
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
// The AVX-512 forms read fp32 or bf16 caches (bf16 widened to fp32 on load: a shift, exact),
// so they need AVX-512BW and VL besides F for the 16-bit masked loads.
#define RPG_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))
template <class T>
RPG_AVX512_TARGET inline __m512 load16(__mmask16 m, const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_maskz_loadu_ps(m, p);
  } else {
    return detail::widen_bf16(_mm256_maskz_loadu_epi16(m, p));
  }
}

#define RPG_FMA2(h)                                         \
  {                                                         \
    const __m512 qb = _mm512_set1_ps(qs[(h) * D + d]);      \
    a##h##0 = _mm512_fmadd_ps(qb, k0, a##h##0);             \
    a##h##1 = _mm512_fmadd_ps(qb, k1, a##h##1);             \
  }
#define RPG_STORE2(h)                                                 \
  {                                                                   \
    _mm512_mask_storeu_ps(s + (h) * L, m0, a##h##0);                  \
    _mm512_mask_storeu_ps(s + (h) * L + 16, m1, a##h##1);             \
  }
// One block of keys (D rows of kKeyBlock, contiguous), the lanes m0, m1 of it; s: the score rows
// at the block's first key.
template <int NH, bool Ahead, class T>
RPG_AVX512_TARGET void scores_block512(const float* __restrict qs, int64_t D, const T* __restrict block,
                                       __mmask16 m0, __mmask16 m1, float* __restrict s, int64_t L) {
  static_assert(kKeyBlock == 32, "two vectors per block row");
  __m512 a00 = _mm512_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00;
  for (int64_t d = 0; d < D; ++d) {
    const T* row = block + d * kKeyBlock;
    if constexpr (Ahead) {  // the same row of the block two ahead (one line of bf16, two of fp32)
      __builtin_prefetch(row + 2 * D * kKeyBlock);
      if constexpr (sizeof(T) == 4) __builtin_prefetch(row + 2 * D * kKeyBlock + 16);
    }
    const __m512 k0 = load16(m0, row), k1 = load16(m1, row + 16);
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
template <int NH, class T>
RPG_AVX512_TARGET void values_block512(const float* __restrict p, int64_t L, const T* __restrict v, int64_t D,
                                       int64_t c0, const __mmask16* mk, int64_t j_begin, int64_t j_end,
                                       float* __restrict acc) {
  __m512 a00, a01, a02, a03, a10, a11, a12, a13, a20, a21, a22, a23, a30, a31, a32, a33;
  a10 = a11 = a12 = a13 = a20 = a21 = a22 = a23 = a30 = a31 = a32 = a33 = _mm512_setzero_ps();
  RPG_ACC_LOAD(0)
  if constexpr (NH > 1) { RPG_ACC_LOAD(1) }
  if constexpr (NH > 2) { RPG_ACC_LOAD(2) }
  if constexpr (NH > 3) { RPG_ACC_LOAD(3) }
  for (int64_t j = j_begin; j < j_end; ++j) {
    const T* vj = v + j * D + c0;
    const __m512 v0 = load16(mk[0], vj), v1 = load16(mk[1], vj + 16);
    const __m512 v2 = load16(mk[2], vj + 32), v3 = load16(mk[3], vj + 48);
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
// Lanes [lo, hi) of a block's 32 keys as its two vectors' masks.
std::pair<__mmask16, __mmask16> block_masks(int64_t lo, int64_t hi) {
  return {static_cast<__mmask16>(lanes_mask(hi) & ~lanes_mask(lo)),
          static_cast<__mmask16>(lanes_mask(hi - 16) & ~lanes_mask(lo - 16))};
}

// One (row, KV head) item's run [j0, j1) of keys: scores s [rep, L] from the scaled queries
// qs [rep, D] and the slot's key blocks kb. `next_bytes` of `next` (the next item's first
// keys) are requested a share per block.
template <class T>
void scores_item512(const float* qs, const T* kb, int64_t j0, int64_t j1, int64_t L, int64_t rep, int64_t D,
                    float* s, const void* next, int64_t next_bytes) {
  const int64_t b0 = j0 / kKeyBlock, b1 = key_blocks(j1);
  for (int64_t b = b0; b < b1; ++b) {
    prefetch_share(next, next_bytes, b - b0, b1 - b0);
    const auto [m0, m1] = block_masks(j0 - b * kKeyBlock, j1 - b * kKeyBlock);
    const bool ahead = b + 2 < b1;
    const T* block = kb + b * D * kKeyBlock;
    float* sb = s + b * kKeyBlock;
    for (int64_t h0 = 0; h0 < rep; h0 += 4)
      detail::with_count<4>(rep - h0, [&](auto nh) {
        if (ahead) scores_block512<decltype(nh)::value, true, T>(qs + h0 * D, D, block, m0, m1, sb + h0 * L, L);
        else scores_block512<decltype(nh)::value, false, T>(qs + h0 * D, D, block, m0, m1, sb + h0 * L, L);
      });
  }
}

// acc [rep, D] += p [rep, L] . v over the run [j0, j1) (v: the slot's values from position 0),
// keys in tiles of 64 (a tile of values stays in L1 while every block of heads reads it).
template <class T>
void values_item512(const float* p, const T* v, int64_t j0, int64_t j1, int64_t L, int64_t rep, int64_t D,
                    float* acc, const void* next, int64_t next_bytes) {
  const int64_t tiles = (j1 - j0 + 63) / 64;
  for (int64_t t0 = j0; t0 < j1; t0 += 64) {
    const int64_t t1 = std::min(j1, t0 + 64);
    prefetch_share(next, next_bytes, (t0 - j0) / 64, tiles);
    for (int64_t c0 = 0; c0 < D; c0 += 64) {
      const __mmask16 mk[4] = {lanes_mask(D - c0), lanes_mask(D - c0 - 16), lanes_mask(D - c0 - 32),
                               lanes_mask(D - c0 - 48)};
      for (int64_t h0 = 0; h0 < rep; h0 += 4)
        detail::with_count<4>(rep - h0, [&](auto nh) {
          values_block512<decltype(nh)::value, T>(p + h0 * L, L, v, D, c0, mk, t0, t1, acc + h0 * D);
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
template <int NQ, bool Accumulate, class T>
RPG_AVX512_TARGET void rank1_multi512(const float* const* src, const T* __restrict x, int64_t x_step, int64_t count,
                                      __mmask16 m0, __mmask16 m1, float* const* dst, int64_t off) {
  RPG_Q12(RPG_DECL)
  if constexpr (Accumulate) { RPG_Q12(RPG_LOAD_PAIR) }
  for (int64_t idx = 0; idx < count; ++idx) {
    const T* xi = x + idx * x_step;
    const __m512 x0 = load16(m0, xi), x1 = load16(m1, xi + 16);
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

// The scores of `nq` queries (q[i] [D], scaled) over the keys [0, n) of the key blocks kb into
// s[i][0, n); then, once softmaxed, the same queries' weighted sums of v [n, D] added to
// acc[i] [D].
template <class T>
void prompt_scores512(const float* const* q, int64_t nq, int64_t D, const T* kb, int64_t n, float* const* s) {
  for (int64_t j0 = 0; j0 < n; j0 += kKeyBlock) {
    const auto [m0, m1] = block_masks(0, n - j0);
    for (int64_t i0 = 0; i0 < nq; i0 += kMultiQueries)
      detail::with_count<kMultiQueries>(std::min(kMultiQueries, nq - i0), [&](auto c) {
        rank1_multi512<decltype(c)::value, false, T>(q + i0, kb + j0 * D, kKeyBlock, D, m0, m1, s + i0, j0);
      });
  }
}
template <class T>
void prompt_values512(const float* const* p, int64_t nq, int64_t D, const T* v, int64_t n, float* const* acc) {
  for (int64_t i0 = 0; i0 < nq; i0 += kMultiQueries)
    for (int64_t c0 = 0; c0 < D; c0 += 32)
      detail::with_count<kMultiQueries>(std::min(kMultiQueries, nq - i0), [&](auto c) {
        rank1_multi512<decltype(c)::value, true, T>(p + i0, v + c0, D, n, lanes_mask(D - c0),
                                                    lanes_mask(D - c0 - 16), acc + i0, c0);
      });
}

// RPG_DECODE_ATTENTION: generic or avx512 pick kAuto's form (benchmarks compare the two);
// sdpa turns this kernel off, so that decode runs the device-generic path a GPU takes
// (position-major caches, SDPA under a mask) on the CPU too (tests of that path).
const std::string& decode_attention_env() {
  static const std::string want = [] {
    const char* env = std::getenv("RPG_DECODE_ATTENTION");
    std::string w = env ? env : "";
    if (!w.empty() && w != "generic" && w != "avx512" && w != "sdpa")
      log_warn("RPG_DECODE_ATTENTION=" + w + ": expected generic, avx512 or sdpa; ignored");
    return w;
  }();
  return want;
}

// What the kernels here are written for: CPU, fp32 or bf16.
bool kernel_takes(at::ScalarType dtype, c10::Device device) {
  return device.is_cpu() && (dtype == at::kFloat || dtype == at::kBFloat16);
}
bool kernel_takes(const at::Tensor& t) { return kernel_takes(t.scalar_type(), t.device()); }

// kAuto's choice: the AVX-512 form where the CPU has it, unless RPG_DECODE_ATTENTION=generic.
bool auto_uses_avx512() {
  static const bool use = decode_attention_env() != "generic" && detail::cpu_has_avx512_bw_vl();
  return use;
}

// One run of an item's keys, [j0, j1): the slot they are read from and which scores they fill.
template <class T>
struct KeyRun {
  const T* k = nullptr;  // the slot's key blocks for the item's KV head
  const T* v = nullptr;  // the slot's values for that head, from position 0
  int64_t j0 = 0, j1 = 0;
};

// RoPE of n positions of H heads each (rope_rows's arithmetic), on T's elements.
template <class T>
void rope(const T* x, const T* cos, const T* sin, T* y, int64_t n, int64_t H, int64_t D) {
  if constexpr (std::is_same_v<T, float>)
    detail::rope_span(x, cos, sin, y, n, H, D);
  else
    detail::rope_span_bf16(reinterpret_cast<const uint16_t*>(x), reinterpret_cast<const uint16_t*>(cos),
                           reinterpret_cast<const uint16_t*>(sin), reinterpret_cast<uint16_t*>(y), n, H, D);
}

template <class T>
at::Tensor run(const at::Tensor& q, const at::Tensor& kt_cache, const at::Tensor& v_cache, const at::Tensor& slots,
               const at::Tensor& positions, const SharedPrefix& prefix, bool avx512, const NewTokens& fresh) {
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2), Hkv = v_cache.size(1), cap = v_cache.size(2);
  const int64_t rep = H / Hkv;
  const bool rotate = fresh.k.defined();
  // Without fresh tokens the queries are read as they are (widened to fp32 once); with them each
  // task rotates its rows' queries into a buffer of its own.
  const at::Tensor qf = rotate ? q.contiguous() : q.to(at::kFloat).contiguous();
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
  if (rotate) {
    // The tasks write while others read: each slot written once, and no prefix read reaching a
    // position written in this call (the row holding that slot writes at its position).
    std::vector<int64_t> writer(static_cast<size_t>(v_cache.size(0)), -1);
    for (int64_t r = 0; r < R; ++r) {
      TORCH_CHECK(writer[static_cast<size_t>(slot[r])] < 0, "decode_attention: slot ", slot[r],
                  " given twice with fresh tokens");
      writer[static_cast<size_t>(slot[r])] = r;
    }
    for (int64_t r = 0; r < R && shared; ++r) {
      const int64_t w = writer[static_cast<size_t>(pslot[r])];
      TORCH_CHECK(plen[r] <= pos[r] && (w < 0 || plen[r] <= pos[w]), "decode_attention: row ", r, " reads ",
                  plen[r], " prefix keys of slot ", pslot[r], ", past a position this call writes");
    }
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
  const float* qp = rotate ? nullptr : qf.data_ptr<float>();
  T* const kp = kt_cache.data_ptr<T>();
  T* const vp = v_cache.data_ptr<T>();
  at::Tensor out = detail::new_cpu_tensor({R, H * D}, q.scalar_type());
  T* op = out.data_ptr<T>();
  const int64_t key_stride = key_span(0, cap, D).size, value_stride = cap * D;  // per (slot, KV head)
  // An item's (a row's and a KV head's, at it = r * Hkv + g) runs of keys: the shared prefix,
  // then the rest from its own slot.
  auto runs = [&](int64_t it) {
    const int64_t r = it / Hkv, g = it % Hkv, n = pos[r] + 1, p = shared ? plen[r] : 0;
    auto at_slot = [&](int64_t s, int64_t j0, int64_t j1) {
      return KeyRun<T>{kp + (s * Hkv + g) * key_stride, vp + (s * Hkv + g) * value_stride, j0, j1};
    };
    return std::array<KeyRun<T>, 2>{at_slot(p > 0 ? pslot[r] : slot[r], 0, p), at_slot(slot[r], p, n)};
  };
  constexpr int64_t es = static_cast<int64_t>(sizeof(T));
  const T* raw_q = rotate ? qf.data_ptr<T>() : nullptr;
  const T* new_k = rotate ? fresh.k.data_ptr<T>() : nullptr;
  const T* new_v = rotate ? fresh.v.data_ptr<T>() : nullptr;
  const T* cos = rotate ? fresh.cos.data_ptr<T>() : nullptr;
  const T* sin = rotate ? fresh.sin.data_ptr<T>() : nullptr;
  // Element 0 of row r's new key for KV head g in the blocked cache (its other elements follow
  // kKeyBlock apart: keys are dimension-major in their block).
  auto new_key_at = [&](int64_t r, int64_t g) {
    const int64_t p = pos[r];
    return kp + (slot[r] * Hkv + g) * key_stride + key_span(p, p + 1, D).offset + p % kKeyBlock;
  };
  // Row r's queries for KV head g as fp32 (rep * D). With fresh tokens: rotated into `buf`
  // (rounded to T first, as rope_rows's T tensor holds them), and the row's key (rotated) and
  // value for head g written into the caches; `tmp` holds rep * D elements of T.
  auto queries = [&](int64_t r, int64_t g, float* buf, T* tmp) -> const float* {
    if (!rotate) return qp + (r * H + g * rep) * D;
    const T *c = cos + r * D, *sn = sin + r * D;
    rope(raw_q + (r * H + g * rep) * D, c, sn, tmp, 1, rep, D);
    for (int64_t i = 0; i < rep * D; ++i) buf[i] = to_float(tmp[i]);
    rope(new_k + (r * Hkv + g) * D, c, sn, tmp, 1, 1, D);
    T* key = new_key_at(r, g);
    for (int64_t d = 0; d < D; ++d) key[d * kKeyBlock] = tmp[d];
    std::memcpy(vp + ((slot[r] * Hkv + g) * cap + pos[r]) * D, new_v + (r * Hkv + g) * D,
                static_cast<size_t>(D) * sizeof(T));
    return buf;
  };

  // One (row, KV head) item in one pass while its scores are in L1: scores, softmax, weighted
  // values. `next`: the first run of the next item, whose first kAheadKeys keys and values are
  // requested meanwhile.
  auto one_item = [&](int64_t it, const float* qi, const KeyRun<T>& next, float* s, float* qs, float* acc) {
    const int64_t r = it / Hkv, g = it % Hkv, n = pos[r] + 1;
    const int64_t ahead_end = std::min(next.j1, next.j0 + kAheadKeys);
    const bool any_next = next.j1 > next.j0;
    const KeySpan next_keys = key_span(next.j0, ahead_end, D);
    const void* next_k = any_next ? next.k + next_keys.offset : nullptr;
    const void* next_v = any_next ? next.v + next.j0 * D : nullptr;
    const int64_t next_k_bytes = next_keys.size * es, next_v_bytes = (ahead_end - next.j0) * D * es;
    const auto item_runs = runs(it);
    if (avx512) scaled_copy(qi, scale, qs, rep * D);
    for (const KeyRun<T>& run : item_runs) {
      if (run.j1 == run.j0) continue;
      if (avx512)
        scores_item512(qs, run.k, run.j0, run.j1, L, rep, D, s, next_k, next_k_bytes);
      else if constexpr (std::is_same_v<T, float>)
        scores_f32(qi, run.k, run.j0, run.j1, L, rep, D, scale, s, next_k, next_k_bytes);
      else
        scores_bf16(qi, run.k, run.j0, run.j1, L, rep, D, scale, s, next_k, next_k_bytes);
    }
    for (int64_t i = 0; i < rep; ++i) softmax_row(s + i * L, n);
    std::fill(acc, acc + rep * D, 0.0f);
    for (const KeyRun<T>& run : item_runs) {
      if (run.j1 == run.j0) continue;
      if (avx512)
        values_item512(s, run.v, run.j0, run.j1, L, rep, D, acc, next_v, next_v_bytes);
      else if constexpr (std::is_same_v<T, float>)
        values_f32(s, run.v, run.j0, run.j1, L, rep, D, acc, next_v, next_v_bytes);
      else
        values_bf16(s, run.v, run.j0, run.j1, L, rep, D, acc, next_v, next_v_bytes);
    }
    store_out(acc, op + (r * H + g * rep) * D, rep * D);
  };
  // Tasks: a KV head of a chunk of consecutive rows (in `order`). The AVX-512 form takes up
  // to kChunk rows sharing a prompt together (their queries against each block of the prompt's
  // keys and values at once, prompt_scores512 / prompt_values512); otherwise a chunk is one row.
  constexpr int64_t kChunk = 4;
  std::vector<std::pair<int64_t, int64_t>> chunks;  // [begin, end) in order
  for (int64_t k = 0; k < R;) {
    int64_t e = k + 1;
    {
      const int64_t r0 = order[static_cast<size_t>(k)];
      if (avx512 && shared && plen[r0] > 0)
        while (e < R && e - k < kChunk && plen[order[static_cast<size_t>(e)]] > 0 &&
               pslot[order[static_cast<size_t>(e)]] == pslot[r0])
          ++e;
    }
    chunks.emplace_back(k, e);
    k = e;
  }
  // Task t is KV head t / chunks of chunk t % chunks: the threads' contiguous shares of the
  // tasks then hold whole heads where they can, so a prompt's keys and values for a head come
  // from memory into one thread's caches (both threads read every head when the tasks go chunk
  // by chunk, as they did: at 8 rows of one prompt, two chunks, each thread one chunk).
  const int64_t num_chunks = static_cast<int64_t>(chunks.size()), tasks = num_chunks * Hkv;
  auto chunk_of = [&](int64_t t) { return chunks[static_cast<size_t>(t % num_chunks)]; };
  // With fresh tokens: the lines of task t's new keys (one per dimension: keys are dimension-
  // major in their block) requested for writing. Each task requests the next one's, so that
  // these misses overlap a task's work (the write pass this replaced, at 64 rows on one thread:
  // 274 ms per 63 steps without requests, 148 with four (row, KV head)s ahead).
  auto request_keys = [&](int64_t t) {
    if (!rotate) return;
    const auto [c0, c1] = chunk_of(t);
    for (int64_t k = c0; k < c1; ++k) {
      const T* key = new_key_at(order[static_cast<size_t>(k)], t / num_chunks);
      for (int64_t d = 0; d < D; ++d) __builtin_prefetch(key + d * kKeyBlock, 1);
    }
  };
  at::parallel_for(0, tasks, 1, [&](int64_t b, int64_t e) {
    const size_t per_row = static_cast<size_t>(rep * D);
    std::vector<float> qs(kChunk * per_row), acc(kChunk * per_row), scores(static_cast<size_t>(kChunk * rep * L));
    std::vector<const float*> qv(static_cast<size_t>(kChunk * rep));
    std::vector<float*> sv(static_cast<size_t>(kChunk * rep)), av(static_cast<size_t>(kChunk * rep));
    std::vector<float> qr(rotate ? kChunk * per_row : 0);  // rotated queries (fresh tokens)
    std::vector<T> tmp(rotate ? per_row : 0);
    for (int64_t t = b; t < e; ++t) {
      const auto [c0, c1] = chunk_of(t);
      const int64_t g = t / num_chunks, nr = c1 - c0;
      if (t == b) request_keys(t);
      if (t + 1 < e) request_keys(t + 1);
      if (nr == 1) {
        const int64_t it = order[static_cast<size_t>(c0)] * Hkv + g;
        const float* qi = queries(order[static_cast<size_t>(c0)], g, qr.data(), tmp.data());
        KeyRun<T> next{};
        if (t + 1 < e) {
          const int64_t d0 = chunk_of(t + 1).first;
          const auto r = runs(order[static_cast<size_t>(d0)] * Hkv + (t + 1) / num_chunks);
          next = r[1].j1 > r[1].j0 ? r[1] : r[0];
        }
        one_item(it, qi, next, scores.data(), qs.data(), acc.data());
        continue;
      }
      {
        // The prompt's keys [0, P) from the first row's prefix slot, P the shortest of the chunk's
        // prefixes (a row's own slot holds the same values up to its own).
        int64_t P = std::numeric_limits<int64_t>::max();
        for (int64_t k = c0; k < c1; ++k) P = std::min(P, plen[order[static_cast<size_t>(k)]]);
        const int64_t ps = pslot[order[static_cast<size_t>(c0)]], nq = nr * rep;
        for (int64_t i = 0; i < nr; ++i) {
          const int64_t r = order[static_cast<size_t>(c0 + i)];
          const float* qi = queries(r, g, qr.data() + i * rep * D, tmp.data());
          scaled_copy(qi, scale, qs.data() + i * rep * D, rep * D);
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
          const int64_t own = slot[r] * Hkv + g;
          const KeySpan keys = key_span(P, n, D);
          prefetch<2>(kp + own * key_stride + keys.offset, keys.size * es);
          prefetch<2>(vp + own * value_stride + P * D, (n - P) * D * es);
        }
        const int64_t prompt = ps * Hkv + g;
        prompt_scores512(qv.data(), nq, D, kp + prompt * key_stride, P, sv.data());
        for (int64_t i = 0; i < nr; ++i) {  // each row's own keys after the prompt, then its softmax
          const int64_t r = order[static_cast<size_t>(c0 + i)], n = pos[r] + 1;
          const int64_t own = slot[r] * Hkv + g;
          if (n > P) scores_item512(qv[static_cast<size_t>(i * rep)], kp + own * key_stride, P, n, L, rep, D,
                                    sv[static_cast<size_t>(i * rep)], nullptr, 0);
          for (int64_t h = 0; h < rep; ++h) softmax_row(sv[static_cast<size_t>(i * rep + h)], n);
        }
        std::fill(acc.begin(), acc.begin() + static_cast<int64_t>(nq * D), 0.0f);
        prompt_values512(sv.data(), nq, D, vp + prompt * value_stride, P, av.data());
        for (int64_t i = 0; i < nr; ++i) {
          const int64_t r = order[static_cast<size_t>(c0 + i)], n = pos[r] + 1;
          const int64_t own = slot[r] * Hkv + g;
          if (n > P) values_item512(sv[static_cast<size_t>(i * rep)], vp + own * value_stride, P, n, L, rep, D,
                                    av[static_cast<size_t>(i * rep)], nullptr, 0);
          store_out(acc.data() + i * rep * D, op + (r * H + g * rep) * D, rep * D);
        }
      }
    }
  });
  return out;
}

// kt_cache is contiguous blocked keys for the values v_cache [S, Hkv, capacity, D].
bool blocked_keys_for(const at::Tensor& kt_cache, const at::Tensor& v_cache) {
  return kt_cache.dim() == 5 && v_cache.dim() == 4 && kt_cache.is_contiguous() &&
         kt_cache.sizes() == at::IntArrayRef{v_cache.size(0), v_cache.size(1), key_blocks(v_cache.size(2)),
                                             v_cache.size(3), kKeyBlock};
}

}  // namespace

at::Tensor block_keys(const at::Tensor& k) {
  TORCH_CHECK(k.dim() == 4, "block_keys: keys [S, Hkv, capacity, D]");
  const int64_t S = k.size(0), Hkv = k.size(1), cap = k.size(2), D = k.size(3), nb = key_blocks(cap);
  at::Tensor padded = at::constant_pad_nd(k, {0, 0, 0, nb * kKeyBlock - cap});
  return padded.view({S, Hkv, nb, kKeyBlock, D}).transpose(3, 4).contiguous();
}

at::Tensor unblock_keys(const at::Tensor& kt, int64_t n) {
  TORCH_CHECK(kt.dim() == 5 && kt.size(4) == kKeyBlock && n >= 0 && key_blocks(n) <= kt.size(2),
              "unblock_keys: blocked keys [S, Hkv, blocks, D, ", kKeyBlock, "] holding ", n, " positions");
  const int64_t nb = key_blocks(n);
  return kt.narrow(2, 0, nb).transpose(3, 4).reshape({kt.size(0), kt.size(1), nb * kKeyBlock, kt.size(3)}).narrow(2, 0, n);
}

KeyPlaces key_places(const at::Tensor& positions) {
  return {at::floor_divide(positions, kKeyBlock), at::remainder(positions, kKeyBlock)};
}

void put_blocked_keys(at::Tensor& kt, const at::Tensor& slot_index, const KeyPlaces& at, const at::Tensor& k) {
  TORCH_CHECK(kt.dim() == 5 && kt.size(4) == kKeyBlock, "put_blocked_keys: blocked keys [S, Hkv, blocks, D, ",
              kKeyBlock, "]");
  // [S, blocks, kKeyBlock, Hkv, D]: (slot, block, lane) names one position's [Hkv, D].
  kt.permute({0, 2, 4, 1, 3}).index_put_({slot_index, at.block, at.lane}, k);
}

bool decode_attention_supports(at::ScalarType dtype, c10::Device device) {
  return kernel_takes(dtype, device) && decode_attention_env() != "sdpa";
}

namespace detail {

bool attention_kernel_available(AttentionKernel kernel) {
  return kernel != AttentionKernel::kAvx512 || detail::cpu_has_avx512_bw_vl();
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& kt_cache, const at::Tensor& v_cache,
                            const at::Tensor& slots, const at::Tensor& positions, const SharedPrefix& prefix,
                            AttentionKernel kernel, const NewTokens& fresh) {
  TORCH_CHECK(q.dim() == 3 && blocked_keys_for(kt_cache, v_cache) && v_cache.is_contiguous() &&
                  q.size(2) == v_cache.size(3) && q.size(1) % v_cache.size(1) == 0 && slots.numel() == q.size(0) &&
                  positions.numel() == q.size(0),
              "decode_attention: q [R, H, D], contiguous caches kt [S, Hkv, capacity / ", kKeyBlock, ", D, ", kKeyBlock,
              "] and v [S, Hkv, capacity, D], slots and positions [R]");
  TORCH_CHECK(prefix.slots.defined() == prefix.lengths.defined() &&
                  (!prefix.slots.defined() ||
                   (prefix.slots.numel() == q.size(0) && prefix.lengths.numel() == q.size(0))),
              "decode_attention: prefix slots and lengths [R], both or neither");
  TORCH_CHECK(q.scalar_type() == kt_cache.scalar_type() && kt_cache.scalar_type() == v_cache.scalar_type() &&
                  kernel_takes(q),
              "decode_attention: CPU float32 or bfloat16, the same for q and the caches");
  if (fresh.k.defined() || fresh.v.defined() || fresh.cos.defined() || fresh.sin.defined()) {
    const int64_t R = q.size(0), Hkv = v_cache.size(1), D = v_cache.size(3);
    auto holds = [&](const at::Tensor& t, int64_t n) {
      return t.defined() && t.is_contiguous() && t.numel() == n && t.scalar_type() == q.scalar_type() && t.is_cpu();
    };
    TORCH_CHECK(q.is_contiguous() && D % 2 == 0 && holds(fresh.k, R * Hkv * D) && holds(fresh.v, R * Hkv * D) &&
                    holds(fresh.cos, R * D) && holds(fresh.sin, R * D),
                "decode_attention: fresh tokens need contiguous q, k and v [R, Hkv, D] and cos, sin [R, D] "
                "in q's dtype (D even)");
  }
  RECORD_FUNCTION("rpg::decode_attention", std::vector<c10::IValue>());  // a row of bench/roofline's --ops
  TORCH_CHECK(attention_kernel_available(kernel), "decode_attention: this CPU has no AVX-512 F, BW and VL");
  // kAuto: the register-blocked form where a KV head serves 3 or more query heads (the two forms
  // give the same bits). decode_attention's time per 15 steps on the Zen 4 VM, without shared
  // prompts, generic / AVX-512: SmolLM2 (3 per KV head) 16 sequences at 2048 keys 859 / 553 ms,
  // 64 at ~160 keys 1298 / 1162 ms; head dim 64 at 8 query heads, 4 layers, 16 at 2048 / 64 at
  // 160 keys: 1 per KV head 227 / 249 and 81 / 87 ms, 2 per KV head 136 / 137 and 51 / 53 ms,
  // 4 per KV head 79 / 73 and 31 / 26 ms.
  const int64_t rep = q.size(1) / v_cache.size(1);
  const bool avx512 =
      kernel == AttentionKernel::kAvx512 || (kernel == AttentionKernel::kAuto && rep >= 3 && auto_uses_avx512());
  if (q.scalar_type() == at::kFloat) return run<float>(q, kt_cache, v_cache, slots, positions, prefix, avx512, fresh);
  return run<c10::BFloat16>(q, kt_cache, v_cache, slots, positions, prefix, avx512, fresh);
}

}  // namespace detail

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& kt_cache, const at::Tensor& v_cache,
                            const at::Tensor& slots, const at::Tensor& positions, const SharedPrefix& prefix,
                            const NewTokens& fresh) {
  return detail::decode_attention(q, kt_cache, v_cache, slots, positions, prefix, detail::AttentionKernel::kAuto, fresh);
}

}  // namespace rpg::model
