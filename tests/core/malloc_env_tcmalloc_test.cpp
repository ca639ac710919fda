// core/malloc_env with tcmalloc as the process's malloc, as rpg-torch links it (cmake's
// RPG_MALLOC=tcmalloc): keep_freed_memory() names it and leaves glibc's heap alone, and
// release_free_memory() hands tcmalloc's free spans back. glibc's side is malloc_env_test.cpp.
#include <gperftools/malloc_extension.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "rpg/core/malloc_env.h"
#include "test_util.h"

namespace rpg {
namespace {

TEST(MallocEnvTcmalloc, NamesTcmallocAndLeavesGlibcAlone) {
  const std::string chosen = malloc_env::keep_freed_memory();
  EXPECT_EQ(chosen.rfind("tcmalloc's own settings (libtcmalloc_minimal.so", 0), 0u) << chosen;
  EXPECT_FALSE(malloc_env::glibc_heap_kept());
  // glibc's variables tune nothing in use: tcmalloc's answer stays.
  setenv("MALLOC_TRIM_THRESHOLD_", "1000000", 1);
  EXPECT_EQ(malloc_env::keep_freed_memory(), chosen);
  unsetenv("MALLOC_TRIM_THRESHOLD_");
}

// With tcmalloc's own gradual release off, a freed block's pages stay resident until
// release_free_memory(). Residency from the page tables (smaps_rollup).
TEST(MallocEnvTcmalloc, ReleaseHandsFreeSpansBack) {
  malloc_env::keep_freed_memory();
  MallocExtension* ext = MallocExtension::instance();
  const double rate = ext->GetMemoryReleaseRate();
  ext->SetMemoryReleaseRate(0);
  const size_t big = 64u << 20;
  void* block = std::malloc(big);
  ASSERT_NE(block, nullptr);
  test::touch_bytes(block, big);
  std::free(block);
  const long long kept = test::resident_anonymous_kib();
  malloc_env::release_if_heap_grew();  // tcmalloc's own business: nothing released here
  EXPECT_GT(test::resident_anonymous_kib(), kept - 4 * 1024) << "release_if_heap_grew released tcmalloc's spans";
  malloc_env::release_free_memory();
  EXPECT_LT(test::resident_anonymous_kib(), kept - 60 * 1024) << "the freed block's pages are still resident";
  ext->SetMemoryReleaseRate(rate);
}

}  // namespace
}  // namespace rpg
