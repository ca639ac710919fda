#include "rpg/model/config.h"

#include <cmath>
#include <iomanip>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/text.h"

namespace rpg::model {
namespace {

using nlohmann::json;

// Typed access to config.json with errors of the form `<file>: <key>: got X, expected Y`.
class Reader {
 public:
  Reader(const json& obj, std::string source, std::string prefix = "")
      : obj_(obj), source_(std::move(source)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw FormatError(str(source_, ": ", prefix_, key, ": ", what));
  }
  const json* find(const std::string& key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  int64_t positive_int(const std::string& key, std::optional<int64_t> fallback = std::nullopt) const {
    const json* v = find(key);
    if (!v) {
      if (fallback) return *fallback;
      fail(key, "missing (expected a positive integer)");
    }
    if (!v->is_number_integer() || v->get<int64_t>() <= 0 || v->get<int64_t>() > (int64_t{1} << 40))
      fail(key, str("got ", v->dump(), ", expected a positive integer"));
    return v->get<int64_t>();
  }
  double positive_double(const std::string& key, std::optional<double> fallback = std::nullopt) const {
    const json* v = find(key);
    if (!v) {
      if (fallback) return *fallback;
      fail(key, "missing (expected a positive number)");
    }
    if (!v->is_number()) fail(key, str("got ", v->dump(), ", expected a positive number"));
    double d = v->get<double>();
    if (!std::isfinite(d) || d <= 0) fail(key, str("got ", v->dump(), ", expected a finite positive number"));
    return d;
  }
  bool boolean(const std::string& key, bool fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail(key, str("got ", v->dump(), ", expected true or false"));
    return v->get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    const json* v = find(key);
    if (!v) return fallback;
    if (!v->is_string()) fail(key, str("got ", v->dump(), ", expected a string"));
    return v->get<std::string>();
  }

 private:
  const json& obj_;
  std::string source_, prefix_;
};

void parse_rope(const json& root, const Reader& top, const std::string& source, ModelConfig& c) {
  // transformers >= 5 writes `rope_parameters` (theta inside); older checkpoints write a
  // top-level `rope_theta` and an optional `rope_scaling`. Accept both spellings.
  const json* params = top.find("rope_parameters");
  const char* key = "rope_parameters";
  if (!params) {
    params = top.find("rope_scaling");
    key = "rope_scaling";
  }
  c.rope_theta = top.positive_double("rope_theta", 10000.0);
  if (!params) return;
  if (!params->is_object()) top.fail(key, str("got ", params->dump(), ", expected an object"));
  Reader r(*params, source, std::string(key) + ".");
  if (r.find("rope_theta")) c.rope_theta = r.positive_double("rope_theta");
  std::string type = r.string("rope_type", r.string("type", "default"));
  if (const json* prf = r.find("partial_rotary_factor"); prf && (!prf->is_number() || prf->get<double>() != 1.0))
    r.fail("partial_rotary_factor", str("got ", prf->dump(), ", expected 1.0 (partial RoPE is not supported)"));
  c.rope_scaling.type = type;
  if (type == "default") return;
  if (type != "llama3")
    r.fail("rope_type", str("got '", type, "', expected 'default' or 'llama3'"));
  c.rope_scaling.factor = r.positive_double("factor");
  c.rope_scaling.low_freq_factor = r.positive_double("low_freq_factor");
  c.rope_scaling.high_freq_factor = r.positive_double("high_freq_factor");
  c.rope_scaling.original_max_position_embeddings = r.positive_int("original_max_position_embeddings");
  if (c.rope_scaling.high_freq_factor <= c.rope_scaling.low_freq_factor)
    r.fail("high_freq_factor", str("got ", c.rope_scaling.high_freq_factor, ", expected > low_freq_factor ",
                                   c.rope_scaling.low_freq_factor));
  (void)root;
}

}  // namespace

ModelConfig ModelConfig::from_json(std::string_view text, const std::string& source) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    throw FormatError(str(source, ": not valid JSON: ", short_json_error(e.what())));
  }
  if (!root.is_object()) throw FormatError(str(source, ": expected a JSON object at the top"));
  Reader r(root, source);
  ModelConfig c;
  c.json_text = std::string(text);
  c.model_type = r.string("model_type", "");
  if (c.model_type == "qwen2") {
    c.family = Family::kQwen2;
  } else if (c.model_type == "qwen3") {
    c.family = Family::kQwen3;
  } else if (c.model_type == "llama") {
    c.family = Family::kLlama;
  } else {
    r.fail("model_type", str("got '", c.model_type, "', expected one of qwen2, qwen3, llama"));
  }
  c.vocab_size = r.positive_int("vocab_size");
  c.hidden_size = r.positive_int("hidden_size");
  c.intermediate_size = r.positive_int("intermediate_size");
  c.num_hidden_layers = r.positive_int("num_hidden_layers");
  c.num_attention_heads = r.positive_int("num_attention_heads");
  c.num_key_value_heads = r.positive_int("num_key_value_heads", c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    r.fail("num_key_value_heads", str("got ", c.num_key_value_heads, ", expected a divisor of num_attention_heads ",
                                      c.num_attention_heads));
  // transformers honours a non-null head_dim in every family; otherwise hidden / heads.
  if (r.find("head_dim")) {
    c.head_dim = r.positive_int("head_dim");
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      r.fail("hidden_size", str("got ", c.hidden_size, ", expected a multiple of num_attention_heads ",
                                c.num_attention_heads, " (no head_dim given)"));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) r.fail("head_dim", str("got ", c.head_dim, ", expected an even number (RoPE pairs)"));
  c.max_position_embeddings = r.positive_int("max_position_embeddings", 32768);
  c.rms_norm_eps = r.positive_double("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  std::string act = r.string("hidden_act", "silu");
  if (act != "silu") r.fail("hidden_act", str("got '", act, "', expected 'silu' (SwiGLU)"));
  if (r.boolean("mlp_bias", false)) r.fail("mlp_bias", "got true, expected false (MLP bias is not supported)");
  if (c.family != Family::kQwen2 && r.boolean("attention_bias", false))
    r.fail("attention_bias", "got true, expected false (attention bias is not supported for this model_type)");
  // Training runs without dropout: a checkpoint that asks for attention dropout would
  // train differently here than under transformers.
  if (const json* d = r.find("attention_dropout"); d && (!d->is_number() || d->get<double>() != 0.0))
    r.fail("attention_dropout", str("got ", d->dump(), ", expected 0 (attention dropout is not supported)"));
  // Sliding-window attention, as transformers resolves it for qwen2 / qwen3 (llama ignores
  // these keys): an explicit `layer_types` list wins; otherwise layers from
  // `max_window_layers` on slide when `use_sliding_window` is true and `sliding_window` is
  // set. Only all-"full_attention" layouts are supported.
  if (c.family != Family::kLlama) {
    if (const json* lt = r.find("layer_types")) {
      if (!lt->is_array()) r.fail("layer_types", str("got ", lt->dump(), ", expected a list"));
      for (const auto& t : *lt)
        if (t != "full_attention")
          r.fail("layer_types", str("got ", t.dump(), ", expected only \"full_attention\" layers "
                                    "(sliding-window attention is not supported)"));
    } else if (r.boolean("use_sliding_window", false) &&
               (!root.contains("sliding_window") || !root["sliding_window"].is_null())) {  // absent: 4096
      int64_t first = 28;  // transformers' default
      if (const json* m = r.find("max_window_layers")) {
        if (!m->is_number_integer() || m->get<int64_t>() < 0)
          r.fail("max_window_layers", str("got ", m->dump(), ", expected a non-negative integer"));
        first = m->get<int64_t>();
      }
      if (first < c.num_hidden_layers)
        r.fail("use_sliding_window",
               str("got true with max_window_layers ", first, " < num_hidden_layers ", c.num_hidden_layers,
                   ": layers ", first, ".. would use sliding-window attention, which is not supported"));
    }
  }
  if (int64_t pt = r.positive_int("pretraining_tp", 1); pt != 1)
    r.fail("pretraining_tp", str("got ", pt, ", expected 1"));
  c.qkv_bias = c.family == Family::kQwen2;
  c.qk_norm = c.family == Family::kQwen3;
  parse_rope(root, r, source, c);
  c.dtype = r.string("dtype", r.string("torch_dtype", ""));
  // Each value is capped, but products of them are not: bound the total in floating point
  // so that later int64 arithmetic on shapes cannot overflow. 2^50 parameters is ~1000x
  // any model in existence; more means a corrupt file.
  const double C = c.hidden_size, I = c.intermediate_size, V = c.vocab_size, D = c.head_dim;
  const double per_layer = C * D * (2.0 * c.num_attention_heads + 2.0 * c.num_key_value_heads) + 3.0 * C * I;
  const double total = 2.0 * V * C + c.num_hidden_layers * per_layer;
  if (!(total < std::ldexp(1.0, 50)))
    throw FormatError(str(source, ": the sizes describe ~", total, " parameters, more than 2^50: not a real model"));
  return c;
}

ModelConfig ModelConfig::from_dir(const std::filesystem::path& dir) {
  auto path = dir / "config.json";
  // A LoRA run's checkpoint (actor/ of lora_rank > 0) is an adapter, not a model.
  if (!std::filesystem::exists(path) && std::filesystem::exists(dir / "adapter_config.json"))
    throw IoError(str(dir.string(), " is a LoRA adapter directory, not a model: use the base model with the adapter "
                      "on top (--model BASE --adapter ", dir.string(), "), or merge them: rpg model merge BASE ",
                      dir.string(), " OUT"));
  return from_json(read_file(path, kSmallJsonBudget, "config.json"), path.string());
}

std::string ModelConfig::to_json(const std::string& dtype_name) const {
  json root = json::parse(json_text.empty() ? std::string("{}") : json_text);
  // Readers differ on the key: transformers 5 reads `dtype`, older readers and vLLM
  // `torch_dtype`. Write whichever the input used (both if it had both, `dtype` if neither).
  bool had_old = root.contains("torch_dtype"), had_new = root.contains("dtype");
  if (had_old) root["torch_dtype"] = dtype_name;
  if (had_new || !had_old) root["dtype"] = dtype_name;
  return root.dump(2) + "\n";
}

std::vector<std::pair<std::string, std::vector<int64_t>>> ModelConfig::parameter_shapes() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  const int64_t C = hidden_size, D = head_dim, H = num_attention_heads, Hkv = num_key_value_heads;
  out.push_back({"model.embed_tokens.weight", {vocab_size, C}});
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    std::string p = str("model.layers.", l, ".");
    out.push_back({p + "input_layernorm.weight", {C}});
    out.push_back({p + "self_attn.q_proj.weight", {H * D, C}});
    if (qkv_bias) out.push_back({p + "self_attn.q_proj.bias", {H * D}});
    out.push_back({p + "self_attn.k_proj.weight", {Hkv * D, C}});
    if (qkv_bias) out.push_back({p + "self_attn.k_proj.bias", {Hkv * D}});
    out.push_back({p + "self_attn.v_proj.weight", {Hkv * D, C}});
    if (qkv_bias) out.push_back({p + "self_attn.v_proj.bias", {Hkv * D}});
    out.push_back({p + "self_attn.o_proj.weight", {C, H * D}});
    if (qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {D}});
      out.push_back({p + "self_attn.k_norm.weight", {D}});
    }
    out.push_back({p + "post_attention_layernorm.weight", {C}});
    out.push_back({p + "mlp.gate_proj.weight", {intermediate_size, C}});
    out.push_back({p + "mlp.up_proj.weight", {intermediate_size, C}});
    out.push_back({p + "mlp.down_proj.weight", {C, intermediate_size}});
  }
  out.push_back({"model.norm.weight", {C}});
  if (!tie_word_embeddings) out.push_back({"lm_head.weight", {vocab_size, C}});
  return out;
}

int64_t ModelConfig::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, shape] : parameter_shapes()) {
    int64_t k = 1;
    for (int64_t d : shape) k *= d;
    n += k;
  }
  return n;
}

std::string describe(const ModelConfig& c) {
  auto gib = [](double bytes) {
    std::ostringstream o;
    o << std::fixed << std::setprecision(2) << bytes / (1024.0 * 1024.0 * 1024.0) << " GiB";
    return o.str();
  };
  int64_t n = c.num_parameters();
  std::string dt = c.dtype.empty() ? "unspecified" : c.dtype;
  double elem = (dt == "float32") ? 4 : 2;
  // K and V, every layer, per token, in the weights' dtype.
  double kv_per_token = 2.0 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * elem;
  std::ostringstream o;
  o << "architecture: " << c.model_type << " (" << c.num_hidden_layers << " layers, hidden " << c.hidden_size
    << ", heads " << c.num_attention_heads << "/" << c.num_key_value_heads << " kv, head_dim " << c.head_dim
    << ", intermediate " << c.intermediate_size << ", vocab " << c.vocab_size
    << (c.tie_word_embeddings ? ", tied embeddings" : "") << ", rope " << c.rope_scaling.type << " theta "
    << c.rope_theta << ")\n";
  o << "parameters: " << n << " (" << std::fixed << std::setprecision(2) << n / 1e9 << " B)\n";
  o << "dtype: " << dt << "\n";
  o << "memory: weights " << gib(n * elem) << " in " << (elem == 4 ? "float32" : "16-bit")
    << "; training with fp32 master weights + AdamW ~" << gib(n * 16.0) << "; KV cache "
    << std::setprecision(1) << kv_per_token / 1024.0 << " KiB per token\n";
  return o.str();
}

}  // namespace rpg::model
