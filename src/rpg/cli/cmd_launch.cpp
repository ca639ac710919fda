// `rpg launch --nproc N -- train ...`: one node's ranks without Python (rpg/dist/launch.h).
#include <unistd.h>

#include <climits>
#include <filesystem>

#include "rpg/cli/commands.h"
#include "rpg/core/args.h"
#include "rpg/core/error.h"
#include "rpg/dist/launch.h"

namespace rpg::cli {

int run_launch(const std::string& full_name, const std::vector<std::string>& args) {
  // Everything after the first `--` is the rank's command, untouched by our parser.
  std::vector<std::string> own, command;
  bool after = false;
  for (const auto& a : args) {
    if (!after && a == "--") {
      after = true;
      continue;
    }
    (after ? command : own).push_back(a);
  }
  int64_t nproc = 1, nnodes = 1, node_rank = 0, master_port = 0;
  std::string master_addr = "127.0.0.1";
  bool exec = false, force = false;
  ArgParser parser(full_name,
                   "Runs N ranks of an rpg command on this node with torchrun's environment (RANK, WORLD_SIZE,\n"
                   "LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, NODE_RANK), each output line prefixed\n"
                   "'[rank k] '. If a rank fails the others are stopped and the launch fails naming that rank.\n"
                   "The command follows '--': rpg launch [options] -- COMMAND [ARGS...]");
  parser.option("--nproc", &nproc, "ranks on this node (default 1)", "N")
      .option("--nnodes", &nnodes, "nodes in the run (default 1)", "N")
      .option("--node-rank", &node_rank, "this node's index (default 0)", "K")
      .option("--master-addr", &master_addr, "address of rank 0's node (default 127.0.0.1)", "HOST")
      .option("--master-port", &master_port, "rendezvous port (default: a free port; required with --nnodes > 1)", "PORT")
      .flag("--exec", &exec, "the command after -- is a program and its arguments, not an rpg command (PATH is searched)")
      .flag("--force", &force, "run more ranks than the node's bound (8 per core, and ulimit -u)")
      .epilog("example: rpg launch --nproc 2 -- train recipes/rpg_reinforce_ufkl.yaml actor_rollout_ref.model.path=DIR\n"
              "several nodes: rpg launch --nnodes 2 --node-rank K --master-addr HOST0 --master-port 29500 --nproc 8 -- ...\n"
              "see docs/scaling.md");
  if (!parser.parse(own)) return 0;
  if (command.empty()) throw UsageError(str(full_name, ": give the command to run after --, e.g. -- train CONFIG"));
  // A typo (an extra digit or two) must not fork the machine to a halt: past this bound the
  // ranks only compete for cores, so asking for more is almost always a mistake.
  if (nproc < 1) throw UsageError(str("launch: --nproc must be >= 1, got ", nproc));
  if (nnodes < 1) throw UsageError(str("launch: --nnodes must be >= 1, got ", nnodes));
  std::string why;
  const int64_t bound = dist::max_local_ranks(&why);
  if (nproc > bound && !force)
    throw UsageError(str("launch: --nproc ", nproc, " exceeds this node's bound of ", bound, " ranks (", why,
                         "); pass --force to start them anyway"));
  if (nproc > INT_MAX || nnodes > INT_MAX)
    throw UsageError(str("launch: --nproc and --nnodes must be at most ", INT_MAX));
  if (node_rank < 0 || node_rank >= nnodes)
    throw UsageError(str("launch: --node-rank ", node_rank, " is not in [0, ", nnodes, ")"));
  dist::LaunchOptions o;
  o.nproc = static_cast<int>(nproc);
  o.nnodes = static_cast<int>(nnodes);
  o.node_rank = static_cast<int>(node_rank);
  o.master_addr = master_addr;
  if (master_port < 0 || master_port > 65535) throw UsageError(str(full_name, ": --master-port must be in [1, 65535]"));
  o.master_port = static_cast<int>(master_port);
  if (exec) {
    o.argv = command;
  } else {
    o.argv = {std::filesystem::read_symlink("/proc/self/exe").string()};
    o.argv.insert(o.argv.end(), command.begin(), command.end());
  }
  dist::launch(o);
  return 0;
}

}  // namespace rpg::cli
