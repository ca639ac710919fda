// The trainer's data-parallel hooks on the dist module's world group (ZeRO-0, and ZeRO-1/2
// through make_optimizer below), and the collective checkpoints. Each is a no-op
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

// ZeRO-1: an optimizer whose state (moments and fp32 master copies) covers only this rank's
// contiguous 1/N of the flattened parameters (the pieces are views into the live
// parameters). step() updates the piece from the (already summed) gradients, then the
// parameters are all-gathered, so every rank holds the same full weights. state() is
// collective (every rank must call it) and returns the full, un-sharded state, as a
// replicated optimizer would; load_state() takes a full state and keeps this rank's piece,
// so checkpoints resume at any world size or stage.
// ZeRO-2 (`shard_gradients`): the gradients too, reduced during the backward passes. Hooks on
// the gradient sources (the parameters, or attach_gradient_sources' compute copy) move each
// gradient, as soon as autograd has accumulated it, into a flat bucket of consecutive
// parameters (at most `bucket_bytes`, in backward order) and drop it; complete buckets are
// reduced asynchronously (c10d reduce) to the ranks owning their positions, which add them
// into a persistent gradient shard over their 1/N; end_micro_batch() after each backward
// sends what is left, so gradient accumulation over micro-batches happens in the shard.
// reduce_update() waits for the last bucket; clip_grad_norm() below clips on the global norm
// of the shards; step() updates the piece from that shard. A rank holds its shard, at most
// two buckets and one parameter's gradient, never the full gradient; the update equals the
// replicated one up to the summation order of the micro-batches' gradients.
std::unique_ptr<Optimizer> make_sharded_optimizer(dist::ProcessGroup& pg, const OptimizerOptions& options,
                                                  NamedTensors params, bool shard_gradients = false,
                                                  int64_t bucket_bytes = int64_t{25} << 20);
// The trainer's optimizer: sharded over the world group when zero_stage is 1 or 2 and more
// than one process runs, else the replicated one (make_optimizer).
// `fp32_gradients` (dist.shard_master_weights, bf16 parameters): unless ZeRO-2 shards them
// (its buckets and shard are fp32 already), each micro-batch's bf16 gradients are added into
// fp32 accumulators at end_micro_batch(), which reduce_update() hands to the parameters as
// their gradients: accumulation over micro-batches, the all-reduce, clipping and the step are
// fp32, as with fp32 weights.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, NamedTensors params, int64_t zero_stage,
                                          int64_t bucket_bytes = int64_t{25} << 20, bool fp32_gradients = false);
// dist.shard_master_weights: the optimizer's fp32 master copies of its (bf16) parameters --
// this rank's 1/N under ZeRO-1/2 -- set from full-precision weights instead of the
// bf16-rounded parameters they were made from. `master_of(name)` gives a parameter's full
// tensor (any float dtype, e.g. a view of the checkpoint's mapped file): a sharded optimizer
// copies only its piece. Not collective.
void init_master_weights(Optimizer& optimizer, const std::function<at::Tensor(const std::string&)>& master_of);
// ZeRO-2: backward produces the gradients on `sources` (a compute copy's parameters, in
// params() order and shapes) instead of the optimizer's parameters. No-op otherwise.
void attach_gradient_sources(Optimizer& optimizer, const std::vector<at::Tensor>& sources);
// ZeRO-2: after each micro-batch's backward (sends the buckets not sent yet). No-op otherwise.
void end_micro_batch(Optimizer& optimizer);
// This rank's accounted memory since the last call (dist/memory.h), as perf/memory/* metrics:
// grad_bytes_max (the peak of gradient tensors: full gradients under ZeRO-0/1; shard +
// buckets + one parameter's gradient under ZeRO-2), optimizer_state_bytes, weight_bytes (the
// optimizer's parameters, replicated: fp32, or bf16 with dist.shard_master_weights),
// largest_param_bytes, master_bytes (dist.shard_master_weights: this rank's fp32 master
// copies, not counted in optimizer_state_bytes), and under ZeRO-2 grad_shard_bytes and
// grad_bucket_bytes (the largest bucket).
void memory_metrics(const Optimizer& optimizer, std::map<std::string, double>& metrics);
// Bytes of optimizer-state tensors this rank holds (its shard under ZeRO-1/2). Not collective.
int64_t local_state_bytes(const Optimizer& optimizer);
// Of those, the fp32 master copies of low-precision parameters (dist.shard_master_weights).
int64_t local_master_bytes(const Optimizer& optimizer);
// The positions [begin, end) of all parameters flattened (in params() order, `total` in all)
// whose optimizer state this rank holds: its 1/N when sharded, everything when replicated.
struct FlatRange {
  int64_t begin = 0, end = 0, total = 0;
};
FlatRange flat_range(const Optimizer& optimizer);
// The state this rank holds (not collective): a sharded optimizer's pieces ("<param>.<slot>",
// flat, the part of the parameter in flat_range), or the whole state of a replicated one.
OptimizerState local_state(const Optimizer& optimizer);
// train::clip_grad_norm on the optimizer's gradients; under ZeRO-2 on the global norm of the
// gradient shards (collective).
double clip_grad_norm(Optimizer& optimizer, double max_norm);

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
