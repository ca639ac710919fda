#include "rpg/train/dp.h"

#include <ATen/ATen.h>

#include <mutex>

#include "rpg/core/device.h"
#include "rpg/core/error.h"
#include "rpg/core/log.h"
#include "rpg/dist/data_parallel.h"
#include "rpg/dist/process_group.h"
#include "rpg/dist/world.h"
#include "rpg/model/causal_lm.h"  // model::LoraConfig, LogProbOptions (plan_input)
#include "rpg/train/config.h"

namespace rpg::train::dp {

namespace {

// Once per process: the KV-cache budget (rollout.kv_cache_memory_fraction) let fewer
// sequences decode together than max_num_seqs.
std::vector<rollout::Response> generate_noting_slots(rollout::RolloutEngine& engine,
                                                     const std::vector<std::vector<int64_t>>& ids,
                                                     const rollout::SamplingParams& sp) {
  auto out = engine.generate(ids, sp);
  const auto& stats = engine.last_stats();
  static std::once_flag told;
  if (stats.slots_cut_by_kv_budget)
    std::call_once(told, [&] {
      log_info("rollout: ", stats.slots, " sequences decode together (the KV cache may take ",
               "actor_rollout_ref.rollout.kv_cache_memory_fraction of the available memory); the rest wait their turn");
    });
  return out;
}

}  // namespace

std::vector<rollout::Response> generate(rollout::RolloutEngine& engine, const std::vector<std::vector<int64_t>>& ids,
                                        rollout::SamplingParams sp) {
  dist::ProcessGroup* pg = dist::world();
  if (!pg) return generate_noting_slots(engine, ids, sp);
  const auto mine = dist::shard(static_cast<int64_t>(ids.size()), pg->size(), pg->rank());
  std::vector<std::vector<int64_t>> part(ids.begin() + mine.begin, ids.begin() + mine.end);
  sp.prompt_index_offset += static_cast<uint64_t>(mine.begin);
  std::vector<rollout::Response> local;
  if (!part.empty()) local = generate_noting_slots(engine, part, sp);

  // Tokens, log-probs and (prompt, sample, finish, seconds) of every rank, in rank order.
  std::vector<std::vector<int64_t>> tokens;
  std::vector<double> log_probs, meta;
  for (const auto& r : local) {
    tokens.push_back(r.token_ids);
    std::vector<int64_t> lp_len{static_cast<int64_t>(r.log_probs.size())};
    tokens.push_back(lp_len);
    log_probs.insert(log_probs.end(), r.log_probs.begin(), r.log_probs.end());
    meta.insert(meta.end(), {static_cast<double>(r.prompt_index + mine.begin), static_cast<double>(r.sample_index),
                             static_cast<double>(r.finish_reason), r.seconds});
  }
  const auto all_tokens = dist::all_gather_sequences(*pg, tokens);
  const auto all_lp = dist::all_gather_values(*pg, log_probs);
  const auto all_meta = dist::all_gather_values(*pg, meta);
  std::vector<rollout::Response> out(all_meta.size() / 4);
  size_t lp = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    rollout::Response& r = out[i];
    r.token_ids = all_tokens[2 * i];
    const auto n = static_cast<size_t>(all_tokens[2 * i + 1].at(0));
    r.log_probs.assign(all_lp.begin() + static_cast<std::ptrdiff_t>(lp), all_lp.begin() + static_cast<std::ptrdiff_t>(lp + n));
    lp += n;
    r.prompt_index = static_cast<int64_t>(all_meta[4 * i]);
    r.sample_index = static_cast<int64_t>(all_meta[4 * i + 1]);
    r.finish_reason = static_cast<rollout::FinishReason>(static_cast<int>(all_meta[4 * i + 2]));
    r.seconds = all_meta[4 * i + 3];
  }
  return out;
}

std::pair<size_t, size_t> micro_batch_range(size_t count) {
  dist::ProcessGroup* pg = dist::world();
  if (!pg) return {0, count};
  const auto mine = dist::shard(static_cast<int64_t>(count), pg->size(), pg->rank());
  return {static_cast<size_t>(mine.begin), static_cast<size_t>(mine.end)};
}

void sum_rows(at::Tensor& rows) {
  if (dist::ProcessGroup* pg = dist::world()) pg->all_reduce(rows, dist::ReduceOp::Sum);
}

std::map<std::string, size_t> metric_sizes(const std::map<std::string, std::vector<double>>& metrics) {
  std::map<std::string, size_t> out;
  for (const auto& [k, v] : metrics) out[k] = v.size();
  return out;
}

bool writes_run_dir() { return dist::is_main(); }

std::filesystem::path metrics_dir(const std::filesystem::path& root) {
  if (dist::is_main()) return root;
  return root / ("rank_" + std::to_string(dist::world()->rank()));
}

dist::PlanInput plan_input(const TrainConfig& cfg, int64_t world) {
  const auto& a = cfg.actor_rollout_ref;
  if (a.model.path.empty()) throw ConfigError("actor_rollout_ref.model.path: required (a Hugging Face model directory)");
  dist::PlanInput in;
  in.model = dist::read_model_shape(a.model.path);
  in.world = world;
  in.zero_stage = cfg.dist.zero_stage;
  in.bucket_bytes = cfg.dist.reduce_bucket_mb * 1024 * 1024;
  in.bf16_compute = cfg.choices.compute_dtype == ComputeDtype::kBFloat16;
  in.shard_master = cfg.dist.shard_master_weights;
  const bool needs_reference = cfg.choices.kl_loss_uses_reference || cfg.algorithm.use_kl_in_reward;
  in.fixed_reference = needs_reference && !(a.actor.use_iterative_ref_model && a.actor.ref_update_freq == 1);
  in.gradient_checkpointing = a.model.enable_gradient_checkpointing;
  in.sequence = cfg.data.max_prompt_length + cfg.data.max_response_length;
  const int64_t mini_rows = a.actor.ppo_mini_batch_size * a.rollout.n;
  in.micro_batch_tokens = a.actor.use_dynamic_bsz
                              ? static_cast<double>(a.actor.ppo_max_token_len_per_gpu)
                              : static_cast<double>(a.actor.ppo_micro_batch_size_per_gpu.value_or(mini_rows) * in.sequence);
  in.micro_batch_responses = a.actor.use_dynamic_bsz
                                 ? static_cast<double>(a.actor.ppo_max_token_len_per_gpu)
                                 : static_cast<double>(a.actor.ppo_micro_batch_size_per_gpu.value_or(mini_rows) *
                                                       cfg.data.max_response_length);
  in.keep_logits_bytes = static_cast<double>(model::LogProbOptions{}.keep_logits_bytes);
  in.rollout_sequences = cfg.data.train_batch_size * a.rollout.n;
  in.max_num_seqs = a.rollout.max_num_seqs;
  in.optimizer = a.actor.optim.optim_type;
  if (cfg.uses_lora()) {
    in.lora_parameters = dist::lora_parameter_count(in.model, a.model.lora_rank, cfg.lora_config().target_modules);
    in.iterative_reference = in.fixed_reference && a.actor.use_iterative_ref_model;
  }
  return in;
}

void join_world(const TrainConfig& cfg, const dist::RankLayout& layout) {
  const auto& t = cfg.trainer;
  if (layout.distributed()) {
    const std::string launched = dist::describe(layout);
    if (t.nnodes && *t.nnodes != layout.nnodes)
      throw ConfigError(str("trainer.nnodes: ", *t.nnodes, ", but ", layout.nnodes, " node(s) were launched (", launched,
                            "); set trainer.nnodes=", layout.nnodes, " or launch ", *t.nnodes, " node(s)"));
    if (t.n_gpus_per_node && *t.n_gpus_per_node != layout.local_world_size)
      throw ConfigError(str("trainer.n_gpus_per_node: ", *t.n_gpus_per_node, ", but ", layout.local_world_size,
                            " process(es) per node were launched (", launched, "); set trainer.n_gpus_per_node=",
                            layout.local_world_size, " or launch ", *t.n_gpus_per_node, " per node"));
  } else if (t.nnodes.value_or(1) * t.n_gpus_per_node.value_or(1) > 1) {
    log_info("trainer.nnodes=", t.nnodes.value_or(1), " x trainer.n_gpus_per_node=", t.n_gpus_per_node.value_or(1),
             " asks for more processes, but no launcher started them: training in one process "
             "(use rpg launch / torchrun / srun for data-parallel training)");
  }
  dist::GroupOptions options;
  options.timeout = std::chrono::seconds(cfg.actor_rollout_ref.nccl_timeout);
  // Gloo on the CPU; NCCL beside it for CUDA tensors when the trainer runs on CUDA (the same
  // selection as the policy's: "auto" is CUDA when a GPU is usable).
  if (layout.distributed()) options.device = device::select(t.device, "trainer.device");
  dist::init_world(layout, options);
}

void reduce_update(Optimizer& optimizer, const std::vector<at::Tensor>& params,
                   std::map<std::string, std::vector<double>>& metrics, const std::map<std::string, size_t>& before,
                   size_t micro_batches) {
  reduce_gradients(optimizer, params, micro_batches);
  dist::ProcessGroup* pg = dist::world();
  if (!pg) return;
  // Metric names: a rank without micro-batches has none, so they are gathered first.
  std::vector<std::vector<int64_t>> names;
  for (const auto& [k, v] : metrics) names.emplace_back(k.begin(), k.end());
  std::map<std::string, bool> all_names;
  for (const auto& n : dist::all_gather_sequences(*pg, names)) all_names[std::string(n.begin(), n.end())] = true;
  for (const auto& [name, unused] : all_names) {
    std::vector<double>& values = metrics[name];
    auto it = before.find(name);
    const size_t keep = it == before.end() ? 0 : it->second;
    std::vector<double> mine(values.begin() + static_cast<std::ptrdiff_t>(keep), values.end());
    values.resize(keep);
    for (double v : dist::all_gather_values(*pg, mine)) values.push_back(v);
  }
}

}  // namespace rpg::train::dp
