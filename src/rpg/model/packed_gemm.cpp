#include "rpg/model/packed_gemm.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <sys/mman.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <vector>

#include "rpg/core/log.h"

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
// packing serves every row count (checked once per process by self_check()).
constexpr int kPackRows = 64;

// W [N, K] row-major is B^T: packed as op(B) = W^T. Undefined if the memory is not there.
//
// The buffer comes from malloc, page-aligned. rpg-torch's heap keeps freed memory
// (core/malloc_env.h), so a rollout's packed copy reuses what the previous update left free
// and costs no new memory. Only where the heap had no room -- a run's first rollout -- does
// the buffer extend it; MKL asks for up to 4x the weight and writes about 1x, and such a
// buffer's pages are handed back to the kernel when it is freed: kept, they stayed resident
// while the first update's tensors were placed around them (+120 MB of peak RSS in a 32 M-
// parameter model's first step). Buffers mapped apart from the heap (mmap) could never reuse
// the update's free memory: +0.8 GB of peak RSS over three SmolLM2 steps.
at::Tensor pack_buffer(const float* w, int n, int k) {
  constexpr size_t kPage = 4096;
  const size_t bytes = (cblas_sgemm_pack_get_size(kBMatrix, kPackRows, n, k) + kPage - 1) / kPage * kPage;
  const char* heap_top = static_cast<const char*>(sbrk(0));
  void* mem = nullptr;
  if (posix_memalign(&mem, kPage, bytes) != 0) return {};
  const bool extended_heap = static_cast<const char*>(mem) + bytes > heap_top;
  at::Tensor buf = at::from_blob(
      mem, {static_cast<int64_t>(bytes / sizeof(float))},
      [bytes, extended_heap](void* p) {
        if (extended_heap) madvise(p, bytes, MADV_DONTNEED);
        std::free(p);
      },
      at::kFloat);
  cblas_sgemm_pack(kRowMajor, kBMatrix, kTrans, kPackRows, n, k, 1.0f, w, k, buf.data_ptr<float>());
  return buf;
}

// y = x W^T (beta = 0: see PackedWeight::linear).
void compute(const float* x, int m, int n, int k, const float* packed, float* y) {
  cblas_sgemm_compute(kRowMajor, kNoTrans, kPacked, m, n, k, x, k, packed, n, 0.0f, y, n);
}

// One packing, multiplied by several row counts, against the exact product: entries are
// multiples of 1/8 in [-1, 1], so every partial sum is exact in fp32 and any summation
// order gives the same value.
bool self_check() {
  const int n = 37, k = 29;
  auto grid = [](int64_t count, int64_t salt) {
    at::Tensor t = at::arange(count, at::kLong).mul_(7).add_(salt).remainder_(17).sub_(8).to(at::kFloat).div_(8);
    return t;
  };
  const at::Tensor w = grid(n * k, 3).view({n, k});
  const at::Tensor buf = pack_buffer(w.data_ptr<float>(), n, k);
  if (!buf.defined()) return false;
  for (int m : {1, 2, 5, 64, 300}) {
    const at::Tensor x = grid(m * k, m).view({m, k});
    at::Tensor y = at::empty({m, n}, at::kFloat);
    compute(x.data_ptr<float>(), m, n, k, buf.data_ptr<float>(), y.data_ptr<float>());
    if (!at::equal(y, at::mm(x.to(at::kDouble), w.to(at::kDouble).t()).to(at::kFloat))) return false;
  }
  return true;
}

}  // namespace

bool packed_gemm_available() {
  static const bool ok = [] {
    if (!cblas_sgemm_pack_get_size || !cblas_sgemm_pack || !cblas_sgemm_compute) return false;
    if (self_check()) return true;
    log_warn("MKL's packed GEMM failed its check on this CPU: decode multiplies unpacked weights");
    return false;
  }();
  return ok;
}

PackedWeight PackedWeight::pack(const at::Tensor& weight) {
  PackedWeight p;
  if (weight.dim() != 2 || weight.scalar_type() != at::kFloat || !weight.device().is_cpu() ||
      !weight.is_contiguous() || weight.size(0) > INT_MAX || weight.size(1) > INT_MAX || weight.numel() == 0 ||
      !packed_gemm_available())
    return p;
  p.n_ = weight.size(0);
  p.k_ = weight.size(1);
  p.buffer_ = pack_buffer(weight.data_ptr<float>(), static_cast<int>(p.n_), static_cast<int>(p.k_));
  if (!p.buffer_.defined()) return {};  // out of memory: this weight stays unpacked
  p.source_ = weight;
  p.version_ = weight._version();
  return p;
}

at::Tensor PackedWeight::linear(const at::Tensor& x, const at::Tensor& bias) const {
  TORCH_CHECK(current() && x.size(-1) == k_ && x.scalar_type() == at::kFloat && x.device().is_cpu() &&
                  (!bias.defined() || (bias.numel() == n_ && bias.scalar_type() == at::kFloat)),
              "PackedWeight::linear: float32 CPU x [..., ", k_, "] and bias [", n_, "] for a current packing");
  RECORD_FUNCTION("rpg::packed_linear", std::vector<c10::IValue>());  // a row of bench/roofline's --ops
  const at::Tensor x2 = x.reshape({-1, k_}).contiguous();
  const int64_t m = x2.size(0);
  std::vector<int64_t> out(x.sizes().begin(), x.sizes().end());
  out.back() = n_;
  at::Tensor y = at::empty({m, n_}, x.options());
  // beta = 0 always: MKL's packed product of one row ignores a C to add to (beta = 1 with the
  // bias in C gave x W^T alone), so the bias is added after.
  if (m > 0)
    compute(x2.data_ptr<float>(), static_cast<int>(m), static_cast<int>(n_), static_cast<int>(k_),
            buffer_.data_ptr<float>(), y.data_ptr<float>());
  if (bias.defined()) y.add_(bias.reshape({n_}));
  return y.view(out);
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
