// Internal: weights packed once in a GEMM layout for the decode steps of a rollout.
// Not part of the public API (CausalLM::pack_weights_for_decode() is).
//
// Why: every at::linear call hands MKL the weight as a plain matrix, and MKL copies it into
// its blocked layout before multiplying ("packing"). A decode step multiplies a few rows by
// every weight of the model, so that copy is most of the work: on SmolLM2-135M the packed
// products are 1.3-5x faster for 1-64 rows (docs/benchmarks.md). Packing costs about one
// read and write of the weights, once per rollout.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace rpg::model::detail {

// Who multiplies packed weights. kPanels: rpg's own AVX2/FMA kernel over weights laid out
// in panels of 24 output columns (on SmolLM2's decode products 1.3-3.3x MKL's packed GEMM
// at 1-256 rows: docs/benchmarks.md); every output is one fused multiply-add chain over K in order, so a
// row's result does not depend on how many rows are multiplied with it or on the threads.
// kPanels512: the same kernel with AVX-512 (32-column panels, 8-row tiles). kMkl: MKL's
// cblas_sgemm_pack / cblas_sgemm_compute (exported by the torch wheel's libtorch_cpu), for
// CPUs without AVX2 and FMA. kPanelsBf16: bfloat16 weights and inputs, the AVX-512 panel
// kernel with AVX512_BF16's pairwise dot products (VDPBF16PS: each output an fp32 chain over K
// in pairs, rounded to bf16 once). kAmxBf16: the same bf16 panels multiplied by AMX's tile
// product (TDPBF16PS, up to 32 rows x 32 columns per tile product; the same fp32 chain per
// output) on CPUs with AMX-BF16. kNone: none; callers keep at::linear.
enum class PackedBackend { kNone, kMkl, kPanels, kPanels512, kPanelsBf16, kAmxBf16 };
// This CPU's float32 backend: kPanels512 where it has AVX-512F, else kPanels where it has AVX2
// and FMA, else kMkl where MKL is there and a packed product passed a check against an exact
// result for several row counts (the packing is done once for all of them), else kNone.
// RPG_PACKED_GEMM=panels512|panels|mkl|none overrides the choice.
PackedBackend packed_backend();
// The backend for weights of `dtype`: packed_backend() for float32; for bfloat16 kAmxBf16 where
// the CPU has AMX-BF16 (and Linux lets the process use it), else kPanelsBf16 where it has
// AVX512_BF16, else kNone. RPG_PACKED_GEMM=panels|panels512 keeps bf16 on kPanelsBf16, =none
// turns it off too.
PackedBackend packed_backend_for(at::ScalarType dtype);
const char* packed_backend_name(PackedBackend backend);
// A backend other than kNone.
bool packed_gemm_available();
// Whether `backend` can run here (tests run every one the CPU has).
bool packed_backend_usable(PackedBackend backend);

// One weight [N, K] (fp32, or bf16 for kPanelsBf16 and kAmxBf16; CPU) packed for x W^T (+ b).
class PackedWeight {
 public:
  // Packs `weight` for `backend`, or returns an empty PackedWeight (defined() false) when it
  // is not a CPU contiguous 2-D tensor of the backend's dtype or the backend cannot run here.
  static PackedWeight pack(const at::Tensor& weight, PackedBackend backend);
  static PackedWeight pack(const at::Tensor& weight) { return pack(weight, packed_backend_for(weight.scalar_type())); }
  bool defined() const { return buffer_.defined(); }
  PackedBackend backend() const { return backend_; }
  // True while the source weight has not been modified in place since it was packed.
  bool current() const { return defined() && source_._version() == version_; }
  // x [..., K] on the CPU in the weight's dtype -> [..., N]; bias [N] or undefined; residual
  // [..., N] or undefined: the result is residual + (x W^T + b), rounded as that sum of tensors
  // would be (the panel kernels add it as they store each tile: one pass over the output fewer).
  // bf16: x W^T + b is rounded to bf16 once, from fp32.
  at::Tensor linear(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual = {}) const;

 private:
  // ys[j] [m, N_j] = x2 [m, K] W_j^T (+ biases[j]) (+ residuals[j]; either undefined: none) for
  // current panel packings of one backend and K, m > 0: one parallel region for all of them.
  static void multiply_panels(c10::ArrayRef<const PackedWeight*> weights, const at::Tensor& x2,
                              at::TensorList biases, at::TensorList residuals, at::TensorList ys);
  friend at::Tensor swiglu_linear(const PackedWeight& gate, const PackedWeight& up, const at::Tensor& x);
  friend std::vector<at::Tensor> linear_together(const std::vector<const PackedWeight*>& weights,
                                                 const at::Tensor& x, const std::vector<at::Tensor>& biases);
  at::Tensor source_;  // kept alive: its address keys PackedWeights and cannot be reused
  at::Tensor buffer_;  // the packed copy (MKL's layout depends on its address: never copied)
  PackedBackend backend_ = PackedBackend::kNone;
  int64_t version_ = 0, n_ = 0, k_ = 0;
};

// silu(x G^T) * (x U^T) (the MLP's SwiGLU on its gate and up projections) for x [..., K]: for
// each panel of columns, the gate's and the up's tiles are multiplied and combined at once, one
// pass where the unfused form makes three (two products, then swiglu_rows). The same bits as
// swiglu_rows(gate.linear(x), up.linear(x)) (in bf16 too). Undefined where it does not apply: the
// two are not current panel packings (kPanels, kPanels512, kPanelsBf16, kAmxBf16) of one backend and
// shape, or x is not on the CPU in their dtype.
at::Tensor swiglu_linear(const PackedWeight& gate, const PackedWeight& up, const at::Tensor& x);

// x W_j^T (+ b_j) for several weights of one x [..., K] (a layer's q, k and v projections): the
// products in one parallel region, the threads splitting all their panels, where separate calls
// make one region each (a fork and a join per product; at one row the k and v products are a few
// panels each). Result j has the bits of weights[j]->linear(x, biases[j]). Empty where it does
// not apply: the weights are not all current panel packings of one backend and K, a bias is not
// [N_j] in their dtype, or x is not on the CPU in their dtype with K columns.
std::vector<at::Tensor> linear_together(const std::vector<const PackedWeight*>& weights, const at::Tensor& x,
                                        const std::vector<at::Tensor>& biases);

// The packed weights of one model, by the weight tensor they were made from.
class PackedWeights {
 public:
  void add(const at::Tensor& weight);
  // The packed copy of `weight`, or nullptr if it was not packed or has changed since.
  const PackedWeight* find(const at::Tensor& weight) const;
  size_t size() const { return packed_.size(); }

 private:
  std::unordered_map<const void*, PackedWeight> packed_;
};

// Rows above which a product goes back to at::linear: for many rows the packing is a small
// part of the product (MKL's packed GEMM measured 0.85-0.94x at::linear at 2048 rows,
// 1.0-1.4x at 512).
inline constexpr int64_t kPackedMaxRows = 512;

}  // namespace rpg::model::detail
