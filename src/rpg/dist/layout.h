// Where this process sits in a multi-process run: its rank, the world size, its place on
// its node, and the rendezvous address (the c10d TCPStore on MASTER_ADDR:MASTER_PORT).
// Read from the environment that the launchers set:
//   torchrun / `rpg launch`: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//                            MASTER_PORT (NODE_RANK or GROUP_RANK optional);
//   SLURM (srun):            SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//                            SLURM_NNODES, SLURM_TASKS_PER_NODE, SLURM_(JOB_)NODELIST
//                            (MASTER_ADDR defaults to the first host of the node list,
//                            MASTER_PORT to 29500);
//   neither:                 one process (rank 0 of 1).
// torchrun's variables win when both are present (torchrun started by srun). A partial or
// malformed environment is a ConfigError naming the variable.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace rpg::dist {

struct RankLayout {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int nnodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single";  // "single", "torchrun" or "slurm"
  // torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True): ranks connect as
  // clients under the prefix /worker/attempt_<TORCHELASTIC_RESTART_COUNT>, as torch does.
  bool agent_store = false;
  int restart_count = 0;

  bool distributed() const { return world_size > 1; }
  bool operator==(const RankLayout&) const = default;
};

// Reads variables through `getenv` (tests pass a map lookup; nullptr = unset).
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
RankLayout layout_from_env(const EnvLookup& getenv);
RankLayout layout_from_env();  // the process environment

// The first host name of a SLURM host list: "node[01-04,07],gpu5" -> "node01",
// "rack[1-2]-n[3,5]" -> "rack1-n3", "a,b" -> "a". Throws ConfigError on an empty list or
// unbalanced brackets (`what` names the variable in the message).
std::string first_slurm_host(const std::string& nodelist, const std::string& what = "SLURM_NODELIST");

// Tasks on node `node` from SLURM_TASKS_PER_NODE's compressed form "2(x3),1" (node 0..2 run
// 2 tasks, node 3 runs 1). Throws ConfigError when malformed or `node` is out of range.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node);

// One line for logs: "rank 1/4 (local 1/2, node 0/2) via torchrun, store 10.0.0.1:29500".
std::string describe(const RankLayout& layout);

}  // namespace rpg::dist
