#include "rpg/model/packed_gemm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/util/SmallVector.h>
#include <immintrin.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "rpg/core/cpu_clones.h"
#include "rpg/core/log.h"
#include "rpg/core/malloc_env.h"
#include "rpg/model/cpu_kernels.h"
#include "rpg/model/decode_elementwise.h"

// at::parallel_for's OpenMP region is compiled into this file: without -fopenmp it runs on one
// thread, silently (src/rpg/model/CMakeLists.txt).
#if !defined(_OPENMP)
#error "this kernel file must be compiled with -fopenmp"
#endif

// MKL's CBLAS packed-GEMM entry points (mkl_cblas.h; LP64: MKL_INT is int). Declared weak so
// that a libtorch built without MKL still links: the addresses are then null.
extern "C" {
size_t cblas_sgemm_pack_get_size(int identifier, int m, int n, int k) __attribute__((weak));
void cblas_sgemm_pack(int layout, int identifier, int trans, int m, int n, int k, float alpha, const float* src,
                      int ld, float* dest) __attribute__((weak));
void cblas_sgemm_compute(int layout, int transa, int transb, int m, int n, int k, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc) __attribute__((weak));
}

namespace rpg::model::detail {
namespace {

// mkl_cblas.h's enum values.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112, kPacked = 151, kBMatrix = 162;
// The row count the packing is told about. MKL's packed size does not depend on it, and one
// packing serves every row count (checked once per process by mkl_self_check()).
constexpr int kPackRows = 64;

// A page-aligned buffer of `bytes` for a packing. Undefined if the memory is not there.
//
// It comes from malloc, whose freed memory rpg-torch keeps for reuse (core/malloc_env.h), so
// a rollout's packed copy reuses what the previous update left free and costs no new memory.
// Buffers mapped apart from the heap (mmap) could never reuse the update's free memory:
// +0.8 GB of peak RSS over three SmolLM2 steps. On glibc's kept heap, only where the heap had
// no room -- a run's first rollout -- does the buffer extend it; its pages are handed back to
// the kernel when it is freed: kept, they stayed resident while the first update's tensors
// were placed around them (+120 MB of peak RSS in a 32 M-parameter model's first step, with
// MKL's packing, which asks for up to 4x the weight and writes about 1x). tcmalloc hands free
// spans back itself.
at::Tensor page_aligned_buffer(size_t bytes) {
  constexpr size_t kPage = 4096;
  bytes = (bytes + kPage - 1) / kPage * kPage;
  const char* heap_top = malloc_env::glibc_heap_kept() ? static_cast<const char*>(sbrk(0)) : nullptr;
  void* mem = nullptr;
  if (posix_memalign(&mem, kPage, bytes) != 0) return {};
  const bool extended_heap = heap_top && static_cast<const char*>(mem) + bytes > heap_top;
  return at::from_blob(
      mem, {static_cast<int64_t>(bytes / sizeof(float))},
      [bytes, extended_heap](void* p) {
        if (extended_heap) madvise(p, bytes, MADV_DONTNEED);
        std::free(p);
      },
      at::kFloat);
}

// ---- MKL's packed GEMM ---------------------------------------------------------------------

// W [N, K] row-major is B^T: packed as op(B) = W^T.
at::Tensor mkl_pack(const float* w, int n, int k) {
  at::Tensor buf = page_aligned_buffer(cblas_sgemm_pack_get_size(kBMatrix, kPackRows, n, k));
  if (buf.defined()) cblas_sgemm_pack(kRowMajor, kBMatrix, kTrans, kPackRows, n, k, 1.0f, w, k, buf.data_ptr<float>());
  return buf;
}

// y = x W^T (beta = 0: see PackedWeight::linear).
void mkl_compute(const float* x, int m, int n, int k, const float* packed, float* y) {
  cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, m, n, k, x, k, packed, n, 0.0f, y, n);
}

// One packing, multiplied by several row counts, against the exact product: entries are
// multiples of 1/8 in [-1, 1], so every partial sum is exact in fp32 and any summation
// order gives the same value.
bool mkl_self_check() {
  const int n = 37, k = 29;
  auto grid = [](int64_t count, int64_t salt) {
    at::Tensor t = at::arange(count, at::kLong).mul_(7).add_(salt).remainder_(17).sub_(8).to(at::kFloat).div_(8);
    return t;
  };
  const at::Tensor w = grid(n * k, 3).view({n, k});
  const at::Tensor buf = mkl_pack(w.data_ptr<float>(), n, k);
  if (!buf.defined()) return false;
  for (int m : {1, 2, 5, 64, 300}) {
    const at::Tensor x = grid(m * k, m).view({m, k});
    at::Tensor y = at::empty({m, n}, at::kFloat);
    mkl_compute(x.data_ptr<float>(), m, n, k, buf.data_ptr<float>(), y.data_ptr<float>());
    if (!at::equal(y, at::mm(x.to(at::kDouble), w.to(at::kDouble).t()).to(at::kFloat))) return false;
  }
  return true;
}

bool mkl_usable() {
  static const bool ok = [] {
    if (!cblas_sgemm_pack_get_size || !cblas_sgemm_pack || !cblas_sgemm_compute) return false;
    if (mkl_self_check()) return true;
    log_warn("MKL's packed GEMM failed its check on this CPU: it is not used");
    return false;
  }();
  return ok;
}

// ---- rpg's panel kernel (AVX2 + FMA) -------------------------------------------------------
//
// W [N, K] is stored as panels of kPanel output columns: panel p holds, for k = 0..K-1, the
// 24 weights W[24p .. 24p+23][k] side by side (columns past N are zero). The kernel keeps a
// 4-row x 24-column tile of y in 12 AVX2 registers and, per k, loads the panel's 3 vectors,
// broadcasts each row's x[r][k] and issues 12 FMAs: 7 loads per 12 FMAs, so the FMA units
// and not the loads set the pace. A panel (24 x K x 4 bytes: 55 KB at K = 576) stays in L2
// while every 4-row block of x passes over it; the threads split the panels. Why not MKL:
// on SmolLM2's decode products its packed GEMM ran at 7 / 31 / 117 GFLOP/s for 1 / 8 / 64
// rows on the 2-core EPYC, this kernel at 15.5 / 103 / 199 (`roofline_bench --phases gemm`,
// docs/benchmarks.md). Rows that did not fit 4 at a time use the same kernel at 1-3 rows:
// the arithmetic of each output is the same FMA chain either way.
//
// The AVX-512 form (kPanels512) is the same with 32-column panels and an 8-row x 32-column
// tile in 16 ZMM registers (2 loads and 8 broadcasts per 16 FMAs): 5-13 % faster than the
// AVX2 form at 8-256 rows on Zen 4, whose 512-bit FMAs are double-pumped; on CPUs with two
// full-width FMA units it has twice the AVX2 form's peak.
constexpr int64_t kPanel = 24, kPanel512 = 32;

// Every tile kernel takes `next` (NextPanel below): rows of the thread's next panel to request
// into L2 while it reads its own, so the next panel's first pass reads L2 instead of waiting on
// DRAM at each page (the hardware prefetchers stop at page boundaries), and its transfer
// overlaps this panel's arithmetic. Measured on the Xeon VM (SmolLM2's decode, 2 threads,
// docs/benchmarks.md): fp32 decode x8 2.58-2.66 -> 2.02-2.20 s, x64 6.88 -> 6.50-6.86 s; the
// VDPBF16PS products 15-30 % faster at 1-64 rows. Results are unchanged: prefetching moves no value.
inline void prefetch_l2(const void* line) { _mm_prefetch(static_cast<const char*>(line), _MM_HINT_T1); }

// The rows of the next panel a tile requests into L2 (prefetch_l2) while it multiplies: rows
// first, first + step, ... (by K index; none without a panel). The row tiles of one panel take
// turns (tile i of n: first i, step n), so the next panel is requested once, spread over all of
// them. Requested by the first tile alone, in one pass, the fp32 decode at 16-64 rows took
// 9-10 % longer (docs/benchmarks.md, 2026-12-07).
// 16 bytes, so that it is passed in two registers: as 24 (64-bit first and step) it went
// through the stack, and the kernel's 16-byte load of it waited on the caller's two stores.
template <class T>
struct NextPanel {
  const T* panel = nullptr;
  int32_t first = 0, step = 1;
};

// The packings below go through K in spans of kPackSpan and move each span's piece of a panel
// (kPackSpan x width 32-bit lanes, contiguous in the panel: fp32 values, or pairs of bf16) as
// 8 x 8 blocks transposed in registers: 8 loads of 8 consecutive lanes from 8 weight rows, 8
// stores of 8 columns into 8 panel rows. A scalar load and store per value made the packing
// 1.6x as long (docs/benchmarks.md).
constexpr int64_t kPackSpan = 64;

// dst[r * ld + c] = rows[c][r] for r, c in [0, 8): 8 rows of 8 floats transposed.
__attribute__((target("avx2"))) inline void transpose8x8(const float* const rows[8], float* dst, int64_t ld) {
  const __m256 r0 = _mm256_loadu_ps(rows[0]), r1 = _mm256_loadu_ps(rows[1]), r2 = _mm256_loadu_ps(rows[2]),
               r3 = _mm256_loadu_ps(rows[3]), r4 = _mm256_loadu_ps(rows[4]), r5 = _mm256_loadu_ps(rows[5]),
               r6 = _mm256_loadu_ps(rows[6]), r7 = _mm256_loadu_ps(rows[7]);
  // Pairs interleaved (a0 b0 a1 b1 | a4 b4 a5 b5), then quadruples (a0 b0 c0 d0 | a4 b4 c4 d4),
  // then the 128-bit halves of the two quadruples joined into whole columns.
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
               t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
               t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)), s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)),
               s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)), s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2)),
               s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)), s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2)),
               s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)), s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  _mm256_storeu_ps(dst + 0 * ld, _mm256_permute2f128_ps(s0, s4, 0x20));
  _mm256_storeu_ps(dst + 1 * ld, _mm256_permute2f128_ps(s1, s5, 0x20));
  _mm256_storeu_ps(dst + 2 * ld, _mm256_permute2f128_ps(s2, s6, 0x20));
  _mm256_storeu_ps(dst + 3 * ld, _mm256_permute2f128_ps(s3, s7, 0x20));
  _mm256_storeu_ps(dst + 4 * ld, _mm256_permute2f128_ps(s0, s4, 0x31));
  _mm256_storeu_ps(dst + 5 * ld, _mm256_permute2f128_ps(s1, s5, 0x31));
  _mm256_storeu_ps(dst + 6 * ld, _mm256_permute2f128_ps(s2, s6, 0x31));
  _mm256_storeu_ps(dst + 7 * ld, _mm256_permute2f128_ps(s3, s7, 0x31));
}

// One span of one panel: dst[r * width + j] = src[j][r] for r < span, j < width (width a
// multiple of 8; columns from `cols` on are zero). src[j]: weight row j at the span's start.
__attribute__((target("avx2"))) void pack_span(const float* const* src, int64_t cols, int64_t width, int64_t span,
                                               float* dst) {
  alignas(32) static const float kZeros[kPackSpan] = {};
  const int64_t whole = span / 8 * 8;
  for (int64_t j = 0; j < width; j += 8) {
    const float* rows[8];
    for (int64_t c = 0; c < 8; ++c) rows[c] = j + c < cols ? src[j + c] : kZeros;
    for (int64_t r = 0; r < whole; r += 8) {
      const float* at[8];
      for (int64_t c = 0; c < 8; ++c) at[c] = rows[c] + r;
      transpose8x8(at, dst + r * width + j, width);
    }
    for (int64_t r = whole; r < span; ++r)  // memcpy: rows may be bf16 pairs at 2-byte offsets
      for (int64_t c = 0; c < 8; ++c) std::memcpy(dst + r * width + j + c, rows[c] + r, sizeof(float));
  }
}

at::Tensor panel_pack(const float* w, int64_t n, int64_t k, int64_t width) {
  TORCH_CHECK(width <= kPanel512 && width % 8 == 0, "panel_pack: panels of at most ", kPanel512,
              " columns, a multiple of 8");
  const int64_t panels = (n + width - 1) / width;
  at::Tensor buf = page_aligned_buffer(static_cast<size_t>(panels * k * width) * sizeof(float));
  if (!buf.defined()) return buf;
  float* out = buf.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      float* panel = out + p * k * width;
      const int64_t cols = std::min(width, n - p * width);
      for (int64_t i0 = 0; i0 < k; i0 += kPackSpan) {
        const int64_t i1 = std::min(k, i0 + kPackSpan);
        const float* src[kPanel512];
        for (int64_t j = 0; j < cols; ++j) {
          src[j] = w + (p * width + j) * k + i0;
          // The column's next span, requested while this one is read.
          for (int64_t i = i1; i < std::min(k, i1 + kPackSpan); i += 16)
            _mm_prefetch(reinterpret_cast<const char*>(w + (p * width + j) * k + i), _MM_HINT_T0);
        }
        pack_span(src, cols, width, i1 - i0, panel + i0 * width);
      }
    }
  });
  return buf;
}

// t[R rows, kPanel] = x[R rows, K] . panel; x rows `ldx` apart (t: the caller's tile, 32-byte
// aligned, rows kPanel apart).
template <int R>
__attribute__((target("avx2,fma"))) void panel_tile(const float* __restrict x, int64_t ldx,
                                                     const float* __restrict panel, int64_t K, float* __restrict t,
                                                     NextPanel<float> next, bool accumulate) {
  // Named accumulators, not an array: GCC kept an array's tile on the stack and stored it
  // every iteration (half the speed).
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00;
  __m256 c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
  if (accumulate) {
    c00 = _mm256_load_ps(t), c01 = _mm256_load_ps(t + 8), c02 = _mm256_load_ps(t + 16);
    if constexpr (R > 1) c10 = _mm256_load_ps(t + 24), c11 = _mm256_load_ps(t + 32), c12 = _mm256_load_ps(t + 40);
    if constexpr (R > 2) c20 = _mm256_load_ps(t + 48), c21 = _mm256_load_ps(t + 56), c22 = _mm256_load_ps(t + 64);
    if constexpr (R > 3) c30 = _mm256_load_ps(t + 72), c31 = _mm256_load_ps(t + 80), c32 = _mm256_load_ps(t + 88);
  }
  const float* x0 = x;
  const float* x1 = x + (R > 1 ? ldx : 0);
  const float* x2 = x + (R > 2 ? 2 * ldx : 0);
  const float* x3 = x + (R > 3 ? 3 * ldx : 0);
  for (int64_t k = 0, want = next.panel ? next.first : K; k < K; ++k) {
    const float* b = panel + k * kPanel;
    if (k == want) {  // 96 bytes a row
      prefetch_l2(next.panel + k * kPanel), prefetch_l2(next.panel + k * kPanel + 16);
      want += next.step;
    }
    const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8), b2 = _mm256_load_ps(b + 16);
    __m256 a = _mm256_broadcast_ss(x0 + k);
    c00 = _mm256_fmadd_ps(a, b0, c00), c01 = _mm256_fmadd_ps(a, b1, c01), c02 = _mm256_fmadd_ps(a, b2, c02);
    if constexpr (R > 1) {
      a = _mm256_broadcast_ss(x1 + k);
      c10 = _mm256_fmadd_ps(a, b0, c10), c11 = _mm256_fmadd_ps(a, b1, c11), c12 = _mm256_fmadd_ps(a, b2, c12);
    }
    if constexpr (R > 2) {
      a = _mm256_broadcast_ss(x2 + k);
      c20 = _mm256_fmadd_ps(a, b0, c20), c21 = _mm256_fmadd_ps(a, b1, c21), c22 = _mm256_fmadd_ps(a, b2, c22);
    }
    if constexpr (R > 3) {
      a = _mm256_broadcast_ss(x3 + k);
      c30 = _mm256_fmadd_ps(a, b0, c30), c31 = _mm256_fmadd_ps(a, b1, c31), c32 = _mm256_fmadd_ps(a, b2, c32);
    }
  }
  _mm256_store_ps(t, c00), _mm256_store_ps(t + 8, c01), _mm256_store_ps(t + 16, c02);
  if constexpr (R > 1) _mm256_store_ps(t + 24, c10), _mm256_store_ps(t + 32, c11), _mm256_store_ps(t + 40, c12);
  if constexpr (R > 2) _mm256_store_ps(t + 48, c20), _mm256_store_ps(t + 56, c21), _mm256_store_ps(t + 64, c22);
  if constexpr (R > 3) _mm256_store_ps(t + 72, c30), _mm256_store_ps(t + 80, c31), _mm256_store_ps(t + 88, c32);
}

// The tile both AVX-512 panel kernels (fp32 and bf16) keep in 16 ZMM registers: rows r < R of
// 32 fp32 columns as c<r>0, c<r>1; stored to t (64-byte aligned, rows 32 apart).
#define RPG_TILE8_ROW_DECLARE(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = _mm512_setzero_ps();
#define RPG_TILE8_DECLARE()                                                                         \
  RPG_TILE8_ROW_DECLARE(0) RPG_TILE8_ROW_DECLARE(1) RPG_TILE8_ROW_DECLARE(2) RPG_TILE8_ROW_DECLARE(3) \
  RPG_TILE8_ROW_DECLARE(4) RPG_TILE8_ROW_DECLARE(5) RPG_TILE8_ROW_DECLARE(6) RPG_TILE8_ROW_DECLARE(7)
#define RPG_TILE8_ROW_LOAD(t, r) \
  if constexpr (R > r) c##r##0 = _mm512_load_ps((t) + r * 32), c##r##1 = _mm512_load_ps((t) + r * 32 + 16);
#define RPG_TILE8_LOAD(t)                                                                          \
  RPG_TILE8_ROW_LOAD(t, 0) RPG_TILE8_ROW_LOAD(t, 1) RPG_TILE8_ROW_LOAD(t, 2) RPG_TILE8_ROW_LOAD(t, 3) \
  RPG_TILE8_ROW_LOAD(t, 4) RPG_TILE8_ROW_LOAD(t, 5) RPG_TILE8_ROW_LOAD(t, 6) RPG_TILE8_ROW_LOAD(t, 7)
#define RPG_TILE8_ROW_STORE(t, r) \
  if constexpr (R > r) _mm512_store_ps((t) + r * 32, c##r##0), _mm512_store_ps((t) + r * 32 + 16, c##r##1);
#define RPG_TILE8_STORE(t)                                                                          \
  RPG_TILE8_ROW_STORE(t, 0) RPG_TILE8_ROW_STORE(t, 1) RPG_TILE8_ROW_STORE(t, 2) RPG_TILE8_ROW_STORE(t, 3) \
  RPG_TILE8_ROW_STORE(t, 4) RPG_TILE8_ROW_STORE(t, 5) RPG_TILE8_ROW_STORE(t, 6) RPG_TILE8_ROW_STORE(t, 7)

// The AVX-512 tile: t[R rows, 32] = x[R rows, K] . panel (32 columns), R <= 8 (t: 64-byte aligned),
// or t += that, continuing t's sums (accumulate).
template <int R>
__attribute__((target("avx512f"))) void panel_tile512(const float* __restrict x, int64_t ldx,
                                                       const float* __restrict panel, int64_t K, float* __restrict t,
                                                       NextPanel<float> next, bool accumulate) {
  static_assert(kPanel512 == 32, "RPG_TILE8: rows of 32 columns");
  RPG_TILE8_DECLARE()
  if (accumulate) { RPG_TILE8_LOAD(t) }
  for (int64_t k = 0, want = next.panel ? next.first : K; k < K; ++k) {
    const float* b = panel + k * kPanel512;
    if (k == want) {
      prefetch_l2(next.panel + k * kPanel512), prefetch_l2(next.panel + k * kPanel512 + 16);
      want += next.step;
    }
    const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#define RPG_TILE_ROW_FMA(r)                                \
  if constexpr (R > r) {                                   \
    const __m512 a = _mm512_set1_ps(x[r * ldx + k]);       \
    c##r##0 = _mm512_fmadd_ps(a, b0, c##r##0);             \
    c##r##1 = _mm512_fmadd_ps(a, b1, c##r##1);             \
  }
    RPG_TILE_ROW_FMA(0) RPG_TILE_ROW_FMA(1) RPG_TILE_ROW_FMA(2) RPG_TILE_ROW_FMA(3)
    RPG_TILE_ROW_FMA(4) RPG_TILE_ROW_FMA(5) RPG_TILE_ROW_FMA(6) RPG_TILE_ROW_FMA(7)
#undef RPG_TILE_ROW_FMA
  }
  RPG_TILE8_STORE(t)
}

// A panel backend's tile kernel: kWidth columns per panel, up to kRows rows per tile; a panel
// read by several row tiles is taken in blocks of kBlockK values of K (for_each_tile).
struct Avx2Tiles {
  static constexpr int64_t kWidth = kPanel, kRows = 4, kBlockK = 256;
  template <int R>
  static void tile(const float* x, int64_t ldx, const float* panel, int64_t K, float* t, NextPanel<float> next,
                   bool accumulate) {
    panel_tile<R>(x, ldx, panel, K, t, next, accumulate);
  }
};
struct Avx512Tiles {
  static constexpr int64_t kWidth = kPanel512, kRows = 8, kBlockK = 128;
  template <int R>
  static void tile(const float* x, int64_t ldx, const float* panel, int64_t K, float* t, NextPanel<float> next,
                   bool accumulate) {
    panel_tile512<R>(x, ldx, panel, K, t, next, accumulate);
  }
};

// ---- the bf16 panel kernel (AVX512_BF16) ---------------------------------------------------
//
// W [N, K] bf16 as panels of 32 columns in pairs of K: for pair q = k / 2, the panel holds
// W[c][2q], W[c][2q + 1] side by side for its 32 columns c (64 bf16, two ZMM registers), so
// that one VDPBF16PS multiplies 16 columns' pair by a row's broadcast pair (x[r][2q],
// x[r][2q + 1]) and adds both products to the column's fp32 sum. An odd K gets a zero last k.
// The tile is the AVX-512 form's: 8 rows x 32 columns in 16 ZMM registers, 2 loads and 8
// broadcasts per 16 dot products. Each output is one chain over the pairs in order, so a row's
// result does not depend on the rows beside it (as for the fp32 panels).
constexpr int64_t kPanelBf16 = 32;
#define RPG_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// A bf16 panel's pairs of K: (K + 1) / 2, padded with zero pairs to a multiple of pair_multiple
// (the tiles' kPairMultiple: 1 for VDPBF16PS, 16 for AMX). The packing and panel_at() share it.
constexpr int64_t panel_pairs(int64_t k, int64_t pair_multiple) {
  return ((k + 1) / 2 + pair_multiple - 1) / pair_multiple * pair_multiple;
}

at::Tensor panel_pack_bf16(const uint16_t* w, int64_t n, int64_t k, int64_t pair_multiple) {
  const int64_t panels = (n + kPanelBf16 - 1) / kPanelBf16, pairs = panel_pairs(k, pair_multiple);
  at::Tensor buf = page_aligned_buffer(static_cast<size_t>(panels * pairs * 2 * kPanelBf16) * sizeof(uint16_t));
  if (!buf.defined()) return buf;
  auto* out = reinterpret_cast<uint16_t*>(buf.data_ptr<float>());
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      uint16_t* panel = out + p * pairs * 2 * kPanelBf16;
      const int64_t cols = std::min(kPanelBf16, n - p * kPanelBf16);
      // A pair of K values is one 32-bit lane of the panel (the lower address the lower half),
      // so the fp32 packing's transposes move the pairs that K holds whole. The last pair of
      // an odd K (its upper half zero) and the pairs beyond K (to pair_multiple) are written here.
      const int64_t whole_pairs = k / 2;
      for (int64_t q0 = 0; q0 < pairs; q0 += kPackSpan) {
        const int64_t q1 = std::min(pairs, q0 + kPackSpan);
        const int64_t full = std::clamp<int64_t>(whole_pairs - q0, 0, q1 - q0);
        if (full > 0) {
          const float* src[kPanelBf16];
          for (int64_t j = 0; j < cols; ++j)
            src[j] = reinterpret_cast<const float*>(w + (p * kPanelBf16 + j) * k + 2 * q0);
          pack_span(src, cols, kPanelBf16, full, reinterpret_cast<float*>(panel + q0 * 2 * kPanelBf16));
        }
        for (int64_t q = q0 + full; q < q1; ++q)
          for (int64_t j = 0; j < kPanelBf16; ++j)
            for (int64_t h = 0; h < 2; ++h)
              panel[q * 2 * kPanelBf16 + 2 * j + h] =
                  j < cols && 2 * q + h < k ? w[(p * kPanelBf16 + j) * k + 2 * q + h] : uint16_t{0};
      }
    }
  });
  return buf;
}

// t[R rows, 32] (fp32) = x[R rows, K] . panel, R <= 8, x bf16 rows `ldx` apart (t: 64-byte aligned).
template <int R>
RPG_BF16_TARGET void panel_tile_bf16(const uint16_t* __restrict x, int64_t ldx, const uint16_t* __restrict panel,
                                     int64_t K, float* __restrict t, NextPanel<uint16_t> next) {
  static_assert(kPanelBf16 == 32, "RPG_TILE8: rows of 32 columns");
  RPG_TILE8_DECLARE()
  // The row's pair q of x as one 32-bit lane, broadcast (the last pair of an odd K with a zero).
  auto pair = [&](int64_t r, int64_t q) -> int32_t {
    const uint16_t lo = x[r * ldx + 2 * q], hi = 2 * q + 1 < K ? x[r * ldx + 2 * q + 1] : uint16_t{0};
    return static_cast<int32_t>(static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16);
  };
  const int64_t full = K / 2, pairs = (K + 1) / 2;
  for (int64_t q = 0, want = next.panel ? next.first : pairs; q < pairs; ++q) {
    const uint16_t* b = panel + q * 2 * kPanelBf16;
    if (q == want) {
      prefetch_l2(next.panel + q * 2 * kPanelBf16), prefetch_l2(next.panel + q * 2 * kPanelBf16 + 32);
      want += next.step;
    }
    const __m512bh b0 = (__m512bh)_mm512_load_si512(b), b1 = (__m512bh)_mm512_load_si512(b + 32);
#define RPG_TILE_ROW_DOT(r)                                                                    \
  if constexpr (R > r) {                                                                       \
    int32_t xr;                                                                                \
    if (q < full) std::memcpy(&xr, x + r * ldx + 2 * q, sizeof xr);                            \
    else xr = pair(r, q);                                                                      \
    const __m512bh a = (__m512bh)_mm512_set1_epi32(xr);                                        \
    c##r##0 = _mm512_dpbf16_ps(c##r##0, a, b0);                                                \
    c##r##1 = _mm512_dpbf16_ps(c##r##1, a, b1);                                                \
  }
    RPG_TILE_ROW_DOT(0) RPG_TILE_ROW_DOT(1) RPG_TILE_ROW_DOT(2) RPG_TILE_ROW_DOT(3)
    RPG_TILE_ROW_DOT(4) RPG_TILE_ROW_DOT(5) RPG_TILE_ROW_DOT(6) RPG_TILE_ROW_DOT(7)
#undef RPG_TILE_ROW_DOT
  }
  RPG_TILE8_STORE(t)
}

#undef RPG_TILE8_ROW_DECLARE
#undef RPG_TILE8_DECLARE
#undef RPG_TILE8_ROW_STORE
#undef RPG_TILE8_STORE
#undef RPG_TILE8_ROW_LOAD
#undef RPG_TILE8_LOAD

// y[0, cols) = bf16(t + bias) (+ residual, added in fp32 and rounded again): the bf16 tile's
// store, 16 lanes at a time (VCVTNEPS2BF16 rounds to nearest even, as c10 does).
RPG_BF16_TARGET void store_row_bf16(const float* t, int64_t cols, const uint16_t* bias, const uint16_t* residual,
                                    uint16_t* y) {
  for (int64_t c = 0; c < cols; c += 16) {
    const __mmask16 m =
        cols - c >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (cols - c)) - 1);
    __m512 v = _mm512_maskz_loadu_ps(m, t + c);
    if (bias) v = _mm512_add_ps(v, widen_bf16(_mm256_maskz_loadu_epi16(m, bias + c)));
    __m256i out = (__m256i)_mm512_cvtneps_pbh(v);
    if (residual) {
      const __m512 res = widen_bf16(_mm256_maskz_loadu_epi16(m, residual + c));
      out = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(res, widen_bf16(out)));
    }
    _mm256_mask_storeu_epi16(y + c, m, out);
  }
}

// y[0, cols) = residual + (t + bias) (either optional), the fp32 tile's store: the additions
// at::linear's result + residual makes, in that order, each case one vectorised loop (GCC makes
// the plain copy a memcpy). Its time, ~2-3 % of decode at 64 rows, is the residual's reads and
// y's first writes: hand-written AVX-512 stores took the same share of the samples.
RPG_CPU_CLONES void store_row_f32(const float* __restrict t, int64_t cols, const float* __restrict bias,
                                  const float* __restrict residual, float* __restrict y) {
  if (bias && residual)
    for (int64_t c = 0; c < cols; ++c) y[c] = residual[c] + (t[c] + bias[c]);
  else if (bias)
    for (int64_t c = 0; c < cols; ++c) y[c] = t[c] + bias[c];
  else if (residual)
    for (int64_t c = 0; c < cols; ++c) y[c] = residual[c] + t[c];
  else
    for (int64_t c = 0; c < cols; ++c) y[c] = t[c];
}

struct Bf16Tiles {
  static constexpr int64_t kWidth = kPanelBf16, kRows = 8, kPairMultiple = 1;
  // No kBlockK: a tile takes all of K at once (accumulate is never set). In K blocks the products
  // of 16-512 rows ran no faster (docs/benchmarks.md, 2026-12-07 fourth session).
  template <int R>
  static void tile(const c10::BFloat16* x, int64_t ldx, const c10::BFloat16* panel, int64_t K, float* t,
                   NextPanel<c10::BFloat16> next, bool /*accumulate*/) {
    panel_tile_bf16<R>(reinterpret_cast<const uint16_t*>(x), ldx, reinterpret_cast<const uint16_t*>(panel), K, t,
                       {reinterpret_cast<const uint16_t*>(next.panel), next.first, next.step});
  }
};

// ---- AMX-BF16 tiles over the bf16 panels (kAmxBf16) ---------------------------------------
//
// The bf16 panels are already in AMX's layout: pair q of a panel is 32 columns x 2 bf16 (128
// bytes), and its two 16-column halves are AMX B tiles of 16 pairs read 128 bytes apart. For AMX
// each panel's pairs are padded with zero pairs to whole tiles (K to a multiple of 32). A tile
// product takes 32 rows x 32 columns of y: tiles 0-3 accumulate its four 16 x 16 quarters in
// fp32, tiles 4-5 hold the two 16-row blocks' 32 values of K, tiles 6-7 the panel's halves for
// those 16 pairs, each loaded once for both row blocks (one tile load per TDPBF16PS; with one
// row block per load, 1.5 loads per product, the 64-row products ran at 780 GFLOP/s against the
// core's 3100). Up to 16 rows take one row block. Each output is still one fp32 chain over the
// pairs in order (rounded to bf16 once, in the shared store; the padding adds exact zeros), and
// a row's result does not depend on the rows beside it. The tiles read whole 16-row blocks of x
// and K padded to a multiple of 32: PackedWeight stages x into a zero-padded copy where needed.
#define RPG_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))

constexpr int64_t kAmxPairs = 16;  // pairs of K per tile (32 bf16 values: 64 bytes a row)

struct alignas(64) AmxTileConfig {  // LDTILECFG's 64-byte operand (palette 1)
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};  // bytes per row
  uint8_t rows[16] = {};
};

struct AmxTiles {
  static constexpr int64_t kWidth = kPanelBf16, kRows = 32, kPairMultiple = kAmxPairs;
  // Each thread loads the configuration (8 tiles of 16 rows x 64 bytes) before its tiles and
  // releases it after: other code on the same threads (oneDNN's bf16 products) loads its own.
  RPG_AMX_TARGET static void begin() {
    AmxTileConfig c;
    for (int i = 0; i < 8; ++i) c.rows[i] = 16, c.colsb[i] = 64;
    // Not _tile_loadconfig: GCC 12's reads the operand as another struct type, and under strict
    // aliasing the stores into `c` were dropped (every tile left unconfigured: SIGILL).
    asm volatile("ldtilecfg %0" : : "m"(c));
  }
  RPG_AMX_TARGET static void end() { _tile_release(); }
  // t[R rows, 32] (fp32) = x[16 or 32 rows, K] . panel, the first R rows kept; x bf16 rows `ldx` apart.
  // `next` is not requested: at AMX's rate the products ran no faster with it (64 rows: 723-843
  // GFLOP/s without, 782-795 with), nor with L1 requests of the panel's own next tiles.
  // No kBlockK: a tile takes all of K at once (accumulate is never set).
  template <int R>
  static void tile(const c10::BFloat16* x, int64_t ldx, const c10::BFloat16* panel, int64_t K, float* t,
                   NextPanel<c10::BFloat16> /*next*/, bool /*accumulate*/) {
    const auto* b = reinterpret_cast<const uint16_t*>(panel);
    if constexpr (R <= 16) one_block(reinterpret_cast<const uint16_t*>(x), ldx, b, K, t, R);
    else two_blocks(reinterpret_cast<const uint16_t*>(x), ldx, b, K, t, R);
  }

 private:
  static constexpr int64_t kStride = kWidth * sizeof(float);  // t's rows, in bytes
  static constexpr int64_t kChunk = kAmxPairs * 2 * kPanelBf16;  // a chunk of 16 pairs in a panel
  RPG_AMX_TARGET static void one_block(const uint16_t* x, int64_t ldx, const uint16_t* panel, int64_t K, float* t,
                                       int rows) {
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t c = 0, chunks = (K + 31) / 32; c < chunks; ++c) {
      const uint16_t* b = panel + c * kChunk;
      _tile_loadd(4, x + c * 32, ldx * 2);
      _tile_loadd(6, b, 2 * kWidth * 2);
      _tile_loadd(7, b + kWidth, 2 * kWidth * 2);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
    }
    alignas(64) float all[16 * kWidth];
    float* out = rows == 16 ? t : all;
    _tile_stored(0, out, kStride);
    _tile_stored(1, out + 16, kStride);
    if (out != t) std::memcpy(t, all, sizeof(float) * static_cast<size_t>(rows) * kWidth);
  }
  RPG_AMX_TARGET static void two_blocks(const uint16_t* x, int64_t ldx, const uint16_t* panel, int64_t K, float* t,
                                        int rows) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint16_t* x1 = x + 16 * ldx;
    for (int64_t c = 0, chunks = (K + 31) / 32; c < chunks; ++c) {
      const uint16_t* b = panel + c * kChunk;
      _tile_loadd(6, b, 2 * kWidth * 2);
      _tile_loadd(7, b + kWidth, 2 * kWidth * 2);
      _tile_loadd(4, x + c * 32, ldx * 2);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_loadd(5, x1 + c * 32, ldx * 2);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, t, kStride);
    _tile_stored(1, t + 16, kStride);
    alignas(64) float all[16 * kWidth];
    float* out = rows == 32 ? t + 16 * kWidth : all;
    _tile_stored(2, out, kStride);
    _tile_stored(3, out + 16, kStride);
    if (out == all) std::memcpy(t + 16 * kWidth, all, sizeof(float) * static_cast<size_t>(rows - 16) * kWidth);
  }
};

// x [m, k] as the AMX tiles read it: whole 16-row blocks, rows of whole 32-value chunks of K.
// Rows that fall short are copied into a zero-padded tensor (m x k bf16: small beside the weights).
at::Tensor amx_rows(const at::Tensor& x2) {
  const int64_t m = x2.size(0), k = x2.size(1);
  if (m % 16 == 0 && k % 32 == 0) return x2;
  at::Tensor padded = at::zeros({(m + 15) / 16 * 16, (k + 31) / 32 * 32}, x2.options());
  padded.narrow(0, 0, m).narrow(1, 0, k).copy_(x2);
  return padded;
}

// Where values [k0, ...) of K start in tile p's panel. A panel is kWidth columns x K (fp32), x K
// rounded up to pairs (bf16), or to whole 16-pair tiles (AMX); in it, k0 rows of kWidth fp32
// values, or k0 / 2 pairs of kWidth x 2 bf16 (k0 even), come first.
template <class Tiles, class T>
const T* panel_at(const T* panels, int64_t p, int64_t k, int64_t k0 = 0) {
  if constexpr (std::is_same_v<T, float>) return panels + (p * k + k0) * Tiles::kWidth;
  else return panels + (p * panel_pairs(k, Tiles::kPairMultiple) * 2 + k0) * Tiles::kWidth;
}

// What the tile at rows [r, r + Tiles::kRows) of panel p (of an m-row product) requests into L2
// while it multiplies values [k0, ...) of K: its turn of the next panel's rows (none after the
// last panel), counted from k0 as the kernel's loop counts them (values; pairs for bf16).
// Called per tile and K block (~1000 cycles of FMAs at 64 rows): at most one division here,
// where two were part of the 5 % the driver took (docs/benchmarks.md, 2026-12-07 fifth session).
template <class Tiles, class T>
NextPanel<T> next_panel(const T* panels, int64_t p, int64_t r, int64_t m, int64_t n, int64_t k, int64_t k0) {
  if ((p + 1) * Tiles::kWidth >= n) return {};
  const int64_t step = (m + Tiles::kRows - 1) / Tiles::kRows, skipped = std::is_same_v<T, float> ? k0 : k0 / 2;
  int64_t first = r / Tiles::kRows;  // in [0, step)
  if (step > 1 && skipped > 0) first -= skipped % step;
  if (first < 0) first += step;
  return {panel_at<Tiles>(panels, p + 1, k, k0), static_cast<int32_t>(first), static_cast<int32_t>(step)};
}

// The row tiles of a panel that for_each_tile takes together: 64 rows' worth (1 without a kBlockK).
template <class Tiles>
constexpr int64_t tile_group() {
  if constexpr (requires { Tiles::kBlockK; }) return 64 / Tiles::kRows;
  else return 1;
}
// The bf16 tiles ignore `accumulate`: given K blocks, they would restart each block's sums.
static_assert(tile_group<Bf16Tiles>() == 1 && tile_group<AmxTiles>() == 1, "bf16 tiles take all of K at once");

// Every tile of a product y [m, n] = x [m, k] W^T over `panels` panels of Tiles::kWidth columns,
// the threads splitting the panels. multiply(p, r, rows, k0, k1, acc) multiplies rows [r, r + rows)
// of panel p (rows: an integral_constant, at most Tiles::kRows) over values [k0, k1) of K into
// the tile's sums `acc` (kAcc floats, 64-byte aligned), continuing them where k0 > 0;
// finish(p, r, rows, acc) stores them once all of K is in.
//
// A panel read by one row tile streams through L1 once. Read by several (m > kRows), each tile
// read it from L2, and the fp32 kernels ran at 79 % of MKL's rate (2048 rows: 293 against 368
// GFLOP/s). Where Tiles has a kBlockK, the row tiles are taken in groups of tile_group() (64
// rows), and
// - a product of up to 64 rows takes K in blocks of kBlockK values, each block multiplied by
//   every tile in turn while it stays in L1, the tiles' sums kept in `acc` between blocks;
// - more rows: each group's tiles are all multiplied, then all stored (in blocks they ran slower).
// Measured on the Xeon VM (SmolLM2's 211 products, AVX-512, four interleaved rounds; docs/
// benchmarks.md, 2026-12-07 fourth session): 64 rows 275 -> 298 GFLOP/s, 512 rows 314 -> 331.
// A sum stored and loaded again is the same float: each output is still one chain over K in
// order, with the bits it has without blocks.
// Tiles with begin() / end() (AMX's tile configuration) have them called around each thread's share.
template <class Tiles, int64_t kAcc, typename Multiply, typename Finish>
void for_each_tile(int64_t m, int64_t panels, int64_t k, const Multiply& multiply, const Finish& finish) {
  constexpr int64_t kGroup = tile_group<Tiles>();
  const int64_t tiles = (m + Tiles::kRows - 1) / Tiles::kRows;
  int64_t block = k;
  if constexpr (kGroup > 1)
    if (tiles > 1 && tiles <= kGroup) block = Tiles::kBlockK;
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    alignas(64) float acc[kGroup * kAcc];
    auto each_tile = [&](int64_t g0, int64_t g1, const auto& f) {
      for (int64_t i = g0; i < g1; ++i) {
        const int64_t r = i * Tiles::kRows;
        with_count<Tiles::kRows>(std::min<int64_t>(Tiles::kRows, m - r),
                                 [&](auto rows) { f(r, rows, acc + (i - g0) * kAcc); });
      }
    };
    if constexpr (requires { Tiles::begin(); }) Tiles::begin();
    for (int64_t p = p0; p < p1; ++p) {
      if (tiles == 1) {  // m <= kRows: the tile multiplied and stored in one call
        each_tile(0, 1, [&](int64_t r, auto rows, float* sums) {
          multiply(p, r, rows, 0, k, sums);
          finish(p, r, rows, sums);
        });
        continue;
      }
      for (int64_t g0 = 0; g0 < tiles; g0 += kGroup) {
        const int64_t g1 = std::min(tiles, g0 + kGroup);
        for (int64_t k0 = 0;;) {  // once where k = 0: the sums start at zero
          const int64_t k1 = std::min(k, k0 + block);
          each_tile(g0, g1, [&](int64_t r, auto rows, float* sums) { multiply(p, r, rows, k0, k1, sums); });
          if (k1 >= k) break;
          k0 = k1;
        }
        each_tile(g0, g1, [&](int64_t r, auto rows, float* sums) { finish(p, r, rows, sums); });
      }
    }
    if constexpr (requires { Tiles::end(); }) Tiles::end();
  });
}

template <class Tiles>
constexpr int64_t panel_count(int64_t n) {
  return (n + Tiles::kWidth - 1) / Tiles::kWidth;
}

// One product of x [m, k]: y [m, n] = x W^T (+ bias [n]) (+ residual [m, n]), W in panels.
template <class T>
struct PanelProduct {
  const T* panels;
  int64_t n;
  const T* bias;      // or null
  const T* residual;  // or null
  T* y;
};

// Each product's y = x W^T (+ bias) (+ residual), the additions made as each tile is stored:
// ((x W^T) + b) + residual, in the order at::linear's result + residual rounds them (T: float,
// or bf16 with x W^T + b rounded to bf16 once and the residual added as bf16 tensors add).
// Several products of one x (a layer's q, k and v) share one parallel region, the threads
// splitting all their panels. x's rows are ldx apart.
template <class Tiles, class T>
void panels_linear(const T* x, int64_t ldx, int64_t m, int64_t k, const PanelProduct<T>* products, int count) {
  constexpr int64_t W = Tiles::kWidth;
  int64_t panels = 0;
  for (int j = 0; j < count; ++j) panels += panel_count<Tiles>(products[j].n);
  // The product panel p belongs to, p made its panel index there.
  auto product_of = [products](int64_t& p) {
    const PanelProduct<T>* product = products;
    for (; p >= panel_count<Tiles>(product->n); ++product) p -= panel_count<Tiles>(product->n);
    return product;
  };
  auto multiply = [&](int64_t p, int64_t r, auto rows, int64_t k0, int64_t k1, float* t) {
    const PanelProduct<T>* product = product_of(p);
    Tiles::template tile<decltype(rows)::value>(
        x + r * ldx + k0, ldx, panel_at<Tiles>(product->panels, p, k, k0), k1 - k0, t,
        next_panel<Tiles>(product->panels, p, r, m, product->n, k, k0), k0 > 0);
  };
  for_each_tile<Tiles, Tiles::kRows * W>(m, panels, k, multiply, [&](int64_t p, int64_t r, auto rows, const float* t) {
    constexpr int R = decltype(rows)::value;
    const PanelProduct<T>* product = product_of(p);
    const int64_t n = product->n;
    const T *bias = product->bias, *residual = product->residual;
    const int64_t c0 = p * W, cols = std::min(W, n - c0);
    for (int64_t i = 0; i < R; ++i) {
      const float* ti = t + i * W;
      T* yi = product->y + (r + i) * n + c0;
      const T* res = residual ? residual + (r + i) * n + c0 : nullptr;
      if constexpr (std::is_same_v<T, float>) {
        store_row_f32(ti, cols, bias ? bias + c0 : nullptr, res, yi);
      } else {
        auto bits = [](const T* a) { return reinterpret_cast<const uint16_t*>(a); };
        store_row_bf16(ti, cols, bias ? bits(bias + c0) : nullptr, res ? bits(res) : nullptr,
                       reinterpret_cast<uint16_t*>(yi));
      }
    }
  });
}

// y [m, n] = silu(x G^T) * (x U^T): each panel's gate and up tiles multiplied one after the
// other (both panels stay in L2) and combined by swiglu_span while in L1. bf16: the tiles are
// first rounded to bf16 as gate.linear(x) and up.linear(x) store them, then combined by the
// bf16 swiglu_rows' arithmetic (the same bits as those three steps).
template <class Tiles, class T>
void panels_swiglu(const T* x, int64_t ldx, int64_t m, int64_t n, int64_t k, const T* gate, const T* up, T* y) {
  constexpr int64_t W = Tiles::kWidth, kTile = Tiles::kRows * W;
  // A tile's sums: the gate's, then the up's.
  auto multiply = [&](int64_t p, int64_t r, auto rows, int64_t k0, int64_t k1, float* sums) {
    constexpr int R = decltype(rows)::value;
    for (int j = 0; j < 2; ++j) {
      const T* panels = j == 0 ? gate : up;
      Tiles::template tile<R>(x + r * ldx + k0, ldx, panel_at<Tiles>(panels, p, k, k0), k1 - k0, sums + j * kTile,
                              next_panel<Tiles>(panels, p, r, m, n, k, k0), k0 > 0);
    }
  };
  for_each_tile<Tiles, 2 * kTile>(m, panel_count<Tiles>(n), k, multiply, [&](int64_t p, int64_t r, auto rows,
                                                                              const float* sums) {
    constexpr int R = decltype(rows)::value;
    const float *g = sums, *u = sums + kTile;
    const int64_t c0 = p * W, cols = std::min(W, n - c0);
    if constexpr (std::is_same_v<T, float>) {  // into y's rows directly
      for (int64_t i = 0; i < R; ++i) swiglu_span(g + i * W, u + i * W, y + (r + i) * n + c0, cols);
    } else {
      alignas(64) T a[R * W];
      alignas(64) uint16_t gb[R * W], ub[R * W];
      store_row_bf16(g, R * W, nullptr, nullptr, gb);
      store_row_bf16(u, R * W, nullptr, nullptr, ub);
      swiglu_span_bf16(gb, ub, reinterpret_cast<uint16_t*>(a), R * W);
      for (int64_t i = 0; i < R; ++i)
        std::memcpy(y + (r + i) * n + c0, a + i * W, static_cast<size_t>(cols) * sizeof(T));
    }
  });
}

bool is_bf16(PackedBackend backend) {
  return backend == PackedBackend::kPanelsBf16 || backend == PackedBackend::kAmxBf16;
}

// f(Tiles{}, (T*) nullptr) with the tile kernel and element type of a panel backend.
template <typename F>
void with_tiles(PackedBackend backend, const F& f) {
  auto* bf16 = static_cast<c10::BFloat16*>(nullptr);
  auto* fp32 = static_cast<float*>(nullptr);
  if (backend == PackedBackend::kAmxBf16) f(AmxTiles{}, bf16);
  else if (backend == PackedBackend::kPanelsBf16) f(Bf16Tiles{}, bf16);
  else if (backend == PackedBackend::kPanels512) f(Avx512Tiles{}, fp32);
  else f(Avx2Tiles{}, fp32);
}

// A product's result shape: x's, with the last dimension n.
std::vector<int64_t> product_shape(const at::Tensor& x, int64_t n) {
  std::vector<int64_t> out(x.sizes().begin(), x.sizes().end());
  out.back() = n;
  return out;
}

}  // namespace

PackedBackend packed_backend() {
  static const PackedBackend chosen = [] {
    // RPG_PACKED_GEMM=panels512|panels|mkl|none overrides the choice (benchmarks: bench/roofline).
    const char* env = std::getenv("RPG_PACKED_GEMM");
    const std::string want = env ? env : "";
    if (want == "none") return PackedBackend::kNone;
    if (want == "mkl") {
      if (mkl_usable()) return PackedBackend::kMkl;
      log_warn("RPG_PACKED_GEMM=mkl: MKL's packed GEMM is not usable on this CPU; using the default choice");
    } else if (!want.empty() && want != "panels512" && want != "panels") {
      log_warn("RPG_PACKED_GEMM=" + want + ": expected mkl, panels, panels512 or none; ignored");
    }
    if (want != "panels" && cpu_has_avx512f()) return PackedBackend::kPanels512;
    if (cpu_has_avx2_fma()) return PackedBackend::kPanels;
    return mkl_usable() ? PackedBackend::kMkl : PackedBackend::kNone;
  }();
  return chosen;
}

PackedBackend packed_backend_for(at::ScalarType dtype) {
  if (dtype == at::kFloat) return packed_backend();
  if (dtype != at::kBFloat16 || !cpu_has_avx512_bf16()) return PackedBackend::kNone;
  static const PackedBackend chosen = [] {
    const char* env = std::getenv("RPG_PACKED_GEMM");
    const std::string want = env ? env : "";
    if (want == "none") return PackedBackend::kNone;
    // panels / panels512 name rpg's AVX panel kernels: VDPBF16PS without the AMX tiles.
    if (want != "panels" && want != "panels512" && cpu_has_amx_bf16()) return PackedBackend::kAmxBf16;
    return PackedBackend::kPanelsBf16;
  }();
  return chosen;
}

const char* packed_backend_name(PackedBackend backend) {
  switch (backend) {
    case PackedBackend::kAmxBf16: return "rpg panels (AMX-BF16)";
    case PackedBackend::kPanelsBf16: return "rpg panels (AVX512_BF16)";
    case PackedBackend::kPanels512: return "rpg panels (AVX-512)";
    case PackedBackend::kPanels: return "rpg panels (AVX2/FMA)";
    case PackedBackend::kMkl: return "MKL packed GEMM";
    case PackedBackend::kNone: break;
  }
  return "none";
}

bool packed_backend_usable(PackedBackend backend) {
  switch (backend) {
    case PackedBackend::kAmxBf16: return cpu_has_amx_bf16();
    case PackedBackend::kPanelsBf16: return cpu_has_avx512_bf16();
    case PackedBackend::kPanels512: return cpu_has_avx512f();
    case PackedBackend::kPanels: return cpu_has_avx2_fma();
    case PackedBackend::kMkl: return mkl_usable();
    case PackedBackend::kNone: break;
  }
  return false;
}

bool packed_gemm_available() { return packed_backend() != PackedBackend::kNone; }

PackedWeight PackedWeight::pack(const at::Tensor& weight, PackedBackend backend) {
  PackedWeight p;
  const at::ScalarType dtype = is_bf16(backend) ? at::kBFloat16 : at::kFloat;
  if (weight.dim() != 2 || weight.scalar_type() != dtype || !weight.device().is_cpu() ||
      !weight.is_contiguous() || weight.size(0) > INT_MAX || weight.size(1) > INT_MAX || weight.numel() == 0 ||
      !packed_backend_usable(backend))
    return p;
  p.n_ = weight.size(0);
  p.k_ = weight.size(1);
  p.buffer_ = is_bf16(backend)
                  ? panel_pack_bf16(reinterpret_cast<const uint16_t*>(weight.data_ptr<c10::BFloat16>()), p.n_, p.k_,
                                    backend == PackedBackend::kAmxBf16 ? AmxTiles::kPairMultiple
                                                                       : Bf16Tiles::kPairMultiple)
              : backend == PackedBackend::kPanels512 ? panel_pack(weight.data_ptr<float>(), p.n_, p.k_, kPanel512)
              : backend == PackedBackend::kPanels  ? panel_pack(weight.data_ptr<float>(), p.n_, p.k_, kPanel)
                  : mkl_pack(weight.data_ptr<float>(), static_cast<int>(p.n_), static_cast<int>(p.k_));
  if (!p.buffer_.defined()) return {};  // out of memory: this weight stays unpacked
  p.backend_ = backend;
  p.source_ = weight;
  p.version_ = weight._version();
  return p;
}

at::Tensor PackedWeight::linear(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual) const {
  const at::ScalarType dtype = source_.scalar_type();
  TORCH_CHECK(current() && x.size(-1) == k_ && x.scalar_type() == dtype && x.device().is_cpu() &&
                  (!bias.defined() || (bias.numel() == n_ && bias.scalar_type() == dtype)),
              "PackedWeight::linear: CPU x [..., ", k_, "] and bias [", n_, "] in the weight's dtype ", dtype,
              " for a current packing");
  RECORD_FUNCTION("rpg::packed_linear", std::vector<c10::IValue>());  // a row of bench/roofline's --ops
  const at::Tensor x2 = x.reshape({-1, k_}).contiguous();
  const int64_t m = x2.size(0);
  const std::vector<int64_t> out = product_shape(x, n_);
  TORCH_CHECK(!residual.defined() || (residual.sizes() == at::IntArrayRef(out) && residual.scalar_type() == dtype &&
                                      residual.device().is_cpu()),
              "PackedWeight::linear: residual ", residual.defined() ? residual.sizes() : at::IntArrayRef{},
              " must be ", dtype, " ", at::IntArrayRef(out), " on the CPU");
  at::Tensor y = new_cpu_tensor({m, n_}, x.scalar_type());
  if (m > 0 && backend_ != PackedBackend::kMkl) {
    multiply_panels({this}, x2, {bias}, {residual}, {y});
    return y.view(out);
  }
  // MKL: the bias and the residual are added after. Its packed product of one row ignores a C
  // to add to (beta = 1 with the bias in C gave x W^T alone).
  if (m > 0)
    mkl_compute(x2.data_ptr<float>(), static_cast<int>(m), static_cast<int>(n_), static_cast<int>(k_),
                buffer_.data_ptr<float>(), y.data_ptr<float>());
  if (bias.defined()) y.add_(bias.reshape({n_}));
  y = y.view(out);
  return residual.defined() ? residual + y : y;
}

void PackedWeight::multiply_panels(c10::ArrayRef<const PackedWeight*> weights, const at::Tensor& x2,
                                   at::TensorList biases, at::TensorList residuals, at::TensorList ys) {
  const int64_t m = x2.size(0);
  // Small vectors: a decode step makes ~10 products per layer, one weight each.
  c10::SmallVector<at::Tensor, 4> bs, rs;
  for (size_t j = 0; j < weights.size(); ++j) {
    const int64_t n = weights[j]->n_;
    bs.push_back(biases[j].defined() ? biases[j].reshape({n}).contiguous() : at::Tensor());
    rs.push_back(residuals[j].defined() ? residuals[j].reshape({m, n}).contiguous() : at::Tensor());
  }
  const PackedBackend backend = weights[0]->backend_;
  const at::Tensor xs = backend == PackedBackend::kAmxBf16 ? amx_rows(x2) : x2;
  with_tiles(backend, [&](auto tiles, auto* elem) {
    using T = std::remove_pointer_t<decltype(elem)>;
    auto ptr = [](const at::Tensor& t) { return t.defined() ? t.data_ptr<T>() : nullptr; };
    c10::SmallVector<PanelProduct<T>, 4> products;
    for (size_t j = 0; j < weights.size(); ++j)
      products.push_back({reinterpret_cast<const T*>(weights[j]->buffer_.data_ptr()), weights[j]->n_, ptr(bs[j]),
                          ptr(rs[j]), ys[j].data_ptr<T>()});
    panels_linear<decltype(tiles), T>(xs.data_ptr<T>(), xs.size(1), m, weights[0]->k_, products.data(),
                                      static_cast<int>(products.size()));
  });
}

std::vector<at::Tensor> linear_together(const std::vector<const PackedWeight*>& weights, const at::Tensor& x,
                                        const std::vector<at::Tensor>& biases) {
  if (weights.empty() || biases.size() != weights.size() || !x.device().is_cpu()) return {};
  const PackedWeight& first = *weights[0];
  for (size_t j = 0; j < weights.size(); ++j) {
    const PackedWeight& w = *weights[j];
    const at::Tensor& b = biases[j];
    if (!w.current() || w.backend() != first.backend() || w.backend() == PackedBackend::kMkl || w.k_ != first.k_ ||
        (b.defined() && (b.numel() != w.n_ || b.scalar_type() != w.source_.scalar_type())))
      return {};
  }
  if (x.size(-1) != first.k_ || x.scalar_type() != first.source_.scalar_type()) return {};
  RECORD_FUNCTION("rpg::packed_linear_together", std::vector<c10::IValue>());  // a row of bench/roofline's --ops
  const at::Tensor x2 = x.reshape({-1, first.k_}).contiguous();
  const int64_t m = x2.size(0);
  std::vector<at::Tensor> ys;
  for (const PackedWeight* w : weights) ys.push_back(new_cpu_tensor({m, w->n_}, x.scalar_type()));
  if (m > 0) PackedWeight::multiply_panels(weights, x2, biases, std::vector<at::Tensor>(weights.size()), ys);
  for (size_t j = 0; j < weights.size(); ++j) ys[j] = ys[j].view(product_shape(x, weights[j]->n_));
  return ys;
}

at::Tensor swiglu_linear(const PackedWeight& gate, const PackedWeight& up, const at::Tensor& x) {
  if (!gate.current() || !up.current() || gate.backend() != up.backend() || gate.n_ != up.n_ || gate.k_ != up.k_ ||
      gate.backend() == PackedBackend::kMkl || x.size(-1) != gate.k_ ||
      x.scalar_type() != gate.source_.scalar_type() || !x.device().is_cpu())
    return {};
  RECORD_FUNCTION("rpg::packed_swiglu", std::vector<c10::IValue>());  // a row of bench/roofline's --ops
  const at::Tensor x2 = x.reshape({-1, gate.k_}).contiguous();
  const int64_t m = x2.size(0), n = gate.n_, k = gate.k_;
  at::Tensor y = new_cpu_tensor({m, n}, x.scalar_type());
  const at::Tensor xs = gate.backend() == PackedBackend::kAmxBf16 ? amx_rows(x2) : x2;
  if (m > 0)
    with_tiles(gate.backend(), [&](auto tiles, auto* elem) {
      using T = std::remove_pointer_t<decltype(elem)>;
      panels_swiglu<decltype(tiles), T>(xs.data_ptr<T>(), xs.size(1), m, n, k,
                                        reinterpret_cast<const T*>(gate.buffer_.data_ptr()),
                                        reinterpret_cast<const T*>(up.buffer_.data_ptr()), y.data_ptr<T>());
    });
  return y.view(product_shape(x, n));
}

void PackedWeights::add(const at::Tensor& weight) {
  if (!weight.defined() || packed_.count(weight.unsafeGetTensorImpl())) return;
  PackedWeight p = PackedWeight::pack(weight);
  if (p.defined()) packed_.emplace(weight.unsafeGetTensorImpl(), std::move(p));
}

const PackedWeight* PackedWeights::find(const at::Tensor& weight) const {
  auto it = packed_.find(weight.unsafeGetTensorImpl());
  return it != packed_.end() && it->second.current() ? &it->second : nullptr;
}

}  // namespace rpg::model::detail
