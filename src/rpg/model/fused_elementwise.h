// Internal: RMSNorm and RoPE for every forward that is not a decode step (the update's forward
// and backward, old / ref scoring), on contiguous fp32 or bf16 CPU tensors. Their values and
// gradients are bit for bit those of layer.cpp's ATen forms (transformers' op-by-op arithmetic)
// and of ATen autograd's chain through them, made in fewer passes: under autograd each is one
// node, where ATen's chain records 5-10 (MulBackward, ToCopyBackward, PowBackward, ...), each a
// pass over the activations with its own temporary. Bit for bit because the fork-step test
// holds rpg's gradients to transformers' (fp32 and bf16) within a few ulps, and Adam turns a
// 1e-7 difference in a near-zero gradient into a 1e-3 one in the step (seen with a fused
// RMSNorm backward that summed in its own order). So every rounding of the chain is made here
// where the chain makes it, and its sums are ATen's own reductions over the same tensors.
// SwiGLU keeps ATen's silu, mul and their backward: a fused backward built by GCC 12 from
// these loops (exp and a division per element) ran at half the rate of ATen's three passes.
#pragma once

#include <ATen/core/Tensor.h>

namespace rpg::model::detail {

// True when the fused forms take x: fp32 or bf16, CPU, contiguous.
bool fused_elementwise_applies(const at::Tensor& x);
// weight * (x.float() * rsqrt(mean(x.float()^2, -1) + eps)).to(x.dtype) for x [..., C] and
// weight [C] of x's dtype; rms_norm_fused_applies says whether it takes them.
bool rms_norm_fused_applies(const at::Tensor& x, const at::Tensor& weight);
at::Tensor rms_norm_fused(const at::Tensor& x, const at::Tensor& weight, double eps);
// x * cos + swap_halves(x) * sin (rope_tables' sign-folded sine) for x [B, T, H, D] and
// contiguous cos, sin [B, T, 1, D] of x's dtype; rope_fused_applies says whether it takes them.
bool rope_fused_applies(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor rope_fused(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace rpg::model::detail
