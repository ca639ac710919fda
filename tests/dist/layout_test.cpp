// Rank layouts from torchrun's and SLURM's environments (variables set by the test).
#include "rpg/dist/layout.h"

#include <gtest/gtest.h>

#include <map>

#include "rpg/core/error.h"

namespace rpg::dist {
namespace {

using Env = std::map<std::string, std::string>;

RankLayout parse(const Env& env) {
  return layout_from_env([&](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

// The ConfigError message of parsing `env` ("" when it parses).
std::string error_of(const Env& env) {
  try {
    parse(env);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// torchrun --nnodes 2 --nproc-per-node 4, the rank on node 1 with local rank 2.
Env torchrun_env() {
  return {{"RANK", "6"},           {"WORLD_SIZE", "8"},     {"LOCAL_RANK", "2"},
          {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "node01"}, {"MASTER_PORT", "29400"},
          {"GROUP_RANK", "1"}};
}

// srun -N 2 --ntasks-per-node 4 on nodes node[01-02], the same rank.
Env slurm_env() {
  return {{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"},          {"SLURM_LOCALID", "2"},
          {"SLURM_NODEID", "1"}, {"SLURM_NNODES", "2"},          {"SLURM_TASKS_PER_NODE", "4(x2)"},
          {"SLURM_JOB_NODELIST", "node[01-02]"}, {"MASTER_PORT", "29400"}};
}

TEST(Layout, NoLauncherIsOneProcess) {
  RankLayout l = parse({{"PATH", "/bin"}});
  EXPECT_EQ(l, RankLayout{});
  EXPECT_FALSE(l.distributed());
}

TEST(Layout, Torchrun) {
  RankLayout l = parse(torchrun_env());
  EXPECT_EQ(l.rank, 6);
  EXPECT_EQ(l.world_size, 8);
  EXPECT_EQ(l.local_rank, 2);
  EXPECT_EQ(l.local_world_size, 4);
  EXPECT_EQ(l.node_rank, 1);
  EXPECT_EQ(l.nnodes, 2);
  EXPECT_EQ(l.master_addr, "node01");
  EXPECT_EQ(l.master_port, 29400);
  EXPECT_EQ(l.source, "torchrun");
  EXPECT_FALSE(l.agent_store);
  EXPECT_TRUE(l.distributed());
}

TEST(Layout, TorchrunNodeRankDefaultsFromRank) {
  Env env = torchrun_env();
  env.erase("GROUP_RANK");
  EXPECT_EQ(parse(env).node_rank, 1);
  env["NODE_RANK"] = "1";
  EXPECT_EQ(parse(env).node_rank, 1);
  env["NODE_RANK"] = "0";  // rank 6 cannot sit on node 0 with 4 ranks per node
  EXPECT_NE(error_of(env).find("RANK=6 does not match NODE_RANK 0"), std::string::npos) << error_of(env);
}

TEST(Layout, TorchrunAgentStore) {
  Env env = torchrun_env();
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  env["TORCHELASTIC_RESTART_COUNT"] = "2";
  RankLayout l = parse(env);
  EXPECT_TRUE(l.agent_store);
  EXPECT_EQ(l.restart_count, 2);
}

TEST(Layout, SlurmEqualsTorchrun) {
  RankLayout a = parse(torchrun_env()), b = parse(slurm_env());
  EXPECT_EQ(b.source, "slurm");
  b.source = a.source;
  EXPECT_EQ(a, b) << describe(a) << "\n" << describe(b);
}

TEST(Layout, SlurmDefaultsAndPrecedence) {
  Env env = slurm_env();
  env.erase("MASTER_PORT");
  env["SLURM_JOB_NODELIST"] = "gpu[007-012,020],cpu1";
  RankLayout l = parse(env);
  EXPECT_EQ(l.master_addr, "gpu007");
  EXPECT_EQ(l.master_port, 29500);
  env["MASTER_ADDR"] = "10.1.2.3";
  EXPECT_EQ(parse(env).master_addr, "10.1.2.3");
  // torchrun started by srun: torchrun's variables win.
  Env both = slurm_env();
  for (auto& [k, v] : torchrun_env()) both[k] = v;
  both["SLURM_PROCID"] = "0";
  EXPECT_EQ(parse(both).source, "torchrun");
  EXPECT_EQ(parse(both).rank, 6);
}

TEST(Layout, SlurmUnevenTasksPerNode) {
  Env env = slurm_env();
  env["SLURM_TASKS_PER_NODE"] = "3,5";
  env["SLURM_LOCALID"] = "4";
  EXPECT_EQ(parse(env).local_world_size, 5);
  env["SLURM_NODEID"] = "0";
  EXPECT_NE(error_of(env).find("SLURM_LOCALID=4 is not below the 3 tasks of node 0"), std::string::npos) << error_of(env);
}

TEST(Layout, PartialTorchrunNamesTheMissingVariable) {
  for (const char* missing : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
    Env env = torchrun_env();
    env.erase(missing);
    std::string e = error_of(env);
    EXPECT_NE(e.find(str("torchrun environment is incomplete: ", missing, " is not set")), std::string::npos)
        << missing << ": " << e;
  }
}

TEST(Layout, PartialSlurmNamesTheMissingVariable) {
  for (const char* missing : {"SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NNODES", "SLURM_TASKS_PER_NODE",
                              "SLURM_JOB_NODELIST"}) {
    Env env = slurm_env();
    env.erase(missing);
    std::string e = error_of(env);
    // The node list may come from any of three variables; the message names the last one tried.
    std::string named = std::string(missing) == "SLURM_JOB_NODELIST" ? "SLURM_NODELIST" : missing;
    EXPECT_NE(e.find(str("SLURM environment is incomplete: ", named, " is not set")), std::string::npos)
        << missing << ": " << e;
  }
}

TEST(Layout, BadValuesNameTheVariable) {
  struct Case {
    const char* var;
    const char* value;
    const char* message;
  } cases[] = {
      {"RANK", "six", "RANK='six' is not an integer"},
      {"RANK", "6x", "RANK='6x' is not an integer"},
      {"RANK", "", "RANK is empty"},
      {"RANK", "8", "RANK=8 is not below WORLD_SIZE=8"},
      {"RANK", "-1", "RANK=-1 is out of range"},
      {"WORLD_SIZE", "0", "WORLD_SIZE=0 is out of range"},
      {"LOCAL_WORLD_SIZE", "5", "WORLD_SIZE=8 is not a multiple of LOCAL_WORLD_SIZE=5"},
      {"LOCAL_RANK", "4", "LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"},
      {"MASTER_PORT", "70000", "MASTER_PORT=70000 is out of range [1, 65535]"},
      {"MASTER_ADDR", "", "MASTER_ADDR is empty"},
      {"GROUP_RANK", "2", "GROUP_RANK=2 is not below the number of nodes 2"},
  };
  for (const auto& c : cases) {
    Env env = torchrun_env();
    env[c.var] = c.value;
    std::string e = error_of(env);
    EXPECT_NE(e.find(c.message), std::string::npos) << c.var << "=" << c.value << ": " << e;
  }
  Env env = slurm_env();
  env["SLURM_TASKS_PER_NODE"] = "4(x2";
  EXPECT_NE(error_of(env).find("SLURM_TASKS_PER_NODE: '4(x2' is not a task count list"), std::string::npos)
      << error_of(env);
  env = slurm_env();
  env["SLURM_JOB_NODELIST"] = "node[01-02";
  EXPECT_NE(error_of(env).find("SLURM_JOB_NODELIST='node[01-02' has unbalanced brackets"), std::string::npos)
      << error_of(env);
}

TEST(Layout, FirstSlurmHost) {
  EXPECT_EQ(first_slurm_host("node[01-04,07]"), "node01");
  EXPECT_EQ(first_slurm_host("node[07,01-04]"), "node07");
  EXPECT_EQ(first_slurm_host("gpu5,node[1-2]"), "gpu5");
  EXPECT_EQ(first_slurm_host("node[1-2],gpu5"), "node1");
  EXPECT_EQ(first_slurm_host("rack[1-2]-n[3,5]"), "rack1-n3");
  EXPECT_EQ(first_slurm_host("single"), "single");
  EXPECT_THROW(first_slurm_host(""), ConfigError);
  EXPECT_THROW(first_slurm_host("n[]"), ConfigError);
  EXPECT_THROW(first_slurm_host("n[a-b]"), ConfigError);
  EXPECT_THROW(first_slurm_host("n]1["), ConfigError);
}

TEST(Layout, SlurmTasksPerNode) {
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("8", 0), 8);
  EXPECT_THROW(slurm_tasks_on_node("2(x3),1", 4), ConfigError);
  EXPECT_THROW(slurm_tasks_on_node("2(3)", 0), ConfigError);
  EXPECT_THROW(slurm_tasks_on_node("", 0), ConfigError);
}

}  // namespace
}  // namespace rpg::dist
