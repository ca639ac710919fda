// rpg train's data-parallel keys: trainer.nnodes / trainer.n_gpus_per_node checked against
// what the launcher started, actor_rollout_ref.nccl_timeout as the process group's timeout,
// dist.zero_stage validated. Each error is the one-line `rpg: error:` naming the key.
#include <gtest/gtest.h>

#include "rpg/dist/launch.h"
#include "test_util.h"

namespace rpg::dist {
namespace {

using test::run_process;

std::vector<std::string> launched_train(const std::vector<std::string>& keys) {
  std::vector<std::string> argv = {test::rpg_binary().string(), "launch", "--nproc", "2", "--", "train", "-"};
  argv.insert(argv.end(), keys.begin(), keys.end());
  return argv;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(TrainDistConfig, GpusPerNodeMustMatchTheLaunch) {
  auto r = run_process(launched_train({"trainer.n_gpus_per_node=8"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(has(r.err, "rpg: error: trainer.n_gpus_per_node: 8, but 2 process(es) per node were launched")) << r.err;
  EXPECT_TRUE(has(r.err, "set trainer.n_gpus_per_node=2")) << r.err;
}

TEST(TrainDistConfig, NnodesMustMatchTheLaunch) {
  auto r = run_process(launched_train({"trainer.nnodes=2"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(has(r.err, "rpg: error: trainer.nnodes: 2, but 1 node(s) were launched")) << r.err;
}

// Matching keys pass the check: the run then fails later, on the (missing) model.
TEST(TrainDistConfig, MatchingKeysAreAccepted) {
  auto r = run_process(launched_train({"trainer.nnodes=1", "trainer.n_gpus_per_node=2"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_FALSE(has(r.err, "trainer.n")) << r.err;
  EXPECT_TRUE(has(r.err, "actor_rollout_ref.model.path: required")) << r.err;
}

// One process without a launcher runs verl's recipes (8 GPUs per node) with a notice only.
TEST(TrainDistConfig, LoneProcessOnlyNotes) {
  auto r = run_process({test::rpg_binary().string(), "train", "-", "trainer.n_gpus_per_node=8"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(has(r.err, "trainer.nnodes=1 x trainer.n_gpus_per_node=8 asks for more processes")) << r.err;
  EXPECT_TRUE(has(r.err, "actor_rollout_ref.model.path: required")) << r.err;
}

// Rank 0 of 2 started alone: with nccl_timeout=2 it gives up on rank 1 after 2 s (with
// verl's default, 600 s, this test would run into ctest's timeout instead).
TEST(TrainDistConfig, NcclTimeoutIsTheGroupTimeout) {
  const std::string port = std::to_string(free_port());
  auto r = run_process({test::rpg_binary().string(), "train", "-", "actor_rollout_ref.nccl_timeout=2"},
                       {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                        "MASTER_PORT=" + port});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(has(r.err, "rpg: error: dist: rank(s) 1 did not join the group at 127.0.0.1:" + port + " within 2 s"))
      << r.err;
}

TEST(TrainDistConfig, ZeroStageIsValidated) {
  auto two = run_process({test::rpg_binary().string(), "train", "-", "dist.zero_stage=2"});
  EXPECT_EQ(two.exit_code, 1);
  EXPECT_TRUE(has(two.err, "rpg: error: dist.zero_stage: 2 (sharded gradients) is not implemented yet")) << two.err;
  auto three = run_process({test::rpg_binary().string(), "train", "-", "dist.zero_stage=3"});
  EXPECT_EQ(three.exit_code, 1);
  EXPECT_TRUE(has(three.err, "rpg: error: dist.zero_stage: must be 0 or 1, got 3")) << three.err;
  auto bad = run_process({test::rpg_binary().string(), "train", "-", "actor_rollout_ref.nccl_timeout=0"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_TRUE(has(bad.err, "rpg: error: actor_rollout_ref.nccl_timeout: must be >= 1, got 0")) << bad.err;
}

}  // namespace
}  // namespace rpg::dist
