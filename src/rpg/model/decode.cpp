// The KV cache and decoding: one step of new tokens for some or all of the cache's slots.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "rpg/core/error.h"
#include "rpg/core/log.h"
#include "rpg/model/decode_attention.h"
#include "rpg/model/layer.h"
#include "rpg/model/packed_gemm.h"

namespace rpg::model {

using namespace detail;

int64_t KVCache::length(int64_t slot) const {
  if (slot < 0 || slot >= num_slots()) throw ValueError(str("KV cache slot ", slot, " out of range [0, ", num_slots(), ")"));
  return lengths_[slot];
}
void KVCache::reset(int64_t slot) {
  (void)length(slot);
  lengths_[slot] = 0;
  prefix_length_[slot] = 0;
}
void KVCache::reset() {
  std::fill(lengths_.begin(), lengths_.end(), 0);
  std::fill(prefix_length_.begin(), prefix_length_.end(), 0);
}

void KVCache::set_length(int64_t slot, int64_t length) {
  (void)this->length(slot);
  if (length < 0 || length > capacity_)
    throw ValueError(str("KVCache::set_length: slot ", slot, " length ", length, " outside 0..", capacity_));
  lengths_[slot] = length;
  prefix_length_[slot] = std::min(prefix_length_[slot], length);
}

void KVCache::copy_slot(int64_t from, int64_t to) {
  const int64_t n = length(from);
  (void)length(to);
  if (from == to) return;
  for (size_t l = 0; l < k_.size(); ++l) {
    const int64_t key_rows = keys_blocked_ ? key_blocks(n) : n;  // positions, or blocks of them
    k_[l][to].narrow(1, 0, key_rows).copy_(k_[l][from].narrow(1, 0, key_rows));
    v_[l][to].narrow(1, 0, n).copy_(v_[l][from].narrow(1, 0, n));
  }
  lengths_[to] = n;
  prefix_id_[to] = prefix_id_[from];
  prefix_length_[to] = prefix_length_[from];
}

int64_t CausalLM::kv_cache_bytes_per_token() const {
  const auto& c = impl_->config;
  return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim *
         static_cast<int64_t>(c10::elementSize(impl_->dtype));
}

int64_t CausalLM::kv_cache_bytes_per_sequence(int64_t capacity) const {
  const int64_t key_positions =
      decode_attention_supports(impl_->dtype, impl_->device) ? key_blocks(capacity) * kKeyBlock : capacity;
  return kv_cache_bytes_per_token() / 2 * (capacity + key_positions);
}

KVCache CausalLM::new_cache(int64_t num_slots, int64_t capacity) const {
  if (num_slots < 1 || capacity < 1)
    throw ValueError(str("KV cache: got ", num_slots, " slots of ", capacity, " tokens, expected both >= 1"));
  const auto& c = impl_->config;
  KVCache cache;
  cache.capacity_ = capacity;
  cache.lengths_.assign(num_slots, 0);
  cache.prefix_id_.assign(num_slots, 0);
  cache.prefix_length_.assign(num_slots, 0);
  auto opt = at::TensorOptions().dtype(impl_->dtype).device(impl_->device);
  // decode_attention() reads keys in blocks of positions; elsewhere SDPA reads them position-major.
  cache.keys_blocked_ = decode_attention_supports(impl_->dtype, impl_->device);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    cache.k_.push_back(cache.keys_blocked_ ? at::zeros({num_slots, c.num_key_value_heads, key_blocks(capacity),
                                                        c.head_dim, kKeyBlock}, opt)
                                           : at::zeros({num_slots, c.num_key_value_heads, capacity, c.head_dim}, opt));
    cache.v_.push_back(at::zeros({num_slots, c.num_key_value_heads, capacity, c.head_dim}, opt));
  }
  return cache;
}

at::Tensor CausalLM::decode(KVCache& cache, const std::vector<int64_t>& slots, const at::Tensor& tokens,
                            const DecodeOptions& options) const {
  const Impl& m = *impl_;
  check_ids(tokens, "tokens");
  const int64_t N = tokens.size(0), T = tokens.size(1);
  if (static_cast<int64_t>(slots.size()) != N)
    throw ValueError(str("decode: ", slots.size(), " slots for ", N, " token rows"));
  if (static_cast<int64_t>(cache.k_.size()) != m.config.num_hidden_layers)
    throw ValueError("decode: the KV cache was made for another model");
  if (!options.lengths.empty() && static_cast<int64_t>(options.lengths.size()) != N)
    throw ValueError(str("decode: ", options.lengths.size(), " lengths for ", N, " token rows"));
  std::vector<int64_t> counts(N, T);
  for (int64_t i = 0; i < N && !options.lengths.empty(); ++i) {
    counts[i] = options.lengths[i];
    if (counts[i] < 1 || counts[i] > T)
      throw ValueError(str("decode: row ", i, " has length ", counts[i], ", expected 1..", T));
  }
  std::vector<int64_t> starts(N);
  std::vector<bool> seen(cache.num_slots(), false);
  int64_t kv_len = 0;
  bool all_slots = N == cache.num_slots();
  for (int64_t i = 0; i < N; ++i) {
    int64_t s = slots[i];
    int64_t len = cache.length(s);
    if (seen[s]) throw ValueError(str("decode: slot ", s, " given twice"));
    seen[s] = true;
    if (len + T > cache.capacity())
      throw ValueError(str("decode: slot ", s, " holds ", len, " tokens; ", T, " more exceed the capacity ", cache.capacity()));
    starts[i] = len;
    kv_len = std::max(kv_len, len + T);
    all_slots = all_slots && s == i;
  }
  at::NoGradGuard no_grad;
  DecodingScope decoding(m.decode_packs.get());
  auto long_opt = at::TensorOptions().dtype(at::kLong).device(m.device);
  at::Tensor start = at::tensor(starts, at::kLong).to(m.device);                       // [N]
  at::Tensor pos = start.unsqueeze(1) + at::arange(T, long_opt).unsqueeze(0);          // [N, T]
  AttnInputs a;
  std::tie(a.cos, a.sin) = rope_tables(m.inv_freq, pos, m.dtype);
  CacheStep step;
  step.keys_blocked = cache.keys_blocked_;
  step.slot_index = at::tensor(slots, at::kLong).to(m.device).unsqueeze(1);
  step.write_pos = pos;
  step.kv_len = kv_len;
  const int64_t S = cache.num_slots();
  step.read = all_slots ? CacheStep::Read::kAll : 2 * N > S ? CacheStep::Read::kDense : CacheStep::Read::kGather;
  // Key j is visible to the query at absolute position p iff j <= p: that covers both the
  // causal order among the new tokens and the slot's length (stale entries lie beyond).
  // Dense reads attend for every slot; idle ones get position 0 so they see key 0 only.
  // A cache laid out for decode_attention() (keys in blocks) is read by it at one token
  // per row: no mask, no dense scatter, no gather.
  if (T == 1 && cache.keys_blocked_) {
    step.kernel_slots = at::tensor(slots, at::kLong);
    step.kernel_positions = at::tensor(starts, at::kLong);
    // Rows holding one prompt read it from the first of them (at the shorter of their two
    // prefix lengths, should one have been shortened). RPG_DECODE_SHARED_PROMPT=0: each its own
    // copy (the same results; benchmarks compare the two).
    static const bool share = [] {
      const char* env = std::getenv("RPG_DECODE_SHARED_PROMPT");
      const std::string want = env ? env : "";
      if (!want.empty() && want != "0" && want != "1")
        log_warn("RPG_DECODE_SHARED_PROMPT=" + want + ": expected 0 or 1; ignored");
      return want != "0";
    }();
    std::vector<int64_t> prefix_slots(N), prefix_lengths(N, 0);
    std::vector<std::pair<int64_t, int64_t>> firsts;  // (prefix id, row)
    bool any = false;
    for (int64_t i = 0; i < N && share; ++i) {
      const int64_t s = slots[i];
      prefix_slots[i] = s;
      if (cache.prefix_length_[s] == 0) continue;
      auto f = std::find_if(firsts.begin(), firsts.end(), [&](const auto& x) { return x.first == cache.prefix_id_[s]; });
      if (f == firsts.end()) {  // the first: its own prompt, in its own slot
        firsts.emplace_back(cache.prefix_id_[s], i);
        prefix_lengths[i] = cache.prefix_length_[s];
        continue;
      }
      const int64_t first = slots[f->second];
      prefix_slots[i] = first;
      prefix_lengths[i] = std::min(cache.prefix_length_[s], cache.prefix_length_[first]);
      any = true;
    }
    if (any) {
      step.kernel_prefix_slots = at::tensor(prefix_slots, at::kLong);
      step.kernel_prefix_lengths = at::tensor(prefix_lengths, at::kLong);
    }
  } else {
    if (cache.keys_blocked_) step.write_places = key_places(pos);  // once, not per layer
    if (kv_len == T) {  // every row starts at 0: a prompt's own tokens are all its keys
      step.new_keys_only = true;
      a.is_causal = true;  // right padding (options.lengths) comes after a row's real tokens
      a.causal_kind = "prefill";
    } else {
      at::Tensor query_pos = pos;
      if (step.read == CacheStep::Read::kDense)
        query_pos = at::zeros({S, T}, long_opt).index_copy_(0, step.slot_index.view({-1}), pos);
      a.mask = make_mask((at::arange(kv_len, long_opt).view({1, 1, kv_len}) <= query_pos.unsqueeze(2)).unsqueeze(1),
                         m.config);  // [N or S, 1, T, L]
    }
  }
  at::Tensor x = at::embedding(m.embed, tokens.to(m.device, at::kLong));
  for (size_t l = 0; l < m.layers.size(); ++l) {
    step.k = &cache.k_[l];
    step.v = &cache.v_[l];
    x = layer_forward(m.layers[l], m.config, x, a, &step);
  }
  for (int64_t i = 0; i < N; ++i) {
    const int64_t s = slots[i];
    // A prompt, or the next chunk of one (several tokens onto a slot that holds only its
    // prompt so far): its copies will share it. A new id for the longer prompt, since copies
    // made of the shorter one keep theirs.
    if (cache.lengths_[s] == 0 || (T > 1 && cache.prefix_length_[s] == cache.lengths_[s])) {
      cache.prefix_id_[s] = cache.next_prefix_id_++;
      cache.prefix_length_[s] = cache.lengths_[s] + counts[i];
    }
    cache.lengths_[s] += counts[i];
  }
  if (options.last_only) {
    at::Tensor last = at::tensor(counts, at::kLong).to(m.device).sub_(1).view({N, 1, 1}).expand({N, 1, x.size(2)});
    x = x.gather(1, last).squeeze(1);  // [N, C]
  }
  return decode_linear(rms_norm(x, m.final_norm, m.config.rms_norm_eps), m.lm_head, {});
}

CausalLM::DecodePacks::DecodePacks(DecodePacks&& other) noexcept
    : impl_(std::exchange(other.impl_, nullptr)), packs_(std::move(other.packs_)), previous_(std::move(other.previous_)) {}

CausalLM::DecodePacks::~DecodePacks() {
  if (impl_ && impl_->decode_packs == packs_) impl_->decode_packs = previous_;
}

size_t CausalLM::DecodePacks::size() const { return packs_ ? packs_->size() : 0; }

int64_t CausalLM::DecodePacks::max_rows() const { return size() > 0 ? kPackedMaxRows : 0; }

CausalLM::DecodePacks CausalLM::pack_weights_for_decode() const {
  DecodePacks handle;
  const Impl& m = *impl_;
  if (!m.device.is_cpu() || packed_backend_for(m.dtype) == PackedBackend::kNone) return handle;
  auto packs = std::make_shared<PackedWeights>();
  for (const LayerWeights& w : m.layers)
    for (const at::Tensor* t : {&w.q_w, &w.k_w, &w.v_w, &w.o_w, &w.gate_w, &w.up_w, &w.down_w}) packs->add(*t);
  packs->add(m.lm_head);
  handle.impl_ = impl_.get();
  handle.previous_ = impl_->decode_packs;
  handle.packs_ = std::move(packs);
  impl_->decode_packs = handle.packs_;
  return handle;
}

at::Tensor CausalLM::decode_all_slots(KVCache& cache, const at::Tensor& tokens, const at::Tensor& positions,
                                      int64_t kv_len) const {
  const Impl& m = *impl_;
  const int64_t S = cache.num_slots();
  if (kv_len < 0 || kv_len > cache.capacity())
    throw ValueError(str("decode_all_slots: kv_len ", kv_len, " outside [0, ", cache.capacity(), "] (0: the capacity)"));
  const int64_t L = kv_len > 0 ? kv_len : cache.capacity();
  if (static_cast<int64_t>(cache.k_.size()) != m.config.num_hidden_layers)
    throw ValueError("decode_all_slots: the KV cache was made for another model");
  if (tokens.dim() != 2 || tokens.size(0) != S || tokens.size(1) != 1 || tokens.scalar_type() != at::kLong ||
      tokens.device() != m.device)
    throw ValueError(str("decode_all_slots: tokens must be int64 [", S, ", 1] on ", m.device.str()));
  if (positions.dim() != 1 || positions.size(0) != S || positions.scalar_type() != at::kLong ||
      positions.device() != m.device)
    throw ValueError(str("decode_all_slots: positions must be int64 [", S, "] on ", m.device.str()));
  at::NoGradGuard no_grad;
  DecodingScope decoding(m.decode_packs.get());
  auto long_opt = at::TensorOptions().dtype(at::kLong).device(m.device);
  at::Tensor pos = positions.view({S, 1});
  AttnInputs a;
  std::tie(a.cos, a.sin) = rope_tables(m.inv_freq, pos, m.dtype);
  CacheStep step;
  step.keys_blocked = cache.keys_blocked_;
  step.slot_index = at::arange(S, long_opt).unsqueeze(1);
  step.write_pos = pos;
  step.kv_len = L;
  step.read = CacheStep::Read::kAll;
  if (cache.keys_blocked_) {  // decode_attention() (see decode())
    step.kernel_slots = at::arange(S, at::kLong);
    step.kernel_positions = positions.cpu();
  } else {
    a.mask = make_mask((at::arange(L, long_opt).view({1, 1, L}) <= pos.unsqueeze(2)).unsqueeze(1), m.config);
  }
  at::Tensor x = at::embedding(m.embed, tokens);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    step.k = &cache.k_[l];
    step.v = &cache.v_[l];
    x = layer_forward(m.layers[l], m.config, x, a, &step);
  }
  return decode_linear(rms_norm(x, m.final_norm, m.config.rms_norm_eps), m.lm_head, {});
}
}  // namespace rpg::model
