// `rpg train` and `rpg eval`: argument parsing only; the work is in rpg/train and rpg/eval.
#include <iostream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>

#include "rpg/cli/commands.h"
#include "rpg/core/args.h"
#include "rpg/core/config.h"
#include "rpg/core/error.h"
#include "rpg/core/signals.h"
#include "rpg/core/io.h"
#include "rpg/core/log.h"
#include "rpg/dist/world.h"
#include "rpg/eval/evaluate.h"
#include "rpg/model/lora.h"
#include "rpg/reward/reward_spec.h"
#include "rpg/train/checkpoint.h"
#include "rpg/train/dp.h"
#include "rpg/train/trainer.h"

namespace rpg::cli {

int run_train(const std::string& full_name, const std::vector<std::string>& args) {
  std::string file;
  std::vector<std::string> overrides;
  ArgParser parser(full_name,
                   "Runs RL training as configured: a YAML file in verl's key layout plus key=value overrides\n"
                   "(the overrides of a verl/RPG run script can be copied as they are). Metrics go to\n"
                   "trainer.default_local_dir (metrics.jsonl, TensorBoard), models to global_step_N/actor.");
  parser.positional("CONFIG", &file, "YAML file ('-' for defaults only)")
      .rest("KEY=VALUE", &overrides, "overrides, e.g. actor_rollout_ref.actor.policy_loss=rpg_reinforce")
      .epilog("example: rpg train recipes/rpg_reinforce_ufkl.yaml actor_rollout_ref.model.path=/models/qwen3-4b");
  if (!parser.parse(args)) return 0;
  signals::install_stop_handlers();  // SIGTERM/SIGINT: finish the step, checkpoint, exit 75
  // Under torchrun / srun / rpg launch (a bad environment is an error naming the variable):
  // join the data-parallel group (timeout: actor_rollout_ref.nccl_timeout) before any work,
  // so a missing rank is reported first; trainer.nnodes / n_gpus_per_node are checked.
  const auto layout = dist::layout_from_env();
  train::TrainConfig config = load_train_config(file, overrides);
  train::dp::join_world(config, layout);
  // The resolved configuration, beside the run's metrics and checkpoints.
  const std::string resolved = config_to_yaml(config);
  const std::filesystem::path run_dir = config.trainer.default_local_dir;
  {
    // Checkpoint rotation deletes old step directories: an input in there would go with them.
    std::vector<NamedPath> inputs{{"actor_rollout_ref.model.path", config.actor_rollout_ref.model.path}};
    for (const auto& f : config.data.train_files) inputs.push_back({"data.train_files", f});
    for (const auto& f : config.data.val_files) inputs.push_back({"data.val_files", f});
    check_output_apart({"trainer.default_local_dir", run_dir}, inputs);
  }
  // One writer per run directory (the main rank writes it), taken before anything is touched.
  const bool run_dir_existed = std::filesystem::exists(run_dir);
  std::optional<train::RunDirLock> lock;
  if (dist::is_main()) lock.emplace(run_dir);
  std::unique_ptr<train::Trainer> trainer;
  try {
    trainer = std::make_unique<train::Trainer>(std::move(config));
  } catch (...) {
    // Refused before training (config, data, model, resume state): leave no run directory
    // behind that the refused command made (remove only succeeds on an empty one).
    lock.reset();
    if (!run_dir_existed && dist::is_main()) {
      std::error_code ignored;
      std::filesystem::remove(run_dir, ignored);
    }
    throw;
  }
  if (dist::is_main()) write_file_atomic(run_dir / "config.yaml", resolved);
  trainer->fit();
  dist::shutdown_world();
  return 0;
}

int run_eval(const std::string& full_name, const std::vector<std::string>& args) {
  std::string model, output, responses, dtype = "auto", device = "auto", template_kwargs, scored_output;
  std::string reward_fn, reward_url, adapter;
  reward::RewardSpec reward_spec;
  std::vector<std::string> files;
  rollout::SamplingParams sampling;
  rollout::EngineOptions engine;
  int64_t seed = 0;
  bool no_progress = false, strict_box = false;
  sampling.temperature = 1.0;
  sampling.max_new_tokens = 4096;
  engine.kv_cache_memory_fraction = 0.8;  // as rpg train's rollout.kv_cache_memory_fraction
  ArgParser parser(full_name,
                   "Evaluates a model on datasets in the paper's schema: n responses per row, scored by the\n"
                   "data_source's rule (DAPO for math_dapo / aime* / amc*), reported as mean@n, pass@k and maj@n\n"
                   "per data_source, as verl's validation does.");
  parser.option("--model", &model, "Hugging Face model directory", "DIR")
      .option("--adapter", &adapter, "a LoRA adapter directory (PEFT's format, e.g. a LoRA run's checkpoint) on top", "DIR")
      .option_list("--data", &files, "Parquet dataset (repeatable)", "FILE")
      .option("--responses", &responses, "score this `rpg generate` output instead of generating", "FILE")
      .option("--n", &sampling.n, "responses per row (default 1)", "N")
      .option("--temperature", &sampling.temperature, "sampling temperature, 0 = greedy (default 1.0)", "T")
      .option("--top-p", &sampling.top_p, "nucleus mass (default 1.0)", "P")
      .option("--top-k", &sampling.top_k, "top-k, -1 = all (default -1)", "K")
      .option("--max-new-tokens", &sampling.max_new_tokens, "tokens per response (default 4096)", "N")
      .option("--seed", &seed, "random seed (default 0)", "S")
      .option("--max-num-seqs", &engine.max_num_seqs, "sequences decoded together (default 64)", "N")
      .option("--max-num-batched-tokens", &engine.max_num_batched_tokens,
              "most prompt tokens one prefill forward takes; longer prompts go in chunks (default 8192)", "N")
      .option("--kv-cache-memory-fraction", &engine.kv_cache_memory_fraction,
              "the KV cache's share of the memory available at the start, 0 = no bound (default 0.8)", "F")
      .option("--output", &output, "also write the metrics as JSON here", "FILE")
      .flag("--strict-box", &strict_box, "DAPO strict-box mode: judge only the last \\boxed{}")
      .option("--chat-template-kwargs", &template_kwargs,
              "JSON object of chat-template variables, as verl's data.apply_chat_template_kwargs "
              "(e.g. '{\"enable_thinking\": false}' for Qwen3)", "JSON")
      .option("--scored-output", &scored_output,
              "write every response with its score, acc and extracted prediction here (JSON lines)", "FILE")
      .option("--reward-fn", &reward_fn,
              "score with this Python file's function instead of the data_source's rule (verl's "
              "custom_reward_function; NAME defaults to compute_score)", "FILE[:NAME]")
      .option("--reward-url", &reward_url, "score with this reward service (docs/rewards.md)", "URL")
      .option("--reward-python", &reward_spec.python.python, "the Python that runs --reward-fn (default python3)", "PY")
      .option("--reward-workers", &reward_spec.python.num_workers,
              "--reward-fn worker processes / --reward-url requests in flight (default: one per core)", "N")
      .option("--reward-timeout", &reward_spec.python.timeout_s,
              "seconds per response (--reward-fn) or request (--reward-url) before it scores 0 (default 10)", "S")
      .option("--dtype", &dtype, "auto | float32 | bfloat16 | float16", "TYPE")
      .option("--device", &device, "auto | cpu | cuda", "DEV")
      .flag("--no-progress", &no_progress, "no progress bar");
  if (!parser.parse(args)) return 0;
  if (!reward_fn.empty()) {
    // FILE:NAME, where a ':' followed by a '/' is part of the path rather than a NAME.
    const size_t colon = reward_fn.rfind(':');
    const bool has_name = colon != std::string::npos && reward_fn.find('/', colon) == std::string::npos;
    reward_spec.python.path = has_name ? reward_fn.substr(0, colon) : reward_fn;
    if (has_name) reward_spec.python.name = reward_fn.substr(colon + 1);
    if (reward_spec.python.name.empty()) throw UsageError(str(full_name, ": --reward-fn ", reward_fn, ": empty NAME"));
  }
  if (reward_spec.python.num_workers < 0) throw UsageError(str(full_name, ": --reward-workers must be >= 0"));
  if (!(engine.kv_cache_memory_fraction >= 0 && engine.kv_cache_memory_fraction <= 1))
    throw UsageError(str(full_name, ": --kv-cache-memory-fraction must be in [0, 1], got ", engine.kv_cache_memory_fraction));
  if (engine.max_num_batched_tokens < 1)
    throw UsageError(str(full_name, ": --max-num-batched-tokens must be >= 1, got ", engine.max_num_batched_tokens));
  if (!(reward_spec.python.timeout_s > 0)) throw UsageError(str(full_name, ": --reward-timeout must be > 0"));
  if (!reward_url.empty() && !reward_fn.empty())
    throw UsageError(str(full_name, ": --reward-fn and --reward-url are both given: score with one of them"));
  reward_spec.http.url = reward_url;
  if (reward_spec.python.num_workers > 0) reward_spec.http.max_concurrency = reward_spec.python.num_workers;
  reward_spec.http.timeout_s = reward_spec.python.timeout_s;
  {
    std::vector<NamedPath> inputs{{"--model", model}, {"--responses", responses}, {"--adapter", adapter}};
    for (const auto& f : files) inputs.push_back({"--data", f});
    check_output_apart({"--output", output}, inputs);
    check_output_apart({"--scored-output", scored_output}, inputs);
  }
  reward::ScorerOptions so;
  so.strict_box_verify = strict_box;
  auto report_timeouts = [&](const eval::EvalResult& result) {
    if (result.reward_timeouts > 0)
      log_warn(str(result.reward_timeouts, " responses were not scored within ", reward_spec.python.timeout_s,
                   " s and count as 0 (--reward-timeout)"));
  };
  auto write_output = [&](const eval::MetricTable& metrics) {
    std::cout << eval::format_metrics(metrics);
    if (!output.empty()) write_file_atomic(output, nlohmann::json(metrics).dump(2) + "\n");
  };
  if (!responses.empty()) {
    if (!model.empty() || !files.empty())
      throw UsageError(str(full_name, ": --responses scores a file; do not also give --model or --data"));
    if (!template_kwargs.empty())
      throw UsageError(str(full_name, ": --chat-template-kwargs renders prompts; --responses does not generate"));
    auto scorer = reward::make_reward_scorer(reward_spec, reward::builtin_scorers(so));
    auto result = eval::evaluate_responses(responses, *scorer);
    report_timeouts(result);
    write_output(result.metrics);
    if (!scored_output.empty()) eval::write_scored_responses(scored_output, result);
    return 0;
  }
  if (model.empty()) throw UsageError(str(full_name, ": --model DIR is required"));
  if (files.empty()) throw UsageError(str(full_name, ": at least one --data FILE is required"));
  sampling.seed = static_cast<uint64_t>(seed);
  auto kwargs = tok::ChatTemplateKwargs::parse(template_kwargs, "--chat-template-kwargs");
  std::vector<data::Row> rows;
  for (const auto& f : files) {
    auto part = data::read_prompt_rows(f, "--data");
    rows.insert(rows.end(), part.begin(), part.end());
  }
  auto scorer = reward::make_reward_scorer(reward_spec, reward::builtin_scorers(so));
  auto policy = rollout::load_policy(model, dtype, device);
  if (!adapter.empty()) rpg::model::load_lora_adapter(policy.model, adapter);
  auto result = eval::evaluate(policy, rows, sampling, engine, *scorer, !no_progress, /*chat_template=*/true, kwargs);
  report_timeouts(result);
  write_output(result.metrics);
  if (!scored_output.empty()) eval::write_scored_responses(scored_output, result);
  log_info(str("evaluated ", rows.size(), " rows x ", sampling.n, " responses: ", result.stats.generated_tokens,
               " tokens in ", result.stats.seconds, " s"));
  return 0;
}

}  // namespace rpg::cli
