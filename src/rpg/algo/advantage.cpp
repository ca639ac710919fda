#include "rpg/algo/advantage.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "rpg/algo/aggregate.h"

namespace rpg::algo {

namespace {

void check(const AdvantageInputs& in, bool needs_groups) {
  if (!in.token_level_rewards.defined() || in.token_level_rewards.dim() != 2)
    throw ValueError("advantage: token_level_rewards must be [B, T]");
  if (!in.response_mask.defined() || in.response_mask.sizes() != in.token_level_rewards.sizes())
    throw ValueError(str("advantage: response_mask must match token_level_rewards ", in.token_level_rewards.sizes()));
  if (needs_groups) {
    if (!in.group_index.defined() || in.group_index.dim() != 1 ||
        in.group_index.size(0) != in.token_level_rewards.size(0))
      throw ValueError("advantage: group_index must be [B], one prompt id per row");
    if (at::isFloatingType(in.group_index.scalar_type()))
      throw ValueError("advantage: group_index must hold integers");
  }
  if (!(in.epsilon >= 0)) throw ValueError(str("advantage: epsilon must be >= 0, got ", in.epsilon));
  if (!(in.gamma >= 0 && in.gamma <= 1)) throw ValueError(str("advantage: gamma must be in [0, 1], got ", in.gamma));
}

// Per-row statistics of the row's group: count n, mean, unbiased std (singletons: 0 and 1).
struct GroupStats {
  at::Tensor n, mean, std;  // [B] each, gathered back to rows
};

// As verl and the authors' fork compute them (compute_grpo_outcome_advantage & co.): per group,
// torch.stack(the scores of its rows, in row order).mean() and .std() -- torch's own reductions
// (std in double, Welford), so that the advantages agree bit for bit; a singleton gets 0 and 1.
// The groups are found on the host (the prompt ids may be there, as verl's numpy index is,
// while the scores are on the device); what is gathered back to rows goes to the scores' device.
GroupStats group_stats(const at::Tensor& scores, const at::Tensor& group_index) {
  auto [uniq, inv, cnt] = at::_unique2(group_index.to(at::kCPU, at::kLong), /*sorted=*/true,
                                       /*return_inverse=*/true, /*return_counts=*/true);
  (void)uniq;
  const int64_t n_groups = cnt.size(0);
  const at::Tensor inverse = inv.to(scores.device());
  auto n = cnt.to(scores.device(), scores.scalar_type());
  auto mean = at::zeros({n_groups}, scores.options()), std = at::ones({n_groups}, scores.options());
  for (int64_t g = 0; g < n_groups; ++g) {
    if (cnt[g].item<int64_t>() <= 1) continue;
    const at::Tensor members = scores.index_select(0, at::nonzero(inv == g).flatten().to(scores.device()));
    mean[g] = members.mean();
    std[g] = members.std();
  }
  return {n.index_select(0, inverse), mean.index_select(0, inverse), std.index_select(0, inverse)};
}

at::Tensor outcome_scores(const AdvantageInputs& in) { return in.token_level_rewards.sum(-1); }

at::Tensor broadcast(const at::Tensor& per_row, const at::Tensor& mask) {
  return per_row.unsqueeze(-1) * mask.to(per_row.scalar_type());
}

AdvantageOutput same(at::Tensor a) { return {a, a}; }

AdvantageOutput grpo_advantage(const AdvantageInputs& in) {
  check(in, true);
  at::NoGradGuard no_grad;
  auto s = outcome_scores(in);
  auto g = group_stats(s, in.group_index);
  auto adv = in.norm_adv_by_std_in_grpo ? (s - g.mean) / (g.std + in.epsilon) : s - g.mean;
  return same(broadcast(adv, in.response_mask));
}

AdvantageOutput group_mean_advantage(const AdvantageInputs& in) {
  check(in, true);
  at::NoGradGuard no_grad;
  auto s = outcome_scores(in);
  return same(broadcast(s - group_stats(s, in.group_index).mean, in.response_mask));
}

AdvantageOutput batch_mean_advantage(const AdvantageInputs& in) {
  check(in, false);
  at::NoGradGuard no_grad;
  auto s = outcome_scores(in);
  return same(broadcast(s - s.mean(), in.response_mask));
}

AdvantageOutput rloo_advantage(const AdvantageInputs& in) {
  check(in, true);
  at::NoGradGuard no_grad;
  auto s = outcome_scores(in);
  auto g = group_stats(s, in.group_index);
  // mean of the other n-1 rows: s - (n*mean - s)/(n-1) = n/(n-1) (s - mean); singletons keep s.
  auto scale = g.n / at::clamp_min(g.n - 1, 1.0);
  auto adv = at::where(g.n > 1, scale * (s - g.mean), s);
  return same(broadcast(adv, in.response_mask));
}

AdvantageOutput rfpp_advantage(const AdvantageInputs& in) {
  check(in, false);
  at::NoGradGuard no_grad;
  const auto& r = in.token_level_rewards;
  auto m = in.response_mask.to(r.scalar_type());
  auto returns = at::zeros_like(r);
  auto running = at::zeros({r.size(0)}, r.options());
  // Return-to-go over response tokens; masked tokens (padding, tool observations) neither
  // receive a return nor reset the running one, so rewards flow past them (verl 0.9).
  for (int64_t t = r.size(1) - 1; t >= 0; --t) {
    auto mt = m.select(1, t);
    auto next = r.select(1, t) + in.gamma * running;
    returns.select(1, t).copy_(next * mt);
    running = next * mt + running * (1 - mt);
  }
  auto adv = masked_whiten(returns, in.response_mask) * m;
  return {adv, returns};
}

AdvantageOutput rfppb_advantage(const AdvantageInputs& in) {
  check(in, true);
  at::NoGradGuard no_grad;
  auto s = outcome_scores(in);
  auto centred = broadcast(s - group_stats(s, in.group_index).mean, in.response_mask);
  auto m = in.response_mask.to(s.scalar_type());
  return same(masked_whiten(centred, in.response_mask) * m);
}

// Adding an estimator = its function (here or in its own file) + one line below.
void register_advantages(Registry<AdvantageFn>& r) {
  r.add("grpo", grpo_advantage);
  r.add("drgrpo", group_mean_advantage);
  r.add("rpg", group_mean_advantage);
  r.add("rpg_batch", batch_mean_advantage);
  r.add("rloo", rloo_advantage);
  r.add("rfpp", rfpp_advantage);
  r.add("rfppb", rfppb_advantage);
  r.add("reinforce_plus_plus", rfpp_advantage);  // verl's names
  r.add("reinforce_plus_plus_baseline", rfppb_advantage);
}

}  // namespace

const Registry<AdvantageFn>& advantage_registry() {
  static const Registry<AdvantageFn> registry = [] {
    Registry<AdvantageFn> r("adv_estimator");
    register_advantages(r);
    return r;
  }();
  return registry;
}

std::vector<std::string> advantage_names() { return advantage_registry().names(); }

AdvantageOutput compute_advantage(std::string_view name, const AdvantageInputs& inputs) {
  return advantage_registry().get(name)(inputs);
}

}  // namespace rpg::algo
