#include "model_test_util.h"

#include <ATen/core/grad_mode.h>

#include "rpg/core/error.h"
#include "rpg/model/safetensors.h"

namespace rpg::model::test {

std::map<std::string, at::Tensor> read_tensors(const std::filesystem::path& path) {
  namespace st = safetensors;
  st::MappedFile f(path);
  st::Header h = st::parse(f.data(), f.size(), path.string());
  std::map<std::string, at::Tensor> out;
  for (const auto& t : h.tensors) {
    at::ScalarType type;
    switch (t.dtype) {
      case st::DType::kF32: type = at::kFloat; break;
      case st::DType::kBF16: type = at::kBFloat16; break;
      case st::DType::kF16: type = at::kHalf; break;
      case st::DType::kI64: type = at::kLong; break;
      default: throw FormatError(str(path.string(), ": test reader cannot read ", t.name));
    }
    void* p = const_cast<uint8_t*>(f.data() + h.data_start + t.begin);
    out[t.name] = at::from_blob(p, t.shape, at::TensorOptions().dtype(type)).clone();
  }
  return out;
}

std::string tiny_config_json(const std::string& model_type, const std::string& extra) {
  std::string c = R"({"model_type": ")" + model_type + R"(", "vocab_size": 300, "hidden_size": 48,
    "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5, "max_position_embeddings": 512, "dtype": "float32")";
  if (model_type == "qwen3") c += R"(, "head_dim": 12)";
  if (model_type == "llama")
    c += R"(, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16})";
  if (!extra.empty()) c += ", " + extra;
  return c + "}";
}

CausalLM random_model(const std::string& model_type, at::ScalarType dtype, const std::string& extra, uint64_t seed,
                      at::Device device) {
  at::manual_seed(seed);
  CausalLM m(ModelConfig::from_json(tiny_config_json(model_type, extra), "test config"), dtype);
  at::NoGradGuard no_grad;
  for (auto& [name, p] : m.named_parameters()) {
    if (name.find("norm") != std::string::npos) p.add_(at::randn_like(p) * 0.2);
    else if (name.ends_with(".bias")) p.copy_(at::randn_like(p) * 0.1);
    else p.mul_(2.5);  // std 0.05: logits far enough from uniform to be informative
  }
  if (device.is_cpu()) return m;
  CausalLM on(m.config(), dtype, device);  // the same values on every device
  on.copy_parameters_from(m);
  return on;
}

PaddedBatch padded_batch(int64_t vocab, uint64_t seed) {
  PaddedBatch b;
  b.prompt_lens = {6, 3, 1, 5};
  b.response_lens = {5, 2, 4, 0};
  b.P = 6;
  b.R = 5;
  const int64_t B = 4, T = b.P + b.R;
  at::manual_seed(seed);
  b.input_ids = at::randint(1, vocab, {B, T}, at::kLong);
  b.attention_mask = at::zeros({B, T}, at::kLong);
  for (int64_t i = 0; i < B; ++i)
    b.attention_mask[i].narrow(0, b.P - b.prompt_lens[i], b.prompt_lens[i] + b.response_lens[i]).fill_(1);
  b.input_ids.mul_(b.attention_mask);
  b.position_ids = (b.attention_mask.cumsum(-1) - 1).clamp_min(0);
  return b;
}

double max_abs_diff_masked(const at::Tensor& a, const at::Tensor& b, const at::Tensor& mask) {
  at::Tensor d = (a.to(at::kCPU, at::kFloat) - b.to(at::kCPU, at::kFloat)).abs();
  while (d.dim() > 2) d = d.amax(-1);
  return d.masked_select(mask.to(at::kCPU, at::kBool)).max().item<double>();
}

}  // namespace rpg::model::test
