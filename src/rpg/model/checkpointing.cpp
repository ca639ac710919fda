// The layer stack's forwards that bring their own autograd: per-layer activation checkpointing
// (the forward keeps each layer's input only, the backward re-runs the layer) for the padded
// forward and for the split-prompt scoring forward, which computes each distinct prompt prefix
// once.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <tuple>

#include "rpg/model/layer.h"

namespace rpg::model::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

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
                            std::vector<int64_t> seq_lens, std::vector<int64_t> key_start, int64_t layer,
                            const CausalLM::Impl* impl) {
    std::vector<at::Tensor> saved = {x, cos, sin, mask.value_or(at::Tensor())};
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["is_causal"] = is_causal;
    ctx->saved_data["seq_lens"] = seq_lens;
    ctx->saved_data["key_start"] = key_start;
    ctx->saved_data["impl"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(impl));
    AttnInputs a{cos, sin, mask.value_or(at::Tensor()), is_causal, std::move(seq_lens), std::move(key_start)};
    return layer_forward(impl->layers[layer], impl->config, x, a, nullptr);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const auto* impl = reinterpret_cast<const CausalLM::Impl*>(static_cast<intptr_t>(ctx->saved_data["impl"].toInt()));
    const AttnInputs a{saved[1], saved[2], saved[3], ctx->saved_data["is_causal"].toBool(),
                       ctx->saved_data["seq_lens"].toIntVector(), ctx->saved_data["key_start"].toIntVector()};
    // x, each param, then cos, sin, mask, is_causal, seq_lens, key_start, layer, impl
    return recompute_layer_gradients(*impl, ctx->saved_data["layer"].toInt(), {saved[0]},
                                     {saved.begin() + 4, saved.end()}, grad_out, 8,
                                     [&](const LayerWeights& w, const std::vector<at::Tensor>& in) {
                                       return std::vector<at::Tensor>{layer_forward(w, impl->config, in[0], a, nullptr)};
                                     });
  }
};

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
    ctx->saved_data["prefix_key_start"] = pa.key_start;
    ctx->saved_data["suffix_key_start"] = sa.key_start;
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
    in.prefix = AttnInputs{saved[2], saved[3], saved[4], ctx->saved_data["prefix_causal"].toBool(), {},
                           ctx->saved_data["prefix_key_start"].toIntVector()};
    in.suffix = AttnInputs{saved[5], saved[6], saved[7], false, {}, ctx->saved_data["suffix_key_start"].toIntVector()};
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

}  // namespace

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
                                   a.seq_lens, a.key_start, static_cast<int64_t>(l), &m);
    } else {
      x = layer_forward(m.layers[l], m.config, x, a, nullptr);
    }
  }
  return rms_norm(x, m.final_norm, m.config.rms_norm_eps);
}

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
  // Left and right padding only: the suffix (and prefix) attend causally from each row's first
  // token without a mask where that is the faster form (AttnInputs::key_start).
  const std::optional<std::vector<int64_t>> starts = contiguous_key_starts(mask);
  const int64_t min_start = starts ? *std::min_element(starts->begin(), starts->end()) : 0;
  const bool suffix_from_start = starts && key_start_form_pays(R, P1 + R, min_start);
  if (P1 == 0) {
    if (suffix_from_start) {
      sa.key_start = *starts;
    } else {
      sa.mask = make_mask(sfx_mask, c);
    }
    return decoder_stack(m, x, sa);
  }
  // Distinct prefixes (ids, mask and positions of columns 0 .. P1-1) and each row's index.
  at::Tensor key = at::cat({ids.narrow(1, 0, P1), mask.narrow(1, 0, P1).to(at::kLong), pos.narrow(1, 0, P1)}, 1);
  auto [uniq, inverse, counts] = at::unique_dim(key.cpu(), 0, /*sorted=*/true, /*return_inverse=*/true);
  const int64_t U = uniq.size(0);
  at::Tensor row_of = inverse.to(ids.device());                                       // [B] -> 0..U-1
  const at::Tensor first_cpu = at::empty({U}, at::kLong).index_put_({inverse}, at::arange(B, at::kLong));
  at::Tensor first = first_cpu.to(ids.device());
  at::Tensor p_ids = ids.narrow(1, 0, P1).index_select(0, first), p_keys = mask.narrow(1, 0, P1).index_select(0, first);
  AttnInputs pa;
  std::tie(pa.cos, pa.sin) = rope_tables(m.inv_freq, pos.narrow(1, 0, P1).index_select(0, first), m.dtype);
  if (p_keys.all().item<bool>()) {
    pa.is_causal = true;
  } else if (starts) {
    const int64_t* row = first_cpu.data_ptr<int64_t>();
    for (int64_t u = 0; u < U; ++u) pa.key_start.push_back((*starts)[static_cast<size_t>(row[u])]);
  } else {
    at::Tensor causal = at::ones({P1, P1}, bool_opt).tril();
    pa.mask = make_mask(causal.logical_and(p_keys.view({U, 1, 1, P1})).logical_or(at::eye(P1, bool_opt)), c);
  }
  if (suffix_from_start) {
    sa.key_start = *starts;
  } else {
    sa.mask = make_mask(at::cat({mask.narrow(1, 0, P1).view({B, 1, 1, P1}).expand({B, 1, R, P1}), sfx_mask}, 3), c);
  }
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

}  // namespace rpg::model::detail
