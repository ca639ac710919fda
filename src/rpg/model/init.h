// A freshly initialised Qwen2 model written as a complete Hugging Face model directory
// (config.json, model.safetensors, generation_config.json and the tokenizer files copied
// beside them), so a run can start from a model rpg built itself instead of a download.
// Knows nothing about the tokenizer's format: the caller supplies the vocabulary size and
// the special-token ids.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace rpg::model {

// Defaults give a ~1.6M-parameter model at a 4k vocabulary: small enough for the CPU demo.
struct InitOptions {
  int64_t hidden_size = 128;
  int64_t num_hidden_layers = 4;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;
  int64_t intermediate_size = 512;
  int64_t max_position_embeddings = 1024;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = true;
  uint64_t seed = 0;
};

struct VocabInfo {
  int64_t vocab_size = 0;
  int64_t eos_token_id = -1;  // <|im_end|>: ends an assistant turn
  int64_t pad_token_id = -1;  // <|endoftext|>: padding, and a second stop token
};

// config.json text of the model (qwen2, float32, in the layout transformers 5 writes).
// Throws ValueError for an inconsistent shape (heads not dividing hidden or each other,
// odd head dim, ids outside the vocabulary, non-positive sizes).
std::string init_config_json(const InitOptions& options, const VocabInfo& vocab);

// Initialises the weights (at::manual_seed(options.seed), then transformers' scheme: normal
// with std 0.02, ones for norms, zeros for biases; the global torch RNG is left seeded) and
// writes the directory `out` atomically, replacing it. Every regular file of
// `tokenizer_dir` apart from weights and configs is copied in. Same options -> the same
// bytes in every file.
void init_model_dir(const InitOptions& options, const VocabInfo& vocab, const std::filesystem::path& tokenizer_dir,
                    const std::filesystem::path& out);

}  // namespace rpg::model
