// `rpg --threads N` and RPG_NUM_THREADS: the intra-op thread count libtorch uses in the
// process, read back from libtorch (at::get_num_threads) by `rpg version`. Every CTest
// process runs with OMP_NUM_THREADS=1, so a count other than 1 shows the setting took effect.
#include <gtest/gtest.h>

#include <algorithm>
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

}  // namespace
}  // namespace rpg
