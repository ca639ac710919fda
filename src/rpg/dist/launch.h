// `rpg launch`: one node's ranks as child processes, with torchrun's environment (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, NODE_RANK), each
// output line prefixed `[rank k] `. When a rank fails (non-zero exit or a signal) the
// others get SIGTERM, then SIGKILL after `grace`; the launch fails naming that rank.
// SIGINT / SIGTERM to the launcher are passed on to the ranks (a second one too, then
// SIGKILL after `grace`). Exit 75 (preempted: the ranks agreed to stop and saved) is not a
// failure: when every rank exits 75 the launch throws Preempted (rpg exits 75). Each rank
// gets PR_SET_PDEATHSIG, so a killed launcher takes its ranks with it. A signal that arrives
// while the ranks are still being started stops the start: the started ranks are killed
// (an incomplete world has nothing to save) and the launch fails.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace rpg::dist {

struct LaunchOptions {
  int nproc = 1;      // ranks on this node
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port of this machine (one node only)
  // A rank's program and its arguments; argv[0] without a '/' is looked up in PATH.
  std::vector<std::string> argv;
  std::chrono::milliseconds grace{std::chrono::seconds(5)};
};

// Runs the ranks to completion. Returns normally when every rank exited 0; throws Error
// "launch: rank K exited with code C (...)" naming the first rank that failed otherwise.
void launch(const LaunchOptions& options);

// The most ranks one node runs without --force: 8 per core, and no more than the user's
// process limit (ulimit -u) leaves room for. `why` (if given) describes the bound.
int64_t max_local_ranks(std::string* why = nullptr);

// `program` as execve needs it: itself when it holds a '/', else the first executable
// PATH entry of that name. Throws Error when there is none.
std::string find_program(const std::string& program);

// A TCP port that is free on every address right now, outside the kernel's ephemeral
// range where it can (see launch.cpp).
int free_port();

}  // namespace rpg::dist
