// One training step, phase by phase (Trainer::train_step calls them in order).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <numeric>

#include "rpg/algo/advantage.h"
#include "rpg/core/device.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/log.h"
#include "rpg/core/rng.h"
#include "rpg/dist/data_parallel.h"
#include "rpg/dist/layout.h"
#include "rpg/dist/process_group.h"
#include "rpg/dist/world.h"
#include "rpg/model/cuda_graph.h"
#include "rpg/reward/overlong.h"
#include "rpg/train/dp.h"
#include "rpg/train/perf_metrics.h"
#include "rpg/train/trainer_impl.h"

namespace rpg::train {

reward::OverlongConfig overlong_shaping(const TrainConfig& cfg) {
  const auto& ob = cfg.reward_model.overlong_buffer;
  return {ob.enable, ob.len, ob.penalty_factor, cfg.data.max_response_length};
}

double mean_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

double masked_mean(const at::Tensor& x, const at::Tensor& mask) {
  at::Tensor m = mask.to(x.scalar_type());
  return ((x * m).sum() / m.sum().clamp_min(1)).item<double>();
}

std::vector<at::Tensor> Trainer::Impl::trainable_tensors(const model::CausalLM& m) const {
  std::vector<at::Tensor> out;
  for (auto& [name, t] : trainable(m)) out.push_back(t);
  return out;
}

void Trainer::Impl::copy_trained(const model::CausalLM& from, model::CausalLM& to) const {
  if (!lora) return to.copy_parameters_from(from);
  c10::NoGradGuard no_grad;
  const auto src = from.lora_parameters(), dst = to.lora_parameters();
  for (size_t i = 0; i < dst.size(); ++i) dst[i].second.detach().copy_(src[i].second);
}

void Trainer::Impl::attach_adapters() {
  if (!lora) return;
  policy.model.set_requires_grad(false);
  // The adapters' init draws from torch's global generator: seeded on its own, then the
  // generator is put back where the run's seed left it.
  const auto& m = cfg.actor_rollout_ref.model;
  at::manual_seed(static_cast<uint64_t>(m.lora_init_seed.value_or(cfg.trainer.seed)));
  // fp32 adapters whatever the base's dtype: on a bf16 base (compute_dtype=bfloat16) they
  // are the fp32 masters the optimizer steps, computed as PEFT does (CausalLM::attach_lora).
  policy.model.attach_lora(cfg.lora_config(), at::kFloat);
  at::manual_seed(static_cast<uint64_t>(cfg.trainer.seed));
}

void Trainer::Impl::sync_compute_weights() {
  if (compute) copy_trained(policy.model, *compute);
}

// The rollout dtype "auto" resolves to: measured on the CPU machine (docs/benchmarks.md,
// "bf16 vs fp32 rollouts"), bf16 on CUDA (tensor cores; verl's default).
static at::ScalarType rollout_dtype(const std::string& name, const at::Device& device) {
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  if (name == "auto" && device.is_cuda()) return at::kBFloat16;
  return at::kFloat;
}

void Trainer::Impl::build_rollout_copy() {
  const at::ScalarType want = rollout_dtype(cfg.actor_rollout_ref.rollout.dtype, policy.model.device());
  rollout_uses_copy = want != policy.model.dtype();
  if (!rollout_uses_copy || (compute && compute->dtype() == want)) return;
  rollout_copy = std::make_unique<model::CausalLM>(
      model::CausalLM::from_pretrained(cfg.actor_rollout_ref.model.path, {want, policy.model.device()}));
  rollout_copy->set_requires_grad(false);
  if (lora) {
    rollout_copy->attach_lora(*policy.model.lora(), at::kFloat);  // fp32 adapters, as the policy's (attach_adapters)
    copy_trained(policy.model, *rollout_copy);
    for (auto& [name, t] : rollout_copy->lora_parameters()) t.requires_grad_(false);
  }
}

model::CausalLM& Trainer::Impl::rollout_model() {
  if (!rollout_uses_copy) return policy.model;
  return rollout_copy ? *rollout_copy : *compute;
}

rollout::EngineOptions Trainer::Impl::engine_options(const model::CausalLM& model) const {
  const auto& r = cfg.actor_rollout_ref.rollout;
  rollout::EngineOptions o{r.max_num_seqs, 0};
  o.max_num_batched_tokens = r.max_num_batched_tokens;
  // The KV cache's share of what is free when each rollout starts (the update's activations
  // are gone). CPU ranks of one node share its memory. A share that cannot hold one sequence of
  // the configured lengths is refused here, naming the key, whatever the prompts drawn.
  const bool cuda = model.device().is_cuda();
  o.kv_cache_memory_fraction = r.kv_cache_memory_fraction;
  o.memory_ranks = cuda ? 1 : dist::layout_from_env().local_world_size;
  if (const auto budget = rollout::kv_budget_bytes(model, o)) {
    const int64_t sequence =
        model.kv_cache_bytes_per_sequence(cfg.data.max_prompt_length + cfg.data.max_response_length);
    if (*budget < sequence)
      throw ValueError(str("actor_rollout_ref.rollout.kv_cache_memory_fraction: ", r.kv_cache_memory_fraction,
                           " of the memory available now is ", format_bytes(static_cast<double>(*budget)),
                           ", less than the KV cache of one sequence (",
                           cfg.data.max_prompt_length + cfg.data.max_response_length, " tokens: ",
                           format_bytes(static_cast<double>(sequence)), ")"));
  }
  if (r.enforce_eager || !cuda) return o;
  const bool graphs = model::cuda_graphs_available();
  static std::once_flag told;  // one line per process, not per generation
  std::call_once(told, [graphs] {
    if (graphs) log_info("rollout: decode steps replayed from a CUDA graph (enforce_eager=false)");
    else log_warn("actor_rollout_ref.rollout.enforce_eager=false: the CUDA plugin librpg_cuda.so is not loaded, so "
                  "decode steps run eagerly (build the rpg_cuda target next to the binary)");
  });
  o.cuda_graph = graphs;
  return o;
}

void Trainer::Impl::refresh_rollout_weights() {
  if (rollout_uses_copy) copy_trained(policy.model, rollout_model());
}

void Trainer::Impl::move_compute_grads() {
  if (!compute) return;
  c10::NoGradGuard no_grad;
  auto master = trainable_tensors(policy.model), work = trainable_tensors(*compute);
  for (size_t i = 0; i < master.size(); ++i) {
    if (!work[i].grad().defined()) continue;
    at::Tensor g = work[i].grad().to(at::kFloat);
    if (master[i].grad().defined()) master[i].mutable_grad().add_(g);
    else master[i].mutable_grad() = g;
    work[i].mutable_grad() = at::Tensor();
  }
}

at::Tensor Trainer::Impl::log_probs_no_grad(const model::CausalLM& m, const rollout::Batch& b, double temperature) {
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> parts;
  const auto micro = micro_batches(b.get("attention_mask"), cfg.actor_rollout_ref.actor);
  const auto [first_micro, end_micro] = dp::micro_batch_range(micro.size());  // data-parallel: this rank's share
  for (size_t mb_index = first_micro; mb_index < end_micro; ++mb_index) {
    const auto& rows = micro[mb_index];
    rollout::Batch mb = b.select(rows);
    model::LogProbOptions lo;
    lo.temperature = temperature;
    lo.remove_padding = cfg.actor_rollout_ref.model.use_remove_padding;
    rules->set_log_prob_options(lo);
    parts.push_back(m.log_probs(mb.get("input_ids"), mb.get("attention_mask"), mb.get("position_ids"),
                                mb.get("responses"), lo)
                        .log_probs);
  }
  // Micro-batches may reorder rows (token packing); put them back. The batch stays where it
  // is (the host): the model's log-probs (on its device) come back to it.
  at::Tensor out = at::zeros_like(b.get("responses"), at::TensorOptions().dtype(at::kFloat));
  size_t k = 0;
  for (size_t mb_index = first_micro; mb_index < end_micro; ++mb_index) {
    out.index_copy_(0, at::tensor(micro[mb_index], at::kLong), parts[k++].to(out.device()));
  }
  dp::sum_rows(out);  // data-parallel: every rank's rows (the others' are zeros here)
  return out;
}

Generation Trainer::Impl::generate_groups() {
  const auto& fg = cfg.algorithm.filter_groups;
  const int64_t gen_batch = cfg.data.gen_batch_size.value_or(cfg.data.train_batch_size);
  Generation gen;
  if (recording) {
    sampling_weights.clear();
    generation_record = {};
  }
  rollout::RolloutEngine engine(rollout_model(), engine_options(rollout_model()));
  bool at_x = false;
  while (static_cast<int64_t>(gen.kept.size()) < cfg.data.train_batch_size) {
    if (gen.rounds > 0 && fg.max_num_gen_batches > 0 && gen.rounds >= fg.max_num_gen_batches)
      throw ValueError(str("dynamic sampling: ", gen.rounds, " generation batches gave only ", gen.kept.size(),
                           " of ", cfg.data.train_batch_size, " groups with varying ", fg.metric,
                           "; raise algorithm.filter_groups.max_num_gen_batches or check the data"));
    // The weights this round samples with (schedule-free AdamW: x or y), in the rollout model
    // (also after a resume or a validation's weight switch).
    if (gen.rounds == 0 || rules->samples_at_x(gen.rounds) != at_x) {
      at_x = rules->samples_at_x(gen.rounds);
      if (at_x) optimizer->use_eval_weights();
      else optimizer->use_train_weights();
      refresh_rollout_weights();
    }
    if (recording) {
      auto& w = sampling_weights.emplace_back();
      for (const auto& p : rollout_model().parameters()) w.push_back(p.detach().clone());
      for (const auto& [name, p] : rollout_model().lora_parameters()) w.push_back(p.detach().clone());
    }
    ++gen.rounds;
    const ScoredRound round = generate_round(engine, next_prompts(gen_batch), gen);
    keep_groups(round, gen);
    if (recording)
      generation_record.acc.emplace_back(gen.all_acc.end() - static_cast<std::ptrdiff_t>(round.responses.size()),
                                         gen.all_acc.end());
    if (!fg.enable) break;
  }
  gen.kept.resize(
      static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(gen.kept.size()), cfg.data.train_batch_size)));
  if (recording)
    for (const auto& g : gen.kept) generation_record.kept.emplace_back(g.round, g.position);
  return gen;
}

ScoredRound Trainer::Impl::generate_round(rollout::RolloutEngine& engine, std::vector<const Prompt*> prompts, Generation& gen) {
  ScoredRound r;
  r.prompts = std::move(prompts);
  std::vector<std::vector<int64_t>> ids;
  for (const auto* p : r.prompts) ids.push_back(p->ids);
  rollout::SamplingParams sp = sampling(false);
  sp.seed = mix_key(static_cast<uint64_t>(cfg.trainer.seed), static_cast<uint64_t>(step),
                    static_cast<uint64_t>(gen.rounds));
  const auto t_gen = Clock::now();
  const double cpu_gen = process_cpu_seconds();
  r.responses = dp::generate(engine, ids, sp);  // data-parallel: shared out, all-gathered
  gen.gen_seconds += seconds_since(t_gen);
  gen.gen_cpu_seconds += process_cpu_seconds() - cpu_gen;
  gen.gen_tokens += engine.last_stats().generated_tokens;

  std::vector<std::string> texts;
  std::vector<reward::ScoreRequest> requests;
  texts.reserve(r.responses.size());
  for (const auto& resp : r.responses) {
    std::vector<tok::TokenId> tid(resp.token_ids.begin(), resp.token_ids.end());
    texts.push_back(policy.tokenizer.decode(tid, /*skip_special_tokens=*/true));
  }
  for (size_t i = 0; i < r.responses.size(); ++i) {
    const Prompt* p = r.prompts[static_cast<size_t>(r.responses[i].prompt_index)];
    requests.push_back({p->data_source, texts[i], p->ground_truth, p->extra_info});
  }
  const auto t_reward = Clock::now();
  reward::RewardScores scored = reward->score(requests);
  r.results = std::move(scored.results);
  gen.reward_timeouts += scored.timeouts;
  for (auto& [key, values] : scored.extra) {
    // A key first seen in a later round has no values for the responses before it.
    auto& all = gen.reward_extra[key];
    all.resize(gen.all_scores.size(), std::numeric_limits<double>::quiet_NaN());
    all.insert(all.end(), values.begin(), values.end());
  }
  gen.reward_seconds += seconds_since(t_reward);
  for (size_t i = 0; i < r.responses.size() && static_cast<int64_t>(gen.samples.size()) < cfg.trainer.sample_log_count;
       ++i) {
    const auto& pids = r.prompts[static_cast<size_t>(r.responses[i].prompt_index)]->ids;
    std::vector<tok::TokenId> pid(pids.begin(), pids.end());
    gen.samples.push_back({{"step", step + 1}, {"prompt", policy.tokenizer.decode(pid)}, {"response", texts[i]},
                           {"score", r.results[i].score}, {"acc", r.results[i].acc},
                           {"ground_truth", requests[i].ground_truth}});
  }
  std::vector<int64_t> lengths;
  for (size_t i = 0; i < r.responses.size(); ++i) {
    lengths.push_back(static_cast<int64_t>(r.responses[i].token_ids.size()));
    r.scores.push_back(r.results[i].score);
  }
  reward::apply_overlong_penalty(overlong_shaping(cfg), lengths, r.scores);
  return r;
}

void Trainer::Impl::keep_groups(const ScoredRound& r, Generation& gen) const {
  const auto& fg = cfg.algorithm.filter_groups;
  const int64_t n = cfg.actor_rollout_ref.rollout.n;
  for (size_t g = 0; g < r.prompts.size(); ++g) {
    Group grp{r.prompts[g], {}, {}, {}, gen.rounds - 1, static_cast<int64_t>(g)};
    for (int64_t j = 0; j < n; ++j) {
      const size_t i = g * static_cast<size_t>(n) + static_cast<size_t>(j);
      grp.responses.push_back(r.responses[i]);
      grp.scores.push_back(r.scores[i]);
      grp.acc.push_back(r.results[i].acc);
      gen.all_scores.push_back(r.scores[i]);
      gen.all_acc.push_back(r.results[i].acc ? 1.0 : 0.0);
    }
    ++gen.generated_groups;
    if (fg.enable && n > 1) {
      std::vector<double> metric;
      for (int64_t j = 0; j < n; ++j)
        metric.push_back(filter_by_acc ? (grp.acc[j] ? 1.0 : 0.0) : grp.scores[j]);
      if (std::all_of(metric.begin(), metric.end(), [&](double x) { return x == metric[0]; })) continue;
    }
    gen.kept.push_back(std::move(grp));
  }
}

StepBatch Trainer::Impl::to_batch(const Generation& gen) const {
  StepBatch sb;
  std::vector<std::vector<int64_t>> group_prompts;
  std::vector<rollout::Response> flat;
  for (size_t g = 0; g < gen.kept.size(); ++g) {
    group_prompts.push_back(gen.kept[g].prompt->ids);
    for (size_t j = 0; j < gen.kept[g].responses.size(); ++j) {
      rollout::Response r = gen.kept[g].responses[j];
      r.prompt_index = static_cast<int64_t>(g);
      if (r.finish_reason == rollout::FinishReason::kLength) ++sb.finished_by_length;
      flat.push_back(std::move(r));
      sb.scores.push_back(gen.kept[g].scores[j]);
    }
  }
  sb.batch = rollout::make_rollout_batch(group_prompts, flat, policy.pad_token_id);
  const at::Tensor& mask = sb.batch.get("response_mask");
  sb.lengths = mask.sum(1);
  sb.token_level_scores = at::zeros(mask.sizes(), at::kFloat);
  for (int64_t b = 0; b < sb.batch.rows(); ++b) {
    const int64_t last = sb.lengths[b].item<int64_t>() - 1;
    if (last >= 0) sb.token_level_scores[b][last] = sb.scores[static_cast<size_t>(b)];
  }
  return sb;
}

PolicyLogProbs Trainer::Impl::old_and_ref_log_probs(const StepBatch& sb, Metrics& m) {
  const auto& actor = cfg.actor_rollout_ref.actor;
  const double temperature = cfg.actor_rollout_ref.rollout.temperature;
  const at::Tensor& mask = sb.batch.get("response_mask");
  PolicyLogProbs lp;
  auto t_old = Clock::now();
  const double cpu_old = process_cpu_seconds();
  rules->use_old_log_prob_weights(*optimizer);
  sync_compute_weights();
  if (recording) {
    old_log_prob_weights.clear();
    for (const auto& p : compute_model().parameters()) old_log_prob_weights.push_back(p.detach().clone());
  }
  lp.from_update = old_log_probs_from_update(sb);
  if (lp.from_update)  // update_actor returns them, micro-batch by micro-batch
    lp.old_log_probs = at::zeros(sb.batch.get("responses").sizes(), at::TensorOptions().dtype(at::kFloat));
  else
    lp.old_log_probs = recompute_old ? log_probs_no_grad(compute_model(), sb.batch, temperature)
                                     : sb.batch.get("rollout_log_probs");
  lp.old_seconds = seconds_since(t_old);
  const double cpu_ref = process_cpu_seconds();
  m["perf/cpu_s/old_log_prob"] = cpu_ref - cpu_old;
  auto t_ref = Clock::now();
  if (reference)
    reference->with_model([&](const model::CausalLM& m) { lp.ref_log_probs = log_probs_no_grad(m, sb.batch, temperature); });
  else if (needs_reference) lp.ref_log_probs = lp.old_log_probs;
  lp.ref_seconds = seconds_since(t_ref);
  m["perf/cpu_s/ref"] = process_cpu_seconds() - cpu_ref;
  if (reference && actor.ref_kl_target > 0) {
    // Paper Section 5: the token-level KL(pi_old || pi_ref) (k3, exact in expectation over
    // pi_old's samples), averaged over the step's response tokens, then over steps.
    const double kl = masked_mean(algo::kl_estimate(lp.old_log_probs, lp.ref_log_probs, algo::KlEstimator::K3), mask);
    ref_kl_running = ref_kl_running ? (1 - actor.ref_kl_ema) * *ref_kl_running + actor.ref_kl_ema * kl : kl;
    m["actor/ref_kl_moving_avg"] = *ref_kl_running;
  }
  if (recompute_old && !lp.from_update) rollout_mismatch_metrics(lp.old_log_probs, sb.batch, m);
  return lp;
}

bool Trainer::Impl::old_log_probs_from_update(const StepBatch& sb) const {
  const auto& a = cfg.actor_rollout_ref.actor;
  return recompute_old && a.on_policy_old_log_probs && rules->allows_old_log_probs_from_update() &&
         a.ppo_epochs == 1 && mini_batch_rows(cfg) >= sb.batch.rows() && !cfg.algorithm.use_kl_in_reward && a.ref_kl_target <= 0;
}

void Trainer::Impl::rollout_mismatch_metrics(const at::Tensor& old_log_probs, const rollout::Batch& b,
                                             std::map<std::string, double>& m) {
  // Rollout/trainer mismatch: the engine's sampling log-probs vs the recomputation.
  const at::Tensor valid = b.get("response_mask").to(at::kBool);
  const at::Tensor diff = (old_log_probs - b.get("rollout_log_probs")).masked_select(valid);
  if (diff.numel() > 0) {
    m["training/rollout_log_prob_diff_mean"] = diff.abs().mean().item<double>();
    m["training/rollout_log_prob_diff_max"] = diff.abs().max().item<double>();
    m["training/rollout_is_weight_min"] = diff.exp().min().item<double>();
    m["training/rollout_is_weight_max"] = diff.exp().max().item<double>();
  }
}

AdvantageResult Trainer::Impl::advantages(const StepBatch& sb, const PolicyLogProbs& lp, Metrics& m) {
  const at::Tensor& mask = sb.batch.get("response_mask");
  AdvantageResult out;
  out.token_level_rewards = sb.token_level_scores;
  if (cfg.algorithm.use_kl_in_reward) {
    KlInReward kl = rules->kl_in_reward(sb.token_level_scores, lp.old_log_probs, lp.ref_log_probs, mask,
                                        kl_in_reward_coef);
    out.token_level_rewards = std::move(kl.token_level_rewards);
    const double current_kl = kl.current_kl;
    m["actor/reward_kl_penalty"] = current_kl;
    m["actor/reward_kl_penalty_coeff"] = kl_in_reward_coef;
    const auto& kc = cfg.algorithm.kl_ctrl;
    if (adaptive_kl_ctrl)  // verl updates with n_steps = the batch's rows
      kl_in_reward_coef = adaptive_kl_coef(kl_in_reward_coef, current_kl, kc.target_kl, kc.horizon, sb.batch.rows());
  }
  const auto t_adv = Clock::now();
  algo::AdvantageInputs ai;
  ai.token_level_rewards = out.token_level_rewards;
  ai.response_mask = mask;
  ai.group_index = sb.batch.get("group_index");
  ai.gamma = cfg.algorithm.gamma;
  ai.norm_adv_by_std_in_grpo = cfg.algorithm.norm_adv_by_std_in_grpo;
  const std::vector<int64_t> order = rules->advantage_order(sb.batch);
  at::Tensor back;  // the estimator's rows back in the batch's order
  if (!order.empty()) {
    const at::Tensor to = at::tensor(order, at::kLong);
    back = at::empty_like(to);
    back.index_copy_(0, to, at::arange(to.numel(), at::kLong));
    for (at::Tensor* t : {&ai.token_level_rewards, &ai.response_mask, &ai.group_index}) *t = t->index_select(0, to);
  }
  auto computed = algo::compute_advantage(cfg.algorithm.adv_estimator, ai);
  out.advantages = back.defined() ? computed.advantages.index_select(0, back) : std::move(computed.advantages);
  out.returns = back.defined() && computed.returns.defined() ? computed.returns.index_select(0, back)
                                                              : std::move(computed.returns);
  out.seconds = seconds_since(t_adv);
  return out;
}

UpdateStats Trainer::Impl::update_actor(const rollout::Batch& batch, const UpdatePlan& plan, bool old_from_update) {
  const auto& actor = cfg.actor_rollout_ref.actor;
  UpdateStats stats;
  // update_policy calls actor_optimizer.train() (dp_actor.py:259-262): back to y.
  optimizer->use_train_weights();
  // The scheduled LR of this step: the schedule advances once per training step, as verl's
  // LambdaLR. The LR each optimizer step really uses (schedule-free AdamW: times its own
  // warm-up over optimizer steps) is averaged into stats.lr.
  stats.scheduled_lr = actor.optim.lr * schedule.factor(step);
  const auto t_update = Clock::now();
  const double cpu_update = process_cpu_seconds();
  updates.clear();
  // One mini-batch, one epoch (old_log_probs_from_update): nothing reads the old log-probs
  // before the micro-batch that computes them.
  if (old_from_update) stats.old_log_probs = at::zeros_like(batch.get("old_log_probs"));
  for (const auto& minis : plan.epochs)
    for (const auto& mini : minis)
      update_mini_batch(batch, mini, stats, old_from_update ? &stats.old_log_probs : nullptr);
  // One LR for the whole step (AdamW, the fork) is logged as is, not as a rounded mean.
  const bool one_lr = std::all_of(stats.lrs.begin(), stats.lrs.end(), [&](double x) { return x == stats.lrs.front(); });
  stats.lr = stats.lrs.empty() ? optimizer->lr_of_next_step(stats.scheduled_lr)
                               : one_lr ? stats.lrs.front() : mean_of(stats.lrs);
  if (old_from_update) {
    dp::sum_rows(stats.old_log_probs);  // data-parallel: every rank's rows (the others' are zeros here)
    std::map<std::string, double> mismatch;
    rollout_mismatch_metrics(stats.old_log_probs, batch, mismatch);
    for (const auto& [k, v] : mismatch) stats.loss_metrics[k] = {v};
  }
  stats.seconds = seconds_since(t_update);
  stats.cpu_seconds = process_cpu_seconds() - cpu_update;
  return stats;
}

void Trainer::Impl::update_mini_batch(const rollout::Batch& batch, const MiniBatchPlan& plan, UpdateStats& stats,
                                      at::Tensor* on_policy_old) {
  const auto& actor = cfg.actor_rollout_ref.actor;
  const std::vector<int64_t>& mini_rows = plan.rows;
  rollout::Batch mini = batch.select(mini_rows);
  const double normaliser = rules->loss_normaliser(mini);
  UpdateRecord record;
  if (recording) {
    record.rows = mini_rows;
    for (const auto& p : trainable_tensors(policy.model)) record.weights.push_back(p.detach().clone());
  }
  sync_compute_weights();
  const auto& micro = plan.micro;
  const auto [first_micro, end_micro] = dp::micro_batch_range(micro.size());  // data-parallel: this rank's share
  const auto metrics_before = dp::metric_sizes(stats.loss_metrics);
  // What comes back to the host (the loss metrics' .item(), the on-policy old log-probs) is
  // read after the last micro-batch, not in between: on CUDA each read waits for the device,
  // which would leave it idle while the next micro-batch is prepared.
  std::vector<std::pair<std::string, at::Tensor>> loss_metrics;
  std::vector<std::pair<std::vector<int64_t>, at::Tensor>> on_policy_rows;
  for (size_t mb = first_micro; mb < end_micro; ++mb) {
    const auto& rows = micro[mb];
    at::Tensor on_policy;
    auto out = micro_batch_loss(mini.select(rows), normaliser, on_policy_old ? &on_policy : nullptr);
    if (on_policy_old) {  // the batch's old log-probs, at the rows of this micro-batch
      std::vector<int64_t> batch_rows;
      for (const int64_t r : rows) batch_rows.push_back(mini_rows[static_cast<size_t>(r)]);
      on_policy_rows.emplace_back(std::move(batch_rows), on_policy);
    }
    out.loss.backward();
    dp::end_micro_batch(*optimizer);  // ZeRO-2: the buckets not yet reduced
    move_compute_grads();
    if (recording) record.loss += out.loss.item<double>();
    for (auto& [k, v] : out.metrics) loss_metrics.emplace_back(k, std::move(v));
  }
  for (const auto& [k, v] : loss_metrics) stats.loss_metrics[k].push_back(v.item<double>());
  for (const auto& [batch_rows, on_policy] : on_policy_rows)  // on the host, as the batch
    on_policy_old->index_copy_(0, at::tensor(batch_rows, at::kLong), on_policy.to(on_policy_old->device(), at::kFloat));
  dp::reduce_update(*optimizer, trainable_tensors(policy.model), stats.loss_metrics, metrics_before,
                    micro.size());  // data-parallel: sum over ranks
  if (recording) {
    for (const auto& p : trainable_tensors(policy.model))
      record.grads.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
    updates.push_back(std::move(record));
  }
  const double norm = dp::clip_grad_norm(*optimizer, actor.grad_clip);  // ZeRO-2: the shards' global norm
  stats.grad_norms.push_back(norm);
  ++optimizer_steps_total;
  if (std::isfinite(norm)) {
    stats.lrs.push_back(optimizer->lr_of_next_step(stats.scheduled_lr));
    optimizer->step(stats.scheduled_lr);
    refresh_rollout_weights();
    if (recording && rollout_uses_copy)
      for (const auto& p : rollout_model().parameters()) {
        updates.back().rollout_weights.push_back(p.detach().clone());
        updates.back().rollout_data.push_back(p.data_ptr());
      }
    consecutive_skips = 0;
  } else {
    // A non-finite loss or gradient: the update is skipped, the weights stay as they were.
    ++stats.skipped;
    ++skipped_total;
    ++consecutive_skips;
    log_warn(str("step ", step + 1, ": non-finite gradient norm, optimizer step skipped"));
  }
  optimizer->zero_grad();
  if (consecutive_skips >= cfg.trainer.max_consecutive_skips)
    throw Error(str("stopping: ", consecutive_skips, " optimizer steps in a row had a non-finite loss or "
                    "gradient (trainer.max_consecutive_skips); the last checkpoint in ",
                    run_dir.root().string(), " is intact"));
}

algo::PolicyLossOutput Trainer::Impl::micro_batch_loss(const rollout::Batch& mb, double normaliser,
                                                       at::Tensor* on_policy_log_probs) {
  const auto& actor = cfg.actor_rollout_ref.actor;
  model::LogProbOptions lo;
  lo.temperature = cfg.actor_rollout_ref.rollout.temperature;
  lo.with_entropy = true;
  lo.remove_padding = cfg.actor_rollout_ref.model.use_remove_padding;
  rules->set_log_prob_options(lo);
  // The batch is on the host, the log-probs on the model's device: the loss's inputs go there,
  // copied before the forward is queued (a blocking host-to-device copy waits for the stream).
  const at::Device dev = compute_model().device();
  auto get = [&](const char* key) { return mb.get(key).to(dev); };
  algo::PolicyLossInputs in;
  in.old_log_probs = get("old_log_probs");
  if (mb.has("ref_log_probs")) in.ref_log_probs = get("ref_log_probs");
  in.rollout_log_probs = get("rollout_log_probs");
  in.advantages = get("advantages");
  in.response_mask = get("response_mask");
  auto lp = compute_model().log_probs(mb.get("input_ids"), mb.get("attention_mask"), mb.get("position_ids"),
                                      mb.get("responses"), lo);
  in.log_probs = lp.log_probs;
  if (on_policy_log_probs) {
    // verl's on_policy (one mini-batch, one epoch): old = current, detached. A reference
    // refreshed every step is pi_old itself.
    *on_policy_log_probs = lp.log_probs.detach();
    in.old_log_probs = *on_policy_log_probs;
    if (!reference && needs_reference) in.ref_log_probs = *on_policy_log_probs;
  }
  in.entropy = actor.entropy_coeff != 0.0 ? lp.entropy : lp.entropy.detach();
  in.normaliser = normaliser;
  return rules->micro_batch_loss(in, mb.rows());
}

void Trainer::Impl::refresh_reference(Metrics& m) {
  const auto& actor = cfg.actor_rollout_ref.actor;
  if (!reference || !actor.use_iterative_ref_model) return;
  const bool by_count = actor.ref_update_freq > 0 && step % actor.ref_update_freq == 0;
  const bool by_kl = actor.ref_kl_target > 0 && ref_kl_running && *ref_kl_running > actor.ref_kl_target;
  if (by_count || by_kl) {
    reference->refresh();  // the weights that sample, as pi_old
    ++ref_updates;
    ref_kl_running.reset();  // the KL to the new reference starts at zero
  }
  m["actor/ref_updates"] = static_cast<double>(ref_updates);
}

void Trainer::Impl::step_metrics(const Generation& gen, const StepBatch& sb, const AdvantageResult& adv, const UpdateStats& up,
                  Metrics& m) const {
  const at::Tensor& mask = sb.batch.get("response_mask");
  for (const auto& [k, v] : up.loss_metrics) m[k] = mean_of(v);
  m["actor/grad_norm"] = mean_of(up.grad_norms);
  m["actor/lr"] = up.lr;
  m["actor/skipped_steps"] = static_cast<double>(up.skipped);
  m["critic/score/mean"] = mean_of(sb.scores);
  m["critic/rewards/mean"] = adv.token_level_rewards.sum(1).to(at::kDouble).mean().item<double>();
  m["critic/advantages/mean"] = masked_mean(adv.advantages, mask);
  m["critic/advantages/max"] = (adv.advantages * mask).max().item<double>();
  m["critic/advantages/min"] = (adv.advantages * mask).min().item<double>();
  if (adv.returns.defined()) {  // verl's compute_data_metrics: the returns over response tokens
    m["critic/returns/mean"] = masked_mean(adv.returns, mask);
    m["critic/returns/max"] = (adv.returns * mask).max().item<double>();
    m["critic/returns/min"] = (adv.returns * mask).min().item<double>();
  }
  m["acc/mean"] = mean_of(gen.all_acc);
  m["acc/generated_score_mean"] = mean_of(gen.all_scores);
  if (cfg.reward_calls_out()) m["reward/timeouts"] = static_cast<double>(gen.reward_timeouts);
  for (const auto& [key, values] : gen.reward_extra) {
    double sum = 0;
    int64_t count = 0;
    for (double v : values)
      if (!std::isnan(v)) sum += v, ++count;
    if (count > 0) m["reward/extra/" + key + "/mean"] = sum / static_cast<double>(count);
  }
  m["response_length/mean"] = sb.lengths.to(at::kDouble).mean().item<double>();
  m["response_length/max"] = sb.lengths.max().item<double>();
  m["response_length/clip_ratio"] = static_cast<double>(sb.finished_by_length) / static_cast<double>(sb.batch.rows());
  m["prompt_length/mean"] = sb.batch.get("attention_mask").sum(1).sub(sb.lengths).to(at::kDouble).mean().item<double>();
  m["train/num_gen_batches"] = static_cast<double>(gen.rounds);
  m["train/kept_group_ratio"] =
      static_cast<double>(gen.kept.size()) / static_cast<double>(std::max<int64_t>(1, gen.generated_groups));
  m["train/epoch"] = static_cast<double>(epoch);
  m["timing_s/gen"] = gen.gen_seconds;
  m["timing_s/reward"] = gen.reward_seconds;
  m["timing_s/update_actor"] = up.seconds;
  m["perf/cpu_s/gen"] = gen.gen_cpu_seconds;
  m["perf/cpu_s/update_actor"] = up.cpu_seconds;
  m["perf/gen_tokens_per_s"] = gen.gen_seconds > 0 ? static_cast<double>(gen.gen_tokens) / gen.gen_seconds : 0.0;
}

namespace {

// The rows of the batch each data-parallel rank runs in the update's first epoch (one
// partition per rank), as dp::micro_batch_range shares out every mini-batch's micro-batches.
std::vector<std::vector<int64_t>> rank_rows(const UpdatePlan& plan, int64_t rows) {
  dist::ProcessGroup* pg = dist::world();
  const int world = pg ? pg->size() : 1;
  std::vector<std::vector<int64_t>> parts(static_cast<size_t>(world));
  if (world == 1) {
    parts[0].resize(static_cast<size_t>(rows));
    std::iota(parts[0].begin(), parts[0].end(), 0);
    return parts;
  }
  for (const MiniBatchPlan& mini : plan.epochs.front())
    for (int r = 0; r < world; ++r) {
      const auto share = dist::shard(static_cast<int64_t>(mini.micro.size()), world, r);
      for (int64_t mb = share.begin; mb < share.end; ++mb)
        for (const int64_t row : mini.micro[static_cast<size_t>(mb)])
          parts[static_cast<size_t>(r)].push_back(mini.rows[static_cast<size_t>(row)]);
    }
  return parts;
}

}  // namespace

void Trainer::Impl::perf_metrics(const StepBatch& sb, const PolicyLogProbs& lp, const UpdatePlan& plan,
                                 const UpdateStats& up, Metrics& m) {
  const at::Tensor lengths = sb.batch.get("attention_mask").sum(1).to(at::kLong).contiguous();
  const std::vector<int64_t> seqlens(lengths.data_ptr<int64_t>(), lengths.data_ptr<int64_t>() + lengths.numel());
  const int64_t total = std::accumulate(seqlens.begin(), seqlens.end(), int64_t{0});
  const int64_t response_tokens = sb.batch.get("response_mask").sum().item<int64_t>();
  std::map<std::string, double> timing;
  for (const auto& [k, v] : m)
    if (k.rfind("timing_s/", 0) == 0) timing[k.substr(9)] = v;
  for (const auto& [k, v] : timing_metrics(timing, total - response_tokens, response_tokens)) m[k] = v;
  dist::ProcessGroup* pg = dist::world();
  const int64_t world = pg ? pg->size() : 1;
  if (timing.count("step"))
    for (const auto& [k, v] : throughput_metrics(seqlens, timing.at("step"), world)) m[k] = v;
  for (const auto& [k, v] : seqlen_balance_metrics(seqlens, rank_rows(plan, sb.batch.rows()))) m[k] = v;
  // MFU as verl's fsdp worker: FLOPs of the batch's real tokens (times ppo_epochs) over the
  // update's time, the device's peak and the world size; the old-log-prob pass is a forward
  // (a third). Only where the peak is known (verl's table by device name, as
  // torch.cuda.get_device_name gives it; on CPU its nominal 448 GFLOP/s).
  const at::Device dev = policy.model.device();
  const int cuda_index = dev.is_cuda() ? static_cast<int>(dev.index()) : -1;
  const double peak =
      dev.is_cpu() ? device_peak_flops("CPU")
                   : dev.is_cuda() ? device_peak_flops(device::cuda_device_name(cuda_index).value_or("")) : 0.0;
  if (peak > 0) {
    const double flops = training_flops(policy.model.config(), seqlens);
    if (up.seconds > 0)
      m["perf/mfu/actor"] = flops * static_cast<double>(cfg.actor_rollout_ref.actor.ppo_epochs) / up.seconds / peak /
                            static_cast<double>(world);
    if (recompute_old && !lp.from_update && lp.old_seconds > 0)
      m["perf/mfu/actor_infer"] = flops / 3 / lp.old_seconds / peak / static_cast<double>(world);
  }
  // CPU memory: the process's peak resident set (verl also logs the machine's used memory,
  // which counts other processes). CUDA: the caching allocator's peaks, as verl's worker.
  m["perf/max_rss_gb"] = peak_rss_gb();
  if (dev.is_cuda())
    if (const auto peaks = device::cuda_memory_peaks(cuda_index)) {
      m["perf/max_memory_allocated_gb"] = static_cast<double>(peaks->allocated) / (1 << 30);
      m["perf/max_memory_reserved_gb"] = static_cast<double>(peaks->reserved) / (1 << 30);
    }
  std::map<std::string, double> mem;
  dp::memory_metrics(*optimizer, mem);  // bytes of gradients / optimizer state / weights (dist/memory.h)
  for (const auto& [k, v] : mem) m[k] = v;
  if (lora) {  // weight_bytes are the adapters (what the optimizer trains); the base apart
    int64_t frozen = 0;
    for (const auto& p : policy.model.parameters()) frozen += static_cast<int64_t>(p.nbytes());
    m["perf/memory/frozen_weight_bytes"] = static_cast<double>(frozen);
  }
}

}  // namespace rpg::train
