// The allocator under a training step. A step frees and reallocates the same large tensors
// (activations, logits chunks, gradients, dtype conversions) thousands of times.
//
// rpg-torch links tcmalloc (gperftools' tcmalloc_minimal; cmake's RPG_MALLOC, default
// tcmalloc). It hands free spans back to the kernel gradually (its release rate), and its
// malloc and free cost less than glibc's walk of a kept heap's free lists. Measured
// on SmolLM2-135M, 2 threads, against glibc's malloc tuned as below (docs/benchmarks.md,
// "2026-12-07 (eighth session)"): the bf16 update pass 8.0-8.2 s -> 6.7-7.1 s (glibc's malloc
// and free were 8 % of its samples), the bf16 RL step -2 to -17 % (mean -10 %), the fp32 one
// within the VM's spread, peak RSS -4 to -9 %.
//
// With glibc's malloc (-DRPG_MALLOC=glibc): glibc gives large blocks back to the kernel when
// they are freed: a block above the mmap threshold is its own mapping, and the heap is trimmed
// once its free top passes the trim threshold, so each reallocation faults in fresh pages the
// kernel has to zero. keep_freed_memory() keeps freed memory for reuse instead: every block
// from the heap (M_MMAP_MAX = 0) and no trimming (M_TRIM_THRESHOLD = -1). Measured on the
// update pass of SmolLM2-135M (bench/roofline, 32 rows of 96 + 64 tokens, 2 threads):
// 13.1 s instead of 15.1 s, system time 5 s instead of 15-21 s, peak RSS +0.6%. The cost: the
// process's resident size stays at its high-water mark instead of shrinking between phases.
#pragma once

#include <string>

namespace rpg::malloc_env {

// With glibc's malloc, applies the settings above unless the user tuned it (GLIBC_TUNABLES
// naming glibc.malloc, or one of the MALLOC_*_ variables that set these thresholds). With
// another allocator's (tcmalloc linked in or preloaded, jemalloc, ...) its own settings stay.
// Returns what was done, for `rpg version`; the same text is kept for choice().
std::string keep_freed_memory();
// keep_freed_memory()'s answer in this process, or "" if it was not called.
const std::string& choice();
// Hands the heap's free pages back to the kernel (malloc_trim; tcmalloc's
// MallocExtension_ReleaseFreeMemory), after a phase whose memory the rest of the process does
// not reuse: a run's setup and resume, which read the checkpoint and rewrite the metrics and
// samples files (transients that grow with the run). A no-op with glibc's malloc unless
// keep_freed_memory() applied its settings (glibc's defaults give it back).
void release_free_memory();
// The same at the end of a training step, but only when the heap has grown by more than a
// sixteenth past its size at the last release (the process's first call only records the
// size its first step grew it to). A step that fits in the memory the previous ones left
// free reuses it with its pages resident (handing them back every step cost SmolLM2's step
// 5 s of page faults), while holes between long-lived blocks cannot pile up into resident
// memory over a long run (a 10-minute soak crept +14% without any release). glibc's heap
// only: tcmalloc hands free spans back at its release rate as they are freed.
void release_if_heap_grew();
// True when keep_freed_memory() applied its settings to glibc's heap: freed blocks stay in it,
// resident, unless released (model/packed_gemm.cpp hands back one that extended the heap).
bool glibc_heap_kept();

}  // namespace rpg::malloc_env
