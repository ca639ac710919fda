#include "rpg/train/config.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <span>
#include <sstream>

#include "rpg/algo/advantage.h"
#include "rpg/algo/fork_loss.h"
#include "rpg/algo/policy_loss.h"
#include "rpg/core/error.h"
#include "rpg/model/causal_lm.h"
#include "rpg/reward/registry.h"

namespace rpg::train {
namespace {

void require(bool ok, const std::string& key, const std::string& message) {
  if (!ok) throw ConfigError(str(key, ": ", message));
}

void require_one_of(const std::string& value, std::span<const char* const> allowed, const std::string& key) {
  for (const char* a : allowed)
    if (value == a) return;
  std::string list;
  for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
  throw ConfigError(str(key, ": got '", value, "', expected one of ", list));
}
void require_one_of(const std::string& value, std::initializer_list<const char*> allowed, const std::string& key) {
  require_one_of(value, std::span<const char* const>(allowed.begin(), allowed.size()), key);
}

// Range checks: "<full.dotted.key>: must be <range>, got <value>".
template <class T>
void at_least(T value, T lo, const std::string& key) {
  require(value >= lo, key, str("must be >= ", lo, ", got ", value));
}
template <class T>
void above(T value, T lo, const std::string& key) {
  require(value > lo, key, str("must be > ", lo, ", got ", value));
}
// [lo, hi] or [lo, hi) with hi_open.
void in_range(double value, double lo, double hi, bool hi_open, const std::string& key) {
  require(value >= lo && (hi_open ? value < hi : value <= hi), key,
          str("must be in [", lo, ", ", hi, hi_open ? ")" : "]", ", got ", value));
}
void unit_interval_open_low(double value, const std::string& key) {  // (0, 1]
  require(value > 0 && value <= 1, key, str("must be in (0, 1], got ", value));
}
template <class T>
void at_least(const std::optional<T>& value, T lo, const std::string& key) {
  if (value) at_least(*value, lo, key);
}
// -1 (off / all) or >= lo
void minus_one_or_at_least(int64_t value, int64_t lo, const std::string& key, const char* minus_one_means) {
  require(value == -1 || value >= lo, key, str("must be -1 (", minus_one_means, ") or >= ", lo, ", got ", value));
}

// The enum of `value` in its name table (config.h, enum order); ConfigError naming the key otherwise.
template <class E, size_t N>
E choice(const std::string& value, const std::array<const char*, N>& names, const std::string& key) {
  for (size_t i = 0; i < N; ++i)
    if (value == names[i]) return static_cast<E>(i);
  require_one_of(value, names, key);
  return E{};  // unreachable: require_one_of threw
}

// rpg.semantics after "auto" is decided; ConfigError listing auto and the table otherwise.
Semantics semantics_named(const std::string& value) {
  for (size_t i = 0; i < kSemanticsNames.size(); ++i)
    if (value == kSemanticsNames[i]) return static_cast<Semantics>(i);
  std::string names = "auto";
  for (const char* n : kSemanticsNames) names += str(", ", n);
  throw ConfigError(str("rpg.semantics: got '", value, "', expected one of ", names));
}

}  // namespace

void DataConfig::validate() const {
  // The paper's schema fixes these columns; another name would be silently ignored.
  require(prompt_key == "prompt", "data.prompt_key", str("only 'prompt' is supported, got '", prompt_key, "'"));
  require(reward_fn_key == "data_source", "data.reward_fn_key",
          str("only 'data_source' is supported, got '", reward_fn_key, "'"));
  above<int64_t>(max_prompt_length, 0, "data.max_prompt_length");
  above<int64_t>(max_response_length, 0, "data.max_response_length");
  at_least<int64_t>(train_batch_size, 1, "data.train_batch_size");
  at_least<int64_t>(gen_batch_size, 1, "data.gen_batch_size");
  at_least<int64_t>(seed, 0, "data.seed");
  minus_one_or_at_least(train_max_samples, 1, "data.train_max_samples", "all");
  minus_one_or_at_least(val_max_samples, 1, "data.val_max_samples", "all");
  require_one_of(truncation, kTruncationNames, "data.truncation");
}

void ActorConfig::validate() const {
  const std::string p = "actor_rollout_ref.actor.";
  at_least<int64_t>(ppo_mini_batch_size, 1, p + "ppo_mini_batch_size");
  at_least<int64_t>(ppo_micro_batch_size_per_gpu, 1, p + "ppo_micro_batch_size_per_gpu");
  at_least<int64_t>(ppo_micro_batch_size, 1, p + "ppo_micro_batch_size");
  at_least<int64_t>(ppo_max_token_len_per_gpu, 1, p + "ppo_max_token_len_per_gpu");
  at_least<int64_t>(ppo_epochs, 1, p + "ppo_epochs");
  // The lower bound 1 - eps_low of the ratio must stay positive.
  in_range(clip_ratio, 0, 1, /*hi_open=*/true, p + "clip_ratio");
  if (clip_ratio_low) in_range(*clip_ratio_low, 0, 1, /*hi_open=*/true, p + "clip_ratio_low");
  at_least<double>(clip_ratio_high, 0, p + "clip_ratio_high");
  at_least(kl_loss_coef, 0.0, p + "kl_loss_coef");
  require(clip_ratio_c > 1.0, p + "clip_ratio_c", str("the dual-clip constant must be > 1, got ", clip_ratio_c));
  require_one_of(loss_agg_mode, {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"},
                 p + "loss_agg_mode");
  require(grad_clip > 0, p + "grad_clip", str("must be > 0, got ", grad_clip));
  require_one_of(kl_form, {"fkl", "rkl", "ufkl", "urkl"}, p + "kl_form");
  require(ref_update_freq > 0 || ref_kl_target > 0, p + "ref_update_freq",
          str("must be > 0 unless ref_kl_target refreshes the reference, got ", ref_update_freq));
  require(ref_kl_target >= 0, p + "ref_kl_target", str("must be >= 0 (0: off), got ", ref_kl_target));
  require(ref_kl_target == 0 || use_iterative_ref_model, p + "ref_kl_target",
          "refreshes the iterative reference: set use_iterative_ref_model=true");
  require(ref_kl_ema > 0 && ref_kl_ema <= 1, p + "ref_kl_ema", str("must be in (0, 1], got ", ref_kl_ema));
  require_one_of(old_log_prob_source, kOldLogProbSourceNames, p + "old_log_prob_source");
  if (compute_dtype) require_one_of(*compute_dtype, kComputeDtypeNames, p + "compute_dtype");
  above(optim.lr, 0.0, p + "optim.lr");
  at_least(optim.weight_decay, 0.0, p + "optim.weight_decay");
  require(optim.betas.size() == 2, p + "optim.betas", "expected two values [beta1, beta2]");
  for (size_t i = 0; i < optim.betas.size(); ++i)
    in_range(optim.betas[i], 0, 1, /*hi_open=*/true, str(p, "optim.betas[", i, "]"));
  minus_one_or_at_least(optim.lr_warmup_steps, 0, p + "optim.lr_warmup_steps", "use lr_warmup_steps_ratio");
  in_range(optim.lr_warmup_steps_ratio, 0, 1, /*hi_open=*/false, p + "optim.lr_warmup_steps_ratio");
  in_range(optim.min_lr_ratio, 0, 1, /*hi_open=*/false, p + "optim.min_lr_ratio");
  above(optim.num_cycles, 0.0, p + "optim.num_cycles");
  minus_one_or_at_least(optim.total_training_steps, 1, p + "optim.total_training_steps", "set by the trainer");
  // "schedulefree" (the fork's spelling) runs in fork semantics only (TrainConfig::check_trainable).
  require_one_of(optim.optim_type, {"adamw", "schedule_free_adamw", "schedulefree"}, p + "optim.optim_type");
  require_one_of(optim.warmup_style.value_or(optim.lr_scheduler_type), {"constant", "cosine"},
                 p + (optim.warmup_style ? "optim.warmup_style" : "optim.lr_scheduler_type"));
}

// A name missing from a registry is an error listing the valid ones, naming the key.
void require_registered(bool ok, const std::string& key, const std::string& name, const std::vector<std::string>& names) {
  if (ok) return;
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
  throw ConfigError(str(key, ": unknown name '", name, "'; valid: ", list));
}

void TrainConfig::validate() const {
  data.validate();
  const auto& loss = actor_rollout_ref.actor.policy_loss;
  require_registered(algo::policy_loss_registry().contains(loss), "actor_rollout_ref.actor.policy_loss", loss,
                     algo::policy_loss_names());
  require_registered(algo::advantage_registry().contains(algorithm.adv_estimator), "algorithm.adv_estimator",
                     algorithm.adv_estimator, algo::advantage_names());
  actor_rollout_ref.actor.validate();
  // KL estimator names (k1, k3, low_var_kl, ...): algorithm.kl_penalty in both rule sets; the
  // actor's kl_loss_type in paper semantics (the fork's kl_loss_type is checked against its own
  // forms by check_fork_semantics; an rpg_* spelling is rewritten by resolve()).
  auto estimator = [](const std::string& name, const std::string& key) {
    try {
      (void)algo::parse_kl_estimator(name);
    } catch (const ValueError& e) {
      throw ConfigError(str(key, ": ", e.what()));
    }
  };
  estimator(algorithm.kl_penalty, "algorithm.kl_penalty");
  if (!fork_semantics() && actor_rollout_ref.actor.kl_loss_type.rfind("rpg_", 0) != 0)
    estimator(actor_rollout_ref.actor.kl_loss_type, "actor_rollout_ref.actor.kl_loss_type");
  check_trainable();
  const auto& r = actor_rollout_ref.rollout;
  const std::string p = "actor_rollout_ref.rollout.";
  at_least<int64_t>(r.n, 1, p + "n");
  // Training divides the logits by the rollout temperature (verl's log-probs): 0 would be a
  // division by zero at the first step, after the run directory was made.
  require(r.temperature > 0 && std::isfinite(r.temperature), p + "temperature",
          str("must be > 0 for training (the log-probs divide the logits by it; greedy decoding has no "
              "policy gradient), got ", r.temperature));
  unit_interval_open_low(r.top_p, p + "top_p");
  minus_one_or_at_least(r.top_k, 1, p + "top_k", "all tokens");
  at_least<int64_t>(r.max_num_seqs, 1, p + "max_num_seqs");
  at_least<int64_t>(r.max_num_batched_tokens, 1, p + "max_num_batched_tokens");
  unit_interval_open_low(r.kv_cache_memory_fraction, p + "kv_cache_memory_fraction");
  require_one_of(r.dtype, {"auto", "float32", "bfloat16", "float16"}, p + "dtype");
  at_least(r.val_kwargs.temperature, 0.0, p + "val_kwargs.temperature");
  unit_interval_open_low(r.val_kwargs.top_p, p + "val_kwargs.top_p");
  minus_one_or_at_least(r.val_kwargs.top_k, 1, p + "val_kwargs.top_k", "all tokens");
  at_least<int64_t>(r.val_kwargs.n, 1, p + "val_kwargs.n");
  const int64_t mini = actor_rollout_ref.actor.ppo_mini_batch_size;
  require(mini <= data.train_batch_size && data.train_batch_size % mini == 0,
          "actor_rollout_ref.actor.ppo_mini_batch_size",
          str("got ", mini, ", must divide data.train_batch_size (", data.train_batch_size, ")"));
  in_range(algorithm.gamma, 0, 1, /*hi_open=*/false, "algorithm.gamma");
  require_one_of(algorithm.kl_ctrl.type, kKlControlTypeNames, "algorithm.kl_ctrl.type");
  at_least(algorithm.kl_ctrl.kl_coef, 0.0, "algorithm.kl_ctrl.kl_coef");
  above<int64_t>(algorithm.kl_ctrl.horizon, 0, "algorithm.kl_ctrl.horizon");
  above(algorithm.kl_ctrl.target_kl, 0.0, "algorithm.kl_ctrl.target_kl");
  require(algorithm.kl_ctrl.type != "adaptive" || (algorithm.kl_ctrl.target_kl > 0 && algorithm.kl_ctrl.horizon > 0),
          "algorithm.kl_ctrl", "adaptive control needs target_kl > 0 and horizon > 0");
  require_one_of(algorithm.filter_groups.metric, kFilterMetricNames, "algorithm.filter_groups.metric");
  {
    const auto& rc = algorithm.rollout_correction;
    const std::string q = "algorithm.rollout_correction.";
    if (rc.rollout_is) require_one_of(*rc.rollout_is, {"token", "sequence"}, q + "rollout_is");
    require(rc.rollout_is_threshold > 0, q + "rollout_is_threshold", str("must be > 0, got ", rc.rollout_is_threshold));
    require(!rc.rollout_rs, q + "rollout_rs", "rejection sampling is not implemented (leave it null)");
    require(!rc.rollout_is_batch_normalize, q + "rollout_is_batch_normalize", "not implemented (leave it false)");
    require(rc.loss_type == "ppo_clip", q + "loss_type",
            str("got '", rc.loss_type, "': rpg chooses the loss with actor_rollout_ref.actor.policy_loss"));
    // The IS weight pi_old / pi_rollout is exactly 1 when pi_old is the rollout's.
    require(!rc.rollout_is || (actor_rollout_ref.actor.old_log_prob_source == "recompute" && !rc.bypass_mode),
            q + "rollout_is", "has no effect when the old log-probs are the rollout's (old_log_prob_source=rollout / "
            "bypass_mode=true)");
  }
  {
    // A reference model is used by a KL loss towards pi_ref (grpo*, verl's term appended to a
    // PPO-family loss) and by KL in the reward; rpg and rpg_reinforce regularise towards pi_old,
    // which is the policy at the start of each step.
    const auto& a = actor_rollout_ref.actor;
    const auto& e = algo::policy_loss_registry().get(a.policy_loss);
    const bool loss_uses_reference = a.use_kl_loss && (e.needs_reference || !e.own_kl_term);
    require(a.ref_kl_target == 0 || loss_uses_reference || algorithm.use_kl_in_reward,
            "actor_rollout_ref.actor.ref_kl_target",
            str("no reference policy is in use (policy_loss ", a.policy_loss, " regularises towards pi_old; a reference "
                "is used by a KL loss towards pi_ref (grpo*, use_kl_loss with a PPO-family loss) and "
                "algorithm.use_kl_in_reward)"));
  }
  {
    const auto& names = reward::dapo_variant_names();
    const auto& v = reward_model.reward_kwargs.dapo_variant;
    if (v && std::find(names.begin(), names.end(), *v) == names.end())
      throw ConfigError(str("reward_model.reward_kwargs.dapo_variant: got '", *v, "', expected math_dapo or math_dapo_fork"));
  }
  if (rpg.semantics != "auto") (void)semantics_named(rpg.semantics);
  if (rpg.semantics == "fork") check_fork_semantics();
  at_least<int64_t>(reward_model.overlong_buffer.len, 0, "reward_model.overlong_buffer.len");
  at_least(reward_model.overlong_buffer.penalty_factor, 0.0, "reward_model.overlong_buffer.penalty_factor");
  require(!reward_model.overlong_buffer.enable || reward_model.overlong_buffer.len > 0,
          "reward_model.overlong_buffer.len", "must be > 0 when the overlong buffer is enabled");
  require(!reward_model.overlong_buffer.enable || reward_model.overlong_buffer.len < data.max_response_length,
          "reward_model.overlong_buffer.len", "must be < data.max_response_length");
  // verl's batch manager calls the function once with lists; rpg's scorers take one response each.
  require(reward_model.reward_manager != "batch", "reward_model.reward_manager",
          "batch (one call with lists) is not supported: rpg calls custom_reward_function once per response; use "
          "naive");
  require_one_of(reward_model.reward_manager, {"naive", "dapo", "prime", "rpg"}, "reward_model.reward_manager");
  {
    const auto& u = reward_model.url;
    require(!u || u->starts_with("http://") || u->starts_with("https://"), "reward_model.url",
            str("must start with http:// or https://, got '", u.value_or(""), "'"));
    require(!(u && custom_reward_function.path), "reward_model.url",
            "and custom_reward_function.path are both set: score with one of them");
    require(!custom_reward_function.path || !custom_reward_function.path->empty(), "custom_reward_function.path",
            "empty (null for the built-in rules)");
    require(!custom_reward_function.name.empty(), "custom_reward_function.name", "empty");
    require(!custom_reward_function.python.empty(), "custom_reward_function.python", "empty");
    at_least<int64_t>(reward_model.num_workers, 0, "reward_model.num_workers");
    require(reward_model.timeout_s > 0 && std::isfinite(reward_model.timeout_s), "reward_model.timeout_s",
            str("must be > 0, got ", reward_model.timeout_s));
    require(std::isfinite(reward_model.timeout_score), "reward_model.timeout_score", "must be finite");
    at_least<int64_t>(reward_model.request_batch_size, 1, "reward_model.request_batch_size");
  }
  require_one_of(trainer.resume_mode, kResumeModeNames, "trainer.resume_mode");
  require(trainer.resume_mode != "resume_path" || trainer.resume_path, "trainer.resume_path",
          "required when trainer.resume_mode=resume_path");
  require_one_of(trainer.device, {"auto", "cpu", "cuda"}, "trainer.device");
  at_least<int64_t>(trainer.max_consecutive_skips, 1, "trainer.max_consecutive_skips");
  if (trainer.max_skipped_steps) at_least<int64_t>(*trainer.max_skipped_steps, 0, "trainer.max_skipped_steps");
  at_least<int64_t>(trainer.total_epochs, 1, "trainer.total_epochs");
  at_least<int64_t>(trainer.total_training_steps, 1, "trainer.total_training_steps");
  at_least<int64_t>(trainer.test_freq, -1, "trainer.test_freq");
  at_least<int64_t>(trainer.save_freq, -1, "trainer.save_freq");
  at_least<int64_t>(trainer.max_actor_ckpt_to_keep, 0, "trainer.max_actor_ckpt_to_keep");
  at_least<int64_t>(trainer.seed, 0, "trainer.seed");
  at_least<int64_t>(trainer.sample_log_freq, 0, "trainer.sample_log_freq");
  at_least<int64_t>(trainer.sample_log_count, 0, "trainer.sample_log_count");
  at_least<int64_t>(trainer.nnodes, 1, "trainer.nnodes");
  at_least<int64_t>(trainer.n_gpus_per_node, 1, "trainer.n_gpus_per_node");
  at_least<int64_t>(actor_rollout_ref.nccl_timeout, 1, "actor_rollout_ref.nccl_timeout");
  require(dist.zero_stage >= 0 && dist.zero_stage <= 2, "dist.zero_stage",
          str("must be 0, 1 or 2, got ", dist.zero_stage));
  require(dist.reduce_bucket_mb > 0, "dist.reduce_bucket_mb", str("must be > 0, got ", dist.reduce_bucket_mb));
  const std::string dtype = actor_rollout_ref.actor.compute_dtype.value_or(fork_semantics() ? "bfloat16" : "float32");
  require(!dist.shard_master_weights || dtype == "bfloat16", "dist.shard_master_weights",
          str("true needs actor_rollout_ref.actor.compute_dtype=bfloat16 (got ", dtype,
              "): with fp32 compute the fp32 weights are the only copy"));
  require(!dist.shard_master_weights || dist.zero_stage >= 1, "dist.shard_master_weights",
          str("true needs dist.zero_stage=1 or 2 (got ", dist.zero_stage, "): the masters live in the sharded optimizer state"));
  validate_lora();
}

void TrainConfig::validate_lora() const {
  const auto& m = actor_rollout_ref.model;
  const std::string p = "actor_rollout_ref.model.";
  at_least<int64_t>(m.lora_rank, 0, p + "lora_rank");
  require(m.lora_dropout == 0, p + "lora_dropout",
          str("got ", m.lora_dropout, ": rpg computes LoRA without dropout (RL post-training uses 0)"));
  if (m.lora_init_seed) at_least<int64_t>(*m.lora_init_seed, 0, p + "lora_init_seed");
  require(m.lora_alpha > 0 && std::isfinite(m.lora_alpha), p + "lora_alpha", str("must be > 0, got ", m.lora_alpha));
  (void)lora_config();  // target_modules, checked with or without adapters (a typo shows either way)
  require(m.lora_rank == 0 || !dist.shard_master_weights, "dist.shard_master_weights",
          "true has nothing to shard with actor_rollout_ref.model.lora_rank > 0: the base weights are frozen and "
          "only the adapters have master weights");
}

model::LoraConfig TrainConfig::lora_config() const {
  const auto& m = actor_rollout_ref.model;
  model::LoraConfig c;
  c.rank = m.lora_rank;
  c.alpha = m.lora_alpha;
  const auto& known = model::lora_module_names();
  for (const auto& t : m.target_modules) {
    if (t == "all-linear") {
      require(m.target_modules.size() == 1, "actor_rollout_ref.model.target_modules",
              "all-linear cannot be combined with other names");
      c.target_modules = known;
      continue;
    }
    require(std::find(known.begin(), known.end(), t) != known.end(), "actor_rollout_ref.model.target_modules",
            str("unknown projection '", t, "'; valid: all-linear, q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                "down_proj"));
    require(std::find(c.target_modules.begin(), c.target_modules.end(), t) == c.target_modules.end(),
            "actor_rollout_ref.model.target_modules", str("'", t, "' is listed twice"));
    c.target_modules.push_back(t);
  }
  require(!c.target_modules.empty(), "actor_rollout_ref.model.target_modules", "empty");
  return c;
}

namespace {

std::string number(double x) {
  std::ostringstream o;
  o << x;
  return o.str();
}

// The one line stating what `rpg train` computes with this config.
std::string algorithm_summary(const TrainConfig& c) {
  const auto& a = c.actor_rollout_ref.actor;
  const auto& alg = c.algorithm;
  const std::string low = number(a.clip_ratio_low.value_or(a.clip_ratio)),
                    high = number(a.clip_ratio_high.value_or(a.clip_ratio));
  std::string adv = alg.adv_estimator;
  if (adv == "grpo") adv = alg.norm_adv_by_std_in_grpo ? "group-normalised advantage (grpo)" : "group-mean advantage (grpo, no std)";
  else if (adv == "rpg" || adv == "drgrpo") adv = "group-mean advantage (" + adv + ")";
  else adv = "advantage " + adv;
  std::string in_reward = "no KL in the reward";
  if (c.choices.semantics == Semantics::kFork) {
    const std::string ref = a.use_iterative_ref_model ? "pi_old" : "pi_ref";
    std::string kl = a.use_kl_loss ? str("KL loss ", number(a.kl_loss_coef), " * ", a.kl_loss_type, "(pi_theta, ", ref,
                                         ") outside the clip (", a.loss_agg_mode, ")")
                                   : str("no KL loss (use_kl_loss=False)");
    if (alg.use_kl_in_reward)
      in_reward = str("reward -= ", number(alg.kl_ctrl.kl_coef), " * ", a.kl_loss_type, "(pi_old, ", ref, ")");
    return str("fork semantics: PPO dual-clip (eps ", low, "/", high, ", c ", number(a.clip_ratio_c), "), ", adv, ", ",
               kl, ", ", in_reward, ", ", a.optim.optim_type,
               a.optim.optim_type != "schedulefree" ? ""
               : alg.use_kl_in_reward && alg.filter_groups.enable
                   ? " (old log-probs and generation rounds 2..k at x; first round, update, validation, saving at y)"
                   : " (old log-probs at x; sampling, update, validation, saving at y)",
               " lr ", number(a.optim.lr), ", reward ", c.choices.dapo_variant);
  }
  std::string loss = "policy_loss " + a.policy_loss;
  if (a.policy_loss == "rpg" || a.policy_loss == "rpg_reinforce")
    loss += str(" (", a.kl_form, a.rpg_style_clip ? ", RPG-Style Clip" : ", no clip", ", beta ",
                a.use_kl_loss ? number(a.kl_loss_coef) : std::string("0 (use_kl_loss=False)"), ")");
  else if (a.use_kl_loss)
    loss += str(" + KL loss ", number(a.kl_loss_coef), " * ", a.kl_loss_type, "(pi_theta, pi_ref)");
  else
    loss += " (no KL loss)";
  if (alg.use_kl_in_reward) in_reward = str("reward -= ", number(alg.kl_ctrl.kl_coef), " * ", alg.kl_penalty, "(pi_old, pi_ref)");
  return str("paper semantics: ", loss, ", ", adv, ", ", in_reward, ", ", a.optim.optim_type, " lr ",
             number(a.optim.lr), ", reward ", c.choices.dapo_variant);
}

}  // namespace

void TrainConfig::check_fork_semantics() const {
  {
    // What the authors' fork has no code for is refused, never silently changed.
    const auto& a = actor_rollout_ref.actor;
    const std::string p = "actor_rollout_ref.actor.";
    const std::string why = " (rpg.semantics=fork computes what the authors' fork computes; set rpg.semantics=paper)";
    require(a.policy_loss == "vanilla" || a.policy_loss == "ppo", p + "policy_loss",
            str("got '", a.policy_loss, "': the fork's actor always runs PPO dual-clip (dp_actor.py:336) and selects "
                "its KL by kl_loss_type", why));
    require(a.loss_agg_mode != "seq-mean-token-sum-norm", p + "loss_agg_mode",
            str("'seq-mean-token-sum-norm' does not exist in the fork", why));
    require((!a.use_kl_loss && !algorithm.use_kl_in_reward) || algo::fork_kl_penalty_registry().contains(a.kl_loss_type),
            p + "kl_loss_type", str("'", a.kl_loss_type, "' is not one of the fork's kl_penalty forms", why));
    require(a.old_log_prob_source == "recompute", p + "old_log_prob_source",
            str("the fork always recomputes the old log-probs", why));
    require(a.ref_kl_target == 0, p + "ref_kl_target", str("the fork has no KL-target reference refresh", why));
    require(!algorithm.rollout_correction.rollout_is, "algorithm.rollout_correction.rollout_is",
            str("the fork has no rollout correction", why));
    require(a.optim.min_lr_ratio == 0 && a.optim.num_cycles == 0.5,
            p + (a.optim.min_lr_ratio != 0 ? "optim.min_lr_ratio" : "optim.num_cycles"),
            str("the fork's fsdp_workers.py passes neither min_lr_ratio nor num_cycles to its cosine schedule", why));
    // The update emulates the fork's W ranks (train/fork_rules.cpp): its dispatch splits the
    // batch into W equal chunks and fsdp_workers.py:117-119 asserts a per-rank mini-batch.
    const int64_t world = trainer.nnodes.value_or(1) * trainer.n_gpus_per_node.value_or(1);
    const int64_t rows = data.train_batch_size * actor_rollout_ref.rollout.n;
    require(rows % world == 0, "trainer.n_gpus_per_node",
            str("data.train_batch_size x rollout.n = ", rows, " rows do not split over trainer.nnodes x "
                "trainer.n_gpus_per_node = ", world, " ranks (the fork's dispatch needs equal chunks)"));
    require(a.ppo_mini_batch_size * actor_rollout_ref.rollout.n >= world, p + "ppo_mini_batch_size",
            str(a.ppo_mini_batch_size, " x rollout.n = ", a.ppo_mini_batch_size * actor_rollout_ref.rollout.n,
                " rows leave none for each of trainer.nnodes x trainer.n_gpus_per_node = ", world,
                " ranks (the fork asserts a per-rank mini-batch)"));
  }
}

void TrainConfig::check_trainable() const {
  const auto& o = actor_rollout_ref.actor.optim;
  require(o.optim_type != "schedulefree" || fork_semantics(),
          "actor_rollout_ref.actor.optim.optim_type",
          "'schedulefree' is the authors' fork's optimizer as its code runs it (schedulefree.AdamWScheduleFree with "
          "verl's LambdaLR on top, old log-probs at x, sampling/training/validation/saving at y) and needs "
          "rpg.semantics=fork; with rpg.semantics=paper use schedule_free_adamw (rpg's schedule-free AdamW: its own "
          "warm-up, validation and export at x)");
}

std::vector<std::string> TrainConfig::fork_spellings() const {
  // The fork's spellings: its kl_loss_type names, its optimizer name and its reward manager.
  const auto& a = actor_rollout_ref.actor;
  std::vector<std::string> why;
  if (a.kl_loss_type.rfind("rpg_", 0) == 0) why.push_back("actor_rollout_ref.actor.kl_loss_type=" + a.kl_loss_type);
  if (a.optim.optim_type == "schedulefree") why.push_back("actor_rollout_ref.actor.optim.optim_type=schedulefree");
  if (reward_model.reward_manager == "rpg") why.push_back("reward_model.reward_manager=rpg");
  return why;
}

std::vector<std::string> TrainConfig::resolve() {
  std::vector<std::string> notices;
  auto& a = actor_rollout_ref.actor;
  if (rpg.semantics == "auto") {
    const std::vector<std::string> why = fork_spellings();
    rpg.semantics = why.empty() ? "paper" : "fork";
    if (!why.empty()) {
      std::string list;
      for (const auto& w : why) list += (list.empty() ? "" : ", ") + w;
      notices.push_back(str("rpg.semantics=fork: the config uses the authors' fork's spellings (", list,
                            "); set rpg.semantics=paper for the paper's algorithms under these keys"));
    }
  }
  choices.semantics = semantics_named(rpg.semantics);
  // verl's deprecated global micro-batch (ray_trainer.py check_mutually_exclusive,
  // fsdp_workers.py: ppo_micro_batch_size //= world size, then it is the per-GPU one), over
  // trainer.nnodes x trainer.n_gpus_per_node processes (checked against the launch at start).
  if (a.ppo_micro_batch_size) {
    const std::string p = "actor_rollout_ref.actor.";
    if (a.ppo_micro_batch_size_per_gpu)
      throw ConfigError(str(p, "ppo_micro_batch_size: set together with ", p, "ppo_micro_batch_size_per_gpu; remove ",
                            p, "ppo_micro_batch_size (the deprecated global form; verl refuses both too)"));
    const int64_t world = trainer.nnodes.value_or(1) * trainer.n_gpus_per_node.value_or(1);
    const int64_t global = *a.ppo_micro_batch_size;
    if (global < world)
      throw ConfigError(str(p, "ppo_micro_batch_size: ", global, " rows over trainer.nnodes x trainer.n_gpus_per_node = ",
                            world, " processes leave none per process"));
    a.ppo_micro_batch_size_per_gpu = global / world;
    a.ppo_micro_batch_size.reset();
    notices.push_back(str(p, "ppo_micro_batch_size=", global, " (deprecated) is ", p, "ppo_micro_batch_size_per_gpu=",
                          *a.ppo_micro_batch_size_per_gpu, " over ", world, " process", world == 1 ? "" : "es",
                          ", as verl divides it"));
  }
  if (choices.semantics == Semantics::kFork) check_fork_semantics();
  // The RPG fork (complex-reasoning/RPG, verl/trainer/ppo/core_algos.py) selects its loss by
  // kl_loss_type: rpg_<kl> = the fully differentiable surrogate, rpg_rf_<kl> = REINFORCE
  // style, rpg_rf_<kl>_clip_ppo = REINFORCE style with RPG-Style Clip (Algorithm 2).
  const std::string t = a.kl_loss_type;
  if (choices.semantics == Semantics::kPaper && t.rfind("rpg_", 0) == 0) {
    const std::string key = "actor_rollout_ref.actor.kl_loss_type";
    std::string rest = t.substr(4), loss = "rpg";
    std::optional<bool> clip;
    if (rest.rfind("rf_", 0) == 0) {
      loss = "rpg_reinforce";
      rest = rest.substr(3);
      const std::string suffix = "_clip_ppo";
      clip = rest.size() > suffix.size() && rest.compare(rest.size() - suffix.size(), suffix.size(), suffix) == 0;
      if (*clip) rest.resize(rest.size() - suffix.size());
    }
    if (rest != "fkl" && rest != "rkl" && rest != "ufkl" && rest != "urkl")
      throw ConfigError(str(key, ": the RPG fork's '", t, "' is not implemented; supported: rpg_<kl>, rpg_rf_<kl>, "
                            "rpg_rf_<kl>_clip_ppo with <kl> one of fkl, rkl, ufkl, urkl"));
    if (a.policy_loss != "vanilla" && a.policy_loss != loss)
      throw ConfigError(str(key, ": '", t, "' means policy_loss=", loss, ", but policy_loss=", a.policy_loss,
                            " is set"));
    a.policy_loss = loss;
    a.kl_form = rest;
    // The paper's Table 2 surrogate; the fork's rpg_rf_<kl> also clamps w inside the
    // stop-gradient weight, which rpg does not reproduce.
    if (clip) a.rpg_style_clip = *clip;
    a.kl_loss_type = ActorConfig{}.kl_loss_type;  // the estimator key is unused by rpg losses
    notices.push_back(str(key, "=", t, " (RPG fork spelling): policy_loss=", loss, ", kl_form=", rest,
                          clip ? str(", rpg_style_clip=", *clip ? "true" : "false") : std::string()));
  }
  auto& rc = algorithm.rollout_correction;
  if (rc.bypass_mode) {
    rc.bypass_mode = false;
    a.old_log_prob_source = "rollout";
    notices.push_back("algorithm.rollout_correction.bypass_mode=true: actor_rollout_ref.actor.old_log_prob_source=rollout");
  }
  const std::string p = "actor_rollout_ref.actor.";
  choices.truncation = choice<Truncation>(data.truncation, kTruncationNames, "data.truncation");
  choices.old_log_prob_source =
      choice<OldLogProbSource>(a.old_log_prob_source, kOldLogProbSourceNames, p + "old_log_prob_source");
  if (!a.compute_dtype) a.compute_dtype = fork_semantics() ? "bfloat16" : "float32";
  choices.compute_dtype = choice<ComputeDtype>(*a.compute_dtype, kComputeDtypeNames, p + "compute_dtype");
  choices.kl_ctrl = choice<KlControlType>(algorithm.kl_ctrl.type, kKlControlTypeNames, "algorithm.kl_ctrl.type");
  choices.filter_metric =
      choice<FilterMetric>(algorithm.filter_groups.metric, kFilterMetricNames, "algorithm.filter_groups.metric");
  choices.resume_mode =
      choice<ResumeMode>(trainer.resume_mode, kResumeModeNames, "trainer.resume_mode");
  const bool known_loss = algo::policy_loss_registry().contains(a.policy_loss);
  if (choices.semantics == Semantics::kFork) {
    // dp_actor.py:316-318: with use_iterative_ref_model the reference IS old_log_probs.
    choices.kl_loss_uses_reference = a.use_kl_loss && !a.use_iterative_ref_model;
    choices.append_kl_loss = false;  // the fork loss has its own KL term
  } else if (known_loss) {
    const auto& e = algo::policy_loss_registry().get(a.policy_loss);
    choices.append_kl_loss = a.use_kl_loss && !e.own_kl_term;
    choices.kl_loss_uses_reference = a.use_kl_loss && (e.needs_reference || choices.append_kl_loss);
  }
  choices.dapo_variant = reward_model.reward_kwargs.dapo_variant.value_or(
      choices.semantics == Semantics::kFork ? "math_dapo_fork" : "math_dapo");
  choices.algorithm_summary = algorithm_summary(*this);
  return notices;
}

}  // namespace rpg::train
