#include "rpg/model/init.h"

#include <ATen/ATen.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/model/causal_lm.h"
#include "rpg/model/config.h"

namespace rpg::model {

namespace fs = std::filesystem;

std::string init_config_json(const InitOptions& o, const VocabInfo& v) {
  auto positive = [](const char* name, int64_t x) {
    if (x <= 0) throw ValueError(str("model init: ", name, " must be positive, got ", x));
  };
  positive("hidden size", o.hidden_size);
  positive("layers", o.num_hidden_layers);
  positive("heads", o.num_attention_heads);
  positive("kv heads", o.num_key_value_heads);
  positive("intermediate size", o.intermediate_size);
  positive("max positions", o.max_position_embeddings);
  positive("vocab size", v.vocab_size);
  if (o.hidden_size % o.num_attention_heads != 0)
    throw ValueError(str("model init: hidden size ", o.hidden_size, " is not a multiple of the ", o.num_attention_heads, " heads"));
  if (o.num_attention_heads % o.num_key_value_heads != 0)
    throw ValueError(str("model init: ", o.num_attention_heads, " heads are not a multiple of the ", o.num_key_value_heads, " kv heads"));
  if ((o.hidden_size / o.num_attention_heads) % 2 != 0)
    throw ValueError(str("model init: head dim ", o.hidden_size / o.num_attention_heads, " must be even (RoPE rotates pairs)"));
  for (auto [name, id] : {std::pair{"eos token id", v.eos_token_id}, std::pair{"pad token id", v.pad_token_id}})
    if (id < 0 || id >= v.vocab_size)
      throw ValueError(str("model init: ", name, " ", id, " is outside the vocabulary of ", v.vocab_size));
  // Estimated before anything is allocated: libtorch's own failure for a too large tensor
  // is a raw allocator message, and a size that fits only by swapping never finishes.
  // In double: the products of user sizes overflow int64 long before they are refused.
  const double h = double(o.hidden_size), kv = double(o.num_key_value_heads) * double(o.hidden_size / o.num_attention_heads);
  const double per_layer = 2 * h * h + 2 * h * kv + 3 * h * double(o.intermediate_size) + 2 * h + h + 2 * kv;
  const double params = double(o.num_hidden_layers) * per_layer + double(v.vocab_size) * h * (o.tie_word_embeddings ? 1 : 2) + h;
  const int64_t avail = available_memory_bytes();
  if (avail > 0 && params * 4 > double(avail))
    throw ValueError(str("model init: ", static_cast<int64_t>(std::min(params, 9e18)), " parameters (",
                         format_bytes(params * 4), " of float32 weights) exceed the ", format_bytes(double(avail)),
                         " of memory available; reduce --hidden, --intermediate or --layers"));
  nlohmann::ordered_json c;
  c["architectures"] = {"Qwen2ForCausalLM"};
  c["attention_dropout"] = 0.0;
  // Qwen2.5 names <|endoftext|> as bos in config.json although the tokenizer adds no bos.
  c["bos_token_id"] = v.pad_token_id;
  c["dtype"] = "float32";
  c["eos_token_id"] = v.eos_token_id;
  c["hidden_act"] = "silu";
  c["hidden_size"] = o.hidden_size;
  c["initializer_range"] = 0.02;
  c["intermediate_size"] = o.intermediate_size;
  c["layer_types"] = std::vector<std::string>(static_cast<size_t>(o.num_hidden_layers), "full_attention");
  c["max_position_embeddings"] = o.max_position_embeddings;
  c["max_window_layers"] = o.num_hidden_layers;
  c["model_type"] = "qwen2";
  c["num_attention_heads"] = o.num_attention_heads;
  c["num_hidden_layers"] = o.num_hidden_layers;
  c["num_key_value_heads"] = o.num_key_value_heads;
  c["pad_token_id"] = v.pad_token_id;
  c["rms_norm_eps"] = o.rms_norm_eps;
  c["rope_parameters"] = {{"rope_theta", o.rope_theta}, {"rope_type", "default"}};
  // Readers older than transformers 5 (and vLLM) look for the top-level key.
  c["rope_theta"] = o.rope_theta;
  c["sliding_window"] = nullptr;
  c["tie_word_embeddings"] = o.tie_word_embeddings;
  c["use_cache"] = true;
  c["use_sliding_window"] = false;
  c["vocab_size"] = v.vocab_size;
  return c.dump(2) + "\n";
}

void init_model_dir(const InitOptions& o, const VocabInfo& v, const fs::path& tokenizer_dir, const fs::path& out) {
  std::string config_text = init_config_json(o, v);
  ModelConfig config = ModelConfig::from_json(config_text, "model init config");
  if (!fs::is_regular_file(tokenizer_dir / "tokenizer.json"))
    throw IoError(str("model init: no tokenizer.json in ", tokenizer_dir.string()));

  // The files that go beside the weights are staged in a directory that is never
  // committed (removed on scope exit), so save_pretrained publishes everything in one rename.
  fs::path target = fs::absolute(out);
  AtomicDir extras(target.parent_path() / ("." + target.filename().string() + ".init-files"));
  for (const auto& e : fs::directory_iterator(tokenizer_dir)) {
    std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == "config.json" || name == "generation_config.json" ||
        name == "model.safetensors.index.json" || name.ends_with(".safetensors"))
      continue;
    write_file_atomic(extras.path() / name, read_file(e.path()));
  }
  nlohmann::ordered_json gen;
  gen["bos_token_id"] = v.pad_token_id;
  gen["eos_token_id"] = v.eos_token_id == v.pad_token_id ? nlohmann::ordered_json(v.eos_token_id)
                                                          : nlohmann::ordered_json{v.eos_token_id, v.pad_token_id};
  gen["pad_token_id"] = v.pad_token_id;
  write_file_atomic(extras.path() / "generation_config.json", gen.dump(2) + "\n");

  at::manual_seed(o.seed);
  CausalLM model(std::move(config), at::kFloat);
  SaveOptions save;
  save.copy_files_from = extras.path();
  model.save_pretrained(out, save);
}

}  // namespace rpg::model
