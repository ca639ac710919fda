// Internal: attention of one new token per sequence over the KV cache, on the CPU (the
// rollout engine's decode step). Not part of the public API.
#pragma once

#include <ATen/core/Tensor.h>

namespace rpg::model {

// For each row r: softmax(q[r] K^T / sqrt(D)) V over the keys 0..positions[r] of cache slot
// slots[r], each query head h reading KV head h / (H / Hkv) (grouped-query attention as
// repeat_kv). q [R, H, D]; keys kt_cache [S, Hkv, D, capacity] (dimension-major), values
// v_cache [S, Hkv, capacity, D], float32 or bfloat16 like q; slots and positions int64 [R].
// Returns [R, H * D] in q's dtype. Scores, softmax and sums are fp32 (as SDPA's CPU kernels
// accumulate for bf16).
//
// Why not SDPA: its CPU flash kernel pads the H / Hkv query rows of a group to 32-row
// blocks and takes a [rows, 1, rep, L] mask; one pass over K and V per row and KV head, each
// a run of AXPYs along contiguous memory, is several times faster (bench/roofline).
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& kt_cache, const at::Tensor& v_cache,
                            const at::Tensor& slots, const at::Tensor& positions);

// Whether decode_attention() serves a decode step in this dtype on this device.
bool decode_attention_supports(at::ScalarType dtype, c10::Device device);

namespace detail {
// The fp32 kernels: kAuto picks the AVX-512 form (registers blocked over keys and query heads)
// where the CPU has AVX-512F and a KV head serves 4 or more query heads, else the generic one
// (compiled per CPU, target_clones); bf16 caches always take the generic one.
// RPG_DECODE_ATTENTION=generic keeps kAuto generic. Tests run every kernel the CPU has.
enum class AttentionKernel { kAuto, kGeneric, kAvx512 };
bool attention_kernel_available(AttentionKernel kernel);
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& kt_cache, const at::Tensor& v_cache,
                            const at::Tensor& slots, const at::Tensor& positions, AttentionKernel kernel);
}  // namespace detail

}  // namespace rpg::model
