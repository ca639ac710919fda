// The trainer's optimizer under data parallelism: ZeRO-1/2 sharding of the optimizer state
// (and gradients) over the world group, fp32 gradient accumulation for bf16 parameters
// (dist.shard_master_weights), and what the trainer asks of whichever optimizer it holds
// (master weights, memory accounting, the flat range this rank owns, clipping). One process:
// the replicated optimizer of optim.h, unchanged.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rpg/train/optim.h"

namespace rpg::dist {
class ProcessGroup;
}

namespace rpg::train::dp {

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

// After a mini-batch's backward passes: fp32 accumulators handed to the parameters, the
// gradient memory observed, and the gradients summed over the ranks (all-reduced; under ZeRO-2
// already reduced during backward into the shards: the zero rounds of a rank with fewer of the
// mini-batch's `micro_batches`, and the last bucket, are done here).
void reduce_gradients(Optimizer& optimizer, const std::vector<at::Tensor>& params, size_t micro_batches);

}  // namespace rpg::train::dp
