#include "rpg/algo/fork_loss.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <ATen/core/grad_mode.h>

#include "rpg/core/error.h"

namespace rpg::algo {

namespace {

// The fork's clamp of every RPG form (a diverged token cannot dominate the mini-batch).
at::Tensor clamp10(const at::Tensor& v) { return at::clamp(v, -10.0, 10.0); }

at::Tensor kl_k1(const at::Tensor& lp, const at::Tensor& ref) { return lp - ref; }
at::Tensor kl_abs(const at::Tensor& lp, const at::Tensor& ref) { return (lp - ref).abs(); }
at::Tensor kl_mse(const at::Tensor& lp, const at::Tensor& ref) { return 0.5 * (lp - ref).square(); }
at::Tensor kl_low_var(const at::Tensor& lp, const at::Tensor& ref) {
  auto kl = ref - lp;  // unlike verl 0.9.1, the fork does not clamp the log-ratio to +-20
  return clamp10(at::exp(kl) - kl - 1);
}
// REINFORCE-style forms: the SG weight C_KL of Table 2 as the fork spells it.
at::Tensor rf_fkl(const at::Tensor& lp, const at::Tensor&) { return -at::ones_like(lp); }
at::Tensor rf_rkl(const at::Tensor& lp, const at::Tensor& ref) {
  auto lw = lp - ref;
  return clamp10(at::exp(lw) * (lw + 1));
}
at::Tensor rf_ufkl(const at::Tensor& lp, const at::Tensor& ref) { return clamp10(at::exp(lp - ref) - 1); }
at::Tensor rf_urkl(const at::Tensor& lp, const at::Tensor& ref) {
  auto lw = lp - ref;
  return clamp10(at::exp(lw) * lw);
}
// Differentiable forms (Table 1 / 4 KL parts).
at::Tensor rpg_fkl(const at::Tensor& lp, const at::Tensor& ref) { return -lp + ref; }  // no clamp in the fork
at::Tensor rpg_rkl(const at::Tensor& lp, const at::Tensor& ref) {
  auto lw = lp - ref;
  return clamp10(at::exp(lw) * lw);
}
at::Tensor rpg_js(const at::Tensor& lp, const at::Tensor& ref) {
  auto lw = lp - ref;
  return clamp10(0.5 * (at::exp(lw) * lw - (-lw)));
}
at::Tensor rpg_ufkl(const at::Tensor& lp, const at::Tensor& ref) {
  auto lw = lp - ref;
  return clamp10(at::exp(lw) - lw - 1);
}
at::Tensor rpg_urkl(const at::Tensor& lp, const at::Tensor& ref) {
  auto lw = lp - ref;
  return clamp10(at::exp(lw) * (lw - 1) + 1);
}
at::Tensor rpg_ujs(const at::Tensor& lp, const at::Tensor& ref) {
  auto lw = lp - ref;
  return clamp10(0.5 * (at::exp(lw) * lw - lw));
}

void register_fork_kl_penalties(Registry<ForkKlPenaltyFn>& r) {
  r.add("kl", kl_k1);
  r.add("abs", kl_abs);
  r.add("mse", kl_mse);
  r.add("low_var_kl", kl_low_var);
  for (const char* suffix : {"", "_clip_hard", "_clip_ppo"}) {
    r.add(std::string("rpg_rf_fkl") + suffix, rf_fkl);
    r.add(std::string("rpg_rf_rkl") + suffix, rf_rkl);
    r.add(std::string("rpg_rf_ufkl") + suffix, rf_ufkl);
    r.add(std::string("rpg_rf_urkl") + suffix, rf_urkl);
  }
  r.add("rpg_fkl", rpg_fkl);
  r.add("rpg_rkl", rpg_rkl);
  r.add("rpg_js", rpg_js);
  r.add("rpg_ufkl", rpg_ufkl);
  r.add("rpg_urkl", rpg_urkl);
  r.add("rpg_ujs", rpg_ujs);
}

// The fork's verl_F.masked_mean: sum / (count + 1e-8).
at::Tensor fork_masked_mean(const at::Tensor& v, const at::Tensor& m) { return (v * m).sum() / (m.sum() + 1e-8); }

// The fork's agg_loss, normalised by this micro-batch alone.
at::Tensor fork_agg(const at::Tensor& loss_mat, const at::Tensor& mask, LossAggMode mode) {
  switch (mode) {
    case LossAggMode::TokenMean: return fork_masked_mean(loss_mat, mask);
    case LossAggMode::SeqMeanTokenSum: return (loss_mat * mask).sum(-1).mean();
    case LossAggMode::SeqMeanTokenMean: return ((loss_mat * mask).sum(-1) / mask.sum(-1)).mean();
    case LossAggMode::SeqMeanTokenSumNorm: break;
  }
  throw ValueError(str("loss_agg_mode: '", to_string(mode), "' does not exist in the authors' fork"));
}

}  // namespace

const Registry<ForkKlPenaltyFn>& fork_kl_penalty_registry() {
  static const Registry<ForkKlPenaltyFn> registry = [] {
    Registry<ForkKlPenaltyFn> r("kl_loss_type");
    register_fork_kl_penalties(r);
    return r;
  }();
  return registry;
}

at::Tensor fork_kl_penalty(const at::Tensor& log_prob, const at::Tensor& ref_log_prob, std::string_view kl_type) {
  if (log_prob.sizes() != ref_log_prob.sizes())
    throw ValueError(str("kl_penalty: shapes ", log_prob.sizes(), " and ", ref_log_prob.sizes(), " differ"));
  return fork_kl_penalty_registry().get(kl_type)(log_prob, ref_log_prob);
}

void validate(const ForkLossConfig& c) {
  if (!(c.clip_ratio_c > 1))
    throw ValueError(str("clip_ratio_c: got ", c.clip_ratio_c, ", expected > 1 (dual-clip bound)"));
  if (!(c.clip_ratio_low >= 0 && c.clip_ratio_low < 1))
    throw ValueError(str("clip_ratio_low: got ", c.clip_ratio_low, ", expected in [0, 1)"));
  if (!(c.clip_ratio_high >= 0)) throw ValueError(str("clip_ratio_high: got ", c.clip_ratio_high, ", expected >= 0"));
  if (c.loss_agg_mode == LossAggMode::SeqMeanTokenSumNorm)
    throw ValueError("loss_agg_mode: 'seq-mean-token-sum-norm' does not exist in the authors' fork");
  if (c.use_kl_loss && !fork_kl_penalty_registry().contains(c.kl_loss_type))
    fork_kl_penalty_registry().get(c.kl_loss_type);  // throws, listing the valid names
}

PolicyLossOutput fork_micro_batch_loss(const PolicyLossInputs& in, const ForkLossConfig& c) {
  validate(c);
  for (auto [t, field] : {std::pair{&in.log_probs, "log_probs"}, {&in.old_log_probs, "old_log_probs"},
                          {&in.advantages, "advantages"}, {&in.response_mask, "response_mask"}})
    if (!t->defined() || t->sizes() != in.log_probs.sizes())
      throw ValueError(str("fork loss: ", field, " missing or not the shape of log_probs"));
  const auto mask = in.response_mask.to(in.log_probs.scalar_type());
  const auto& A = in.advantages;
  std::map<std::string, at::Tensor> metrics;

  // core_algos.compute_policy_loss (dual-clip PPO), line for line; no log-ratio clamp.
  auto neg_approx_kl = in.log_probs - in.old_log_probs;
  auto ratio = at::exp(neg_approx_kl);
  auto l1 = -A * ratio;
  auto l2 = -A * at::clamp(ratio, 1 - c.clip_ratio_low, 1 + c.clip_ratio_high);
  auto clip1 = at::maximum(l1, l2);
  auto l3 = -A * c.clip_ratio_c;
  auto clip2 = at::minimum(l3, clip1);
  auto pg_losses = at::where(A < 0, clip2, clip1);
  auto pg_loss = fork_agg(pg_losses, mask, c.loss_agg_mode);
  {
    at::NoGradGuard no_grad;
    metrics["actor/ppo_kl"] = fork_masked_mean(-neg_approx_kl.detach(), mask);
    metrics["actor/pg_clipfrac"] = fork_masked_mean(at::gt(l2, l1).to(mask.scalar_type()), mask);
    metrics["actor/pg_clipfrac_lower"] =
        fork_masked_mean((at::gt(clip1, l3) & (A < 0)).to(mask.scalar_type()), mask);
    metrics["actor/pg_loss"] = pg_loss.detach();
  }

  // dp_actor always aggregates the entropy and subtracts entropy_coeff times it.
  at::Tensor loss = pg_loss;
  if (in.entropy.defined()) {
    auto ent = fork_agg(in.entropy, mask, c.loss_agg_mode);
    loss = loss - ent * c.entropy_coeff;
    metrics["actor/entropy"] = ent.detach();
  }
  if (c.use_kl_loss) {
    const at::Tensor& ref = c.use_iterative_ref_model ? in.old_log_probs : in.ref_log_probs;
    if (!ref.defined())
      throw ValueError("fork loss: use_kl_loss without use_iterative_ref_model needs ref_log_probs");
    auto kl_loss = fork_agg(fork_kl_penalty(in.log_probs, ref, c.kl_loss_type), mask, c.loss_agg_mode);
    loss = loss + kl_loss * c.kl_loss_coef;
    metrics["actor/kl_loss"] = kl_loss.detach();
    metrics["actor/kl_coef"] = at::scalar_tensor(c.kl_loss_coef, at::kDouble);
  }
  return {loss, std::move(metrics)};
}

double fork_micro_batch_weight(int64_t micro_batch_rows, int64_t mini_batch_rows, bool use_dynamic_bsz,
                               int64_t micro_batch_size_per_gpu) {
  if (mini_batch_rows <= 0) throw ValueError(str("ppo_mini_batch_size: got ", mini_batch_rows, ", expected > 0"));
  if (use_dynamic_bsz) return static_cast<double>(micro_batch_rows) / static_cast<double>(mini_batch_rows);
  if (micro_batch_size_per_gpu <= 0)
    throw ValueError(str("ppo_micro_batch_size_per_gpu: got ", micro_batch_size_per_gpu, ", expected > 0"));
  const int64_t accumulation = mini_batch_rows / micro_batch_size_per_gpu;  // Python's //
  if (accumulation <= 0)
    throw ValueError(str("ppo_micro_batch_size_per_gpu: ", micro_batch_size_per_gpu,
                         " exceeds ppo_mini_batch_size ", mini_batch_rows));
  return 1.0 / static_cast<double>(accumulation);
}

at::Tensor fork_weighted_micro_batch_loss(const at::Tensor& loss, int64_t micro_batch_rows, int64_t mini_batch_rows,
                                          bool use_dynamic_bsz, int64_t micro_batch_size_per_gpu) {
  const double weight = fork_micro_batch_weight(micro_batch_rows, mini_batch_rows, use_dynamic_bsz, micro_batch_size_per_gpu);
  if (use_dynamic_bsz) return loss * weight;
  return loss / static_cast<double>(mini_batch_rows / micro_batch_size_per_gpu);  // policy_loss / gradient_accumulation
}

std::vector<std::vector<int64_t>> fork_fixed_micro_batches(int64_t rows, int64_t micro_batch_size) {
  if (micro_batch_size <= 0)
    throw ValueError(str("ppo_micro_batch_size_per_gpu: got ", micro_batch_size, ", expected > 0"));
  std::vector<std::vector<int64_t>> out;
  for (int64_t start = 0; start < rows; start += micro_batch_size) {
    out.emplace_back();
    for (int64_t i = start; i < std::min(rows, start + micro_batch_size); ++i) out.back().push_back(i);
  }
  return out;
}

namespace {

// karmarkar_karp's Set and State with their Python orderings (seqlen_balancing.py).
struct KkSet {
  int64_t sum = 0;
  std::vector<std::pair<int64_t, int64_t>> items;  // (index, length), in insertion order
  bool operator<(const KkSet& o) const {
    if (sum != o.sum) return sum < o.sum;
    if (items.size() != o.items.size()) return items.size() < o.items.size();
    return items < o.items;
  }
};

struct KkState {
  std::vector<KkSet> sets;  // descending
  int64_t spread() const { return sets.front().sum - sets.back().sum; }
  void sort_sets() {
    std::stable_sort(sets.begin(), sets.end(), [](const KkSet& a, const KkSet& b) { return b < a; });
  }
  // Python's State.__lt__ (a min-heap pops the "smallest"): larger spread first, then the
  // larger first set.
  bool before(const KkState& o) const {
    if (spread() != o.spread()) return spread() > o.spread();
    return o.sets.front() < sets.front();
  }
};

}  // namespace

std::vector<std::vector<int64_t>> fork_balanced_partitions(const std::vector<int64_t>& lengths, int64_t k,
                                                           bool equal_size) {
  const int64_t n = static_cast<int64_t>(lengths.size());
  if (k < 1 || k > n) throw ValueError(str("balanced partitions: ", k, " partitions for ", n, " rows"));
  if (equal_size && n % k != 0)
    throw ValueError(str("balanced partitions: ", n, " rows do not split into ", k, " equal partitions"));
  std::vector<std::pair<int64_t, int64_t>> sorted;  // (length, index), ascending as Python sorts tuples
  for (size_t i = 0; i < lengths.size(); ++i) sorted.emplace_back(lengths[i], static_cast<int64_t>(i));
  std::sort(sorted.begin(), sorted.end());
  // The initial states: one row each, or (equal_size) k consecutive rows of the sorted list,
  // one per set. The states are totally ordered (every set holds distinct indices), so a
  // priority queue pops them in the order heapq does.
  std::vector<KkState> heap;
  const int64_t per_state = equal_size ? k : 1;
  for (int64_t offset = 0; offset < n; offset += per_state) {
    KkState st;
    st.sets.resize(static_cast<size_t>(k));
    for (int64_t i = 0; i < per_state; ++i) {
      const auto& [len, idx] = sorted[static_cast<size_t>(offset + i)];
      st.sets[static_cast<size_t>(i)].sum = len;
      st.sets[static_cast<size_t>(i)].items.emplace_back(idx, len);
    }
    st.sort_sets();
    heap.push_back(std::move(st));
  }
  auto pop_first = [&heap] {
    size_t best = 0;
    for (size_t i = 1; i < heap.size(); ++i)
      if (heap[i].before(heap[best])) best = i;
    KkState st = std::move(heap[best]);
    heap.erase(heap.begin() + static_cast<std::ptrdiff_t>(best));
    return st;
  };
  while (heap.size() > 1) {
    KkState a = pop_first();
    KkState b = pop_first();
    for (size_t i = 0; i < static_cast<size_t>(k); ++i) {
      const KkSet& other = b.sets[static_cast<size_t>(k) - 1 - i];
      for (const auto& it : other.items) a.sets[i].items.push_back(it);
      a.sets[i].sum += other.sum;
    }
    a.sort_sets();
    heap.push_back(std::move(a));
  }
  std::vector<std::vector<int64_t>> out;
  for (const auto& set : heap.front().sets) {
    std::vector<int64_t> rows;
    for (const auto& it : set.items) rows.push_back(it.first);
    if (rows.empty()) throw ValueError("balanced partitions: an empty partition");
    std::sort(rows.begin(), rows.end());
    out.push_back(std::move(rows));
  }
  return out;
}

std::vector<std::vector<int64_t>> fork_dynamic_micro_batches(const std::vector<int64_t>& lengths,
                                                             int64_t max_token_len, int64_t padded_width) {
  if (max_token_len < padded_width)
    throw ValueError(str("ppo_max_token_len_per_gpu: ", max_token_len, " is less than the padded sequence length ",
                         padded_width, " (the fork asserts max_token_len >= max_seq_len)"));
  int64_t total = 0;
  for (int64_t l : lengths) total += l;
  const int64_t k = (total + max_token_len - 1) / max_token_len;
  if (k < 1 || k > static_cast<int64_t>(lengths.size()))
    throw ValueError(str("dynamic micro-batches: ", k, " partitions for ", lengths.size(), " rows"));
  return fork_balanced_partitions(lengths, k, /*equal_size=*/false);
}

at::Tensor fork_mini_batch_loss(const PolicyLossInputs& in, const ForkLossConfig& config,
                                const std::vector<std::vector<int64_t>>& micro_batches, bool use_dynamic_bsz,
                                int64_t mini_batch_rows, int64_t micro_batch_size_per_gpu) {
  at::Tensor total;
  for (const auto& rows : micro_batches) {
    if (rows.empty()) throw ValueError("fork loss: an empty micro-batch");
    auto idx = at::tensor(rows, at::kLong).to(in.log_probs.device());
    auto pick = [&](const at::Tensor& t) { return t.defined() ? t.index_select(0, idx) : t; };
    PolicyLossInputs mb;
    mb.log_probs = pick(in.log_probs);
    mb.old_log_probs = pick(in.old_log_probs);
    mb.ref_log_probs = pick(in.ref_log_probs);
    mb.advantages = pick(in.advantages);
    mb.response_mask = pick(in.response_mask);
    mb.entropy = pick(in.entropy);
    auto part = fork_weighted_micro_batch_loss(fork_micro_batch_loss(mb, config).loss, static_cast<int64_t>(rows.size()),
                                               mini_batch_rows, use_dynamic_bsz, micro_batch_size_per_gpu);
    total = total.defined() ? total + part : part;
  }
  if (!total.defined()) throw ValueError("fork loss: no micro-batches");
  return total;
}

}  // namespace rpg::algo
