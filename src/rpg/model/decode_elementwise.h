// Internal: a decode step's RMSNorm, RoPE and SwiGLU as one pass each over fp32 or bf16 CPU
// rows, instead of the 7-9 ATen ops (each with its own dispatch, allocation and pass) of
// layer.cpp's forms. Only decode uses them (DecodingScope): the training forward keeps
// transformers' op-by-op values, bit for bit (fused_elementwise.h makes RMSNorm's and RoPE's
// in fewer passes). Equal to those forms up to fp32 rounding (the
// sum of squares is accumulated in another order; SwiGLU's exp is core/fast_exp.h's). bf16 rows
// are computed in fp32 and rounded to bf16 where the ATen forms round their bf16 tensors (RoPE:
// the same bits as those forms).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace rpg::model::detail {

// A new uninitialised CPU tensor of `sizes` made without the dispatcher: the decode kernels'
// outputs. After a product has streamed its weights through the caches the dispatcher's path to
// at::empty runs cold: 6-8 us a call in a decode step, against ~2.4 for this (rms_norm_rows'
// output at 1 and 8 rows, SmolLM2, Intel Xeon VM); a decode layer makes about 8 such outputs.
at::Tensor new_cpu_tensor(at::IntArrayRef sizes, at::ScalarType dtype);
// True when the fused forms take these inputs: fp32 or bf16, CPU, contiguous, no autograd recording.
bool decode_elementwise_applies(const at::Tensor& x);
// weight * (x * rsqrt(mean(x^2, -1) + eps)) for x [..., C], weight [C].
at::Tensor rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, double eps);
// x * cos + swap_halves(x) * sin (rope_tables' sign-folded sine) for x [B, T, H, D] and
// cos, sin [B, T, 1, D].
at::Tensor rope_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
// rope_rows's arithmetic on `positions` positions of H heads each, x and y [positions, H, D],
// cos and sin [positions, D]; the bf16 form on bf16 bits (decode_attention's fresh tokens).
void rope_span(const float* x, const float* cos, const float* sin, float* y, int64_t positions, int64_t H, int64_t D);
void rope_span_bf16(const uint16_t* x, const uint16_t* cos, const uint16_t* sin, uint16_t* y, int64_t positions,
                    int64_t H, int64_t D);
// silu(gate) * up, elementwise (the MLP's SwiGLU), one pass instead of silu's and mul's.
at::Tensor swiglu_rows(const at::Tensor& gate, const at::Tensor& up);
// y[0, n) = silu(g) * u: swiglu_rows's arithmetic on one run (the fused products use it); the
// bf16 form on bf16 bits.
void swiglu_span(const float* g, const float* u, float* y, int64_t n);
void swiglu_span_bf16(const uint16_t* g, const uint16_t* u, uint16_t* y, int64_t n);

// The scoring pass's entropy term (log_probs.cpp): sum_k softmax(z)_k * z_k of each row, as
// sum_k exp(z_k - lse) * z_k in one pass over z (lse: the row's logsumexp) instead of softmax's
// [n, V] temporary and a row-wise dot. fp32 CPU rows; exp is core/fast_exp.h's.
at::Tensor expected_logit_rows(const at::Tensor& z, const at::Tensor& lse);
// sum_k a_k * b_k of each fp32 CPU row [n, V] (the entropy gradient's sum_k p_k log p_k), in 16 lanes.
at::Tensor dot_rows(const at::Tensor& a, const at::Tensor& b);

}  // namespace rpg::model::detail
