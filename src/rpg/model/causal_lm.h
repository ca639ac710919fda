// The decoder-only causal LM (Qwen2 / Qwen2.5 / Qwen3 / Llama 3) on libtorch, with
// Hugging Face checkpoint load and save. Knows nothing about RL: it turns token ids into
// logits, log-probs and entropies, and writes its weights back in the format it read.
//
// Shapes: B rows, T tokens, R scored (response) tokens, H query heads, Hkv key/value
// heads, D head dim, C hidden, V vocab, S cache slots.
//
// Parameters are plain leaf tensors with requires_grad (no torch::nn module), enumerated
// with their Hugging Face names by named_parameters(), so an optimizer can own them and a
// checkpoint is exactly that list.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rpg/model/config.h"

namespace rpg::model {
namespace detail {
class PackedWeights;
}

struct LoadOptions {
  // dtype of the parameters after loading; default: the checkpoint tensors' own dtype.
  std::optional<at::ScalarType> dtype;
  at::Device device = at::kCPU;
};

struct SaveOptions {
  // dtype written to disk; default: the parameters' dtype.
  std::optional<at::ScalarType> dtype;
  // A checkpoint larger than this is split into model-0000i-of-0000n.safetensors files
  // plus model.safetensors.index.json (transformers' own default is 5 GB).
  int64_t max_shard_bytes = int64_t{5} << 30;
  // When set, every other file of this directory (tokenizer, generation config, chat
  // template...) is copied beside the weights, so the output is a complete model dir.
  std::filesystem::path copy_files_from;
};

// LoRA as PEFT computes it: on each targeted projection y = W x + b + B (A x) * scale with
// A [r, in], B [out, r] and scale = alpha / r (alpha / sqrt(r) with use_rslora). model/lora.h
// reads and writes PEFT's adapter directories.
struct LoraConfig {
  int64_t rank = 8;
  double alpha = 16;
  // Projection names (q_proj k_proj v_proj o_proj gate_proj up_proj down_proj), every layer.
  std::vector<std::string> target_modules;
  bool use_rslora = false;
  double scale() const;
  bool operator==(const LoraConfig&) const = default;
};

// The projections LoRA can target, in layer order; "all-linear" means all of them (PEFT:
// every linear layer but the output head).
const std::vector<std::string>& lora_module_names();

struct LogProbOptions {
  double temperature = 1.0;   // logits are divided by this before the softmax (as verl does)
  bool with_entropy = false;  // also return the entropy of each position's distribution
  // Token rows whose fp32 logits [rows, V] exist at once, forward and backward. The extra
  // peak is about rows * V * 12 bytes (two fp32 work buffers and the matmul output)
  // instead of several B * R * V * 4 copies: 256 rows at V = 152k is ~0.5 GB.
  int64_t chunk_tokens = 256;
  // Padding-free forward (verl's use_remove_padding): the rows' real tokens (attention_mask
  // 1) are packed into one stream and run through packed_hidden_states(), so the decoder
  // layers and the lm_head work on real tokens only. Results on scored positions equal the
  // padded path's (to fp32 rounding); positions whose target or scoring token is padding
  // get log-prob 0 and entropy 0 (the padded path leaves finite, meaningless values there).
  bool remove_padding = false;
  // Padded path only: compute the prompt part (all but its last token) once per distinct
  // prompt and, in the last layer, only its keys/values; the scoring positions attend over
  // it (rows of a GRPO group share a prompt, so most of the prompt work is skipped). Equal
  // to the full forward up to fp32 rounding. With gradient checkpointing each layer of it is
  // checkpointed (only the layer's prefix and suffix inputs are kept).
  bool split_prompt = true;
  // The log-prob backward forms p as exp(s - logsumexp(s)), exactly as torch's autograd
  // differentiates gather - logsumexp (transformers + verl; fork semantics uses it to equal
  // the fork's update bit for bit), instead of from log_softmax. An ulp apart per element.
  // Off by default: with it, 2-rank bf16 ZeRO-2 runs drifted past 1e-6 of the 1-rank run by
  // step 2 (DataParallelTrain.ZeroTwoBf16*), with log_softmax they do not.
  bool autograd_backward = false;
  // When the scored rows' fp32 log-probabilities [rows, V] take at most this many bytes, a
  // forward that autograd records keeps them for its backward instead of recomputing each
  // chunk's lm_head product there (2 x rows x hidden x V FLOPs, the update's largest single
  // GEMM on a small model). Same gradients bit for bit; 0 always recomputes.
  int64_t keep_logits_bytes = int64_t{1} << 30;
};

struct TokenLogProbs {
  at::Tensor log_probs;  // [B, R] fp32
  at::Tensor entropy;    // [B, R] fp32, or undefined without with_entropy
  int64_t kept_logits_bytes = 0;  // held for the backward (LogProbOptions::keep_logits_bytes), or 0
};

// Key/value cache for incremental decoding: a fixed number S of independent sequence
// slots, each a padded buffer of `capacity` positions with its own length. This is what a
// continuous-batching engine needs: any subset of slots advances in one decode() call, a
// finished slot is reset() and refilled while the others continue, and no sequence ever
// shifts in memory. Positions beyond a slot's length are masked out, so stale data from a
// previous occupant is never read.
class KVCache {
 public:
  int64_t num_slots() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t capacity() const { return capacity_; }
  int64_t length(int64_t slot) const;  // tokens cached for this slot
  void reset(int64_t slot);            // empty one slot (its buffers are reused)
  void reset();                        // empty every slot
  // Makes slot `to` a copy of slot `from` (its cached tokens and length), so n samples of
  // one prompt share a single prefill. The copies remember that they hold the same prompt:
  // decode() reads it once per step for all of them (decode_attention.h, SharedPrefix).
  void copy_slot(int64_t from, int64_t to);
  // Sets a slot's length (for decode_all_slots callers, which keep lengths themselves).
  void set_length(int64_t slot, int64_t length);

 private:
  friend class CausalLM;
  // Per layer, in the model dtype: values [S, Hkv, capacity, D]; keys the same, or in blocks of
  // positions when keys_blocked_ (the CPU decode kernel's layout, decode_attention.h).
  std::vector<at::Tensor> k_, v_;
  bool keys_blocked_ = false;
  std::vector<int64_t> lengths_;   // [S] on the host: shapes depend on it
  // Slots with the same prefix_id_ hold the same keys and values at positions below their
  // prefix_length_ (0: none): a prompt prefilled from an empty slot, and its copies. Writes
  // only ever append, so that stays true until a slot is reset or shortened.
  std::vector<int64_t> prefix_id_, prefix_length_;
  int64_t next_prefix_id_ = 0;
  int64_t capacity_ = 0;
};

class CausalLM {
 public:
  // Fresh parameters on `device` in `dtype`, initialised as transformers does (normal with
  // std 0.02 for matrices, ones for norms, zeros for biases). Uses torch's global RNG.
  CausalLM(ModelConfig config, at::ScalarType dtype, at::Device device = at::kCPU);
  ~CausalLM();
  CausalLM(CausalLM&&) noexcept;
  CausalLM& operator=(CausalLM&&) noexcept;

  // Loads <dir>/config.json and model.safetensors (or the shards listed by
  // model.safetensors.index.json). Files are memory-mapped; each tensor is converted once
  // into its parameter and its pages are released, so the weights are never held twice.
  // Throws FormatError naming file and tensor for any malformed, missing, extra or
  // mis-shaped tensor; IoError when a file cannot be read.
  static CausalLM from_pretrained(const std::filesystem::path& dir, const LoadOptions& options = {});

  // Writes config.json + weights in the safetensors layout transformers and vLLM read,
  // sharded above options.max_shard_bytes, into a temporary directory renamed over `dir`
  // at the end (a reader never sees a half-written model). Replaces an existing `dir`.
  void save_pretrained(const std::filesystem::path& dir, const SaveOptions& options = {}) const;

  const ModelConfig& config() const;
  at::ScalarType dtype() const;
  at::Device device() const;

  // Every parameter with its Hugging Face name, in checkpoint order. Tied embeddings
  // appear once (as model.embed_tokens.weight). The tensors are the live parameters.
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const;
  std::vector<at::Tensor> parameters() const;
  void set_requires_grad(bool requires_grad);
  // Copies values from a model of the same architecture (any dtype / device), e.g. fp32
  // master weights into a bf16 copy.
  void copy_parameters_from(const CausalLM& other);

  // LoRA adapters on config.target_modules of every layer, in `adapter_dtype` (default: the
  // model's) on its device and requiring gradients: A Kaiming-uniform as PEFT (U(-1/sqrt(in),
  // 1/sqrt(in)), torch's global RNG), B zeros, so the model computes what it did before until
  // B moves. fp32 adapters on a bf16 model are PEFT's default for bf16 bases
  // (autocast_adapter_dtype): the adapter branch runs in fp32, its sum with the base output is
  // rounded to bf16. ValueError for rank < 1, an unknown module, or adapters already attached.
  void attach_lora(const LoraConfig& config, std::optional<at::ScalarType> adapter_dtype = std::nullopt);
  const std::optional<LoraConfig>& lora() const;
  // Off: every forward (training, log-probs, decode) computes the base model exactly -- the
  // reference policy of a LoRA run without a second copy of the weights. On by default.
  void set_lora_enabled(bool enabled);
  bool lora_enabled() const;
  // The adapters under PEFT's saved names, layer by layer in lora_module_names() order:
  // "base_model.model.model.layers.<i>.self_attn.q_proj.lora_A.weight", then lora_B.
  std::vector<std::pair<std::string, at::Tensor>> lora_parameters() const;
  // Folds the adapters into the weights as PEFT's merge_and_unload() does (W += B A * scale,
  // in the weights' dtype) and removes them: the plain model computing the adapted outputs.
  void merge_lora();

  // Recompute each decoder layer in the backward pass instead of keeping its activations.
  // Backward then needs this model alive (it holds the layer's weights).
  void set_gradient_checkpointing(bool enabled);
  bool gradient_checkpointing() const;

  // Training / scoring forward over a padded batch.
  //   input_ids      [B, T] int64
  //   attention_mask [B, T] 1 on tokens, 0 on padding (any layout: left-padded prompts
  //                  and right-padded responses); undefined = no padding (pure causal)
  //   position_ids   [B, T] int64; undefined = cumsum(attention_mask) - 1 clamped at 0,
  //                  the verl layout, so padding never shifts positions
  // Outputs at padding positions are finite but meaningless.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask = {},
                     const at::Tensor& position_ids = {}) const;  // logits [B, T, V], model dtype
  at::Tensor hidden_states(const at::Tensor& input_ids, const at::Tensor& attention_mask = {},
                           const at::Tensor& position_ids = {}) const;  // [B, T, C] after the final norm

  // Padding-free forward over S sequences concatenated into one stream of N tokens:
  //   input_ids    [N] int64
  //   position_ids [N] int64, each sequence's own positions (in verl's layout 0..L_i-1,
  //                so RoPE restarts with every sequence)
  //   seq_lens     S lengths >= 1 summing to N
  // Attention is causal within each sequence and never crosses into another (block-
  // diagonal causal): each sequence gets the hidden states it would get alone. Work and
  // memory scale with N and sum L_i^2, not with S * max L. Returns [N, C] after the final
  // norm. Honours gradient checkpointing like hidden_states().
  at::Tensor packed_hidden_states(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                  const std::vector<int64_t>& seq_lens) const;

  // Log-probabilities (and entropies) of `targets` [B, R] (in verl's layout the responses,
  // i.e. the last R tokens of input_ids), scored by the logits of the R positions before
  // the last one (so R <= T - 1):
  // log softmax(logits[:, T-R-1 : T-1] / temperature)[targets]. The lm_head projection
  // runs in chunks of options.chunk_tokens rows, forward and backward, so [B, R, V]
  // logits never exist in fp32. Differentiable w.r.t. the parameters. With
  // options.remove_padding the same call runs padding-free (see LogProbOptions).
  TokenLogProbs log_probs(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                          const at::Tensor& position_ids, const at::Tensor& targets,
                          const LogProbOptions& options = {}) const;

  // Incremental decoding. new_cache() allocates S slots of `capacity` tokens each.
  // decode() appends tokens [N, T'] to the N distinct `slots` (T' = prompt length for a
  // prefill, 1 for a decode step; one call may mix slots at different lengths) and returns
  // the logits [N, T', V] of the new positions. Positions continue from each slot's length.
  // Runs without autograd. See DecodeOptions for ragged prefills and last-token logits.
  KVCache new_cache(int64_t num_slots, int64_t capacity) const;
  // Bytes new_cache() holds per slot and token position: K and V of every layer, model dtype.
  int64_t kv_cache_bytes_per_token() const;
  // Bytes new_cache() holds per slot of `capacity` positions: the above, with the keys padded to
  // whole blocks of positions where the CPU decode kernel reads them (decode_attention.h).
  int64_t kv_cache_bytes_per_sequence(int64_t capacity) const;
  struct DecodeOptions {
    // Valid tokens per row when `tokens` is right-padded (ragged prefill); empty = all T'.
    // A slot advances by its own count; its padded tail is written but never attended to,
    // so length + T' must still fit in the capacity.
    std::vector<int64_t> lengths;
    // Return only each row's last valid position: [N, V] instead of [N, T', V] (what a
    // sampler needs; skips the lm_head over the rest of a prefill).
    bool last_only = false;
  };
  at::Tensor decode(KVCache& cache, const std::vector<int64_t>& slots, const at::Tensor& tokens,
                    const DecodeOptions& options) const;
  at::Tensor decode(KVCache& cache, const std::vector<int64_t>& slots, const at::Tensor& tokens) const {
    return decode(cache, slots, tokens, DecodeOptions{});
  }
  struct Impl;

  // While the returned handle lives, decode() and decode_all_slots() multiply by this model's
  // weights packed once in the CPU GEMM's own layout (MKL's), instead of the GEMM re-packing
  // every weight on every call: on SmolLM2-135M a decode step of 1-32 rows is 1.1-1.7x
  // faster; packing costs about one copy of the weights in time and memory, freed with the
  // handle (the rollout engine holds one per generate()). A no-op where it does not apply
  // (bf16 or CUDA weights, a libtorch without MKL). A weight changed in place after packing
  // is noticed (its version counter) and multiplied unpacked. The handle must not outlive
  // the model.
  class DecodePacks {
   public:
    DecodePacks() = default;
    DecodePacks(DecodePacks&& other) noexcept;
    DecodePacks& operator=(DecodePacks&&) = delete;
    DecodePacks(const DecodePacks&) = delete;
    DecodePacks& operator=(const DecodePacks&) = delete;
    ~DecodePacks();
    // How many weight matrices were packed (0 for the no-op).
    size_t size() const;
    // Inputs of up to this many rows (tokens) take the packed products, larger ones the
    // unpacked GEMM (0 for the no-op): what a caller batching rows together stays within.
    int64_t max_rows() const;

   private:
    friend class CausalLM;
    Impl* impl_ = nullptr;
    std::shared_ptr<const detail::PackedWeights> packs_, previous_;
  };
  [[nodiscard]] DecodePacks pack_weights_for_decode() const;

  // One decode step of every slot with fixed shapes and no host read: tokens [S, 1] and
  // positions [S] (where each token is written: the slot's length) are tensors on the
  // model's device, attention spans the first kv_len positions of the cache (0: its whole
  // capacity) under the mask key <= position. Returns logits [S, 1, V]. Slot lengths are
  // not advanced (set_length): the step can be captured in a CUDA graph (cuda_graph.h), one
  // per kv_len, and replayed with new tensor contents. A position >= kv_len is undefined
  // behaviour (checked by the caller, on the host).
  at::Tensor decode_all_slots(KVCache& cache, const at::Tensor& tokens, const at::Tensor& positions,
                              int64_t kv_len = 0) const;

 private:
  TokenLogProbs packed_log_probs(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                 const at::Tensor& position_ids, const at::Tensor& targets,
                                 const LogProbOptions& options) const;
  explicit CausalLM(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The scaled_dot_product_attention kernel each kind of attention call of this process got so
// far, keyed "<device>/<dtype>/<kind>" (kind: causal, masked, masked_gqa, packed, full), e.g.
// "cuda/BFloat16/causal" -> "flash_attention"; "math" is the unfused fallback, which on a GPU
// is also logged once as a warning. Asked once per key (at::_fused_sdp_choice).
std::map<std::string, std::string> sdpa_backends();

}  // namespace rpg::model
