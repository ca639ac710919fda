// `rpg --threads N` and RPG_NUM_THREADS: the intra-op thread count libtorch uses in the
// process, read back from libtorch (at::get_num_threads) by `rpg version`. Every CTest
// process runs with OMP_NUM_THREADS=1, so a count other than 1 shows the setting took effect.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"

namespace rpg {
namespace {

using test::ProcessResult;

ProcessResult rpg(std::vector<std::string> args, std::vector<std::string> env = {}) {
  args.insert(args.begin(), test::rpg_binary().string());
  env.push_back("OMP_NUM_THREADS=1");
  return test::run_process(args, env);
}

std::string threads_line(const ProcessResult& r) {
  const size_t at = r.out.find("\nthreads ");
  return at == std::string::npos ? std::string() : r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
}

void expect_one_line_error(const ProcessResult& r, const std::string& fragment) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("rpg: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
}

TEST(CliThreads, DefaultFollowsOmpNumThreads) {
  ProcessResult r = rpg({"version"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(threads_line(r), "threads 1 (libtorch intra-op)") << r.out;
}

TEST(CliThreads, FlagSetsTheCount) {
  for (const char* n : {"3", "2"}) {
    ProcessResult r = rpg({"--threads", n, "version"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(threads_line(r), std::string("threads ") + n + " (libtorch intra-op)") << r.out;
  }
  ProcessResult eq = rpg({"--threads=3", "--version"});
  ASSERT_EQ(eq.exit_code, 0) << eq.err;
  EXPECT_EQ(threads_line(eq), "threads 3 (libtorch intra-op)") << eq.out;
}

TEST(CliThreads, EnvironmentSetsTheCountAndTheFlagWins) {
  ProcessResult env = rpg({"version"}, {"RPG_NUM_THREADS=3"});
  ASSERT_EQ(env.exit_code, 0) << env.err;
  EXPECT_EQ(threads_line(env), "threads 3 (libtorch intra-op)") << env.out;
  ProcessResult both = rpg({"--threads", "2", "version"}, {"RPG_NUM_THREADS=3"});
  ASSERT_EQ(both.exit_code, 0) << both.err;
  EXPECT_EQ(threads_line(both), "threads 2 (libtorch intra-op)") << both.out;
}

TEST(CliThreads, BadValuesAreOneLineErrorsNamingTheSource) {
  expect_one_line_error(rpg({"--threads", "0", "version"}), "--threads: got '0'");
  expect_one_line_error(rpg({"--threads", "two", "version"}), "--threads: got 'two'");
  expect_one_line_error(rpg({"--threads=-1", "version"}), "--threads: got '-1'");
  expect_one_line_error(rpg({"--threads"}), "--threads: missing value");
  expect_one_line_error(rpg({"version"}, {"RPG_NUM_THREADS=abc"}), "RPG_NUM_THREADS: got 'abc'");
  expect_one_line_error(rpg({"version"}, {"RPG_NUM_THREADS=99999999"}), "RPG_NUM_THREADS: got '99999999'");
}

// The OpenMP wait policy (core/openmp_env.h), chosen by the front binary before rpg-torch loads
// libgomp, and read back from libgomp itself (OMP_DISPLAY_ENV=verbose prints its settings on
// stderr at load: GOMP_SPINCOUNT '0' is the passive policy). RPG_TEST_OTHER_RUNNABLE stands in
// for the machine's run queue.
TEST(CliThreads, WaitPolicyIsPassiveOnlyWhenTheMachineIsBusyAndTheUserWins) {
  auto line = [](const ProcessResult& r) {
    const size_t at = r.out.find("openmp wait policy ");
    return at == std::string::npos ? std::string() : r.out.substr(at, r.out.find('\n', at) - at);
  };
  ProcessResult busy = rpg({"version"}, {"RPG_TEST_OTHER_RUNNABLE=64", "OMP_DISPLAY_ENV=verbose"});
  ASSERT_EQ(busy.exit_code, 0) << busy.err;
  EXPECT_EQ(line(busy).rfind("openmp wait policy PASSIVE (chosen by rpg: 64 other runnable threads + 1 here exceed ", 0), 0u)
      << busy.out;
  EXPECT_NE(busy.err.find("GOMP_SPINCOUNT = '0'"), std::string::npos) << busy.err;

  ProcessResult idle = rpg({"version"}, {"RPG_TEST_OTHER_RUNNABLE=0", "OMP_DISPLAY_ENV=verbose"});
  ASSERT_EQ(idle.exit_code, 0) << idle.err;
  EXPECT_EQ(line(idle).rfind("openmp wait policy default (chosen by rpg: 0 other runnable threads + 1 here fit ", 0), 0u) << idle.out;
  EXPECT_NE(idle.err.find("GOMP_SPINCOUNT = '"), std::string::npos) << idle.err;
  EXPECT_EQ(idle.err.find("GOMP_SPINCOUNT = '0'"), std::string::npos) << idle.err;

  ProcessResult user = rpg({"version"}, {"RPG_TEST_OTHER_RUNNABLE=64", "OMP_WAIT_POLICY=active"});
  ASSERT_EQ(user.exit_code, 0) << user.err;
  EXPECT_EQ(line(user), "openmp wait policy active (set by the user)") << user.out;
  ProcessResult spin = rpg({"version"}, {"RPG_TEST_OTHER_RUNNABLE=64", "GOMP_SPINCOUNT=1000"});
  ASSERT_EQ(spin.exit_code, 0) << spin.err;
  EXPECT_EQ(line(spin), "openmp wait policy default (GOMP_SPINCOUNT=1000 set by the user)") << spin.out;
}

// core/malloc_env.h: rpg-torch runs on the tcmalloc it links (cmake's RPG_MALLOC), or on
// glibc's malloc keeping freed memory for reuse unless the user tuned it.
TEST(CliThreads, MallocKeepsFreedMemoryUnlessTheUserTunedIt) {
  auto line = [](const ProcessResult& r) {
    const size_t at = r.out.find("malloc ");
    return at == std::string::npos ? std::string() : r.out.substr(at, r.out.find('\n', at) - at);
  };
  ProcessResult plain = rpg({"version"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ProcessResult user = rpg({"version"}, {"MALLOC_MMAP_THRESHOLD_=65536"});
  ASSERT_EQ(user.exit_code, 0) << user.err;
#ifdef RPG_TEST_LINKS_TCMALLOC
  // The dynamic linker binds malloc to the linked tcmalloc, and glibc's variables tune nothing.
  EXPECT_EQ(line(plain).rfind("malloc tcmalloc's own settings (libtcmalloc_minimal.so", 0), 0u) << plain.out;
  EXPECT_EQ(line(user), line(plain)) << user.out;
#else
  EXPECT_EQ(line(plain), "malloc freed memory kept for reuse (M_MMAP_MAX=0, M_TRIM_THRESHOLD=-1)") << plain.out;
  EXPECT_EQ(line(user), "malloc glibc's settings (MALLOC_MMAP_THRESHOLD_ set by the user)") << user.out;
#endif
  // Another allocator in front of glibc's (as LD_PRELOAD puts tcmalloc): glibc's settings
  // would not be its own, whatever its mallopt answers, so none are claimed.
  const std::filesystem::path interposer = RPG_TEST_MALLOC_INTERPOSER;
  ProcessResult other = rpg({"version"}, {"LD_PRELOAD=" + interposer.string()});
  ASSERT_EQ(other.exit_code, 0) << other.err;
  EXPECT_EQ(line(other), "malloc another allocator's own settings (" + interposer.filename().string() + ")")
      << other.out;
}

}  // namespace
}  // namespace rpg
