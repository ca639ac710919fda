// core/malloc_env: after keep_freed_memory() a large block comes from the heap (no mmap'd
// chunk) and, freed, stays there for the next one; a user's malloc tunables win. The CLI
// side (rpg-torch calls it first thing; `rpg version` reports it) is in
// tests/cli/threads_cli_test.cpp.
#include <gtest/gtest.h>
#include <malloc.h>
#include <stdlib.h>

#include <cstring>

#include "rpg/core/malloc_env.h"

namespace rpg {
namespace {

TEST(MallocEnv, LargeBlocksComeFromTheHeapAndStayForReuse) {
  unsetenv("GLIBC_TUNABLES");
  const size_t big = 96u << 20;  // above glibc's largest mmap threshold (32 MiB on 64-bit)
  EXPECT_EQ(malloc_env::keep_freed_memory(), "freed memory kept for reuse (M_MMAP_MAX=0, M_TRIM_THRESHOLD=-1)");
  EXPECT_EQ(malloc_env::choice(), "freed memory kept for reuse (M_MMAP_MAX=0, M_TRIM_THRESHOLD=-1)");
  const size_t mapped_before = mallinfo2().hblkhd;
  void* p = malloc(big);
  ASSERT_NE(p, nullptr);
  std::memset(p, 1, big);
  EXPECT_EQ(mallinfo2().hblkhd, mapped_before) << "the block was mmap'd";
  const size_t arena = mallinfo2().arena;
  free(p);
  EXPECT_GE(mallinfo2().arena, arena) << "the heap was trimmed";
  EXPECT_GE(mallinfo2().fordblks, big) << "the freed block is not kept";
}

TEST(MallocEnv, TheUsersTunablesWin) {
  setenv("MALLOC_TRIM_THRESHOLD_", "1000000", 1);
  EXPECT_EQ(malloc_env::keep_freed_memory(), "glibc's settings (MALLOC_TRIM_THRESHOLD_ set by the user)");
  unsetenv("MALLOC_TRIM_THRESHOLD_");
  setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2", 1);
  EXPECT_EQ(malloc_env::keep_freed_memory(), "glibc's settings (GLIBC_TUNABLES set by the user)");
  setenv("GLIBC_TUNABLES", "glibc.cpu.hwcaps=-AVX2", 1);  // not malloc's
  EXPECT_EQ(malloc_env::keep_freed_memory().rfind("freed memory kept for reuse", 0), 0u);
  unsetenv("GLIBC_TUNABLES");
}

}  // namespace
}  // namespace rpg
