// `rpg plan CONFIG [overrides] [--world-size N]`: docs/scaling.md's memory estimate per rank
// for a training configuration: the parameter count from the model directory's safetensors
// headers, the layer shapes from its config.json, the states of the chosen compute dtype,
// optimizer and ZeRO stage, the activations of one micro-batch and the rollout's KV cache.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "rpg/cli/commands.h"
#include "rpg/core/args.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"

namespace rpg::cli {
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
    int64_t e = 1;
    for (const auto& d : info.at("shape")) e *= d.get<int64_t>();
    total += e;
  }
  return total;
}

int64_t model_parameters(const fs::path& dir) {
  if (fs::exists(dir / "model.safetensors")) return safetensors_elements(dir / "model.safetensors");
  const fs::path index = dir / "model.safetensors.index.json";
  if (!fs::exists(index)) throw IoError(str(dir.string(), ": no model.safetensors or model.safetensors.index.json"));
  std::set<std::string> shards;
  for (const auto& [name, file] : nlohmann::json::parse(read_file(index)).at("weight_map").items())
    shards.insert(file.get<std::string>());
  int64_t total = 0;
  for (const auto& s : shards) total += safetensors_elements(dir / s);
  return total;
}

std::string gib(double bytes) {
  return bytes >= 1024.0 * 1024 * 1024 ? str(format_fixed(bytes / (1024.0 * 1024 * 1024), 2), " GiB")
                                      : str(format_fixed(bytes / (1024.0 * 1024), 1), " MiB");
}

}  // namespace

int run_plan(const std::string& full_name, const std::vector<std::string>& args) {
  std::string file;
  std::vector<std::string> overrides;
  int64_t world = 1;
  ArgParser parser(full_name,
                   "Prints the memory one rank of `rpg train CONFIG [overrides]` needs (docs/scaling.md's model):\n"
                   "weights, gradients, optimizer state (sharded with dist.zero_stage=1), the compute copy, a fixed\n"
                   "reference model, one micro-batch's activations and the rollout's KV cache.");
  parser.positional("CONFIG", &file, "YAML file ('-' for defaults only)")
      .option("--world-size", &world, "ranks in the run (default 1)", "N")
      .rest("KEY=VALUE", &overrides, "overrides, as for rpg train")
      .epilog("example: rpg plan recipes/rpg_reinforce_ufkl.yaml --world-size 8 dist.zero_stage=1");
  if (!parser.parse(args)) return 0;
  if (world < 1) throw UsageError(str(full_name, ": --world-size must be >= 1, got ", world));
  const train::TrainConfig cfg = load_train_config(file, overrides);
  const auto& a = cfg.actor_rollout_ref;
  const fs::path model = a.model.path;
  if (model.empty()) throw ConfigError("actor_rollout_ref.model.path: required (a Hugging Face model directory)");
  const auto mc = nlohmann::json::parse(read_file(model / "config.json"));
  auto dim = [&](const char* key) {
    if (!mc.contains(key) || !mc[key].is_number_integer())
      throw FormatError(str((model / "config.json").string(), ": missing integer '", key, "'"));
    return mc[key].get<int64_t>();
  };
  const double P = static_cast<double>(model_parameters(model));
  const int64_t h = dim("hidden_size"), L = dim("num_hidden_layers"), I = dim("intermediate_size"),
                H = dim("num_attention_heads");
  const int64_t Hkv = mc.contains("num_key_value_heads") ? dim("num_key_value_heads") : H;
  const int64_t D = mc.contains("head_dim") && mc["head_dim"].is_number_integer() ? dim("head_dim") : h / H;
  const bool bf16 = cfg.choices.compute_dtype == train::ComputeDtype::kBFloat16;
  const bool zero1 = cfg.dist.zero_stage >= 1 && world > 1;
  const bool needs_reference = cfg.choices.kl_loss_uses_reference || cfg.algorithm.use_kl_in_reward;
  const bool fixed_reference = needs_reference && !(a.actor.use_iterative_ref_model && a.actor.ref_update_freq == 1);
  const double N = static_cast<double>(world);

  const double weights = 4 * P, compute = bf16 ? 2 * P : 0, grads = 4 * P, optimizer = 8 * P / (zero1 ? N : 1.0),
               reference = fixed_reference ? 4 * P : 0;
  const double states = weights + compute + grads + optimizer + reference;
  // One micro-batch of T tokens: each layer's input kept (checkpointing) plus one layer's
  // full set during recomputation; without checkpointing every layer's full set.
  const int64_t seq = cfg.data.max_prompt_length + cfg.data.max_response_length;
  const int64_t mini_rows = a.actor.ppo_mini_batch_size * a.rollout.n;
  const double T = a.actor.use_dynamic_bsz ? static_cast<double>(a.actor.ppo_max_token_len_per_gpu)
                                           : static_cast<double>(a.actor.ppo_micro_batch_size_per_gpu.value_or(mini_rows) * seq);
  const double b = bf16 ? 2 : 4;
  const double layer_full = static_cast<double>(5 * h + 2 * H * D + 2 * Hkv * D + 4 * I) * T * b;
  // Attention probabilities: per head, each row's seq x seq (CPU attention materialises them).
  const double scores = static_cast<double>(H) * static_cast<double>(seq) * T * b;
  // Backward of a layer holds its activations and their gradients at once (2 x layer_full).
  const double activations = a.model.enable_gradient_checkpointing
                                 ? static_cast<double>(L * h) * T * b + 2 * layer_full + scores
                                 : static_cast<double>(L) * (layer_full + h * T * b + scores) + layer_full;
  // Rollouts: every sequence of this rank's share at full length, fp32 K and V.
  const double seqs = std::min(static_cast<double>(a.rollout.max_num_seqs),
                               std::ceil(static_cast<double>(cfg.data.train_batch_size * a.rollout.n) / N));
  const double kv = 2.0 * static_cast<double>(L * Hkv * D) * 4 * seqs * static_cast<double>(seq);
  const double total = states + std::max(activations, kv);

  std::cout << "model " << model.string() << ": " << format_fixed(P / 1e9, 3) << " B parameters (" << static_cast<int64_t>(P)
            << "), " << L << " layers, hidden " << h << ", heads " << H << "/" << Hkv << " x " << D << ", MLP " << I << "\n"
            << "per rank of " << world << ", ZeRO-" << (zero1 ? 1 : 0) << ", compute " << (bf16 ? "bf16" : "fp32") << ", "
            << a.actor.optim.optim_type << ":\n"
            << "  weights (fp32)            " << gib(weights) << "\n"
            << "  compute copy (bf16)       " << gib(compute) << "\n"
            << "  gradients (fp32)          " << gib(grads) << "\n"
            << "  optimizer state (fp32)    " << gib(optimizer) << (zero1 ? " (1/N)" : "") << "\n"
            << "  fixed reference (fp32)    " << gib(reference) << "\n"
            << "  states                    " << gib(states) << "\n"
            << "  activations               " << gib(activations) << " (" << static_cast<int64_t>(T)
            << " tokens per micro-batch, gradient checkpointing " << (a.model.enable_gradient_checkpointing ? "on" : "off")
            << ")\n"
            << "  KV cache (rollout, fp32)  " << gib(kv) << " (" << static_cast<int64_t>(seqs) << " sequences x " << seq
            << " tokens)\n"
            << "  peak = states + max(activations, KV cache)\n"
            << "total " << gib(total) << " (" << static_cast<int64_t>(total) << " bytes)" << std::endl;
  return 0;
}

}  // namespace rpg::cli
