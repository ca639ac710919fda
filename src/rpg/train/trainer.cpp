#include "rpg/train/trainer.h"
#include "rpg/model/checkpoint_files.h"
#include "rpg/model/lora.h"
#include "rpg/train/perf_metrics.h"
#include "rpg/train/trainer_impl.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <numeric>
#include <optional>
#include <sstream>

#include "rpg/algo/advantage.h"
#include "rpg/algo/policy_loss.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/jsonl.h"
#include "rpg/core/log.h"
#include "rpg/core/malloc_env.h"
#include "rpg/core/metrics.h"
#include "rpg/core/progress.h"
#include "rpg/core/rng.h"
#include "rpg/core/signals.h"
#include "rpg/data/dataset.h"
#include "rpg/eval/evaluate.h"
#include "rpg/train/dp.h"
#include "rpg/eval/report.h"
#include "rpg/reward/overlong.h"
#include "rpg/reward/reward_spec.h"
#include "rpg/rollout/batch.h"
#include "rpg/rollout/engine.h"
#include "rpg/rollout/policy.h"
#include "rpg/train/checkpoint.h"
#include "rpg/train/resume_check.h"
#include "rpg/train/trainer_testing.h"
#include "rpg/train/optim.h"


#include <nlohmann/json.hpp>

namespace rpg::train {
namespace {

// The rows of every file in order; `where`, when given, receives "FILE row K" for each.
std::vector<data::Row> read_rows(const std::vector<std::string>& files, int64_t max_samples, const std::string& key,
                                 std::vector<std::string>* where = nullptr) {
  if (files.empty()) throw ConfigError(str(key, ": no files given"));
  std::vector<data::Row> rows;
  for (const auto& f : files) {
    auto part = data::read_prompt_rows(f, key);
    if (where)
      for (size_t k = 0; k < part.size(); ++k) where->push_back(str(f, " row ", k));
    rows.insert(rows.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  if (max_samples >= 0 && static_cast<int64_t>(rows.size()) > max_samples) rows.resize(static_cast<size_t>(max_samples));
  return rows;
}

std::vector<tok::ChatMessage> messages_of(const data::Row& row) {
  std::vector<tok::ChatMessage> m;
  for (const auto& msg : row.prompt) m.push_back({msg.role, msg.content});
  return m;
}

}  // namespace

std::vector<int64_t> truncate_prompt(std::vector<int64_t> ids, int64_t max_len, Truncation how) {
  const auto n = static_cast<int64_t>(ids.size());
  if (n <= max_len) return ids;
  switch (how) {
    case Truncation::kLeft: return {ids.end() - max_len, ids.end()};
    case Truncation::kRight: ids.resize(static_cast<size_t>(max_len)); return ids;
    case Truncation::kMiddle: {
      // verl (utils/torch_functional.py postprocess_data): the first max_len // 2 tokens and
      // the last max_len - max_len // 2.
      const int64_t left = max_len / 2, right = max_len - left;
      std::vector<int64_t> out(ids.begin(), ids.begin() + left);
      out.insert(out.end(), ids.end() - right, ids.end());
      return out;
    }
    case Truncation::kError: break;
  }
  throw ValueError(str("prompt of ", n, " tokens > ", max_len, " and truncation=error"));
}

double adaptive_kl_coef(double coef, double current_kl, double target_kl, int64_t horizon, int64_t n) {
  const double error = std::clamp(current_kl / target_kl - 1.0, -0.2, 0.2);
  return coef * (1.0 + error * static_cast<double>(n) / static_cast<double>(horizon));
}

namespace {

// The policy's weights are bf16 (no fp32 copy of the model): dist.shard_master_weights (the
// fp32 masters are the sharded optimizer's), or LoRA with bf16 compute (the base is frozen,
// the fp32 adapters are the only masters).
bool bf16_policy(const TrainConfig& cfg) {
  return cfg.dist.shard_master_weights || (cfg.uses_lora() && cfg.choices.compute_dtype == ComputeDtype::kBFloat16);
}

reward::RewardSpec reward_spec(const TrainConfig& cfg) {
  reward::RewardSpec spec;
  const auto& fn = cfg.custom_reward_function;
  const auto& rm = cfg.reward_model;
  if (fn.path) {
    spec.python.path = *fn.path;
    spec.python.name = fn.name;
    spec.python.python = fn.python;
    spec.python.kwargs_json = fn.reward_kwargs.json;
    spec.python.num_workers = rm.num_workers;
    spec.python.timeout_s = rm.timeout_s;
    spec.python.timeout_score = rm.timeout_score;
  }
  if (rm.url) {
    spec.http.url = *rm.url;
    spec.http.batch_size = rm.request_batch_size;
    if (rm.num_workers > 0) spec.http.max_concurrency = rm.num_workers;
    spec.http.timeout_s = rm.timeout_s;
    spec.http.timeout_score = rm.timeout_score;
  }
  return spec;
}

}  // namespace

Trainer::Impl::Impl(TrainConfig c, reward::ScorerRegistry s)
    : cfg(std::move(c)),
      reward(dp::reward_scorer(cfg.reward_calls_out(),
                               [&] { return reward::make_reward_scorer(reward_spec(cfg), std::move(s)); })),
      // bf16 weights (bf16_policy), else fp32 weights that are the master.
      policy(rollout::load_policy(cfg.actor_rollout_ref.model.path, bf16_policy(cfg) ? "bfloat16" : "float32",
                                  cfg.trainer.device)) {
  shard_master = cfg.dist.shard_master_weights;
  lora = cfg.uses_lora();
  // A bf16 policy samples itself unless another dtype is asked for explicitly ("auto" would be
  // an fp32 copy on the CPU: the 4 B/param the bf16 policy saves).
  if (bf16_policy(cfg) && cfg.actor_rollout_ref.rollout.dtype == "auto") cfg.actor_rollout_ref.rollout.dtype = "bfloat16";
  recompute_old = cfg.choices.old_log_prob_source == OldLogProbSource::kRecompute;
  filter_by_acc = cfg.choices.filter_metric == FilterMetric::kAcc;
  adaptive_kl_ctrl = cfg.choices.kl_ctrl == KlControlType::kAdaptive;
}

void Trainer::Impl::set_epoch(int64_t e) {
  epoch = e;
  cursor = 0;
  order = rules->epoch_order(static_cast<int64_t>(prompts.size()), e);
}

std::vector<const Prompt*> Trainer::Impl::next_prompts(int64_t k) {
  if (cursor + k > static_cast<int64_t>(order.size())) {
    if (rules->data_ends_with_total_epochs() && epoch + 1 >= cfg.trainer.total_epochs)
      throw DataExhausted(str("the training data is used up: trainer.total_epochs=", cfg.trainer.total_epochs,
                              " passes of ", order.size() / static_cast<size_t>(k), " generation batches"));
    set_epoch(epoch + 1);
  }
  std::vector<const Prompt*> out;
  for (int64_t i = 0; i < k; ++i) out.push_back(&prompts[static_cast<size_t>(order[static_cast<size_t>(cursor++)])]);
  return out;
}

rollout::SamplingParams Trainer::Impl::sampling(bool validation) const {
  const auto& r = cfg.actor_rollout_ref.rollout;
  rollout::SamplingParams p;
  if (validation) {
    p.temperature = r.val_kwargs.do_sample ? r.val_kwargs.temperature : 0.0;
    p.top_p = r.val_kwargs.top_p;
    p.top_k = r.val_kwargs.top_k;
    p.n = r.val_kwargs.n;
  } else {
    p.temperature = r.temperature;
    p.top_p = r.top_p;
    p.top_k = r.top_k;
    p.n = r.n;
  }
  p.max_new_tokens = cfg.data.max_response_length;
  p.ignore_eos = r.ignore_eos;
  p.stop_token_ids = policy.stop_token_ids;
  return p;
}

void Trainer::Impl::write_report() {
  // Once, at the end of the run (or its preemption): the report reads all of metrics.jsonl,
  // so writing it at every checkpoint would cost the square of the run's length.
  if (dp::writes_run_dir()) eval::write_report(run_dir.root());
}

void Trainer::Impl::load_data() {
  std::vector<std::string> where;
  auto rows = read_rows(cfg.data.train_files, cfg.data.train_max_samples, "data.train_files", &where);
  for (const auto& r : rows) reward->check_data_source(r.data_source);
  for (size_t i = 0; i < rows.size(); ++i) {
    Prompt p;
    try {
      p.ids = rollout::render_prompt(policy.tokenizer, messages_of(rows[i]), true,
                                     cfg.data.apply_chat_template_kwargs);
    } catch (const Error& e) {  // the template is the model's; what it failed on is this row
      throw ValueError(str("data.train_files: ", where[i], ": rendering its prompt with the chat template failed: ",
                           e.what()));
    }
    p.data_source = rows[i].data_source;
    p.ground_truth = rows[i].reward_model.ground_truth;
    p.extra_info = data::extra_info_json(rows[i].extra_info);
    const int64_t len = static_cast<int64_t>(p.ids.size()), max_len = cfg.data.max_prompt_length;
    if (len > max_len) {
      if (cfg.data.filter_overlong_prompts) continue;
      if (cfg.choices.truncation == Truncation::kError)
        throw ValueError(str("data.train_files: row ", i, " has a prompt of ", len,
                             " tokens > data.max_prompt_length=", max_len,
                             " (set data.truncation=left|right|middle or data.filter_overlong_prompts=true)"));
      p.ids = truncate_prompt(std::move(p.ids), max_len, cfg.choices.truncation);
    }
    prompts.push_back(std::move(p));
  }
  const int64_t gen_batch = cfg.data.gen_batch_size.value_or(cfg.data.train_batch_size);
  if (static_cast<int64_t>(prompts.size()) < std::max(cfg.data.train_batch_size, gen_batch))
    throw ConfigError(str("data.train_batch_size / data.gen_batch_size (", std::max(cfg.data.train_batch_size, gen_batch),
                          ") exceed the ", prompts.size(), " usable training prompts"));
  if (!cfg.data.val_files.empty()) val_rows = read_rows(cfg.data.val_files, cfg.data.val_max_samples, "data.val_files");
  steps_per_epoch = static_cast<int64_t>(prompts.size()) / rules->prompts_per_step();
  total_steps = cfg.trainer.total_training_steps.value_or(steps_per_epoch * cfg.trainer.total_epochs);
  set_epoch(0);
}

void Trainer::Impl::build_optimizer() {
  const auto& o = cfg.actor_rollout_ref.actor.optim;
  OptimizerOptions oo;
  oo.type = o.optim_type;
  oo.lr = o.lr;
  oo.beta1 = o.betas[0];
  oo.beta2 = o.betas[1];
  oo.weight_decay = o.weight_decay;
  const int64_t warmup = resolve_warmup_steps(o.lr_warmup_steps, o.lr_warmup_steps_ratio, total_steps);
  oo.warmup_steps = warmup;
  if (o.optim_type == "schedulefree") {
    // The fork (fsdp_workers.py:278-285): schedulefree.AdamWScheduleFree(lr, betas, weight_decay),
    // eps 1e-8, no warmup_steps of its own; the LambdaLR below writes the scheduled LR into its
    // param group; eval()/train() interpolate between x and y (dp_actor.py:205-208, 259-262).
    oo.type = "schedule_free_adamw";
    oo.warmup_steps = 0;
    oo.scheduled_lr = true;
    oo.restore_exact_y = false;
  }
  // With LoRA the adapters, in PEFT's order (the fork's FSDP order is of full weights).
  NamedTensors params = lora ? policy.model.lora_parameters() : rules->optimizer_order(policy.model.named_parameters());
  // ZeRO-1/2: sharded. dist.shard_master_weights: the parameters are bf16, their fp32 masters
  // are the optimizer's (1/N per rank), and gradients accumulate in fp32 (zero_optimizer.h).
  optimizer = dp::make_optimizer(oo, std::move(params), cfg.dist.zero_stage,
                                 static_cast<int64_t>(cfg.dist.reduce_bucket_mb * 1024 * 1024), shard_master);
  schedule = LrSchedule{o.warmup_style.value_or(o.lr_scheduler_type), warmup, total_steps, o.min_lr_ratio,
                        o.num_cycles};
  schedule.fork_constant = rules->constant_schedule_starts_at_zero();
}

void Trainer::Impl::build_models() {
  const auto& path = cfg.actor_rollout_ref.model.path;
  kl_in_reward_coef = cfg.algorithm.kl_ctrl.kl_coef;
  needs_reference = cfg.choices.kl_loss_uses_reference || cfg.algorithm.use_kl_in_reward;
  if (needs_reference && rules->reference_resident()) {
    if (lora && cfg.actor_rollout_ref.actor.use_iterative_ref_model) {
      reference = adapter_snapshot_reference(policy.model);
    } else if (lora) {
      reference = base_model_reference(policy.model);
    } else {
      // In the dtype the policy computes in (dist.shard_master_weights implies bf16): a bf16
      // policy is compared with a bf16 reference, so that pi_ref = pi_theta gives KL 0 exactly
      // (at the start, and after each refresh, where the reference takes the masters' bf16
      // rounding, the compute copy's values).
      const bool bf16_compute = cfg.choices.compute_dtype == ComputeDtype::kBFloat16;
      auto ref = std::make_unique<model::CausalLM>(
          model::CausalLM::from_pretrained(path, {bf16_compute ? at::kBFloat16 : at::kFloat, policy.model.device()}));
      if (rules->reference_weights_bf16() && ref->dtype() == at::kFloat) {  // bf16 values computed in fp32
        c10::NoGradGuard no_grad;
        for (auto& [name, w] : ref->named_parameters()) w.copy_(w.to(at::kBFloat16));
      }
      reference = resident_reference(std::move(ref), policy.model);
    }
  }
  if (shard_master) {
    // The policy (bf16) runs forward/backward itself: no compute copy. The optimizer's fp32
    // masters start from the checkpoint's full-precision weights, not from their bf16
    // rounding: read from the memory-mapped safetensors, each rank copying only its 1/N.
    model::CheckpointFiles fp32(path);
    dp::init_master_weights(*optimizer, [&](const std::string& name) { return fp32.view(name); });
  } else if (cfg.choices.compute_dtype == ComputeDtype::kBFloat16 && !lora) {
    // (LoRA: the bf16 policy with fp32 adapters computes itself, no copy.)
    compute = std::make_unique<model::CausalLM>(
        model::CausalLM::from_pretrained(path, {at::kBFloat16, policy.model.device()}));
    compute->set_requires_grad(true);
    compute->set_gradient_checkpointing(cfg.actor_rollout_ref.model.enable_gradient_checkpointing);
    // ZeRO-2: its gradients go to the buckets, paired with the optimizer's parameters by
    // position, so in the optimizer's order.
    const NamedTensors sources = rules->optimizer_order(compute->named_parameters());
    std::vector<at::Tensor> source_tensors;
    for (auto& [name, tensor] : sources) source_tensors.push_back(tensor);
    dp::attach_gradient_sources(*optimizer, source_tensors);
  }
  build_rollout_copy();
}

void Trainer::Impl::open_run_dir() {
  run_dir = RunDir(cfg.trainer.default_local_dir);
  if (dp::writes_run_dir()) run_dir.remove_partial();  // data-parallel: rank 0 owns the directory
  resume();
  logger = std::make_unique<MetricsLogger>(dp::metrics_dir(run_dir.root()), /*tensorboard=*/true, step + 1);
  if (dp::writes_run_dir()) {
    jsonl::keep_steps(run_dir.root() / "samples.jsonl", [&](int64_t st) { return st <= step; });
    // The one statement of what runs, as resolved (written once the run is accepted, resume
    // included): `rpg report` shows it instead of re-deriving one from config keys.
    write_file_atomic(run_dir.root() / "algorithm.txt", cfg.choices.algorithm_summary + "\n");
  }
}

void Trainer::Impl::log_step(const Metrics& m, const std::vector<nlohmann::json>& samples) {
  logger->log(step, m);
  if (dp::writes_run_dir() && cfg.trainer.sample_log_freq > 0 && step % cfg.trainer.sample_log_freq == 0) {
    std::string lines;
    for (const auto& j : samples) lines += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    rpg::append_file(run_dir.root() / "samples.jsonl", lines);  // core/io: under the write-fault hook
  }
}

namespace {
// The one place the trainer resolves (logging what resolve() rewrote; nothing when `rpg train`
// resolved it already: resolve() is idempotent) and validates its config, every rule at once.
TrainConfig prepared(TrainConfig config) {
  for (const auto& notice : config.resolve()) log_info(notice);
  config.validate();
  if (config.actor_rollout_ref.model.path.empty())
    throw ConfigError("actor_rollout_ref.model.path: required (a Hugging Face model directory)");
  return config;
}

reward::ScorerRegistry builtin_scorers_for(const TrainConfig& resolved) {
  reward::ScorerOptions options;
  options.dapo_variant = resolved.choices.dapo_variant;
  return reward::builtin_scorers(options);
}
}  // namespace

Trainer::Trainer(TrainConfig config) : Trainer(Prepared{prepared(std::move(config))}, std::nullopt) {}

Trainer::Trainer(TrainConfig config, reward::ScorerRegistry scorers)
    : Trainer(Prepared{prepared(std::move(config))}, std::move(scorers)) {}

Trainer::Trainer(Prepared p, std::optional<reward::ScorerRegistry> scorers) {
  log_info(p.config.choices.algorithm_summary);  // the one line stating what runs
  if (!scorers) scorers = builtin_scorers_for(p.config);
  impl_ = std::make_unique<Impl>(std::move(p.config), std::move(*scorers));
  Impl& s = *impl_;
  const auto& cfg = s.cfg;
  at::manual_seed(static_cast<uint64_t>(cfg.trainer.seed));
  s.policy.model.set_gradient_checkpointing(cfg.actor_rollout_ref.model.enable_gradient_checkpointing);
  s.rules = make_rules(cfg);  // the loss's string keys parsed and checked once
  s.load_data();
  s.attach_adapters();
  s.build_optimizer();
  s.build_models();
  s.open_run_dir();
  malloc_env::release_free_memory();  // the setup's and resume's transients (core/malloc_env.h)
  log_info(str("train: ", s.prompts.size(), " prompts, ", s.steps_per_epoch, " steps per epoch, ", s.total_steps,
               " steps; policy loss ", cfg.actor_rollout_ref.actor.policy_loss, ", advantages ",
               cfg.algorithm.adv_estimator, "; run dir ", s.run_dir.root().string()));
}

Trainer::~Trainer() = default;

int64_t Trainer::global_step() const { return impl_->step; }
bool Trainer::has_reference_model() const { return impl_->reference && impl_->reference->resident(); }
int64_t Trainer::total_steps() const { return impl_->total_steps; }
const model::CausalLM& Trainer::model() const { return impl_->policy.model; }
const rollout::Batch& Trainer::last_batch() const { return impl_->last_batch; }
void TrainerTesting::record_updates(Trainer& t, bool on) { t.impl_->recording = on; }
const std::vector<UpdateRecord>& TrainerTesting::last_updates(const Trainer& t) { return t.impl_->updates; }
const std::vector<std::vector<at::Tensor>>& TrainerTesting::last_sampling_weights(const Trainer& t) {
  return t.impl_->sampling_weights;
}
const std::vector<at::Tensor>& TrainerTesting::last_old_log_prob_weights(const Trainer& t) {
  return t.impl_->old_log_prob_weights;
}
const GenerationRecord& TrainerTesting::last_generation(const Trainer& t) { return t.impl_->generation_record; }
OptimizerState TrainerTesting::optimizer_state(const Trainer& t) { return t.impl_->optimizer->state(); }

std::string validation_metric_key(const std::string& source, const std::string& name,
                                  const std::map<std::string, double>& table) {
  // ray_trainer._validate: per data source, the core variable is acc when present (else the
  // reward; rpg's score where a table has no reward); n_max is the largest "@n" among that
  // variable's metrics.
  auto var_of = [](const std::string& n) {
    const auto slash = n.find('/');
    return slash == std::string::npos ? std::string() : n.substr(0, slash);
  };
  auto at_n = [](const std::string& n) -> int64_t {
    const auto at = n.rfind('@');
    if (at == std::string::npos) return -1;
    return std::atoll(n.c_str() + at + 1);  // int(name.split("@")[-1].split("/")[0])
  };
  bool has_acc = false, has_reward = false;
  for (const auto& [n, v] : table) {
    has_acc = has_acc || var_of(n) == "acc";
    has_reward = has_reward || var_of(n) == "reward";
  }
  const std::string core = has_acc ? "acc" : has_reward ? "reward" : "score";
  const std::string var = var_of(name);
  bool is_core = false;
  if (var == core) {
    int64_t n_max = -1;
    for (const auto& [n, v] : table)
      if (var_of(n) == var) n_max = std::max(n_max, at_n(n));
    const std::string metric = name.substr(var.size() + 1);
    const bool prefix = metric.rfind("mean", 0) == 0 || metric.rfind("maj", 0) == 0 || metric.rfind("best", 0) == 0;
    is_core = prefix && metric.find(str("@", n_max)) != std::string::npos;
  }
  return str(is_core ? "val-core/" : "val-aux/", source, "/", name);
}

std::string step_summary(int64_t step, int64_t total, const Metrics& m) {
  auto get = [&](const char* key) {
    auto it = m.find(key);
    return it == m.end() ? std::nan("") : it->second;
  };
  double kl = std::nan("");
  for (const char* key : {"actor/kl_loss", "actor/rpg_kl", "actor/reward_kl_penalty", "actor/ppo_kl"})
    if (m.count(key)) {
      kl = m.at(key);
      break;
    }
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %lld/%lld | score %.4f | pg_loss %.4g | kl %.3g | grad_norm %.4g | response_length %.1f | %.2f s",
                static_cast<long long>(step), static_cast<long long>(total), get("critic/score/mean"),
                get("actor/pg_loss"), kl, get("actor/grad_norm"), get("response_length/mean"), get("timing_s/step"));
  return buf;
}

Metrics Trainer::train_step() {
  Impl& s = *impl_;
  const auto t_step = Clock::now();
  const double cpu_step = process_cpu_seconds();
  Metrics m;
  const Generation gen = s.generate_groups();
  StepBatch sb = s.to_batch(gen);
  const PolicyLogProbs lp = s.old_and_ref_log_probs(sb, m);
  const AdvantageResult adv = s.advantages(sb, lp, m);
  sb.batch.set("old_log_probs", lp.old_log_probs);
  if (lp.ref_log_probs.defined()) sb.batch.set("ref_log_probs", lp.ref_log_probs);
  sb.batch.set("advantages", adv.advantages);
  sb.batch.set("token_level_scores", sb.token_level_scores);
  const UpdatePlan plan = s.rules->plan_update(sb.batch, s.step);
  const UpdateStats up = s.update_actor(sb.batch, plan, lp.from_update);
  if (lp.from_update) {  // the update's own log-probs (and pi_ref when it is pi_old)
    sb.batch.set("old_log_probs", up.old_log_probs);
    if (lp.ref_log_probs.defined() && lp.ref_log_probs.is_same(lp.old_log_probs))
      sb.batch.set("ref_log_probs", up.old_log_probs);
  }
  ++s.step;
  s.refresh_reference(m);
  s.step_metrics(gen, sb, adv, up, m);
  m["timing_s/old_log_prob"] = lp.old_seconds;
  m["timing_s/ref"] = lp.ref_seconds;
  m["timing_s/adv"] = adv.seconds;
  m["timing_s/step"] = seconds_since(t_step);
  m["perf/cpu_s/step"] = process_cpu_seconds() - cpu_step;
  s.perf_metrics(sb, lp, plan, up, m);
  s.last_batch = std::move(sb.batch);
  s.log_step(m, gen.samples);
  malloc_env::release_if_heap_grew();  // no creep over a long run (core/malloc_env.h)
  return m;
}

Metrics Trainer::validate() {
  Impl& s = *impl_;
  Metrics m;
  if (s.val_rows.empty()) return m;
  const auto t_testing = Clock::now();
  s.rules->use_export_weights(*s.optimizer);
  // verl's and the fork's val_reward_fn is the training reward manager, overlong shaping
  // included: its tensor is the "reward" variable (val-aux), the scorer's own value "score".
  auto result = eval::evaluate(s.policy, s.val_rows, s.sampling(true), s.engine_options(s.policy.model),
                               *s.reward, /*progress=*/false, /*chat_template=*/true,
                               s.cfg.data.apply_chat_template_kwargs, overlong_shaping(s.cfg));
  s.optimizer->use_train_weights();
  for (const auto& [source, table] : result.metrics)
    for (const auto& [name, value] : table) m[validation_metric_key(source, name, table)] = value;
  m["timing_s/testing"] = seconds_since(t_testing);  // verl's name for the validation time
  s.logger->log(s.step, m);
  return m;
}

void Trainer::save_model(const std::string& dir) {
  Impl& s = *impl_;
  s.rules->use_export_weights(*s.optimizer);
  if (s.lora) model::save_lora_adapter(s.policy.model, dir, s.cfg.actor_rollout_ref.model.path);
  else s.save_actor(dir);
  s.optimizer->use_train_weights();
}

void Trainer::fit() { fit(ValidationStop{}); }

void Trainer::fit(const ValidationStop& stop) {
  Impl& s = *impl_;
  const auto& t = s.cfg.trainer;
  // As verl and the fork (rpg_ray_trainer.fit): validation before the first step of this
  // process (also after a resume), every test_freq steps and at the last step.
  if (t.val_before_train && !s.val_rows.empty() && s.step < s.total_steps) {
    for (const auto& [k, val] : validate())
      if (k.rfind("val-core/", 0) == 0) log_info(str("before training: ", k, " = ", val));
  }
  ProgressBar bar("train", s.total_steps, "step");
  bar.advance(s.step);
  // Preemption (core/signals.h): polled between steps only, so a step is never half applied.
  // Data-parallel: the ranks agree at each boundary (a signal on any rank stops all after the
  // same step, with one checkpoint that every rank takes part in; each exits 75).
  auto stop_if_signalled = [&] {
    std::string who;
    if (!dp::agree_stop(signals::stop_requested(), &who)) return;
    s.logger->flush(/*durable=*/true);
    std::string saved = "nothing to save before the first step";
    if (!t.save_on_preempt) saved = "no checkpoint written (trainer.save_on_preempt=false)";
    else if (s.step > 0) {
      if (!dp::main_decides(s.run_dir.has_complete(s.step))) s.save_checkpoint();
      s.logger->flush(/*durable=*/true);
      saved = str("checkpoint ", s.run_dir.checkpoint(s.step).string());
    }
    try {  // best effort: the stop (exit 75) is what the caller must see
      s.write_report();
    } catch (const std::exception& e) {
      log_warn(str("report not written: ", e.what()));
    }
    const std::string what = signals::stop_requested() ? signals::stop_signal_name() : "a stop signal";
    throw Preempted(str(what, who.empty() ? "" : str(" (received by ", who, ")"), " at step ", s.step, "/",
                        s.total_steps, ": ", saved, "; run the same command again to resume"));
  };
  while (s.step < s.total_steps) {
    stop_if_signalled();
    Metrics m;
    try {
      m = train_step();
    } catch (const DataExhausted& e) {
      // The step in progress is dropped (its generation batches were used up), as the fork's
      // loop drops its partial batch. rpg still saves the weights trained so far below.
      log_info(str(e.what(), " after step ", s.step, " of ", s.total_steps, ": training ends here, as the fork's "
                   "epoch loop does (rpg.semantics=fork)"));
      break;
    }
    // On a terminal the bar holds the current line without a newline: clear it so the step
    // line takes its place; the bar is redrawn below by advance().
    if (isatty(fileno(stderr))) std::fputs("\r\033[2K", stderr);
    log_info(step_summary(s.step, s.total_steps, m));
    bar.advance(1, str("score=", m["critic/score/mean"], " acc=", m["acc/mean"], " len=", m["response_length/mean"]));
    if (s.step < s.total_steps) stop_if_signalled();
    if (t.test_freq > 0 && (s.step % t.test_freq == 0 || s.step == s.total_steps) && !s.val_rows.empty()) {
      const Metrics val = validate();
      for (const auto& [k, v] : val)
        if (k.rfind("val-core/", 0) == 0) log_info(str("step ", s.step, ": ", k, " = ", v));
      // Every rank validated the same rows, so each reaches the same verdict.
      if (const std::string why = stop ? stop(s.step, val) : std::string(); !why.empty() && s.step < s.total_steps) {
        log_info(str("stopping after step ", s.step, " of ", s.total_steps, ": ", why));
        break;
      }
    }
    if (t.save_freq > 0 && s.step % t.save_freq == 0 && s.step < s.total_steps) s.save_checkpoint();
  }
  bar.finish();
  s.logger->flush(/*durable=*/true);
  if (!dp::main_decides(s.run_dir.has_complete(s.step))) {
    s.save_checkpoint();
    s.logger->flush(/*durable=*/true);
  }
  s.write_report();
  // A run that could not learn is not a success, though what it saved stays.
  const int64_t limit = t.max_skipped_steps.value_or(s.optimizer_steps_total / 10);
  if (s.skipped_total > 0 && (s.skipped_total > limit || s.skipped_total == s.optimizer_steps_total))
    throw Error(str(s.skipped_total, " of ", s.optimizer_steps_total,
                    " optimizer steps were skipped for a non-finite loss or gradient (trainer.max_skipped_steps=",
                    limit, t.max_skipped_steps ? "" : ", 10% of the steps", "): the run did not train as configured; "
                    "its checkpoints in ", s.run_dir.root().string(), " hold what it did"));
}

}  // namespace rpg::train
