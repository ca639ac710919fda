// Architecture description of a decoder-only causal LM, parsed from a Hugging Face
// config.json. One struct covers the supported families; the per-family differences are
// plain flags filled by the parser, so the compute code never switches on model_type:
//   qwen2 / qwen2.5: bias on q/k/v projections (none on o_proj)
//   qwen3:           per-head RMSNorm on q and k before RoPE, explicit head_dim, no bias
//   llama (3.x):     no bias, optional rope_scaling of type `llama3`
// Torch-free, so the CLI and tests can describe a model without loading libtorch.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace rpg::model {

enum class Family { kQwen2, kQwen3, kLlama };

// RoPE frequency scaling. `type` is "default" (plain RoPE) or "llama3" (Llama 3.1 smooth
// interpolation between low- and high-frequency bands).
struct RopeScaling {
  std::string type = "default";
  double factor = 1.0;                            // llama3: wavelength stretch of low freqs
  double low_freq_factor = 1.0;                   // llama3: low band edge = orig_ctx / this
  double high_freq_factor = 4.0;                  // llama3: high band edge = orig_ctx / this
  int64_t original_max_position_embeddings = 0;   // llama3: pretraining context length
};

struct ModelConfig {
  std::string model_type;            // "qwen2", "qwen3" or "llama", as in config.json
  Family family = Family::kQwen2;
  int64_t vocab_size = 0;            // V
  int64_t hidden_size = 0;           // C
  int64_t intermediate_size = 0;     // SwiGLU inner width
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;   // H
  int64_t num_key_value_heads = 0;   // grouped-query attention: H % Hkv == 0
  int64_t head_dim = 0;              // D; hidden/heads unless config.json says otherwise
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;  // lm_head shares embed_tokens' weight (no lm_head tensor)
  bool qkv_bias = false;             // qwen2: q/k/v projections carry a bias
  bool qk_norm = false;              // qwen3: RMSNorm over D on every q and k head
  std::string dtype;                 // checkpoint dtype named in config.json ("bfloat16"...), may be empty
  std::string json_text;             // the config.json text as read; saving writes it back

  // Parses config.json text. `source` names the file in errors. Throws rpg::FormatError
  // for malformed JSON, missing or non-finite values, or an unsupported model_type /
  // feature (sliding-window attention, other activations or RoPE types, attention_bias).
  static ModelConfig from_json(std::string_view text, const std::string& source);
  // Reads <dir>/config.json. Throws IoError / FormatError.
  static ModelConfig from_dir(const std::filesystem::path& dir);

  // The config.json to write next to weights saved in `dtype_name` ("float32",
  // "bfloat16", "float16"): the original keys with the dtype entry updated.
  std::string to_json(const std::string& dtype_name) const;

  // Every parameter with its Hugging Face name and shape, in checkpoint order. The one
  // list that loading, saving, validation and counting all walk. A tied lm_head is not
  // listed (it is embed_tokens.weight).
  std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes() const;
  int64_t num_parameters() const;
};

// One-paragraph human description: family, sizes, parameter count, dtype, and the memory
// the weights take (plus the per-token KV-cache cost) — what `rpg model info` prints.
std::string describe(const ModelConfig& config);

}  // namespace rpg::model
