// Optimizers, LR schedules and gradient clipping against live oracles: torch.optim.AdamW,
// schedulefree.AdamWScheduleFree, torch.nn.utils.clip_grad_norm_, verl's schedules.
#include "rpg/train/optim.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <cstdio>
#include <functional>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "tensor_file.h"
#include "test_util.h"

namespace rpg::train {
namespace {

using TensorMap = std::map<std::string, at::Tensor>;

struct Problem {
  std::vector<at::Tensor> init;  // initial parameters (float64)
  TensorMap grads;               // "g.<step>.<i>"
  int steps = 0;
};

// Random parameters and gradients; parameter 1 has no gradient at step 2 (skipped update).
Problem make_problem(int steps, uint64_t seed) {
  at::manual_seed(seed);
  Problem pr;
  pr.steps = steps;
  pr.init = {at::randn({4, 3}, at::kDouble), at::randn({5}, at::kDouble), at::randn({2, 2, 2}, at::kDouble)};
  for (int s = 0; s < steps; ++s)
    for (size_t i = 0; i < pr.init.size(); ++i) {
      if (s == 2 && i == 1) continue;
      pr.grads[str("g.", s, ".", i)] = at::randn_like(pr.init[i]) * (1.0 + s);
    }
  return pr;
}

TensorMap run_oracle_case(const nlohmann::json& c, const Problem& pr) {
  test::TempDir dir;
  TensorMap in = pr.grads;
  for (size_t i = 0; i < pr.init.size(); ++i) in[str("p.", i)] = pr.init[i];
  test::save_tensors(dir / "in.safetensors", in);
  test::write_text(dir / "case.json", c.dump());
  test::run_oracle("train_optim.py",
                   {(dir / "case.json").string(), (dir / "in.safetensors").string(), (dir / "out.safetensors").string()});
  return test::load_tensors(dir / "out.safetensors");
}

NamedTensors make_params(const Problem& pr, at::ScalarType dtype = at::kDouble) {
  NamedTensors ps;
  for (size_t i = 0; i < pr.init.size(); ++i)
    ps.emplace_back(str("w", i), pr.init[i].to(dtype).clone().requires_grad_(true));
  return ps;
}

void set_grads(const NamedTensors& ps, const Problem& pr, int step) {
  for (size_t i = 0; i < ps.size(); ++i) {
    auto it = pr.grads.find(str("g.", step, ".", i));
    ps[i].second.mutable_grad() = it == pr.grads.end() ? at::Tensor() : it->second.to(ps[i].second.scalar_type());
  }
}

void expect_close(const at::Tensor& ours, const at::Tensor& ref, double tol, const std::string& what) {
  ASSERT_EQ(ours.sizes(), ref.sizes()) << what;
  double diff = (ours.detach().to(at::kDouble) - ref.to(at::kDouble)).abs().max().item<double>();
  EXPECT_LE(diff, tol) << what;
}

// torch.optim.AdamW live on `pr` (lr 1e-2, weight decay 0.1, verl's constant schedule with
// `warmup` steps) and rpg's AdamW on the same problem in `dtype`; check(ours, torch's, what)
// after every step. Returns torch's parameters.
TensorMap adamw_against_torch(const Problem& pr, int warmup, at::ScalarType dtype,
                              const std::function<void(const at::Tensor&, const at::Tensor&, const std::string&)>& check) {
  OptimizerOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  nlohmann::json c = {{"kind", "adamw"}, {"num_params", pr.init.size()}, {"steps", pr.steps}, {"lr", o.lr},
                      {"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps}, {"weight_decay", o.weight_decay},
                      {"warmup", warmup}};
  TensorMap ref = run_oracle_case(c, pr);
  NamedTensors ps = make_params(pr, dtype);
  auto opt = make_optimizer(o, ps);
  LrSchedule sched{"constant", warmup};
  for (int s = 0; s < pr.steps; ++s) {
    set_grads(ps, pr, s);
    opt->step(o.lr * sched.factor(opt->step_count()));
    for (size_t i = 0; i < ps.size(); ++i) check(ps[i].second.detach(), ref.at(str("p.", s, ".", i)), str("step ", s, " param ", i));
  }
  return ref;
}

TEST(Optim, AdamWWithVerlWarmupMatchesTorch) {
  Problem pr = make_problem(7, 1);
  TensorMap ref = adamw_against_torch(pr, 3, at::kDouble, [](const at::Tensor& ours, const at::Tensor& torch, const std::string& what) {
    expect_close(ours, torch, 1e-14, what);
  });
  // The first step has LR 0 under verl's warm-up (factor(0) = 0): parameters unchanged.
  EXPECT_TRUE(at::equal(ref.at("p.0.0"), pr.init[0]));
}

// fp32 AdamW equals torch.optim.AdamW (single-tensor, as verl builds it on the CPU) bit for
// bit, torch itself live: tensors large enough for ATen's vector loops, their tails and its
// parallel split, gradients from 1e-4 to 1e4 in size, weight decay, the warm-up's LR 0 and a
// skipped parameter. (torch's sqrt is MKL's, within 1 ulp: a hand-written one-pass step with
// std::sqrt differed on a fifth of the elements; docs/benchmarks.md, the optimizer row.)
TEST(Optim, AdamWFp32EqualsTorchBitForBit) {
  at::manual_seed(5);
  Problem pr;
  pr.steps = 6;
  pr.init = {at::randn({300, 257}), at::randn({70001}), at::randn({33})};
  for (int s = 0; s < pr.steps; ++s)
    for (size_t i = 0; i < pr.init.size(); ++i) {
      if (s == 2 && i == 1) continue;
      const at::Tensor& p = pr.init[i];
      pr.grads[str("g.", s, ".", i)] = at::randn_like(p) * at::exp(at::randn_like(p) * 3.0).clamp(1e-4, 1e4);
    }
  TensorMap ref = adamw_against_torch(pr, 2, at::kFloat, [](const at::Tensor& ours, const at::Tensor& torch, const std::string& what) {
    EXPECT_TRUE(at::equal(ours, torch)) << what;
  });
  EXPECT_EQ(ref.at("p.0.0").scalar_type(), at::kFloat);
}

TEST(Optim, ScheduleFreeAdamWMatchesReferenceImplementation) {
  Problem pr = make_problem(8, 2);
  OptimizerOptions o;
  o.type = "schedule_free_adamw";
  o.lr = 5e-2;
  o.weight_decay = 0.1;
  o.warmup_steps = 3;
  o.r = 0.5;
  nlohmann::json c = {{"kind", "schedule_free"}, {"num_params", 3}, {"steps", pr.steps}, {"lr", o.lr},
                      {"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps}, {"weight_decay", o.weight_decay},
                      {"warmup", o.warmup_steps}, {"r", o.r}, {"weight_lr_power", o.weight_lr_power}};
  TensorMap ref = run_oracle_case(c, pr);
  NamedTensors ps = make_params(pr);
  auto opt = make_optimizer(o, ps);
  for (int s = 0; s < pr.steps; ++s) {
    set_grads(ps, pr, s);
    // The LR the trainer logs is the warm-up's, whatever schedule it is handed.
    EXPECT_DOUBLE_EQ(opt->lr_of_next_step(123.0), o.lr * std::min(1.0, (s + 1.0) / 3.0)) << s;
    opt->step(0.0);
    for (size_t i = 0; i < ps.size(); ++i) expect_close(ps[i].second, ref.at(str("p.", s, ".", i)), 1e-13, str("step ", s, " param ", i));
  }
  opt->use_eval_weights();
  opt->use_eval_weights();  // idempotent
  for (size_t i = 0; i < ps.size(); ++i) expect_close(ps[i].second, ref.at(str("x.", i)), 1e-13, str("x ", i));
  EXPECT_THROW(opt->step(0.0), ValueError);
  opt->use_train_weights();
  for (size_t i = 0; i < ps.size(); ++i)
    expect_close(ps[i].second, ref.at(str("p.", pr.steps - 1, ".", i)), 1e-13, str("y again ", i));
}

// Schedule-free AdamW as the authors' fork runs it (scheduled_lr: verl's LambdaLR writes the
// group's lr; restore_exact_y off: eval()/train() interpolate), fp32 as the fork's weights,
// against schedulefree.AdamWScheduleFree driven through the same events live: LR 0 first (the
// fork's constant schedule at step 1: zero averaging weight), a parameter without gradient,
// eval/train switches between and around steps (twice in a row too), weight decay, and a
// configuration with the optimizer's own warm-up and polynomial weighting.
TEST(Optim, ScheduleFreeAdamWAsTheForkRunsItMatchesSchedulefreeLive) {
  struct Config {
    int64_t warmup;
    double r;
  };
  for (const Config& k : {Config{0, 0.0}, Config{3, 0.5}}) {
    Problem pr = make_problem(7, 7);
    for (auto& t : pr.init) t = t.to(at::kFloat);
    for (auto& [key, g] : pr.grads) g = g.to(at::kFloat);
    OptimizerOptions o;
    o.type = "schedule_free_adamw";
    o.lr = 3e-2;  // the peak; the steps' group LRs below
    o.weight_decay = 0.1;
    o.warmup_steps = k.warmup;
    o.r = k.r;
    o.scheduled_lr = true;
    o.restore_exact_y = false;
    const std::vector<double> lrs = {0.0, 1e-2, 2e-2, 3e-2, 3e-2, 1.5e-2, 3e-2};
    nlohmann::json events = nlohmann::json::array();
    size_t next = 0;
    auto step_event = [&] { events.push_back({{"op", "step"}, {"lr", lrs[next++]}}); };
    // As the fork's trainer: train() before the first update (no-op before any step), then per
    // training step eval() (old log-probs), train() (update), with extra eval/train pairs.
    for (const char* op : {"eval", "train", "S", "S", "eval", "train", "S", "eval", "eval", "train", "train", "S", "S",
                           "eval", "train", "S", "eval", "train", "S"}) {
      if (std::string(op) == "S") step_event();
      else events.push_back({{"op", op}});
    }
    ASSERT_EQ(next, lrs.size());
    nlohmann::json c = {{"kind", "schedule_free_events"}, {"num_params", 3}, {"lr", o.lr}, {"beta1", o.beta1},
                        {"beta2", o.beta2}, {"eps", o.eps}, {"weight_decay", o.weight_decay}, {"warmup", o.warmup_steps},
                        {"r", o.r}, {"weight_lr_power", o.weight_lr_power}, {"events", events}};
    TensorMap ref = run_oracle_case(c, pr);
    NamedTensors ps = make_params(pr, at::kFloat);
    auto opt = make_optimizer(o, ps);
    int step = 0;
    double worst = 0;
    for (size_t e = 0; e < events.size(); ++e) {
      const std::string op = events[e]["op"];
      if (op == "train") opt->use_train_weights();
      else if (op == "eval") opt->use_eval_weights();
      else {
        set_grads(ps, pr, step);
        const double group_lr = events[e]["lr"];
        // The LR it uses (what the trainer logs): the group's times its own warm-up.
        EXPECT_DOUBLE_EQ(opt->lr_of_next_step(group_lr), ref.at(str("lr.", step)).item<double>()) << step;
        opt->step(group_lr);
        ++step;
      }
      for (size_t i = 0; i < ps.size(); ++i) {
        const at::Tensor& want = ref.at(str("p.", e, ".", i));
        const double d = (ps[i].second.detach().to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
        worst = std::max(worst, d);
        // Same libtorch on both sides (the venv's): bit-identical, not just within 1e-6.
        EXPECT_EQ(d, 0.0) << "warmup " << k.warmup << ", event " << e << " (" << op << "), param " << i;
      }
    }
    // The first step (LR 0) moved nothing.
    EXPECT_TRUE(at::equal(ref.at("p.2.0"), pr.init[0]));
    std::printf("schedule-free (warmup %lld, r %g) vs schedulefree: largest difference %.3g over %zu events\n",
                static_cast<long long>(k.warmup), k.r, worst, events.size());
  }
}

// The state round trip must be bit-exact: a resumed run equals an uninterrupted one.
void check_resume_is_exact(const std::string& type) {
  Problem pr = make_problem(6, 3);
  OptimizerOptions o;
  o.type = type;
  o.lr = 1e-2;
  o.warmup_steps = 2;
  NamedTensors a = make_params(pr);
  auto opt_a = make_optimizer(o, a);
  for (int s = 0; s < 6; ++s) {
    set_grads(a, pr, s);
    opt_a->step(o.lr);
  }
  NamedTensors b = make_params(pr);
  auto opt_b = make_optimizer(o, b);
  for (int s = 0; s < 3; ++s) {
    set_grads(b, pr, s);
    opt_b->step(o.lr);
  }
  OptimizerState saved = opt_b->state();
  NamedTensors c = make_params(pr);
  for (size_t i = 0; i < c.size(); ++i) c[i].second.detach().copy_(b[i].second.detach());
  auto opt_c = make_optimizer(o, c);
  opt_c->load_state(saved);
  EXPECT_EQ(opt_c->step_count(), 3);
  for (int s = 3; s < 6; ++s) {
    set_grads(c, pr, s);
    opt_c->step(o.lr);
  }
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i].second, c[i].second)) << type << " param " << i;
}

TEST(Optim, AdamWStateRoundTripIsBitExact) { check_resume_is_exact("adamw"); }
TEST(Optim, ScheduleFreeStateRoundTripIsBitExact) { check_resume_is_exact("schedule_free_adamw"); }

TEST(Optim, LoadStateRejectsMismatchedShapes) {
  Problem pr = make_problem(1, 4);
  OptimizerOptions o;
  auto opt = make_optimizer(o, make_params(pr));
  OptimizerState st = opt->state();
  st.tensors["w0.exp_avg"] = at::zeros({7});
  EXPECT_THROW(opt->load_state(st), FormatError);
  st = opt->state();
  st.tensors.erase("w2.exp_avg_sq");
  EXPECT_THROW(opt->load_state(st), FormatError);
}

TEST(Optim, Bf16ParametersUpdateThroughAnFp32Master) {
  Problem pr = make_problem(4, 5);
  for (auto& t : pr.init) t = t.to(at::kBFloat16).to(at::kDouble);  // representable start
  OptimizerOptions o;
  o.lr = 1e-3;
  NamedTensors low = make_params(pr, at::kBFloat16), full = make_params(pr, at::kFloat);
  auto opt_low = make_optimizer(o, low);
  auto opt_full = make_optimizer(o, full);
  for (int s = 0; s < 4; ++s) {
    set_grads(low, pr, s);
    set_grads(full, pr, s);
    // Same fp32 gradient values for both.
    for (size_t i = 0; i < low.size(); ++i)
      if (full[i].second.grad().defined()) low[i].second.mutable_grad() = full[i].second.grad().clone();
    opt_low->step(o.lr);
    opt_full->step(o.lr);
  }
  // The bf16 weights are the fp32 trajectory rounded, not an accumulation of bf16 roundings
  // (lr 1e-3 steps are below bf16 resolution for O(1) weights: without a master nothing moves).
  for (size_t i = 0; i < low.size(); ++i)
    EXPECT_TRUE(at::equal(low[i].second, full[i].second.to(at::kBFloat16))) << i;
  EXPECT_TRUE(opt_low->state().tensors.count("w0.master"));
}

TEST(Optim, ClipGradNormMatchesTorch) {
  for (double max_norm : {0.5, 1e6}) {
    Problem pr = make_problem(1, 6);
    nlohmann::json c = {{"kind", "clip"}, {"num_params", 3}, {"max_norm", max_norm}};
    TensorMap ref = run_oracle_case(c, pr);
    NamedTensors ps = make_params(pr);
    set_grads(ps, pr, 0);
    double total = clip_grad_norm(ps, max_norm);
    EXPECT_NEAR(total, ref.at("total_norm").item<double>(), 1e-12);
    for (size_t i = 0; i < ps.size(); ++i) expect_close(ps[i].second.grad(), ref.at(str("grad.", i)), 1e-14, str("grad ", i));
  }
}

TEST(Optim, ClipGradNormLeavesNonFiniteGradientsForTheCallerToSkip) {
  NamedTensors ps = {{"w", at::ones({3}, at::kDouble).requires_grad_(true)}};
  ps[0].second.mutable_grad() = at::tensor({1.0, std::nan(""), 2.0}, at::kDouble);
  EXPECT_FALSE(std::isfinite(clip_grad_norm(ps, 1.0)));
  EXPECT_EQ(ps[0].second.grad()[2].item<double>(), 2.0);
}

TEST(Optim, LrSchedulesMatchVerl) {
  struct Case {
    std::string type;
    int64_t warmup, total;
    double min_lr_ratio, cycles;
  };
  const std::vector<Case> cases = {Case{"constant", 0, 0, 0, 0.5}, Case{"constant", 10, 0, 0, 0.5},
                                   Case{"cosine", 5, 40, 0.0, 0.5}, Case{"cosine", 3, 30, 0.1, 0.5},
                                   Case{"cosine", 0, 25, 0.2, 1.0}};
  nlohmann::json c = {{"kind", "lr"}, {"steps", 45}, {"schedules", nlohmann::json::array()}};
  for (const Case& k : cases)
    c["schedules"].push_back({{"type", k.type}, {"warmup", k.warmup}, {"total", k.total},
                              {"min_lr_ratio", k.min_lr_ratio}, {"num_cycles", k.cycles}});
  test::TempDir dir;
  test::write_text(dir / "case.json", c.dump());
  test::run_oracle("train_optim.py", {(dir / "case.json").string(), "-", (dir / "out.safetensors").string()});
  auto ref = test::load_tensors(dir / "out.safetensors");
  for (size_t j = 0; j < cases.size(); ++j) {
    const Case& k = cases[j];
    LrSchedule s{k.type, k.warmup, k.total, k.min_lr_ratio, k.cycles};
    // verl's cosine climbs again past num_training_steps (progress > 1); rpg clamps the
    // progress, so the two agree up to the last training step and rpg stays at the floor.
    const int64_t last = k.type == "cosine" ? k.total : 45;
    for (int64_t step = 0; step < last; ++step)
      EXPECT_NEAR(s.factor(step), ref.at(str("factors.", j))[step].item<double>(), 1e-15)
          << k.type << " warmup " << k.warmup << " step " << step;
    for (int64_t step = last; step < 45; ++step)
      EXPECT_NEAR(s.factor(step), k.cycles == 0.5 ? k.min_lr_ratio : s.factor(k.total), 1e-15)
          << k.type << " past the end, step " << step;
  }
  EXPECT_EQ(resolve_warmup_steps(-1, 0.05, 400), 20);
  EXPECT_EQ(resolve_warmup_steps(10, 0.05, 400), 10);
}

TEST(Optim, UnknownTypeIsConfigError) {
  OptimizerOptions o;
  o.type = "adam";
  EXPECT_THROW(make_optimizer(o, {}), ConfigError);
}

}  // namespace
}  // namespace rpg::train
