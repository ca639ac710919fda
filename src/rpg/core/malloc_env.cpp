#include "rpg/core/malloc_env.h"

#include <malloc.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <utility>

namespace rpg::malloc_env {
namespace {

std::string& chosen() {
  static std::string s;
  return s;
}
// True once keep_freed_memory() applied its settings: only then is there memory to release.
bool& keeping() {
  static bool kept = false;
  return kept;
}
// The heap's largest size (every arena) seen at a release. Measured before trimming: a step
// that grows the heap back to where it was before the last release is not growth.
size_t heap_high_water = 0;

// The variable the user set that tunes glibc's malloc thresholds, or "".
std::string user_setting() {
  for (const char* name : {"MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"})
    if (const char* v = std::getenv(name); v && *v) return name;
  if (const char* t = std::getenv("GLIBC_TUNABLES"); t && std::string_view(t).find("glibc.malloc.") != std::string_view::npos)
    return "GLIBC_TUNABLES";
  return "";
}

}  // namespace

std::string keep_freed_memory() {
  if (const std::string user = user_setting(); !user.empty()) return chosen() = "glibc's settings (" + user + " set by the user)";
  // mallopt returns 1 on success; another allocator (LD_PRELOAD) may ignore it.
  const bool ok = mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, -1) == 1;
  keeping() = ok;
  return chosen() = ok ? "freed memory kept for reuse (M_MMAP_MAX=0, M_TRIM_THRESHOLD=-1)" : "mallopt refused: allocator defaults";
}

const std::string& choice() { return chosen(); }

void release_free_memory() {
  if (!keeping()) return;
  heap_high_water = std::max(heap_high_water, mallinfo2().arena);
  malloc_trim(0);
}

void release_if_heap_grew() {
  if (!keeping()) return;
  const size_t heap = mallinfo2().arena;
  // The first step grows the heap to its working size: recorded, not released. Later, growth
  // by more than 1/16: a step's own small variations are not a trend, and a release costs
  // the next step its page faults (SmolLM2: 5 s).
  static bool first = true;
  if (std::exchange(first, false)) heap_high_water = std::max(heap_high_water, heap);
  else if (heap > heap_high_water + heap_high_water / 16) release_free_memory();
}

}  // namespace rpg::malloc_env
