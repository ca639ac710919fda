// `rpg plan CONFIG [overrides] [--world-size N]`: docs/scaling.md's memory estimate per rank
// for a training configuration (the model: src/rpg/dist/plan.h).
#include <iostream>

#include "rpg/cli/commands.h"
#include "rpg/core/args.h"
#include "rpg/core/error.h"
#include "rpg/dist/plan.h"
#include "rpg/train/dp.h"

namespace rpg::cli {

int run_plan(const std::string& full_name, const std::vector<std::string>& args) {
  std::string file;
  std::vector<std::string> overrides;
  int64_t world = 1;
  ArgParser parser(full_name,
                   "Prints the memory one rank of `rpg train CONFIG [overrides]` needs (docs/scaling.md's model):\n"
                   "weights, gradients, optimizer state (sharded with dist.zero_stage=1 or 2), the compute copy, a fixed\n"
                   "reference model, one micro-batch's activations and the rollout's KV cache.");
  parser.positional("CONFIG", &file, "YAML file ('-' for defaults only)")
      .option("--world-size", &world, "ranks in the run (default 1)", "N")
      .rest("KEY=VALUE", &overrides, "overrides, as for rpg train")
      .epilog("example: rpg plan recipes/rpg_reinforce_ufkl.yaml --world-size 8 dist.zero_stage=1");
  if (!parser.parse(args)) return 0;
  if (world < 1) throw UsageError(str(full_name, ": --world-size must be >= 1, got ", world));
  const train::TrainConfig cfg = load_train_config(file, overrides);
  const dist::PlanInput in = train::dp::plan_input(cfg, world);
  std::cout << dist::format_plan(cfg.actor_rollout_ref.model.path, in, dist::estimate(in)) << std::flush;
  return 0;
}

}  // namespace rpg::cli
