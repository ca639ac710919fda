// core/malloc_env: after keep_freed_memory() a large block comes from the heap (no mmap'd
// chunk) and, freed, stays there for the next one; a user's malloc tunables win. The CLI
// side (rpg-torch calls it first thing; `rpg version` reports it) is in
// tests/cli/threads_cli_test.cpp.
#include <gtest/gtest.h>
#include <malloc.h>
#include <stdlib.h>

#include <cstring>
#include <string>

#include "rpg/core/malloc_env.h"
#include "test_util.h"

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

// release_free_memory() hands the heap's free pages back (a setup's transients), where
// keep_freed_memory() keeps them otherwise. Residency from the page tables (smaps_rollup).
TEST(MallocEnv, ReleaseHandsTheHeapsFreePagesBack) {
  unsetenv("GLIBC_TUNABLES");
  malloc_env::keep_freed_memory();
  const size_t big = 64u << 20;
  void* block = malloc(big);
  ASSERT_NE(block, nullptr);
  test::touch_bytes(block, big);
  void* after = malloc(64);  // keeps the block off the heap's top: freed, it is a hole
  test::touch_bytes(after, 64);
  free(block);
  const long long kept = test::resident_anonymous_kib();
  malloc_env::release_free_memory();
  EXPECT_LT(test::resident_anonymous_kib(), kept - 60 * 1024) << "the freed block's pages are still resident";
  free(after);
}

// At a step's end memory is handed back only if the heap grew by more than a sixteenth past
// its size at the last release: a step that grows it back to that size (after a release trimmed it) or reuses
// its free memory keeps its pages resident for the next.
TEST(MallocEnv, AStepHandsMemoryBackOnlyWhenTheHeapGrew) {
  unsetenv("GLIBC_TUNABLES");
  malloc_env::keep_freed_memory();
  malloc_env::release_free_memory();
  malloc_env::release_if_heap_grew();  // the first step: its size is recorded
  const size_t big = 160u << 20;  // larger than any hole the other tests leave: grows the heap
  for (int step = 0; step < 2; ++step) {
    void* block = malloc(big);
    ASSERT_NE(block, nullptr);
    test::touch_bytes(block, big);
    free(block);
    const long long resident = test::resident_anonymous_kib();
    malloc_env::release_if_heap_grew();
    if (step == 0) EXPECT_LT(test::resident_anonymous_kib(), resident - 150 * 1024) << "the heap grew and its free pages stayed resident";
    else EXPECT_GT(test::resident_anonymous_kib(), resident - 1024) << "a step within the heap's earlier size had its memory handed back";
  }
}

}  // namespace
}  // namespace rpg
