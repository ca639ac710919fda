// Helpers shared by the model tests.
#pragma once

#include <ATen/ATen.h>

#include <filesystem>
#include <map>
#include <string>

#include "rpg/model/causal_lm.h"
#include "rpg/model/config.h"

namespace rpg::model::test {

// Every tensor of a safetensors file, copied out of the mapping.
std::map<std::string, at::Tensor> read_tensors(const std::filesystem::path& path);

// config.json text of a tiny model of `model_type` ("qwen2", "qwen3", "llama"); `extra`
// is spliced into the JSON object (e.g. R"("tie_word_embeddings": true)").
std::string tiny_config_json(const std::string& model_type, const std::string& extra = "");

// A randomly initialised model whose norms and biases are perturbed away from 1 / 0, so
// that every parameter influences the output. Initialised on the CPU, then copied to
// `device`: the same seed gives the same values on every device.
CausalLM random_model(const std::string& model_type, at::ScalarType dtype = at::kFloat,
                      const std::string& extra = "", uint64_t seed = 0, at::Device device = at::kCPU);

// A padded batch in verl's layout: prompts left-padded to P, responses right-padded to R.
struct PaddedBatch {
  at::Tensor input_ids, attention_mask, position_ids;  // [B, P + R]
  std::vector<int64_t> prompt_lens, response_lens;
  int64_t P = 0, R = 0;
};
PaddedBatch padded_batch(int64_t vocab, uint64_t seed = 1);

// max |a - b| over positions where `mask` [B, T] is 1 (a, b: [B, T, ...], any devices).
double max_abs_diff_masked(const at::Tensor& a, const at::Tensor& b, const at::Tensor& mask);

}  // namespace rpg::model::test
