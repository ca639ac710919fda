// Rollout throughput of rpg's engine on a model directory and token-id prompts; the peer
// side (transformers generate) and the ratio are in rollout_bench.py, which runs this.
//
//   rollout_bench --model DIR --prompts prompts.json --n N --max-new-tokens T
//                 [--stop id,id,...] [--temperature T] [--top-p P] [--top-k K] [--max-num-seqs S]
//                 [--max-num-batched-tokens T] [--seed S] [--dtype float32|bfloat16|float16]
// Prints one JSON object: generated tokens, seconds, tokens/s, peak RSS (VmHWM, MiB), the
// decode steps' seconds and count, prompt tokens and the forwards that prefilled them.
#include <ATen/Parallel.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "rpg/core/args.h"
#include "rpg/core/io.h"
#include "rpg/model/causal_lm.h"
#include "rpg/rollout/engine.h"

namespace {
double peak_rss_mib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, prompts_file, stop, dtype = "float32";
  rpg::rollout::SamplingParams p;
  rpg::rollout::EngineOptions e;
  int64_t seed = 0, threads = 0;
  rpg::ArgParser parser("rollout_bench", "rpg rollout throughput on token-id prompts");
  parser.option("--model", &model_dir, "model directory", "DIR")
      .option("--prompts", &prompts_file, "JSON list of token-id lists", "FILE")
      .option("--n", &p.n, "responses per prompt")
      .option("--max-new-tokens", &p.max_new_tokens, "tokens per response")
      .option("--stop", &stop, "comma-separated stop token ids", "IDS")
      .option("--temperature", &p.temperature, "sampling temperature (default 1.0)")
      .option("--top-p", &p.top_p, "nucleus mass (default 1.0)")
      .option("--top-k", &p.top_k, "top-k, -1 = all (default -1)")
      .option("--max-num-seqs", &e.max_num_seqs, "sequence slots")
      .option("--max-num-batched-tokens", &e.max_num_batched_tokens, "most prompt tokens per prefill forward")
      .option("--seed", &seed, "seed")
      .option("--threads", &threads, "intra-op threads (0: torch default)")
      .option("--dtype", &dtype, "weights and KV cache: float32 | bfloat16 | float16", "DTYPE");
  try {
    if (!parser.parse(std::vector<std::string>(argv + 1, argv + argc))) return 0;
    if (threads > 0) at::set_num_threads(static_cast<int>(threads));
    p.seed = static_cast<uint64_t>(seed);
    std::stringstream ss(stop);
    std::string id;
    while (std::getline(ss, id, ',')) p.stop_token_ids.push_back(std::stoll(id));
    auto prompts = nlohmann::json::parse(rpg::read_file(prompts_file)).get<std::vector<std::vector<int64_t>>>();
    rpg::model::LoadOptions lo;
    if (dtype == "float32") lo.dtype = at::kFloat;
    else if (dtype == "bfloat16") lo.dtype = at::kBFloat16;
    else if (dtype == "float16") lo.dtype = at::kHalf;
    else throw std::invalid_argument("--dtype: float32, bfloat16 or float16, not '" + dtype + "'");
    auto model = rpg::model::CausalLM::from_pretrained(model_dir, lo);
    rpg::rollout::RolloutEngine engine(model, e);
    auto out = engine.generate(prompts, p);
    const auto& s = engine.last_stats();
    std::vector<int64_t> lengths;
    for (const auto& r : out) lengths.push_back(static_cast<int64_t>(r.token_ids.size()));
    nlohmann::json j = {{"generated_tokens", s.generated_tokens}, {"seconds", s.seconds},
                        {"tokens_per_second", s.tokens_per_second()}, {"peak_rss_mib", peak_rss_mib()},
                        {"decode_seconds", s.decode_seconds}, {"decode_steps", s.decode_steps},
                        {"prompt_tokens", s.prompt_tokens}, {"prefill_forwards", s.prefill_forwards},
                        {"lengths", lengths}};
    std::cout << j.dump() << "\n";
  } catch (const std::exception& ex) {
    std::cerr << "rollout_bench: error: " << ex.what() << "\n";
    return 1;
  }
  return 0;
}
