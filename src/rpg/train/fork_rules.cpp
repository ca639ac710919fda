// The fork's rules (rpg.semantics=fork): what the authors' verl fork (complex-reasoning/RPG
// @ ec8e30bd) computed when their run scripts executed (docs/fork-vs-paper.md): PPO
// dual-clip + kl_loss_coef * agg(kl_penalty) outside the clip (algo/fork_loss.h), each
// micro-batch aggregated over its own tokens and weighted, the in-reward KL with
// actor.kl_loss_type, transformers' parameter order, one step per generation batch, and
// schedule-free AdamW switched only around the old log-probs and the update.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

#include "rpg/algo/fork_loss.h"
#include "rpg/core/error.h"
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
      : cfg_(cfg),
        actor_(cfg.actor_rollout_ref.actor),
        loss_(fork_loss_config(actor_)),
        world_(cfg.trainer.nnodes.value_or(1) * cfg.trainer.n_gpus_per_node.value_or(1)),
        rank_mini_rows_(mini_batch_rows(cfg) / world_),
        micro_size_(actor_.ppo_micro_batch_size_per_gpu.value_or(rank_mini_rows_)) {
    if (rank_mini_rows_ < 1)
      throw ConfigError(str("actor_rollout_ref.actor.ppo_mini_batch_size: ", mini_batch_rows(cfg),
                            " rows (x rollout.n) over trainer.nnodes x trainer.n_gpus_per_node = ", world_,
                            " ranks leave none per rank (the fork asserts ppo_mini_batch_size > 0 after normalization)"));
  }

  // ray_trainer._create_dataloader: RandomSampler(generator=torch.Generator() seeded with
  // data.get('seed', 1)). Each epoch's iteration draws torch.randperm(n) from that one
  // generator for its order and, when the loader runs the sampler to its end, a second one
  // for the remainder num_samples % n (empty, but drawn): epoch e's order is the (2e+1)-th
  // permutation. libtorch's CPU generator and randperm are torch's own, so the orders are the
  // fork's.
  std::vector<int64_t> epoch_order(int64_t n, int64_t epoch) const override {
    std::vector<int64_t> order(static_cast<size_t>(n));
    if (!cfg_.data.shuffle) {  // SequentialSampler
      std::iota(order.begin(), order.end(), 0);
      return order;
    }
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(cfg_.data.seed.value_or(1)));
    at::Tensor perm;
    for (int64_t e = 0; e <= 2 * epoch; ++e) perm = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
    std::copy(perm.data_ptr<int64_t>(), perm.data_ptr<int64_t>() + n, order.begin());
    return order;
  }

  // rpg_ray_trainer.fit loops `for epoch in range(total_epochs): for batch in dataloader`:
  // when dynamic sampling has used up the batches of every epoch before the step count is
  // reached, the loops end (no further step, validation or save).
  bool data_ends_with_total_epochs() const override { return true; }

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
  // With use_kl_in_reward the generation loop computes each round's old log-probs
  // (rpg_ray_trainer.py:132-134, compute_log_prob -> eval()) and, when dynamic sampling wants
  // more groups, `continue`s to the next round without a train() in between: rounds 2..k
  // sample at x. The first round samples where the previous update left the weights: y.
  bool samples_at_x(int64_t round) const override { return round > 0 && cfg_.algorithm.use_kl_in_reward; }
  // The fork switches only around its old log-probs (eval) and its update (train), so it
  // samples, validates and saves (hf_model included) at y.
  void use_export_weights(Optimizer& optimizer) const override { optimizer.use_train_weights(); }

  // use_iterative_ref_model means ref = old_log_probs (dp_actor.py:316-318,
  // rpg_ray_trainer.py), whatever ref_update_freq says; otherwise the fixed initial policy.
  bool reference_resident() const override { return !actor_.use_iterative_ref_model; }
  // The ref worker loads the checkpoint in bf16 (fsdp_workers.py:167-169: model_dtype unset
  // is fp32 for the actor, bf16 otherwise) and runs it under the same FSDP mixed precision.
  bool reference_weights_bf16() const override { return true; }
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

  // The fork's data-parallel layout, emulated whatever the number of rpg processes: W =
  // trainer.nnodes x trainer.n_gpus_per_node ranks (8 in every script). With
  // trainer.balance_batch, _balance_batch (ray_trainer.py:796-811) reorders the rows into W
  // token-balanced partitions of equal size (get_seqlen_balanced_partitions, equal_size);
  // the dispatch hands rank r the r-th contiguous chunk; each rank splits its chunk into
  // mini-batches of ppo_mini_batch_size x n / W rows (fsdp_workers.py:117-118) and cuts each
  // into its own micro-batches (dp_actor.update_policy: token-budget partitions with
  // use_dynamic_bsz, else consecutive ppo_micro_batch_size_per_gpu rows). Optimizer step m
  // sums every rank's m-th mini-batch (FSDP's mean of the ranks' gradients: each micro-batch
  // weighted by rows / (W x per-rank mini-batch), micro_batch_loss). The same split every
  // epoch (no shuffle).
  // The fork computes the advantages after _balance_batch (ray_trainer.py: balance, old
  // log-probs, compute_advantage), so its estimators sum the rows in the balanced order.
  std::vector<int64_t> advantage_order(const rollout::Batch& batch) const override {
    if (!balances()) return {};
    return rank_order(row_lengths(batch.get("attention_mask")));
  }

  UpdatePlan plan_update(const rollout::Batch& batch, int64_t) const override {
    const int64_t rows = batch.rows();
    const at::Tensor& am = batch.get("attention_mask");
    const std::vector<int64_t> lengths = row_lengths(am);
    if (rows % world_ != 0)
      throw ValueError(str("fork layout: ", rows, " rows do not split over trainer.nnodes x trainer.n_gpus_per_node = ",
                           world_, " ranks"));
    const std::vector<int64_t> order = rank_order(lengths);
    const int64_t per_rank = rows / world_;
    std::vector<MiniBatchPlan> minis;
    for (int64_t start = 0; start < per_rank; start += rank_mini_rows_) {
      MiniBatchPlan mini;
      for (int64_t r = 0; r < world_; ++r) {
        const int64_t begin = r * per_rank + start, end = r * per_rank + std::min(per_rank, start + rank_mini_rows_);
        const std::vector<int64_t> rank_rows(order.begin() + begin, order.begin() + end);
        std::vector<std::vector<int64_t>> micro;
        if (actor_.use_dynamic_bsz) {
          std::vector<int64_t> l;
          for (const int64_t row : rank_rows) l.push_back(lengths[static_cast<size_t>(row)]);
          micro = algo::fork_dynamic_micro_batches(l, actor_.ppo_max_token_len_per_gpu, am.size(1));
        } else {
          micro = algo::fork_fixed_micro_batches(static_cast<int64_t>(rank_rows.size()), micro_size_);
        }
        const int64_t offset = static_cast<int64_t>(mini.rows.size());
        for (auto& m : micro)
          for (int64_t& i : m) i += offset;
        mini.rows.insert(mini.rows.end(), rank_rows.begin(), rank_rows.end());
        mini.micro.insert(mini.micro.end(), micro.begin(), micro.end());
      }
      minis.push_back(std::move(mini));
    }
    UpdatePlan plan;
    plan.epochs.assign(static_cast<size_t>(actor_.ppo_epochs), minis);
    return plan;
  }
  double loss_normaliser(const rollout::Batch&) const override { return 0.0; }
  // The micro-batch's own aggregation, times rows / mini-batch rows (dynamic bsz) or
  // 1 / gradient_accumulation.
  // With W emulated ranks: rows / (W x per-rank mini-batch rows), or 1 / (W x
  // gradient_accumulation), the rank's weight and FSDP's mean over ranks in one factor.
  algo::PolicyLossOutput micro_batch_loss(const algo::PolicyLossInputs& in, int64_t rows) const override {
    auto out = algo::fork_micro_batch_loss(in, loss_);
    out.loss = algo::fork_weighted_micro_batch_loss(out.loss, rows, world_ * rank_mini_rows_, actor_.use_dynamic_bsz,
                                                    micro_size_);
    return out;
  }

 private:
  bool balances() const { return cfg_.trainer.balance_batch && world_ > 1; }

  static std::vector<int64_t> row_lengths(const at::Tensor& attention_mask) {
    const at::Tensor t = attention_mask.sum(1).to(at::kLong).contiguous();
    return {t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel()};
  }

  // The rows in the order the ranks take them: balance_batch's partitions one after the
  // other, or the batch's own order.
  std::vector<int64_t> rank_order(const std::vector<int64_t>& lengths) const {
    std::vector<int64_t> order;
    if (balances()) {
      for (const auto& part : algo::fork_balanced_partitions(lengths, world_, /*equal_size=*/true))
        order.insert(order.end(), part.begin(), part.end());
    } else {
      order.resize(lengths.size());
      std::iota(order.begin(), order.end(), 0);
    }
    return order;
  }

  const TrainConfig& cfg_;
  const ActorConfig& actor_;
  algo::ForkLossConfig loss_;
  int64_t world_;           // the fork's data-parallel ranks, emulated
  int64_t rank_mini_rows_;  // one rank's mini-batch rows (the fork's normalised ppo_mini_batch_size)
  int64_t micro_size_;      // ppo_micro_batch_size_per_gpu (a rank's whole mini-batch when unset)
};

}  // namespace

std::unique_ptr<Rules> make_fork_rules(const TrainConfig& cfg) { return std::make_unique<ForkRules>(cfg); }

}  // namespace rpg::train
