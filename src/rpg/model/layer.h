// Internal to src/rpg/model: the decoder layer's arithmetic (layer.cpp) and the forwards built
// on it that need autograd of their own (checkpointing.cpp), shared by the forward modes in
// causal_lm.cpp, log_probs.cpp and decode.cpp. Not part of the public API.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rpg/model/decode_attention.h"
#include "rpg/model/impl.h"

namespace rpg::model::detail {

// ---- parameters --------------------------------------------------------------------------
// A layer's weights in ModelConfig::parameter_shapes() order.
std::vector<at::Tensor*> layer_slots(LayerWeights& w, const ModelConfig& c);
// A layer's LoRA adapters in lora_module_names() order, each with the weight it adapts.
struct LoraSlot {
  const char* module;  // PEFT's module path inside a layer
  at::Tensor* weight;
  LoraPair* lora;
};
std::vector<LoraSlot> lora_slots(LayerWeights& w);
// What a checkpointed layer saves and differentiates: its weights, then its adapters.
std::vector<at::Tensor*> compute_slots(LayerWeights& w, const ModelConfig& c);

// ---- one layer -----------------------------------------------------------------------------
class PackedWeights;

// Set for its lifetime on this thread: projections go through decode_linear() instead of
// at::linear. Only decode() / decode_all_slots() set it: every other forward keeps
// at::linear's arithmetic (the trainer's log-probs are compared bit for bit with the fork's).
class DecodingScope {
 public:
  // packs: the model's weights packed for this rollout (CausalLM::pack_weights_for_decode), or null.
  explicit DecodingScope(const PackedWeights* packs);
  ~DecodingScope();
  DecodingScope(const DecodingScope&) = delete;
  DecodingScope& operator=(const DecodingScope&) = delete;
};

// For its lifetime, in the whole process: grouped-query attention without a mask repeats K/V
// heads to the query heads on every device, the form CUDA takes where no fused kernel shares
// K/V heads (fp32). Lets the CPU tests check that form against enable_gqa's.
class RepeatKvHeadsScope {
 public:
  RepeatKvHeadsScope();
  ~RepeatKvHeadsScope();
  RepeatKvHeadsScope(const RepeatKvHeadsScope&) = delete;
  RepeatKvHeadsScope& operator=(const RepeatKvHeadsScope&) = delete;
};

// Where a layer's keys/values come from: the current tokens only (training forward) or a
// KV cache the new tokens are appended to first (decode).
struct CacheStep {
  at::Tensor* k = nullptr;  // [S, Hkv, capacity, D], or blocked when keys_blocked (decode_attention.h)
  at::Tensor* v = nullptr;  // [S, Hkv, capacity, D]
  bool keys_blocked = false;
  at::Tensor slot_index;    // [N, 1] int64 on device
  at::Tensor write_pos;     // [N, T] int64 on device
  KeyPlaces write_places;   // write_pos in blocked keys (keys_blocked, more than one token per row)
  int64_t kv_len = 0;       // keys to attend: max over rows of (length + T)
  // How attention reads the cache for the N rows:
  //   kAll:    the rows are slots 0..S-1 in order; the cache is used as is.
  //   kDense:  most slots are active (2N > S): the N queries are scattered into S rows and
  //            attention runs over the whole cache (idle rows see one key and are dropped),
  //            cheaper than copying N rows of K/V out of it.
  //   kGather: few slots active: their K/V rows are gathered.
  enum class Read { kAll, kDense, kGather } read = Read::kGather;
  // One token per row on the CPU: decode_attention() rotates the rows' queries and keys, writes
  // their keys and values and reads each row's slot in place (no gather, no dense scatter).
  // Host int64 [N]: each row's slot and query position.
  at::Tensor kernel_slots, kernel_positions;
  // Rows sharing a prompt with others (decode_attention.h, SharedPrefix), or undefined.
  at::Tensor kernel_prefix_slots, kernel_prefix_lengths;
  // Every row starts at position 0 (prompts into empty slots): the new tokens are all the
  // keys there are, so the cache is only written and attention runs causally over the new
  // keys (AttnInputs::is_causal), with no mask and no read of the cache.
  bool new_keys_only = false;
};

// What every layer shares for one forward call.
struct AttnInputs {
  at::Tensor cos, sin;   // [B, T, 1, D]
  at::Tensor mask;       // make_mask(): [B, 1, (rep*)T, S] bool (true = attend), or undefined = causal
  bool is_causal = false;
  // Packed stream (B = 1): the lengths of the sequences laid end to end along T; each
  // attends causally within itself only. Empty = not packed.
  std::vector<int64_t> seq_lens;
  // Padded rows without a mask: each row's first real key (keys before it are left padding).
  // Query t of T sits at key position S - T + t (its row's last T positions) and attends to
  // the real keys up to its own position; keys after a row's real tokens (right padding) are
  // only ever seen by padding queries. A query before its row's first real key gets 0.
  // attend() runs this as one causal SDPA, which skips the masked-out half of the work a
  // mask cannot tell SDPA about. Empty = unused.
  std::vector<int64_t> key_start;
  // The name an unmasked causal call is reported under (sdpa_backends_seen()).
  const char* causal_kind = "causal";
};

// Each row's first real token, when the 0/1 rows of `mask` [B, T] are runs of ones between
// left and right padding (what the trainer's batches are); nullopt if a row has a hole or
// no token at all.
std::optional<std::vector<int64_t>> contiguous_key_starts(const at::Tensor& mask);
// Whether attention of T queries over S keys (the queries on the last T key positions; rows'
// first real keys at least min_key_start) is faster as attend()'s key_start form than as a
// mask. The causal form computes (S - min_key_start)^2 / 2 scores per head, the mask form T x S
// without SDPA's causal skipping: measured on CPU SDPA (docs/benchmarks.md), the causal form
// wins from T = 1024 queries with at most T / 4 keys before them, and always when T = S.
bool key_start_form_pays(int64_t queries, int64_t keys, int64_t min_key_start);

// Queries (unless !with_q), keys and values of one layer for the normed input x [B, T, C]:
// [B, T, H or Hkv, D], q/k normed (qwen3) and rotated.
struct Qkv {
  at::Tensor q, k, v;
};

// x W^T + b inside a DecodingScope: the packed weight when the scope has a current one and
// x has at most kPackedMaxRows rows, else linear_for_decode (the skinny kernel or at::linear).
at::Tensor decode_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);
// A projection: x W^T + b, plus LoRA's (x A^T) B^T * scale in PEFT's order of operations.
at::Tensor project(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const LoraPair& lora,
                   double scale);
// residual + project(x, weight, {}, lora, scale) (a layer's o_proj and down_proj with the
// residual stream): inside a DecodingScope the packed product adds the residual as it stores
// its tiles, with the same bits as the sum of tensors.
at::Tensor project_add(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, const LoraPair& lora,
                       double scale);
// transformers' RMSNorm: normalise in fp32, cast back, then scale in the weight's dtype.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
// RoPE tables for positions [B, T] -> cos, sin [B, T, 1, D] in `dtype`.
std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& inv_freq, const at::Tensor& positions,
                                              at::ScalarType dtype);
// q, k and v of x [B, T, C] as [B, T, heads, D], q and k rotated (rope = false: not; decode's
// kernel rotates them as it attends).
Qkv project_qkv(const LayerWeights& w, const ModelConfig& c, const at::Tensor& x, const at::Tensor& cos,
                const at::Tensor& sin, bool with_q = true, bool rope = true);
// softmax(q k^T / sqrt(D) + mask) v for q [B, T, H, D], k and v [B, S, Hkv, D] -> [B, T, H*D].
at::Tensor attend(const ModelConfig& c, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const AttnInputs& a);
// The attention mask as attend() consumes it: [B, 1, T, S] bool, or for grouped-query
// models [B, 1, rep*T, S].
at::Tensor make_mask(const at::Tensor& mask, const ModelConfig& c);
// The MLP half of a layer on the attention block's output h: h + down(silu(gate(n)) * up(n)).
at::Tensor mlp_block(const LayerWeights& w, const ModelConfig& c, const at::Tensor& h);
// One decoder layer over x [B, T, C]; with `cache`, keys/values are appended to it first.
at::Tensor layer_forward(const LayerWeights& w, const ModelConfig& c, const at::Tensor& x, const AttnInputs& a,
                         const CacheStep* cache);
// The SDPA kernel each kind of attention call got so far (sdpa_backends()).
std::map<std::string, std::string> sdpa_backends_seen();

// ---- batches -------------------------------------------------------------------------------
// Positions from the attention mask (cumsum - 1, clamped at 0), or 0..T-1 without one.
at::Tensor default_positions(const at::Tensor& input_ids, const at::Tensor& attention_mask);
// Token ids must be [B, T] integers; out-of-vocabulary ids are caught by at::embedding.
void check_ids(const at::Tensor& ids, const char* what);
// A padded batch: [B, T] ids with an optional mask and positions of the same shape.
void check_batch(const at::Tensor& input_ids, const at::Tensor& attention_mask, const at::Tensor& position_ids);

// ---- the layer stack (checkpointing.cpp) ----------------------------------------------------
// The decoder layers (checkpointed when enabled and autograd is recording) and the final
// norm over embeddings x [B, T, C].
at::Tensor decoder_stack(const CausalLM::Impl& m, at::Tensor x, const AttnInputs& a);
// The final hidden states at the scoring positions T-R-1 .. T-2 of a padded batch ([B, R, C])
// with each distinct prompt prefix computed once (LogProbOptions::split_prompt).
at::Tensor scoring_hidden_states(const CausalLM::Impl& m, const at::Tensor& ids, const at::Tensor& mask,
                                 const at::Tensor& pos, int64_t R);

// ---- log-probs (log_probs.cpp) --------------------------------------------------------------
// Log-probs (and entropies when asked) of `targets` [N] under hidden [N, C] x weight [V, C]^T
// / options.temperature, in row chunks of options.chunk_tokens whose [n, V] logits autograd
// never stores (LogProbOptions::keep_logits_bytes: the log-probabilities, when they fit).
// Returns [N] log-probs, [N] entropies (or an empty tensor) and the bytes kept.
struct ChunkedLogProbsOut {
  at::Tensor log_probs, entropy;
  int64_t kept_logits_bytes = 0;
};
ChunkedLogProbsOut chunked_log_probs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                     const LogProbOptions& options);

}  // namespace rpg::model::detail
