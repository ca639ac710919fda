// PEFT's LoRA adapter directory, read and written as `peft` does, so an adapter trained by rpg
// loads with peft.PeftModel.from_pretrained and one trained by PEFT loads into rpg:
//   adapter_config.json        {"peft_type": "LORA", "r", "lora_alpha", "target_modules", ...}
//   adapter_model.safetensors  base_model.model.model.layers.<i>.<module>.lora_{A,B}.weight
// The adapters themselves live in CausalLM (attach_lora, lora_parameters).
#pragma once

#include <filesystem>
#include <string>

#include "rpg/model/causal_lm.h"

namespace rpg::model {

// Reads <dir>/adapter_config.json. FormatError naming the file and key for a malformed file
// and for every PEFT option rpg does not compute (DoRA, LoRA biases, modules_to_save, rank /
// alpha patterns, layer subsets, fan_in_fan_out, target_modules other than projection names
// or "all-linear"); target_modules "all-linear" becomes every projection. Entries may be module
// paths ("model.layers.3.mlp.up_proj", as PEFT writes all-linear for small models): a
// projection must then be listed for each of the `num_layers` layers (LoRA on some layers
// only is refused).
LoraConfig read_lora_config(const std::filesystem::path& dir, int64_t num_layers);

// Attaches the adapter of `dir` to `model` in `adapter_dtype` (default: the model's; see
// CausalLM::attach_lora) or, when the model already has adapters of the same configuration,
// overwrites their values. FormatError for a missing, extra or mis-shaped tensor, naming it.
void load_lora_adapter(CausalLM& model, const std::filesystem::path& dir,
                       std::optional<at::ScalarType> adapter_dtype = std::nullopt);

// Writes adapter_config.json and adapter_model.safetensors (the adapters in `dtype`, default
// their own) into the existing directory `dir` (plain writes: the caller publishes the
// directory atomically). `base_model` is recorded as base_model_name_or_path.
void write_lora_adapter(const CausalLM& model, const std::filesystem::path& dir, const std::string& base_model = "");

// write_lora_adapter into a fresh directory published by one rename.
void save_lora_adapter(const CausalLM& model, const std::filesystem::path& dir, const std::string& base_model = "");

}  // namespace rpg::model
