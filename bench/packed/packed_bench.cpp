// Training forward + backward tokens/s, padded vs packed (padding-free), on one mixed-length
// micro-batch of a small random Qwen2. The step is what the trainer's update does per
// micro-batch: log-probs + entropy of the response tokens (LogProbOptions::remove_padding
// off / on), a masked loss, backward into the parameters. Tokens/s counts real tokens only
// (the trainer's token budget), so the ratio is packed time saved on padding.
//
//   packed_bench [--threads N] [--rows B] [--min-len L] [--max-len L] [--rounds K] [--steps S]
//
// Rows' total lengths are drawn uniformly in [min-len, max-len] (default 64..256: 4x), a
// quarter of each row prompt (left-padded) and the rest response (right-padded), verl's
// layout. Rounds alternate padded and packed; the median step time of each is reported.
// Build: cmake --build <dir> --target packed_bench (not built by default).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "../common/mixed_batch.h"
#include "rpg/model/causal_lm.h"
#include "rpg/model/config.h"

using rpg::model::CausalLM;
using rpg::model::LogProbOptions;

int main(int argc, char** argv) {
  int threads = 2, rounds = 3, steps = 3;
  int64_t rows = 32, min_len = 64, max_len = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    long v = std::atol(argv[i + 1]);
    if (a == "--threads") threads = static_cast<int>(v);
    else if (a == "--rows") rows = v;
    else if (a == "--min-len") min_len = v;
    else if (a == "--max-len") max_len = v;
    else if (a == "--rounds") rounds = static_cast<int>(v);
    else if (a == "--steps") steps = static_cast<int>(v);
    else {
      std::fprintf(stderr, "packed_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  at::set_num_threads(threads);
  // The issue's benchmark model shape: 4 layers, hidden 256, Qwen2 (GQA, qkv bias).
  auto config = rpg::model::ModelConfig::from_json(
      R"({"model_type": "qwen2", "vocab_size": 8192, "hidden_size": 256, "intermediate_size": 1024,
          "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
          "max_position_embeddings": 1024, "tie_word_embeddings": true, "dtype": "float32"})",
      "packed_bench config");
  at::manual_seed(0);
  CausalLM model(config, at::kFloat);

  const rpg::bench::MixedBatch b = rpg::bench::mixed_batch(rows, min_len, max_len, config.vocab_size);
  const at::Tensor &ids = b.ids, &mask = b.attention_mask, &targets = b.targets, &rmask = b.response_mask;
  const int64_t T = b.width, real = b.real_tokens, response_tokens = b.response_tokens;

  auto step = [&](bool packed) {
    LogProbOptions o;
    o.with_entropy = true;
    o.remove_padding = packed;
    auto t = model.log_probs(ids, mask, {}, targets, o);
    at::Tensor loss = ((t.log_probs + 0.01 * t.entropy) * rmask).sum() / rmask.sum();
    auto g = torch::autograd::grad({loss}, model.parameters());
    return g.size();
  };
  // Wall time and this process's CPU time (all threads): on a loaded machine the CPU time
  // is the steadier of the two.
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  std::vector<double> padded_cpu, packed_cpu;
  auto seconds = [&](bool packed) {
    double c0 = cpu_now();
    auto t0 = std::chrono::steady_clock::now();
    step(packed);
    (packed ? packed_cpu : padded_cpu).push_back(cpu_now() - c0);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  step(false);  // warm-up both paths
  step(true);
  std::vector<double> padded_t, packed_t;
  for (int r = 0; r < rounds; ++r)
    for (int s = 0; s < steps; ++s) {
      padded_t.push_back(seconds(false));
      packed_t.push_back(seconds(true));
    }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  double tp = median(padded_t), tk = median(packed_t);
  std::printf("packed_bench: %lld rows, lengths %lld..%lld (padded width %lld), %lld real tokens of %lld padded "
              "(%.0f%% padding), %lld response tokens, %d threads, %d timed steps each\n",
              static_cast<long long>(rows), static_cast<long long>(min_len), static_cast<long long>(max_len),
              static_cast<long long>(T), static_cast<long long>(real), static_cast<long long>(rows * T),
              100.0 * (1.0 - static_cast<double>(real) / static_cast<double>(rows * T)),
              static_cast<long long>(response_tokens), threads, rounds * steps);
  double cp = median(padded_cpu), ck = median(packed_cpu);
  std::printf("padded: median %.3f s/step wall (%.0f real tokens/s), %.3f s CPU\n", tp, real / tp, cp);
  std::printf("packed: median %.3f s/step wall (%.0f real tokens/s), %.3f s CPU\n", tk, real / tk, ck);
  std::printf("packed/padded speed ratio: %.2fx wall, %.2fx CPU time\n", tp / tk, cp / ck);
  return 0;
}
