#include "rpg/core/malloc_env.h"

#include <dlfcn.h>
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
// tcmalloc's MallocExtension_ReleaseFreeMemory (gperftools/malloc_extension_c.h) when tcmalloc
// is the malloc in use. Looked up in the process, not linked: core does not depend on it, and
// a preloaded tcmalloc is found the same way as the one rpg-torch links.
void (*tcmalloc_release)() = nullptr;
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

// The file name of the library whose malloc this process calls when it is not glibc's (an
// allocator preloaded or linked in front of it: tcmalloc, jemalloc, mimalloc), else "".
// Such an allocator may accept glibc's mallopt parameters and ignore them: tcmalloc's mallopt
// returns 1 for any. dlsym finds the definition the dynamic linker binds malloc to.
std::string other_allocator() {
  Dl_info info{};
  void* bound = dlsym(RTLD_DEFAULT, "malloc");
  if (bound == nullptr || dladdr(bound, &info) == 0 || info.dli_fname == nullptr) return "";
  std::string_view file(info.dli_fname);
  if (const size_t slash = file.rfind('/'); slash != std::string_view::npos) file.remove_prefix(slash + 1);
  return file.starts_with("libc.so") || file.starts_with("libc-") ? "" : std::string(file);
}

}  // namespace

std::string keep_freed_memory() {
  keeping() = false;
  tcmalloc_release = nullptr;
  // Whose malloc first: with another allocator's, glibc's variables tune nothing in use.
  if (const std::string other = other_allocator(); !other.empty()) {
    if (other.starts_with("libtcmalloc"))
      if (void* release = dlsym(RTLD_DEFAULT, "MallocExtension_ReleaseFreeMemory")) {
        tcmalloc_release = reinterpret_cast<void (*)()>(release);
        return chosen() = "tcmalloc's own settings (" + other + ")";
      }
    return chosen() = "another allocator's own settings (" + other + ")";
  }
  if (const std::string user = user_setting(); !user.empty()) return chosen() = "glibc's settings (" + user + " set by the user)";
  // mallopt returns 1 on success. Reached with glibc's malloc, or when the dynamic linker
  // could not say whose malloc is bound (then a 1 may still come from an allocator ignoring it).
  const bool ok = mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, -1) == 1;
  keeping() = ok;
  return chosen() = ok ? "freed memory kept for reuse (M_MMAP_MAX=0, M_TRIM_THRESHOLD=-1)" : "mallopt refused: allocator defaults";
}

const std::string& choice() { return chosen(); }

bool glibc_heap_kept() { return keeping(); }

void release_free_memory() {
  if (tcmalloc_release) return tcmalloc_release();
  if (!keeping()) return;
  heap_high_water = std::max(heap_high_water, mallinfo2().arena);
  malloc_trim(0);
}

void release_if_heap_grew() {
  // tcmalloc needs no such rule: it hands free spans back at its release rate as they are freed.
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
