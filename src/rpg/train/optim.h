// Optimizers, learning-rate schedules and gradient clipping of the trainer.
//
// AdamW (Loshchilov & Hutter) matches torch.optim.AdamW; schedule-free AdamW (Defazio et
// al., 2024) matches schedulefree.AdamWScheduleFree. Parameters that are not fp32 get an
// fp32 master copy inside the optimizer, so bf16 weights still take exact fp32 updates.
// Both optimizers expose their whole state as named tensors + scalars, for bit-exact resume.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace rpg::train {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct OptimizerOptions {
  std::string type = "adamw";  // adamw | schedule_free_adamw
  double lr = 1e-6;            // peak LR; AdamW takes the scheduled LR in step()
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  // schedule_free_adamw only: its own linear warm-up, and the averaging weights
  // c_t ∝ t^r * lr_max^weight_lr_power of the paper.
  int64_t warmup_steps = 0;
  double r = 0.0;
  double weight_lr_power = 2.0;
  // schedule_free_adamw only. false (rpg): the LR is `lr` times the own warm-up, whatever step()
  // is handed. true (the authors' fork, fsdp_workers.py:282 + 306-312): verl's LambdaLR writes
  // the scheduled LR into the param group, so the LR is step()'s argument times the own warm-up
  // (the fork passes no warmup_steps: 0).
  bool scheduled_lr = false;
  // schedule_free_adamw only. true (rpg): use_train_weights() after use_eval_weights() restores
  // the exact y it saved. false (schedulefree.AdamWScheduleFree.train()): y is recomputed from x
  // and z by interpolation, as the fork's every eval()/train() pair does (a few ulp off y).
  bool restore_exact_y = true;
};

// The complete state of an optimizer: tensors by "<param name>.<slot>" and scalars.
struct OptimizerState {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, double> scalars;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update from the gradients in the parameters' .grad(). `lr` is the scheduled
  // learning rate (AdamW); schedule-free AdamW multiplies it by its own warm-up with
  // scheduled_lr, else ignores it and uses `lr` times its own warm-up.
  virtual void step(double lr) = 0;
  // The learning rate the next step() uses given the scheduled one: `scheduled` for AdamW,
  // see step() for schedule-free AdamW (what the trainer logs as actor/lr).
  virtual double lr_of_next_step(double scheduled) const { return scheduled; }
  void zero_grad();
  // Schedule-free AdamW trains at y but evaluates at x: the trainer switches the live
  // parameters before generation / evaluation / saving and back before training.
  // No-ops for AdamW. Idempotent.
  virtual void use_eval_weights() {}
  virtual void use_train_weights() {}
  virtual OptimizerState state() const = 0;
  // Throws FormatError when the state does not fit these parameters.
  virtual void load_state(const OptimizerState& state) = 0;
  int64_t step_count() const { return steps_; }
  const NamedTensors& params() const { return params_; }

 protected:
  explicit Optimizer(NamedTensors params);
  NamedTensors params_;
  int64_t steps_ = 0;
};

// Throws ConfigError for an unknown type.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, NamedTensors params);

// Scales the gradients so that their global L2 norm is at most max_norm, as
// torch.nn.utils.clip_grad_norm_ does; returns the norm before clipping. A non-finite
// norm leaves the gradients untouched (the trainer then skips the step, as verl does).
double clip_grad_norm(const NamedTensors& params, double max_norm);

// LR multipliers of verl's schedules (verl.utils.torch_functional), as a function of the
// number of TRAINING steps already taken (0 for the first step): verl steps its LambdaLR once
// per training step (fsdp_workers.py update_actor), so every optimizer step (mini-batch,
// ppo epoch) of one training step uses the same LR. Cosine progress is clamped to [0, 1].
struct LrSchedule {
  std::string type = "constant";  // constant | cosine
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;        // cosine only
  double min_lr_ratio = 0.0;      // cosine only
  double num_cycles = 0.5;        // cosine only
  // The authors' fork's get_constant_schedule_with_warmup: min(1, step / max(1, warmup)), so
  // the first step has LR 0 even without warm-up (verl 0.9.1: 1 when warmup = 0).
  bool fork_constant = false;
  double factor(int64_t step) const;
};

// verl's rule: lr_warmup_steps if > 0, else int(lr_warmup_steps_ratio * total_steps).
int64_t resolve_warmup_steps(int64_t lr_warmup_steps, double lr_warmup_steps_ratio, int64_t total_steps);

}  // namespace rpg::train
