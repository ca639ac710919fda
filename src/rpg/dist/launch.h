// `rpg launch`: one node's ranks as child processes, with torchrun's environment (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, NODE_RANK), each
// output line prefixed `[rank k] `. When a rank fails (non-zero exit or a signal) the
// others get SIGTERM, then SIGKILL after `grace`; the launch fails naming that rank.
// SIGINT / SIGTERM to the launcher are passed on to the ranks (a second one too, then
// SIGKILL after `grace`). Exit 75 (preempted: the ranks agreed to stop and saved) is not a
// failure: when every rank exits 75 the launch throws Preempted (rpg exits 75). Each rank
// gets PR_SET_PDEATHSIG, so a killed launcher takes its ranks with it.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace rpg::dist {

struct LaunchOptions {
  int nproc = 1;      // ranks on this node
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port of this machine (one node only)
  std::vector<std::string> argv;  // a rank's program (argv[0], a path) and its arguments
  std::chrono::milliseconds grace{std::chrono::seconds(5)};
};

// Runs the ranks to completion. Returns normally when every rank exited 0; throws Error
// "launch: rank K exited with code C (...)" naming the first rank that failed otherwise.
void launch(const LaunchOptions& options);

// A TCP port that is free on 127.0.0.1 right now.
int free_port();

}  // namespace rpg::dist
