#include "rpg/rollout/policy.h"

#include <ATen/Context.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "rpg/core/device.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"

namespace rpg::rollout {

at::Device parse_device(const std::string& name) {
  // device::select loads libtorch's CUDA backend (dlopen) only for "cuda", or for "auto"
  // when the driver reports a GPU; a CPU run never maps it.
  if (device::select(name) == device::Kind::kCpu) return at::kCPU;
  if (!at::hasCUDA())
    throw ConfigError(str("device: ", name, ": libtorch's CUDA backend loaded, but torch sees no CUDA device (a CUDA query "
                          "ran before device selection, or the driver is older than the wheel's CUDA runtime)"));
  return at::Device(at::kCUDA, 0);
}

at::ScalarType parse_dtype(const std::string& name, const std::filesystem::path& model_dir, at::Device device) {
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  if (name == "float16" || name == "fp16") return at::kHalf;
  if (name != "auto") throw ConfigError(str("dtype: got '", name, "', expected auto, float32, bfloat16 or float16"));
  if (device.is_cpu()) return at::kFloat;
  const std::string d = model::ModelConfig::from_dir(model_dir).dtype;
  return d == "bfloat16" ? at::kBFloat16 : d == "float16" ? at::kHalf : at::kFloat;
}

Policy load_policy(const std::filesystem::path& dir, const std::string& dtype, const std::string& device) {
  at::Device dev = parse_device(device);
  model::LoadOptions lo;
  lo.device = dev;
  lo.dtype = parse_dtype(dtype, dir, dev);
  Policy p{model::CausalLM::from_pretrained(dir, lo), tok::Tokenizer::from_dir(dir), {}, 0};
  auto add_stop = [&](int64_t id) {
    if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), id) == p.stop_token_ids.end())
      p.stop_token_ids.push_back(id);
  };
  if (auto eos = p.tokenizer.eos_id()) add_stop(*eos);
  const auto gen_path = dir / "generation_config.json";
  if (std::filesystem::exists(gen_path)) {
    auto j = nlohmann::json::parse(read_file(gen_path), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw FormatError(str(gen_path.string(), ": malformed JSON"));
    if (j.contains("eos_token_id")) {
      const auto& e = j["eos_token_id"];
      if (e.is_number_integer()) add_stop(e.get<int64_t>());
      else if (e.is_array())
        for (const auto& x : e)
          if (x.is_number_integer()) add_stop(x.get<int64_t>());
    }
  }
  if (auto pad = p.tokenizer.pad_id()) p.pad_token_id = *pad;
  else if (auto eos = p.tokenizer.eos_id()) p.pad_token_id = *eos;
  return p;
}

SamplingParams with_stop_tokens(SamplingParams params, const Policy& policy) {
  for (int64_t id : policy.stop_token_ids)
    if (std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), id) == params.stop_token_ids.end())
      params.stop_token_ids.push_back(id);
  return params;
}

std::vector<int64_t> render_prompt(const tok::Tokenizer& tokenizer, const std::vector<tok::ChatMessage>& messages,
                                   bool use_chat_template, const tok::ChatTemplateKwargs& template_kwargs) {
  std::string text;
  if (use_chat_template) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
    text = tokenizer.apply_chat_template(list, /*add_generation_prompt=*/true, template_kwargs.json());
  } else {
    for (const auto& m : messages) text += m.content;
  }
  auto ids = tokenizer.encode(text, /*add_special_tokens=*/false);
  return {ids.begin(), ids.end()};
}

}  // namespace rpg::rollout
