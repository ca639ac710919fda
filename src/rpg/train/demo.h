// `rpg demo`: a complete, real RL run on a laptop CPU with nothing downloaded.
//   synthetic math problems (train / validation / test that share no problem)
//   -> a byte-level BPE tokenizer trained on the training text
//   -> a small Qwen2 model initialised from scratch, in Hugging Face format
//   -> a short SFT warm start on worked solutions (a partly competent policy)
//   -> evaluation on the held-out test split
//   -> RL with RPG-REINFORCE-UFKL and RPG-Style Clip (0.2, 0.28), iterative reference,
//      dynamic sampling
//   -> evaluation again, and an HTML report.
// Every step is the real code path of the corresponding rpg command.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace rpg::train {

struct DemoOptions {
  std::filesystem::path out_dir = "runs/demo";
  uint64_t seed = 0;
  // Sizes (defaults: the full demo; `quick` shrinks everything for a smoke test).
  int64_t train_problems = 2000, test_problems = 200;
  int max_difficulty = 2;
  int64_t sft_steps = 300;
  int64_t rl_steps = 30;
  int64_t rl_prompts = 16;  // per RL step
  int64_t rl_n = 8;         // responses per prompt
  int64_t eval_n = 4;       // mean@eval_n on the test split
  int64_t max_response_tokens = 48;
  bool quick = false;
  bool progress = true;
};

struct DemoResult {
  double before = 0.0, after = 0.0;  // test mean@eval_n accuracy of the SFT model and after RL
  std::filesystem::path report;      // the HTML report
};

DemoResult run_demo(DemoOptions options);

}  // namespace rpg::train
