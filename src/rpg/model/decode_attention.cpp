#include "rpg/model/decode_attention.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

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

// Scores of one (row, KV head): s[i * L + j] = scale * q_i . k_j for the rep query heads i
// and keys j < n_keys; -inf for n_keys <= j < L. kt: D rows of `stride` positions.
// Cache lines of [p, p + bytes) requested ahead of use: the next item's keys or values,
// while this item's are computed on (the K/V cache is read from memory once per step, in
// short rows the hardware prefetcher does not follow far enough).
inline __attribute__((always_inline)) void prefetch(const void* p, int64_t bytes) {
  if (!p) return;
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(static_cast<const char*>(p) + off);
}

template <class T>
inline __attribute__((always_inline)) void scores_item(const float* __restrict q, const T* __restrict kt,
                                                       int64_t stride, int64_t n_keys, int64_t L, int64_t rep,
                                                       int64_t D, float scale, float* __restrict s,
                                                       const T* next_kt, int64_t next_n) {
  for (int64_t x = 0; x < rep * L; ++x) s[x] = 0;
  for (int64_t d = 0; d < D; ++d) {
    prefetch(next_kt ? next_kt + d * stride : nullptr, next_n * static_cast<int64_t>(sizeof(T)));
    const T* __restrict row = kt + d * stride;
    for (int64_t i = 0; i < rep; ++i) {
      axpy(q[i * D + d] * scale, row, s + i * L, n_keys);
    }
  }
  for (int64_t i = 0; i < rep; ++i)
    for (int64_t j = n_keys; j < L; ++j) s[i * L + j] = -std::numeric_limits<float>::infinity();
}

// out_i = sum_j p[i * L + j] v_j over j < n_keys for the rep heads, in fp32 (acc: rep x D).
template <class T>
inline __attribute__((always_inline)) void values_item(const float* __restrict p, const T* __restrict v,
                                                       int64_t n_keys, int64_t L, int64_t rep, int64_t D,
                                                       float* __restrict acc, const T* next_v, int64_t next_n) {
  for (int64_t x = 0; x < rep * D; ++x) acc[x] = 0;
  // The next item's values, spread over this item's keys.
  const int64_t ahead = next_v ? (next_n * D * static_cast<int64_t>(sizeof(T)) + n_keys - 1) / n_keys : 0;
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

template <class T>
at::Tensor run(const at::Tensor& q, const at::Tensor& kt_cache, const at::Tensor& v_cache, const at::Tensor& slots,
               const at::Tensor& positions) {
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2), Hkv = v_cache.size(1), cap = v_cache.size(2);
  const int64_t rep = H / Hkv, items = R * Hkv;
  const at::Tensor qf = q.to(at::kFloat).contiguous();
  const at::Tensor slot_c = slots.to(at::kCPU, at::kLong).contiguous(), pos_c = positions.to(at::kCPU, at::kLong).contiguous();
  const int64_t* slot = slot_c.data_ptr<int64_t>();
  const int64_t* pos = pos_c.data_ptr<int64_t>();
  int64_t L = 1;
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(pos[r] >= 0 && pos[r] < cap && slot[r] >= 0 && slot[r] < v_cache.size(0),
                "decode_attention: row ", r, " slot ", slot[r], " position ", pos[r], " outside the cache");
    L = std::max(L, pos[r] + 1);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  at::Tensor scores = at::empty({items, rep, L}, q.options().dtype(at::kFloat));
  const float* qp = qf.data_ptr<float>();
  const T* kp = kt_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  float* sp = scores.data_ptr<float>();
  const int64_t head_stride = cap * D;  // one (slot, KV head)'s keys or values
  // Item it's keys or values (cache) and key count; the next item's for the prefetch.
  auto item_kv = [&](const T* cache, int64_t it) { return cache + (slot[it / Hkv] * Hkv + it % Hkv) * head_stride; };
  auto item_n = [&](int64_t it) { return pos[it / Hkv] + 1; };
  at::parallel_for(0, items, 1, [&](int64_t b, int64_t e) {
    for (int64_t it = b; it < e; ++it) {
      const int64_t r = it / Hkv, g = it % Hkv;
      const float* qi = qp + (r * H + g * rep) * D;
      const T* next = it + 1 < e ? item_kv(kp, it + 1) : nullptr;
      const int64_t next_n = it + 1 < e ? item_n(it + 1) : 0;
      if constexpr (std::is_same_v<T, float>)
        scores_f32(qi, item_kv(kp, it), cap, item_n(it), L, rep, D, scale, sp + it * rep * L, next, next_n);
      else scores_bf16(qi, item_kv(kp, it), cap, item_n(it), L, rep, D, scale, sp + it * rep * L, next, next_n);
    }
  });
  const at::Tensor probs = at::softmax(scores, -1);  // ATen's vectorised exp; -inf keys get 0
  const float* pp = probs.data_ptr<float>();
  at::Tensor out = at::empty({R, H * D}, q.options());
  T* op = out.data_ptr<T>();
  at::parallel_for(0, items, 1, [&](int64_t b, int64_t e) {
    std::vector<float> acc(static_cast<size_t>(rep * D));
    for (int64_t it = b; it < e; ++it) {
      const int64_t r = it / Hkv, g = it % Hkv;
      const T* next = it + 1 < e ? item_kv(vp, it + 1) : nullptr;
      const int64_t next_n = it + 1 < e ? item_n(it + 1) : 0;
      if constexpr (std::is_same_v<T, float>)
        values_f32(pp + it * rep * L, item_kv(vp, it), item_n(it), L, rep, D, acc.data(), next, next_n);
      else values_bf16(pp + it * rep * L, item_kv(vp, it), item_n(it), L, rep, D, acc.data(), next, next_n);
      T* o = op + (r * H + g * rep) * D;
      for (int64_t x = 0; x < rep * D; ++x) o[x] = static_cast<T>(acc[static_cast<size_t>(x)]);
    }
  });
  return out;
}

}  // namespace

bool decode_attention_supports(at::ScalarType dtype, c10::Device device) {
  return device.is_cpu() && (dtype == at::kFloat || dtype == at::kBFloat16);
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& kt_cache, const at::Tensor& v_cache,
                            const at::Tensor& slots, const at::Tensor& positions) {
  TORCH_CHECK(q.dim() == 3 && v_cache.dim() == 4 && kt_cache.sizes() == v_cache.transpose(2, 3).sizes() &&
                  kt_cache.is_contiguous() && v_cache.is_contiguous() && q.size(2) == v_cache.size(3) &&
                  q.size(1) % v_cache.size(1) == 0 && slots.numel() == q.size(0) && positions.numel() == q.size(0),
              "decode_attention: q [R, H, D], contiguous caches kt [S, Hkv, D, capacity] and v [S, Hkv, capacity, D], "
              "slots and positions [R]");
  TORCH_CHECK(q.scalar_type() == kt_cache.scalar_type() && kt_cache.scalar_type() == v_cache.scalar_type() &&
                  decode_attention_supports(q.scalar_type(), q.device()),
              "decode_attention: CPU float32 or bfloat16, the same for q and the caches");
  RECORD_FUNCTION("rpg::decode_attention", std::vector<c10::IValue>());  // a row of bench/roofline's --ops
  if (q.scalar_type() == at::kFloat) return run<float>(q, kt_cache, v_cache, slots, positions);
  return run<c10::BFloat16>(q, kt_cache, v_cache, slots, positions);
}

}  // namespace rpg::model
