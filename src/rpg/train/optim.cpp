#include "rpg/train/optim.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>

#include "rpg/core/error.h"
#include "rpg/core/test_hook.h"

namespace rpg::train {
namespace {

// fp32 master copy for a low-precision parameter, undefined for an fp32 (or fp64) one.
at::Tensor make_master(const at::Tensor& p) {
  if (p.scalar_type() == at::kFloat || p.scalar_type() == at::kDouble) return {};
  return p.detach().to(at::kFloat).clone();
}

// The tensor the update is applied to: the master copy if any, else the parameter.
at::Tensor target_of(const at::Tensor& param, const at::Tensor& master) { return master.defined() ? master : param.detach(); }

void publish(const at::Tensor& param, const at::Tensor& master) {
  if (master.defined()) param.detach().copy_(master);
}

const at::Tensor& find_tensor(const OptimizerState& s, const std::string& key) {
  auto it = s.tensors.find(key);
  if (it == s.tensors.end()) throw FormatError(str("optimizer state: missing tensor '", key, "'"));
  return it->second;
}

double find_scalar(const OptimizerState& s, const std::string& key) {
  auto it = s.scalars.find(key);
  if (it == s.scalars.end()) throw FormatError(str("optimizer state: missing value '", key, "'"));
  return it->second;
}

void load_into(at::Tensor& slot, const at::Tensor& like, const OptimizerState& s, const std::string& key) {
  const at::Tensor& t = find_tensor(s, key);
  if (t.sizes() != like.sizes())
    throw FormatError(str("optimizer state: '", key, "' has shape ", t.sizes(), ", the parameter ", like.sizes()));
  slot = t.to(like.options()).clone();
}

class AdamW final : public Optimizer {
 public:
  AdamW(const OptimizerOptions& o, NamedTensors params) : Optimizer(std::move(params)), o_(o) {
    for (const auto& [name, p] : params_) {
      Slots s;
      s.master = make_master(p);
      at::Tensor t = target_of(p, s.master);
      s.exp_avg = at::zeros_like(t);
      s.exp_avg_sq = at::zeros_like(t);
      slots_.push_back(std::move(s));
    }
  }

  void step(double lr) override {
    c10::NoGradGuard no_grad;
    ++steps_;
    for (size_t i = 0; i < params_.size(); ++i) {
      // Kill-and-resume tests die here, half of the parameters updated (core/test_hook.h).
      if (i == params_.size() / 2) test_hook::kill_point("optimizer_step");
      const at::Tensor& param = params_[i].second;
      if (!param.grad().defined()) continue;
      Slots& s = slots_[i];
      // Bias correction counts this parameter's own updates, as torch does: a parameter
      // without a gradient in some step is not updated and its count does not advance.
      const double t = static_cast<double>(++s.steps);
      const double bc1 = 1.0 - std::pow(o_.beta1, t);
      const double bc2_sqrt = std::sqrt(1.0 - std::pow(o_.beta2, t));
      at::Tensor p = target_of(param, s.master);
      at::Tensor g = param.grad().to(p.scalar_type());
      // Same operation order as torch.optim.AdamW (single-tensor path).
      p.mul_(1.0 - lr * o_.weight_decay);
      s.exp_avg.lerp_(g, 1.0 - o_.beta1);
      s.exp_avg_sq.mul_(o_.beta2).addcmul_(g, g, 1.0 - o_.beta2);
      at::Tensor denom = (s.exp_avg_sq.sqrt() / bc2_sqrt).add_(o_.eps);
      p.addcdiv_(s.exp_avg, denom, -lr / bc1);
      publish(param, s.master);
    }
  }

  OptimizerState state() const override {
    OptimizerState st;
    st.scalars["step"] = static_cast<double>(steps_);
    for (size_t i = 0; i < params_.size(); ++i) {
      const std::string& n = params_[i].first;
      st.scalars[n + ".step"] = static_cast<double>(slots_[i].steps);
      st.tensors[n + ".exp_avg"] = slots_[i].exp_avg;
      st.tensors[n + ".exp_avg_sq"] = slots_[i].exp_avg_sq;
      if (slots_[i].master.defined()) st.tensors[n + ".master"] = slots_[i].master;
    }
    return st;
  }

  void load_state(const OptimizerState& st) override {
    c10::NoGradGuard no_grad;
    steps_ = static_cast<int64_t>(find_scalar(st, "step"));
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& [n, param] = params_[i];
      Slots& s = slots_[i];
      if (s.master.defined()) load_into(s.master, s.master, st, n + ".master");
      s.steps = static_cast<int64_t>(find_scalar(st, n + ".step"));
      at::Tensor t = target_of(param, s.master);
      load_into(s.exp_avg, t, st, n + ".exp_avg");
      load_into(s.exp_avg_sq, t, st, n + ".exp_avg_sq");
      publish(param, s.master);
    }
  }

 private:
  struct Slots {
    at::Tensor master, exp_avg, exp_avg_sq;
    int64_t steps = 0;
  };
  OptimizerOptions o_;
  std::vector<Slots> slots_;
};

// Schedule-free AdamW. The iterates of the paper: z (the base SGD-like sequence),
// x (a weighted average of z, used for evaluation) and y = (1-beta1) z + beta1 x (where
// gradients are taken). The live parameters hold y in train mode and x in eval mode; x is
// never stored, only recovered from y and z.
class ScheduleFreeAdamW final : public Optimizer {
 public:
  ScheduleFreeAdamW(const OptimizerOptions& o, NamedTensors params) : Optimizer(std::move(params)), o_(o) {
    if (o_.beta1 <= 0.0 || o_.beta1 >= 1.0)
      throw ConfigError(str("schedule_free_adamw: beta1 must be in (0, 1), got ", o_.beta1));
    for (const auto& [name, p] : params_) {
      Slots s;
      s.master = make_master(p);
      at::Tensor t = target_of(p, s.master);
      s.z = t.clone();
      s.exp_avg_sq = at::zeros_like(t);
      slots_.push_back(std::move(s));
    }
  }

  // schedulefree's lr = group['lr'] * sched, sched = (k + 1) / warmup_steps during its warm-up.
  double lr_of_next_step(double scheduled) const override {
    const double k = static_cast<double>(steps_);
    const double group_lr = o_.scheduled_lr ? scheduled : o_.lr;
    return group_lr * (steps_ < o_.warmup_steps ? (k + 1.0) / static_cast<double>(o_.warmup_steps) : 1.0);
  }

  void step(double scheduled) override {
    if (!train_mode_) throw ValueError("schedule_free_adamw: step() called with evaluation weights loaded");
    c10::NoGradGuard no_grad;
    const double k = static_cast<double>(steps_);
    const double lr = lr_of_next_step(scheduled);
    lr_max_ = std::max(lr, lr_max_);
    const double weight = std::pow(k + 1.0, o_.r) * std::pow(lr_max_, o_.weight_lr_power);
    weight_sum_ += weight;
    const double ckp1 = weight_sum_ != 0.0 ? weight / weight_sum_ : 0.0;
    const double bc2 = 1.0 - std::pow(o_.beta2, k + 1.0);
    for (size_t i = 0; i < params_.size(); ++i) {
      // Kill-and-resume tests die here, half of the parameters updated (core/test_hook.h).
      if (i == params_.size() / 2) test_hook::kill_point("optimizer_step");
      const at::Tensor& param = params_[i].second;
      if (!param.grad().defined()) continue;
      Slots& s = slots_[i];
      at::Tensor y = target_of(param, s.master);
      at::Tensor g = param.grad().to(y.scalar_type());
      s.exp_avg_sq.mul_(o_.beta2).addcmul_(g, g, 1.0 - o_.beta2);
      at::Tensor denom = s.exp_avg_sq.div(bc2).sqrt_().add_(o_.eps);
      at::Tensor step_dir = g.div(denom);
      if (o_.weight_decay != 0.0) step_dir.add_(y, o_.weight_decay);  // decay evaluated at y
      // y_{t+1} from y_t and z_t without forming x: lerp towards z, then the gradient step.
      y.lerp_(s.z, ckp1);
      y.add_(step_dir, lr * (o_.beta1 * (1.0 - ckp1) - 1.0));
      s.z.sub_(step_dir, lr);
      publish(param, s.master);
    }
    ++steps_;
  }

  // y -> x -> y by interpolation is not bit-exact in floating point, and validation or a
  // checkpoint in the middle of training must not perturb it: y is kept while x is loaded
  // (restore_exact_y; without it, as schedulefree, y is interpolated back from x and z).
  void use_eval_weights() override {
    if (!train_mode_) return;
    c10::NoGradGuard no_grad;
    saved_y_.clear();
    if (o_.restore_exact_y)
      for (size_t i = 0; i < params_.size(); ++i) saved_y_.push_back(target_of(params_[i].second, slots_[i].master).clone());
    interpolate(1.0 - 1.0 / o_.beta1);  // y -> x
    train_mode_ = false;
  }
  void use_train_weights() override {
    if (train_mode_) return;
    if (saved_y_.size() == params_.size()) {
      c10::NoGradGuard no_grad;
      for (size_t i = 0; i < params_.size(); ++i) {
        target_of(params_[i].second, slots_[i].master).copy_(saved_y_[i]);
        publish(params_[i].second, slots_[i].master);
      }
      saved_y_.clear();
    } else {
      interpolate(1.0 - o_.beta1);  // x -> y (state loaded in eval mode)
    }
    train_mode_ = true;
  }

  OptimizerState state() const override {
    OptimizerState st;
    st.scalars["step"] = static_cast<double>(steps_);
    st.scalars["weight_sum"] = weight_sum_;
    st.scalars["lr_max"] = lr_max_;
    st.scalars["train_mode"] = train_mode_ ? 1.0 : 0.0;
    for (size_t i = 0; i < params_.size(); ++i) {
      const std::string& n = params_[i].first;
      st.tensors[n + ".z"] = slots_[i].z;
      st.tensors[n + ".exp_avg_sq"] = slots_[i].exp_avg_sq;
      if (slots_[i].master.defined()) st.tensors[n + ".master"] = slots_[i].master;
    }
    return st;
  }

  void load_state(const OptimizerState& st) override {
    c10::NoGradGuard no_grad;
    saved_y_.clear();
    steps_ = static_cast<int64_t>(find_scalar(st, "step"));
    weight_sum_ = find_scalar(st, "weight_sum");
    lr_max_ = find_scalar(st, "lr_max");
    train_mode_ = find_scalar(st, "train_mode") != 0.0;
    for (size_t i = 0; i < params_.size(); ++i) {
      const auto& [n, param] = params_[i];
      Slots& s = slots_[i];
      if (s.master.defined()) load_into(s.master, s.master, st, n + ".master");
      at::Tensor t = target_of(param, s.master);
      load_into(s.z, t, st, n + ".z");
      load_into(s.exp_avg_sq, t, st, n + ".exp_avg_sq");
      publish(param, s.master);
    }
  }

 private:
  void interpolate(double weight) {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor p = target_of(params_[i].second, slots_[i].master);
      p.lerp_(slots_[i].z, weight);
      publish(params_[i].second, slots_[i].master);
    }
  }

  struct Slots {
    at::Tensor master, z, exp_avg_sq;
  };
  OptimizerOptions o_;
  std::vector<Slots> slots_;
  std::vector<at::Tensor> saved_y_;  // training weights while the evaluation weights are loaded
  double weight_sum_ = 0.0;
  double lr_max_ = -1.0;
  bool train_mode_ = true;
};

}  // namespace

Optimizer::Optimizer(NamedTensors params) : params_(std::move(params)) {}

void Optimizer::zero_grad() {
  for (auto& [name, p] : params_)
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, NamedTensors params) {
  if (options.type == "adamw") return std::make_unique<AdamW>(options, std::move(params));
  if (options.type == "schedule_free_adamw") return std::make_unique<ScheduleFreeAdamW>(options, std::move(params));
  throw ConfigError(str("optimizer: unknown type '", options.type, "', expected adamw or schedule_free_adamw"));
}

double clip_grad_norm(const NamedTensors& params, double max_norm) {
  c10::NoGradGuard no_grad;
  // torch.nn.utils.clip_grad_norm_ operation for operation, in the gradients' dtype: the norm
  // of the per-tensor norms, clip_coef = max_norm / (total + 1e-6) (Python's float / tensor is
  // reciprocal() * float), clamped to 1 and multiplied in as a tensor. A coefficient computed
  // in double instead differs by an ulp and moves fp32 weights by an ulp after the step.
  std::vector<at::Tensor> norms;
  for (const auto& [name, p] : params)
    if (p.grad().defined()) norms.push_back(at::linalg_vector_norm(p.grad(), 2));
  if (norms.empty()) return 0.0;
  const at::Tensor total = at::linalg_vector_norm(at::stack(norms), 2);
  const double total_d = total.item<double>();
  if (!std::isfinite(total_d)) return total_d;
  const at::Tensor coef = ((total + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
  for (const auto& [name, p] : params)
    if (p.grad().defined()) p.grad().mul_(coef);
  return total_d;
}

double LrSchedule::factor(int64_t step) const {
  const double s = static_cast<double>(step);
  if (type == "constant" && fork_constant)
    return std::min(1.0, s / static_cast<double>(std::max<int64_t>(1, warmup_steps)));
  if (step < warmup_steps) return s / static_cast<double>(std::max<int64_t>(1, warmup_steps));
  if (type == "constant") return 1.0;
  if (type == "cosine") {
    // Clamped: past total_steps the LR stays at its floor instead of climbing again.
    const double progress = std::clamp((s - static_cast<double>(warmup_steps)) /
                                           static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps)),
                                       0.0, 1.0);
    const double x = std::cos(M_PI * num_cycles * 2.0 * progress);
    return std::max(min_lr_ratio, x * (1.0 - min_lr_ratio) * 0.5 + (1.0 + min_lr_ratio) * 0.5);
  }
  throw ConfigError(str("lr schedule: unknown type '", type, "', expected constant or cosine"));
}

int64_t resolve_warmup_steps(int64_t lr_warmup_steps, double lr_warmup_steps_ratio, int64_t total_steps) {
  if (lr_warmup_steps > 0) return lr_warmup_steps;
  return static_cast<int64_t>(lr_warmup_steps_ratio * static_cast<double>(total_steps));
}

}  // namespace rpg::train
