// CausalLM's construction, parameters, LoRA adapters and the padded / packed training
// forwards. The layer arithmetic is layer.cpp, checkpointing and split-prompt scoring
// checkpointing.cpp, log-probs log_probs.cpp, the KV cache and decoding decode.cpp.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>

#include "rpg/core/error.h"
#include "rpg/model/impl.h"
#include "rpg/model/layer.h"

namespace rpg::model {

using namespace detail;

// ---- construction ----

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
    // Left and right padding only (the trainer's batches): causal attention from each row's
    // first token, without a mask (AttnInputs::key_start).
    if (auto starts = contiguous_key_starts(attention_mask)) {
      a.key_start = std::move(*starts);
      return decoder_stack(m, at::embedding(m.embed, ids), a);
    }
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

}  // namespace rpg::model
