// `rpg plan`'s memory model (docs/scaling.md): the bytes one rank of a data-parallel run
// needs, from a model directory's shapes and a run's batch / dtype / ZeRO settings.
// src/rpg/train/dp.h turns a TrainConfig into a PlanInput; `rpg plan` prints it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace rpg::dist {

// What the estimate needs of a Hugging Face model directory.
struct ModelShape {
  int64_t parameters = 0;  // every tensor's elements (safetensors headers; tied weights once)
  int64_t hidden = 0, layers = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t vocab = 0;  // vocab_size (0 when config.json has none)
  // Elements of the largest single tensor (the embedding, or an MLP matrix).
  // In elements, as a double: a config's dimensions may multiply past 64 bits.
  double largest_tensor() const {
    const double h = static_cast<double>(hidden);
    return std::max(static_cast<double>(vocab) * h, h * static_cast<double>(intermediate));
  }
};
// LoRA adapter parameters of rank `rank` on `target_modules` (projection names) of every
// layer: rank x (in + out) per projection.
int64_t lora_parameter_count(const ModelShape& m, int64_t rank, const std::vector<std::string>& target_modules);
// Reads config.json and the safetensors headers (model.safetensors or the index's shards).
// Throws IoError / FormatError naming the file.
ModelShape read_model_shape(const std::filesystem::path& dir);

struct PlanInput {
  ModelShape model;
  int64_t world = 1;
  int64_t zero_stage = 0;       // dist.zero_stage; only counts with world > 1
  double bucket_bytes = 25.0 * 1024 * 1024;  // dist.reduce_bucket_mb (ZeRO-2)
  bool bf16_compute = false;    // a bf16 working copy next to the fp32 master weights
  // dist.shard_master_weights (with bf16_compute): the weights are bf16 (no separate compute
  // copy), the fp32 masters live in the optimizer state (1/N with ZeRO-1/2), the rollout's KV
  // cache is bf16.
  bool shard_master = false;
  bool fixed_reference = false;  // a resident reference model, in the compute dtype
  // LoRA (actor_rollout_ref.model.lora_rank > 0): the adapters' parameter count, the only
  // trained ones -- gradients and optimizer state are theirs, the base is frozen (no
  // gradient, no state), the fixed reference is the base itself (no copy) and an iterative
  // one a snapshot of the adapters (iterative_reference). 0: full fine-tuning.
  int64_t lora_parameters = 0;
  bool iterative_reference = false;  // with LoRA: a resident snapshot of the adapters
  bool gradient_checkpointing = false;
  int64_t sequence = 0;          // max prompt + max response tokens
  double micro_batch_tokens = 0;  // tokens per micro-batch
  double micro_batch_responses = 0;  // response tokens per micro-batch (the lm_head's scored rows)
  // LogProbOptions::keep_logits_bytes: the update keeps the scored rows' fp32 log-probabilities
  // [rows, vocab] for its backward when they take at most this many bytes.
  double keep_logits_bytes = 0;
  int64_t rollout_sequences = 0;  // sequences generated per step (whole world)
  int64_t max_num_seqs = 0;       // the rollout engine's concurrent sequences
  std::string optimizer;          // named in the output only
};

// Bytes per rank.
struct MemoryPlan {
  int64_t stage = 0;  // the effective ZeRO stage (0 alone)
  double weights = 0, compute = 0, grads = 0, optimizer = 0, reference = 0, states = 0;
  double master = 0;  // fp32 master weights held by the optimizer (shard_master only; else `weights` is the master)
  double adapters = 0;  // LoRA: the fp32 adapters (`weights` is then the frozen base)
  double activations = 0, kv_cache = 0, total = 0;
  double kept_logits = 0;  // part of `activations`: the update's kept log-probabilities (or 0)
  double micro_batch_tokens = 0, rollout_sequences = 0;
};
MemoryPlan estimate(const PlanInput& in);

// The report `rpg plan` prints; its last line is "total <size> (<bytes> bytes)".
std::string format_plan(const std::filesystem::path& model_dir, const PlanInput& in, const MemoryPlan& plan);

}  // namespace rpg::dist
