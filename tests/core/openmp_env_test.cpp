// core/openmp_env.h: when rpg asks libgomp not to spin. The whole-process effect (libgomp in
// rpg-torch really runs passive) is checked in tests/cli/threads_cli_test.cpp.
#include <gtest/gtest.h>

#include "rpg/core/openmp_env.h"

namespace rpg::openmp {
namespace {

TEST(OpenMpWaitPolicy, PassiveOnlyWhenOurThreadsDoNotFitBesideTheOthers) {
  EXPECT_FALSE(oversubscribed(0, 2, 2));    // an idle 2-core machine, 2 threads: spinning is free
  EXPECT_FALSE(oversubscribed(1, 1, 2));    // one other process, one thread here: still fits
  EXPECT_TRUE(oversubscribed(1, 2, 2));     // one other process, two threads here: one core short
  EXPECT_TRUE(oversubscribed(1.5, 1, 2));
  EXPECT_FALSE(oversubscribed(6, 2, 16));   // a big machine with a few busy cores
  EXPECT_TRUE(oversubscribed(15, 2, 16));
  EXPECT_TRUE(oversubscribed(2, 0, 2));     // zero threads counts as one
  EXPECT_FALSE(oversubscribed(100, 1, 0));  // no core count: never decide
}

TEST(OpenMpWaitPolicy, RunQueueSnapshotIsReadable) {
  // On Linux /proc/loadavg exists; the caller itself is never counted.
  auto others = other_runnable_threads();
  ASSERT_TRUE(others.has_value());
  EXPECT_GE(*others, 0.0);
}

}  // namespace
}  // namespace rpg::openmp
