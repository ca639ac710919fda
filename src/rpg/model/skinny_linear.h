// Internal: x W^T + b for the few rows of a decode step on the CPU. Not part of the public API.
#pragma once

#include <ATen/core/Tensor.h>

namespace rpg::model {

// at::linear(x, weight, bias), computed by skinny_linear_kernel() when it is faster: no
// autograd recording, float32 on the CPU, at most kSkinnyRows rows (the product of x's
// leading dimensions); at::linear otherwise.
//
// Why: for one or two rows the product is bound by reading the weights; MKL's GEMV read
// SmolLM2's at ~12 GB/s on the 2-core EPYC where a plain sum streams ~25 GB/s, this kernel
// (8 weight rows per tile, every thread on its own rows, prefetch) at ~15.5 GB/s; from 4
// rows on MKL's GEMM is faster (bench/roofline, docs/benchmarks.md).
at::Tensor linear_for_decode(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

inline constexpr int64_t kSkinnyRows = 2;

// The kernel itself (exposed for tests): x [M, K] float32, weight [N, K], bias [N] or
// undefined, all contiguous on the CPU, any M >= 1 -> [M, N].
at::Tensor skinny_linear_kernel(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace rpg::model
