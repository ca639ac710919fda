// rpg's side of the GPU benchmark (scripts/gpu_check.sh runs it next to
// bench/gpu/hf_bench.py, transformers on the same shapes): a random Qwen2 of a
// Qwen2.5-0.5B / 1.5B shape (or a tiny one for the CPU dry run) in bf16 or fp32, and
//   --what train : forward + backward of the chunked token log-probs (the actor update's
//                  work) on [batch, seq] tokens; seconds per step (mean of --steps after
//                  --warmup), tokens/s. MFU is computed by the caller from the shape (verl's
//                  FLOP formula) so that both sides use one formula.
//   --what decode: the rollout engine sampling --new-tokens per prompt (no stop token, so
//                  every row generates all of them) for --batch prompts of --prompt-len
//                  random tokens; generated tokens/s.
//   --what graph : greedy decode steps of all --batch slots with fixed shapes
//                  (CausalLM::decode_all_slots, argmax on the device, no host sync per
//                  token), eager and replayed from one CUDA graph (cuda_graph.h); tokens/s
//                  of each and whether both produced the same tokens. Eager only without
//                  the CUDA plugin (the CPU).
//   --what packed: the training step (log-probs + entropy of the response tokens, a masked
//                  loss, backward) on one mixed-length micro-batch of --batch rows whose
//                  lengths vary 4x (--seq / 4 .. --seq; bench/common/mixed_batch.h), padded vs
//                  packed (LogProbOptions::remove_padding); real tokens/s of each.
//   --what engine: the rollout engine end to end (prefill, continuous batching, greedy),
//                  eager steps over the active rows vs fixed-slot steps replayed from a
//                  CUDA graph (EngineOptions::cuda_graph, what enforce_eager=false selects;
//                  fixed-slot eager without the plugin); tokens/s of each and how many
//                  responses came out identical (bf16 rounding may flip near-ties).
// Prints one JSON object per run. The device goes through rollout::parse_device, i.e. the
// same on-demand CUDA backend load as `rpg ... --device`.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../common/mixed_batch.h"
#include "rpg/core/args.h"
#include "rpg/core/device.h"
#include "rpg/core/error.h"
#include "rpg/model/causal_lm.h"
#include "rpg/model/config.h"
#include "rpg/model/cuda_graph.h"
#include "rpg/rollout/engine.h"
#include "rpg/rollout/policy.h"

namespace {

// Qwen2.5-0.5B / 1.5B's config.json values (random weights), and a tiny one.
std::string shape_json(const std::string& shape) {
  std::string common = R"("model_type": "qwen2", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
      "max_position_embeddings": 32768, "tie_word_embeddings": true)";
  if (shape == "0.5b")
    return R"({"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
      "num_attention_heads": 14, "num_key_value_heads": 2, )" + common + "}";
  if (shape == "1.5b")
    return R"({"vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
      "num_attention_heads": 12, "num_key_value_heads": 2, )" + common + "}";
  if (shape == "tiny")
    return R"({"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, )" + common + "}";
  throw rpg::UsageError("--shape: got '" + shape + "', expected 0.5b, 1.5b or tiny");
}

void sync(const at::Device& d) {
  if (d.is_cuda()) at::detail::getCUDAHooks().deviceSynchronize(d.index());
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<std::vector<int64_t>> random_prompts(int64_t vocab, int64_t batch, int64_t prompt_len) {
  std::vector<std::vector<int64_t>> prompts;
  at::Tensor r = at::randint(0, vocab, {batch, prompt_len}, at::kLong).contiguous();
  for (int64_t i = 0; i < batch; ++i) prompts.emplace_back(r[i].data_ptr<int64_t>(), r[i].data_ptr<int64_t>() + prompt_len);
  return prompts;
}

struct TimedGenerate {
  std::vector<rpg::rollout::Response> responses;
  double seconds = 0;
  rpg::rollout::GenerateStats stats;
};

// The engine's responses to `prompts`, the seconds they took and its stats, after a 4-token
// warm-up on up to 4 of them (allocator, kernels; CUDA graphs are captured per generate()
// call anyway, their capture inside the time).
TimedGenerate timed_generate(const rpg::model::CausalLM& model, const rpg::rollout::EngineOptions& options,
                             const std::vector<std::vector<int64_t>>& prompts,
                             const rpg::rollout::SamplingParams& params) {
  rpg::rollout::RolloutEngine engine(model, options);
  rpg::rollout::SamplingParams w = params;
  w.max_new_tokens = 4;
  engine.generate({prompts.begin(), prompts.begin() + std::min<size_t>(prompts.size(), 4)}, w);
  sync(model.device());
  const double t0 = now();
  auto out = engine.generate(prompts, params);
  sync(model.device());
  return {std::move(out), now() - t0, engine.last_stats()};
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "0.5b", device_name = "cuda", dtype_name = "bf16", what = "train";
  int64_t batch = 8, seq = 1024, steps = 5, warmup = 1, prompt_len = 128, new_tokens = 256, chunk = 1024, seed = 0;
  rpg::ArgParser parser("gpu_bench", "rpg's training-step and decode throughput on a random Qwen2 shape");
  parser.option("--shape", &shape, "0.5b | 1.5b | tiny")
      .option("--device", &device_name, "cuda | cpu | auto")
      .option("--dtype", &dtype_name, "bf16 | fp32")
      .option("--what", &what, "train | packed | decode | graph | engine")
      .option("--batch", &batch, "rows (train) or prompts (decode)")
      .option("--seq", &seq, "tokens per row (train)")
      .option("--steps", &steps, "timed steps (train)")
      .option("--warmup", &warmup, "untimed steps first (train)")
      .option("--chunk", &chunk, "log-prob chunk_tokens (train)")
      .option("--prompt-len", &prompt_len, "prompt tokens (decode)")
      .option("--new-tokens", &new_tokens, "generated tokens per prompt (decode)")
      .option("--seed", &seed, "seed");
  try {
    if (!parser.parse(std::vector<std::string>(argv + 1, argv + argc))) return 0;
    const at::Device dev = rpg::rollout::parse_device(device_name);
    const at::ScalarType dt = dtype_name == "bf16" ? at::kBFloat16 : at::kFloat;
    if (dtype_name != "bf16" && dtype_name != "fp32") throw rpg::UsageError("--dtype: expected bf16 or fp32");
    at::manual_seed(static_cast<uint64_t>(seed));
    const auto cfg = rpg::model::ModelConfig::from_json(shape_json(shape), "--shape " + shape);
    rpg::model::CausalLM model(cfg, dt, dev);
    nlohmann::json j = {{"impl", "rpg"},   {"what", what},   {"shape", shape},
                        {"device", dev.str()}, {"dtype", dtype_name}, {"params", cfg.num_parameters()}};
    if (what == "train") {
      at::Tensor ids = at::randint(0, cfg.vocab_size, {batch, seq}, at::kLong).to(dev);
      at::Tensor targets = ids.narrow(1, 1, seq - 1);
      rpg::model::LogProbOptions lo;
      lo.chunk_tokens = chunk;
      auto step = [&] {
        for (auto& p : model.parameters()) p.mutable_grad() = at::Tensor();
        at::Tensor lp = model.log_probs(ids, {}, {}, targets, lo).log_probs;
        (-lp.mean()).backward();
      };
      for (int64_t i = 0; i < warmup; ++i) step();
      sync(dev);
      const double t0 = now();
      for (int64_t i = 0; i < steps; ++i) step();
      sync(dev);
      const double s = (now() - t0) / static_cast<double>(steps);
      j.update({{"batch", batch}, {"seq", seq}, {"steps", steps}, {"seconds_per_step", s},
                {"tokens_per_second", static_cast<double>(batch * seq) / s}});
    } else if (what == "packed") {
      const rpg::bench::MixedBatch b = rpg::bench::mixed_batch(batch, std::max<int64_t>(2, seq / 4), seq, cfg.vocab_size);
      const at::Tensor ids = b.ids.to(dev), mask = b.attention_mask.to(dev), targets = b.targets.to(dev),
                       rmask = b.response_mask.to(dev);
      auto step = [&](bool packed) {
        for (auto& p : model.parameters()) p.mutable_grad() = at::Tensor();
        rpg::model::LogProbOptions o;
        o.with_entropy = true;
        o.remove_padding = packed;
        o.chunk_tokens = chunk;
        auto t = model.log_probs(ids, mask, {}, targets, o);
        (((t.log_probs + 0.01 * t.entropy) * rmask).sum() / rmask.sum()).backward();
      };
      auto seconds = [&](bool packed) {
        for (int64_t i = 0; i < warmup; ++i) step(packed);
        sync(dev);
        const double t0 = now();
        for (int64_t i = 0; i < steps; ++i) step(packed);
        sync(dev);
        return (now() - t0) / static_cast<double>(steps);
      };
      const double padded = seconds(false), packed = seconds(true);
      const auto real = static_cast<double>(b.real_tokens);
      j.update({{"batch", batch}, {"width", b.width}, {"real_tokens", b.real_tokens}, {"steps", steps},
                {"padded_seconds_per_step", padded}, {"packed_seconds_per_step", packed},
                {"padded_tokens_per_second", real / padded}, {"packed_tokens_per_second", real / packed},
                {"speedup", padded / packed}});
    } else if (what == "decode") {
      rpg::rollout::SamplingParams p;
      p.temperature = 1.0;
      p.max_new_tokens = new_tokens;
      p.seed = static_cast<uint64_t>(seed);
      const TimedGenerate t = timed_generate(model, {batch, 0}, random_prompts(cfg.vocab_size, batch, prompt_len), p);
      const double s = t.seconds;
      int64_t generated = 0;
      for (const auto& o : t.responses) generated += static_cast<int64_t>(o.token_ids.size());
      j.update({{"batch", batch}, {"prompt_len", prompt_len}, {"new_tokens", new_tokens}, {"seconds", s},
                {"generated_tokens", generated}, {"tokens_per_second", static_cast<double>(generated) / s}});
    } else if (what == "graph") {
      at::NoGradGuard no_grad;
      const int64_t S = batch, steps_n = new_tokens - 2;
      if (steps_n < 1) throw rpg::UsageError("--new-tokens: at least 3 for --what graph");
      rpg::model::KVCache cache = model.new_cache(S, prompt_len + new_tokens);
      std::vector<int64_t> all(static_cast<size_t>(S));
      for (int64_t i = 0; i < S; ++i) all[static_cast<size_t>(i)] = i;
      at::Tensor prompts = at::randint(0, cfg.vocab_size, {S, prompt_len}, at::kLong).to(dev);
      auto long_opt = at::TensorOptions().dtype(at::kLong).device(dev);
      at::Tensor tok = at::empty({S, 1}, long_opt), pos = at::empty({S}, long_opt);
      auto prefill = [&] {
        cache.reset();
        rpg::model::CausalLM::DecodeOptions o;
        o.last_only = true;
        tok.copy_(model.decode(cache, all, prompts, o).argmax(-1, true));
        pos.fill_(prompt_len);
      };
      auto step = [&] {
        at::Tensor logits = model.decode_all_slots(cache, tok, pos);  // [S, 1, V]
        tok.copy_(logits.select(1, 0).argmax(-1, true));
        pos.add_(1);
      };
      auto run = [&](const std::function<void()>& one, at::Tensor& hist) {
        hist = at::empty({S, steps_n + 1}, long_opt);
        hist.select(1, 0).copy_(tok.view({S}));
        sync(dev);
        const double t0 = now();
        for (int64_t i = 1; i <= steps_n; ++i) {
          one();
          hist.select(1, i).copy_(tok.view({S}));
        }
        sync(dev);
        return now() - t0;
      };
      at::Tensor eager_hist, graph_hist;
      prefill();
      step();  // warm-up, as the capture's own warm-up step below
      const double t_eager = run(step, eager_hist);
      j.update({{"batch", S}, {"prompt_len", prompt_len}, {"steps", steps_n}, {"eager_seconds", t_eager},
                {"eager_tokens_per_second", static_cast<double>(S * steps_n) / t_eager}});
      if (rpg::model::cuda_graphs_available()) {
        prefill();
        auto graph = rpg::model::capture_cuda_graph(step);  // runs one warm-up step
        const double t_graph = run([&] { graph->replay(); }, graph_hist);
        j.update({{"graph_seconds", t_graph}, {"graph_tokens_per_second", static_cast<double>(S * steps_n) / t_graph},
                  {"graph_equals_eager", at::equal(graph_hist, eager_hist)},
                  {"graph_speedup", t_eager / t_graph}});
      } else {
        j["graph"] = "unavailable (no CUDA plugin loaded: CPU run)";
      }
    } else if (what == "engine") {
      const auto prompts = random_prompts(cfg.vocab_size, batch, prompt_len);
      rpg::rollout::SamplingParams p;
      p.temperature = 0;
      p.max_new_tokens = new_tokens;
      rpg::rollout::EngineOptions eager{batch, 0}, fixed{batch, 0};
      fixed.fixed_slots = true;
      fixed.cuda_graph = dev.is_cuda() && rpg::model::cuda_graphs_available();
      const TimedGenerate e = timed_generate(model, eager, prompts, p);
      const TimedGenerate f = timed_generate(model, fixed, prompts, p);
      const double t_eager = e.seconds, t_fixed = f.seconds;
      int64_t generated = 0, identical = 0;
      for (size_t i = 0; i < e.responses.size(); ++i) {
        generated += static_cast<int64_t>(e.responses[i].token_ids.size());
        identical += e.responses[i].token_ids == f.responses[i].token_ids;
      }
      j.update({{"batch", batch}, {"prompt_len", prompt_len}, {"new_tokens", new_tokens},
                {"eager_seconds", t_eager}, {"eager_tokens_per_second", static_cast<double>(generated) / t_eager},
                {"fixed_seconds", t_fixed}, {"fixed_tokens_per_second", static_cast<double>(generated) / t_fixed},
                {"cuda_graph", fixed.cuda_graph}, {"speedup", t_eager / t_fixed},
                {"graphs_captured", f.stats.graphs_captured},
                // the share of the whole cache the fixed-slot steps attended (1: every step all of it)
                {"attended_share", static_cast<double>(f.stats.attended_positions) /
                                       static_cast<double>(std::max<int64_t>(1, f.stats.decode_steps * (prompt_len + new_tokens)))},
                {"identical_responses", identical}, {"responses", static_cast<int64_t>(e.responses.size())}});
    } else {
      throw rpg::UsageError("--what: got '" + what + "', expected train, packed, decode, graph or engine");
    }
    j["sdpa"] = rpg::model::sdpa_backends();  // which fused attention kernels ran
    // As hf_bench.py's torch.cuda.max_memory_allocated(): the allocator's peak of this process.
    if (const auto peaks = dev.is_cuda() ? rpg::device::cuda_memory_peaks(static_cast<int>(dev.index())) : std::nullopt)
      j["max_memory_allocated_gb"] = static_cast<double>(peaks->allocated) / (1 << 30);
    std::cout << j.dump() << std::endl;
  } catch (const std::exception& e) {
    std::string m = e.what();
    if (auto nl = m.find('\n'); nl != std::string::npos) m.resize(nl);
    std::cerr << "gpu_bench: error: " << m << "\n";
    return 1;
  }
  return 0;
}
