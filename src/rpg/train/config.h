// The configuration of `rpg train`, with verl's key names so that the overrides of an
// existing verl/RPG run script can be copied as they are. Defaults are verl's
// (verl/trainer/config/ppo_trainer.yaml) unless a comment says otherwise. Keys that only
// steer verl's Ray / vLLM / FSDP plumbing are accepted with a notice (see ignored()).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rpg/train/chat_kwargs.h"

namespace rpg::model {
struct LoraConfig;
}

namespace rpg::train {

// The string-valued keys as enums, converted once by TrainConfig::resolve(); code compares
// these, never the strings.
enum class Truncation { kError, kLeft, kRight, kMiddle };  // data.truncation, as verl
enum class OldLogProbSource { kRecompute, kRollout };
enum class ComputeDtype { kFloat32, kBFloat16 };
enum class KlControlType { kFixed, kAdaptive };
enum class FilterMetric { kAcc, kScore };
enum class ResumeMode { kAuto, kDisable, kResumePath };
// Each enum's config spellings, in enum order: the one table its key's help, validation and
// resolution read (a new value is one enumerator plus one name here).
inline constexpr std::array<const char*, 4> kTruncationNames = {"error", "left", "right", "middle"};
inline constexpr std::array<const char*, 2> kOldLogProbSourceNames = {"recompute", "rollout"};
inline constexpr std::array<const char*, 2> kComputeDtypeNames = {"float32", "bfloat16"};
inline constexpr std::array<const char*, 2> kKlControlTypeNames = {"fixed", "adaptive"};
inline constexpr std::array<const char*, 2> kFilterMetricNames = {"acc", "score"};
inline constexpr std::array<const char*, 3> kResumeModeNames = {"auto", "disable", "resume_path"};
// "a | b | c" of a table, for help texts.
template <size_t N>
std::string one_of(const std::array<const char*, N>& names) {
  std::string out;
  for (const char* n : names) out += (out.empty() ? "" : " | ") + std::string(n);
  return out;
}
// rpg.semantics: what `rpg train` computes (docs/fork-vs-paper.md).
//   kPaper: the paper's algorithms under rpg's names (policy_loss rpg / rpg_reinforce, ...).
//   kFork:  what the authors' verl fork (complex-reasoning/RPG @ ec8e30bd) computes for the
//           same keys: PPO dual-clip + kl_loss_coef * agg(kl_penalty) outside the clip
//           (algo/fork_loss.h), in-reward KL with actor.kl_loss_type, per-micro-batch
//           weighting, steps = floor(N / gen_batch_size) x epochs, reward math_dapo_fork.
enum class Semantics { kPaper, kFork };
// rpg.semantics also takes "auto" (fork when the config uses the fork's spellings). A new rule
// set is one enumerator and one name here, one file implementing train::Rules and one line in
// make_rules (docs/architecture.md).
inline constexpr std::array<const char*, 2> kSemanticsNames = {"paper", "fork"};

struct ResolvedChoices {
  Truncation truncation = Truncation::kError;
  OldLogProbSource old_log_prob_source = OldLogProbSource::kRecompute;
  ComputeDtype compute_dtype = ComputeDtype::kFloat32;
  KlControlType kl_ctrl = KlControlType::kFixed;
  FilterMetric filter_metric = FilterMetric::kAcc;
  ResumeMode resume_mode = ResumeMode::kAuto;
  // A reference model's log-probs are needed by the KL loss (use_kl_loss on and the loss's KL
  // is towards pi_ref: grpo*, verl's KL term appended to a PPO-family loss, the fork's KL loss
  // without use_iterative_ref_model).
  bool kl_loss_uses_reference = false;
  // use_kl_loss with a loss that has no KL term of its own (ppo, vanilla, dapo, rfpp, rfppb,
  // rloo, gspo, cispo): the trainer adds verl's kl_loss_coef * agg(kl_penalty(log_prob, ref)).
  bool append_kl_loss = false;
  Semantics semantics = Semantics::kPaper;
  // The DAPO rule of math_dapo / aime* / amc* (reward::ScorerOptions::dapo_variant):
  // reward_model.reward_kwargs.dapo_variant, else math_dapo_fork in fork semantics, math_dapo in paper.
  std::string dapo_variant = "math_dapo";
  // One line stating the algorithm that runs (logged once by the trainer).
  std::string algorithm_summary;
};

struct DataConfig {
  std::vector<std::string> train_files;  // Parquet files in the paper's schema
  std::vector<std::string> val_files;
  std::string prompt_key = "prompt";
  std::string reward_fn_key = "data_source";
  int64_t max_prompt_length = 512;
  int64_t max_response_length = 512;
  int64_t train_batch_size = 1024;          // prompts per RL step
  std::optional<int64_t> gen_batch_size;    // prompts per generation batch (dynamic sampling)
  std::string truncation = "error";         // kTruncationNames
  bool shuffle = true;
  std::optional<int64_t> seed;              // data shuffling seed; null: trainer.seed (fork: 1)
  bool filter_overlong_prompts = false;
  int64_t train_max_samples = -1;
  int64_t val_max_samples = -1;
  tok::ChatTemplateKwargs apply_chat_template_kwargs;  // template variables, e.g. {enable_thinking: false}

  template <class V>
  void visit(V& v) {
    v("train_files", train_files, "training Parquet files");
    v("val_files", val_files, "validation Parquet files");
    v("prompt_key", prompt_key, "column holding the chat messages");
    v("reward_fn_key", reward_fn_key, "column that selects the reward scorer");
    v("max_prompt_length", max_prompt_length, "prompt tokens (left-padded to this)");
    v("max_response_length", max_response_length, "generated tokens per response");
    v("train_batch_size", train_batch_size, "prompts per RL step");
    v("gen_batch_size", gen_batch_size, "prompts per generation batch; train_batch_size when null");
    v.ignored("val_batch_size", "validation generates all its prompts as one batch; verl deprecated the key too");
    v("truncation", truncation, "over-long prompts: " + one_of(kTruncationNames) + " (middle keeps both ends, as verl)");
    v("shuffle", shuffle, "shuffle the training data every epoch");
    v("seed", seed, "data shuffle seed; null: trainer.seed (fork semantics: 1, the fork's default)");
    v("filter_overlong_prompts", filter_overlong_prompts, "drop prompts longer than max_prompt_length");
    v("train_max_samples", train_max_samples, "use at most this many training rows (-1: all)");
    v("val_max_samples", val_max_samples, "use at most this many validation rows (-1: all)");
    v("apply_chat_template_kwargs", apply_chat_template_kwargs,
      "chat-template variables for every prompt, e.g. {enable_thinking: false} (Qwen3)");
    v.ignored("tokenizer", "the tokenizer is read from the model directory");
    v.ignored("use_shm", "no shared-memory model copy");
    v.ignored("dataloader_num_workers", "data loading is in-process");
    v.ignored("return_raw_chat", "fixed by rpg's rollout");
    v.ignored("return_raw_input_ids", "fixed by rpg's rollout");
    v.ignored("return_full_prompt", "fixed by rpg's rollout");
    v.ignored("trust_remote_code", "no remote code is ever run");
  }
  void validate() const;
};

struct SamplingKwargs {
  double temperature = 0.0;
  double top_p = 1.0;
  int64_t top_k = -1;
  int64_t n = 1;
  bool do_sample = false;

  template <class V>
  void visit(V& v) {
    v("temperature", temperature, "sampling temperature (0: greedy)");
    v("top_p", top_p, "nucleus sampling mass in (0, 1]");
    v("top_k", top_k, "keep the k most likely tokens (-1: all)");
    v("n", n, "responses per prompt");
    v("do_sample", do_sample, "sample (true) or decode greedily (false)");
  }
};

struct RolloutConfig {
  int64_t n = 1;  // responses per prompt
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = -1;
  bool ignore_eos = false;
  int64_t max_num_seqs = 256;  // sequence slots of the continuous-batching engine
  int64_t max_num_batched_tokens = 8192;  // rollout::EngineOptions::max_num_batched_tokens
  // The share of the memory available when a rollout starts (CPU: MemAvailable, divided among
  // the node's ranks; CUDA: the device's free memory) that the engine's KV cache may take: a
  // long-response batch decodes fewer sequences at a time instead of running out of memory.
  // vLLM's gpu_memory_utilization counts the device's total memory and vLLM's weights too.
  double kv_cache_memory_fraction = 0.8;
  // Weights and KV cache the engine samples with: a copy of the live fp32 weights in this
  // dtype, refreshed in place after every optimizer step (auto: the faster on the device).
  std::string dtype = "auto";
  // false: decode steps replayed from a CUDA graph on CUDA (rollout::EngineOptions::cuda_graph;
  // the paper's scripts set false). verl's default; eager on the CPU either way.
  bool enforce_eager = true;
  SamplingKwargs val_kwargs;

  template <class V>
  void visit(V& v) {
    v("n", n, "responses per prompt (group size)");
    v("temperature", temperature, "sampling temperature");
    v("top_p", top_p, "nucleus sampling mass in (0, 1]");
    v("top_k", top_k, "keep the k most likely tokens (-1: all)");
    v("ignore_eos", ignore_eos, "keep generating past EOS");
    v("max_num_seqs", max_num_seqs, "concurrent sequences in the generation engine");
    v("max_num_batched_tokens", max_num_batched_tokens,
      "most prompt tokens one prefill forward takes; a longer prompt is prefilled in chunks of this size");
    v("kv_cache_memory_fraction", kv_cache_memory_fraction,
      "share of the memory available at a rollout's start that its KV cache may take (fewer concurrent sequences beyond)");
    v("dtype", dtype, "auto | float32 | bfloat16 | float16: rollout weights and KV cache (auto: the faster on the device)");
    v("enforce_eager", enforce_eager, "false: decode steps replayed from a CUDA graph on CUDA (eager on the CPU)");
    v.section("val_kwargs", val_kwargs, "sampling for validation");
    for (const char* key : {"name", "mode", "tensor_model_parallel_size", "data_parallel_size",
                            "expert_parallel_size", "pipeline_model_parallel_size", "gpu_memory_utilization",
                            "free_cache_engine", "max_model_len",
                            "enable_chunked_prefill", "enable_prefix_caching", "load_format",
                            "disable_log_stats", "engine_kwargs", "calculate_log_probs", "layered_summon",
                            "multi_turn", "agent", "cudagraph_capture_sizes", "prompt_length", "response_length",
                            "do_sample"})
      v.ignored(key, "vLLM/SGLang setting; rpg generates in-process");
    for (const char* key : {"log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu", "log_prob_use_dynamic_bsz",
                            "log_prob_max_token_len_per_gpu"})
      v.ignored(key, "micro-batching of the no-grad old log-prob pass; rpg cuts that pass like the actor's update "
                     "(actor.use_dynamic_bsz / ppo_max_token_len_per_gpu / ppo_micro_batch_size_per_gpu), which "
                     "changes no log-prob beyond float rounding");
  }
};

struct OptimConfig {
  double lr = 1e-6;
  double weight_decay = 0.01;
  std::vector<double> betas = {0.9, 0.999};
  int64_t lr_warmup_steps = -1;         // -1: use lr_warmup_steps_ratio
  double lr_warmup_steps_ratio = 0.0;
  std::optional<std::string> warmup_style;  // deprecated verl spelling of lr_scheduler_type
  std::string lr_scheduler_type = "constant";  // constant | cosine
  double min_lr_ratio = 0.0;
  double num_cycles = 0.5;
  std::string optim_type = "adamw";  // adamw | schedule_free_adamw (the RPG fork's key)
  int64_t total_training_steps = -1;  // filled in by the trainer

  template <class V>
  void visit(V& v) {
    v("lr", lr, "peak learning rate");
    v("weight_decay", weight_decay, "decoupled weight decay");
    v("betas", betas, "Adam betas");
    v("lr_warmup_steps", lr_warmup_steps, "linear warm-up steps (-1: use lr_warmup_steps_ratio)");
    v("lr_warmup_steps_ratio", lr_warmup_steps_ratio, "warm-up steps as a fraction of total steps");
    v("warmup_style", warmup_style, "old name of lr_scheduler_type");
    v("lr_scheduler_type", lr_scheduler_type, "constant | cosine");
    v("min_lr_ratio", min_lr_ratio, "cosine floor as a fraction of lr");
    v("num_cycles", num_cycles, "cosine cycles");
    v("optim_type", optim_type, "adamw | schedule_free_adamw");
    v("total_training_steps", total_training_steps, "set by the trainer");
    v.ignored("optimizer", "use optim_type");
    v.ignored("optimizer_impl", "rpg has its own optimizers");
    v.ignored("clip_grad", "use actor_rollout_ref.actor.grad_clip");
    v.ignored("override_optimizer_config", "not supported");
    v.ignored("zero_indexed_step", "rpg counts steps from 1 like verl's default");
  }
};

struct ActorConfig {
  int64_t ppo_mini_batch_size = 256;  // prompts per optimizer step
  std::optional<int64_t> ppo_micro_batch_size_per_gpu;
  std::optional<int64_t> ppo_micro_batch_size;  // deprecated global form; resolve() divides it into the per-GPU one
  bool use_dynamic_bsz = false;
  int64_t ppo_max_token_len_per_gpu = 16384;
  int64_t ppo_epochs = 1;
  bool shuffle = false;
  double clip_ratio = 0.2;
  std::optional<double> clip_ratio_low;   // clip_ratio when null
  std::optional<double> clip_ratio_high;  // clip_ratio when null
  double clip_ratio_c = 3.0;              // dual-clip bound
  std::string loss_agg_mode = "token-mean";
  double entropy_coeff = 0.0;
  bool use_kl_loss = false;
  std::string kl_loss_type = "low_var_kl";
  double kl_loss_coef = 0.001;
  bool use_iterative_ref_model = false;  // the RPG fork: pi_ref <- pi_theta periodically
  int64_t ref_update_freq = 1;           // steps between reference updates when iterative (<= 0: never by count)
  // rpg (paper Section 5): also refresh the iterative reference when a moving average of the
  // token-level KL(pi_old || pi_ref) exceeds this target kappa (0: off).
  double ref_kl_target = 0.0;
  double ref_kl_ema = 0.1;               // weight of the newest step in that moving average
  // rpg: where the old log-probs (pi_old) come from: recomputed by a forward pass of the
  // trainer (verl's default), or the sampling engine's own log-probs (saves that pass).
  std::string old_log_prob_source = "recompute";
  // rpg: with one mini-batch and one epoch per step (verl's on_policy), the recomputed old
  // log-probs are the update's own log-probs, detached, and no separate forward pass runs;
  // applies when nothing needs them before the update (no KL in the reward, no
  // ref_kl_target, not fork semantics).
  bool on_policy_old_log_probs = true;
  // rpg: dtype of forward/backward; the master weights and the optimizer state stay fp32.
  // Unset: bfloat16 in fork semantics (the fork's FSDP MixedPrecision default: bf16 params
  // for forward/backward, fp32 gradient reduction and masters), float32 in paper semantics.
  std::optional<std::string> compute_dtype;
  std::string policy_loss = "vanilla";   // policy loss by registry name
  std::string kl_form = "ufkl";          // rpg / rpg_reinforce: fkl | rkl | ufkl | urkl
  bool rpg_style_clip = true;            // rpg / rpg_reinforce: RPG-Style Clip (Algorithms 1, 2)
  double grad_clip = 1.0;
  OptimConfig optim;

  template <class V>
  void visit(V& v) {
    v("ppo_mini_batch_size", ppo_mini_batch_size, "prompts per optimizer step");
    v("ppo_micro_batch_size_per_gpu", ppo_micro_batch_size_per_gpu, "rows per forward/backward");
    v("ppo_micro_batch_size", ppo_micro_batch_size,
      "deprecated: rows per forward/backward over all processes (divided by trainer.nnodes x n_gpus_per_node into "
      "ppo_micro_batch_size_per_gpu, as verl)");
    v("use_dynamic_bsz", use_dynamic_bsz, "pack micro-batches by token budget");
    v("ppo_max_token_len_per_gpu", ppo_max_token_len_per_gpu, "token budget of one micro-batch");
    v("ppo_epochs", ppo_epochs, "passes over each batch");
    v("shuffle", shuffle, "shuffle rows between epochs");
    v("clip_ratio", clip_ratio, "PPO clip epsilon");
    v("clip_ratio_low", clip_ratio_low, "lower clip epsilon (clip_ratio when null)");
    v("clip_ratio_high", clip_ratio_high, "upper clip epsilon (clip_ratio when null)");
    v("clip_ratio_c", clip_ratio_c, "dual-clip constant c > 1");
    v("loss_agg_mode", loss_agg_mode,
      "token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm");
    v("entropy_coeff", entropy_coeff, "entropy bonus coefficient");
    v("use_kl_loss", use_kl_loss, "add a KL loss term (GRPO / RPG)");
    v("kl_loss_type", kl_loss_type,
      "kl (k1) | abs | mse (k2) | low_var_kl (k3); the RPG fork's rpg_<kl>, rpg_rf_<kl>[_clip_ppo] set policy_loss/kl_form");
    v("kl_loss_coef", kl_loss_coef, "KL coefficient beta");
    v("use_iterative_ref_model", use_iterative_ref_model, "update the reference policy to the current one");
    v("ref_update_freq", ref_update_freq, "steps between reference updates (<= 0: only on ref_kl_target)");
    v("ref_kl_target", ref_kl_target, "also refresh the reference when the moving-average token KL to it exceeds this (0: off)");
    v("ref_kl_ema", ref_kl_ema, "weight of the newest step in the moving-average token KL, in (0, 1]");
    v("old_log_prob_source", old_log_prob_source,
      one_of(kOldLogProbSourceNames) + ": a trainer forward pass, or the engine's log-probs");
    v("on_policy_old_log_probs", on_policy_old_log_probs,
      "one mini-batch, one epoch: old log-probs = the update's own, detached (no separate pass)");
    v("compute_dtype", compute_dtype,
      one_of(kComputeDtypeNames) + " forward/backward (master weights stay fp32; a fixed reference computes in it too); "
      "null: bfloat16 in fork semantics (the fork's FSDP mixed precision), float32 in paper semantics");
    v("policy_loss", policy_loss, "policy loss by registry name (docs/algorithms.md)");
    v("kl_form", kl_form, "rpg / rpg_reinforce regulariser: fkl | rkl | ufkl | urkl");
    v("rpg_style_clip", rpg_style_clip, "rpg / rpg_reinforce: RPG-Style Clip");
    v("grad_clip", grad_clip, "max global gradient norm");
    v.section("optim", optim, "optimizer and LR schedule");
    for (const char* key : {"strategy", "fsdp_config", "ulysses_sequence_parallel_size", "use_torch_compile",
                            "checkpoint", "profiler", "use_remove_padding", "entropy_from_logits_with_chunking",
                            "entropy_checkpointing", "use_fused_kernels", "data_loader_seed"})
      v.ignored(key, "FSDP/Megatron setting");
  }
  void validate() const;
};

struct ModelConfig {
  std::string path;  // Hugging Face model directory
  bool enable_gradient_checkpointing = true;
  // Padding-free log-prob passes (old, reference, update): each micro-batch's real tokens
  // packed into one stream. Equal to the padded path within fp32 rounding. Off by default
  // (verl 0.9 defaults to true) so that runs without the key, the demo's included, keep
  // their numbers.
  bool use_remove_padding = false;
  // LoRA (verl's keys): rank 0 trains every weight; > 0 trains adapters of this rank on
  // target_modules with the base frozen, and the fixed reference is the base itself (adapters
  // off: no second model, verl's ref_in_actor). docs/lora.md.
  int64_t lora_rank = 0;
  double lora_alpha = 16;
  std::vector<std::string> target_modules = {"all-linear"};
  double lora_dropout = 0.0;             // rpg computes LoRA without dropout: only 0 is accepted
  std::optional<int64_t> lora_init_seed;  // seed of the adapters' A init; null: trainer.seed

  template <class V>
  void visit(V& v) {
    v("path", path, "Hugging Face model directory");
    v("enable_gradient_checkpointing", enable_gradient_checkpointing, "recompute layer activations in backward");
    v.ignored("tokenizer_path", "the tokenizer is read from actor_rollout_ref.model.path");
    v("use_remove_padding", use_remove_padding, "padding-free forward/backward: a micro-batch's real tokens packed");
    v("lora_rank", lora_rank, "LoRA adapter rank; 0 trains every weight (no adapters)");
    v("lora_alpha", lora_alpha, "LoRA scaling numerator: adapters are scaled by lora_alpha / lora_rank");
    v("target_modules", target_modules,
      "projections that get adapters: all-linear, or a list of q_proj k_proj v_proj o_proj gate_proj up_proj down_proj");
    v("lora_dropout", lora_dropout, "LoRA dropout; only 0 (RL trains adapters without dropout)");
    v("lora_init_seed", lora_init_seed, "seed of the adapters' initialisation; null: trainer.seed");
    for (const char* key : {"trust_remote_code", "external_lib",
                            "enable_activation_offload", "use_shm", "use_liger", "use_fused_kernels"})
      v.ignored(key, "HF/FSDP loading option");
    v.ignored("override_config", "HF config overrides are not applied: rpg's models have no dropout, and dropout 0 "
                                 "(attention_dropout, embd_pdrop, resid_pdrop) is all the fork's scripts override");
  }
};

struct ActorRolloutRefConfig {
  ModelConfig model;
  ActorConfig actor;
  RolloutConfig rollout;
  int64_t nccl_timeout = 600;  // seconds (verl's default): the data-parallel process group's timeout

  template <class V>
  void visit(V& v) {
    v.section("model", model);
    v.section("actor", actor);
    v.section("rollout", rollout);
    v.ignored("ref", "the reference policy shares the actor's settings");
    v.ignored("hybrid_engine", "rollout and training always share weights in rpg");
    v("nccl_timeout", nccl_timeout, "seconds before a data-parallel collective (or the rendezvous) fails");
  }
};

struct KlControlConfig {
  std::string type = "fixed";  // fixed | adaptive
  double kl_coef = 0.001;
  int64_t horizon = 10000;
  double target_kl = 0.1;

  template <class V>
  void visit(V& v) {
    v("type", type, one_of(kKlControlTypeNames));
    v("kl_coef", kl_coef, "KL-in-reward coefficient");
    v("horizon", horizon, "adaptive controller horizon");
    v("target_kl", target_kl, "adaptive controller target");
  }
};

struct FilterGroupsConfig {
  bool enable = false;
  std::string metric = "acc";  // verl default is "reward"; DAPO recipes use acc
  int64_t max_num_gen_batches = 0;  // <= 0: no limit

  template <class V>
  void visit(V& v) {
    v("enable", enable, "dynamic sampling: drop groups whose metric is constant");
    v("metric", metric, one_of(kFilterMetricNames) + " (score: the reward after overlong shaping)");
    v("max_num_gen_batches", max_num_gen_batches, "generation batches per step before giving up (<=0: no limit)");
  }
};

// verl's algorithm.rollout_correction (verl/trainer/config/algorithm/rollout_correction.yaml):
// truncated importance sampling between the sampling engine's and the trainer's log-probs.
struct RolloutCorrectionConfig {
  std::optional<std::string> rollout_is;       // null (off) | token | sequence
  double rollout_is_threshold = 2.0;            // truncation: rho = min(pi_old / pi_rollout, threshold)
  std::optional<std::string> rollout_rs;       // rejection sampling: not implemented, must be null
  std::optional<std::string> rollout_rs_threshold;
  bool bypass_mode = false;                     // true: old log-probs are the rollout's (2 policies)
  std::string loss_type = "ppo_clip";           // bypass-mode loss; rpg picks its loss by policy_loss
  bool rollout_is_batch_normalize = false;      // not implemented, must be false

  template <class V>
  void visit(V& v) {
    v("rollout_is", rollout_is, "truncated IS weight per token | sequence (null: off)");
    v("rollout_is_threshold", rollout_is_threshold, "upper bound of the truncated IS weight");
    v("rollout_rs", rollout_rs, "rejection sampling (not supported: null)");
    v("rollout_rs_threshold", rollout_rs_threshold, "rejection sampling threshold (unused)");
    v("bypass_mode", bypass_mode, "take the old log-probs from the rollout (= actor.old_log_prob_source=rollout)");
    v("loss_type", loss_type, "ppo_clip (the loss is actor_rollout_ref.actor.policy_loss)");
    v("rollout_is_batch_normalize", rollout_is_batch_normalize, "normalise IS weights to mean 1 (not supported: false)");
  }
};

struct AlgorithmConfig {
  std::string adv_estimator = "grpo";  // verl's default is gae (needs a critic, which rpg has not)
  double gamma = 1.0;
  bool norm_adv_by_std_in_grpo = true;
  bool use_kl_in_reward = false;
  std::string kl_penalty = "kl";
  KlControlConfig kl_ctrl;
  FilterGroupsConfig filter_groups;
  RolloutCorrectionConfig rollout_correction;

  template <class V>
  void visit(V& v) {
    v("adv_estimator", adv_estimator, "advantage estimator by name");
    v("gamma", gamma, "discount for token-level rewards");
    v.ignored("lam", "GAE's lambda: rpg has no critic, so no GAE estimator");
    v("norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo, "divide GRPO advantages by the group std");
    v("use_kl_in_reward", use_kl_in_reward, "fold the KL penalty into the token reward");
    v("kl_penalty", kl_penalty, "KL estimator of the in-reward penalty");
    v.section("kl_ctrl", kl_ctrl);
    v.section("filter_groups", filter_groups);
    v.ignored("use_pf_ppo", "not supported");
    v.ignored("pf_ppo", "not supported");
    v.section("rollout_correction", rollout_correction);
  }
};

struct OverlongBufferConfig {
  bool enable = false;
  int64_t len = 0;
  double penalty_factor = 0.0;

  template <class V>
  void visit(V& v) {
    v("enable", enable, "DAPO overlong reward shaping");
    v("len", len, "buffer length in tokens before max_response_length");
    v("penalty_factor", penalty_factor, "penalty at the maximum length");
    v.ignored("log", "rpg logs no per-response overlong metrics");
  }
};

// verl's reward_model.reward_kwargs (keyword arguments of the reward manager); rpg reads one.
struct RewardKwargsConfig {
  std::optional<std::string> dapo_variant;  // math_dapo | math_dapo_fork; null: by rpg.semantics

  template <class V>
  void visit(V& v) {
    v("dapo_variant", dapo_variant,
      "DAPO rule of math_dapo/aime*/amc*: math_dapo (verl 0.9.1, \\boxed{} fallback) | math_dapo_fork (the "
      "authors' fork, 'Answer:' only); null: math_dapo_fork in fork semantics, math_dapo in paper semantics");
  }
};

struct RewardModelConfig {
  OverlongBufferConfig overlong_buffer;
  std::string reward_manager = "dapo";
  RewardKwargsConfig reward_kwargs;
  std::optional<std::string> url;  // a reward service instead of the built-in rules
  int64_t num_workers = 0;
  double timeout_s = 10.0;
  double timeout_score = 0.0;
  int64_t request_batch_size = 64;

  template <class V>
  void visit(V& v) {
    v.section("overlong_buffer", overlong_buffer);
    v("reward_manager", reward_manager,
      "naive | dapo | prime | rpg: each response scored on its own (rpg = the authors' fork; prime's process "
      "pool is custom_reward_function's); batch is refused");
    v.section("reward_kwargs", reward_kwargs, "reward manager options");
    v("url", url,
      "reward service: POST [{data_source, solution_str, ground_truth, extra_info}] -> [{score, ...}] "
      "(docs/rewards.md); null: custom_reward_function or the built-in rules");
    v("num_workers", num_workers,
      "Python reward worker processes (custom_reward_function) or requests in flight (url); 0: one per core");
    v("timeout_s", timeout_s,
      "a response (Python) or request (url) not scored within this many seconds scores timeout_score "
      "(reward/timeouts)");
    v("timeout_score", timeout_score, "the score of a response whose scorer timed out");
    v("request_batch_size", request_batch_size, "responses per request to reward_model.url");
    v.ignored("enable", "rpg scores with rules, not a reward model");
    v.ignored("model", "rpg scores with rules, not a reward model");
    v.ignored("max_length", "rpg scores with rules, not a reward model");
  }
};

// verl's custom_reward_function: a Python file's function scores every response instead of
// the built-in rules (reward/python_pool.h).
struct CustomRewardFunctionConfig {
  std::optional<std::string> path;
  std::string name = "compute_score";
  std::string python = "python3";
  JsonMapping reward_kwargs;

  template <class V>
  void visit(V& v) {
    v("path", path,
      "Python file with compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> "
      "number | {score, ...}; null: the built-in rules by data_source");
    v("name", name, "the function's name in that file");
    v("python", python, "the Python that runs it (searched on PATH without a '/'); rpg's worker needs no package");
    v("reward_kwargs", reward_kwargs, "keyword arguments passed to the function");
  }
};

struct TrainerConfig {
  int64_t total_epochs = 30;
  std::optional<int64_t> total_training_steps;
  int64_t test_freq = -1;
  int64_t save_freq = -1;
  bool val_before_train = true;
  std::string resume_mode = "auto";  // auto | disable | resume_path
  std::optional<std::string> resume_path;
  std::string default_local_dir = "checkpoints";
  std::optional<int64_t> max_actor_ckpt_to_keep;
  bool save_on_preempt = true;  // rpg: checkpoint on SIGTERM / SIGINT before exiting (core/signals.h)
  int64_t seed = 42;
  std::string device = "auto";  // auto | cpu | cuda
  int64_t max_consecutive_skips = 10;  // rpg: stop after this many non-finite updates in a row
  std::optional<int64_t> max_skipped_steps;  // rpg: null = 10% of the optimizer steps taken
  int64_t sample_log_freq = 10;        // rpg: log sample generations every this many steps (0: never)
  int64_t sample_log_count = 4;        // rpg: how many responses each time
  // verl's cluster shape; null: not checked (1). Checked against the launcher's (torchrun/srun/rpg
  // launch); in fork semantics also the ranks whose layout the update emulates (fork_rules.cpp).
  std::optional<int64_t> nnodes, n_gpus_per_node;
  bool balance_batch = true;  // verl's default

  template <class V>
  void visit(V& v) {
    v("total_epochs", total_epochs, "passes over the training data");
    v("total_training_steps", total_training_steps, "stop after this many steps (epochs decide when null)");
    v("test_freq", test_freq, "validate every this many steps (-1: never)");
    v("save_freq", save_freq, "checkpoint every this many steps (-1: only at the end)");
    v("val_before_train", val_before_train, "validate once before the first step");
    v("resume_mode", resume_mode, one_of(kResumeModeNames));
    v("resume_path", resume_path, "checkpoint to resume from with resume_mode=resume_path");
    v("default_local_dir", default_local_dir, "run directory (checkpoints, logs)");
    v("max_actor_ckpt_to_keep", max_actor_ckpt_to_keep, "keep the newest N checkpoints (all when null)");
    v("save_on_preempt", save_on_preempt, "on SIGTERM/SIGINT finish the step, save a checkpoint, exit 75");
    v("seed", seed, "seed of every random stream");
    v.ignored("project_name", "a name for wandb; rpg's run is its directory, trainer.default_local_dir");
    v.ignored("experiment_name", "a name for wandb; rpg's run is its directory, trainer.default_local_dir");
    v("device", device, "auto | cpu | cuda");
    v("max_consecutive_skips", max_consecutive_skips, "stop after this many skipped (non-finite) updates in a row");
    v("max_skipped_steps", max_skipped_steps,
      "exit 1 (after the final checkpoint) when more optimizer steps than this were skipped for a non-finite loss "
      "or gradient in this process; null: 10% of its optimizer steps; a run whose every step was skipped always fails");
    v("sample_log_freq", sample_log_freq, "write sample generations to samples.jsonl every N steps (0: never)");
    v("sample_log_count", sample_log_count, "responses per sample log");
    v("nnodes", nnodes, "nodes launched (checked against the launcher when set and more than one process runs)");
    v("n_gpus_per_node", n_gpus_per_node,
      "processes per node (checked like nnodes); fork semantics: nnodes x n_gpus_per_node is the data-parallel "
      "layout the update emulates (balance_batch, per-rank mini- and micro-batches) in any number of processes");
    v.ignored("logger", "rpg always writes metrics.jsonl and TensorBoard events in the run directory");
    v("balance_batch", balance_batch,
      "fork semantics: reorder each step's rows into token-balanced rank partitions before the update, as the "
      "fork's _balance_batch (no effect on the paper's update)");
    for (const char* key : {"log_val_generations",
                            "critic_warmup", "ray_wait_register_center_timeout", "del_local_ckpt_after_load",
                            "default_hdfs_dir", "max_critic_ckpt_to_keep", "use_legacy_worker_impl"})
      v.ignored(key, "Ray/cluster setting");
  }
};

// rpg's data-parallel settings (docs/scaling.md).
struct DistConfig {
  int64_t zero_stage = 0;  // 0: replicated optimizer; 1: optimizer state sharded; 2: and the gradients
  double reduce_bucket_mb = 25.0;  // ZeRO-2: gradient bucket reduced during backward (DeepSpeed's reduce_bucket_size)
  // ZeRO-1/2 with bf16 compute: the policy itself holds bf16 weights (it generates, is the
  // reference's source, and is saved) and the fp32 master weights live only in the sharded
  // optimizer state, 1/N per rank (textbook ZeRO / FSDP mixed precision; docs/scaling.md).
  bool shard_master_weights = false;

  template <class V>
  void visit(V& v) {
    v("zero_stage", zero_stage,
      "0 (replicated optimizer state) | 1 (optimizer state sharded over the ranks) | 2 (and the gradients)");
    v("reduce_bucket_mb", reduce_bucket_mb,
      "ZeRO-2: MiB of gradients per bucket reduced to their owners during backward (default 25)");
    v("shard_master_weights", shard_master_weights,
      "ZeRO-1/2 + compute_dtype bfloat16: the policy holds bf16 weights, the fp32 masters only the sharded "
      "optimizer state (1/N per rank); default false (fp32 weights replicated)");
  }
};

// Keys of rpg's own (no verl counterpart).
struct RpgConfig {
  std::string semantics = "auto";  // auto, or one of kSemanticsNames

  template <class V>
  void visit(V& v) {
    v("semantics", semantics,
      "auto | " + one_of(kSemanticsNames) +
          ": paper (the paper's algorithms under rpg's names), fork (compute what the authors' verl fork "
          "computes for these keys), auto (fork when the config uses the fork's spellings: kl_loss_type=rpg_*, "
          "optim_type=schedulefree, reward_manager=rpg; else paper). docs/fork-vs-paper.md");
  }
};

// The whole `rpg train` configuration.
struct TrainConfig {
  DataConfig data;
  ActorRolloutRefConfig actor_rollout_ref;
  AlgorithmConfig algorithm;
  RewardModelConfig reward_model;
  CustomRewardFunctionConfig custom_reward_function;
  TrainerConfig trainer;
  DistConfig dist;  // rpg: data-parallel settings
  RpgConfig rpg;
  // Not a config key: filled by resolve().
  ResolvedChoices choices;

  template <class V>
  void visit(V& v) {
    v.section("data", data);
    v.section("actor_rollout_ref", actor_rollout_ref);
    v.section("algorithm", algorithm);
    v.section("reward_model", reward_model);
    v.section("custom_reward_function", custom_reward_function, "a Python reward function (verl's)");
    v.section("trainer", trainer);
    v.section("dist", dist);
    v.section("rpg", rpg, "rpg's own settings");
    v.ignored("critic", "rpg trains no critic");
    v.ignored("ray_init", "no Ray");
    v.ignored("ray_kwargs", "no Ray");
    v.ignored("global_profiler", "no profiler hook; bench/roofline/roofline_bench --ops K lists the ops of each phase");
  }
  void validate() const;
  // A Python reward function or a reward service scores instead of the built-in rules.
  bool reward_calls_out() const { return custom_reward_function.path || reward_model.url; }
  // Decides rpg.semantics (auto -> fork | paper). In paper semantics, rewrites aliases into the
  // canonical keys, so the resolved config shows what runs: the RPG
  // fork's kl_loss_type spellings (rpg_ufkl, rpg_rf_ufkl_clip_ppo, ...) into policy_loss,
  // kl_form and rpg_style_clip; verl's rollout_correction.bypass_mode into
  // old_log_prob_source. Converts the string keys to `choices`. Idempotent; returns one
  // notice per rewrite. ConfigError for a spelling we do not implement.
  std::vector<std::string> resolve();
  // Fork semantics: ConfigError naming the key for what the authors' fork has no code for
  // (another policy_loss, seq-mean-token-sum-norm, a kl_loss_type the fork lacks, rollout
  // old log-probs, ref_kl_target, rollout correction).
  void check_fork_semantics() const;
  // optim_type=schedulefree outside fork semantics (the fork's optimizer as its code runs it):
  // one of validate()'s rules, callable alone.
  void check_trainable() const;
  // actor_rollout_ref.model.lora_* as the model's adapter configuration (target_modules
  // all-linear expanded); ConfigError naming the key for an unknown or repeated projection.
  model::LoraConfig lora_config() const;
  bool uses_lora() const { return actor_rollout_ref.model.lora_rank > 0; }

 private:
  void validate_lora() const;
  // The keys in the fork's spellings that make rpg.semantics=auto fork ("key=value" each).
  std::vector<std::string> fork_spellings() const;
  // rpg.semantics as resolve() decides it, before it has.
  bool fork_semantics() const { return rpg.semantics == "fork" || (rpg.semantics == "auto" && !fork_spellings().empty()); }
};

}  // namespace rpg::train
