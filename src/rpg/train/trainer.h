// `rpg train`: the paper's RL loop (Section 5, Algorithms 1-2) configured like verl.
//
// One step: generate n responses for a batch of prompts with the live weights -> score them
// (reward registry by data_source) -> DAPO overlong shaping -> dynamic sampling (drop groups
// whose metric is constant, generate more until train_batch_size groups) -> old log-probs
// (recomputed, or the rollout's) and reference log-probs (initial policy, or the iterative
// reference refreshed every K steps or on a moving-average token-KL target) -> advantages ->
// ppo_epochs x mini-batches x micro-batches of the chosen policy loss (optionally with
// truncated-IS rollout correction), with the global normaliser of each mini-batch -> clip ->
// step. Forward/backward in fp32 or bf16 (a bf16 copy; fp32 master weights and optimizer).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rpg/core/error.h"
#include "rpg/reward/registry.h"
#include "rpg/train/config.h"

namespace rpg::model {
class CausalLM;
}
namespace rpg::rollout {
class Batch;
}

namespace rpg::train {

using Metrics = std::map<std::string, double>;

// Thrown by Trainer::train_step when the rule set ends training once trainer.total_epochs
// passes over the data are used up (fork semantics, as the fork's epoch loop ends) before the
// step could gather its batch; Trainer::fit ends the run there.
class DataExhausted : public Error {
 public:
  using Error::Error;
};

// A prompt longer than max_len cut as verl's data.truncation does: left keeps the end, right
// the start, middle the first max_len / 2 and the last max_len - max_len / 2 tokens.
// ValueError for kError. Shorter prompts are returned unchanged.
std::vector<int64_t> truncate_prompt(std::vector<int64_t> ids, int64_t max_len, Truncation how);

// The adaptive KL controller of Ziegler et al. (2019) as verl applies it to the KL-in-reward
// coefficient: coef * (1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon).
double adaptive_kl_coef(double coef, double current_kl, double target_kl, int64_t horizon, int64_t n);

// The console line of one training step, e.g. "step 3/20 | score -0.512 | pg_loss 0.0123 |
// kl 1.2e-05 | grad_norm 0.53 | response_length 11.2 | 4.1 s"; kl is the step's KL term
// (actor/kl_loss, else actor/rpg_kl, else actor/reward_kl_penalty, else actor/ppo_kl).
std::string step_summary(int64_t step, int64_t total, const Metrics& m);

// The key of one validation metric as verl's _validate lays it out: "val-core/<source>/<name>"
// for the core variable's (acc, else score) mean / maj / best at the largest n, else
// "val-aux/<source>/<name>". `table` is the source's whole metric table.
std::string validation_metric_key(const std::string& source, const std::string& name,
                                  const std::map<std::string, double>& table);

class Trainer {
 public:
  // Loads the model, tokenizer and datasets; throws ConfigError / FormatError / IoError
  // naming the key or file at fault.
  Trainer(TrainConfig config, reward::ScorerRegistry scorers);
  // With the built-in scorers as the resolved config asks for them (the DAPO rule variant of
  // reward_model.reward_kwargs.dapo_variant / rpg.semantics): what `rpg train` and the demo run.
  explicit Trainer(TrainConfig config);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Validates before training if configured (also after a resume), runs every remaining step,
  // validates every test_freq steps and at the last step, checkpoints every save_freq steps
  // and at the end. A new Trainer on
  // the same trainer.default_local_dir resumes from the newest complete checkpoint
  // (resume_mode auto) and produces the same weights as an uninterrupted run.
  void fit();
  // fit() with a caller's stopping rule: after each validation during training, `stop` sees
  // the step and the validation metrics; a non-empty reason ends the run there (logged, and
  // the step is checkpointed as the last one). Not a verl setting: the demo stops its RL
  // stage when validation saturates, where dynamic sampling would draw ever more batches.
  using ValidationStop = std::function<std::string(int64_t step, const Metrics& validation)>;
  void fit(const ValidationStop& stop);
  // One RL step; returns its metrics (verl's names: critic/score/mean, actor/pg_loss, ...).
  Metrics train_step();
  // Generates on the validation files with val_kwargs; metrics laid out as verl's:
  // "val-core/<source>/acc/mean@n" (and maj@n, best@n), the rest under "val-aux/".
  Metrics validate();
  // Writes the policy (evaluation weights for schedule-free AdamW) as a Hugging Face model
  // directory, atomically.
  void save_model(const std::string& dir);

  int64_t global_step() const;
  // Whether a second (reference) model is resident: not with the iterative reference
  // refreshed every step (pi_ref = pi_old), nor when no loss needs one.
  bool has_reference_model() const;
  int64_t total_steps() const;
  // The fp32 master weights (the optimizer's).
  const model::CausalLM& model() const;
  // The last step's batch in verl's layout: input_ids, attention_mask, position_ids, responses,
  // response_mask, rollout_log_probs, group_index, old_log_probs, ref_log_probs (when a
  // reference is used), advantages, token_level_scores (outcome scores on the last token).
  const rollout::Batch& last_batch() const;
 private:
  // A config resolved and validated (trainer.cpp's prepared()): the public constructors prepare
  // theirs once, then build from it; no scorers: the built-in ones its resolved choices ask for.
  struct Prepared {
    TrainConfig config;
  };
  Trainer(Prepared p, std::optional<reward::ScorerRegistry> scorers);
  friend struct TrainerTesting;  // trainer_testing.h: hooks for tests that rebuild an update
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rpg::train
