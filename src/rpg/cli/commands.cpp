// The command table, compiled twice: into the torch-free `rpg` front binary (RPG_CLI_FRONT;
// the commands that need libtorch have no entry point there and are run by exec'ing
// rpg-torch, see main.cpp) and into rpg-torch (every command).
#include "rpg/cli/commands.h"

namespace rpg::cli {

#ifdef RPG_CLI_FRONT
#define RPG_TORCH_COMMAND(f) nullptr
#else
#define RPG_TORCH_COMMAND(f) f
#endif

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"config show", "print the resolved training configuration (file + overrides + defaults)", RPG_TORCH_COMMAND(run_config_show)},
      {"version", "print rpg's version and the versions of its libraries", RPG_TORCH_COMMAND(run_version)},
      {"data prepare", "JSONL / CSV {problem, answer} records -> Parquet in the paper's schema", run_data_prepare},
      {"data show", "print a Parquet dataset's schema, row count and first rows", run_data_show},
      {"data synth", "seeded synthetic math problems (splits in Parquet + SFT JSONL) for the demo", run_data_synth},
      {"tokenizer train", "train a byte-level BPE tokenizer (Qwen2 style) on text; writes HF tokenizer files", run_tokenizer_train},
      {"model init", "a freshly initialised Qwen2 model directory (HF format) for a tokenizer, from a seed", RPG_TORCH_COMMAND(run_model_init)},
      {"model merge", "a LoRA adapter (PEFT's format) folded into its base model: a plain HF model directory", RPG_TORCH_COMMAND(run_model_merge)},
      {"generate", "sample responses from a model for a dataset or prompts (JSON lines)", RPG_TORCH_COMMAND(run_generate)},
      {"eval", "mean@n / pass@k / maj@n of a model on Parquet datasets, scored like verl", RPG_TORCH_COMMAND(run_eval)},
      {"demo", "a real RL run on the CPU from scratch: SFT warm start, RPG-REINFORCE, held-out eval", RPG_TORCH_COMMAND(run_demo)},
      {"train", "RL training (RPG, GRPO, DAPO, REINFORCE++) configured like verl", RPG_TORCH_COMMAND(run_train), true},
      {"plan", "print the memory per rank a training configuration needs (docs/scaling.md)", RPG_TORCH_COMMAND(run_plan)},
      {"launch", "run N ranks of a command on this node (torchrun's environment, output prefixed by rank)", RPG_TORCH_COMMAND(run_launch)},
      {"report", "HTML report of a run (summary, charts) or of several runs compared (Table 3 layout)", run_report},
      {"model info", "architecture, parameter count, dtype and memory of a model directory", run_model_info},
      {"tokenize", "ids and pieces of a text under a model directory's tokenizer", run_tokenize},
      {"sft", "supervised fine-tuning on (prompt, response) JSONL pairs, loss on responses only", RPG_TORCH_COMMAND(run_sft), true},
  };
  return table;
}

}  // namespace rpg::cli
