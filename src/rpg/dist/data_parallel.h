// Data-parallel (ZeRO-0) building blocks on a ProcessGroup: every rank holds the whole
// model and optimizer, works on its shard of the batch, and the gradients are summed
// over the ranks before the (replicated, identical) optimizer step. With each rank's loss
// divided by the *global* normaliser (token or group counts all-reduced), the summed
// gradient equals the one-process gradient of the whole batch.
//
// `rpg train` uses them through its hooks in src/rpg/train/dp.h.
#pragma once

#include <cstdint>
#include <vector>

#include "rpg/dist/process_group.h"

namespace rpg::dist {

// A half-open range [begin, end) of items.
struct Shard {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const Shard&) const = default;
};

// Rank `rank`'s contiguous share of `items` items among `world` ranks, in whole units of
// `granule` items (a prompt's n responses stay on one rank): the first
// (items / granule) % world ranks get one unit more. Throws ValueError when `items` is not
// a multiple of `granule`.
Shard shard(int64_t items, int world, int rank, int64_t granule = 1);

// Sums the gradients of `params` over the ranks, in place, in flat buckets of at most
// `bucket_bytes` per dtype (one all_reduce each). A parameter without a gradient
// contributes zeros and gets a gradient (every rank must issue the same collectives).
void all_reduce_gradients(ProcessGroup& pg, const std::vector<at::Tensor>& params,
                          int64_t bucket_bytes = int64_t{25} << 20);

// Every rank's values, concatenated in rank order (counts may differ between ranks).
std::vector<double> all_gather_values(ProcessGroup& pg, const std::vector<double>& mine);
// Every rank's integer sequences (lengths may differ), concatenated in rank order.
std::vector<std::vector<int64_t>> all_gather_sequences(ProcessGroup& pg, const std::vector<std::vector<int64_t>>& mine);

}  // namespace rpg::dist
