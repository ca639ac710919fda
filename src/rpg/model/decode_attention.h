// Internal: attention of one new token per sequence over the KV cache, on the CPU (the
// rollout engine's decode step). Not part of the public API.
#pragma once

#include <ATen/core/Tensor.h>

namespace rpg::model {

// The keys' layout for decode_attention(): blocks of kKeyBlock positions, dimension-major
// inside each block. kt_cache [S, Hkv, ceil(capacity / kKeyBlock), D, kKeyBlock]: dimension d
// of the key at position j is at [s, g, j / kKeyBlock, d, j % kKeyBlock].
// Why blocks: a block of keys is one contiguous 8 KB run (D = 64, fp32) that the scores kernel
// reads front to back; fully dimension-major keys put each of a block's D rows on its own page,
// D streams too many for the hardware prefetcher (long sequences read their keys at about half
// the rate of their values that way).
constexpr int64_t kKeyBlock = 32;
inline int64_t key_blocks(int64_t positions) { return (positions + kKeyBlock - 1) / kKeyBlock; }
// Position-major keys [S, Hkv, capacity, D] in the blocked layout (a copy; a last partial block
// is padded with zeros).
at::Tensor block_keys(const at::Tensor& k);
// Positions [0, n) of blocked keys as position-major [S, Hkv, n, D] (a copy).
at::Tensor unblock_keys(const at::Tensor& kt, int64_t n);
// Where positions [N, T] (int64) lie in blocked keys: their block and their lane in it.
struct KeyPlaces {
  at::Tensor block, lane;
};
KeyPlaces key_places(const at::Tensor& positions);
// kt[slot_index, :, positions] = k, as index_put_ on position-major keys: slot_index [N, 1],
// at = key_places(positions [N, T]), k [N, T, Hkv, D].
void put_blocked_keys(at::Tensor& kt, const at::Tensor& slot_index, const KeyPlaces& at, const at::Tensor& k);

// For each row r: softmax(q[r] K^T / sqrt(D)) V over the keys 0..positions[r] of cache slot
// slots[r], each query head h reading KV head h / (H / Hkv) (grouped-query attention as
// repeat_kv). q [R, H, D]; keys kt_cache blocked as above, values v_cache [S, Hkv, capacity, D],
// float32 or bfloat16 like q; slots and positions int64 [R]. Returns [R, H * D] in q's dtype.
// Scores, softmax and sums are fp32 (as SDPA's CPU kernels accumulate for bf16).
//
// Why not SDPA: its CPU flash kernel pads the H / Hkv query rows of a group to 32-row
// blocks and takes a [rows, 1, rep, L] mask; one pass over K and V per row and KV head, each
// a run of AXPYs along contiguous memory, is several times faster (bench/roofline).
//
// prefix (optional, int64 [R] each): row r's keys 0..lengths[r]-1 are read from slot
// slots[r] instead of its own, which must hold the same values there (the engine copies a
// prompt's cache into the slots of its n samples). The result is the same bit for bit; rows
// reading one prefix slot are taken one after another, so the prompt's keys and values come
// from memory once per step instead of once per sample.
struct SharedPrefix {
  at::Tensor slots, lengths;
};
// fresh (optional): the step's own token per row, not yet rotated nor in the caches. q is then
// the rows' queries before RoPE; each row's queries and key are rotated (x * cos + swap_halves(x)
// * sin with rope_tables' sign-folded sine, rope_rows' arithmetic: the same bits), and its key
// and value written to position positions[r] of slot slots[r], inside the pass that attends:
// the same results and caches as rope_rows on q and k, then the writes, then the attention,
// without their separate ops (per layer two allocations, three passes and the write's parallel
// region).
// k and v: R x Hkv x D elements, contiguous; cos and sin: R x D (rope_tables' [R, 1, 1, D]),
// contiguous; all in q's dtype.
struct NewTokens {
  at::Tensor k, v, cos, sin;
};
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& kt_cache, const at::Tensor& v_cache,
                            const at::Tensor& slots, const at::Tensor& positions, const SharedPrefix& prefix = {},
                            const NewTokens& fresh = {});
// Whether decode_attention() serves a decode step in this dtype on this device (CPU fp32 and
// bf16, unless RPG_DECODE_ATTENTION=sdpa asks for the device-generic path a GPU takes).
bool decode_attention_supports(at::ScalarType dtype, c10::Device device);

namespace detail {
// The kernels: kAuto picks the AVX-512 form (registers blocked over keys and query heads) where
// the CPU has AVX-512 F, BW and VL and a KV head serves 3 or more query heads, else the generic
// one (compiled per CPU: core/cpu_clones.h). Both read fp32 and bf16 caches (bf16 widened to
// fp32 exactly). On such a CPU the two give the same bits (the same FMA chains): the choice is
// speed only.
// RPG_DECODE_ATTENTION=generic keeps kAuto generic. Tests run every kernel the CPU has.
enum class AttentionKernel { kAuto, kGeneric, kAvx512 };
bool attention_kernel_available(AttentionKernel kernel);
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& kt_cache, const at::Tensor& v_cache,
                            const at::Tensor& slots, const at::Tensor& positions, const SharedPrefix& prefix,
                            AttentionKernel kernel, const NewTokens& fresh = {});
}  // namespace detail

}  // namespace rpg::model
