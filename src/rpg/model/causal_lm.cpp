// Compute side of CausalLM: parameters, RoPE, the decoder layer, the three forward modes
// (padded training forward, KV-cache decode, chunked log-probs) and per-layer gradient
// checkpointing. The numerics follow transformers' eager/SDPA path operation by operation
// (RMSNorm in fp32, RoPE tables in fp32 cast to the compute dtype) so that bf16 results
// agree with it as closely as fp32 ones do.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <mutex>

#include "rpg/core/error.h"
#include "rpg/core/log.h"
#include "rpg/model/decode_attention.h"
#include "rpg/model/impl.h"
#include "rpg/model/skinny_linear.h"

namespace rpg::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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

// A layer's LoRA adapters in lora_module_names() order, each with the weight it adapts.
struct LoraSlot {
  const char* module;  // PEFT's module path inside a layer
  at::Tensor* weight;
  LoraPair* lora;
};
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

// Set while decode() / decode_all_slots() run: their projections of a few rows go to the
// decode kernel (linear_for_decode); every other forward keeps at::linear's arithmetic (the
// trainer's log-probs are compared bit for bit with the fork's).
thread_local bool t_decoding = false;
struct DecodingScope {
  DecodingScope() { t_decoding = true; }
  ~DecodingScope() { t_decoding = false; }
};

// A projection: x W^T + b, plus LoRA's (x A^T) B^T * scale in PEFT's order of operations.
// Adapters in another dtype than the base (fp32 on a bf16 model, PEFT's autocast_adapter_dtype)
// compute their branch in their dtype, and the sum is rounded to the base's, as PEFT does.
at::Tensor project(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const LoraPair& lora,
                   double scale) {
  at::Tensor y = t_decoding ? linear_for_decode(x, weight, bias) : at::linear(x, weight, bias);
  if (scale == 0 || !lora.a.defined()) return y;
  if (lora.a.scalar_type() == x.scalar_type()) return y + at::linear(at::linear(x, lora.a), lora.b) * scale;
  const at::Tensor delta = at::linear(at::linear(x.to(lora.a.scalar_type()), lora.a), lora.b) * scale;
  return (y + delta).to(y.scalar_type());
}

// transformers' RMSNorm: normalise in fp32, cast back, then scale in the weight's dtype.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor var = xf.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (xf * at::rsqrt(var + eps)).to(x.scalar_type());
}

// The two halves of the last dimension swapped: [x1, x2] -> [x2, x1]. With the sign of the
// first half folded into the sine table (rope_tables), x * cos + swap_halves(x) * sin is
// transformers' x * cos + rotate_half(x) * sin bit for bit (negation is exact), and its
// backward is another swap: rotate_half's narrows each zero-fill a full-size gradient.
at::Tensor swap_halves(const at::Tensor& x) {
  std::vector<int64_t> halves(x.sizes().begin(), x.sizes().end() - 1);
  halves.insert(halves.end(), {2, x.size(-1) / 2});
  return x.reshape(halves).flip(-2).reshape(x.sizes());
}

// RoPE tables for positions [B, T] -> cos, sin [B, T, 1, D] in `dtype` (broadcast over
// heads); sin carries rotate_half's sign: [-sin, sin] (see swap_halves).
std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& inv_freq, const at::Tensor& positions,
                                              at::ScalarType dtype) {
  at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq;  // [B, T, D/2]
  at::Tensor sin = freqs.sin();
  return {at::cat({freqs, freqs}, -1).unsqueeze(2).cos().to(dtype), at::cat({-sin, sin}, -1).unsqueeze(2).to(dtype)};
}

// Where a layer's keys/values come from: the current tokens only (training forward) or a
// KV cache the new tokens are appended to first (decode).
struct CacheStep {
  at::Tensor* k = nullptr;  // [S, Hkv, capacity, D], or [S, Hkv, D, capacity] when keys_transposed
  at::Tensor* v = nullptr;  // [S, Hkv, capacity, D]
  bool keys_transposed = false;
  at::Tensor slot_index;    // [N, 1] int64 on device
  at::Tensor write_pos;     // [N, T] int64 on device
  int64_t kv_len = 0;       // keys to attend: max over rows of (length + T)
  // How attention reads the cache for the N rows:
  //   kAll:    the rows are slots 0..S-1 in order; the cache is used as is.
  //   kDense:  most slots are active (2N > S): the N queries are scattered into S rows and
  //            attention runs over the whole cache (idle rows see one key and are dropped),
  //            cheaper than copying N rows of K/V out of it.
  //   kGather: few slots active: their K/V rows are gathered.
  enum class Read { kAll, kDense, kGather } read = Read::kGather;
  // One token per row on the CPU: decode_attention() reads each row's slot in place (no
  // gather, no dense scatter). Host int64 [N]: each row's slot and query position.
  at::Tensor kernel_slots, kernel_positions;
};

// What every layer shares for one forward call.
struct AttnInputs {
  at::Tensor cos, sin;   // [B, T, 1, D]
  at::Tensor mask;       // make_mask(): [B, 1, (rep*)T, S] bool (true = attend), or undefined = causal
  bool is_causal = false;
  // Packed stream (B = 1): the lengths of the sequences laid end to end along T; each
  // attends causally within itself only. Empty = not packed.
  std::vector<int64_t> seq_lens;
};

at::Tensor attend(const ModelConfig& c, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const AttnInputs& a);

// Queries (unless !with_q), keys and values of one layer for the normed input x [B, T, C]:
// [B, T, H or Hkv, D], q/k normed (qwen3) and rotated.
struct Qkv {
  at::Tensor q, k, v;
};

Qkv project_qkv(const LayerWeights& w, const ModelConfig& c, const at::Tensor& x, const at::Tensor& cos,
                const at::Tensor& sin, bool with_q = true) {
  const int64_t B = x.size(0), T = x.size(1), H = c.num_attention_heads, Hkv = c.num_key_value_heads,
                D = c.head_dim;
  Qkv r;
  if (with_q) r.q = project(x, w.q_w, w.q_b, w.q_lora, w.lora_scale).view({B, T, H, D});
  r.k = project(x, w.k_w, w.k_b, w.k_lora, w.lora_scale).view({B, T, Hkv, D});
  r.v = project(x, w.v_w, w.v_b, w.v_lora, w.lora_scale).view({B, T, Hkv, D});
  if (c.qk_norm) {
    if (with_q) r.q = rms_norm(r.q, w.q_norm, c.rms_norm_eps);
    r.k = rms_norm(r.k, w.k_norm, c.rms_norm_eps);
  }
  if (with_q) r.q = r.q * cos + swap_halves(r.q) * sin;
  r.k = r.k * cos + swap_halves(r.k) * sin;
  return r;
}

at::Tensor attention(const LayerWeights& w, const ModelConfig& c, const at::Tensor& x, const AttnInputs& a,
                     const CacheStep* cache) {
  const int64_t T = x.size(1), H = c.num_attention_heads, D = c.head_dim;
  auto [q, k, v] = project_qkv(w, c, x, a.cos, a.sin);
  if (cache) {
    // The cache is heads-major; written through [S, capacity, Hkv, D] views.
    const at::Tensor keys = cache->keys_transposed ? cache->k->transpose(2, 3) : *cache->k;  // [S, Hkv, cap, D]
    keys.transpose(1, 2).index_put_({cache->slot_index, cache->write_pos}, k);
    cache->v->transpose(1, 2).index_put_({cache->slot_index, cache->write_pos}, v);
    if (cache->kernel_slots.defined())
      return project(decode_attention(q.view({q.size(0), H, D}), *cache->k, *cache->v, cache->kernel_slots,
                                      cache->kernel_positions)
                         .view({q.size(0), 1, H * D}),
                     w.o_w, {}, w.o_lora, w.lora_scale);
    at::Tensor rows = cache->slot_index.view({-1});
    k = keys.narrow(2, 0, cache->kv_len);  // [S, Hkv, L, D]
    v = cache->v->narrow(2, 0, cache->kv_len);
    if (cache->read == CacheStep::Read::kGather) {
      k = k.index_select(0, rows);
      v = v.index_select(0, rows);
    } else if (cache->keys_transposed) {
      k = k.contiguous();  // a prefill over every slot (SDPA wants the last dim contiguous)
    }
    if (cache->read == CacheStep::Read::kDense) {
      const int64_t S = cache->k->size(0);
      at::Tensor qs = at::zeros({S, T, H, D}, q.options()).index_copy_(0, rows, q);
      at::Tensor o = attend(c, qs, k.transpose(1, 2), v.transpose(1, 2), a);
      return project(o.index_select(0, rows), w.o_w, {}, w.o_lora, w.lora_scale);
    }
    return project(attend(c, q, k.transpose(1, 2), v.transpose(1, 2), a), w.o_w, {}, w.o_lora, w.lora_scale);
  }
  return project(attend(c, q, k, v, a), w.o_w, {}, w.o_lora, w.lora_scale);
}

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

// softmax(q k^T / sqrt(D) + mask) v for q [B, T, H, D], k and v [B, S, Hkv, D] -> [B, T, H*D].
at::Tensor attend(const ModelConfig& c, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const AttnInputs& a) {
  const int64_t B = q.size(0), T = q.size(1), H = c.num_attention_heads, Hkv = c.num_key_value_heads,
                D = c.head_dim;
  const at::Tensor kt = k.transpose(1, 2), vt = v.transpose(1, 2);  // [B, Hkv, S, D]
  if (!a.seq_lens.empty()) {
    // Block-diagonal causal attention over a packed stream: one causal SDPA per sequence
    // on its slice of the stream (no [N, N] mask, no cross-sequence work). The slices come
    // from one split per tensor, whose backward concatenates the slices' gradients (S
    // separate narrows would each materialise a zero gradient of the whole stream).
    const auto qs = q.transpose(1, 2).split_with_sizes(a.seq_lens, 2);  // S x [1, H, L_i, D]
    const auto ks = kt.split_with_sizes(a.seq_lens, 2), vs = vt.split_with_sizes(a.seq_lens, 2);
    std::vector<at::Tensor> outs;
    outs.reserve(a.seq_lens.size());
    note_sdpa("packed", qs[0], ks[0], vs[0], std::nullopt, true, H != Hkv);
    for (size_t i = 0; i < a.seq_lens.size(); ++i)
      outs.push_back(at::scaled_dot_product_attention(qs[i], ks[i], vs[i], std::nullopt, /*dropout_p=*/0.0,
                                                      /*is_causal=*/true, /*scale=*/std::nullopt,
                                                      /*enable_gqa=*/H != Hkv));
    at::Tensor o = outs.size() == 1 ? outs[0] : at::cat(outs, 2);  // [1, H, N, D]
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
  // Without a mask SDPA's enable_gqa shares K/V heads in place (flash supports it).
  const std::optional<at::Tensor> mask = a.mask.defined() ? std::optional<at::Tensor>(a.mask) : std::nullopt;
  note_sdpa(mask ? "masked" : a.is_causal ? "causal" : "full", q.transpose(1, 2), kt, vt, mask, a.is_causal, H != Hkv);
  at::Tensor o = at::scaled_dot_product_attention(q.transpose(1, 2), kt, vt, mask, /*dropout_p=*/0.0, a.is_causal,
                                                  /*scale=*/std::nullopt, /*enable_gqa=*/H != Hkv);
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
  return h + project(at::silu(project(n, w.gate_w, {}, w.gate_lora, r)) * project(n, w.up_w, {}, w.up_lora, r), w.down_w,
                     {}, w.down_lora, r);
}

at::Tensor layer_forward(const LayerWeights& w, const ModelConfig& c, const at::Tensor& x, const AttnInputs& a,
                         const CacheStep* cache) {
  return mlp_block(w, c, x + attention(w, c, rms_norm(x, w.input_norm, c.rms_norm_eps), a, cache));
}

// The backward of a checkpointed layer: re-runs `run` (the layer's forward) with autograd on
// over detached copies of the saved activations and of layer `layer`'s weights (`saved_params`,
// in layer_slots order) and differentiates the outputs whose incoming gradient is defined. The
// layer is deterministic (no dropout), so the recomputation reproduces the forward exactly.
// Returns one gradient per activation, then one per weight, then `trailing` undefined ones (the
// Function's inputs that are not differentiated).
variable_list recompute_layer_gradients(
    const CausalLM::Impl& impl, int64_t layer, const std::vector<at::Tensor>& activations,
    const std::vector<at::Tensor>& saved_params, const variable_list& grad_out, size_t trailing,
    const std::function<std::vector<at::Tensor>(const LayerWeights&, const std::vector<at::Tensor>&)>& run) {
  at::AutoGradMode grad_on(true);
  std::vector<at::Tensor> acts, inputs;
  std::vector<size_t> where;  // index into the gradient list for each differentiated input
  for (size_t i = 0; i < activations.size(); ++i) {
    acts.push_back(activations[i].detach().requires_grad_(activations[i].requires_grad()));
    if (acts.back().requires_grad()) inputs.push_back(acts.back()), where.push_back(i);
  }
  LayerWeights w = impl.layers[layer];
  auto ws = compute_slots(w, impl.config);
  for (size_t i = 0; i < ws.size(); ++i) {
    const at::Tensor& p = saved_params[i];
    *ws[i] = p.detach().requires_grad_(p.requires_grad());
    if (p.requires_grad()) inputs.push_back(*ws[i]), where.push_back(activations.size() + i);
  }
  variable_list grads(activations.size() + ws.size() + trailing);
  if (inputs.empty()) return grads;
  const std::vector<at::Tensor> outs = run(w, acts);
  std::vector<at::Tensor> outputs, grad_outputs;
  for (size_t k = 0; k < outs.size() && k < grad_out.size(); ++k)
    if (outs[k].defined() && grad_out[k].defined()) outputs.push_back(outs[k]), grad_outputs.push_back(grad_out[k]);
  if (outputs.empty()) return grads;
  auto g = torch::autograd::grad(outputs, inputs, grad_outputs, /*retain_graph=*/false, /*create_graph=*/false,
                                 /*allow_unused=*/true);
  for (size_t i = 0; i < g.size(); ++i) grads[where[i]] = g[i];
  return grads;
}

// Per-layer activation checkpointing: the forward keeps only the layer input; backward
// re-runs the layer (recompute_layer_gradients).
struct CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, at::TensorList params, at::Tensor cos,
                            at::Tensor sin, std::optional<at::Tensor> mask, bool is_causal,
                            std::vector<int64_t> seq_lens, int64_t layer, const CausalLM::Impl* impl) {
    std::vector<at::Tensor> saved = {x, cos, sin, mask.value_or(at::Tensor())};
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["is_causal"] = is_causal;
    ctx->saved_data["seq_lens"] = seq_lens;
    ctx->saved_data["impl"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(impl));
    AttnInputs a{cos, sin, mask.value_or(at::Tensor()), is_causal, std::move(seq_lens)};
    return layer_forward(impl->layers[layer], impl->config, x, a, nullptr);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const auto* impl = reinterpret_cast<const CausalLM::Impl*>(static_cast<intptr_t>(ctx->saved_data["impl"].toInt()));
    const AttnInputs a{saved[1], saved[2], saved[3], ctx->saved_data["is_causal"].toBool(),
                       ctx->saved_data["seq_lens"].toIntVector()};
    // x, each param, then cos, sin, mask, is_causal, seq_lens, layer, impl
    return recompute_layer_gradients(*impl, ctx->saved_data["layer"].toInt(), {saved[0]},
                                     {saved.begin() + 4, saved.end()}, grad_out, 7,
                                     [&](const LayerWeights& w, const std::vector<at::Tensor>& in) {
                                       return std::vector<at::Tensor>{layer_forward(w, impl->config, in[0], a, nullptr)};
                                     });
  }
};

// Log-probs / entropies of target tokens through the lm_head in row chunks. Forward and
// backward both recompute each chunk's logits, so autograd never stores [N, V] either.
//   log p_t = s_t - lse(s),  s = z / tau,  H = lse(s) - sum_k p_k s_k
//   d log p_t / ds = onehot_t - p,  dH/ds_k = -p_k (log p_k + H)
// Each chunk works in at most two [n, V] fp32 buffers (updated in place; row-wise dot
// products go through bmm instead of an elementwise temporary), so the peak is about
// 2 * n * V * 4 bytes plus the [n, V] matmul output in the weight dtype.
struct ChunkedLogProbs : public torch::autograd::Function<ChunkedLogProbs> {
  // Row-wise sum_k a[r, k] * b[r, k] without an [n, V] temporary: [n, 1, V] @ [n, V, 1].
  static at::Tensor row_dot(const at::Tensor& a, const at::Tensor& b) {
    return at::bmm(a.unsqueeze(1), b.unsqueeze(2)).view({a.size(0)});
  }
  // fp32 logits / tau of rows [s, s + n): [n, V].
  static at::Tensor scaled_logits(const at::Tensor& hidden, const at::Tensor& weight, int64_t s, int64_t n,
                                  double temperature) {
    at::Tensor z = at::matmul(hidden.narrow(0, s, n), weight.t());
    z = z.scalar_type() == at::kFloat ? z : z.to(at::kFloat);
    if (temperature != 1.0) z.div_(temperature);
    return z;
  }

  static variable_list forward(AutogradContext* ctx, at::Tensor hidden, at::Tensor weight, at::Tensor targets,
                               double temperature, bool with_entropy, int64_t chunk, bool autograd_backward) {
    const int64_t N = hidden.size(0);
    at::Tensor lp = at::empty({N}, hidden.options().dtype(at::kFloat));
    at::Tensor ent = at::empty({with_entropy ? N : 0}, hidden.options().dtype(at::kFloat));
    for (int64_t s = 0; s < N; s += chunk) {
      int64_t n = std::min(chunk, N - s);
      at::Tensor z = scaled_logits(hidden, weight, s, n, temperature);
      at::Tensor lse = at::logsumexp(z, -1);
      lp.narrow(0, s, n).copy_(z.gather(1, targets.narrow(0, s, n).unsqueeze(1)).squeeze(1) - lse);
      if (with_entropy) ent.narrow(0, s, n).copy_(lse - row_dot(at::softmax(z, -1), z));
    }
    ctx->save_for_backward({hidden, weight, targets});
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["with_entropy"] = with_entropy;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["autograd_backward"] = autograd_backward;
    return {lp, ent};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    at::Tensor hidden = saved[0], weight = saved[1], targets = saved[2];
    double temperature = ctx->saved_data["temperature"].toDouble();
    bool with_entropy = ctx->saved_data["with_entropy"].toBool();
    int64_t chunk = ctx->saved_data["chunk"].toInt();
    const bool autograd_backward = ctx->saved_data["autograd_backward"].toBool();
    at::Tensor g_lp = grad_out[0], g_ent = with_entropy ? grad_out[1] : at::Tensor();
    const int64_t N = hidden.size(0);
    bool need_h = hidden.requires_grad(), need_w = weight.requires_grad();
    at::Tensor grad_h = need_h ? at::empty_like(hidden) : at::Tensor();
    // fp32 accumulator: summing many chunk products in bf16 would lose the small ones.
    at::Tensor grad_w = need_w ? at::zeros(weight.sizes(), weight.options().dtype(at::kFloat)) : at::Tensor();
    for (int64_t s = 0; s < N; s += chunk) {
      int64_t n = std::min(chunk, N - s);
      at::Tensor h = hidden.narrow(0, s, n);
      // autograd_backward: log p = s - lse(s) and p = exp(s - lse(s)), as autograd
      // differentiates the forward's gather - logsumexp (logsumexp's backward is
      // exp(s - lse)): the same fp32 gradient as transformers + verl's logprobs_from_logits,
      // bit for bit (log_softmax's own rounding of log p differs by an ulp, which the
      // gradient of a cancelling sum amplifies). Otherwise from log_softmax (see
      // LogProbOptions::autograd_backward for why that stays the default).
      at::Tensor gs = scaled_logits(hidden, weight, s, n, temperature);
      if (autograd_backward) gs.sub_(at::logsumexp(gs, -1, /*keepdim=*/true));  // log p
      else gs = at::log_softmax(gs, -1);
      at::Tensor p = gs.exp();
      if (g_ent.defined()) {
        at::Tensor H = -row_dot(p, gs).unsqueeze(1);                        // [n, 1]
        gs.add_(H).mul_(p).mul_(-g_ent.narrow(0, s, n).unsqueeze(1));     // dH/ds * g_ent
      } else {
        gs.zero_();
      }
      if (g_lp.defined()) {
        at::Tensor g = g_lp.narrow(0, s, n).unsqueeze(1);
        gs.sub_(p.mul_(g));                                                  // - p * g
        gs.scatter_add_(1, targets.narrow(0, s, n).unsqueeze(1), g);         // + onehot * g
      }
      p.reset();
      if (temperature != 1.0) gs.div_(temperature);
      // The logits' gradient in the weight's dtype: what autograd hands both products of a
      // bf16 lm_head. grad_w sums its chunks in fp32 either way; with autograd_backward its
      // factor is that rounded gradient too (the fork's bf16 run), else the fp32 one.
      const bool low = gs.scalar_type() != weight.scalar_type();
      at::Tensor gz = low && (need_h || autograd_backward) ? gs.to(weight.scalar_type()) : gs;
      if (need_h) grad_h.narrow(0, s, n).copy_(at::matmul(gz, weight));
      if (need_w) {
        const at::Tensor factor = low && autograd_backward ? gz.to(at::kFloat) : gs;
        grad_w.addmm_(factor.t(), h.scalar_type() == at::kFloat ? h : h.to(at::kFloat));
      }
    }
    return {grad_h, need_w ? grad_w.to(weight.scalar_type()) : at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor default_positions(const at::Tensor& input_ids, const at::Tensor& attention_mask) {
  if (attention_mask.defined()) return (attention_mask.to(at::kLong).cumsum(-1) - 1).clamp_min(0);
  return at::arange(input_ids.size(1), input_ids.options().dtype(at::kLong)).unsqueeze(0).expand_as(input_ids);
}

// The decoder layers (checkpointed when enabled and autograd is recording) and the final
// norm over embeddings x [B, T, C].
at::Tensor decoder_stack(const CausalLM::Impl& m, at::Tensor x, const AttnInputs& a) {
  bool checkpoint = m.checkpointing && at::GradMode::is_enabled();
  for (size_t l = 0; l < m.layers.size(); ++l) {
    if (checkpoint) {
      LayerWeights w = m.layers[l];
      std::vector<at::Tensor> params;
      for (at::Tensor* p : compute_slots(w, m.config)) params.push_back(*p);
      x = CheckpointedLayer::apply(x, at::TensorList(params), a.cos, a.sin,
                                   a.mask.defined() ? std::optional<at::Tensor>(a.mask) : std::nullopt, a.is_causal,
                                   a.seq_lens, static_cast<int64_t>(l), &m);
    } else {
      x = layer_forward(m.layers[l], m.config, x, a, nullptr);
    }
  }
  return rms_norm(x, m.final_norm, m.config.rms_norm_eps);
}

// What one layer of the split forward below reads besides its weights: the prefix's and the
// suffix's attention inputs and each row's prefix (an index into the distinct prefixes).
struct SplitInputs {
  AttnInputs prefix, suffix;
  at::Tensor row_of;
};

// One layer of the split forward: the distinct prefixes xp [U, P1, C] (their keys/values only
// when `last`: the outputs are never scored) and every row's suffix x [B, R, C], attending
// over its prefix's keys/values then its own. Returns (xp', x'); xp' is undefined when last.
std::pair<at::Tensor, at::Tensor> split_layer(const LayerWeights& w, const ModelConfig& c, const at::Tensor& xp,
                                              const at::Tensor& x, const SplitInputs& in, bool last) {
  Qkv p = project_qkv(w, c, rms_norm(xp, w.input_norm, c.rms_norm_eps), in.prefix.cos, in.prefix.sin, !last);
  at::Tensor xp_out;
  if (!last) xp_out = mlp_block(w, c, xp + project(attend(c, p.q, p.k, p.v, in.prefix), w.o_w, {}, w.o_lora, w.lora_scale));
  Qkv s = project_qkv(w, c, rms_norm(x, w.input_norm, c.rms_norm_eps), in.suffix.cos, in.suffix.sin);
  at::Tensor k = at::cat({p.k.index_select(0, in.row_of), s.k}, 1);
  at::Tensor v = at::cat({p.v.index_select(0, in.row_of), s.v}, 1);
  return {xp_out, mlp_block(w, c, x + project(attend(c, s.q, k, v, in.suffix), w.o_w, {}, w.o_lora, w.lora_scale))};
}

// split_layer under activation checkpointing (as CheckpointedLayer: the forward keeps only
// the layer's inputs, the backward re-runs it with autograd on). The SplitInputs outlive the
// backward only while the graph does: they are copied into the saved tensors here.
struct CheckpointedSplitLayer : public torch::autograd::Function<CheckpointedSplitLayer> {
  static variable_list forward(AutogradContext* ctx, at::Tensor xp, at::Tensor x, at::TensorList params, int64_t layer,
                               bool last, const CausalLM::Impl* impl, const SplitInputs* in) {
    const auto& pa = in->prefix;
    const auto& sa = in->suffix;
    std::vector<at::Tensor> saved = {xp, x, pa.cos, pa.sin, pa.mask, sa.cos, sa.sin, sa.mask, in->row_of};
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["last"] = last;
    ctx->saved_data["prefix_causal"] = pa.is_causal;
    ctx->saved_data["impl"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(impl));
    auto [xp_out, x_out] = split_layer(impl->layers[layer], impl->config, xp, x, *in, last);
    if (last) return {x_out};
    return {x_out, xp_out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const auto* impl = reinterpret_cast<const CausalLM::Impl*>(static_cast<intptr_t>(ctx->saved_data["impl"].toInt()));
    const bool last = ctx->saved_data["last"].toBool();
    SplitInputs in;
    in.prefix = AttnInputs{saved[2], saved[3], saved[4], ctx->saved_data["prefix_causal"].toBool(), {}};
    in.suffix = AttnInputs{saved[5], saved[6], saved[7], false, {}};
    in.row_of = saved[8];
    // xp, x, each param, then layer, last, impl, in; outputs as forward's: x', then xp' unless last
    return recompute_layer_gradients(*impl, ctx->saved_data["layer"].toInt(), {saved[0], saved[1]},
                                     {saved.begin() + 9, saved.end()}, grad_out, 4,
                                     [&](const LayerWeights& w, const std::vector<at::Tensor>& acts) {
                                       auto [xp_out, x_out] = split_layer(w, impl->config, acts[0], acts[1], in, last);
                                       return std::vector<at::Tensor>{x_out, xp_out};
                                     });
  }
};

// The final hidden states at the scoring positions T-R-1 .. T-2 of a padded batch ([B, R, C]),
// computed in two parts that do less work than decoder_stack over all T columns:
//   prefix: columns 0 .. P-2 (P = T-R, the prompt without its last token) of each distinct
//     prefix once (rows of a GRPO group share their prompt: 1 of n rows is computed), and
//     of the last layer only the keys/values (no query, attention output or MLP: the
//     prefix's last-layer outputs are never scored);
//   suffix: columns P-1 .. T-2 of every row (the R scoring positions), each layer attending
//     over its row's prefix keys/values (gathered from the distinct prefixes) then its own.
// Column T-1 (the last target) is never a query or a key of a scoring position. Every
// scoring query sees exactly the keys of the padded path (causal AND key-is-a-token, OR
// itself), so the result is the padded path's up to fp32 rounding. Autograd flows back
// through the gather into the shared prefix (its gradient sums over the rows sharing it).
at::Tensor scoring_hidden_states(const CausalLM::Impl& m, const at::Tensor& ids, const at::Tensor& mask,
                                 const at::Tensor& pos, int64_t R) {
  const ModelConfig& c = m.config;
  const int64_t B = ids.size(0), T = ids.size(1), P1 = T - R - 1;  // prefix length (may be 0)
  const auto bool_opt = ids.options().dtype(at::kBool);
  // Suffix: R queries over P1 prefix keys then R own keys.
  at::Tensor sfx_mask = at::ones({R, R}, bool_opt).tril().logical_and(mask.narrow(1, P1, R).view({B, 1, 1, R}))
                            .logical_or(at::eye(R, bool_opt));  // [B, 1, R, R]
  AttnInputs sa;
  std::tie(sa.cos, sa.sin) = rope_tables(m.inv_freq, pos.narrow(1, P1, R), m.dtype);
  at::Tensor x = at::embedding(m.embed, ids.narrow(1, P1, R));  // [B, R, C]
  const bool checkpoint = m.checkpointing && at::GradMode::is_enabled();
  if (P1 == 0) {
    sa.mask = make_mask(sfx_mask, c);
    return decoder_stack(m, x, sa);
  }
  // Distinct prefixes (ids, mask and positions of columns 0 .. P1-1) and each row's index.
  at::Tensor key = at::cat({ids.narrow(1, 0, P1), mask.narrow(1, 0, P1).to(at::kLong), pos.narrow(1, 0, P1)}, 1);
  auto [uniq, inverse, counts] = at::unique_dim(key.cpu(), 0, /*sorted=*/true, /*return_inverse=*/true);
  const int64_t U = uniq.size(0);
  at::Tensor row_of = inverse.to(ids.device());                                       // [B] -> 0..U-1
  at::Tensor first = at::empty({U}, at::kLong).index_put_({inverse}, at::arange(B, at::kLong)).to(ids.device());
  at::Tensor p_ids = ids.narrow(1, 0, P1).index_select(0, first), p_keys = mask.narrow(1, 0, P1).index_select(0, first);
  AttnInputs pa;
  std::tie(pa.cos, pa.sin) = rope_tables(m.inv_freq, pos.narrow(1, 0, P1).index_select(0, first), m.dtype);
  if (p_keys.all().item<bool>()) {
    pa.is_causal = true;
  } else {
    at::Tensor causal = at::ones({P1, P1}, bool_opt).tril();
    pa.mask = make_mask(causal.logical_and(p_keys.view({U, 1, 1, P1})).logical_or(at::eye(P1, bool_opt)), c);
  }
  sa.mask = make_mask(at::cat({mask.narrow(1, 0, P1).view({B, 1, 1, P1}).expand({B, 1, R, P1}), sfx_mask}, 3), c);
  at::Tensor xp = at::embedding(m.embed, p_ids);  // [U, P1, C]
  const size_t L = m.layers.size();
  const SplitInputs in{pa, sa, row_of};
  for (size_t l = 0; l < L; ++l) {
    const bool last = l + 1 == L;
    if (checkpoint) {
      LayerWeights w = m.layers[l];
      std::vector<at::Tensor> params;
      for (at::Tensor* p : compute_slots(w, c)) params.push_back(*p);
      auto out = CheckpointedSplitLayer::apply(xp, x, at::TensorList(params), static_cast<int64_t>(l), last, &m, &in);
      x = out[0];
      if (!last) xp = out[1];
    } else {
      std::tie(xp, x) = split_layer(m.layers[l], c, xp, x, in, last);
    }
  }
  return rms_norm(x, m.final_norm, c.rms_norm_eps);
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

}  // namespace

// ---- construction ----

std::map<std::string, std::string> sdpa_backends() {
  std::lock_guard<std::mutex> lock(g_sdpa_mutex);
  return sdpa_seen();
}

std::vector<at::Tensor*> CausalLM::Impl::slots() {
  std::vector<at::Tensor*> s = {&embed};
  for (auto& l : layers) {
    auto ls = layer_slots(l, config);
    s.insert(s.end(), ls.begin(), ls.end());
  }
  s.push_back(&final_norm);
  if (!config.tie_word_embeddings) s.push_back(&lm_head);
  return s;
}

CausalLM::Impl::Impl(ModelConfig cfg, at::ScalarType dt, at::Device dev)
    : config(std::move(cfg)), dtype(dt), device(dev) {
  if (dt != at::kFloat && dt != at::kBFloat16 && dt != at::kHalf)
    throw ValueError(str("model dtype: got ", c10::toString(dt), ", expected Float, BFloat16 or Half"));
  layers.resize(config.num_hidden_layers);
  auto shapes = config.parameter_shapes();
  auto ptrs = slots();
  TORCH_CHECK(shapes.size() == ptrs.size(), "parameter list out of sync with the config");
  at::TensorOptions opt = at::TensorOptions().dtype(dt).device(dev);
  for (size_t i = 0; i < ptrs.size(); ++i) *ptrs[i] = at::empty(shapes[i].second, opt).requires_grad_(true);
  if (config.tie_word_embeddings) lm_head = embed;

  // RoPE inverse frequencies, computed in fp32 exactly as transformers does.
  const int64_t D = config.head_dim;
  at::Tensor exponents = at::arange(0, D, 2, at::kLong).to(at::kFloat) / static_cast<double>(D);
  at::Tensor inv = 1.0 / at::pow(config.rope_theta, exponents);
  if (config.rope_scaling.type == "llama3") {
    // Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between.
    const auto& r = config.rope_scaling;
    double ctx = static_cast<double>(r.original_max_position_embeddings);
    double low_wavelen = ctx / r.low_freq_factor, high_wavelen = ctx / r.high_freq_factor;
    at::Tensor wavelen = 2 * M_PI / inv;
    at::Tensor scaled = at::where(wavelen > low_wavelen, inv / r.factor, inv);
    at::Tensor smooth = (ctx / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
    at::Tensor blended = (1 - smooth) * scaled / r.factor + smooth * scaled;
    at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv = at::where(medium, blended, scaled);
  }
  inv_freq = inv.to(dev);
}

CausalLM::CausalLM(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CausalLM::CausalLM(ModelConfig config, at::ScalarType dtype, at::Device device)
    : impl_(std::make_unique<Impl>(std::move(config), dtype, device)) {
  at::NoGradGuard no_grad;
  auto shapes = impl_->config.parameter_shapes();
  auto ptrs = impl_->slots();
  for (size_t i = 0; i < ptrs.size(); ++i) {
    const std::string& name = shapes[i].first;
    if (name.ends_with("norm.weight")) ptrs[i]->fill_(1.0);
    else if (name.ends_with(".bias")) ptrs[i]->zero_();
    else ptrs[i]->normal_(0.0, 0.02);
  }
}

CausalLM::~CausalLM() = default;
CausalLM::CausalLM(CausalLM&&) noexcept = default;
CausalLM& CausalLM::operator=(CausalLM&&) noexcept = default;

const ModelConfig& CausalLM::config() const { return impl_->config; }
at::ScalarType CausalLM::dtype() const { return impl_->dtype; }
at::Device CausalLM::device() const { return impl_->device; }

std::vector<std::pair<std::string, at::Tensor>> CausalLM::named_parameters() const {
  auto shapes = impl_->config.parameter_shapes();
  auto ptrs = impl_->slots();
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(ptrs.size());
  for (size_t i = 0; i < ptrs.size(); ++i) out.emplace_back(shapes[i].first, *ptrs[i]);
  return out;
}

std::vector<at::Tensor> CausalLM::parameters() const {
  std::vector<at::Tensor> out;
  for (at::Tensor* p : impl_->slots()) out.push_back(*p);
  return out;
}

void CausalLM::set_requires_grad(bool requires_grad) {
  for (at::Tensor* p : impl_->slots()) p->requires_grad_(requires_grad);
}

void CausalLM::copy_parameters_from(const CausalLM& other) {
  auto mine = impl_->slots();
  auto theirs = other.impl_->slots();
  auto a = impl_->config.parameter_shapes(), b = other.impl_->config.parameter_shapes();
  if (a != b) throw ValueError("copy_parameters_from: the two models have different architectures");
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < mine.size(); ++i) mine[i]->copy_(*theirs[i]);
}

double LoraConfig::scale() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(rank)) : alpha / static_cast<double>(rank);
}

const std::vector<std::string>& lora_module_names() {
  static const std::vector<std::string> names = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return names;
}

void CausalLM::attach_lora(const LoraConfig& config, std::optional<at::ScalarType> adapter_dtype) {
  Impl& m = *impl_;
  if (m.lora) throw ValueError("attach_lora: the model already has LoRA adapters");
  if (config.rank < 1) throw ValueError(str("LoRA rank: must be >= 1, got ", config.rank));
  if (!std::isfinite(config.alpha)) throw ValueError("LoRA alpha: must be finite");
  if (config.target_modules.empty()) throw ValueError("LoRA target_modules: empty");
  const auto& known = lora_module_names();
  for (const auto& t : config.target_modules)
    if (std::find(known.begin(), known.end(), t) == known.end())
      throw ValueError(str("LoRA target_modules: unknown module '", t,
                           "'; expected all-linear or q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"));
  at::NoGradGuard no_grad;
  const at::TensorOptions opt = at::TensorOptions().dtype(adapter_dtype.value_or(m.dtype)).device(m.device);
  for (auto& w : m.layers) {
    const auto slots = lora_slots(w);
    for (size_t i = 0; i < slots.size(); ++i) {
      if (std::find(config.target_modules.begin(), config.target_modules.end(), known[i]) ==
          config.target_modules.end())
        continue;
      const int64_t out = slots[i].weight->size(0), in = slots[i].weight->size(1);
      // PEFT: kaiming_uniform_(A, a=sqrt(5)), whose bound gain * sqrt(3 / fan_in) is 1 / sqrt(in).
      const double bound = 1.0 / std::sqrt(static_cast<double>(in));
      slots[i].lora->a = at::empty({config.rank, in}, opt).uniform_(-bound, bound).requires_grad_(true);
      slots[i].lora->b = at::zeros({out, config.rank}, opt).requires_grad_(true);
    }
  }
  m.lora = config;
  set_lora_enabled(true);
}

const std::optional<LoraConfig>& CausalLM::lora() const { return impl_->lora; }

void CausalLM::set_lora_enabled(bool enabled) {
  Impl& m = *impl_;
  m.lora_enabled = enabled;
  const double scale = m.lora && enabled ? m.lora->scale() : 0.0;
  for (auto& w : m.layers) w.lora_scale = scale;
}

bool CausalLM::lora_enabled() const { return impl_->lora && impl_->lora_enabled; }

std::vector<std::pair<std::string, at::Tensor>> CausalLM::lora_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t l = 0; l < impl_->layers.size(); ++l)
    for (const LoraSlot& slot : lora_slots(impl_->layers[l])) {
      if (!slot.lora->a.defined()) continue;
      const std::string prefix = str("base_model.model.model.layers.", l, ".", slot.module);
      out.emplace_back(prefix + ".lora_A.weight", slot.lora->a);
      out.emplace_back(prefix + ".lora_B.weight", slot.lora->b);
    }
  return out;
}

void CausalLM::merge_lora() {
  Impl& m = *impl_;
  if (!m.lora) throw ValueError("merge_lora: the model has no LoRA adapters");
  const double scale = m.lora->scale();
  at::NoGradGuard no_grad;
  for (auto& w : m.layers) {
    for (const LoraSlot& slot : lora_slots(w)) {
      if (!slot.lora->a.defined()) continue;
      slot.weight->add_((at::matmul(slot.lora->b, slot.lora->a) * scale).to(slot.weight->scalar_type()));
      *slot.lora = LoraPair{};
    }
    w.lora_scale = 0;
  }
  m.lora.reset();
}

void CausalLM::set_gradient_checkpointing(bool enabled) { impl_->checkpointing = enabled; }
bool CausalLM::gradient_checkpointing() const { return impl_->checkpointing; }

// ---- forward modes ----

at::Tensor CausalLM::hidden_states(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                   const at::Tensor& position_ids) const {
  const Impl& m = *impl_;
  check_batch(input_ids, attention_mask, position_ids);
  const int64_t B = input_ids.size(0), T = input_ids.size(1);
  at::Tensor ids = input_ids.to(m.device, at::kLong);
  at::Tensor pos = position_ids.defined() ? position_ids.to(m.device, at::kLong)
                                          : default_positions(ids, attention_mask.defined() ? attention_mask.to(m.device) : at::Tensor());
  AttnInputs a;
  std::tie(a.cos, a.sin) = rope_tables(m.inv_freq, pos, m.dtype);
  // A mask without padding is plain causal attention: the flag lets SDPA pick its fused
  // causal kernels (and native GQA) instead of reading a [B, 1, T, T] mask.
  if (attention_mask.defined() && !attention_mask.to(at::kBool).all().item<bool>()) {
    // Causal AND key-is-a-token, OR the diagonal: a padding query would otherwise see no
    // key at all, and SDPA's NaN for an empty row would leak into valid rows through V.
    at::Tensor keys = attention_mask.to(m.device).to(at::kBool).view({B, 1, 1, T});
    at::Tensor causal = at::ones({T, T}, ids.options().dtype(at::kBool)).tril();
    at::Tensor eye = at::eye(T, ids.options().dtype(at::kBool));
    a.mask = make_mask(causal.logical_and(keys).logical_or(eye), m.config);  // [B, 1, T, T]
  } else {
    a.is_causal = true;
  }
  return decoder_stack(m, at::embedding(m.embed, ids), a);
}

at::Tensor CausalLM::packed_hidden_states(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                          const std::vector<int64_t>& seq_lens) const {
  const Impl& m = *impl_;
  TORCH_CHECK(input_ids.dim() == 1, "packed input_ids must be [N], got ", input_ids.sizes());
  TORCH_CHECK(input_ids.scalar_type() == at::kLong || input_ids.scalar_type() == at::kInt,
              "packed input_ids must be integer");
  TORCH_CHECK(position_ids.sizes() == input_ids.sizes(), "packed position_ids ", position_ids.sizes(),
              " must match input_ids ", input_ids.sizes());
  int64_t total = 0;
  for (int64_t L : seq_lens) {
    if (L < 1) throw ValueError(str("packed forward: sequence length ", L, ", expected >= 1"));
    total += L;
  }
  if (total != input_ids.size(0))
    throw ValueError(str("packed forward: sequence lengths sum to ", total, " but the stream has ",
                         input_ids.size(0), " tokens"));
  at::Tensor ids = input_ids.to(m.device, at::kLong).unsqueeze(0);  // [1, N]
  AttnInputs a;
  std::tie(a.cos, a.sin) = rope_tables(m.inv_freq, position_ids.to(m.device, at::kLong).unsqueeze(0), m.dtype);
  a.is_causal = true;
  if (seq_lens.size() > 1) a.seq_lens = seq_lens;  // one sequence: plain causal attention
  return decoder_stack(m, at::embedding(m.embed, ids), a).squeeze(0);  // [N, C]
}

at::Tensor CausalLM::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                             const at::Tensor& position_ids) const {
  return at::linear(hidden_states(input_ids, attention_mask, position_ids), impl_->lm_head);
}

TokenLogProbs CausalLM::log_probs(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                  const at::Tensor& position_ids, const at::Tensor& targets,
                                  const LogProbOptions& options) const {
  check_ids(targets, "targets");
  const int64_t B = input_ids.size(0), T = input_ids.size(1), R = targets.size(1);
  TORCH_CHECK(targets.size(0) == B, "targets rows ", targets.size(0), " != input_ids rows ", B);
  TORCH_CHECK(R >= 1 && R <= T - 1, "targets length ", R, " must be in [1, T-1] for T = ", T);
  if (!(options.temperature > 0) || !std::isfinite(options.temperature))
    throw ValueError(str("log_probs temperature: got ", options.temperature, ", expected a finite value > 0"));
  if (options.chunk_tokens < 1) throw ValueError(str("log_probs chunk_tokens: got ", options.chunk_tokens, ", expected >= 1"));
  if (options.remove_padding) return packed_log_probs(input_ids, attention_mask, position_ids, targets, options);
  at::Tensor h;
  if (options.split_prompt) {
    const Impl& m = *impl_;
    check_batch(input_ids, attention_mask, position_ids);
    at::Tensor ids = input_ids.to(m.device, at::kLong);
    at::Tensor mask = attention_mask.defined() ? attention_mask.to(m.device).to(at::kBool)
                                               : at::ones({B, T}, ids.options().dtype(at::kBool));
    at::Tensor pos = position_ids.defined() ? position_ids.to(m.device, at::kLong) : default_positions(ids, mask);
    h = scoring_hidden_states(m, ids, mask, pos, R);
  } else {
    h = hidden_states(input_ids, attention_mask, position_ids).narrow(1, T - R - 1, R);  // [B, R, C]
  }
  at::Tensor t = targets.to(impl_->device, at::kLong).reshape({B * R});
  auto out = ChunkedLogProbs::apply(h.reshape({B * R, h.size(2)}), impl_->lm_head, t, options.temperature,
                                    options.with_entropy, options.chunk_tokens, options.autograd_backward);
  TokenLogProbs r;
  r.log_probs = out[0].view({B, R});
  if (options.with_entropy) r.entropy = out[1].view({B, R});
  return r;
}

// log_probs() with options.remove_padding: unpad -> packed_hidden_states -> score the
// positions whose scoring token and target are both real -> scatter back to [B, R].
TokenLogProbs CausalLM::packed_log_probs(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                         const at::Tensor& position_ids, const at::Tensor& targets,
                                         const LogProbOptions& options) const {
  const Impl& m = *impl_;
  check_batch(input_ids, attention_mask, position_ids);
  const int64_t B = input_ids.size(0), T = input_ids.size(1), R = targets.size(1);
  at::Tensor ids = input_ids.to(m.device, at::kLong);
  at::Tensor mask = attention_mask.defined() ? attention_mask.to(m.device).to(at::kBool)
                                             : at::ones({B, T}, ids.options().dtype(at::kBool));
  at::Tensor pos = position_ids.defined() ? position_ids.to(m.device, at::kLong) : default_positions(ids, mask);
  // Sequence lengths on the host (shapes depend on them); rows without tokens drop out.
  at::Tensor lens = mask.sum(1).to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> seq_lens;
  for (int64_t b = 0; b < B; ++b)
    if (int64_t L = lens.data_ptr<int64_t>()[b]; L > 0) seq_lens.push_back(L);
  at::Tensor flat = mask.reshape({B * T});
  at::Tensor h = packed_hidden_states(ids.reshape({B * T}).masked_select(flat), pos.reshape({B * T}).masked_select(flat),
                                      seq_lens);  // [N, C]
  // Stream index of every real padded position; scored rows of the response window.
  at::Tensor where = (flat.to(at::kLong).cumsum(0) - 1).view({B, T});
  at::Tensor scored = mask.narrow(1, T - R - 1, R).logical_and(mask.narrow(1, T - R, R));  // [B, R]
  at::Tensor rows = where.narrow(1, T - R - 1, R).masked_select(scored);                   // [M]
  at::Tensor t = targets.to(m.device, at::kLong).masked_select(scored);
  auto out = ChunkedLogProbs::apply(h.index_select(0, rows), m.lm_head, t, options.temperature,
                                    options.with_entropy, options.chunk_tokens, options.autograd_backward);
  at::Tensor zeros = at::zeros({B, R}, h.options().dtype(at::kFloat));
  TokenLogProbs r;
  r.log_probs = zeros.masked_scatter(scored, out[0]);
  if (options.with_entropy) r.entropy = zeros.masked_scatter(scored, out[1]);
  return r;
}

int64_t KVCache::length(int64_t slot) const {
  if (slot < 0 || slot >= num_slots()) throw ValueError(str("KV cache slot ", slot, " out of range [0, ", num_slots(), ")"));
  return lengths_[slot];
}
void KVCache::reset(int64_t slot) {
  (void)length(slot);
  lengths_[slot] = 0;
}
void KVCache::reset() { std::fill(lengths_.begin(), lengths_.end(), 0); }

void KVCache::set_length(int64_t slot, int64_t length) {
  (void)this->length(slot);
  if (length < 0 || length > capacity_)
    throw ValueError(str("KVCache::set_length: slot ", slot, " length ", length, " outside 0..", capacity_));
  lengths_[slot] = length;
}

void KVCache::copy_slot(int64_t from, int64_t to) {
  const int64_t n = length(from);
  (void)length(to);
  if (from == to) return;
  for (size_t l = 0; l < k_.size(); ++l) {
    k_[l][to].narrow(keys_transposed_ ? 2 : 1, 0, n).copy_(k_[l][from].narrow(keys_transposed_ ? 2 : 1, 0, n));
    v_[l][to].narrow(1, 0, n).copy_(v_[l][from].narrow(1, 0, n));
  }
  lengths_[to] = n;
}

KVCache CausalLM::new_cache(int64_t num_slots, int64_t capacity) const {
  if (num_slots < 1 || capacity < 1)
    throw ValueError(str("KV cache: got ", num_slots, " slots of ", capacity, " tokens, expected both >= 1"));
  const auto& c = impl_->config;
  KVCache cache;
  cache.capacity_ = capacity;
  cache.lengths_.assign(num_slots, 0);
  auto opt = at::TensorOptions().dtype(impl_->dtype).device(impl_->device);
  // decode_attention() reads keys dimension-major; elsewhere SDPA reads them position-major.
  cache.keys_transposed_ = decode_attention_supports(impl_->dtype, impl_->device);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    cache.k_.push_back(cache.keys_transposed_
                           ? at::zeros({num_slots, c.num_key_value_heads, c.head_dim, capacity}, opt)
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
  DecodingScope decoding;
  auto long_opt = at::TensorOptions().dtype(at::kLong).device(m.device);
  at::Tensor start = at::tensor(starts, at::kLong).to(m.device);                       // [N]
  at::Tensor pos = start.unsqueeze(1) + at::arange(T, long_opt).unsqueeze(0);          // [N, T]
  AttnInputs a;
  std::tie(a.cos, a.sin) = rope_tables(m.inv_freq, pos, m.dtype);
  CacheStep step;
  step.keys_transposed = cache.keys_transposed_;
  step.slot_index = at::tensor(slots, at::kLong).to(m.device).unsqueeze(1);
  step.write_pos = pos;
  step.kv_len = kv_len;
  const int64_t S = cache.num_slots();
  step.read = all_slots ? CacheStep::Read::kAll : 2 * N > S ? CacheStep::Read::kDense : CacheStep::Read::kGather;
  // Key j is visible to the query at absolute position p iff j <= p: that covers both the
  // causal order among the new tokens and the slot's length (stale entries lie beyond).
  // Dense reads attend for every slot; idle ones get position 0 so they see key 0 only.
  // A cache laid out for decode_attention() (keys dimension-major) is read by it at one token
  // per row: no mask, no dense scatter, no gather.
  if (T == 1 && cache.keys_transposed_) {
    step.kernel_slots = at::tensor(slots, at::kLong);
    step.kernel_positions = at::tensor(starts, at::kLong);
  } else {
    at::Tensor query_pos = pos;
    if (step.read == CacheStep::Read::kDense)
      query_pos = at::zeros({S, T}, long_opt).index_copy_(0, step.slot_index.view({-1}), pos);
    a.mask = make_mask((at::arange(kv_len, long_opt).view({1, 1, kv_len}) <= query_pos.unsqueeze(2)).unsqueeze(1),
                       m.config);  // [N or S, 1, T, L]
  }
  at::Tensor x = at::embedding(m.embed, tokens.to(m.device, at::kLong));
  for (size_t l = 0; l < m.layers.size(); ++l) {
    step.k = &cache.k_[l];
    step.v = &cache.v_[l];
    x = layer_forward(m.layers[l], m.config, x, a, &step);
  }
  for (int64_t i = 0; i < N; ++i) cache.lengths_[slots[i]] += counts[i];
  if (options.last_only) {
    at::Tensor last = at::tensor(counts, at::kLong).to(m.device).sub_(1).view({N, 1, 1}).expand({N, 1, x.size(2)});
    x = x.gather(1, last).squeeze(1);  // [N, C]
  }
  return linear_for_decode(rms_norm(x, m.final_norm, m.config.rms_norm_eps), m.lm_head, {});
}

at::Tensor CausalLM::decode_all_slots(KVCache& cache, const at::Tensor& tokens, const at::Tensor& positions) const {
  const Impl& m = *impl_;
  const int64_t S = cache.num_slots(), L = cache.capacity();
  if (static_cast<int64_t>(cache.k_.size()) != m.config.num_hidden_layers)
    throw ValueError("decode_all_slots: the KV cache was made for another model");
  if (tokens.dim() != 2 || tokens.size(0) != S || tokens.size(1) != 1 || tokens.scalar_type() != at::kLong ||
      tokens.device() != m.device)
    throw ValueError(str("decode_all_slots: tokens must be int64 [", S, ", 1] on ", m.device.str()));
  if (positions.dim() != 1 || positions.size(0) != S || positions.scalar_type() != at::kLong ||
      positions.device() != m.device)
    throw ValueError(str("decode_all_slots: positions must be int64 [", S, "] on ", m.device.str()));
  at::NoGradGuard no_grad;
  DecodingScope decoding;
  auto long_opt = at::TensorOptions().dtype(at::kLong).device(m.device);
  at::Tensor pos = positions.view({S, 1});
  AttnInputs a;
  std::tie(a.cos, a.sin) = rope_tables(m.inv_freq, pos, m.dtype);
  CacheStep step;
  step.keys_transposed = cache.keys_transposed_;
  step.slot_index = at::arange(S, long_opt).unsqueeze(1);
  step.write_pos = pos;
  step.kv_len = L;
  step.read = CacheStep::Read::kAll;
  if (cache.keys_transposed_) {  // decode_attention() (see decode())
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
  return linear_for_decode(rms_norm(x, m.final_norm, m.config.rms_norm_eps), m.lm_head, {});
}

}  // namespace rpg::model
