// `rpg generate`: argument parsing only; the work is in rpg/eval/generate.
#include <cmath>
#include <cstdint>

#include "rpg/cli/commands.h"
#include "rpg/core/args.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/log.h"
#include "rpg/eval/generate.h"
#include "rpg/tokenizer/tokenizer.h"

namespace rpg::cli {

int run_generate(const std::string& full_name, const std::vector<std::string>& args) {
  eval::GenerateOptions o;
  o.engine.kv_cache_memory_fraction = 0.8;  // as rpg train's rollout.kv_cache_memory_fraction
  std::string model, data, output, template_kwargs, adapter;
  int64_t seed = 0;
  bool no_chat_template = false, no_progress = false;
  ArgParser parser(full_name,
                   "Samples n responses per prompt from a Hugging Face model directory with rpg's rollout engine\n"
                   "(the model's chat template, KV cache, continuous batching) and writes one JSON line per\n"
                   "response: prompt, response text and ids, finish reason, data_source and ground truth.");
  parser.option("--model", &model, "Hugging Face model directory (weights, config, tokenizer)", "DIR")
      .option("--adapter", &adapter, "a LoRA adapter directory (PEFT's format, e.g. a LoRA run's checkpoint) on top", "DIR")
      .option("--data", &data, "Parquet dataset in the paper's schema", "FILE")
      .option_list("--prompt", &o.prompts, "a user message (repeatable; used without --data)", "TEXT")
      .option("--output", &output, "write JSON lines here (.jsonl) instead of stdout", "FILE")
      .option("--n", &o.sampling.n, "responses per prompt (default 1)", "N")
      .option("--temperature", &o.sampling.temperature, "sampling temperature, 0 = greedy (default 1.0)", "T")
      .option("--top-p", &o.sampling.top_p, "nucleus mass in (0, 1] (default 1.0)", "P")
      .option("--top-k", &o.sampling.top_k, "keep the k most likely tokens, -1 = all (default -1)", "K")
      .option("--max-new-tokens", &o.sampling.max_new_tokens, "tokens per response (default 512)", "N")
      .option("--seed", &seed, "random seed (default 0)", "S")
      .flag("--ignore-eos", &o.sampling.ignore_eos, "keep generating past end-of-sequence tokens")
      .option("--max-num-seqs", &o.engine.max_num_seqs, "sequences decoded together (default 64)", "N")
      .option("--max-kv-tokens", &o.engine.max_kv_tokens, "KV-cache budget in tokens, 0 = none (default 0)", "N")
      .option("--max-num-batched-tokens", &o.engine.max_num_batched_tokens,
              "most prompt tokens one prefill forward takes; longer prompts go in chunks (default 8192)", "N")
      .option("--kv-cache-memory-fraction", &o.engine.kv_cache_memory_fraction,
              "the KV cache's share of the memory available at the start, 0 = no bound (default 0.8)", "F")
      .option("--limit", &o.limit, "use only the first N rows of --data", "N")
      .flag("--no-chat-template", &no_chat_template, "encode the prompt text as is")
      .option("--chat-template-kwargs", &template_kwargs,
              "JSON object of chat-template variables, as verl's data.apply_chat_template_kwargs "
              "(e.g. '{\"enable_thinking\": false}' for Qwen3)", "JSON")
      .option("--dtype", &o.dtype, "auto | float32 | bfloat16 | float16 (default auto)", "TYPE")
      .option("--device", &o.device, "auto | cpu | cuda (default auto)", "DEV")
      .flag("--no-progress", &no_progress, "no progress bar")
      .epilog("example: rpg generate --model ckpt/step_100/actor --data aime-2024.parquet --n 4 --output out.jsonl");
  if (!parser.parse(args)) return 0;
  if (model.empty()) throw UsageError(str(full_name, ": --model DIR is required"));
  if (!data.empty() && !o.prompts.empty()) throw UsageError(str(full_name, ": give --data or --prompt, not both"));
  // Each count is checked here, named as the user typed it, before anything is loaded or
  // allocated: a count past these caps is a typo, not a workload.
  auto count = [&](const char* flag, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi) throw UsageError(str(full_name, ": ", flag, " must be in [", lo, ", ", hi, "], got ", v));
  };
  count("--n", o.sampling.n, 1, int64_t{1} << 20);
  count("--max-new-tokens", o.sampling.max_new_tokens, 1, int64_t{1} << 24);
  count("--max-num-seqs", o.engine.max_num_seqs, 1, int64_t{1} << 20);
  count("--max-kv-tokens", o.engine.max_kv_tokens, 0, int64_t{1} << 40);
  count("--max-num-batched-tokens", o.engine.max_num_batched_tokens, 1, int64_t{1} << 40);
  if (!(o.engine.kv_cache_memory_fraction >= 0 && o.engine.kv_cache_memory_fraction <= 1))
    throw UsageError(str(full_name, ": --kv-cache-memory-fraction must be in [0, 1], got ", o.engine.kv_cache_memory_fraction));
  count("--limit", o.limit, -1, INT64_MAX);
  if (o.sampling.top_k == 0 || o.sampling.top_k < -1)
    throw UsageError(str(full_name, ": --top-k must be -1 (all) or >= 1, got ", o.sampling.top_k));
  if (!(o.sampling.temperature >= 0.0) || !std::isfinite(o.sampling.temperature))
    throw UsageError(str(full_name, ": --temperature must be a finite number >= 0, got ", o.sampling.temperature));
  if (!(o.sampling.top_p > 0.0 && o.sampling.top_p <= 1.0))
    throw UsageError(str(full_name, ": --top-p must be in (0, 1], got ", o.sampling.top_p));
  if (!data.empty()) check_output_apart({"--output", output}, {{"--data", data}, {"--model", model}, {"--adapter", adapter}});
  else check_output_apart({"--output", output}, {{"--model", model}, {"--adapter", adapter}});
  o.model_dir = model;
  o.adapter = adapter;
  o.data = data;
  o.output = output;
  o.sampling.seed = static_cast<uint64_t>(seed);
  o.chat_template = !no_chat_template;
  o.chat_template_kwargs = tok::ChatTemplateKwargs::parse(template_kwargs, "--chat-template-kwargs");
  o.progress = !no_progress;
  auto s = eval::run_generate(o);
  log_info(str("generated ", s.responses, " responses for ", s.prompts, " prompts: ", s.stats.generated_tokens,
               " tokens in ", s.stats.seconds, " s (", static_cast<int64_t>(s.stats.tokens_per_second()), " tokens/s)",
               output.empty() ? "" : ", written to " + output));
  return 0;
}

}  // namespace rpg::cli
