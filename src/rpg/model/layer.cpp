// The decoder layer's arithmetic, shared by every forward mode (training forward, split-prompt
// and packed scoring, KV-cache decode): projections with LoRA, RMSNorm, RoPE, attention through
// SDPA (or the CPU decode kernel), the MLP. The numerics follow transformers' eager/SDPA path
// operation by operation (RMSNorm in fp32, RoPE tables in fp32 cast to the compute dtype) so
// that bf16 results agree with it as closely as fp32 ones do.
#include "rpg/model/layer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "rpg/core/log.h"
#include "rpg/model/decode_attention.h"
#include "rpg/model/decode_elementwise.h"
#include "rpg/model/fused_elementwise.h"
#include "rpg/model/packed_gemm.h"
#include "rpg/model/skinny_linear.h"

namespace rpg::model {
namespace detail {
namespace {

// Set while decode() / decode_all_slots() run: their projections go through decode_linear();
// every other forward keeps at::linear's arithmetic (the trainer's log-probs are compared bit
// for bit with the fork's).
thread_local bool t_decoding = false;
thread_local const PackedWeights* t_packs = nullptr;
// Set by RepeatKvHeadsScope: grouped_sdpa() repeats K/V heads on every device. Process-wide,
// not per thread: autograd's backward (a checkpointed layer's recompute) may run on another.
std::atomic<bool> g_repeat_kv_heads{false};

}  // namespace

DecodingScope::DecodingScope(const PackedWeights* packs) {
  t_decoding = true;
  t_packs = packs;
}
DecodingScope::~DecodingScope() {
  t_decoding = false;
  t_packs = nullptr;
}
RepeatKvHeadsScope::RepeatKvHeadsScope() { g_repeat_kv_heads = true; }
RepeatKvHeadsScope::~RepeatKvHeadsScope() { g_repeat_kv_heads = false; }

namespace {

// The packed copy of `weight` that a DecodingScope multiplies x by, or null.
const PackedWeight* decode_pack(const at::Tensor& x, const at::Tensor& weight) {
  if (t_packs && x.dim() >= 1 && x.numel() <= kPackedMaxRows * x.size(-1) && !c10::GradMode::is_enabled())
    return t_packs->find(weight);
  return nullptr;
}

// A projection with no adapter in effect (the packed forms below have no LoRA branch).
bool without_adapter(const LoraPair& lora, double scale) { return scale == 0 || !lora.a.defined(); }

}  // namespace

at::Tensor decode_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (const PackedWeight* p = decode_pack(x, weight)) return p->linear(x, bias);
  return linear_for_decode(x, weight, bias);
}

std::vector<at::Tensor*> layer_slots(LayerWeights& w, const ModelConfig& c) {
  std::vector<at::Tensor*> s = {&w.input_norm, &w.q_w};
  if (c.qkv_bias) s.push_back(&w.q_b);
  s.push_back(&w.k_w);
  if (c.qkv_bias) s.push_back(&w.k_b);
  s.push_back(&w.v_w);
  if (c.qkv_bias) s.push_back(&w.v_b);
  s.push_back(&w.o_w);
  if (c.qk_norm) {
    s.push_back(&w.q_norm);
    s.push_back(&w.k_norm);
  }
  for (at::Tensor* t : {&w.post_norm, &w.gate_w, &w.up_w, &w.down_w}) s.push_back(t);
  return s;
}

std::vector<LoraSlot> lora_slots(LayerWeights& w) {
  return {{"self_attn.q_proj", &w.q_w, &w.q_lora},     {"self_attn.k_proj", &w.k_w, &w.k_lora},
          {"self_attn.v_proj", &w.v_w, &w.v_lora},     {"self_attn.o_proj", &w.o_w, &w.o_lora},
          {"mlp.gate_proj", &w.gate_w, &w.gate_lora}, {"mlp.up_proj", &w.up_w, &w.up_lora},
          {"mlp.down_proj", &w.down_w, &w.down_lora}};
}

// What a checkpointed layer saves and differentiates: its weights, then its adapters.
std::vector<at::Tensor*> compute_slots(LayerWeights& w, const ModelConfig& c) {
  auto s = layer_slots(w, c);
  for (const LoraSlot& slot : lora_slots(w))
    if (slot.lora->a.defined()) s.insert(s.end(), {&slot.lora->a, &slot.lora->b});
  return s;
}

// A projection: x W^T + b, plus LoRA's (x A^T) B^T * scale in PEFT's order of operations.
// Adapters in another dtype than the base (fp32 on a bf16 model, PEFT's autocast_adapter_dtype)
// compute their branch in their dtype, and the sum is rounded to the base's, as PEFT does.
at::Tensor project(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const LoraPair& lora,
                   double scale) {
  at::Tensor y = t_decoding ? decode_linear(x, weight, bias) : at::linear(x, weight, bias);
  if (without_adapter(lora, scale)) return y;
  if (lora.a.scalar_type() == x.scalar_type()) return y + at::linear(at::linear(x, lora.a), lora.b) * scale;
  const at::Tensor delta = at::linear(at::linear(x.to(lora.a.scalar_type()), lora.a), lora.b) * scale;
  return (y + delta).to(y.scalar_type());
}

at::Tensor project_add(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight, const LoraPair& lora,
                       double scale) {
  // A layer's residual has the product's shape and dtype; PackedWeight::linear checks it.
  if (without_adapter(lora, scale))
    if (const PackedWeight* p = decode_pack(x, weight)) return p->linear(x, {}, residual);
  return residual + project(x, weight, {}, lora, scale);
}

// transformers' RMSNorm: normalise in fp32, cast back, then scale in the weight's dtype.
// Decode's fp32 and bf16 rows take the fused pass (decode_elementwise.h); every other forward
// on the CPU the same values and gradients, bit for bit, in fewer passes (fused_elementwise.h).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (t_decoding && decode_elementwise_applies(x) && weight.scalar_type() == x.scalar_type() && weight.is_contiguous())
    return rms_norm_rows(x, weight, eps);
  if (rms_norm_fused_applies(x, weight)) return rms_norm_fused(x, weight, eps);
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor var = xf.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (xf * at::rsqrt(var + eps)).to(x.scalar_type());
}

namespace {

// The two halves of the last dimension swapped: [x1, x2] -> [x2, x1]. With the sign of the
// first half folded into the sine table (rope_tables), x * cos + swap_halves(x) * sin is
// transformers' x * cos + rotate_half(x) * sin bit for bit (negation is exact), and its
// backward is another swap: rotate_half's narrows each zero-fill a full-size gradient.
at::Tensor swap_halves(const at::Tensor& x) {
  std::vector<int64_t> halves(x.sizes().begin(), x.sizes().end() - 1);
  halves.insert(halves.end(), {2, x.size(-1) / 2});
  return x.reshape(halves).flip(-2).reshape(x.sizes());
}

}  // namespace

// RoPE tables for positions [B, T] -> cos, sin [B, T, 1, D] in `dtype` (broadcast over
// heads); sin carries rotate_half's sign: [-sin, sin] (see swap_halves).
std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& inv_freq, const at::Tensor& positions,
                                              at::ScalarType dtype) {
  at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq;  // [B, T, D/2]
  at::Tensor sin = freqs.sin();
  return {at::cat({freqs, freqs}, -1).unsqueeze(2).cos().to(dtype), at::cat({-sin, sin}, -1).unsqueeze(2).to(dtype)};
}

Qkv project_qkv(const LayerWeights& w, const ModelConfig& c, const at::Tensor& x, const at::Tensor& cos,
                const at::Tensor& sin, bool with_q, bool rope) {
  const int64_t B = x.size(0), T = x.size(1), H = c.num_attention_heads, Hkv = c.num_key_value_heads,
                D = c.head_dim;
  Qkv r;
  // Decode's packed q, k and v: one product over the threads, not three (linear_together).
  const double s = w.lora_scale;
  if (with_q && without_adapter(w.q_lora, s) && without_adapter(w.k_lora, s) && without_adapter(w.v_lora, s)) {
    const PackedWeight *q = decode_pack(x, w.q_w), *k = decode_pack(x, w.k_w), *v = decode_pack(x, w.v_w);
    if (q && k && v) {
      std::vector<at::Tensor> qkv = linear_together({q, k, v}, x, {w.q_b, w.k_b, w.v_b});
      if (!qkv.empty()) {
        r.q = qkv[0].view({B, T, H, D});
        r.k = qkv[1].view({B, T, Hkv, D});
        r.v = qkv[2].view({B, T, Hkv, D});
      }
    }
  }
  if (!r.k.defined()) {
    if (with_q) r.q = project(x, w.q_w, w.q_b, w.q_lora, s).view({B, T, H, D});
    r.k = project(x, w.k_w, w.k_b, w.k_lora, s).view({B, T, Hkv, D});
    r.v = project(x, w.v_w, w.v_b, w.v_lora, s).view({B, T, Hkv, D});
  }
  if (c.qk_norm) {
    if (with_q) r.q = rms_norm(r.q, w.q_norm, c.rms_norm_eps);
    r.k = rms_norm(r.k, w.k_norm, c.rms_norm_eps);
  }
  if (!rope) return r;
  // Decode's fp32 and bf16 rows: the fused pass (decode_elementwise.h), the same formula;
  // every other CPU forward: the same bits with a fused backward (fused_elementwise.h).
  auto rotate = [&](const at::Tensor& t) {
    const bool tables = cos.scalar_type() == t.scalar_type() && sin.scalar_type() == t.scalar_type() &&
                        cos.is_contiguous() && sin.is_contiguous();
    if (t_decoding && decode_elementwise_applies(t) && tables) return rope_rows(t, cos, sin);
    if (rope_fused_applies(t, cos, sin)) return rope_fused(t, cos, sin);
    return t * cos + swap_halves(t) * sin;
  };
  if (with_q) r.q = rotate(r.q);
  r.k = rotate(r.k);
  return r;
}

// The attention half of a layer: residual + o_proj(attention over x, the normed residual).
at::Tensor attention(const LayerWeights& w, const ModelConfig& c, const at::Tensor& residual, const at::Tensor& x,
                     const AttnInputs& a, const CacheStep* cache) {
  const int64_t T = x.size(1), H = c.num_attention_heads, D = c.head_dim;
  // Decode's CPU kernel rotates q and k, writes k and v and attends in one pass (NewTokens).
  const bool kernel = cache && cache->kernel_slots.defined();
  auto [q, k, v] = project_qkv(w, c, x, a.cos, a.sin, /*with_q=*/true, /*rope=*/!kernel);
  if (kernel) {
    const int64_t R = q.size(0);
    const at::Tensor o = rpg::model::decode_attention(
        q.contiguous().view({R, H, D}), *cache->k, *cache->v, cache->kernel_slots, cache->kernel_positions,
        {cache->kernel_prefix_slots, cache->kernel_prefix_lengths},
        {k.contiguous(), v.contiguous(), a.cos.contiguous(), a.sin.contiguous()});
    return project_add(residual, o.view({R, 1, H * D}), w.o_w, w.o_lora, w.lora_scale);
  }
  if (cache) {
    // The cache is heads-major; written through [S, capacity, Hkv, D] views.
    if (cache->keys_blocked) put_blocked_keys(*cache->k, cache->slot_index, cache->write_places, k);
    else cache->k->transpose(1, 2).index_put_({cache->slot_index, cache->write_pos}, k);
    cache->v->transpose(1, 2).index_put_({cache->slot_index, cache->write_pos}, v);
    if (cache->new_keys_only) return project_add(residual, attend(c, q, k, v, a), w.o_w, w.o_lora, w.lora_scale);
    const bool gather = cache->read == CacheStep::Read::kGather;
    at::Tensor rows = cache->slot_index.view({-1});
    if (cache->keys_blocked) {  // read back as a position-major copy of the first kv_len positions
      const at::Tensor blocks = cache->k->narrow(2, 0, key_blocks(cache->kv_len));
      k = unblock_keys(gather ? blocks.index_select(0, rows) : blocks, cache->kv_len);  // [N or S, Hkv, L, D]
    } else {
      k = cache->k->narrow(2, 0, cache->kv_len);  // [S, Hkv, L, D]
      if (gather) k = k.index_select(0, rows);
    }
    v = cache->v->narrow(2, 0, cache->kv_len);
    if (gather) v = v.index_select(0, rows);
    if (cache->read == CacheStep::Read::kDense) {
      const int64_t S = cache->k->size(0);
      at::Tensor qs = at::zeros({S, T, H, D}, q.options()).index_copy_(0, rows, q);
      at::Tensor o = attend(c, qs, k.transpose(1, 2), v.transpose(1, 2), a);
      return project_add(residual, o.index_select(0, rows), w.o_w, w.o_lora, w.lora_scale);
    }
    return project_add(residual, attend(c, q, k.transpose(1, 2), v.transpose(1, 2), a), w.o_w, w.o_lora, w.lora_scale);
  }
  return project_add(residual, attend(c, q, k, v, a), w.o_w, w.o_lora, w.lora_scale);
}

namespace {

// The SDPA kernel each kind of attention call gets ("cuda/bf16/causal" -> "flash_attention"),
// asked once per key with at::_fused_sdp_choice (the dispatcher scaled_dot_product_attention
// itself uses). A math fallback on a GPU is one warning line: never silent.
std::mutex g_sdpa_mutex;
std::map<std::string, std::string>& sdpa_seen() {
  static std::map<std::string, std::string> seen;
  return seen;
}

void note_sdpa(const char* kind, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
               const std::optional<at::Tensor>& mask, bool is_causal, bool gqa) {
  std::string key = std::string(q.device().is_cuda() ? "cuda" : "cpu") + "/" + c10::toString(q.scalar_type()) + "/" + kind;
  {
    std::lock_guard<std::mutex> lock(g_sdpa_mutex);
    if (sdpa_seen().count(key)) return;
  }
  const int64_t choice = at::_fused_sdp_choice(q, k, v, mask, 0.0, is_causal, std::nullopt, gqa);
  static const char* const names[] = {"math", "flash_attention", "efficient_attention", "cudnn_attention", "overrideable"};
  const std::string name = choice >= 0 && choice <= 4 ? names[choice] : "error";
  {
    std::lock_guard<std::mutex> lock(g_sdpa_mutex);
    if (!sdpa_seen().emplace(key, name).second) return;
  }
  if (q.device().is_cuda() && choice <= 0)
    log_warn("attention ", key, ": scaled_dot_product_attention falls back to the ", name,
             " kernel (no fused kernel supports this call: q ", q.sizes(), ", kv ", k.sizes(),
             mask ? ", with a mask" : "", ")");
}

// Unmasked SDPA (causal or full) over grouped-query heads, q [B, H, T, D], k and v [B, Hkv,
// S, D]. On CUDA the flash and cuDNN kernels take fp16 / bf16 only, and of the fused kernels
// only flash shares K/V heads in place (enable_gqa); the memory-efficient kernel (the one for
// fp32) refuses grouped heads. So an fp32 call would get the math kernel, which materialises
// every score. Where the dispatcher would pick math, K/V heads are repeated to H (head h reads
// K/V head h / rep, as enable_gqa and transformers' repeat_kv do) and the call goes without
// enable_gqa. RepeatKvHeadsScope forces that form on every device (tests).
bool repeats_kv_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal) {
  return q.size(1) != k.size(1) &&
         (g_repeat_kv_heads.load(std::memory_order_relaxed) ||
          (q.is_cuda() && at::_fused_sdp_choice(q, k, v, std::nullopt, 0.0, is_causal, std::nullopt, true) == 0));
}

// K/V [B, Hkv, S, D] with each head repeated rep times in place: head h = K/V head h / rep
// (transformers' repeat_kv). One copy; no index tensor, nothing read back from a device.
at::Tensor repeat_kv(const at::Tensor& x, int64_t rep) {
  const int64_t B = x.size(0), Hkv = x.size(1), S = x.size(2), D = x.size(3);
  return x.unsqueeze(2).expand({B, Hkv, rep, S, D}).reshape({B, Hkv * rep, S, D});
}

// The call, reported under `kind` (+ "_repeated_kv" where K/V heads were repeated). With
// seq_lens (a packed stream, B = 1), one call per sequence on its slice of the stream (no
// [N, N] mask, no cross-sequence work), K/V heads repeated once for the whole stream. The
// slices come from one split per tensor, whose backward concatenates the slices' gradients
// (separate narrows would each materialise a zero gradient of the whole stream).
at::Tensor grouped_sdpa(const std::string& kind, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        bool is_causal, const std::vector<int64_t>& seq_lens = {}) {
  const int64_t rep = q.size(1) / k.size(1);
  const bool repeat = repeats_kv_heads(q, k, v, is_causal), gqa = rep > 1 && !repeat;
  const at::Tensor kr = repeat ? repeat_kv(k, rep) : k, vr = repeat ? repeat_kv(v, rep) : v;
  std::vector<at::Tensor> qs{q}, ks{kr}, vs{vr};
  if (!seq_lens.empty())
    qs = q.split_with_sizes(seq_lens, 2), ks = kr.split_with_sizes(seq_lens, 2), vs = vr.split_with_sizes(seq_lens, 2);
  note_sdpa((repeat ? kind + "_repeated_kv" : kind).c_str(), qs[0], ks[0], vs[0], std::nullopt, is_causal, gqa);
  std::vector<at::Tensor> outs;
  outs.reserve(qs.size());
  for (size_t i = 0; i < qs.size(); ++i)
    outs.push_back(at::scaled_dot_product_attention(qs[i], ks[i], vs[i], std::nullopt, /*dropout_p=*/0.0, is_causal,
                                                    /*scale=*/std::nullopt, gqa));
  return outs.size() == 1 ? outs[0] : at::cat(outs, 2);
}

// A host index list on the device. A copy from pageable memory synchronises the stream (the
// host waits for every kernel queued before it), which here would be three times per layer
// call; from pinned memory it is queued like a kernel.
at::Tensor index_on(const std::vector<int64_t>& rows, const at::Device& device) {
  at::Tensor host = at::tensor(rows, at::kLong);
  if (!device.is_cuda()) return host.to(device);
  return host.pin_memory().to(device, at::kLong, /*non_blocking=*/true);
}

// attend() for AttnInputs::key_start. Row b's columns are its key positions from z_b on, so
// every row's first real key is column 0 and its query t (key position S - T + t) column
// S - T - z_b + t: causal attention over the columns is then exactly each real query's
// attention over its real keys. Columns hold no query in front of a row's queries (a zero
// query, whose output is dropped) and behind a row's last key (a copy of the last key, seen
// only by columns behind it). With one start for all rows the columns are a narrow (plus
// zero queries); otherwise one gather per tensor.
at::Tensor attend_from_key_start(const ModelConfig& c, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v, const std::vector<int64_t>& key_start) {
  const int64_t B = q.size(0), T = q.size(1), S = k.size(1), H = c.num_attention_heads, Hkv = c.num_key_value_heads,
                D = c.head_dim;
  TORCH_CHECK(static_cast<int64_t>(key_start.size()) == B, "key_start has ", key_start.size(), " rows, q ", B);
  const auto [lo, hi] = std::minmax_element(key_start.begin(), key_start.end());
  TORCH_CHECK(*lo >= 0 && *hi <= S, "key_start outside [0, ", S, "]");
  const int64_t W = S - *lo;  // columns
  if (W == 0) return q.new_zeros({B, T, H * D});  // no row has a real key
  const bool one_start = *lo == *hi;
  const int64_t lead = W - T;  // one_start: zero queries in front (> 0) or queries with no real key (< 0)
  at::Tensor qc, kc, vc;
  if (one_start) {
    kc = k.narrow(1, *lo, W), vc = v.narrow(1, *lo, W);
    qc = lead > 0 ? at::cat({q.new_zeros({B, lead, H, D}), q}, 1) : q.narrow(1, -lead, W);
  } else {
    // Flat row-major indices: keys of row b at columns w are k[b, min(z_b + w, S - 1)]; its
    // queries come from [zero; q] at 1 + (w - (S - T - z_b)) where that is a query, else 0.
    std::vector<int64_t> key_at(static_cast<size_t>(B * W)), query_at(static_cast<size_t>(B * W));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t w = 0; w < W; ++w) {
        const int64_t z = key_start[static_cast<size_t>(b)], t = w - (S - T - z);
        key_at[static_cast<size_t>(b * W + w)] = b * S + std::min(z + w, S - 1);
        query_at[static_cast<size_t>(b * W + w)] = t >= 0 && t < T ? 1 + b * T + t : 0;
      }
    const auto idx = [&](const std::vector<int64_t>& rows) { return index_on(rows, q.device()); };
    const at::Tensor ki = idx(key_at);
    kc = k.reshape({B * S, Hkv, D}).index_select(0, ki).view({B, W, Hkv, D});
    vc = v.reshape({B * S, Hkv, D}).index_select(0, ki).view({B, W, Hkv, D});
    qc = at::cat({q.new_zeros({1, H, D}), q.reshape({B * T, H, D})}, 0).index_select(0, idx(query_at)).view({B, W, H, D});
  }
  at::Tensor qt = qc.transpose(1, 2), kt = kc.transpose(1, 2), vt = vc.transpose(1, 2);
  at::Tensor o = grouped_sdpa(T < S ? "causal_from_key_start_offset" : "causal_from_key_start", qt, kt, vt, true)
                     .transpose(1, 2);  // [B, W, H, D]
  if (one_start) {
    o = lead >= 0 ? o.narrow(1, lead, T) : at::cat({o.new_zeros({B, -lead, H, D}), o}, 1);
  } else {
    // Query t of row b is column S - T - z_b + t of [zero column; o], shifted by one.
    std::vector<int64_t> out_at(static_cast<size_t>(B * T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t w = S - T - key_start[static_cast<size_t>(b)] + t;
        out_at[static_cast<size_t>(b * T + t)] = w >= 0 ? 1 + b * W + w : 0;
      }
    o = at::cat({o.new_zeros({1, H, D}), o.reshape({B * W, H, D})}, 0)
            .index_select(0, index_on(out_at, q.device()));
  }
  return o.reshape({B, T, H * D});
}

}  // namespace

std::optional<std::vector<int64_t>> contiguous_key_starts(const at::Tensor& mask) {
  const at::Tensor m = mask.to(at::kCPU, at::kBool).contiguous();
  const int64_t B = m.size(0), T = m.size(1);
  const bool* p = m.data_ptr<bool>();
  std::vector<int64_t> starts(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b, p += T) {
    int64_t i = 0;
    while (i < T && !p[i]) ++i;
    if (i == T) return std::nullopt;
    starts[static_cast<size_t>(b)] = i;
    while (i < T && p[i]) ++i;
    while (i < T && !p[i]) ++i;
    if (i < T) return std::nullopt;
  }
  return starts;
}

bool key_start_form_pays(int64_t queries, int64_t keys, int64_t min_key_start) {
  const int64_t zero_queries = keys - min_key_start - queries;
  return zero_queries <= 0 || (queries >= 1024 && queries >= 4 * zero_queries);
}

// softmax(q k^T / sqrt(D) + mask) v for q [B, T, H, D], k and v [B, S, Hkv, D] -> [B, T, H*D].
at::Tensor attend(const ModelConfig& c, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const AttnInputs& a) {
  const int64_t B = q.size(0), T = q.size(1), H = c.num_attention_heads, Hkv = c.num_key_value_heads,
                D = c.head_dim;
  if (!a.key_start.empty()) return attend_from_key_start(c, q, k, v, a.key_start);
  const at::Tensor kt = k.transpose(1, 2), vt = v.transpose(1, 2);  // [B, Hkv, S, D]
  if (!a.seq_lens.empty()) {
    // Block-diagonal causal attention over a packed stream: one causal SDPA per sequence.
    at::Tensor o = grouped_sdpa("packed", q.transpose(1, 2), kt, vt, true, a.seq_lens);  // [1, H, N, D]
    return o.transpose(1, 2).reshape({B, T, H * D});
  }
  if (H != Hkv && a.mask.defined()) {
    // Grouped-query attention with a mask: fold each group's query heads into the query
    // length, [B, T, H, D] -> [B, Hkv, rep*T, D] (head h = kv * rep + r reads K/V head kv,
    // as repeat_kv does), and attend over the Hkv heads directly with the mask folded the
    // same way (make_mask). Nothing of size K/V is copied, unlike repeating K/V to H heads
    // (which a decode step would pay for the whole cache) or SDPA's GQA fallback.
    const int64_t rep = H / Hkv;
    at::Tensor qf = q.view({B, T, Hkv, rep, D}).permute({0, 2, 3, 1, 4}).reshape({B, Hkv, rep * T, D});
    note_sdpa("masked_gqa", qf, kt, vt, a.mask, false, false);
    at::Tensor o = at::scaled_dot_product_attention(qf, kt, vt, a.mask);  // [B, Hkv, rep*T, D]
    return o.view({B, Hkv, rep, T, D}).permute({0, 3, 1, 2, 4}).reshape({B, T, H * D});
  }
  at::Tensor o;
  if (a.mask.defined()) {  // one K/V head per query head here: nothing grouped
    note_sdpa("masked", q.transpose(1, 2), kt, vt, a.mask, false, false);
    o = at::scaled_dot_product_attention(q.transpose(1, 2), kt, vt, a.mask);
  } else {
    o = grouped_sdpa(a.is_causal ? a.causal_kind : "full", q.transpose(1, 2), kt, vt, a.is_causal);
  }
  return o.transpose(1, 2).reshape({B, T, H * D});
}

// The attention mask as attention() consumes it: [B, 1, T, S] bool, or for grouped-query
// models [B, 1, rep*T, S] with each query row repeated for the rep heads folded into it.
at::Tensor make_mask(const at::Tensor& mask, const ModelConfig& c) {
  const int64_t rep = c.num_attention_heads / c.num_key_value_heads;
  if (rep == 1) return mask;
  const int64_t B = mask.size(0), T = mask.size(2), S = mask.size(3);
  return mask.unsqueeze(2).expand({B, 1, rep, T, S}).reshape({B, 1, rep * T, S});
}

// The MLP half of a layer on the attention block's output h: h + down(silu(gate(n)) * up(n)).
at::Tensor mlp_block(const LayerWeights& w, const ModelConfig& c, const at::Tensor& h) {
  at::Tensor n = rms_norm(h, w.post_norm, c.rms_norm_eps);
  const double r = w.lora_scale;
  at::Tensor act;
  // Decode's packed gate and up: both products and the SwiGLU in one pass (swiglu_linear).
  if (without_adapter(w.gate_lora, r) && without_adapter(w.up_lora, r))
    if (const PackedWeight* gate = decode_pack(n, w.gate_w))
      if (const PackedWeight* up = decode_pack(n, w.up_w)) act = swiglu_linear(*gate, *up, n);
  if (!act.defined()) {
    const at::Tensor gate = project(n, w.gate_w, {}, w.gate_lora, r), up = project(n, w.up_w, {}, w.up_lora, r);
    const bool fused = t_decoding && decode_elementwise_applies(gate) && decode_elementwise_applies(up) &&
                       gate.scalar_type() == up.scalar_type();
    act = fused ? swiglu_rows(gate, up) : at::silu(gate) * up;
  }
  return project_add(h, act, w.down_w, w.down_lora, r);
}

at::Tensor layer_forward(const LayerWeights& w, const ModelConfig& c, const at::Tensor& x, const AttnInputs& a,
                         const CacheStep* cache) {
  return mlp_block(w, c, attention(w, c, x, rms_norm(x, w.input_norm, c.rms_norm_eps), a, cache));
}

at::Tensor default_positions(const at::Tensor& input_ids, const at::Tensor& attention_mask) {
  if (attention_mask.defined()) return (attention_mask.to(at::kLong).cumsum(-1) - 1).clamp_min(0);
  return at::arange(input_ids.size(1), input_ids.options().dtype(at::kLong)).unsqueeze(0).expand_as(input_ids);
}

// Token ids must be [B, T] integers; out-of-vocabulary ids are caught by at::embedding.
void check_ids(const at::Tensor& ids, const char* what) {
  TORCH_CHECK(ids.defined() && ids.dim() == 2, what, " must be [B, T], got ", ids.defined() ? ids.sizes() : at::IntArrayRef{});
  TORCH_CHECK(ids.scalar_type() == at::kLong || ids.scalar_type() == at::kInt, what, " must be integer");
}

// A padded batch: [B, T] ids with an optional mask and positions of the same shape.
void check_batch(const at::Tensor& input_ids, const at::Tensor& attention_mask, const at::Tensor& position_ids) {
  check_ids(input_ids, "input_ids");
  if (attention_mask.defined())
    TORCH_CHECK(attention_mask.sizes() == input_ids.sizes(), "attention_mask ", attention_mask.sizes(),
                " must match input_ids ", input_ids.sizes());
  if (position_ids.defined())
    TORCH_CHECK(position_ids.sizes() == input_ids.sizes(), "position_ids ", position_ids.sizes(),
                " must match input_ids ", input_ids.sizes());
}

std::map<std::string, std::string> sdpa_backends_seen() {
  std::lock_guard<std::mutex> lock(g_sdpa_mutex);
  return sdpa_seen();
}

}  // namespace detail

std::map<std::string, std::string> sdpa_backends() { return detail::sdpa_backends_seen(); }

}  // namespace rpg::model
