// Bytes held in the training state's tensors, counted by the code that allocates them
// (the CPU has no allocator statistics like CUDA's max_memory_allocated): the analogue of
// verl's perf/max_memory_allocated_gb, per kind of tensor, for this process. `rpg train`
// logs them as perf/memory/* (docs/scaling.md, "Measured").
//
// add() moves a kind's current count (and its peak); observe() only raises the peak, for
// tensors whose lifetime is not tracked (the full gradients of ZeRO-0/1, seen at their
// largest, after the backward passes). Thread-safe.
#pragma once

#include <cstdint>

namespace rpg::dist::memory {

enum class Kind { Gradients = 0, Count };

void add(Kind kind, int64_t bytes);
void observe(Kind kind, int64_t bytes);
int64_t current(Kind kind);
int64_t peak(Kind kind);
// The peak restarts from the current count (at each training step).
void reset_peak(Kind kind);

}  // namespace rpg::dist::memory
