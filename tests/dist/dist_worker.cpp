// A rank of the process-group tests: joins the group from the launcher's environment and
// runs a scenario; prints one line per result ("name v1 v2 ..."), which the tests compare
// with closed-form values. Errors as rpg prints them: `rpg: error: ...`, exit 1.
//   dist_worker collectives          every collective once
//   dist_worker kill RANK            RANK SIGKILLs itself after the first all_reduce
//   dist_worker hang RANK            RANK sleeps through the second all_reduce (then exits)
//   dist_worker fail RANK            RANK throws an rpg error after the first all_reduce
//   dist_worker train                3 data-parallel (ZeRO-0) AdamW steps of a small MLP on
//                                    10 rows in 5 groups of 2, sharded by whole groups
//   dist_worker zero1 OPT DTYPE      3 steps of rpg's optimizer OPT (adamw | schedule_free_adamw)
//                                    on a small MLP with DTYPE (float | bfloat16) parameters
//                                    and the whole batch's gradient on every rank: sharded
//                                    (ZeRO-1) with more than one rank, replicated with one;
//                                    prints the weights (in eval mode), this rank's optimizer
//                                    state bytes and the gathered full state
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>

#include "rpg/core/error.h"
#include "rpg/dist/data_parallel.h"
#include "rpg/dist/process_group.h"
#include "rpg/train/dp.h"
#include "rpg/train/optim.h"

namespace {

void print(const std::string& name, const at::Tensor& t) {
  std::cout << name;
  at::Tensor d = t.to(at::kDouble).contiguous();
  for (int64_t i = 0; i < d.numel(); ++i) std::cout << " " << d.data_ptr<double>()[i];
  std::cout << std::endl;
}

// The data-parallel step as `rpg train` would take it: each rank's micro-batches of its
// shard, each loss divided by the global normaliser (an all-reduced weight sum, like a
// token count), gradients summed over ranks, clipped on the (now global) norm, AdamW.
int train(rpg::dist::ProcessGroup& pg) {
  torch::manual_seed(7);  // the same initial weights on every rank
  torch::nn::Sequential mlp(torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 1));
  mlp->to(torch::kDouble);
  const int64_t rows = 10, group = 2;
  at::Tensor x = torch::sin(torch::arange(rows * 4, torch::kDouble).view({rows, 4}) * 0.7);
  at::Tensor y = torch::cos(torch::arange(rows, torch::kDouble));
  at::Tensor weight = 1 + torch::arange(rows, torch::kDouble).remainder(3);  // "tokens" per row
  torch::optim::AdamW opt(mlp->parameters(), torch::optim::AdamWOptions(0.05).weight_decay(0.01));
  const auto mine = rpg::dist::shard(rows, pg.size(), pg.rank(), group);
  std::cout.precision(17);
  for (int step = 0; step < 3; ++step) {
    at::Tensor norm = weight.narrow(0, mine.begin, mine.size()).sum().reshape({1});
    pg.all_reduce(norm);  // the global normaliser
    at::Tensor loss_sum = torch::zeros({1}, torch::kDouble);
    for (int64_t start = mine.begin; start < mine.end; start += group) {  // micro-batches of one group
      at::Tensor xs = x.narrow(0, start, group), ys = y.narrow(0, start, group), ws = weight.narrow(0, start, group);
      at::Tensor loss = (ws * (mlp->forward(xs).squeeze(1) - ys).pow(2)).sum() / norm;
      loss.backward();
      loss_sum += loss.detach();
    }
    rpg::dist::all_reduce_gradients(pg, mlp->parameters(), /*bucket_bytes=*/64);
    pg.all_reduce(loss_sum);
    double grad_norm = torch::nn::utils::clip_grad_norm_(mlp->parameters(), 0.5);
    opt.step();
    opt.zero_grad();
    std::cout << "step " << step << " loss " << loss_sum.item<double>() << " grad_norm " << grad_norm << std::endl;
  }
  std::cout << "weights";
  for (const auto& p : mlp->parameters()) {
    at::Tensor f = p.detach().reshape({-1});
    for (int64_t i = 0; i < f.numel(); ++i) std::cout << " " << f[i].item<double>();
  }
  std::cout << std::endl;
  return 0;
}

int zero1(rpg::dist::ProcessGroup& pg, const std::string& type, const std::string& dtype) {
  torch::manual_seed(7);
  torch::nn::Sequential mlp(torch::nn::Linear(4, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
  mlp->to(dtype == "bfloat16" ? torch::kBFloat16 : torch::kFloat);
  rpg::train::NamedTensors params;
  for (const auto& item : mlp->named_parameters()) params.emplace_back(item.key(), item.value());
  rpg::train::OptimizerOptions o;
  o.type = type;
  o.lr = 0.05;
  o.warmup_steps = 2;
  auto opt = pg.size() > 1 ? rpg::train::dp::make_sharded_optimizer(pg, o, params) : rpg::train::make_optimizer(o, params);
  at::Tensor x = torch::sin(torch::arange(40, torch::kFloat).view({10, 4}) * 0.7).to(mlp->parameters()[0].scalar_type());
  at::Tensor y = torch::cos(torch::arange(30, torch::kFloat).view({10, 3})).to(x.scalar_type());
  std::cout.precision(17);
  for (int step = 0; step < 3; ++step) {
    opt->use_train_weights();
    at::Tensor loss = (mlp->forward(x) - y).pow(2).mean();
    loss.backward();
    rpg::train::clip_grad_norm(opt->params(), 0.5);
    opt->step(0.05);
    opt->zero_grad();
    opt->use_eval_weights();  // schedule-free: evaluation weights between steps
    std::cout << "loss " << loss.item<double>() << std::endl;
  }
  std::cout << "weights";
  for (const auto& p : mlp->parameters()) {
    at::Tensor f = p.detach().to(at::kDouble).reshape({-1});
    for (int64_t i = 0; i < f.numel(); ++i) std::cout << " " << f[i].item<double>();
  }
  std::cout << std::endl;
  std::cout << "state_bytes " << rpg::train::dp::local_state_bytes(*opt) << std::endl;
  const rpg::train::OptimizerState st = opt->state();  // collective under ZeRO-1
  std::cout << "state";
  for (const auto& [k, t] : st.tensors) {
    at::Tensor f = t.to(at::kDouble).reshape({-1});
    for (int64_t i = 0; i < f.numel(); ++i) std::cout << " " << f[i].item<double>();
  }
  for (const auto& [k, v] : st.scalars) std::cout << " " << v;
  std::cout << std::endl << "state_keys " << st.tensors.size() << " " << st.scalars.size() << std::endl;
  return 0;
}

int run(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "collectives";
  int victim = argc > 2 ? std::atoi(argv[2]) : -1;
  rpg::dist::GroupOptions options;
  options.timeout = std::chrono::seconds(mode == "hang" ? 3 : 60);
  options.heartbeat = std::chrono::milliseconds(200);
  auto layout = rpg::dist::layout_from_env();
  auto pg = rpg::dist::ProcessGroup::init(layout, options);
  const int r = pg->rank(), w = pg->size();
  std::cout << "joined " << r << " " << w << std::endl;
  if (mode == "train") return train(*pg);
  if (mode == "zero1") return zero1(*pg, argv[2], argv[3]);

  at::Tensor a = torch::tensor({r + 1.0, 2.0 * (r + 1), 10.0}, torch::kDouble);
  pg->all_reduce(a);
  print("sum", a);
  if (mode == "kill" && r == victim) raise(SIGKILL);
  if (mode == "fail" && r == victim) throw rpg::ValueError("worker failed on purpose");
  if (mode == "hang" && r == victim) {
    std::this_thread::sleep_for(std::chrono::seconds(8));
    std::cout << "woke" << std::endl;
    _exit(0);
  }
  at::Tensor m = torch::tensor({static_cast<float>(r), static_cast<float>(5 - r)});
  pg->all_reduce(m, rpg::dist::ReduceOp::Max);
  print("max", m);
  at::Tensor mn = torch::tensor({static_cast<int64_t>(r) + 5}, torch::kLong);
  pg->all_reduce(mn, rpg::dist::ReduceOp::Min);
  print("min", mn);
  at::Tensor b = r == w - 1 ? torch::tensor({7.0f, 8.0f}) : torch::zeros({2});
  pg->broadcast(b, w - 1);
  print("broadcast", b);
  print("all_gather", pg->all_gather(torch::tensor({10.0f * r, 10.0f * r + 1})));
  print("reduce_scatter", pg->reduce_scatter(torch::arange(2 * w, torch::kFloat) * (r + 1)));
  pg->barrier();
  std::cout << "collectives " << pg->collectives() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const rpg::Error& e) {
    std::cout.flush();
    std::fprintf(stderr, "rpg: error: %s\n", e.what());
    return 1;
  }
}
