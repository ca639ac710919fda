// Model benchmark: throughput of our forward / log-probs next to transformers' on the same
// checkpoint (ratios > 1 mean we are faster), and the peak memory of the chunked log-prob
// path against the naive full-logits computation at vocab 151936, seq 2048.
//
//   model_bench [--threads N] [--skip-throughput] [--skip-memory]
//
// Peak memory is measured in child processes (this binary re-executed with --child) on
// Linux: /proc/self/clear_refs resets VmHWM after setup, VmHWM - VmRSS(before) is the
// extra peak of the measured step. Build: cmake --build <dir> --target model_bench.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "rpg/model/causal_lm.h"

namespace fs = std::filesystem;
using rpg::model::CausalLM;
using rpg::model::LogProbOptions;

namespace {

std::string run_capture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("cannot run " + cmd);
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  if (pclose(p) != 0) throw std::runtime_error("failed: " + cmd + "\n" + out);
  return out;
}

double proc_status_mb(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key + ":", 0) == 0) return std::stod(line.substr(key.size() + 1)) / 1024.0;  // kB -> MB
  return -1;
}

template <class F>
double median_seconds(F&& f, int repeats) {
  f();
  std::vector<double> ts;
  for (int i = 0; i < repeats; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

std::string config_json(int64_t vocab, int64_t hidden, int64_t layers, int64_t heads, int64_t kv, int64_t inter) {
  return "{\"model_type\": \"qwen2\", \"vocab_size\": " + std::to_string(vocab) + ", \"hidden_size\": " +
         std::to_string(hidden) + ", \"num_hidden_layers\": " + std::to_string(layers) +
         ", \"num_attention_heads\": " + std::to_string(heads) + ", \"num_key_value_heads\": " + std::to_string(kv) +
         ", \"intermediate_size\": " + std::to_string(inter) + ", \"max_position_embeddings\": 4096}";
}

// One measured step in a fresh process; prints the extra peak in MB.
int child(const std::string& mode, bool grad) {
  const int64_t V = 151936, T = 2048;
  at::manual_seed(0);
  CausalLM m(rpg::model::ModelConfig::from_json(config_json(V, 896, 1, 14, 2, 4864), "bench"), at::kFloat);
  at::Tensor ids = at::randint(0, V, {1, T}, at::kLong);
  at::Tensor targets = ids.narrow(1, 1, T - 1);
  std::optional<at::NoGradGuard> no_grad;
  if (!grad) no_grad.emplace();
  { std::ofstream("/proc/self/clear_refs") << "5"; }
  double before = proc_status_mb("VmRSS");
  { std::ofstream("/proc/self/clear_refs") << "5"; }
  at::Tensor loss;
  if (mode == "naive") {
    at::Tensor z = m.forward(ids).narrow(1, 0, T - 1).to(at::kFloat) / 0.7;
    at::Tensor lp = at::log_softmax(z, -1);
    at::Tensor logp = lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
    at::Tensor ent = -(lp.exp() * lp).sum(-1);
    loss = logp.sum() + ent.sum();
  } else {
    auto r = m.log_probs(ids, {}, {}, targets, LogProbOptions{0.7, true, 256});
    loss = r.log_probs.sum() + r.entropy.sum();
  }
  if (grad) loss.backward();
  double peak = proc_status_mb("VmHWM");
  double grads_mb = 0;
  if (grad)
    for (auto& p : m.parameters()) grads_mb += p.numel() * 4.0 / (1024.0 * 1024.0);
  std::printf("%.1f %.1f\n", peak - before, grads_mb);
  return 0;
}

void memory_report(const std::string& self) {
  std::printf("\n== peak memory of log-probs + entropy, vocab 151936, seq 2048, hidden 896, fp32 ==\n");
  for (bool grad : {false, true}) {
    double naive = 0, chunked = 0, grads = 0;
    for (std::string mode : {"naive", "chunked"}) {
      std::string out = run_capture(self + " --child " + mode + (grad ? " grad" : " nograd"));
      double mb = 0, g = 0;
      std::sscanf(out.c_str(), "%lf %lf", &mb, &g);
      (mode == "naive" ? naive : chunked) = mb;
      grads = g;
    }
    if (!grad) {
      std::printf("no grad:   naive %8.1f MB   chunked (256 rows) %8.1f MB   ratio %.3f\n", naive, chunked,
                  chunked / naive);
    } else {
      std::printf("with grad: naive %8.1f MB   chunked (256 rows) %8.1f MB   ratio %.3f\n", naive, chunked,
                  chunked / naive);
      std::printf("           excluding the %.1f MB of parameter gradients both must hold: ratio %.3f\n", grads,
                  (chunked - grads) / (naive - grads));
    }
  }
}

void throughput_report(const std::string& python, const fs::path& script, int threads) {
  const int B = 4, T = 256, repeats = 3;
  fs::path dir = fs::temp_directory_path() / ("rpg-model-bench-" + std::to_string(getpid()));
  run_capture(python + " " + script.string() + " make " + dir.string() + " 32000 512 4 8 2 1408 2>/dev/null");
  nlohmann::json hf = nlohmann::json::parse(run_capture(python + " " + script.string() + " time " + dir.string() + " " +
                                                        std::to_string(B) + " " + std::to_string(T) + " " +
                                                        std::to_string(repeats) + " " + std::to_string(threads) +
                                                        " 2>/dev/null"));
  at::set_num_threads(threads);
  CausalLM m = CausalLM::from_pretrained(dir);
  fs::remove_all(dir);
  at::NoGradGuard no_grad;
  at::manual_seed(0);
  at::Tensor ids = at::randint(0, 32000, {B, T}, at::kLong), mask = at::ones({B, T}, at::kLong);
  double fwd = median_seconds([&] { m.forward(ids, mask); }, repeats);
  double lp = median_seconds(
      [&] { m.log_probs(ids, mask, {}, ids.narrow(1, 1, T - 1), LogProbOptions{0.7, true, 1024}); }, repeats);
  // Greedy generation through the KV cache: prefill 64-token prompts, 64 decode steps.
  const int64_t prompt = 64, fresh = 64;
  double gen = median_seconds(
      [&] {
        auto cache = m.new_cache(B, prompt + fresh);
        std::vector<int64_t> slots(B);
        for (int64_t i = 0; i < B; ++i) slots[i] = i;
        at::Tensor next = m.decode(cache, slots, ids.narrow(1, 0, prompt), {{}, true}).argmax(-1, true);
        for (int64_t t = 1; t < fresh; ++t) next = m.decode(cache, slots, next, {{}, true}).argmax(-1, true);
      },
      repeats);
  double hf_fwd = hf["forward_s"], hf_lp = hf["log_probs_s"], hf_gen = hf["generate_s"];
  std::printf("== throughput, qwen2 fp32 (hidden 512, 4 layers, vocab 32000), batch %d x %d tokens, %d threads ==\n",
              B, T, threads);
  std::printf("forward:   rpg %.4f s (%.0f tok/s)   transformers %.4f s (%.0f tok/s)   speed ratio %.2f\n", fwd,
              B * T / fwd, hf_fwd, B * T / hf_fwd, hf_fwd / fwd);
  std::printf("log-probs: rpg %.4f s (%.0f tok/s)   transformers %.4f s (%.0f tok/s)   speed ratio %.2f\n", lp,
              B * T / lp, hf_lp, B * T / hf_lp, hf_lp / lp);
  std::printf("generate:  rpg %.4f s (%.0f new tok/s)   transformers %.4f s (%.0f new tok/s)   speed ratio %.2f"
              "   (greedy, %lld-token prompts, %lld new tokens per row)\n",
              gen, B * fresh / gen, hf_gen, B * fresh / hf_gen, hf_gen / gen, static_cast<long long>(prompt),
              static_cast<long long>(fresh));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 3 && args[0] == "--child") return child(args[1], args[2] == "grad");
  int threads = 2;
  bool throughput = true, memory = true;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--threads" && i + 1 < args.size()) threads = std::stoi(args[++i]);
    else if (args[i] == "--skip-throughput") throughput = false;
    else if (args[i] == "--skip-memory") memory = false;
    else {
      std::fprintf(stderr, "usage: model_bench [--threads N] [--skip-throughput] [--skip-memory]\n");
      return 2;
    }
  }
  fs::path src = RPG_SOURCE_DIR;
  std::string self = fs::read_symlink("/proc/self/exe").string();
  try {
    if (throughput) throughput_report((src / ".venv/bin/python").string(), src / "bench/model/model_hf_bench.py", threads);
    if (memory) memory_report(self);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
