#include "rpg/dist/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "rpg/core/error.h"
#include "rpg/core/io.h"

namespace rpg::dist {
namespace {

namespace fs = std::filesystem;

std::string read_file_prefix(const fs::path& file, uint64_t n) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw IoError(str(file.string(), ": cannot open"));
  std::string out(n, '\0');
  in.read(out.data(), static_cast<std::streamsize>(n));
  out.resize(static_cast<size_t>(in.gcount()));
  return out;
}

std::string format_fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

// Elements of every tensor in a safetensors file (its JSON header only).
int64_t safetensors_elements(const fs::path& file) {
  const std::string head = read_file_prefix(file, 8);
  if (head.size() < 8) throw FormatError(str(file.string(), ": not a safetensors file (shorter than 8 bytes)"));
  uint64_t n = 0;
  std::memcpy(&n, head.data(), 8);
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(read_file_prefix(file, 8 + n).substr(8));
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(str(file.string(), ": bad safetensors header: ", e.what()));
  }
  int64_t total = 0;
  for (const auto& [name, info] : h.items()) {
    if (name == "__metadata__") continue;
    if (!info.is_object() || !info.contains("shape") || !info["shape"].is_array())
      throw FormatError(str(file.string(), ": tensor '", name, "' has no shape list"));
    int64_t e = 1;
    for (const auto& d : info["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || __builtin_mul_overflow(e, d.get<int64_t>(), &e))
        throw FormatError(str(file.string(), ": tensor '", name, "' has shape ", info["shape"].dump(),
                              " (not a list of counts whose product fits in 64 bits)"));
    }
    if (__builtin_add_overflow(total, e, &total))
      throw FormatError(str(file.string(), ": more elements than fit in 64 bits"));
  }
  return total;
}

int64_t model_parameters(const fs::path& dir) {
  if (fs::exists(dir / "model.safetensors")) {
    const int64_t n = safetensors_elements(dir / "model.safetensors");
    if (n == 0) throw FormatError(str((dir / "model.safetensors").string(), ": holds no tensors"));
    return n;
  }
  const fs::path index = dir / "model.safetensors.index.json";
  if (!fs::exists(index)) throw IoError(str(dir.string(), ": no model.safetensors or model.safetensors.index.json"));
  std::set<std::string> shards;
  const auto j = nlohmann::json::parse(read_file(index), nullptr, false);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw FormatError(str(index.string(), ": missing the weight_map object"));
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) throw FormatError(str(index.string(), ": weight_map['", name, "'] is not a file name"));
    shards.insert(file.get<std::string>());
  }
  int64_t total = 0;
  for (const auto& s : shards)
    if (__builtin_add_overflow(total, safetensors_elements(dir / s), &total))
      throw FormatError(str(index.string(), ": more elements than fit in 64 bits"));
  if (total == 0) throw FormatError(str(index.string(), ": the index lists no tensors"));
  return total;
}

std::string gib(double bytes) {
  return bytes >= 1024.0 * 1024 * 1024 ? str(format_fixed(bytes / (1024.0 * 1024 * 1024), 2), " GiB")
                                      : str(format_fixed(bytes / (1024.0 * 1024), 1), " MiB");
}

}  // namespace

ModelShape read_model_shape(const fs::path& dir) {
  const auto mc = nlohmann::json::parse(read_file(dir / "config.json"), nullptr, false);
  if (!mc.is_object()) throw FormatError(str((dir / "config.json").string(), ": malformed JSON"));
  auto dim = [&](const char* key) {
    if (!mc.contains(key) || !mc[key].is_number_integer())
      throw FormatError(str((dir / "config.json").string(), ": missing integer '", key, "'"));
    const int64_t v = mc[key].get<int64_t>();
    if (v < 1) throw FormatError(str((dir / "config.json").string(), ": '", key, "' must be >= 1, got ", v));
    return v;
  };
  ModelShape m;
  m.parameters = model_parameters(dir);
  m.hidden = dim("hidden_size");
  m.layers = dim("num_hidden_layers");
  m.intermediate = dim("intermediate_size");
  m.heads = dim("num_attention_heads");
  m.kv_heads = mc.contains("num_key_value_heads") ? dim("num_key_value_heads") : m.heads;
  m.head_dim = mc.contains("head_dim") && mc["head_dim"].is_number_integer() ? dim("head_dim") : m.hidden / m.heads;
  m.vocab = mc.contains("vocab_size") && mc["vocab_size"].is_number_integer() ? dim("vocab_size") : 0;
  return m;
}

int64_t lora_parameter_count(const ModelShape& m, int64_t rank, const std::vector<std::string>& target_modules) {
  const int64_t q = m.heads * m.head_dim, kv = m.kv_heads * m.head_dim;
  int64_t per_layer = 0;
  for (const auto& t : target_modules) {
    if (t == "q_proj") per_layer += m.hidden + q;
    else if (t == "k_proj" || t == "v_proj") per_layer += m.hidden + kv;
    else if (t == "o_proj") per_layer += q + m.hidden;
    else if (t == "gate_proj" || t == "up_proj" || t == "down_proj") per_layer += m.hidden + m.intermediate;
    else throw ValueError(str("LoRA target module '", t, "' is not a projection name"));
  }
  return rank * per_layer * m.layers;
}

MemoryPlan estimate(const PlanInput& in) {
  const ModelShape& m = in.model;
  MemoryPlan p;
  p.stage = in.world > 1 ? in.zero_stage : 0;
  const double P = static_cast<double>(m.parameters), N = static_cast<double>(in.world);
  const bool sm = in.shard_master;
  const double shard = p.stage >= 1 ? N : 1.0;
  p.weights = sm ? 2 * P : 4 * P;
  p.compute = in.bf16_compute && !sm ? 2 * P : 0;
  p.master = sm ? 4 * P / shard : 0;
  // ZeRO-2 reduces the gradients bucket by bucket during backward into a persistent 1/N fp32
  // shard: at its peak a rank holds the shard, the bucket in flight and the one being filled
  // (a tensor larger than a bucket is a bucket of its own), never more than the full gradient.
  const double bucket = std::max(in.bucket_bytes, 4.0 * m.largest_tensor());
  if (in.lora_parameters > 0) {
    // The trained parameters are the fp32 adapters (A): the base has no gradient and no state
    // and is held once, in the compute dtype (bf16 compute: a bf16 base, no copy); the
    // reference costs at most a snapshot of the adapters.
    const double A = static_cast<double>(in.lora_parameters);
    p.weights = in.bf16_compute ? 2 * P : 4 * P;
    p.adapters = 4 * A;
    p.compute = 0;
    p.grads = p.stage >= 2 ? std::min(4 * A, 4 * A / N + 2 * in.bucket_bytes) : 4 * A;
    p.optimizer = 8 * A / shard;
    p.reference = in.iterative_reference ? 4 * A : 0;
  } else {
    p.grads = p.stage >= 2 ? std::min(4 * P, 4 * P / N + 2 * bucket) : 4 * P;
    p.optimizer = 8 * P / shard;
    p.reference = in.fixed_reference ? (in.bf16_compute ? 2 : 4) * P : 0;  // in the compute dtype
  }
  p.states = p.weights + p.adapters + p.compute + p.master + p.grads + p.optimizer + p.reference;
  // One micro-batch of T tokens: each layer's input kept (checkpointing) plus one layer's
  // full set during recomputation; without checkpointing every layer's full set.
  const double T = in.micro_batch_tokens;
  p.micro_batch_tokens = T;
  const double b = in.bf16_compute ? 2 : 4;
  const double h = static_cast<double>(m.hidden), L = static_cast<double>(m.layers);
  const double layer_full =
      (5 * h + 2 * static_cast<double>(m.heads) * static_cast<double>(m.head_dim) +
       2 * static_cast<double>(m.kv_heads) * static_cast<double>(m.head_dim) + 4 * static_cast<double>(m.intermediate)) *
      T * b;
  // Attention probabilities: per head, each row's seq x seq (CPU attention materialises them).
  const double scores = static_cast<double>(m.heads) * static_cast<double>(in.sequence) * T * b;
  // Backward of a layer holds its activations and their gradients at once (2 x layer_full).
  p.activations = in.gradient_checkpointing ? L * h * T * b + 2 * layer_full + scores
                                            : L * (layer_full + h * T * b + scores) + layer_full;
  // A full-length micro-batch's log-probabilities, when they fit the keep budget.
  const double logits = in.micro_batch_responses * static_cast<double>(m.vocab) * 4;
  p.kept_logits = logits <= in.keep_logits_bytes ? logits : 0;
  p.activations += p.kept_logits;
  // Rollouts: every sequence of this rank's share at full length, fp32 K and V.
  p.rollout_sequences = std::min(static_cast<double>(in.max_num_seqs), std::ceil(static_cast<double>(in.rollout_sequences) / N));
  p.kv_cache = 2.0 * static_cast<double>(m.layers) * static_cast<double>(m.kv_heads) * static_cast<double>(m.head_dim) * (sm ? 2 : 4) * p.rollout_sequences *
               static_cast<double>(in.sequence);
  p.total = p.states + std::max(p.activations, p.kv_cache);
  return p;
}

std::string format_plan(const fs::path& model_dir, const PlanInput& in, const MemoryPlan& p) {
  const ModelShape& m = in.model;
  const double P = static_cast<double>(m.parameters);
  std::ostringstream o;
  o << "model " << model_dir.string() << ": " << format_fixed(P / 1e9, 3) << " B parameters (" << m.parameters << "), "
    << m.layers << " layers, hidden " << m.hidden << ", heads " << m.heads << "/" << m.kv_heads << " x " << m.head_dim
    << ", MLP " << m.intermediate << "\n"
    << "per rank of " << in.world << ", ZeRO-" << p.stage << ", compute " << (in.bf16_compute ? "bf16" : "fp32") << ", "
    << in.optimizer << ":\n"
    << (in.shard_master || (in.lora_parameters > 0 && in.bf16_compute) ? "  weights (bf16)            "
                                                                       : "  weights (fp32)            ")
    << gib(p.weights)
    << (in.lora_parameters > 0 ? " (frozen)" : "") << "\n";
  if (in.lora_parameters > 0)
    o << "  LoRA adapters (fp32)      " << gib(p.adapters) << " (" << in.lora_parameters
      << " parameters: the only trained ones)\n";
  if (in.shard_master)
    o << "  master weights (fp32)     " << gib(p.master) << (p.stage >= 1 ? " (1/N, in the optimizer state)" : " (in the optimizer state)")
      << "\n";
  else
    o << "  compute copy (bf16)       " << gib(p.compute) << "\n";
  o << "  gradients (fp32)          " << gib(p.grads)
    << (p.stage >= 2 ? " (1/N shard + 2 buckets in flight)" : "") << "\n"
    << "  optimizer state (fp32)    " << gib(p.optimizer) << (p.stage >= 1 ? " (1/N)" : "") << "\n"
    << (in.lora_parameters > 0 ? (in.iterative_reference ? "  reference (adapter copy)  " : "  reference (the base)      ")
        : in.bf16_compute       ? "  fixed reference (bf16)    "
                                : "  fixed reference (fp32)    ")
    << gib(p.reference) << "\n"
    << "  states                    " << gib(p.states) << "\n"
    << "  activations               " << gib(p.activations) << " (" << static_cast<int64_t>(p.micro_batch_tokens)
    << " tokens per micro-batch, gradient checkpointing " << (in.gradient_checkpointing ? "on" : "off")
    << (p.kept_logits > 0 ? ", the lm_head's log-probs kept for the backward: " + gib(p.kept_logits) : std::string()) << ")\n"
    << (in.shard_master ? "  KV cache (rollout, bf16)  " : "  KV cache (rollout, fp32)  ") << gib(p.kv_cache) << " (" << static_cast<int64_t>(p.rollout_sequences)
    << " sequences x " << in.sequence
    << " tokens; fewer decode together where that exceeds rollout.kv_cache_memory_fraction of the free memory)\n"
    << "  peak = states + max(activations, KV cache)\n"
    << "total " << gib(p.total) << " (" << format_fixed(p.total, 0) << " bytes)\n";
  return o.str();
}

}  // namespace rpg::dist
