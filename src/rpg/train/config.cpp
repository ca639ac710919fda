#include "rpg/train/config.h"

#include <algorithm>
#include <initializer_list>

#include "rpg/algo/advantage.h"
#include "rpg/algo/policy_loss.h"
#include "rpg/core/error.h"

namespace rpg {
namespace {

void require(bool ok, const std::string& key, const std::string& message) {
  if (!ok) throw ConfigError(str(key, ": ", message));
}

void require_one_of(const std::string& value, std::initializer_list<const char*> allowed, const std::string& key) {
  for (const char* a : allowed)
    if (value == a) return;
  std::string list;
  for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
  throw ConfigError(str(key, ": got '", value, "', expected one of ", list));
}

}  // namespace

void DataConfig::validate() const {
  // The paper's schema fixes these columns; another name would be silently ignored.
  require(prompt_key == "prompt", "data.prompt_key", str("only 'prompt' is supported, got '", prompt_key, "'"));
  require(reward_fn_key == "data_source", "data.reward_fn_key",
          str("only 'data_source' is supported, got '", reward_fn_key, "'"));
  require(max_prompt_length > 0, "data.max_prompt_length", str("must be > 0, got ", max_prompt_length));
  require(max_response_length > 0, "data.max_response_length", str("must be > 0, got ", max_response_length));
  require(train_batch_size > 0, "data.train_batch_size", str("must be > 0, got ", train_batch_size));
  require(!gen_batch_size || *gen_batch_size > 0, "data.gen_batch_size", "must be > 0");
  require_one_of(truncation, {"error", "left", "right", "middle"}, "data.truncation");
}

void ActorConfig::validate() const {
  const std::string p = "actor_rollout_ref.actor.";
  require(ppo_mini_batch_size > 0, p + "ppo_mini_batch_size", str("must be > 0, got ", ppo_mini_batch_size));
  require(ppo_epochs > 0, p + "ppo_epochs", str("must be > 0, got ", ppo_epochs));
  require(clip_ratio >= 0, p + "clip_ratio", str("must be >= 0, got ", clip_ratio));
  require(!clip_ratio_low || *clip_ratio_low >= 0, p + "clip_ratio_low", "must be >= 0");
  require(!clip_ratio_high || *clip_ratio_high >= 0, p + "clip_ratio_high", "must be >= 0");
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
  require_one_of(old_log_prob_source, {"recompute", "rollout"}, p + "old_log_prob_source");
  require_one_of(compute_dtype, {"float32", "bfloat16"}, p + "compute_dtype");
  require(optim.lr >= 0, p + "optim.lr", str("must be >= 0, got ", optim.lr));
  require(optim.betas.size() == 2, p + "optim.betas", "expected two values [beta1, beta2]");
  require_one_of(optim.optim_type, {"adamw", "schedule_free_adamw"}, p + "optim.optim_type");
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
  const auto& r = actor_rollout_ref.rollout;
  const std::string p = "actor_rollout_ref.rollout.";
  require(r.n >= 1, p + "n", str("must be >= 1, got ", r.n));
  require(r.temperature >= 0, p + "temperature", str("must be >= 0, got ", r.temperature));
  require(r.top_p > 0 && r.top_p <= 1, p + "top_p", str("must be in (0, 1], got ", r.top_p));
  require(r.top_k == -1 || r.top_k > 0, p + "top_k", str("must be -1 or > 0, got ", r.top_k));
  require(r.val_kwargs.top_p > 0 && r.val_kwargs.top_p <= 1, p + "val_kwargs.top_p",
          str("must be in (0, 1], got ", r.val_kwargs.top_p));
  require(r.val_kwargs.n >= 1, p + "val_kwargs.n", str("must be >= 1, got ", r.val_kwargs.n));
  const int64_t mini = actor_rollout_ref.actor.ppo_mini_batch_size;
  require(mini <= data.train_batch_size && data.train_batch_size % mini == 0,
          "actor_rollout_ref.actor.ppo_mini_batch_size",
          str("got ", mini, ", must divide data.train_batch_size (", data.train_batch_size, ")"));
  require_one_of(algorithm.kl_ctrl.type, {"fixed", "adaptive"}, "algorithm.kl_ctrl.type");
  require(algorithm.kl_ctrl.type != "adaptive" || (algorithm.kl_ctrl.target_kl > 0 && algorithm.kl_ctrl.horizon > 0),
          "algorithm.kl_ctrl", "adaptive control needs target_kl > 0 and horizon > 0");
  require_one_of(algorithm.filter_groups.metric, {"acc", "score"}, "algorithm.filter_groups.metric");
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
    // A reference model is used only by grpo's KL loss and by KL in the reward; rpg and
    // rpg_reinforce regularise towards pi_old, which is the policy at the start of each step.
    const auto& a = actor_rollout_ref.actor;
    const bool uses_reference = (a.use_kl_loss && a.policy_loss.rfind("grpo", 0) == 0) || algorithm.use_kl_in_reward;
    require(a.ref_kl_target == 0 || uses_reference, "actor_rollout_ref.actor.ref_kl_target",
            str("no reference policy is in use (policy_loss ", a.policy_loss, " regularises towards pi_old; a reference "
                "is used by grpo's KL loss and algorithm.use_kl_in_reward)"));
  }
  require(!reward_model.overlong_buffer.enable || reward_model.overlong_buffer.len > 0,
          "reward_model.overlong_buffer.len", "must be > 0 when the overlong buffer is enabled");
  require(!reward_model.overlong_buffer.enable || reward_model.overlong_buffer.len < data.max_response_length,
          "reward_model.overlong_buffer.len", "must be < data.max_response_length");
  require_one_of(trainer.resume_mode, {"auto", "disable", "resume_path"}, "trainer.resume_mode");
  require(trainer.resume_mode != "resume_path" || trainer.resume_path, "trainer.resume_path",
          "required when trainer.resume_mode=resume_path");
  require_one_of(trainer.device, {"auto", "cpu", "cuda"}, "trainer.device");
  require(trainer.max_consecutive_skips >= 1, "trainer.max_consecutive_skips",
          str("must be >= 1, got ", trainer.max_consecutive_skips));
  require(trainer.total_epochs > 0, "trainer.total_epochs", str("must be > 0, got ", trainer.total_epochs));
  require(!trainer.total_training_steps || *trainer.total_training_steps > 0, "trainer.total_training_steps",
          "must be > 0");
}

std::vector<std::string> TrainConfig::resolve() {
  std::vector<std::string> notices;
  auto& a = actor_rollout_ref.actor;
  // The RPG fork (complex-reasoning/RPG, verl/trainer/ppo/core_algos.py) selects its loss by
  // kl_loss_type: rpg_<kl> = the fully differentiable surrogate, rpg_rf_<kl> = REINFORCE
  // style, rpg_rf_<kl>_clip_ppo = REINFORCE style with RPG-Style Clip (Algorithm 2).
  const std::string t = a.kl_loss_type;
  if (t.rfind("rpg_", 0) == 0) {
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
  return notices;
}

}  // namespace rpg
