#include "rpg/train/trainer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <unistd.h>

#include <algorithm>
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
#include "rpg/core/metrics.h"
#include "rpg/core/progress.h"
#include "rpg/core/rng.h"
#include "rpg/data/dataset.h"
#include "rpg/eval/evaluate.h"
#include "rpg/eval/report.h"
#include "rpg/reward/overlong.h"
#include "rpg/rollout/batch.h"
#include "rpg/rollout/engine.h"
#include "rpg/rollout/policy.h"
#include "rpg/train/checkpoint.h"
#include "rpg/train/resume_check.h"
#include "rpg/train/trainer_testing.h"
#include "rpg/train/optim.h"

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace rpg::train {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One training prompt, rendered and tokenized once.
struct Prompt {
  std::vector<int64_t> ids;
  std::string data_source, ground_truth;
};

std::vector<data::Row> read_rows(const std::vector<std::string>& files, int64_t max_samples, const std::string& key) {
  if (files.empty()) throw ConfigError(str(key, ": no files given"));
  std::vector<data::Row> rows;
  for (const auto& f : files) {
    auto part = data::read_parquet(f);
    rows.insert(rows.end(), std::make_move_iterator(part.begin()), std::make_move_iterator(part.end()));
  }
  if (max_samples >= 0 && static_cast<int64_t>(rows.size()) > max_samples) rows.resize(static_cast<size_t>(max_samples));
  return rows;
}

std::vector<ChatMessage> messages_of(const data::Row& row) {
  std::vector<ChatMessage> m;
  for (const auto& msg : row.prompt) m.push_back({msg.role, msg.content});
  return m;
}

double mean_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

// Masked mean of a [B, T] tensor.
double masked_mean(const at::Tensor& x, const at::Tensor& mask) {
  at::Tensor m = mask.to(x.scalar_type());
  return ((x * m).sum() / m.sum().clamp_min(1)).item<double>();
}

}  // namespace

namespace {

void append_file(const fs::path& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (!f) throw IoError(str("cannot open ", path.string()));
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) throw IoError(str("cannot write ", path.string()));
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

// ---- One training step, phase by phase ----------------------------------------------------

// One prompt's n responses, their scores (after overlong shaping) and correctness.
struct Group {
  const Prompt* prompt = nullptr;
  std::vector<rollout::Response> responses;
  std::vector<double> scores;
  std::vector<bool> acc;
};

// generate_groups: the groups kept for training and what it took to get them.
struct Generation {
  std::vector<Group> kept;
  int64_t rounds = 0, generated_groups = 0, gen_tokens = 0;
  double gen_seconds = 0, reward_seconds = 0;
  std::vector<double> all_scores, all_acc;  // every generated response, kept or not
  std::vector<nlohmann::json> samples;      // this step's lines of samples.jsonl
};

// One generation batch, decoded and scored.
struct ScoredRound {
  std::vector<const Prompt*> prompts;
  std::vector<rollout::Response> responses;
  std::vector<reward::ScoreResult> results;
  std::vector<double> scores;  // results' scores after DAPO overlong shaping
};

// to_batch: the verl layout, outcome scores on each response's last token.
struct StepBatch {
  rollout::Batch batch;
  at::Tensor token_level_scores, lengths;  // [B, T], [B]
  std::vector<double> scores;              // per row
  int64_t finished_by_length = 0;
};

// old_and_ref_log_probs
struct PolicyLogProbs {
  at::Tensor old_log_probs, ref_log_probs;  // ref undefined when no reference is used
  double old_seconds = 0, ref_seconds = 0;
};

// advantages
struct AdvantageResult {
  at::Tensor token_level_rewards, advantages;
  double seconds = 0;
};

// update_actor: every optimizer step's metrics.
struct UpdateStats {
  std::map<std::string, std::vector<double>> loss_metrics;
  std::vector<double> grad_norms;
  int64_t skipped = 0;
  double lr = 0, seconds = 0;
};

}  // namespace

struct Trainer::Impl {
  TrainConfig cfg;
  reward::ScorerRegistry scorers;
  rollout::Policy policy;
  std::unique_ptr<model::CausalLM> reference;  // for KL-to-reference losses (grpo)
  // compute_dtype=bfloat16: the bf16 working copy that runs forward/backward; the optimizer
  // owns the fp32 master weights in policy.model (which also generates).
  std::unique_ptr<model::CausalLM> compute;
  // Iterative reference refreshed on a KL target: the moving average of the token-level
  // KL(pi_old || pi_ref) since the last refresh (none yet after one), and refreshes so far.
  std::optional<double> ref_kl_running;
  int64_t ref_updates = 0;
  rollout::Batch last_batch;
  bool recording = false;
  std::vector<UpdateRecord> updates;
  std::unique_ptr<Optimizer> optimizer;
  LrSchedule schedule;
  std::vector<Prompt> prompts;
  std::vector<data::Row> val_rows;
  RunDir run_dir{""};
  std::unique_ptr<MetricsLogger> logger;
  int64_t step = 0, total_steps = 0, steps_per_epoch = 0;
  double kl_in_reward_coef = 0.0;  // algorithm.kl_ctrl: fixed, or adapted every step
  bool needs_reference = false;
  algo::PolicyLossConfig loss_cfg;
  algo::KlEstimator kl_penalty = algo::KlEstimator::K1;  // algorithm.kl_penalty
  bool recompute_old = true;     // old log-probs: a trainer forward pass, else the rollout's
  bool filter_by_acc = true;     // dynamic sampling metric: acc, else score
  bool adaptive_kl_ctrl = false;  // algorithm.kl_ctrl.type adaptive
  int64_t consecutive_skips = 0;   // optimizer steps skipped in a row for a non-finite gradient
  // Data position: epoch and cursor in that epoch's order.
  int64_t epoch = 0, cursor = 0;
  std::vector<int64_t> order;

  Impl(TrainConfig c, reward::ScorerRegistry s)
      : cfg(std::move(c)),
        scorers(std::move(s)),
        policy(rollout::load_policy(cfg.actor_rollout_ref.model.path, "float32", cfg.trainer.device)) {
    recompute_old = cfg.choices.old_log_prob_source == OldLogProbSource::kRecompute;
    filter_by_acc = cfg.choices.filter_metric == FilterMetric::kAcc;
    adaptive_kl_ctrl = cfg.choices.kl_ctrl == KlControlType::kAdaptive;
  }

  void set_epoch(int64_t e) {
    epoch = e;
    cursor = 0;
    const int64_t n = static_cast<int64_t>(prompts.size());
    if (cfg.data.shuffle) {
      order = random_permutation(n, mix_key(static_cast<uint64_t>(cfg.data.seed.value_or(cfg.trainer.seed)),
                                            static_cast<uint64_t>(e)));
    } else {
      order.resize(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), 0);
    }
  }

  // The next `k` prompts of the data stream. Like verl's DataLoader(drop_last=True), an
  // epoch's last partial batch is skipped and the next epoch starts.
  std::vector<const Prompt*> next_prompts(int64_t k) {
    if (cursor + k > static_cast<int64_t>(order.size())) set_epoch(epoch + 1);
    std::vector<const Prompt*> out;
    for (int64_t i = 0; i < k; ++i) out.push_back(&prompts[static_cast<size_t>(order[static_cast<size_t>(cursor++)])]);
    return out;
  }

  algo::PolicyLossConfig loss_config() const {
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

  rollout::SamplingParams sampling(bool validation) const {
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

  // The model that runs the trainer's forward/backward passes: the bf16 copy or the master.
  model::CausalLM& compute_model() { return compute ? *compute : policy.model; }
  // The bf16 copy takes the master weights' current values (after every optimizer step and
  // every schedule-free train/eval switch).
  void sync_compute_weights() {
    if (compute) compute->copy_parameters_from(policy.model);
  }
  // Moves the bf16 copy's gradients of one micro-batch into the fp32 master gradients, so that
  // accumulation over micro-batches happens in fp32.
  void move_compute_grads() {
    if (!compute) return;
    c10::NoGradGuard no_grad;
    auto master = policy.model.parameters(), work = compute->parameters();
    for (size_t i = 0; i < master.size(); ++i) {
      if (!work[i].grad().defined()) continue;
      at::Tensor g = work[i].grad().to(at::kFloat);
      if (master[i].grad().defined()) master[i].mutable_grad().add_(g);
      else master[i].mutable_grad() = g;
      work[i].mutable_grad() = at::Tensor();
    }
  }

  // Log-probs of the batch's responses under `m` without gradient, in micro-batches.
  at::Tensor log_probs_no_grad(const model::CausalLM& m, const rollout::Batch& b, double temperature) {
    c10::NoGradGuard no_grad;
    std::vector<at::Tensor> parts;
    for (const auto& rows : micro_batches(b)) {
      rollout::Batch mb = b.select(rows);
      model::LogProbOptions lo;
      lo.temperature = temperature;
      parts.push_back(m.log_probs(mb.get("input_ids"), mb.get("attention_mask"), mb.get("position_ids"),
                                  mb.get("responses"), lo)
                          .log_probs);
    }
    // Micro-batches may reorder rows (token packing); put them back.
    at::Tensor out = at::empty_like(b.get("responses"), at::TensorOptions().dtype(at::kFloat));
    size_t k = 0;
    for (const auto& rows : micro_batches(b)) {
      out.index_copy_(0, at::tensor(rows, at::kLong), parts[k++]);
    }
    return out;
  }

  // Settings a resumed run must share with the run that wrote the checkpoint.
  nlohmann::json fingerprint() const {
    return {{"model_path", cfg.actor_rollout_ref.model.path},
            {"train_batch_size", cfg.data.train_batch_size},
            {"rollout_n", cfg.actor_rollout_ref.rollout.n},
            {"ppo_mini_batch_size", cfg.actor_rollout_ref.actor.ppo_mini_batch_size},
            {"optim_type", cfg.actor_rollout_ref.actor.optim.optim_type}};
  }

  // A checkpoint (layout: RunDir) written into a temporary directory and published by one
  // rename; latest_checkpointed_iteration.txt (verl's marker) is updated after it.
  void save_checkpoint() {
    AtomicDir out(run_dir.checkpoint(step));
    optimizer->use_eval_weights();
    model::SaveOptions so;
    so.copy_files_from = cfg.actor_rollout_ref.model.path;
    policy.model.save_pretrained(out.path() / "actor", so);
    optimizer->use_train_weights();
    std::map<std::string, at::Tensor> tensors;
    for (const auto& [name, p] : policy.model.named_parameters()) tensors["param." + name] = p;
    OptimizerState os = optimizer->state();
    for (const auto& [k, t] : os.tensors) tensors["optim." + k] = t;
    if (reference)
      for (const auto& [name, p] : reference->named_parameters()) tensors["ref." + name] = p;
    save_tensor_file(out.path() / "train_state.safetensors", tensors);
    write_train_state(out.path(), {{"step", step}, {"epoch", epoch}, {"cursor", cursor},
                                   {"kl_in_reward_coef", kl_in_reward_coef}, {"optimizer", os.scalars},
                                   {"config", fingerprint()}, {"ref_updates", ref_updates},
                                   {"ref_kl_running", ref_kl_running ? nlohmann::json(*ref_kl_running) : nlohmann::json()}});
    save_checkpoint_config(out.path(), cfg);
    out.commit();
    run_dir.mark_latest(step);
    run_dir.prune(cfg.trainer.max_actor_ckpt_to_keep);
    eval::write_report(run_dir.root());
  }

  // The checkpoints to resume from, best first (empty: start fresh).
  std::vector<fs::path> resume_candidates() const {
    const auto& t = cfg.trainer;
    if (cfg.choices.resume_mode == ResumeMode::kDisable) return {};
    if (cfg.choices.resume_mode == ResumeMode::kResumePath) {
      if (!RunDir::is_complete(*t.resume_path))
        throw ConfigError(str("trainer.resume_path: ", *t.resume_path, " is not a complete rpg checkpoint"));
      return {*t.resume_path};
    }
    return run_dir.resume_candidates();
  }

  // Loads the first candidate that is complete and intact; a damaged one is reported and
  // skipped. Returns false when there is nothing to resume from.
  bool resume() {
    const auto candidates = resume_candidates();
    for (const auto& dir : candidates) {
      try {
        if (!RunDir::is_complete(dir)) throw FormatError(str(dir.string(), " is not a complete checkpoint"));
        load_checkpoint(dir);
        return true;
      } catch (const ConfigError&) {
        throw;  // an incompatible configuration is the user's decision, not damage
      } catch (const Error& e) {
        if (cfg.choices.resume_mode == ResumeMode::kResumePath) throw;
        log_warn(str("skipping damaged checkpoint: ", e.what()));
      }
    }
    if (!candidates.empty())
      throw FormatError(str("no intact checkpoint in ", run_dir.root().string(),
                            " (set trainer.resume_mode=disable to start over)"));
    return false;
  }

  void load_checkpoint(const fs::path& dir) {
    auto state = read_train_state(dir);
    const auto want = fingerprint();
    for (const auto& [key, value] : want.items())
      if (state["config"][key] != value)
        throw ConfigError(str("cannot resume from ", dir.string(), ": ", key, " was ", state["config"][key].dump(),
                              ", the config now says ", value.dump(), " (use trainer.resume_mode=disable or another "
                              "trainer.default_local_dir to start over)"));
    auto tensors = load_tensor_file(dir / "train_state.safetensors");
    {
      c10::NoGradGuard no_grad;
      auto copy_into = [&](const std::string& prefix, const model::CausalLM& m) {
        for (const auto& [name, p] : m.named_parameters()) {
          auto it = tensors.find(prefix + name);
          if (it == tensors.end() || it->second.sizes() != p.sizes())
            throw FormatError(str(dir.string(), "/train_state.safetensors: missing or mis-shaped '", prefix, name, "'"));
          p.detach().copy_(it->second);
        }
      };
      copy_into("param.", policy.model);
      if (reference) copy_into("ref.", *reference);
    }
    OptimizerState os;
    for (const auto& [k, t] : tensors)
      if (k.rfind("optim.", 0) == 0) os.tensors[k.substr(6)] = t;
    os.scalars = state["optimizer"].get<std::map<std::string, double>>();
    optimizer->load_state(os);
    step = state["step"].get<int64_t>();
    kl_in_reward_coef = state["kl_in_reward_coef"].get<double>();
    // Absent in checkpoints written before the KL-target refresh existed.
    ref_updates = state.value("ref_updates", int64_t{0});
    ref_kl_running.reset();
    if (state.contains("ref_kl_running") && state["ref_kl_running"].is_number())
      ref_kl_running = state["ref_kl_running"].get<double>();
    set_epoch(state["epoch"].get<int64_t>());
    cursor = state["cursor"].get<int64_t>();
    log_info(str("resumed from ", dir.string(), " at step ", step));
    report_config_changes(dir, cfg);
  }

  std::vector<std::vector<int64_t>> micro_batches(const rollout::Batch& b) const {
    const auto& a = cfg.actor_rollout_ref.actor;
    if (a.use_dynamic_bsz) {
      at::Tensor lengths = b.get("attention_mask").sum(1);
      std::vector<int64_t> l(lengths.data_ptr<int64_t>(), lengths.data_ptr<int64_t>() + lengths.numel());
      return rollout::split_by_tokens(l, a.ppo_max_token_len_per_gpu);
    }
    return rollout::split_by_rows(b.rows(), a.ppo_micro_batch_size_per_gpu.value_or(b.rows()));
  }

  // ---- construction -----------------------------------------------------------------------

  // Training prompts rendered like verl's RLHFDataset (over-long ones filtered or truncated),
  // validation rows, and the step count.
  void load_data() {
    auto rows = read_rows(cfg.data.train_files, cfg.data.train_max_samples, "data.train_files");
    for (const auto& r : rows) (void)scorers.find(r.data_source);
    for (size_t i = 0; i < rows.size(); ++i) {
      Prompt p;
      p.ids = rollout::render_prompt(policy.tokenizer, messages_of(rows[i]));
      p.data_source = rows[i].data_source;
      p.ground_truth = rows[i].reward_model.ground_truth;
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
    steps_per_epoch = static_cast<int64_t>(prompts.size()) / cfg.data.train_batch_size;
    total_steps = cfg.trainer.total_training_steps.value_or(steps_per_epoch * cfg.trainer.total_epochs);
    set_epoch(0);
  }

  // Optimizer and LR schedule (verl's rules).
  void build_optimizer() {
    const auto& o = cfg.actor_rollout_ref.actor.optim;
    OptimizerOptions oo;
    oo.type = o.optim_type;
    oo.lr = o.lr;
    oo.beta1 = o.betas[0];
    oo.beta2 = o.betas[1];
    oo.weight_decay = o.weight_decay;
    const int64_t warmup = resolve_warmup_steps(o.lr_warmup_steps, o.lr_warmup_steps_ratio, total_steps);
    oo.warmup_steps = warmup;
    optimizer = make_optimizer(oo, policy.model.named_parameters());
    schedule = LrSchedule{o.warmup_style.value_or(o.lr_scheduler_type), warmup, total_steps, o.min_lr_ratio,
                          o.num_cycles};
  }

  // The reference policy (for a KL-to-reference loss and for KL in the reward: the initial
  // weights, or the policy of every ref_update_freq steps when iterative; with the iterative
  // reference refreshed every step pi_ref = pi_old and no second model is resident) and the
  // bf16 compute copy.
  void build_models() {
    const auto& actor = cfg.actor_rollout_ref.actor;
    const auto& path = cfg.actor_rollout_ref.model.path;
    kl_in_reward_coef = cfg.algorithm.kl_ctrl.kl_coef;
    needs_reference = cfg.choices.kl_loss_uses_reference || cfg.algorithm.use_kl_in_reward;
    if (needs_reference && !(actor.use_iterative_ref_model && actor.ref_update_freq == 1)) {
      reference = std::make_unique<model::CausalLM>(
          model::CausalLM::from_pretrained(path, {at::kFloat, policy.model.device()}));
      reference->set_requires_grad(false);
    }
    if (cfg.choices.compute_dtype == ComputeDtype::kBFloat16) {
      compute = std::make_unique<model::CausalLM>(
          model::CausalLM::from_pretrained(path, {at::kBFloat16, policy.model.device()}));
      compute->set_requires_grad(true);
      compute->set_gradient_checkpointing(cfg.actor_rollout_ref.model.enable_gradient_checkpointing);
    }
  }

  // The run directory: a killed checkpoint write's temporary directory removed, the newest
  // intact checkpoint loaded, the logs of steps after it (a crashed run's tail) dropped.
  void open_run_dir() {
    run_dir = RunDir(cfg.trainer.default_local_dir);
    run_dir.remove_partial();
    resume();
    logger = std::make_unique<MetricsLogger>(run_dir.root(), /*tensorboard=*/true, step + 1);
    jsonl::keep_steps(run_dir.root() / "samples.jsonl", [&](int64_t st) { return st <= step; });
  }

  // ---- train_step's phases --------------------------------------------------------------

  // Phase 1: generate and score until train_batch_size groups survive dynamic sampling.
  Generation generate_groups() {
    const auto& fg = cfg.algorithm.filter_groups;
    const int64_t gen_batch = cfg.data.gen_batch_size.value_or(cfg.data.train_batch_size);
    rollout::RolloutEngine engine(policy.model, {cfg.actor_rollout_ref.rollout.max_num_seqs, 0});
    Generation gen;
    optimizer->use_train_weights();
    while (static_cast<int64_t>(gen.kept.size()) < cfg.data.train_batch_size) {
      if (gen.rounds > 0 && fg.max_num_gen_batches > 0 && gen.rounds >= fg.max_num_gen_batches)
        throw ValueError(str("dynamic sampling: ", gen.rounds, " generation batches gave only ", gen.kept.size(),
                             " of ", cfg.data.train_batch_size, " groups with varying ", fg.metric,
                             "; raise algorithm.filter_groups.max_num_gen_batches or check the data"));
      ++gen.rounds;
      const ScoredRound round = generate_round(engine, next_prompts(gen_batch), gen);
      keep_groups(round, gen);
      if (!fg.enable) break;
    }
    gen.kept.resize(
        static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(gen.kept.size()), cfg.data.train_batch_size)));
    return gen;
  }

  // One generation batch: sampled with the live weights, decoded, scored, overlong-shaped;
  // the first responses of the step also go to `gen.samples`.
  ScoredRound generate_round(rollout::RolloutEngine& engine, std::vector<const Prompt*> prompts, Generation& gen) {
    ScoredRound r;
    r.prompts = std::move(prompts);
    std::vector<std::vector<int64_t>> ids;
    for (const auto* p : r.prompts) ids.push_back(p->ids);
    rollout::SamplingParams sp = sampling(false);
    sp.seed = mix_key(static_cast<uint64_t>(cfg.trainer.seed), static_cast<uint64_t>(step),
                      static_cast<uint64_t>(gen.rounds));
    const auto t_gen = Clock::now();
    r.responses = engine.generate(ids, sp);
    gen.gen_seconds += seconds_since(t_gen);
    gen.gen_tokens += engine.last_stats().generated_tokens;

    std::vector<std::string> texts;
    std::vector<reward::ScoreRequest> requests;
    texts.reserve(r.responses.size());
    for (const auto& resp : r.responses) {
      std::vector<TokenId> tid(resp.token_ids.begin(), resp.token_ids.end());
      texts.push_back(policy.tokenizer.decode(tid, /*skip_special_tokens=*/true));
    }
    for (size_t i = 0; i < r.responses.size(); ++i) {
      const Prompt* p = r.prompts[static_cast<size_t>(r.responses[i].prompt_index)];
      requests.push_back({p->data_source, texts[i], p->ground_truth});
    }
    const auto t_reward = Clock::now();
    r.results = reward::score_batch(scorers, requests);
    gen.reward_seconds += seconds_since(t_reward);
    for (size_t i = 0; i < r.responses.size() && static_cast<int64_t>(gen.samples.size()) < cfg.trainer.sample_log_count;
         ++i) {
      const auto& pids = r.prompts[static_cast<size_t>(r.responses[i].prompt_index)]->ids;
      std::vector<TokenId> pid(pids.begin(), pids.end());
      gen.samples.push_back({{"step", step + 1}, {"prompt", policy.tokenizer.decode(pid)}, {"response", texts[i]},
                             {"score", r.results[i].score}, {"acc", r.results[i].acc},
                             {"ground_truth", requests[i].ground_truth}});
    }
    std::vector<int64_t> lengths;
    for (size_t i = 0; i < r.responses.size(); ++i) {
      lengths.push_back(static_cast<int64_t>(r.responses[i].token_ids.size()));
      r.scores.push_back(r.results[i].score);
    }
    const reward::OverlongConfig overlong{cfg.reward_model.overlong_buffer.enable, cfg.reward_model.overlong_buffer.len,
                                          cfg.reward_model.overlong_buffer.penalty_factor, cfg.data.max_response_length};
    reward::apply_overlong_penalty(overlong, lengths, r.scores);
    return r;
  }

  // Splits a round into groups of n and keeps them; with dynamic sampling (DAPO) a group whose
  // metric is the same for every response has zero advantage and is dropped.
  void keep_groups(const ScoredRound& r, Generation& gen) const {
    const auto& fg = cfg.algorithm.filter_groups;
    const int64_t n = cfg.actor_rollout_ref.rollout.n;
    for (size_t g = 0; g < r.prompts.size(); ++g) {
      Group grp{r.prompts[g], {}, {}, {}};
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

  // Phase 2: the kept groups in verl's layout, outcome scores on each response's last token.
  StepBatch to_batch(const Generation& gen) const {
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

  // Phase 3: old (sampling-policy) log-probs recomputed by the trainer (in the compute dtype,
  // so that the first update's ratio is 1 in the precision it is computed in) or taken from
  // the rollout, and the reference's (pi_old itself when the reference is refreshed every step).
  PolicyLogProbs old_and_ref_log_probs(const StepBatch& sb, Metrics& m) {
    const auto& actor = cfg.actor_rollout_ref.actor;
    const double temperature = cfg.actor_rollout_ref.rollout.temperature;
    const at::Tensor& mask = sb.batch.get("response_mask");
    PolicyLogProbs lp;
    auto t_old = Clock::now();
    sync_compute_weights();
    lp.old_log_probs = recompute_old ? log_probs_no_grad(compute_model(), sb.batch, temperature)
                                     : sb.batch.get("rollout_log_probs");
    lp.old_seconds = seconds_since(t_old);
    auto t_ref = Clock::now();
    if (reference) lp.ref_log_probs = log_probs_no_grad(*reference, sb.batch, temperature);
    else if (needs_reference) lp.ref_log_probs = lp.old_log_probs;
    lp.ref_seconds = seconds_since(t_ref);
    if (reference && actor.ref_kl_target > 0) {
      // Paper Section 5: the token-level KL(pi_old || pi_ref) (k3, exact in expectation over
      // pi_old's samples), averaged over the step's response tokens, then over steps.
      const double kl = masked_mean(algo::kl_estimate(lp.old_log_probs, lp.ref_log_probs, algo::KlEstimator::K3), mask);
      ref_kl_running = ref_kl_running ? (1 - actor.ref_kl_ema) * *ref_kl_running + actor.ref_kl_ema * kl : kl;
      m["actor/ref_kl_moving_avg"] = *ref_kl_running;
    }
    if (recompute_old) {
      // Rollout/trainer mismatch: the engine's sampling log-probs vs the recomputation.
      const at::Tensor valid = mask.to(at::kBool);
      const at::Tensor diff = (lp.old_log_probs - sb.batch.get("rollout_log_probs")).masked_select(valid);
      if (diff.numel() > 0) {
        m["training/rollout_log_prob_diff_mean"] = diff.abs().mean().item<double>();
        m["training/rollout_log_prob_diff_max"] = diff.abs().max().item<double>();
        m["training/rollout_is_weight_min"] = diff.exp().min().item<double>();
        m["training/rollout_is_weight_max"] = diff.exp().max().item<double>();
      }
    }
    return lp;
  }

  // Phase 4: rewards (KL-penalised with algorithm.use_kl_in_reward, REINFORCE++) and
  // advantages on the whole batch.
  AdvantageResult advantages(const StepBatch& sb, const PolicyLogProbs& lp, Metrics& m) {
    const at::Tensor& mask = sb.batch.get("response_mask");
    AdvantageResult out;
    out.token_level_rewards = sb.token_level_scores;
    if (cfg.algorithm.use_kl_in_reward) {
      const auto estimator = kl_penalty;
      out.token_level_rewards = algo::apply_kl_penalty(sb.token_level_scores, lp.old_log_probs, lp.ref_log_probs, mask,
                                                       kl_in_reward_coef, estimator);
      // The batch's KL (mean over rows of each row's token mean), as verl's controller sees it.
      at::Tensor kl = algo::kl_estimate(lp.old_log_probs, lp.ref_log_probs, estimator) * mask;
      const double current_kl = (kl.sum(1) / mask.sum(1).clamp_min(1)).mean().item<double>();
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
    out.advantages = algo::compute_advantage(cfg.algorithm.adv_estimator, ai).advantages;
    out.seconds = seconds_since(t_adv);
    return out;
  }

  // Phase 5: ppo_epochs x mini-batches (whole groups) x micro-batches of the policy loss, one
  // optimizer step per mini-batch. `batch` carries old_log_probs, ref_log_probs, advantages.
  UpdateStats update_actor(const rollout::Batch& batch) {
    const auto& actor = cfg.actor_rollout_ref.actor;
    const algo::PolicyLossConfig& lc = loss_cfg;
    UpdateStats stats;
    // The LR the first update of the step uses (schedule-free AdamW: its own warm-up).
    stats.lr = optimizer->lr_of_next_step(actor.optim.lr * schedule.factor(optimizer->step_count()));
    const int64_t rows_per_mini =
        std::min<int64_t>(actor.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n, batch.rows());
    const auto t_update = Clock::now();
    updates.clear();
    for (int64_t e = 0; e < actor.ppo_epochs; ++e) {
      std::vector<int64_t> row_order(static_cast<size_t>(batch.rows()));
      std::iota(row_order.begin(), row_order.end(), 0);
      if (actor.shuffle && e > 0)
        row_order = random_permutation(batch.rows(), mix_key(static_cast<uint64_t>(cfg.trainer.seed), step, e));
      for (int64_t start = 0; start < batch.rows(); start += rows_per_mini) {
        std::vector<int64_t> mini_rows(row_order.begin() + start,
                                       row_order.begin() + std::min<int64_t>(batch.rows(), start + rows_per_mini));
        update_mini_batch(batch, mini_rows, lc, stats);
      }
    }
    stats.seconds = seconds_since(t_update);
    return stats;
  }

  // One optimizer step: forward/backward of every micro-batch (gradients accumulate in fp32,
  // each loss normalised by the whole mini-batch), clip, step. A non-finite gradient norm
  // skips the step; too many skips in a row stop the run.
  void update_mini_batch(const rollout::Batch& batch, const std::vector<int64_t>& mini_rows,
                         const algo::PolicyLossConfig& lc, UpdateStats& stats) {
    const auto& actor = cfg.actor_rollout_ref.actor;
    rollout::Batch mini = batch.select(mini_rows);
    const double normaliser = algo::loss_normaliser(mini.get("response_mask"), lc.loss_agg_mode);
    UpdateRecord record;
    if (recording) {
      record.rows = mini_rows;
      for (const auto& p : policy.model.parameters()) record.weights.push_back(p.detach().clone());
    }
    sync_compute_weights();
    for (const auto& rows : micro_batches(mini)) {
      auto out = micro_batch_loss(mini.select(rows), lc, normaliser);
      out.loss.backward();
      move_compute_grads();
      if (recording) record.loss += out.loss.item<double>();
      for (const auto& [k, v] : out.metrics) stats.loss_metrics[k].push_back(v.item<double>());
    }
    if (recording) {
      for (const auto& p : policy.model.parameters())
        record.grads.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
      updates.push_back(std::move(record));
    }
    const double norm = clip_grad_norm(optimizer->params(), actor.grad_clip);
    stats.grad_norms.push_back(norm);
    if (std::isfinite(norm)) {
      optimizer->step(stats.lr);
      consecutive_skips = 0;
    } else {
      // A non-finite loss or gradient: the update is skipped, the weights stay as they were.
      ++stats.skipped;
      ++consecutive_skips;
      log_warn(str("step ", step + 1, ": non-finite gradient norm, optimizer step skipped"));
    }
    optimizer->zero_grad();
    if (consecutive_skips >= cfg.trainer.max_consecutive_skips)
      throw Error(str("stopping: ", consecutive_skips, " optimizer steps in a row had a non-finite loss or "
                      "gradient (trainer.max_consecutive_skips); the last checkpoint in ",
                      run_dir.root().string(), " is intact"));
  }

  // The policy loss of one micro-batch (differentiable), under the compute model.
  algo::PolicyLossOutput micro_batch_loss(const rollout::Batch& mb, const algo::PolicyLossConfig& lc,
                                          double normaliser) {
    const auto& actor = cfg.actor_rollout_ref.actor;
    model::LogProbOptions lo;
    lo.temperature = cfg.actor_rollout_ref.rollout.temperature;
    lo.with_entropy = true;
    auto lp = compute_model().log_probs(mb.get("input_ids"), mb.get("attention_mask"), mb.get("position_ids"),
                                        mb.get("responses"), lo);
    algo::PolicyLossInputs in;
    in.log_probs = lp.log_probs;
    in.old_log_probs = mb.get("old_log_probs");
    if (mb.has("ref_log_probs")) in.ref_log_probs = mb.get("ref_log_probs");
    in.rollout_log_probs = mb.get("rollout_log_probs");
    in.advantages = mb.get("advantages");
    in.response_mask = mb.get("response_mask");
    in.entropy = actor.entropy_coeff != 0.0 ? lp.entropy : lp.entropy.detach();
    in.normaliser = normaliser;
    return algo::compute_policy_loss(actor.policy_loss, in, lc);
  }

  // Phase 6: the iterative reference becomes the current policy every ref_update_freq steps,
  // or (paper Section 5) when the moving-average token KL to it exceeds the target. Runs after
  // the step counter has advanced.
  void refresh_reference(Metrics& m) {
    const auto& actor = cfg.actor_rollout_ref.actor;
    if (!reference || !actor.use_iterative_ref_model) return;
    const bool by_count = actor.ref_update_freq > 0 && step % actor.ref_update_freq == 0;
    const bool by_kl = actor.ref_kl_target > 0 && ref_kl_running && *ref_kl_running > actor.ref_kl_target;
    if (by_count || by_kl) {
      reference->copy_parameters_from(policy.model);  // the weights that sample, as pi_old
      ++ref_updates;
      ref_kl_running.reset();  // the KL to the new reference starts at zero
    }
    m["actor/ref_updates"] = static_cast<double>(ref_updates);
  }

  // Phase 7: the step's metrics, with verl's names.
  void step_metrics(const Generation& gen, const StepBatch& sb, const AdvantageResult& adv, const UpdateStats& up,
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
    m["acc/mean"] = mean_of(gen.all_acc);
    m["acc/generated_score_mean"] = mean_of(gen.all_scores);
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
    m["perf/gen_tokens_per_s"] = gen.gen_seconds > 0 ? static_cast<double>(gen.gen_tokens) / gen.gen_seconds : 0.0;
  }

  // The step's metrics line and sample generations, written after the step.
  void log_step(const Metrics& m, const std::vector<nlohmann::json>& samples) {
    logger->log(step, m);
    if (cfg.trainer.sample_log_freq > 0 && step % cfg.trainer.sample_log_freq == 0) {
      std::string lines;
      for (const auto& j : samples) lines += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
      append_file(run_dir.root() / "samples.jsonl", lines);
    }
  }
};

Trainer::Trainer(TrainConfig config, reward::ScorerRegistry scorers) {
  for (const auto& notice : config.resolve()) log_info(notice);
  config.validate();
  if (config.actor_rollout_ref.model.path.empty())
    throw ConfigError("actor_rollout_ref.model.path: required (a Hugging Face model directory)");
  impl_ = std::make_unique<Impl>(std::move(config), std::move(scorers));
  Impl& s = *impl_;
  const auto& cfg = s.cfg;
  at::manual_seed(static_cast<uint64_t>(cfg.trainer.seed));
  s.policy.model.set_gradient_checkpointing(cfg.actor_rollout_ref.model.enable_gradient_checkpointing);
  (void)algo::advantage_registry().get(cfg.algorithm.adv_estimator);  // unknown names fail now, not at step 1
  (void)algo::policy_loss_registry().get(cfg.actor_rollout_ref.actor.policy_loss);
  s.loss_cfg = s.loss_config();  // the loss's string keys parsed once
  s.kl_penalty = algo::parse_kl_estimator(cfg.algorithm.kl_penalty);
  s.load_data();
  s.build_optimizer();
  s.build_models();
  s.open_run_dir();
  log_info(str("train: ", s.prompts.size(), " prompts, ", s.steps_per_epoch, " steps per epoch, ", s.total_steps,
               " steps; policy loss ", cfg.actor_rollout_ref.actor.policy_loss, ", advantages ",
               cfg.algorithm.adv_estimator, "; run dir ", s.run_dir.root().string()));
}

Trainer::~Trainer() = default;

int64_t Trainer::global_step() const { return impl_->step; }
bool Trainer::has_reference_model() const { return impl_->reference != nullptr; }
int64_t Trainer::total_steps() const { return impl_->total_steps; }
const model::CausalLM& Trainer::model() const { return impl_->policy.model; }
const rollout::Batch& Trainer::last_batch() const { return impl_->last_batch; }
void TrainerTesting::record_updates(Trainer& t, bool on) { t.impl_->recording = on; }
const std::vector<UpdateRecord>& TrainerTesting::last_updates(const Trainer& t) { return t.impl_->updates; }

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
  Metrics m;
  const Generation gen = s.generate_groups();
  StepBatch sb = s.to_batch(gen);
  const PolicyLogProbs lp = s.old_and_ref_log_probs(sb, m);
  const AdvantageResult adv = s.advantages(sb, lp, m);
  sb.batch.set("old_log_probs", lp.old_log_probs);
  if (lp.ref_log_probs.defined()) sb.batch.set("ref_log_probs", lp.ref_log_probs);
  sb.batch.set("advantages", adv.advantages);
  const UpdateStats up = s.update_actor(sb.batch);
  ++s.step;
  s.refresh_reference(m);
  s.step_metrics(gen, sb, adv, up, m);
  m["timing_s/old_log_prob"] = lp.old_seconds;
  m["timing_s/ref"] = lp.ref_seconds;
  m["timing_s/adv"] = adv.seconds;
  m["timing_s/step"] = seconds_since(t_step);
  s.last_batch = std::move(sb.batch);
  s.log_step(m, gen.samples);
  return m;
}

Metrics Trainer::validate() {
  Impl& s = *impl_;
  Metrics m;
  if (s.val_rows.empty()) return m;
  s.optimizer->use_eval_weights();
  auto result = eval::evaluate(s.policy, s.val_rows, s.sampling(true), {s.cfg.actor_rollout_ref.rollout.max_num_seqs, 0},
                               s.scorers, /*progress=*/false);
  s.optimizer->use_train_weights();
  for (const auto& [source, table] : result.metrics)
    for (const auto& [name, value] : table) m[str("val-core/", source, "/", name)] = value;
  s.logger->log(s.step, m);
  return m;
}

void Trainer::save_model(const std::string& dir) {
  Impl& s = *impl_;
  s.optimizer->use_eval_weights();
  model::SaveOptions so;
  so.copy_files_from = s.cfg.actor_rollout_ref.model.path;
  s.policy.model.save_pretrained(dir, so);
  s.optimizer->use_train_weights();
}

void Trainer::fit() {
  Impl& s = *impl_;
  const auto& t = s.cfg.trainer;
  if (t.val_before_train && !s.val_rows.empty() && s.step == 0) {
    for (const auto& [k, val] : validate()) log_info(str("before training: ", k, " = ", val));
  }
  ProgressBar bar("train", s.total_steps, "step");
  bar.advance(s.step);
  while (s.step < s.total_steps) {
    auto m = train_step();
    // On a terminal the bar holds the current line without a newline: clear it so the step
    // line takes its place; the bar is redrawn below by advance().
    if (isatty(fileno(stderr))) std::fputs("\r\033[2K", stderr);
    log_info(step_summary(s.step, s.total_steps, m));
    bar.advance(1, str("score=", m["critic/score/mean"], " acc=", m["acc/mean"], " len=", m["response_length/mean"]));
    if (t.test_freq > 0 && s.step % t.test_freq == 0 && !s.val_rows.empty()) {
      for (const auto& [k, val] : validate()) log_info(str("step ", s.step, ": ", k, " = ", val));
    }
    if (t.save_freq > 0 && s.step % t.save_freq == 0 && s.step < s.total_steps) s.save_checkpoint();
  }
  bar.finish();
  s.logger->flush(/*durable=*/true);
  if (!s.run_dir.has_complete(s.step)) s.save_checkpoint();
}

}  // namespace rpg::train
