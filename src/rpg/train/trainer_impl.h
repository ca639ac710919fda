// Private to src/rpg/train (not an API): the trainer's state and the results of one step's
// phases, shared by trainer.cpp (setup, run directory, fit), trainer_checkpoint.cpp (save,
// resume) and phases.cpp (one step).
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rpg/algo/policy_loss.h"
#include "rpg/core/metrics.h"
#include "rpg/data/dataset.h"
#include "rpg/reward/overlong.h"
#include "rpg/reward/registry.h"
#include "rpg/reward/scorer.h"
#include "rpg/rollout/batch.h"
#include "rpg/rollout/engine.h"
#include "rpg/rollout/policy.h"
#include "rpg/train/checkpoint.h"
#include "rpg/train/optim.h"
#include "rpg/train/reference.h"
#include "rpg/train/rules.h"
#include "rpg/train/trainer.h"
#include "rpg/train/trainer_testing.h"

namespace rpg::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One training prompt, rendered and tokenized once.
struct Prompt {
  std::vector<int64_t> ids;
  std::string data_source, ground_truth;
  std::string extra_info;  // the row's extra_info as JSON, for custom reward functions
};

double mean_of(const std::vector<double>& v);
// reward_model.overlong_buffer as the reward shaping of training and validation.
reward::OverlongConfig overlong_shaping(const TrainConfig& cfg);
// Masked mean of a [B, T] tensor.
double masked_mean(const at::Tensor& x, const at::Tensor& mask);

// ---- One training step, phase by phase ----------------------------------------------------

// One prompt's n responses, their scores (after overlong shaping) and correctness.
struct Group {
  const Prompt* prompt = nullptr;
  std::vector<rollout::Response> responses;
  std::vector<double> scores;
  std::vector<bool> acc;
  int64_t round = 0, position = 0;  // which generation batch it came from, and where in it
};

// generate_groups: the groups kept for training and what it took to get them.
struct Generation {
  std::vector<Group> kept;
  int64_t rounds = 0, generated_groups = 0, gen_tokens = 0;
  double gen_seconds = 0, reward_seconds = 0;
  double gen_cpu_seconds = 0;  // process CPU time (user + sys, all threads) of generation
  std::vector<double> all_scores, all_acc;  // every generated response, kept or not
  int64_t reward_timeouts = 0;               // responses scored reward_model.timeout_score
  std::map<std::string, std::vector<double>> reward_extra;  // a custom reward's other keys, NaN where absent
  std::vector<nlohmann::json> samples;      // this step's lines of samples.jsonl
};

// One generation batch, decoded and scored.
struct ScoredRound {
  std::vector<const Prompt*> prompts;
  std::vector<rollout::Response> responses;
  std::vector<reward::ScoreResult> results;
  std::vector<double> scores;  // results' scores after DAPO overlong shaping
};

// to_batch: the verl layout, outcome scores on each response's last token.
struct StepBatch {
  rollout::Batch batch;
  at::Tensor token_level_scores, lengths;  // [B, T], [B]
  std::vector<double> scores;              // per row
  int64_t finished_by_length = 0;
};

// old_and_ref_log_probs
struct PolicyLogProbs {
  at::Tensor old_log_probs, ref_log_probs;  // ref undefined when no reference is used
  // The old log-probs are the update's own forward (verl's on_policy): old_log_probs holds
  // zeros until update_actor returns them (UpdateStats::old_log_probs).
  bool from_update = false;
  double old_seconds = 0, ref_seconds = 0;
};

// advantages
struct AdvantageResult {
  at::Tensor token_level_rewards, advantages;
  at::Tensor returns;  // the estimator's returns (verl logs them as critic/returns/*)
  double seconds = 0;
};

// update_actor: every optimizer step's metrics.
struct UpdateStats {
  std::map<std::string, std::vector<double>> loss_metrics;
  std::vector<double> grad_norms;
  int64_t skipped = 0;
  double scheduled_lr = 0;  // optim.lr times the schedule's factor for this training step
  std::vector<double> lrs;  // the LR each optimizer step of this training step used
  double cpu_seconds = 0;  // process CPU time (user + sys, all threads) of the update
  double lr = 0, seconds = 0;  // lr: the mean of lrs (every step skipped: the LR the next one would use)
  at::Tensor old_log_probs;  // PolicyLogProbs::from_update: the update's own log-probs, [B, T]
};

struct Trainer::Impl {
  TrainConfig cfg;
  // The built-in rules, or what custom_reward_function / reward_model.url ask for.
  std::unique_ptr<reward::RewardScorer> reward;
  rollout::Policy policy;
  // actor_rollout_ref.model.lora_rank > 0: policy.model carries LoRA adapters, the only
  // parameters trained (the base is frozen).
  bool lora = false;
  // pi_ref for KL-to-reference losses (grpo) and KL in the reward (reference.h); null when the
  // reference is refreshed every step (pi_ref = pi_old) or not used.
  std::unique_ptr<ReferencePolicy> reference;
  // compute_dtype=bfloat16: the bf16 working copy that runs forward/backward; the optimizer
  // owns the fp32 master weights in policy.model (which also generates).
  std::unique_ptr<model::CausalLM> compute;
  // dist.shard_master_weights: policy.model holds bf16 weights and is trained directly (no
  // `compute`); the fp32 masters exist only in the (sharded) optimizer state.
  bool shard_master = false;
  // actor_rollout_ref.rollout.dtype other than fp32: the copy of the master weights the
  // engine samples with (and its KV cache's dtype), refreshed in place after every optimizer
  // step and before every generation. Shared with `compute` when the dtypes agree.
  std::unique_ptr<model::CausalLM> rollout_copy;
  // Iterative reference refreshed on a KL target: the moving average of the token-level
  // KL(pi_old || pi_ref) since the last refresh (none yet after one), and refreshes so far.
  std::optional<double> ref_kl_running;
  int64_t ref_updates = 0;
  rollout::Batch last_batch;
  bool recording = false;
  std::vector<UpdateRecord> updates;
  std::vector<std::vector<at::Tensor>> sampling_weights;  // recording: per generation round of the step
  std::vector<at::Tensor> old_log_prob_weights;           // recording: the old-log-prob pass's weights
  GenerationRecord generation_record;                     // recording: dynamic sampling's rounds and choice
  std::unique_ptr<Optimizer> optimizer;
  LrSchedule schedule;
  std::vector<Prompt> prompts;
  std::vector<data::Row> val_rows;
  RunDir run_dir{""};
  std::unique_ptr<MetricsLogger> logger;
  int64_t step = 0, total_steps = 0, steps_per_epoch = 0;
  double kl_in_reward_coef = 0.0;  // algorithm.kl_ctrl: fixed, or adapted every step
  bool needs_reference = false;
  // rpg.semantics: the paper's rules or the fork's, wherever the two differ (rules.h).
  std::unique_ptr<Rules> rules;
  bool recompute_old = true;     // old log-probs: a trainer forward pass, else the rollout's
  bool filter_by_acc = true;     // dynamic sampling metric: acc, else score
  bool adaptive_kl_ctrl = false;  // algorithm.kl_ctrl.type adaptive
  int64_t skipped_total = 0, optimizer_steps_total = 0;  // this process's, for trainer.max_skipped_steps
  int64_t consecutive_skips = 0;   // optimizer steps skipped in a row for a non-finite gradient
  // Data position: epoch and cursor in that epoch's order.
  int64_t epoch = 0, cursor = 0;
  std::vector<int64_t> order;

  Impl(TrainConfig c, reward::ScorerRegistry s);
  void set_epoch(int64_t e);
  // The next `k` prompts of the data stream. Like verl's DataLoader(drop_last=True), an
  // epoch's last partial batch is skipped and the next epoch starts.
  std::vector<const Prompt*> next_prompts(int64_t k);
  rollout::SamplingParams sampling(bool validation) const;
  // The model that runs the trainer's forward/backward passes: the bf16 copy or the master.
  model::CausalLM& compute_model() { return compute ? *compute : policy.model; }
  // What the optimizer trains in `m`: the LoRA adapters (PEFT's names), else every parameter.
  NamedTensors trainable(const model::CausalLM& m) const { return lora ? m.lora_parameters() : m.named_parameters(); }
  std::vector<at::Tensor> trainable_tensors(const model::CausalLM& m) const;
  // Copies the trained values of `from` into `to` (the adapters only with LoRA: the frozen
  // base of every copy was loaded from the same files).
  void copy_trained(const model::CausalLM& from, model::CausalLM& to) const;
  // With LoRA: policy.model gets its adapters (actor_rollout_ref.model.lora_*) and its base
  // weights stop requiring gradients.
  void attach_adapters();
  // The model the rollout engine samples with: the master (fp32 rollouts), the bf16 compute
  // copy, or rollout_copy.
  model::CausalLM& rollout_model();
  // The engine's options for `model` (slots; CUDA graphs where enforce_eager=false allows).
  rollout::EngineOptions engine_options(const model::CausalLM& model) const;
  bool rollout_uses_copy = false;  // rollout_model() is not the master
  // Builds rollout_copy when actor_rollout_ref.rollout.dtype asks for another dtype than the
  // master's and the compute copy's (build_models calls it).
  void build_rollout_copy();
  // Copies the master weights into the rollout model (in place; no-op for fp32 rollouts).
  void refresh_rollout_weights();
  // The bf16 copy takes the master weights' current values (after every optimizer step and
  // every schedule-free train/eval switch).
  void sync_compute_weights();
  // Moves the bf16 copy's gradients of one micro-batch into the fp32 master gradients, so that
  // accumulation over micro-batches happens in fp32.
  void move_compute_grads();
  // Log-probs of the batch's responses under `m` without gradient, in micro-batches.
  at::Tensor log_probs_no_grad(const model::CausalLM& m, const rollout::Batch& b, double temperature);
  // Settings a resumed run must share with the run that wrote the checkpoint.
  nlohmann::json fingerprint() const;
  // fingerprint() plus the weight layout when it is not the default (dist.shard_master_weights).
  nlohmann::json fingerprint_with_layout() const;
  // A checkpoint (layout: RunDir) written into a temporary directory and published by one
  // rename; latest_checkpointed_iteration.txt (verl's marker) is updated after it.
  void save_checkpoint();
  // The checkpoint's actor/: a Hugging Face model directory, or with LoRA PEFT's adapter
  // directory (its base is actor_rollout_ref.model.path).
  void save_actor(const fs::path& dir) const;
  // report.html (eval/report.h) from the run directory's logs, by the rank that writes it.
  void write_report();
  // The checkpoints to resume from, best first (empty: start fresh).
  std::vector<fs::path> resume_candidates() const;
  // Loads the first candidate that is complete and intact; a damaged one is reported and
  // skipped. Returns false when there is nothing to resume from.
  bool resume();
  void load_checkpoint(const fs::path& dir);
  // A checkpoint's step, epoch and data cursor are consistent with its directory and this
  // run's data: FormatError (damaged: skipped for an older one) or, for a step beyond the
  // plan, ConfigError.
  void check_train_state(const fs::path& dir, const nlohmann::json& state) const;
  // The optimizer's step count in a checkpoint fits its training steps (FormatError: damaged).
  void check_optimizer_steps(const fs::path& dir, int64_t training_steps, const OptimizerState& os) const;
  // ---- construction -----------------------------------------------------------------------
  // Training prompts rendered like verl's RLHFDataset (over-long ones filtered or truncated),
  // validation rows, and the step count.
  void load_data();
  // Optimizer and LR schedule (verl's rules).
  void build_optimizer();
  // The reference policy (for a KL-to-reference loss and for KL in the reward: the initial
  // weights, or the policy of every ref_update_freq steps when iterative; with the iterative
  // reference refreshed every step pi_ref = pi_old and no second model is resident) and the
  // bf16 compute copy.
  void build_models();
  // The run directory: a killed checkpoint write's temporary directory removed, the newest
  // intact checkpoint loaded, the logs of steps after it (a crashed run's tail) dropped.
  void open_run_dir();
  // ---- train_step's phases --------------------------------------------------------------
  // Phase 1: generate and score until train_batch_size groups survive dynamic sampling.
  Generation generate_groups();
  // One generation batch: sampled with the live weights, decoded, scored, overlong-shaped;
  // the first responses of the step also go to `gen.samples`.
  ScoredRound generate_round(rollout::RolloutEngine& engine, std::vector<const Prompt*> prompts, Generation& gen);
  // Splits a round into groups of n and keeps them; with dynamic sampling (DAPO) a group whose
  // metric is the same for every response has zero advantage and is dropped.
  void keep_groups(const ScoredRound& r, Generation& gen) const;
  // Phase 2: the kept groups in verl's layout, outcome scores on each response's last token.
  StepBatch to_batch(const Generation& gen) const;
  // Phase 3: old (sampling-policy) log-probs recomputed by the trainer (in the compute dtype,
  // so that the first update's ratio is 1 in the precision it is computed in) or taken from
  // the rollout, and the reference's (pi_old itself when the reference is refreshed every step).
  PolicyLogProbs old_and_ref_log_probs(const StepBatch& sb, Metrics& m);
  // Whether this step's old log-probs can be the update's own (one mini-batch, one epoch,
  // nothing reads them before the update): verl's on_policy, without the separate pass.
  bool old_log_probs_from_update(const StepBatch& sb) const;
  // The rollout/trainer mismatch metrics (training/rollout_log_prob_diff_*, ...).
  static void rollout_mismatch_metrics(const at::Tensor& old_log_probs, const rollout::Batch& b,
                                       std::map<std::string, double>& m);
  // Phase 4: rewards (KL-penalised with algorithm.use_kl_in_reward, REINFORCE++) and
  // advantages on the whole batch.
  AdvantageResult advantages(const StepBatch& sb, const PolicyLogProbs& lp, Metrics& m);
  // Phase 5: ppo_epochs x mini-batches x micro-batches of the policy loss (rules->plan_update),
  // one optimizer step per mini-batch.
  // `batch` carries old_log_probs, ref_log_probs, advantages; with old_from_update its old
  // log-probs are placeholders and the update's own come back in UpdateStats::old_log_probs.
  UpdateStats update_actor(const rollout::Batch& batch, const UpdatePlan& plan, bool old_from_update);
  // One optimizer step: forward/backward of every micro-batch (gradients accumulate in fp32,
  // each loss normalised by the whole mini-batch), clip, step. A non-finite gradient norm
  // skips the step; too many skips in a row stop the run. With `on_policy_old`, the
  // micro-batches' own log-probs are written into it at their batch rows.
  void update_mini_batch(const rollout::Batch& batch, const MiniBatchPlan& mini_plan, UpdateStats& stats,
                         at::Tensor* on_policy_old);
  // The policy loss of one micro-batch (differentiable), under the compute model.
  // With `on_policy_log_probs`, it receives the micro-batch's log-probs, detached (they are
  // its old log-probs too).
  algo::PolicyLossOutput micro_batch_loss(const rollout::Batch& mb, double normaliser,
                                          at::Tensor* on_policy_log_probs = nullptr);
  // Phase 6: the iterative reference becomes the current policy every ref_update_freq steps,
  // or (paper Section 5) when the moving-average token KL to it exceeds the target. Runs after
  // the step counter has advanced.
  void refresh_reference(Metrics& m);
  // Phase 7: the step's metrics, with verl's names.
  void step_metrics(const Generation& gen, const StepBatch& sb, const AdvantageResult& adv, const UpdateStats& up, Metrics& m) const;
  // verl's perf metrics (train/perf_metrics.h) from the step's timing_s/* in `m`: timing per
  // token, throughput, MFU of the update (and of the old-log-prob pass) where the device's peak
  // is known, global_seqlen/*, the process's peak RSS. Runs after timing_s/step is set.
  void perf_metrics(const StepBatch& sb, const PolicyLogProbs& lp, const UpdatePlan& plan, const UpdateStats& up,
                    Metrics& m);
  // The step's metrics line and sample generations, written after the step.
  void log_step(const Metrics& m, const std::vector<nlohmann::json>& samples);
};

}  // namespace rpg::train
