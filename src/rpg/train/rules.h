// Private to src/rpg/train: which rules a training step follows. rpg.semantics chooses one
// rule set once, at start: the paper's algorithms as rpg implements them (paper_rules.cpp) or
// what the authors' verl fork computed when their scripts ran (fork_rules.cpp). The trainer
// asks its Rules at every point where the two differ, so neither path tests for the other;
// a third rule set (say verl upstream's current semantics) is one new file and one line in
// make_rules.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "rpg/algo/policy_loss.h"
#include "rpg/model/causal_lm.h"
#include "rpg/rollout/batch.h"
#include "rpg/train/config.h"
#include "rpg/train/optim.h"

namespace rpg::train {

// How the update cuts a step's batch (Rules::plan_update, once per step; used by the update
// and by the rank split of the perf metrics): per PPO epoch, the mini-batches (one optimizer
// step each; rows of the batch), each cut into micro-batches (rows of the mini-batch).
// Data-parallel processes run contiguous shares of every mini-batch's micro-batches
// (dp::micro_batch_range).
struct MiniBatchPlan {
  std::vector<int64_t> rows;
  std::vector<std::vector<int64_t>> micro;
};
struct UpdatePlan {
  std::vector<std::vector<MiniBatchPlan>> epochs;
};

// The KL-penalised rewards of algorithm.use_kl_in_reward and the batch's KL as the adaptive
// controller sees it (the mean over rows of each row's token mean).
struct KlInReward {
  at::Tensor token_level_rewards;
  double current_kl = 0;
};

class Rules {
 public:
  virtual ~Rules() = default;

  // ---- data and step counting ---------------------------------------------------------
  // The order epoch `epoch` (0-based) visits the `n` training prompts in (data.shuffle).
  virtual std::vector<int64_t> epoch_order(int64_t n, int64_t epoch) const = 0;
  // Training ends when trainer.total_epochs passes over the data are used up, even before
  // the planned step count (else the data stream wraps into further epochs).
  virtual bool data_ends_with_total_epochs() const = 0;
  // Training prompts one training step counts against the epoch (steps per epoch =
  // prompts / this).
  virtual int64_t prompts_per_step() const = 0;

  // ---- optimizer and weights ----------------------------------------------------------
  // The parameters in the order the optimizer and gradient clipping walk them (a float sum
  // of per-tensor norms depends on it).
  virtual NamedTensors optimizer_order(NamedTensors params) const = 0;
  // The constant LR schedule gives LR 0 at the first step (the fork's LambdaLR).
  virtual bool constant_schedule_starts_at_zero() const = 0;
  // Schedule-free AdamW's weights (x or y) for the old/ref log-prob pass and for validation
  // and export. No-op for AdamW.
  virtual void use_old_log_prob_weights(Optimizer& optimizer) const = 0;
  // Schedule-free AdamW: generation round `round` of a step (0: the first) samples at x
  // (true) or at y, the weights the update leaves.
  virtual bool samples_at_x(int64_t round) const = 0;
  virtual void use_export_weights(Optimizer& optimizer) const = 0;

  // ---- reference and log-probs --------------------------------------------------------
  // A reference model is kept in memory (else pi_ref is pi_old, no second model).
  virtual bool reference_resident() const = 0;
  // The resident reference computes in the actor's compute dtype; with fp32 compute it holds
  // the checkpoint's weights rounded to bf16 (true) or as the checkpoint has them (false).
  virtual bool reference_weights_bf16() const = 0;
  // How every trainer log-prob pass runs the model (no-grad passes and the update).
  virtual void set_log_prob_options(model::LogProbOptions& options) const = 0;
  // The old log-probs may come from the update's own forward (verl's on_policy) when the
  // step's shape allows it.
  virtual bool allows_old_log_probs_from_update() const = 0;

  // ---- rewards ------------------------------------------------------------------------
  // algorithm.use_kl_in_reward: scores - coef * KL(old, ref) per token.
  virtual KlInReward kl_in_reward(const at::Tensor& token_level_scores, const at::Tensor& old_log_probs,
                                  const at::Tensor& ref_log_probs, const at::Tensor& response_mask,
                                  double coef) const = 0;

  // The row order the advantage estimator sums the batch in (group statistics, batch
  // whitening: float sums, so the order shows in the last bits); empty: the batch's own.
  virtual std::vector<int64_t> advantage_order(const rollout::Batch& batch) const = 0;

  // ---- the update ---------------------------------------------------------------------
  // ppo_epochs x mini-batches x micro-batches of training step `step` (0-based).
  virtual UpdatePlan plan_update(const rollout::Batch& batch, int64_t step) const = 0;
  // The one normaliser every micro-batch's loss of `mini` is divided by (0: each micro-batch
  // aggregates over its own tokens).
  virtual double loss_normaliser(const rollout::Batch& mini) const = 0;
  // The differentiable loss of one micro-batch whose backward accumulates the mini-batch's
  // gradient, and its metrics.
  virtual algo::PolicyLossOutput micro_batch_loss(const algo::PolicyLossInputs& in, int64_t micro_batch_rows) const = 0;
};

// The rule set rpg.semantics names (the config resolved and validated).
std::unique_ptr<Rules> make_rules(const TrainConfig& cfg);
std::unique_ptr<Rules> make_paper_rules(const TrainConfig& cfg);
std::unique_ptr<Rules> make_fork_rules(const TrainConfig& cfg);

// Shared by the rule sets and the no-grad log-prob passes: consecutive rows of
// ppo_micro_batch_size_per_gpu (all rows when unset), or token-budget micro-batches of
// ppo_max_token_len_per_gpu with use_dynamic_bsz.
// `attention_mask` holds the rows' masks ([rows, T]).
std::vector<std::vector<int64_t>> micro_batches(const at::Tensor& attention_mask, const ActorConfig& actor);
// The actor's optimizer-step rows: ppo_mini_batch_size prompts x rollout.n.
int64_t mini_batch_rows(const TrainConfig& cfg);

}  // namespace rpg::train
