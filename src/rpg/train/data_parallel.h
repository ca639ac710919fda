// The trainer's data-parallel hooks on the dist module's world group (ZeRO-0, and ZeRO-1
// through make_optimizer below). Each is a
// no-op pass-through when the process runs alone, so a one-process run is unchanged.
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
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "rpg/dist/layout.h"
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
std::unique_ptr<Optimizer> make_sharded_optimizer(dist::ProcessGroup& pg, const OptimizerOptions& options,
                                                  NamedTensors params);
// The trainer's optimizer: sharded over the world group when zero_stage is 1 and more than
// one process runs, else the replicated one (make_optimizer).
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, NamedTensors params, int64_t zero_stage);
// Bytes of optimizer-state tensors this rank holds (its shard under ZeRO-1). Not collective.
int64_t local_state_bytes(const Optimizer& optimizer);
// What a rank that does not write the checkpoint must do while rank 0 saves one: take part
// in the sharded optimizer's collectives (no-op for a replicated optimizer).
void join_checkpoint(Optimizer& optimizer);

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

// After a mini-batch's backward passes: gradients summed over the ranks, and the loss
// metrics appended since `before` gathered in rank order (= micro-batch order).
void reduce_update(const std::vector<at::Tensor>& params, std::map<std::string, std::vector<double>>& metrics,
                   const std::map<std::string, size_t>& before);

// Rank 0 (or a process alone) owns the run directory: checkpoints, metrics, samples. The
// state is replicated, so its checkpoint is every rank's, for any later world size.
bool writes_run_dir();
// Where this rank's own metrics go: the run directory for rank 0, `<root>/rank_<k>` otherwise.
std::filesystem::path metrics_dir(const std::filesystem::path& root);

}  // namespace rpg::train::dp
