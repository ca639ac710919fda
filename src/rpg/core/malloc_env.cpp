#include "rpg/core/malloc_env.h"

#include <malloc.h>

#include <cstdlib>
#include <string_view>

namespace rpg::malloc_env {
namespace {

std::string& chosen() {
  static std::string s;
  return s;
}

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
  return chosen() = ok ? "freed memory kept for reuse (M_MMAP_MAX=0, M_TRIM_THRESHOLD=-1)" : "mallopt refused: allocator defaults";
}

const std::string& choice() { return chosen(); }

}  // namespace rpg::malloc_env
