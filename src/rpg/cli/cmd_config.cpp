// `rpg config show` and `rpg version`: they need libtorch (the policy-loss registry, libtorch's
// thread count), so they live in the rpg-torch binary only.
#include <ATen/Parallel.h>

#include <cstdlib>
#include <iostream>

#include "rpg/cli/commands.h"
#include "rpg/core/args.h"
#include "rpg/core/build_info.h"
#include "rpg/core/config.h"
#include "rpg/algo/policy_loss.h"
#include "rpg/core/log.h"
#include "rpg/core/malloc_env.h"
#include "rpg/train/config.h"

namespace rpg::cli {

train::TrainConfig load_train_config(const std::string& file, const std::vector<std::string>& overrides) {
  auto loaded = load_config<train::TrainConfig>(file == "-" ? std::filesystem::path() : std::filesystem::path(file), overrides);
  for (const auto& notice : loaded.notices) log_info(notice);
  for (const auto& notice : loaded.value.resolve()) log_info(notice);  // aliases -> canonical keys
  return std::move(loaded.value);
}

int run_config_show(const std::string& full_name, const std::vector<std::string>& args) {
  std::string file;
  std::vector<std::string> overrides;
  std::string losses = "policy losses (actor_rollout_ref.actor.policy_loss; docs/algorithms.md):";
  for (const auto& name : algo::policy_loss_names()) {
    const auto& e = algo::policy_loss_registry().get(name);
    losses += str("\n  ", name, std::string(name.size() < 16 ? 16 - name.size() : 1, ' '), e.description,
                  e.needs_reference ? " [use_kl_loss: reference model]" : "");
  }
  ArgParser parser(full_name,
                   "Loads a training config (YAML), applies key=value overrides in order, fills in the\n"
                   "defaults and prints the result. Unknown keys, wrong types and out-of-range values are\n"
                   "errors naming the full key.");
  parser.positional("CONFIG", &file, "YAML file ('-' for defaults only)")
      .rest("KEY=VALUE", &overrides, "overrides, e.g. actor_rollout_ref.actor.optim.lr=1e-6")
      .epilog("example: rpg config show recipes/rpg_reinforce_ufkl.yaml data.train_batch_size=64\n\n" + losses);
  if (!parser.parse(args)) return 0;
  std::cout << config_to_yaml(load_train_config(file, overrides));
  return 0;
}

int run_version(const std::string& full_name, const std::vector<std::string>& args) {
  ArgParser parser(full_name,
                   "Prints the versions of rpg and of the libtorch it was built against, and the\n"
                   "intra-op thread count this process uses (rpg --threads N / RPG_NUM_THREADS) and its\n"
                   "OpenMP wait policy (passive when the machine was busy at start, else libgomp's default;\n"
                   "OMP_WAIT_POLICY or GOMP_SPINCOUNT set by you win), and which malloc it runs on (the tcmalloc\n"
                   "it links, one you preloaded, or glibc's: then freed memory is kept for reuse unless you\n"
                   "set GLIBC_TUNABLES or MALLOC_*_ thresholds).");
  if (!parser.parse(args)) return 0;
  std::cout << "rpg " << RPG_VERSION_STRING << " (libtorch " << RPG_TORCH_VERSION_STRING << ")\n";
  std::cout << "threads " << at::get_num_threads() << " (libtorch intra-op)\n";
  // What the front binary chose before libgomp loaded (core/openmp_env.h); absent when
  // rpg-torch was started directly.
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const char* choice = std::getenv("RPG_OMP_WAIT_POLICY_CHOICE");
  std::cout << "openmp wait policy " << (policy && *policy ? policy : "default") << " ("
            << (choice && *choice ? choice : "rpg-torch started directly: not chosen by rpg") << ")\n";
  std::cout << "malloc " << malloc_env::choice() << "\n";
  return 0;
}

}  // namespace rpg::cli
