// The paper's rules (rpg.semantics=paper): the algorithms as the paper writes them, under
// rpg's names (docs/algorithms.md). One loss normaliser per mini-batch, so micro-batching
// does not change the gradient; the policy loss from algo's registry.
#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "rpg/algo/aggregate.h"
#include "rpg/algo/kl.h"
#include "rpg/core/rng.h"
#include "rpg/train/rules.h"

namespace rpg::train {

std::vector<std::vector<int64_t>> micro_batches(const at::Tensor& attention_mask, const ActorConfig& actor) {
  const int64_t rows = attention_mask.size(0);
  if (actor.use_dynamic_bsz) {
    const at::Tensor lengths = attention_mask.sum(1).to(at::kLong).contiguous();
    const std::vector<int64_t> l(lengths.data_ptr<int64_t>(), lengths.data_ptr<int64_t>() + lengths.numel());
    return rollout::split_by_tokens(l, actor.ppo_max_token_len_per_gpu);
  }
  return rollout::split_by_rows(rows, actor.ppo_micro_batch_size_per_gpu.value_or(rows));
}

int64_t mini_batch_rows(const TrainConfig& cfg) {
  return cfg.actor_rollout_ref.actor.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n;
}

namespace {

// The loss's string keys parsed once.
algo::PolicyLossConfig policy_loss_config(const TrainConfig& cfg) {
  const auto& a = cfg.actor_rollout_ref.actor;
  algo::PolicyLossConfig l;
  l.clip_ratio_low = a.clip_ratio_low.value_or(a.clip_ratio);
  l.clip_ratio_high = a.clip_ratio_high.value_or(a.clip_ratio);
  l.clip_ratio_c = a.clip_ratio_c;
  l.clip = a.rpg_style_clip;
  l.kl = algo::parse_divergence(a.kl_form);
  l.kl_coef = a.use_kl_loss ? a.kl_loss_coef : 0.0;
  l.kl_loss_type = algo::parse_kl_estimator(a.kl_loss_type);
  l.loss_agg_mode = algo::parse_loss_agg_mode(a.loss_agg_mode);
  l.entropy_coeff = a.entropy_coeff;
  const auto& rc = cfg.algorithm.rollout_correction;
  if (rc.rollout_is) {
    l.rollout_correction = algo::parse_rollout_correction(*rc.rollout_is);
    l.rollout_correction_cap = rc.rollout_is_threshold;
  }
  algo::validate(l);
  return l;
}

class PaperRules final : public Rules {
 public:
  explicit PaperRules(const TrainConfig& cfg)
      : cfg_(cfg),
        actor_(cfg.actor_rollout_ref.actor),
        loss_(policy_loss_config(cfg)),
        kl_penalty_(algo::parse_kl_estimator(cfg.algorithm.kl_penalty)) {}

  std::vector<int64_t> epoch_order(int64_t n, int64_t epoch) const override {
    if (cfg_.data.shuffle)
      return random_permutation(n, mix_key(static_cast<uint64_t>(cfg_.data.seed.value_or(cfg_.trainer.seed)),
                                           static_cast<uint64_t>(epoch)));
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    return order;
  }
  bool data_ends_with_total_epochs() const override { return false; }
  int64_t prompts_per_step() const override { return cfg_.data.train_batch_size; }

  NamedTensors optimizer_order(NamedTensors params) const override { return params; }
  bool constant_schedule_starts_at_zero() const override { return false; }
  // Schedule-free AdamW: the old log-probs at y (the weights that sampled), validation and
  // export at the average x.
  void use_old_log_prob_weights(Optimizer&) const override {}
  bool samples_at_x(int64_t) const override { return false; }
  void use_export_weights(Optimizer& optimizer) const override { optimizer.use_eval_weights(); }

  // A fixed reference, or one refreshed every few steps; refreshed every step it is pi_old.
  bool reference_resident() const override { return !(actor_.use_iterative_ref_model && actor_.ref_update_freq == 1); }
  bool reference_weights_bf16() const override { return false; }
  void set_log_prob_options(model::LogProbOptions&) const override {}  // the defaults: split prompt, log_softmax backward
  bool allows_old_log_probs_from_update() const override { return true; }

  KlInReward kl_in_reward(const at::Tensor& scores, const at::Tensor& old_log_probs, const at::Tensor& ref_log_probs,
                          const at::Tensor& mask, double coef) const override {
    KlInReward out;
    out.token_level_rewards = algo::apply_kl_penalty(scores, old_log_probs, ref_log_probs, mask, coef, kl_penalty_);
    const at::Tensor kl = algo::kl_estimate(old_log_probs, ref_log_probs, kl_penalty_) * mask;
    out.current_kl = (kl.sum(1) / mask.sum(1).clamp_min(1)).mean().item<double>();
    return out;
  }

  // Mini-batches of consecutive rows (ppo_mini_batch_size prompts x n), in a new order every
  // epoch after the first with actor.shuffle; each cut by micro_batches().
  std::vector<int64_t> advantage_order(const rollout::Batch&) const override { return {}; }

  UpdatePlan plan_update(const rollout::Batch& batch, int64_t step) const override {
    const int64_t rows = batch.rows(), per_mini = std::min<int64_t>(mini_batch_rows(cfg_), rows);
    const at::Tensor& mask = batch.get("attention_mask");  // all the partition reads
    UpdatePlan plan;
    for (int64_t e = 0; e < actor_.ppo_epochs; ++e) {
      std::vector<int64_t> row_order(static_cast<size_t>(rows));
      std::iota(row_order.begin(), row_order.end(), 0);
      if (e > 0 && actor_.shuffle)
        row_order = random_permutation(rows, mix_key(static_cast<uint64_t>(cfg_.trainer.seed), step, e));
      auto& minis = plan.epochs.emplace_back();
      for (int64_t start = 0; start < rows; start += per_mini) {
        MiniBatchPlan mini;
        mini.rows.assign(row_order.begin() + start, row_order.begin() + std::min<int64_t>(rows, start + per_mini));
        mini.micro = micro_batches(mask.index_select(0, at::tensor(mini.rows, at::kLong)), actor_);
        minis.push_back(std::move(mini));
      }
    }
    return plan;
  }
  double loss_normaliser(const rollout::Batch& mini) const override {
    return algo::loss_normaliser(mini.get("response_mask"), loss_.loss_agg_mode);
  }
  algo::PolicyLossOutput micro_batch_loss(const algo::PolicyLossInputs& in, int64_t) const override {
    auto out = algo::compute_policy_loss(actor_.policy_loss, in, loss_);
    if (cfg_.choices.append_kl_loss) {
      // verl's dp_actor: kl_loss_coef * agg(kl_penalty(log_prob, ref_log_prob, kl_loss_type)),
      // added outside the policy loss for a loss without a KL term of its own.
      auto kl = algo::agg_loss(algo::kl_estimate(in.log_probs, in.ref_log_probs, loss_.kl_loss_type), in.response_mask,
                               loss_.loss_agg_mode, in.normaliser, loss_.loss_scale_factor);
      out.loss = out.loss + actor_.kl_loss_coef * kl;
      out.metrics["actor/kl_loss"] = kl.detach();
      out.metrics["actor/kl_coef"] = at::scalar_tensor(actor_.kl_loss_coef, at::kDouble);
    }
    return out;
  }

 private:
  const TrainConfig& cfg_;
  const ActorConfig& actor_;
  algo::PolicyLossConfig loss_;
  algo::KlEstimator kl_penalty_;
};

}  // namespace

std::unique_ptr<Rules> make_paper_rules(const TrainConfig& cfg) { return std::make_unique<PaperRules>(cfg); }

}  // namespace rpg::train
