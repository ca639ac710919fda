// A policy as the trainer and the evaluator use it: a model directory's weights, tokenizer
// and stop tokens, and prompts rendered the way verl renders them.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "rpg/model/causal_lm.h"
#include "rpg/rollout/sampler.h"
#include "rpg/tokenizer/tokenizer.h"

namespace rpg::rollout {

struct Policy {
  model::CausalLM model;
  tok::Tokenizer tokenizer;
  // EOS of tokenizer_config.json plus every eos_token_id of generation_config.json.
  std::vector<int64_t> stop_token_ids;
  int64_t pad_token_id = 0;  // pad, else EOS, else 0
};

// "auto" -> CUDA when the driver reports a GPU (libtorch's CUDA backend is loaded then, see
// core/device.h), else CPU; "cuda" without a usable GPU and anything else: ConfigError.
at::Device parse_device(const std::string& name);
// "auto" -> the checkpoint's dtype on CUDA, float32 on CPU (CPU bf16 matmuls are slow and
// inexact). Throws ConfigError for an unknown name.
at::ScalarType parse_dtype(const std::string& name, const std::filesystem::path& model_dir, at::Device device);

Policy load_policy(const std::filesystem::path& dir, const std::string& dtype = "auto", const std::string& device = "auto");

// `params` with the policy's stop tokens added (each once).
SamplingParams with_stop_tokens(SamplingParams params, const Policy& policy);

// apply_chat_template(messages, add_generation_prompt=true, **template_kwargs), then encode
// without special tokens (verl's RLHFDataset with data.apply_chat_template_kwargs).
// Without a chat template the messages' contents are joined (and the kwargs unused).
std::vector<int64_t> render_prompt(const tok::Tokenizer& tokenizer, const std::vector<tok::ChatMessage>& messages,
                                   bool use_chat_template = true,
                                   const tok::ChatTemplateKwargs& template_kwargs = {});

}  // namespace rpg::rollout
