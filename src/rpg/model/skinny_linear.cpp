#include "rpg/model/skinny_linear.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>

#include <cstring>

#include "rpg/core/cpu_clones.h"

// at::parallel_for's OpenMP region is compiled into this file: without -fopenmp it runs on one
// thread, silently (src/rpg/model/CMakeLists.txt).
#if !defined(_OPENMP)
#error "this kernel file must be compiled with -fopenmp"
#endif

// The 64-byte vector type below is only ever used inside the per-CPU clones (always
// inlined); GCC's note about its ABI in the baseline build does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace rpg::model {
namespace {

// 16 floats: one AVX-512 register; GCC splits it into two AVX2 (or four SSE) operations
// in the builds for those CPUs.
typedef float v16 __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;

inline __attribute__((always_inline)) v16 load(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline __attribute__((always_inline)) float lane_sum(v16 v) {
  float s = 0;
  for (int64_t t = 0; t < kLanes; ++t) s += v[t];
  return s;
}

// y[m][n] = x[m] . w[n] (+ b[n]) for NR weight rows n0.. and MR input rows m0..: NR x MR
// accumulators in registers, each weight vector loaded once for the MR rows. The prefetch
// one tile ahead may name addresses past the weights: harmless (a prefetch never faults).
template <int NR, int MR>
inline __attribute__((always_inline)) void tile(const float* __restrict x, int64_t K, const float* __restrict w,
                                                const float* __restrict b, int64_t n0, int64_t m0, float* __restrict y,
                                                int64_t N) {
  // Fully unrolled (the pragmas) so that the accumulators live in registers, not memory.
  v16 acc[NR][MR] = {};
  const int64_t Kv = K / kLanes * kLanes;
  for (int64_t k = 0; k < Kv; k += kLanes) {
    v16 xv[MR];
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) xv[m] = load(x + (m0 + m) * K + k);
#pragma GCC unroll 8
    for (int r = 0; r < NR; ++r) {
      __builtin_prefetch(w + (n0 + r + NR) * K + k);  // the next tile's rows (measured: +15%)
      const v16 wv = load(w + (n0 + r) * K + k);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) acc[r][m] += wv * xv[m];
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MR; ++m) {
      float s = lane_sum(acc[r][m]);
      for (int64_t k = Kv; k < K; ++k) s += w[(n0 + r) * K + k] * x[(m0 + m) * K + k];
      y[(m0 + m) * N + n0 + r] = b ? s + b[n0 + r] : s;
    }
}

// Weight rows [n0, n1) for every input row: tiles of 8 (then 4, then 1) weight rows x up to
// 4 input rows.
template <int NR>
inline __attribute__((always_inline)) void rows(const float* x, int64_t M, int64_t K, const float* w,
                                                const float* b, int64_t n0, float* y, int64_t N) {
  int64_t m0 = 0;
  for (; m0 + 4 <= M; m0 += 4) tile<NR, 4>(x, K, w, b, n0, m0, y, N);
  switch (M - m0) {
    case 3: tile<NR, 3>(x, K, w, b, n0, m0, y, N); break;
    case 2: tile<NR, 2>(x, K, w, b, n0, m0, y, N); break;
    case 1: tile<NR, 1>(x, K, w, b, n0, m0, y, N); break;
    default: break;
  }
}

RPG_CPU_CLONES void skinny_f32(const float* x, int64_t M, int64_t K, const float* w, const float* b, int64_t n0,
                               int64_t n1, float* y, int64_t N) {
  int64_t n = n0;
  for (; n + 8 <= n1; n += 8) rows<8>(x, M, K, w, b, n, y, N);
  for (; n + 4 <= n1; n += 4) rows<4>(x, M, K, w, b, n, y, N);
  for (; n < n1; ++n) rows<1>(x, M, K, w, b, n, y, N);
}

}  // namespace

at::Tensor skinny_linear_kernel(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2 && x.size(1) == weight.size(1) && x.is_contiguous() &&
                  weight.is_contiguous() && x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat &&
                  x.device().is_cpu() && weight.device().is_cpu() &&
                  (!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0) && bias.is_contiguous() &&
                                       bias.scalar_type() == at::kFloat)),
              "skinny_linear_kernel: contiguous float32 CPU x [M, K], weight [N, K], bias [N]");
  RECORD_FUNCTION("rpg::skinny_linear", std::vector<c10::IValue>());  // a row of bench/roofline's --ops
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  // Blocks of 32 weight rows (a multiple of the 4-row tile): enough to balance the threads
  // on the smallest projections (192 rows) without splitting the weight stream finer.
  constexpr int64_t kBlock = 32;
  at::parallel_for(0, (N + kBlock - 1) / kBlock, 1, [&](int64_t b0, int64_t b1) {
    skinny_f32(xp, M, K, wp, bp, b0 * kBlock, std::min(N, b1 * kBlock), yp, N);
  });
  return y;
}

at::Tensor linear_for_decode(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (c10::GradMode::is_enabled() || !x.device().is_cpu() || x.scalar_type() != at::kFloat ||
      weight.scalar_type() != at::kFloat || !weight.is_contiguous() || x.dim() < 1 ||
      x.numel() > kSkinnyRows * x.size(-1) || (bias.defined() && bias.scalar_type() != at::kFloat))
    return at::linear(x, weight, bias);
  std::vector<int64_t> out(x.sizes().begin(), x.sizes().end());
  out.back() = weight.size(0);
  return skinny_linear_kernel(x.reshape({-1, x.size(-1)}).contiguous(), weight, bias.defined() ? bias.contiguous() : bias)
      .view(out);
}

}  // namespace rpg::model
