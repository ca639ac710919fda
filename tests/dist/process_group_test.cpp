// c10d process groups over loopback: 2 ranks (processes of tests/dist/dist_worker) with
// torchrun's environment; results against closed-form values, faults named by rank.
#include "rpg/dist/process_group.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <future>
#include <sstream>

#include "rpg/dist/data_parallel.h"

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
std::vector<ProcessResult> run_ranks(const std::vector<std::string>& args, int world = 2, std::vector<int> ranks = {},
                                     const std::vector<std::string>& extra_env = {}) {
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
    futures.push_back(std::async(std::launch::async, [=] {
      auto env = rank_env(r, world, port);
      env.insert(env.end(), extra_env.begin(), extra_env.end());
      return test::run_process(argv, env);
    }));
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
  EXPECT_EQ(results[1].exit_code, -9) << results[1].err;
  EXPECT_EQ(results[0].exit_code, 1) << results[0].out;
  EXPECT_TRUE(contains(results[0].err, "rpg: error: dist: rank 1 is lost (its heartbeat stopped")) << results[0].err;
  EXPECT_TRUE(contains(results[0].err, "rank 0: all_reduce (collective #2) failed")) << results[0].err;
}

TEST(ProcessGroup, KilledStoreHostIsNamed) {
  auto results = run_ranks({"kill", "0"});
  EXPECT_EQ(results[0].exit_code, -9) << results[0].err;
  EXPECT_EQ(results[1].exit_code, 1) << results[1].out;
  EXPECT_TRUE(contains(results[1].err, "rank 0 is lost")) << results[1].err;
}

TEST(ProcessGroup, FailedRankIsNamed) {
  auto results = run_ranks({"fail", "1"}, 3);
  EXPECT_EQ(results[1].exit_code, 1) << results[1].err;
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

// Gloo cannot connect (no such network interface) after the store rendezvous and the
// heartbeat thread started: one line and exit 1, not std::terminate on a running thread.
TEST(ProcessGroup, GlooConnectFailureIsOneLineNotACrash) {
  auto results = run_ranks({"hang"}, 2, {}, {"GLOO_SOCKET_IFNAME=rpg_no_such_if0"});
  for (int r : {0, 1}) {
    EXPECT_EQ(results[r].exit_code, 1) << results[r].err;
    EXPECT_TRUE(contains(results[r].err, "rpg: error: ")) << results[r].err;
    EXPECT_TRUE(contains(results[r].err, "connecting Gloo")) << results[r].err;
  }
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

namespace rpg::dist {
namespace {

TEST(DataParallel, ShardsKeepGroupsWhole) {
  EXPECT_EQ(shard(10, 2, 0, 2), (Shard{0, 6}));
  EXPECT_EQ(shard(10, 2, 1, 2), (Shard{6, 10}));
  EXPECT_EQ(shard(10, 3, 0, 2), (Shard{0, 4}));
  EXPECT_EQ(shard(10, 3, 1, 2), (Shard{4, 8}));
  EXPECT_EQ(shard(10, 3, 2, 2), (Shard{8, 10}));
  EXPECT_EQ(shard(2, 4, 3, 2), (Shard{2, 2}));  // more ranks than groups: empty shards
  EXPECT_THROW(shard(9, 2, 0, 2), ValueError);
  EXPECT_THROW(shard(10, 2, 2, 2), ValueError);
}

// "name v1 v2 ..." lines of `out`: the values of every line starting with `name`.
std::vector<double> values_of(const std::string& out, const std::string& name) {
  std::vector<double> v;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with(name + " ")) continue;
    std::istringstream words(line.substr(name.size()));
    std::string w;
    while (words >> w)
      if (w.find_first_not_of("0123456789.-+e") == std::string::npos) v.push_back(std::stod(w));
  }
  return v;
}

// 2 and 3 ranks of data-parallel AdamW steps (uneven shards of whole groups, micro-batches,
// the normaliser all-reduced, bucketed gradient all-reduce, global-norm clipping) end with
// the 1-rank weights and losses, to 1e-6 relative (summation order differs).
TEST(DataParallel, RanksEqualOneRank) {
  auto one = run_ranks({"train"}, 1);
  ASSERT_EQ(one[0].exit_code, 0) << one[0].err;
  const auto w1 = values_of(one[0].out, "weights"), l1 = values_of(one[0].out, "step");
  ASSERT_EQ(w1.size(), 4u * 8 + 8 + 8 + 1);
  ASSERT_EQ(l1.size(), 3u * 3);
  double scale = 0;
  for (double v : w1) scale = std::max(scale, std::abs(v));
  for (int world : {2, 3}) {
    auto results = run_ranks({"train"}, world);
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(results[r].exit_code, 0) << results[r].err;
      const auto w = values_of(results[r].out, "weights"), l = values_of(results[r].out, "step");
      ASSERT_EQ(w.size(), w1.size());
      ASSERT_EQ(l.size(), l1.size());
      for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], w1[i], 1e-6 * scale) << "world " << world << " rank " << r;
      for (size_t i = 0; i < l.size(); ++i)
        EXPECT_NEAR(l[i], l1[i], 1e-6 * std::abs(l1[i])) << "world " << world << " rank " << r << " value " << i;
    }
  }
  // The run is not trivially constant: the weights moved.
  auto first = values_of(one[0].out, "step");
  EXPECT_NE(first[1], first[7]);  // loss at step 0 vs step 2
}

// ZeRO-1 (rpg's AdamW and schedule-free AdamW; fp32 parameters, and bf16 ones with fp32 master
// copies in the optimizer): 2 and 3 ranks, each stepping its 1/N of the flattened parameters
// and all-gathering them, end with the replicated optimizer's weights and its full state
// (gathered by state()); each rank holds 1/N of the state's bytes (+ at most one element
// per slot from the uneven split).
TEST(DataParallel, ZeroOneEqualsReplicated) {
  for (const std::string type : {"adamw", "schedule_free_adamw"}) {
    for (const std::string dtype : {"float", "bfloat16"}) {
      const std::string what = type + " " + dtype;
      auto one = run_ranks({"zero1", type, dtype}, 1);
      ASSERT_EQ(one[0].exit_code, 0) << one[0].err;
      const auto w1 = values_of(one[0].out, "weights"), s1 = values_of(one[0].out, "state");
      const auto keys1 = values_of(one[0].out, "state_keys"), bytes1 = values_of(one[0].out, "state_bytes");
      ASSERT_EQ(w1.size(), 4u * 8 + 8 + 8 * 3 + 3) << what;
      ASSERT_EQ(bytes1.size(), 1u);
      // fp32 moments (+ an fp32 master copy for bf16 parameters) of 67 parameters.
      const int slots = dtype == "float" ? 2 : 3;
      EXPECT_EQ(bytes1[0], 67.0 * 4 * slots) << what;
      double scale = 0;
      for (double v : w1) scale = std::max(scale, std::abs(v));
      for (int world : {2, 3}) {
        auto results = run_ranks({"zero1", type, dtype}, world);
        double bytes_sum = 0;
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(results[r].exit_code, 0) << results[r].err;
          const auto w = values_of(results[r].out, "weights"), s = values_of(results[r].out, "state");
          ASSERT_EQ(w.size(), w1.size());
          for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(w[i], w1[i], 1e-6 * scale) << what << " world " << world << " rank " << r;
          EXPECT_EQ(values_of(results[r].out, "state_keys"), keys1) << what;
          ASSERT_EQ(s.size(), s1.size()) << what;
          for (size_t i = 0; i < s.size(); ++i)
            EXPECT_NEAR(s[i], s1[i], 1e-6 * std::max(1.0, std::abs(s1[i]))) << what << " world " << world << " value " << i;
          const double bytes = values_of(results[r].out, "state_bytes").at(0);
          EXPECT_LE(bytes, bytes1[0] / world + 4.0 * slots) << what << " world " << world << " rank " << r;
          bytes_sum += bytes;
        }
        EXPECT_EQ(bytes_sum, bytes1[0]) << what << " world " << world;
      }
    }
  }
}

}  // namespace
}  // namespace rpg::dist
