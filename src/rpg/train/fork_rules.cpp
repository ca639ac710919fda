// The fork's rules (rpg.semantics=fork): what the authors' verl fork (complex-reasoning/RPG
// @ ec8e30bd) computed when their run scripts executed (docs/fork-vs-paper.md): PPO
// dual-clip + kl_loss_coef * agg(kl_penalty) outside the clip (algo/fork_loss.h), each
// micro-batch aggregated over its own tokens and weighted, the in-reward KL with
// actor.kl_loss_type, transformers' parameter order, one step per generation batch, and
// schedule-free AdamW switched only around the old log-probs and the update.
#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <string>

#include "rpg/algo/fork_loss.h"
#include "rpg/train/rules.h"

namespace rpg::train {
namespace {

// The order transformers registers a decoder's parameters in: embed_tokens; per layer
// self_attn q/k/v/o (weight, bias), q_norm, k_norm, mlp gate/up/down, input_layernorm,
// post_attention_layernorm; norm; lm_head. The fork's clip_grad_norm_ over
// model.parameters() adds the per-tensor norms up in this order, and a float sum depends on it
// (an ulp in the clip coefficient, then in the update).
NamedTensors in_transformers_order(NamedTensors params) {
  static const std::vector<std::string> within = {
      "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight", "self_attn.k_proj.bias",
      "self_attn.v_proj.weight", "self_attn.v_proj.bias", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
      "self_attn.k_norm.weight", "mlp.gate_proj.weight",  "mlp.up_proj.weight",     "mlp.down_proj.weight",
      "input_layernorm.weight", "post_attention_layernorm.weight"};
  const std::string layers = "model.layers.";
  auto key = [&](const std::string& name) -> std::pair<int64_t, int64_t> {
    if (name == "model.embed_tokens.weight") return {-1, 0};
    if (name.rfind(layers, 0) == 0) {
      const size_t dot = name.find('.', layers.size());
      const int64_t layer = std::stoll(name.substr(layers.size(), dot - layers.size()));
      const auto it = std::find(within.begin(), within.end(), name.substr(dot + 1));
      return {layer, static_cast<int64_t>(it - within.begin())};
    }
    return {std::numeric_limits<int64_t>::max(), name == "model.norm.weight" ? 0 : 1};
  };
  std::stable_sort(params.begin(), params.end(), [&](const auto& a, const auto& b) { return key(a.first) < key(b.first); });
  return params;
}

algo::ForkLossConfig fork_loss_config(const ActorConfig& a) {
  algo::ForkLossConfig f;
  f.clip_ratio_low = a.clip_ratio_low.value_or(a.clip_ratio);
  f.clip_ratio_high = a.clip_ratio_high.value_or(a.clip_ratio);
  f.clip_ratio_c = a.clip_ratio_c;
  f.loss_agg_mode = algo::parse_loss_agg_mode(a.loss_agg_mode);
  f.entropy_coeff = a.entropy_coeff;
  f.use_kl_loss = a.use_kl_loss;
  f.kl_loss_coef = a.kl_loss_coef;
  f.kl_loss_type = a.kl_loss_type;
  f.use_iterative_ref_model = a.use_iterative_ref_model;
  algo::validate(f);
  return f;
}

class ForkRules final : public Rules {
 public:
  explicit ForkRules(const TrainConfig& cfg)
      : cfg_(cfg), actor_(cfg.actor_rollout_ref.actor), loss_(fork_loss_config(actor_)), mini_rows_(mini_batch_rows(cfg)) {}

  // The fork's dataloader yields gen_batch_size prompts per batch and counts one training
  // step per batch (ray_trainer.py:456-488).
  int64_t prompts_per_step() const override { return cfg_.data.gen_batch_size.value_or(cfg_.data.train_batch_size); }

  // Its torch optimizer and clip_grad_norm_ see the parameters in transformers' order.
  NamedTensors optimizer_order(NamedTensors params) const override { return in_transformers_order(std::move(params)); }
  bool constant_schedule_starts_at_zero() const override { return true; }
  // compute_log_prob calls actor_optimizer.eval() (dp_actor.py:205-208): with schedule-free
  // AdamW the old log-probs (and the in-reward KL, and ref under use_iterative_ref_model) come
  // from x, while the responses were sampled at y.
  void use_old_log_prob_weights(Optimizer& optimizer) const override { optimizer.use_eval_weights(); }
  // The fork switches only around its old log-probs (eval) and its update (train), so it
  // samples, validates and saves (hf_model included) at y.
  void use_export_weights(Optimizer& optimizer) const override { optimizer.use_train_weights(); }

  // use_iterative_ref_model means ref = old_log_probs (dp_actor.py:316-318,
  // rpg_ray_trainer.py), whatever ref_update_freq says; otherwise the fixed initial policy.
  bool reference_resident() const override { return !actor_.use_iterative_ref_model; }
  // Every row's full forward, as the fork's dp_actor rounds it; the log-prob backward as
  // torch's autograd differentiates gather - logsumexp.
  void set_log_prob_options(model::LogProbOptions& options) const override {
    options.split_prompt = false;
    options.autograd_backward = true;
  }
  bool allows_old_log_probs_from_update() const override { return false; }

  // rpg_ray_trainer.py:195-199 -> ray_trainer.apply_kl_penalty with kl_penalty =
  // actor.kl_loss_type: the fork's kl_penalty(old_log_probs, ref) (the RPG forms clamped to
  // +-10; with use_iterative_ref_model ref = old_log_probs).
  KlInReward kl_in_reward(const at::Tensor& scores, const at::Tensor& old_log_probs, const at::Tensor& ref_log_probs,
                          const at::Tensor& mask, double coef) const override {
    const at::Tensor fm = mask.to(at::kFloat);
    const at::Tensor kld = algo::fork_kl_penalty(old_log_probs, ref_log_probs, actor_.kl_loss_type) * fm;
    KlInReward out;
    out.token_level_rewards = scores - coef * kld;
    // masked_mean over each row (the fork's: sum / (count + 1e-8)), then the mean over rows.
    out.current_kl = (kld.sum(1) / (fm.sum(1) + 1e-8)).mean().item<double>();
    return out;
  }

  bool reshuffles_epochs() const override { return false; }  // the fork splits the same batch every epoch
  // dp_actor.update_policy: token-budget partitions with use_dynamic_bsz, else consecutive
  // ppo_micro_batch_size_per_gpu rows (the whole mini-batch without one).
  std::vector<std::vector<int64_t>> update_micro_batches(const rollout::Batch& mini) const override {
    if (actor_.use_dynamic_bsz) {
      const at::Tensor& am = mini.get("attention_mask");
      const at::Tensor lengths = am.sum(1).to(at::kLong).contiguous();
      const std::vector<int64_t> l(lengths.data_ptr<int64_t>(), lengths.data_ptr<int64_t>() + lengths.numel());
      return algo::fork_dynamic_micro_batches(l, actor_.ppo_max_token_len_per_gpu, am.size(1));
    }
    return algo::fork_fixed_micro_batches(mini.rows(), actor_.ppo_micro_batch_size_per_gpu.value_or(mini_rows_));
  }
  double loss_normaliser(const rollout::Batch&) const override { return 0.0; }
  // The micro-batch's own aggregation, times rows / mini-batch rows (dynamic bsz) or
  // 1 / gradient_accumulation.
  algo::PolicyLossOutput micro_batch_loss(const algo::PolicyLossInputs& in, int64_t rows) const override {
    auto out = algo::fork_micro_batch_loss(in, loss_);
    out.loss = algo::fork_weighted_micro_batch_loss(out.loss, rows, mini_rows_, actor_.use_dynamic_bsz,
                                                    actor_.ppo_micro_batch_size_per_gpu.value_or(mini_rows_));
    return out;
  }

 private:
  const TrainConfig& cfg_;
  const ActorConfig& actor_;
  algo::ForkLossConfig loss_;
  int64_t mini_rows_;
};

}  // namespace

std::unique_ptr<Rules> make_fork_rules(const TrainConfig& cfg) { return std::make_unique<ForkRules>(cfg); }

}  // namespace rpg::train
