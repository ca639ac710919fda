// The RL step's training passes in isolation, on the TRL side-by-side bench's shapes
// (bench/trl_step): a reference pass (no_grad log-probs) and an update pass (log-probs +
// entropy, a GRPO-like loss, backward), timed in CPU seconds (user + sys of the process,
// all threads) and wall seconds, median of --repeats after one warm-up.
//
//   update_bench MODEL_DIR [--threads 2] [--rows 128] [--prompt 190] [--response 64] [--n 8]
//                [--repeats 3] [--packed] [--no-split] [--checkpointing] [--only ref|update]
//
// Rows come in groups of --n sharing a prompt (as GRPO's). MODEL_DIR: a Qwen2 checkpoint, e.g. the bench's (`trl_step_bench.py --work W
// --only-inputs` writes W/model). Prompts are left-padded (lengths prompt-2..prompt),
// responses right-padded (lengths response-8..response), token ids random, seeded.
// Build: cmake --build <dir> --target update_bench.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "rpg/model/causal_lm.h"

using rpg::model::CausalLM;
using rpg::model::LogProbOptions;

namespace {

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

struct Times {
  double cpu = 0, wall = 0;
};

template <class F>
Times median_times(F&& f, int repeats) {
  f();
  std::vector<double> cpu, wall;
  for (int i = 0; i < repeats; ++i) {
    const double c0 = cpu_seconds();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    cpu.push_back(cpu_seconds() - c0);
  }
  std::sort(cpu.begin(), cpu.end());
  std::sort(wall.begin(), wall.end());
  return {cpu[cpu.size() / 2], wall[wall.size() / 2]};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: update_bench MODEL_DIR [--threads N] [--rows B] [--prompt P] [--response R] [--n N] "
                         "[--repeats K] [--packed] [--no-split] [--checkpointing] [--only ref|update]\n");
    return 2;
  }
  std::string dir = argv[1], only;
  int threads = 2, repeats = 3;
  int64_t B = 128, P = 190, R = 64, n = 8;
  bool packed = false, split = true, checkpointing = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return std::string(argv[++i]); };
    if (a == "--threads") threads = std::stoi(next());
    else if (a == "--rows") B = std::stoll(next());
    else if (a == "--prompt") P = std::stoll(next());
    else if (a == "--response") R = std::stoll(next());
    else if (a == "--n") n = std::stoll(next());
    else if (a == "--repeats") repeats = std::stoi(next());
    else if (a == "--packed") packed = true;
    else if (a == "--no-split") split = false;
    else if (a == "--checkpointing") checkpointing = true;
    else if (a == "--only") only = next();
    else {
      std::fprintf(stderr, "update_bench: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  at::set_num_threads(threads);
  CausalLM m = CausalLM::from_pretrained(dir, {at::kFloat});
  m.set_gradient_checkpointing(checkpointing);
  const int64_t V = m.config().vocab_size, T = P + R;
  at::manual_seed(0);
  at::Tensor ids = at::randint(V, {B, T}, at::kLong);
  at::Tensor mask = at::ones({B, T}, at::kLong);
  for (int64_t b = 0; b < B; ++b) {
    // Groups of n rows share a prompt (P - pad tokens); responses have R - cut tokens.
    const int64_t pad = (b / n) % 3, cut = b % 9;
    ids[b].narrow(0, 0, P).copy_(ids[b / n * n].narrow(0, 0, P));
    mask[b].narrow(0, 0, pad).zero_();
    if (cut) mask[b].narrow(0, T - cut, cut).zero_();
  }
  ids.mul_(mask);
  at::Tensor pos = (mask.cumsum(1) - 1).clamp_min(0);
  at::Tensor targets = ids.narrow(1, P, R).contiguous();
  at::Tensor rmask = mask.narrow(1, P, R).to(at::kFloat);
  at::Tensor adv = at::randn({B, 1}).expand({B, R});
  LogProbOptions lo;
  lo.remove_padding = packed;
  lo.split_prompt = split;

  at::Tensor ref;
  const Times ref_t = only == "update" ? Times{} : median_times([&] {
    c10::NoGradGuard no_grad;
    ref = m.log_probs(ids, mask, pos, targets, lo).log_probs;
  }, repeats);
  if (!ref.defined()) {
    c10::NoGradGuard no_grad;
    ref = m.log_probs(ids, mask, pos, targets, lo).log_probs;
  }
  double loss_value = 0;
  const Times upd_t = only == "ref" ? Times{} : median_times([&] {
    LogProbOptions l2 = lo;
    l2.with_entropy = true;
    auto out = m.log_probs(ids, mask, pos, targets, l2);
    at::Tensor ratio = (out.log_probs - out.log_probs.detach()).exp();
    at::Tensor kl = (ref - out.log_probs).exp() - (ref - out.log_probs) - 1;
    at::Tensor loss = ((-adv * ratio + 1e-3 * kl) * rmask).sum() / rmask.sum();
    loss.backward();
    loss_value = loss.item<double>();
    for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
  }, repeats);
  std::printf("update_bench: %lld rows x (%lld prompt + %lld response), vocab %lld, hidden %lld, %lld layers, "
              "%d threads, %s%s%s\n",
              static_cast<long long>(B), static_cast<long long>(P), static_cast<long long>(R),
              static_cast<long long>(V), static_cast<long long>(m.config().hidden_size),
              static_cast<long long>(m.config().num_hidden_layers), threads, packed ? "packed" : "padded",
              packed || split ? "" : ", no split_prompt", checkpointing ? ", gradient checkpointing" : "");
  std::printf("ref    (no_grad log-probs):     cpu %7.3f s  wall %7.3f s\n", ref_t.cpu, ref_t.wall);
  std::printf("update (log-probs+ent, fwd+bwd): cpu %7.3f s  wall %7.3f s  (loss %.6g)\n", upd_t.cpu, upd_t.wall,
              loss_value);
  return 0;
}
