// The trainer's data-parallel hooks on the dist module's world group (ZeRO-0, and ZeRO-1/2
// through zero_optimizer.h's make_optimizer), and the collective checkpoints. Each is a no-op
// pass-through when the process runs alone, so a one-process run is unchanged.
// What a data-parallel step does (docs/scaling.md):
//   rollout   each rank generates a contiguous share of whole prompts, keyed like a one-process
//             run (SamplingParams::prompt_index_offset); the responses are all-gathered, so
//             every rank then scores, filters and batches the same groups;
//   update    each rank runs its contiguous share of a mini-batch's micro-batches (the loss
//             normaliser is the whole mini-batch's, which every rank holds), the fp32
//             gradients are summed over ranks (bucketed all-reduce) before clipping, so the
//             norm is the global one and every rank takes the same optimizer step.
//   log-probs each rank computes the old/reference log-probs of its contiguous share of the
//             micro-batches; the rows are summed over the ranks (zeros elsewhere: exact).
// Not yet shared out: advantages and validation run whole on every rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "rpg/dist/layout.h"
#include "rpg/dist/plan.h"
#include "rpg/reward/scorer.h"
#include "rpg/rollout/engine.h"
#include "rpg/train/optim.h"
#include "rpg/train/zero_optimizer.h"

namespace rpg {
namespace train {
struct TrainConfig;
}
namespace dist {
class ProcessGroup;
}
}  // namespace rpg

namespace rpg::train::dp {

// Joins the world group of `layout` (no-op for one process) with actor_rollout_ref.nccl_timeout
// as the group's timeout, after checking trainer.nnodes / trainer.n_gpus_per_node against what
// was launched: when more than one process runs, a set key that disagrees is a ConfigError
// naming it (null keys are not checked); a lone process only logs a notice when they ask for
// more (verl's recipes say 8 GPUs per node; rpg still runs them in one process).
void join_world(const TrainConfig& cfg, const dist::RankLayout& layout);

// The reward scorer of a data-parallel run. The built-in rules are deterministic and run on
// every rank. A scorer that calls out (custom_reward_function, reward_model.url) is made by
// `make` on rank 0 only (one pool of Python workers per run, not per rank) and its results,
// timeouts and errors included, are sent to every rank: a timeout on one rank alone would
// otherwise give the ranks different batches. One process: make() itself.
std::unique_ptr<reward::RewardScorer> reward_scorer(bool calls_out,
                                                    const std::function<std::unique_ptr<reward::RewardScorer>()>& make);

// engine.generate(ids, sp), shared out over the ranks; the responses of every rank in
// prompt order, with prompt_index relative to `ids` as in a one-process call.
std::vector<rollout::Response> generate(rollout::RolloutEngine& engine, const std::vector<std::vector<int64_t>>& ids,
                                        rollout::SamplingParams sp);

// This rank's micro-batches of a mini-batch: [begin, end) of `count`.
std::pair<size_t, size_t> micro_batch_range(size_t count);

// Rows computed by one rank each (zeros on the others) summed over the ranks, in place:
// every rank then holds all of them, exactly.
void sum_rows(at::Tensor& rows);

// Sizes of the loss-metric lists (taken before a mini-batch's micro-batches).
std::map<std::string, size_t> metric_sizes(const std::map<std::string, std::vector<double>>& metrics);

// After a mini-batch's backward passes: gradients summed over the ranks (all-reduced; under
// ZeRO-2 already reduced during backward into the optimizer's shards: the zero rounds of a
// rank with fewer of the mini-batch's `micro_batches`, and the last bucket, are done here),
// and the loss metrics appended since `before` gathered in rank order (= micro-batch order).
void reduce_update(Optimizer& optimizer, const std::vector<at::Tensor>& params,
                   std::map<std::string, std::vector<double>>& metrics, const std::map<std::string, size_t>& before,
                   size_t micro_batches);

// Rank 0 (or a process alone) owns the run directory: metrics, samples, and the checkpoint
// directory, into which every rank writes its optimizer shard (below).
bool writes_run_dir();

// ---- Collective checkpoints (docs/scaling.md) -------------------------------------------------
// A data-parallel run's checkpoint: rank 0 writes the Hugging Face actor/ and
// train_state.safetensors (exact weights, reference), every rank k of N writes its shard of
// the optimizer state, optim_shard_<k>_of_<N>.safetensors (the flattened parameters' range
// [total*k/N, total*(k+1)/N): a ZeRO-1/2 rank's own state, a ZeRO-0 rank's slice of its
// replicated state), and rank 0 writes the manifest last: train_state.json's
// "optimizer_shards" {world_size, elements, shards: [{rank, file, begin, end, bytes, scalars}]}.
// All of it goes into rank 0's temporary directory, published by one rename once every rank
// has reported its shard written: a checkpoint is complete when its manifest exists. A
// one-process run keeps the whole optimizer state in train_state.safetensors ("optim.*").
// Resuming reads the shards that cover this rank's range at any world size or ZeRO stage.

// Whether checkpoints hold the optimizer state as per-rank shards (more than one process).
bool shards_checkpoints();
// Runs `body` on this rank, then agrees with the others (collective): when any rank failed,
// every rank throws -- the failing rank its own exception, the others an Error
// "<what>: rank K failed: <its message>" -- so no rank is left waiting in a collective. A
// process alone just runs `body`.
void all_or_none(const std::string& what, const std::function<void()>& body);
// Rank 0's `path` on every rank (collective; a process alone gets its own).
std::filesystem::path main_path(const std::filesystem::path& path);
// Rank 0's `value` on every rank (collective): decisions that depend on files rank 0 owns.
bool main_decides(bool value);
// Writes this rank's optimizer shard into `dir`; returns its manifest entry.
nlohmann::json write_optimizer_shard(const Optimizer& optimizer, const std::filesystem::path& dir);
// Every rank's manifest entry (collective), as train_state.json's "optimizer_shards".
nlohmann::json gather_shard_manifest(const nlohmann::json& mine, const Optimizer& optimizer);
// The optimizer state for this rank's flat_range from a checkpoint's shards: full-shaped
// tensors for the parameters that overlap it (filled where the range is), and the scalars.
// Throws FormatError (naming the file) for a manifest that does not cover the parameters, or
// a shard file that is missing or of the wrong size.
OptimizerState read_optimizer_shards(const std::filesystem::path& dir, const nlohmann::json& manifest,
                                     const Optimizer& optimizer);
// Waits for every rank (no-op alone): the others wait until rank 0 has published a checkpoint.
void barrier();

// ---- rpg plan ---------------------------------------------------------------------------------
// dist::estimate's input for `world` ranks of this training config (reads the model
// directory's config.json and safetensors headers).
dist::PlanInput plan_input(const TrainConfig& cfg, int64_t world);

// ---- Preemption -------------------------------------------------------------------------------
// At a step boundary (collective): whether any rank was asked to stop (SIGTERM / SIGINT on
// one rank, or on all as SLURM does), so that every rank stops after the same step and
// takes part in one checkpoint. `who` gets "rank 1" / "ranks 0, 1" when one did.
bool agree_stop(bool mine, std::string* who);
// Where this rank's own metrics go: the run directory for rank 0, `<root>/rank_<k>` otherwise.
std::filesystem::path metrics_dir(const std::filesystem::path& root);

}  // namespace rpg::train::dp
