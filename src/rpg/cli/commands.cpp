#include "rpg/cli/commands.h"

#include <ATen/Parallel.h>

#include <iostream>

#include "rpg/core/args.h"
#include "rpg/core/build_info.h"
#include "rpg/core/config.h"
#include "rpg/algo/policy_loss.h"
#include "rpg/core/log.h"
#include "rpg/train/config.h"

namespace rpg::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"config show", "print the resolved training configuration (file + overrides + defaults)", run_config_show},
      {"version", "print rpg's version and the versions of its libraries", run_version},
      {"data prepare", "JSONL / CSV {problem, answer} records -> Parquet in the paper's schema", run_data_prepare},
      {"data show", "print a Parquet dataset's schema, row count and first rows", run_data_show},
      {"data synth", "seeded synthetic math problems (splits in Parquet + SFT JSONL) for the demo", run_data_synth},
      {"tokenizer train", "train a byte-level BPE tokenizer (Qwen2 style) on text; writes HF tokenizer files", run_tokenizer_train},
      {"model init", "a freshly initialised Qwen2 model directory (HF format) for a tokenizer, from a seed", run_model_init},
      {"generate", "sample responses from a model for a dataset or prompts (JSON lines)", run_generate},
      {"eval", "mean@n / pass@k / maj@n of a model on Parquet datasets, scored like verl", run_eval},
      {"demo", "a real RL run on the CPU from scratch: SFT warm start, RPG-REINFORCE, held-out eval", run_demo},
      {"train", "RL training (RPG, GRPO, DAPO, REINFORCE++) configured like verl", run_train},
      {"plan", "print the memory per rank a training configuration needs (docs/scaling.md)", run_plan},
      {"launch", "run N ranks of a command on this node (torchrun's environment, output prefixed by rank)", run_launch},
      {"report", "HTML report of a run (summary, charts) or of several runs compared (Table 3 layout)", run_report},
      {"model info", "architecture, parameter count, dtype and memory of a model directory", run_model_info},
      {"tokenize", "ids and pieces of a text under a model directory's tokenizer", run_tokenize},
      {"sft", "supervised fine-tuning on (prompt, response) JSONL pairs, loss on responses only", run_sft},
  };
  return table;
}

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
                   "intra-op thread count this process uses (rpg --threads N / RPG_NUM_THREADS).");
  if (!parser.parse(args)) return 0;
  std::cout << "rpg " << RPG_VERSION_STRING << " (libtorch " << RPG_TORCH_VERSION_STRING << ")\n";
  std::cout << "threads " << at::get_num_threads() << " (libtorch intra-op)\n";
  return 0;
}

}  // namespace rpg::cli
