// c10d process groups over loopback: 2 ranks (processes of tests/dist/dist_worker) with
// torchrun's environment; results against closed-form values, faults named by rank.
#include "rpg/dist/process_group.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <future>

#include "rpg/dist/launch.h"
#include "test_util.h"

namespace rpg::dist {
namespace {

using test::ProcessResult;

std::vector<std::string> rank_env(int rank, int world, int port) {
  return {str("RANK=", rank),        str("WORLD_SIZE=", world), str("LOCAL_RANK=", rank),
          str("LOCAL_WORLD_SIZE=", world), "MASTER_ADDR=127.0.0.1", str("MASTER_PORT=", port),
          "OMP_NUM_THREADS=1"};
}

// Runs `dist_worker args...` as ranks 0..world-1 (only those in `ranks`) concurrently.
std::vector<ProcessResult> run_ranks(const std::vector<std::string>& args, int world = 2, std::vector<int> ranks = {}) {
  for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "SLURM_PROCID", "TORCHELASTIC_USE_AGENT_STORE"})
    unsetenv(v);
  if (ranks.empty())
    for (int r = 0; r < world; ++r) ranks.push_back(r);
  const int port = free_port();
  std::vector<std::string> argv = {RPG_DIST_WORKER};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<std::future<ProcessResult>> futures;
  for (int r : ranks)
    futures.push_back(std::async(std::launch::async, [=] { return test::run_process(argv, rank_env(r, world, port)); }));
  std::vector<ProcessResult> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

bool contains(const std::string& haystack, const std::string& needle) { return haystack.find(needle) != std::string::npos; }

// Closed forms for world size W, rank r (dist_worker's inputs):
//   sum of (r+1, 2(r+1), 10) = (W(W+1)/2, W(W+1), 10W); max of (r, 5-r) = (W-1, 5);
//   min of r+5 = 5; broadcast from W-1 = (7, 8); all_gather of (10r, 10r+1);
//   reduce_scatter of arange(2W)*(r+1): chunk r of arange(2W) * W(W+1)/2.
std::string expected_output(int r, int w) {
  double s = w * (w + 1) / 2.0;
  std::string gather;
  for (int k = 0; k < w; ++k) gather += str(" ", 10 * k, " ", 10 * k + 1);
  return str("joined ", r, " ", w, "\n", "sum ", s, " ", 2 * s, " ", 10 * w, "\n", "max ", w - 1, " 5\n", "min 5\n",
             "broadcast 7 8\n", "all_gather", gather, "\n", "reduce_scatter ", 2 * r * s, " ", (2 * r + 1) * s, "\n",
             "collectives 7\n");
}

TEST(ProcessGroup, TwoRanksCollectives) {
  auto results = run_ranks({"collectives"});
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << results[r].err;
    EXPECT_EQ(results[r].out, expected_output(r, 2)) << "rank " << r << "\n" << results[r].err;
  }
}

TEST(ProcessGroup, ThreeRanksCollectives) {
  auto results = run_ranks({"collectives"}, 3);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << results[r].err;
    EXPECT_EQ(results[r].out, expected_output(r, 3)) << "rank " << r << "\n" << results[r].err;
  }
}

TEST(ProcessGroup, KilledRankIsNamed) {
  auto results = run_ranks({"kill", "1"});
  EXPECT_EQ(results[1].exit_code, -9);
  EXPECT_EQ(results[0].exit_code, 1) << results[0].out;
  EXPECT_TRUE(contains(results[0].err, "rpg: error: dist: rank 1 is lost (its heartbeat stopped")) << results[0].err;
  EXPECT_TRUE(contains(results[0].err, "rank 0: all_reduce (collective #2) failed")) << results[0].err;
}

TEST(ProcessGroup, KilledStoreHostIsNamed) {
  auto results = run_ranks({"kill", "0"});
  EXPECT_EQ(results[0].exit_code, -9);
  EXPECT_EQ(results[1].exit_code, 1) << results[1].out;
  EXPECT_TRUE(contains(results[1].err, "rank 0 is lost")) << results[1].err;
}

TEST(ProcessGroup, FailedRankIsNamed) {
  auto results = run_ranks({"fail", "1"}, 3);
  EXPECT_EQ(results[1].exit_code, 1);
  EXPECT_TRUE(contains(results[1].err, "rpg: error: worker failed on purpose")) << results[1].err;
  for (int r : {0, 2}) {
    EXPECT_EQ(results[r].exit_code, 1) << results[r].out;
    EXPECT_TRUE(contains(results[r].err, "rank 1 ")) << results[r].err;
  }
}

TEST(ProcessGroup, HungRankIsNamedAfterTheTimeout) {
  auto results = run_ranks({"hang", "1"});
  EXPECT_EQ(results[1].exit_code, 0) << results[1].err;
  EXPECT_EQ(results[0].exit_code, 1) << results[0].out;
  EXPECT_TRUE(contains(results[0].err, "rank 1 did not reach this collective (it is at #1")) << results[0].err;
}

TEST(ProcessGroup, MissingRankAtJoinIsNamed) {
  auto results = run_ranks({"hang"}, 3, {0, 2});
  EXPECT_EQ(results[0].exit_code, 1) << results[0].out;
  EXPECT_TRUE(contains(results[0].err, "rpg: error: dist: rank(s) 1 did not join the group")) << results[0].err;
  // Rank 2 times out as well, or (when rank 0, the store's host, gave up first) loses the store.
  EXPECT_EQ(results[1].exit_code, 1) << results[1].out;
  EXPECT_TRUE(contains(results[1].err, "rpg: error: dist: rank(s) 1 did not join the group") ||
              contains(results[1].err, "(hosted by rank 0) went away while rank 2 was joining"))
      << results[1].err;
}

}  // namespace
}  // namespace rpg::dist
