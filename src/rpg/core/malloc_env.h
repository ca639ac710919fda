// glibc's malloc gives large blocks back to the kernel when they are freed: a block above the
// mmap threshold is its own mapping, and the heap is trimmed once its free top passes the
// trim threshold. A training step frees and reallocates the same large tensors (activations,
// logits chunks, gradients) thousands of times, and each reallocation then faults in fresh
// pages the kernel has to zero. rpg-torch keeps freed memory for reuse instead: every block
// from the heap (M_MMAP_MAX = 0) and no trimming (M_TRIM_THRESHOLD = -1). Measured on the
// update pass of SmolLM2-135M (bench/roofline, 32 rows of 96 + 64 tokens, 2 threads):
// 13.1 s instead of 15.1 s, system time 5 s instead of 15-21 s, peak RSS +0.6%. The cost: the
// process's resident size stays at its high-water mark instead of shrinking between phases.
#pragma once

#include <string>

namespace rpg::malloc_env {

// Applies the settings above unless the user tuned glibc's malloc (GLIBC_TUNABLES naming
// glibc.malloc, or one of the MALLOC_*_ variables that set these thresholds) or malloc is
// another allocator's (preloaded, e.g. tcmalloc: its own settings stay). Returns what was
// done, for `rpg version`; the same text is kept for choice().
std::string keep_freed_memory();
// keep_freed_memory()'s answer in this process, or "" if it was not called.
const std::string& choice();
// Hands the heap's free pages back to the kernel (malloc_trim), after a phase whose memory
// the rest of the process does not reuse: a run's setup and resume, which read the
// checkpoint and rewrite the metrics and samples files (transients that grow with the run).
// A no-op unless keep_freed_memory() applied its settings (glibc's defaults give it back).
void release_free_memory();
// The same at the end of a training step, but only when the heap has grown by more than a
// sixteenth past its size at the last release (the process's first call only records the
// size its first step grew it to). A step that fits in the memory the previous ones left
// free reuses it with its pages resident (handing them back every step cost SmolLM2's step
// 5 s of page faults), while holes between long-lived blocks cannot pile up into resident
// memory over a long run (a 10-minute soak crept +14% without any release).
void release_if_heap_grew();

}  // namespace rpg::malloc_env
