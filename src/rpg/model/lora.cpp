#include "rpg/model/lora.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <map>
#include <set>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/model/tensor_file.h"

namespace rpg::model {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";

// PEFT options that change what is computed: each must be absent or at its default (null,
// false, "none", {} or []), else the adapter would run differently here than in PEFT.
bool is_default(const Json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_string() && v.get<std::string>() == "none") ||
         (v.is_object() && v.empty()) || (v.is_array() && v.empty());
}

}  // namespace

LoraConfig read_lora_config(const fs::path& dir, int64_t num_layers) {
  const fs::path file = dir / kConfigFile;
  const std::string where = file.string();
  const Json j = Json::parse(read_file(file, kSmallJsonBudget, "adapter_config.json"), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw FormatError(str(where, ": not a JSON object"));
  auto get = [&](const char* key) -> const Json& {
    if (!j.contains(key)) throw FormatError(str(where, ": missing '", key, "'"));
    return j[key];
  };
  if (get("peft_type") != "LORA") throw FormatError(str(where, ": peft_type ", get("peft_type").dump(), " is not LORA"));
  for (const char* key : {"use_dora", "lora_bias", "bias", "modules_to_save", "layers_to_transform", "layers_pattern",
                          "rank_pattern", "alpha_pattern", "fan_in_fan_out", "layer_replication", "exclude_modules",
                          "target_parameters", "trainable_token_indices", "use_qalora", "use_bdlora", "megatron_config"})
    if (j.contains(key) && !is_default(j[key]))
      throw FormatError(str(where, ": ", key, "=", j[key].dump(), " is not supported (rpg computes plain LoRA)"));
  LoraConfig c;
  const Json& r = get("r");
  if (!r.is_number_integer() || r.get<int64_t>() < 1) throw FormatError(str(where, ": r must be an integer >= 1, got ", r.dump()));
  c.rank = r.get<int64_t>();
  const Json& alpha = get("lora_alpha");
  if (!alpha.is_number() || !std::isfinite(alpha.get<double>()))
    throw FormatError(str(where, ": lora_alpha must be a number, got ", alpha.dump()));
  c.alpha = alpha.get<double>();
  c.use_rslora = j.contains("use_rslora") && j["use_rslora"].is_boolean() && j["use_rslora"].get<bool>();
  const auto& known = lora_module_names();
  const Json& targets = get("target_modules");
  std::set<std::string> wanted;
  std::map<std::string, std::set<int64_t>> per_layer;  // module paths: projection -> layers
  auto bad_entry = [&](const Json& t) {
    return FormatError(str(where, ": target_modules entry ", t.dump(),
                           " is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (or "
                           "model.layers.<i>.self_attn.<q|k|v|o>_proj / model.layers.<i>.mlp.<gate|up|down>_proj)"));
  };
  if (targets.is_string() && targets.get<std::string>() == "all-linear") {
    wanted.insert(known.begin(), known.end());
  } else if (targets.is_array()) {
    for (const auto& t : targets) {
      if (!t.is_string()) throw bad_entry(t);
      const std::string s = t.get<std::string>();
      if (std::find(known.begin(), known.end(), s) != known.end()) {
        wanted.insert(s);
        continue;
      }
      const std::string prefix = "model.layers.";
      const size_t dot = s.find('.', prefix.size());
      if (!s.starts_with(prefix) || dot == std::string::npos) throw bad_entry(t);
      const std::string index = s.substr(prefix.size(), dot - prefix.size()), rest = s.substr(dot + 1);
      if (index.empty() || index.size() > 9 || index.find_first_not_of("0123456789") != std::string::npos)
        throw bad_entry(t);
      const size_t last = rest.rfind('.');
      const std::string proj = last == std::string::npos ? "" : rest.substr(last + 1);
      if (std::find(known.begin(), known.end(), proj) == known.end()) throw bad_entry(t);
      const bool mlp = proj == "gate_proj" || proj == "up_proj" || proj == "down_proj";
      if (rest != (mlp ? "mlp." : "self_attn.") + proj) throw bad_entry(t);
      per_layer[proj].insert(std::stoll(index));
    }
  } else {
    throw FormatError(str(where, ": target_modules ", targets.dump(),
                          " must be a list of projection names or \"all-linear\" (regular expressions are not supported)"));
  }
  for (const auto& [proj, layers] : per_layer) {
    if (wanted.count(proj)) continue;
    const bool every = static_cast<int64_t>(layers.size()) == num_layers && *layers.begin() == 0 &&
                       *layers.rbegin() == num_layers - 1;
    if (!every)
      throw FormatError(str(where, ": target_modules puts ", proj, " adapters on ", layers.size(), " of ", num_layers,
                            " layers; LoRA on some layers only is not supported"));
    wanted.insert(proj);
  }
  if (wanted.empty()) throw FormatError(str(where, ": target_modules is empty"));
  // Layer order, whatever order PEFT wrote (it writes a set).
  for (const auto& k : known)
    if (wanted.count(k)) c.target_modules.push_back(k);
  return c;
}

void load_lora_adapter(CausalLM& model, const fs::path& dir, std::optional<at::ScalarType> adapter_dtype) {
  const LoraConfig config = read_lora_config(dir, model.config().num_hidden_layers);
  if (!model.lora()) {
    model.attach_lora(config, adapter_dtype);
  } else if (!(*model.lora() == config)) {
    throw FormatError(str((dir / kConfigFile).string(), ": the model already has adapters of another configuration"));
  }
  const fs::path file = dir / kWeightsFile;
  auto tensors = read_tensor_file(file);
  at::NoGradGuard no_grad;
  for (auto& [name, p] : model.lora_parameters()) {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw FormatError(str(file.string(), ": missing tensor ", name));
    if (it->second.sizes() != p.sizes())
      throw FormatError(str(file.string(), ": tensor ", name, " has shape ", it->second.sizes(), ", expected ", p.sizes()));
    p.copy_(it->second);
    tensors.erase(it);
  }
  if (!tensors.empty())
    throw FormatError(str(file.string(), ": unexpected tensor ", tensors.begin()->first, " (not an adapter of ",
                          (dir / kConfigFile).string(), "'s target_modules on this model)"));
}

void write_lora_adapter(const CausalLM& model, const fs::path& dir, const std::string& base_model) {
  if (!model.lora()) throw ValueError("write_lora_adapter: the model has no LoRA adapters");
  const LoraConfig& c = *model.lora();
  // The keys PEFT writes that decide the computation; every other one takes PEFT's default.
  Json j = {{"peft_type", "LORA"},
            {"task_type", "CAUSAL_LM"},
            {"base_model_name_or_path", base_model.empty() ? Json(nullptr) : Json(base_model)},
            {"r", c.rank},
            {"lora_alpha", c.alpha},
            {"lora_dropout", 0.0},
            {"target_modules", c.target_modules},
            {"bias", "none"},
            {"use_rslora", c.use_rslora},
            {"use_dora", false},
            {"fan_in_fan_out", false},
            {"init_lora_weights", true},
            {"modules_to_save", nullptr},
            {"layers_to_transform", nullptr},
            {"layers_pattern", nullptr},
            {"rank_pattern", Json::object()},
            {"alpha_pattern", Json::object()},
            {"inference_mode", true}};
  // An integral alpha is written as PEFT writes it (8, not 8.0).
  if (c.alpha == std::floor(c.alpha) && std::abs(c.alpha) < 1e15) j["lora_alpha"] = static_cast<int64_t>(c.alpha);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (auto& [name, p] : model.lora_parameters()) tensors.emplace_back(name, p.detach());
  TensorFileOptions options;
  options.metadata = {{"format", "pt"}};
  write_tensor_file(dir / kWeightsFile, tensors, options);
  write_file_atomic(dir / kConfigFile, j.dump(2) + "\n");
}

void save_lora_adapter(const CausalLM& model, const fs::path& dir, const std::string& base_model) {
  AtomicDir out(dir);
  write_lora_adapter(model, out.path(), base_model);
  out.commit();
}

}  // namespace rpg::model
