// `rpg sft`: argument parsing only; the work is in rpg/train/sft.
#include <iostream>

#include "rpg/cli/commands.h"
#include "rpg/core/args.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/signals.h"
#include "rpg/train/sft.h"

namespace rpg::cli {

int run_sft(const std::string& full_name, const std::vector<std::string>& args) {
  std::string model, data, output, scheduler;
  train::SftOptions o;
  int64_t steps = 0;
  bool no_progress = false;
  scheduler = o.lr_scheduler;
  ArgParser parser(full_name,
                   "Supervised fine-tuning on (prompt, response) pairs, the loss on response tokens only: each\n"
                   "prompt is rendered with the model's chat template, each response is followed by EOS.\n"
                   "Writes metrics.jsonl + TensorBoard events to OUT_DIR and the model to OUT_DIR/model.");
  parser.option("--model", &model, "Hugging Face model directory", "DIR")
      .option("--data", &data, "JSONL, one {\"prompt\": ..., \"response\": ...} per line", "FILE")
      .option("--output", &output, "output directory", "OUT_DIR")
      .option("--epochs", &o.epochs, "passes over the data (default 1)", "N")
      .option("--steps", &steps, "optimizer steps instead of epochs (repeats the data as needed)", "N")
      .option("--lr", &o.lr, "peak learning rate (default 1e-4)", "X")
      .option("--lr-scheduler", &scheduler, "cosine | constant (default cosine)", "NAME")
      .option("--warmup-ratio", &o.warmup_ratio, "warm-up steps as a fraction of all steps (default 0.05)", "X")
      .option("--weight-decay", &o.weight_decay, "AdamW weight decay (default 0)", "X")
      .option("--grad-clip", &o.grad_clip, "gradient-norm clip (default 1.0)", "X")
      .option("--batch-size", &o.batch_size, "pairs per optimizer step (default 8)", "N")
      .option("--micro-batch-size", &o.micro_batch_size, "pairs per forward/backward (default 8)", "N")
      .option("--max-length", &o.max_length, "prompt + response tokens; longer pairs are dropped (default 1024)", "N")
      .option("--seed", &o.seed, "shuffling seed (default 0)", "S")
      .option("--dtype", &o.dtype, "training dtype: float32 | bfloat16 | auto (default float32)", "TYPE")
      .option("--device", &o.device, "auto | cpu | cuda", "DEV")
      .flag("--no-progress", &no_progress, "no progress bar")
      .epilog("example: rpg sft --model /models/tiny --data synth/train_sft.jsonl --output runs/sft --epochs 2");
  if (!parser.parse(args)) return 0;
  signals::install_stop_handlers();  // SIGTERM/SIGINT: finish the step, checkpoint, exit 75
  if (model.empty()) throw UsageError(str(full_name, ": --model DIR is required"));
  if (data.empty()) throw UsageError(str(full_name, ": --data FILE is required"));
  if (output.empty()) throw UsageError(str(full_name, ": --output OUT_DIR is required"));
  check_output_apart({"--output", output}, {{"--model", model}, {"--data", data}});
  if (steps != 0) o.steps = steps;
  o.lr_scheduler = scheduler;
  o.progress = !no_progress;
  auto result = train::run_sft(model, data, output, o);
  std::cout << result.model_dir.string() << "\n";
  return 0;
}

}  // namespace rpg::cli
