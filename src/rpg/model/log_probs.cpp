// Token log-probs and entropies (the trainer's scoring pass): the padded, split-prompt and
// packed (remove_padding) forms, each ending in the lm_head applied in row chunks.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>

#include "rpg/core/error.h"
#include "rpg/model/decode_elementwise.h"
#include "rpg/model/layer.h"

namespace rpg::model {
namespace detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Log-probs / entropies of target tokens through the lm_head in row chunks. Unless `keep`,
// forward and backward both compute each chunk's logits, so autograd never stores [N, V].
//   log p_t = s_t - lse(s),  s = z / tau,  H = lse(s) - sum_k p_k s_k
//   d log p_t / ds = onehot_t - p,  dH/ds_k = -p_k (log p_k + H)
// Each chunk works in at most two [n, V] fp32 buffers (updated in place; row-wise dot
// products go through row_dot instead of an elementwise temporary), so the peak is about
// 2 * n * V * 4 bytes plus the [n, V] matmul output in the weight dtype. With `keep` the
// forward also writes each chunk's log p (the backward's first value, computed the same way)
// into one [N, V] fp32 tensor, and the backward starts from it instead of the lm_head GEMM.
struct ChunkedLogProbs : public torch::autograd::Function<ChunkedLogProbs> {
  // Row-wise sum_k a[r, k] * b[r, k] without an [n, V] temporary: on the CPU one pass
  // (decode_elementwise.h: bmm's [n, 1, V] @ [n, V, 1] ran at ~1 GFLOP/s there), else bmm.
  static at::Tensor row_dot(const at::Tensor& a, const at::Tensor& b) {
    if (a.device().is_cpu() && a.is_contiguous() && b.is_contiguous()) return dot_rows(a, b);
    return at::bmm(a.unsqueeze(1), b.unsqueeze(2)).view({a.size(0)});
  }
  // sum_k p_k z_k of each row (p = softmax(z), lse = logsumexp(z)): the entropy's second term.
  // fp32 CPU rows in one pass without an [n, V] temporary (decode_elementwise.h).
  static at::Tensor expected_logits(const at::Tensor& z, const at::Tensor& lse) {
    if (z.device().is_cpu() && z.is_contiguous()) return expected_logit_rows(z, lse);
    return row_dot(at::softmax(z, -1), z);
  }
  // fp32 logits / tau of rows [s, s + n): [n, V].
  static at::Tensor scaled_logits(const at::Tensor& hidden, const at::Tensor& weight, int64_t s, int64_t n,
                                  double temperature) {
    at::Tensor z = at::matmul(hidden.narrow(0, s, n), weight.t());
    z = z.scalar_type() == at::kFloat ? z : z.to(at::kFloat);
    if (temperature != 1.0) z.div_(temperature);
    return z;
  }
  // log p of scaled logits z as the backward uses it: z - logsumexp(z) with autograd_backward
  // (autograd's own form; `lse` is the forward's logsumexp(z), the same reduction), else
  // log_softmax(z). Written into `out`.
  static void log_p_into(at::Tensor out, const at::Tensor& z, const at::Tensor& lse, bool autograd_backward) {
    if (autograd_backward) at::sub_out(out, z, lse.unsqueeze(1));
    else at::_log_softmax_out(out, z, -1, /*half_to_float=*/false);
  }

  static variable_list forward(AutogradContext* ctx, at::Tensor hidden, at::Tensor weight, at::Tensor targets,
                               double temperature, bool with_entropy, int64_t chunk, bool autograd_backward,
                               bool keep) {
    const int64_t N = hidden.size(0);
    at::Tensor lp = at::empty({N}, hidden.options().dtype(at::kFloat));
    at::Tensor ent = at::empty({with_entropy ? N : 0}, hidden.options().dtype(at::kFloat));
    at::Tensor kept = keep ? at::empty({N, weight.size(0)}, hidden.options().dtype(at::kFloat)) : at::Tensor();
    for (int64_t s = 0; s < N; s += chunk) {
      int64_t n = std::min(chunk, N - s);
      at::Tensor z = scaled_logits(hidden, weight, s, n, temperature);
      at::Tensor lse = at::logsumexp(z, -1);
      lp.narrow(0, s, n).copy_(z.gather(1, targets.narrow(0, s, n).unsqueeze(1)).squeeze(1) - lse);
      if (with_entropy) ent.narrow(0, s, n).copy_(lse - expected_logits(z, lse));
      if (keep) log_p_into(kept.narrow(0, s, n), z, lse, autograd_backward);
    }
    // An output the loss does not use (the entropy when entropy_coeff is 0, a metric only)
    // gets an undefined gradient instead of zeros: backward skips its term.
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({hidden, weight, targets});
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["with_entropy"] = with_entropy;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["autograd_backward"] = autograd_backward;
    // Not a saved variable: the backward overwrites it in place and then drops it, so a second
    // backward (retain_graph) finds none and recomputes.
    ctx->saved_data["kept"] = kept;
    return {lp, ent};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    at::Tensor hidden = saved[0], weight = saved[1], targets = saved[2];
    double temperature = ctx->saved_data["temperature"].toDouble();
    bool with_entropy = ctx->saved_data["with_entropy"].toBool();
    int64_t chunk = ctx->saved_data["chunk"].toInt();
    const bool autograd_backward = ctx->saved_data["autograd_backward"].toBool();
    at::Tensor kept = ctx->saved_data["kept"].toTensor();
    ctx->saved_data["kept"] = at::Tensor();
    at::Tensor g_lp = grad_out[0], g_ent = with_entropy ? grad_out[1] : at::Tensor();
    const int64_t N = hidden.size(0);
    bool need_h = hidden.requires_grad(), need_w = weight.requires_grad();
    at::Tensor grad_h = need_h ? at::empty_like(hidden) : at::Tensor();
    // fp32 accumulator: summing many chunk products in bf16 would lose the small ones. The
    // first chunk's product starts it (no zero-filled [V, C] to add to: 0 + x is x exactly).
    at::Tensor grad_w;
    for (int64_t s = 0; s < N; s += chunk) {
      int64_t n = std::min(chunk, N - s);
      at::Tensor h = hidden.narrow(0, s, n);
      // log p. autograd_backward: s - lse(s), as autograd differentiates the forward's
      // gather - logsumexp (logsumexp's backward is exp(s - lse)): the same fp32 gradient as
      // transformers + verl's logprobs_from_logits, bit for bit (log_softmax's own rounding of
      // log p differs by an ulp, which the gradient of a cancelling sum amplifies). Otherwise
      // log_softmax (see LogProbOptions::autograd_backward for why that stays the default).
      at::Tensor gs;
      if (kept.defined()) {
        gs = kept.narrow(0, s, n);
      } else {
        at::Tensor z = scaled_logits(hidden, weight, s, n, temperature);
        gs = at::empty_like(z);
        log_p_into(gs, z, autograd_backward ? at::logsumexp(z, -1) : at::Tensor(), autograd_backward);
      }
      if (g_ent.defined()) {
        at::Tensor p = gs.exp();
        at::Tensor H = -row_dot(p, gs).unsqueeze(1);                        // [n, 1]
        gs.add_(H).mul_(p).mul_(-g_ent.narrow(0, s, n).unsqueeze(1));     // dH/ds * g_ent
        if (g_lp.defined()) gs.sub_(p.mul_(g_lp.narrow(0, s, n).unsqueeze(1)));  // - p * g
      } else if (g_lp.defined()) {
        // - p * g in place (no second [n, V] buffer): p * -g is -(p * g) exactly.
        gs.exp_().mul_(-g_lp.narrow(0, s, n).unsqueeze(1));
      } else {
        gs.zero_();
      }
      if (g_lp.defined())
        gs.scatter_add_(1, targets.narrow(0, s, n).unsqueeze(1), g_lp.narrow(0, s, n).unsqueeze(1));  // + onehot * g
      if (temperature != 1.0) gs.div_(temperature);
      // The logits' gradient in the weight's dtype: what autograd hands both products of a
      // bf16 lm_head. grad_w sums its chunks in fp32 either way; with autograd_backward its
      // factor is that rounded gradient too (the fork's bf16 run), else the fp32 one.
      const bool low = gs.scalar_type() != weight.scalar_type();
      at::Tensor gz = low && (need_h || autograd_backward) ? gs.to(weight.scalar_type()) : gs;
      if (need_h) grad_h.narrow(0, s, n).copy_(at::matmul(gz, weight));
      if (need_w) {
        const at::Tensor factor = low && autograd_backward ? gz.to(at::kFloat) : gs;
        const at::Tensor hf = h.scalar_type() == at::kFloat ? h : h.to(at::kFloat);
        if (grad_w.defined()) grad_w.addmm_(factor.t(), hf);
        else grad_w = at::mm(factor.t(), hf);
      }
    }
    if (need_w && !grad_w.defined()) grad_w = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));  // N = 0
    return {grad_h, need_w ? grad_w.to(weight.scalar_type()) : at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

ChunkedLogProbsOut chunked_log_probs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                     const LogProbOptions& options) {
  // Keep only where a backward can follow: autograd records this call (grad mode on and an
  // input that needs a gradient); a no-grad pass (old / reference log-probs) keeps nothing.
  const int64_t bytes = hidden.size(0) * weight.size(0) * 4;
  const bool keep = at::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad()) &&
                    bytes <= options.keep_logits_bytes;
  auto out = ChunkedLogProbs::apply(hidden, weight, targets, options.temperature, options.with_entropy,
                                    options.chunk_tokens, options.autograd_backward, keep);
  return {out[0], out[1], keep ? bytes : 0};
}

}  // namespace detail

using namespace detail;

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
  auto out = chunked_log_probs(h.reshape({B * R, h.size(2)}), impl_->lm_head, t, options);
  TokenLogProbs r;
  r.log_probs = out.log_probs.view({B, R});
  if (options.with_entropy) r.entropy = out.entropy.view({B, R});
  r.kept_logits_bytes = out.kept_logits_bytes;
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
  auto out = chunked_log_probs(h.index_select(0, rows), m.lm_head, t, options);
  at::Tensor zeros = at::zeros({B, R}, h.options().dtype(at::kFloat));
  TokenLogProbs r;
  r.log_probs = zeros.masked_scatter(scored, out.log_probs);
  if (options.with_entropy) r.entropy = zeros.masked_scatter(scored, out.entropy);
  r.kept_logits_bytes = out.kept_logits_bytes;
  return r;
}

}  // namespace rpg::model
