// Test-only hooks into the Trainer, kept out of its public header: tests that rebuild an
// optimizer step by hand read what the trainer did.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "rpg/train/optim.h"
#include "rpg/train/trainer.h"

namespace rpg::train {

// One optimizer step as the trainer took it: the rows of Trainer::last_batch() in the
// mini-batch, the fp32 master weights before the step, the summed micro-batch losses and the
// accumulated fp32 gradients before clipping, in named_parameters() order (with LoRA: the
// adapters, lora_parameters() order).
struct UpdateRecord {
  std::vector<int64_t> rows;
  std::vector<at::Tensor> weights;
  double loss = 0.0;
  std::vector<at::Tensor> grads;
  // With a rollout dtype other than fp32: the rollout model's weights right after this
  // optimizer step (copies; their data pointers in rollout_data), else empty.
  std::vector<at::Tensor> rollout_weights;
  std::vector<const void*> rollout_data;
};

// The generation batches of one training step as dynamic sampling saw them: every round's
// acc per response (groups x n, in generation order) and, in the training batch's order, the
// (round, position in its round) of each group kept.
struct GenerationRecord {
  std::vector<std::vector<double>> acc;
  std::vector<std::pair<int64_t, int64_t>> kept;
};

struct TrainerTesting {
  // With on = true every later train_step keeps an UpdateRecord per optimizer step (costs a
  // copy of the weights and gradients each time).
  static void record_updates(Trainer& t, bool on);
  static const std::vector<UpdateRecord>& last_updates(const Trainer& t);
  // Recording on: the rollout model's weights in each generation round of the last step, and
  // the weights its old log-probs were computed with (named_parameters() order, copies; the
  // sampling weights are followed by the rollout model's LoRA adapters, lora_parameters() order).
  static const std::vector<std::vector<at::Tensor>>& last_sampling_weights(const Trainer& t);
  static const std::vector<at::Tensor>& last_old_log_prob_weights(const Trainer& t);
  static const GenerationRecord& last_generation(const Trainer& t);
  // The optimizer's whole state now (what a checkpoint holds of it).
  static OptimizerState optimizer_state(const Trainer& t);
};

}  // namespace rpg::train
