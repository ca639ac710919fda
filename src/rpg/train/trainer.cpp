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

double adaptive_kl_coef(double coef, double current_kl, double target_kl, int64_t horizon, int64_t n) {
  const double error = std::clamp(current_kl / target_kl - 1.0, -0.2, 0.2);
  return coef * (1.0 + error * static_cast<double>(n) / static_cast<double>(horizon));
}

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
  fs::path run_dir;
  std::unique_ptr<MetricsLogger> logger;
  int64_t step = 0, total_steps = 0, steps_per_epoch = 0;
  double kl_in_reward_coef = 0.0;  // algorithm.kl_ctrl: fixed, or adapted every step
  bool needs_reference = false;
  int64_t consecutive_skips = 0;   // optimizer steps skipped in a row for a non-finite gradient
  // Data position: epoch and cursor in that epoch's order.
  int64_t epoch = 0, cursor = 0;
  std::vector<int64_t> order;

  Impl(TrainConfig c, reward::ScorerRegistry s)
      : cfg(std::move(c)),
        scorers(std::move(s)),
        policy(rollout::load_policy(cfg.actor_rollout_ref.model.path, "float32", cfg.trainer.device)) {}

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

  // global_step_<N>/ = actor/ (Hugging Face model, evaluation weights) + train_state.* (the
  // exact training weights, optimizer, reference, data position), published by one rename;
  // latest_checkpointed_iteration.txt (verl's marker) is updated after it.
  void save_checkpoint() {
    const fs::path dir = run_dir / str("global_step_", step);
    AtomicDir out(dir);
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
    nlohmann::json state = {{"step", step}, {"epoch", epoch}, {"cursor", cursor}, {"kl_in_reward_coef", kl_in_reward_coef},
                            {"optimizer", os.scalars}, {"config", fingerprint()}, {"ref_updates", ref_updates},
                            {"ref_kl_running", ref_kl_running ? nlohmann::json(*ref_kl_running) : nlohmann::json()}};
    write_file_atomic(out.path() / "train_state.json", state.dump(2) + "\n");
    save_checkpoint_config(out.path(), cfg);
    out.commit();
    write_file_atomic(run_dir / "latest_checkpointed_iteration.txt", std::to_string(step) + "\n");
    prune_checkpoints();
    eval::write_report(run_dir);
  }

  // Complete-looking checkpoint directories global_step_<N> (no temporary suffix), newest first.
  std::vector<std::pair<int64_t, fs::path>> checkpoint_dirs() const {
    std::vector<std::pair<int64_t, fs::path>> steps;
    if (!fs::is_directory(run_dir)) return steps;
    for (const auto& e : fs::directory_iterator(run_dir)) {
      const std::string name = e.path().filename().string();
      if (e.is_directory() && name.rfind("global_step_", 0) == 0 && name.size() > 12 &&
          std::all_of(name.begin() + 12, name.end(), ::isdigit))
        steps.emplace_back(std::stoll(name.substr(12)), e.path());
    }
    std::sort(steps.rbegin(), steps.rend());
    return steps;
  }

  void prune_checkpoints() {
    const auto keep = cfg.trainer.max_actor_ckpt_to_keep;
    if (!keep || *keep <= 0) return;
    const auto steps = checkpoint_dirs();
    for (size_t i = static_cast<size_t>(*keep); i < steps.size(); ++i) fs::remove_all(steps[i].second);
  }

  // The checkpoints to resume from, best first (empty: start fresh). resume_mode auto takes
  // the one the latest marker names, then every other global_step_N, newest first, so a
  // damaged newest checkpoint falls back to the previous complete one.
  std::vector<fs::path> resume_candidates() const {
    const auto& t = cfg.trainer;
    if (t.resume_mode == "disable") return {};
    if (t.resume_mode == "resume_path") {
      if (!fs::exists(fs::path(*t.resume_path) / "train_state.json"))
        throw ConfigError(str("trainer.resume_path: ", *t.resume_path, " is not a complete rpg checkpoint"));
      return {*t.resume_path};
    }
    std::vector<fs::path> out;
    const fs::path marker = run_dir / "latest_checkpointed_iteration.txt";
    if (fs::exists(marker)) {
      std::string text = read_file(marker);
      out.push_back(run_dir / str("global_step_", text.substr(0, text.find_first_of("\r\n"))));
    }
    for (const auto& [n, p] : checkpoint_dirs())
      if (out.empty() || p != out.front()) out.push_back(p);
    return out;
  }

  // Loads the first candidate that is complete and intact; a damaged one is reported and
  // skipped. Returns false when there is nothing to resume from.
  bool resume() {
    const auto candidates = resume_candidates();
    for (const auto& dir : candidates) {
      try {
        if (!fs::exists(dir / "train_state.json")) throw FormatError(str(dir.string(), " is not a complete checkpoint"));
        load_checkpoint(dir);
        return true;
      } catch (const ConfigError&) {
        throw;  // an incompatible configuration is the user's decision, not damage
      } catch (const Error& e) {
        if (cfg.trainer.resume_mode == "resume_path") throw;
        log_warn(str("skipping damaged checkpoint: ", e.what()));
      }
    }
    if (!candidates.empty())
      throw FormatError(str("no intact checkpoint in ", run_dir.string(),
                            " (set trainer.resume_mode=disable to start over)"));
    return false;
  }

  void load_checkpoint(const fs::path& dir) {
    auto state = nlohmann::json::parse(read_file(dir / "train_state.json"), nullptr, false);
    if (!state.is_object()) throw FormatError(str(dir.string(), "/train_state.json: malformed JSON"));
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
};

Trainer::Trainer(TrainConfig config, reward::ScorerRegistry scorers) {
  for (const auto& notice : config.resolve()) log_info(notice);
  config.validate();
  if (config.actor_rollout_ref.model.path.empty())
    throw ConfigError("actor_rollout_ref.model.path: required (a Hugging Face model directory)");
  impl_ = std::make_unique<Impl>(std::move(config), std::move(scorers));
  Impl& s = *impl_;
  const auto& cfg = s.cfg;
  const auto& actor = cfg.actor_rollout_ref.actor;
  at::manual_seed(static_cast<uint64_t>(cfg.trainer.seed));
  s.policy.model.set_gradient_checkpointing(cfg.actor_rollout_ref.model.enable_gradient_checkpointing);
  (void)algo::advantage_registry().get(cfg.algorithm.adv_estimator);  // unknown names fail now, not at step 1
  (void)algo::policy_loss_registry().get(actor.policy_loss);
  (void)s.loss_config();

  // Training prompts, rendered like verl's RLHFDataset.
  auto rows = read_rows(cfg.data.train_files, cfg.data.train_max_samples, "data.train_files");
  for (const auto& r : rows) (void)s.scorers.find(r.data_source);
  for (size_t i = 0; i < rows.size(); ++i) {
    Prompt p;
    p.ids = rollout::render_prompt(s.policy.tokenizer, messages_of(rows[i]));
    p.data_source = rows[i].data_source;
    p.ground_truth = rows[i].reward_model.ground_truth;
    const int64_t len = static_cast<int64_t>(p.ids.size()), max_len = cfg.data.max_prompt_length;
    if (len > max_len) {
      if (cfg.data.filter_overlong_prompts) continue;
      if (cfg.data.truncation == "left") p.ids.erase(p.ids.begin(), p.ids.end() - max_len);
      else if (cfg.data.truncation == "right") p.ids.resize(static_cast<size_t>(max_len));
      else
        throw ValueError(str("data.train_files: row ", i, " has a prompt of ", len, " tokens > data.max_prompt_length=",
                             max_len, " (set data.truncation=left|right or data.filter_overlong_prompts=true)"));
    }
    s.prompts.push_back(std::move(p));
  }
  const int64_t gen_batch = cfg.data.gen_batch_size.value_or(cfg.data.train_batch_size);
  if (static_cast<int64_t>(s.prompts.size()) < std::max(cfg.data.train_batch_size, gen_batch))
    throw ConfigError(str("data.train_batch_size / data.gen_batch_size (", std::max(cfg.data.train_batch_size, gen_batch),
                          ") exceed the ", s.prompts.size(), " usable training prompts"));
  if (!cfg.data.val_files.empty()) s.val_rows = read_rows(cfg.data.val_files, cfg.data.val_max_samples, "data.val_files");

  s.steps_per_epoch = static_cast<int64_t>(s.prompts.size()) / cfg.data.train_batch_size;
  s.total_steps = cfg.trainer.total_training_steps.value_or(s.steps_per_epoch * cfg.trainer.total_epochs);
  s.set_epoch(0);

  // Optimizer and LR schedule (verl's rules).
  const auto& o = actor.optim;
  OptimizerOptions oo;
  oo.type = o.optim_type;
  oo.lr = o.lr;
  oo.beta1 = o.betas[0];
  oo.beta2 = o.betas[1];
  oo.weight_decay = o.weight_decay;
  const int64_t warmup = resolve_warmup_steps(o.lr_warmup_steps, o.lr_warmup_steps_ratio, s.total_steps);
  oo.warmup_steps = warmup;
  s.optimizer = make_optimizer(oo, s.policy.model.named_parameters());
  s.schedule = LrSchedule{o.warmup_style.value_or(o.lr_scheduler_type), warmup, s.total_steps, o.min_lr_ratio,
                          o.num_cycles};

  s.kl_in_reward_coef = cfg.algorithm.kl_ctrl.kl_coef;
  // A reference policy is needed for GRPO's KL loss and for KL in the reward (REINFORCE++):
  // the initial weights, or the policy of every ref_update_freq steps (iterative).
  // With the iterative reference refreshed every step, pi_ref = pi_old: its log-probs are the
  // old log-probs and no second model is resident.
  const bool grpo_kl = actor.use_kl_loss && actor.policy_loss.rfind("grpo", 0) == 0;
  s.needs_reference = grpo_kl || cfg.algorithm.use_kl_in_reward;
  if (s.needs_reference && !(actor.use_iterative_ref_model && actor.ref_update_freq == 1)) {
    s.reference = std::make_unique<model::CausalLM>(model::CausalLM::from_pretrained(
        cfg.actor_rollout_ref.model.path, {at::kFloat, s.policy.model.device()}));
    s.reference->set_requires_grad(false);
  }
  if (actor.compute_dtype == "bfloat16") {
    s.compute = std::make_unique<model::CausalLM>(model::CausalLM::from_pretrained(
        cfg.actor_rollout_ref.model.path, {at::kBFloat16, s.policy.model.device()}));
    s.compute->set_requires_grad(true);
    s.compute->set_gradient_checkpointing(cfg.actor_rollout_ref.model.enable_gradient_checkpointing);
  }

  s.run_dir = cfg.trainer.default_local_dir;
  // A run killed while writing a checkpoint leaves its temporary directory behind.
  if (fs::is_directory(s.run_dir))
    for (const auto& e : fs::directory_iterator(s.run_dir)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("global_step_", 0) == 0 && name.find(".tmp.") != std::string::npos) fs::remove_all(e.path());
    }
  s.resume();
  // Metrics of steps after the checkpoint (a crashed run's tail) are dropped.
  s.logger = std::make_unique<MetricsLogger>(s.run_dir, /*tensorboard=*/true, s.step + 1);
  jsonl::keep_steps(s.run_dir / "samples.jsonl", [&](int64_t st) { return st <= s.step; });
  log_info(str("train: ", s.prompts.size(), " prompts, ", s.steps_per_epoch, " steps per epoch, ", s.total_steps,
               " steps; policy loss ", actor.policy_loss, ", advantages ", cfg.algorithm.adv_estimator, "; run dir ",
               s.run_dir.string()));
}

Trainer::~Trainer() = default;

int64_t Trainer::global_step() const { return impl_->step; }
bool Trainer::has_reference_model() const { return impl_->reference != nullptr; }
int64_t Trainer::total_steps() const { return impl_->total_steps; }
const model::CausalLM& Trainer::model() const { return impl_->policy.model; }
const rollout::Batch& Trainer::last_batch() const { return impl_->last_batch; }
void Trainer::record_updates(bool on) { impl_->recording = on; }
const std::vector<UpdateRecord>& Trainer::last_updates() const { return impl_->updates; }

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
  const auto& cfg = s.cfg;
  const auto& actor = cfg.actor_rollout_ref.actor;
  const int64_t n = cfg.actor_rollout_ref.rollout.n;
  const auto t_step = Clock::now();
  Metrics m;

  // 1. Generate and score until train_batch_size groups survive dynamic sampling.
  struct Group {
    const Prompt* prompt;
    std::vector<rollout::Response> responses;
    std::vector<double> scores;
    std::vector<bool> acc;
  };
  std::vector<Group> kept;
  int64_t rounds = 0, generated_groups = 0;
  double gen_seconds = 0, reward_seconds = 0;
  std::vector<nlohmann::json> samples;
  int64_t gen_tokens = 0;
  const int64_t gen_batch = cfg.data.gen_batch_size.value_or(cfg.data.train_batch_size);
  rollout::RolloutEngine engine(s.policy.model, {cfg.actor_rollout_ref.rollout.max_num_seqs, 0});
  reward::OverlongConfig overlong{cfg.reward_model.overlong_buffer.enable, cfg.reward_model.overlong_buffer.len,
                                  cfg.reward_model.overlong_buffer.penalty_factor, cfg.data.max_response_length};
  std::vector<double> all_scores, all_acc;
  s.optimizer->use_train_weights();
  while (static_cast<int64_t>(kept.size()) < cfg.data.train_batch_size) {
    const auto& fg = cfg.algorithm.filter_groups;
    if (rounds > 0 && fg.max_num_gen_batches > 0 && rounds >= fg.max_num_gen_batches)
      throw ValueError(str("dynamic sampling: ", rounds, " generation batches gave only ", kept.size(), " of ",
                           cfg.data.train_batch_size, " groups with varying ", fg.metric,
                           "; raise algorithm.filter_groups.max_num_gen_batches or check the data"));
    ++rounds;
    auto batch_prompts = s.next_prompts(gen_batch);
    std::vector<std::vector<int64_t>> ids;
    for (const auto* p : batch_prompts) ids.push_back(p->ids);
    rollout::SamplingParams sp = s.sampling(false);
    sp.seed = mix_key(static_cast<uint64_t>(cfg.trainer.seed), static_cast<uint64_t>(s.step),
                      static_cast<uint64_t>(rounds));
    auto t_gen = Clock::now();
    auto responses = engine.generate(ids, sp);
    gen_seconds += seconds_since(t_gen);
    gen_tokens += engine.last_stats().generated_tokens;

    std::vector<std::string> texts;
    std::vector<reward::ScoreRequest> requests;
    texts.reserve(responses.size());
    for (const auto& r : responses) {
      std::vector<TokenId> tid(r.token_ids.begin(), r.token_ids.end());
      texts.push_back(s.policy.tokenizer.decode(tid, /*skip_special_tokens=*/true));
    }
    for (size_t i = 0; i < responses.size(); ++i) {
      const Prompt* p = batch_prompts[static_cast<size_t>(responses[i].prompt_index)];
      requests.push_back({p->data_source, texts[i], p->ground_truth});
    }
    auto t_reward = Clock::now();
    auto results = reward::score_batch(s.scorers, requests);
    reward_seconds += seconds_since(t_reward);
    for (size_t i = 0; i < responses.size() && static_cast<int64_t>(samples.size()) < cfg.trainer.sample_log_count; ++i) {
      const auto& ids = batch_prompts[static_cast<size_t>(responses[i].prompt_index)]->ids;
      std::vector<TokenId> pid(ids.begin(), ids.end());
      samples.push_back({{"step", s.step + 1}, {"prompt", s.policy.tokenizer.decode(pid)}, {"response", texts[i]},
                         {"score", results[i].score}, {"acc", results[i].acc},
                         {"ground_truth", requests[i].ground_truth}});
    }
    std::vector<int64_t> lengths;
    std::vector<double> scores;
    for (size_t i = 0; i < responses.size(); ++i) {
      lengths.push_back(static_cast<int64_t>(responses[i].token_ids.size()));
      scores.push_back(results[i].score);
    }
    reward::apply_overlong_penalty(overlong, lengths, scores);

    for (size_t g = 0; g < batch_prompts.size(); ++g) {
      Group grp{batch_prompts[g], {}, {}, {}};
      for (int64_t j = 0; j < n; ++j) {
        const size_t i = g * static_cast<size_t>(n) + static_cast<size_t>(j);
        grp.responses.push_back(responses[i]);
        grp.scores.push_back(scores[i]);
        grp.acc.push_back(results[i].acc);
        all_scores.push_back(scores[i]);
        all_acc.push_back(results[i].acc ? 1.0 : 0.0);
      }
      ++generated_groups;
      if (fg.enable) {
        // DAPO: a group whose metric is the same for every response has zero advantage.
        std::vector<double> metric;
        for (int64_t j = 0; j < n; ++j) metric.push_back(fg.metric == "acc" ? (grp.acc[j] ? 1.0 : 0.0) : grp.scores[j]);
        const bool constant = std::all_of(metric.begin(), metric.end(), [&](double x) { return x == metric[0]; });
        if (constant && n > 1) continue;
      }
      kept.push_back(std::move(grp));
    }
    if (!fg.enable) break;
  }
  kept.resize(static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(kept.size()), cfg.data.train_batch_size)));

  // 2. The verl layout, outcome scores on each response's last token.
  std::vector<std::vector<int64_t>> group_prompts;
  std::vector<rollout::Response> flat;
  std::vector<double> flat_scores;
  int64_t finished_by_length = 0;
  for (size_t g = 0; g < kept.size(); ++g) {
    group_prompts.push_back(kept[g].prompt->ids);
    for (size_t j = 0; j < kept[g].responses.size(); ++j) {
      rollout::Response r = kept[g].responses[j];
      r.prompt_index = static_cast<int64_t>(g);
      if (r.finish_reason == rollout::FinishReason::kLength) ++finished_by_length;
      flat.push_back(std::move(r));
      flat_scores.push_back(kept[g].scores[j]);
    }
  }
  rollout::Batch batch = rollout::make_rollout_batch(group_prompts, flat, s.policy.pad_token_id);
  const at::Tensor& mask = batch.get("response_mask");
  at::Tensor lengths = mask.sum(1);
  at::Tensor token_level_scores = at::zeros(mask.sizes(), at::kFloat);
  for (int64_t b = 0; b < batch.rows(); ++b) {
    const int64_t last = lengths[b].item<int64_t>() - 1;
    if (last >= 0) token_level_scores[b][last] = flat_scores[static_cast<size_t>(b)];
  }

  // 3. Old (sampling-policy) log-probs recomputed by the trainer (in the compute dtype, so
  // that the first update's ratio is 1 in the precision it is computed in) or taken from the
  // rollout, and the reference's.
  const double temperature = cfg.actor_rollout_ref.rollout.temperature;
  const bool recompute_old = actor.old_log_prob_source == "recompute";
  auto t_old = Clock::now();
  s.sync_compute_weights();
  at::Tensor old_log_probs = recompute_old ? s.log_probs_no_grad(s.compute_model(), batch, temperature)
                                           : batch.get("rollout_log_probs");
  const double old_seconds = seconds_since(t_old);
  auto t_ref = Clock::now();
  at::Tensor ref_log_probs;
  if (s.reference) ref_log_probs = s.log_probs_no_grad(*s.reference, batch, temperature);
  else if (s.needs_reference) ref_log_probs = old_log_probs;
  const double ref_seconds = seconds_since(t_ref);
  if (s.reference && actor.ref_kl_target > 0) {
    // Paper Section 5: the token-level KL(pi_old || pi_ref) (k3, exact in expectation over
    // pi_old's samples), averaged over the step's response tokens, then over steps.
    const double kl = masked_mean(algo::kl_estimate(old_log_probs, ref_log_probs, algo::KlEstimator::K3), mask);
    s.ref_kl_running = s.ref_kl_running ? (1 - actor.ref_kl_ema) * *s.ref_kl_running + actor.ref_kl_ema * kl : kl;
    m["actor/ref_kl_moving_avg"] = *s.ref_kl_running;
  }
  if (recompute_old) {
    // Rollout/trainer mismatch: the engine's sampling log-probs vs the recomputation.
    const at::Tensor valid = mask.to(at::kBool);
    const at::Tensor diff = (old_log_probs - batch.get("rollout_log_probs")).masked_select(valid);
    if (diff.numel() > 0) {
      m["training/rollout_log_prob_diff_mean"] = diff.abs().mean().item<double>();
      m["training/rollout_log_prob_diff_max"] = diff.abs().max().item<double>();
      m["training/rollout_is_weight_min"] = diff.exp().min().item<double>();
      m["training/rollout_is_weight_max"] = diff.exp().max().item<double>();
    }
  }

  // 4. Rewards (optionally KL-penalised, REINFORCE++) and advantages on the whole batch.
  at::Tensor token_level_rewards = token_level_scores;
  if (cfg.algorithm.use_kl_in_reward) {
    const auto estimator = algo::parse_kl_estimator(cfg.algorithm.kl_penalty);
    token_level_rewards = algo::apply_kl_penalty(token_level_scores, old_log_probs, ref_log_probs, mask,
                                                 s.kl_in_reward_coef, estimator);
    // The batch's KL (mean over rows of each row's token mean), as verl's controller sees it.
    at::Tensor kl = algo::kl_estimate(old_log_probs, ref_log_probs, estimator) * mask;
    const double current_kl = (kl.sum(1) / mask.sum(1).clamp_min(1)).mean().item<double>();
    m["actor/reward_kl_penalty"] = current_kl;
    m["actor/reward_kl_penalty_coeff"] = s.kl_in_reward_coef;
    const auto& kc = cfg.algorithm.kl_ctrl;
    if (kc.type == "adaptive")  // verl updates with n_steps = the batch's rows
      s.kl_in_reward_coef = adaptive_kl_coef(s.kl_in_reward_coef, current_kl, kc.target_kl, kc.horizon, batch.rows());
  }
  auto t_adv = Clock::now();
  algo::AdvantageInputs ai;
  ai.token_level_rewards = token_level_rewards;
  ai.response_mask = mask;
  ai.group_index = batch.get("group_index");
  ai.gamma = cfg.algorithm.gamma;
  ai.norm_adv_by_std_in_grpo = cfg.algorithm.norm_adv_by_std_in_grpo;
  at::Tensor advantages = algo::compute_advantage(cfg.algorithm.adv_estimator, ai).advantages;
  const double adv_seconds = seconds_since(t_adv);
  batch.set("old_log_probs", old_log_probs);
  if (ref_log_probs.defined()) batch.set("ref_log_probs", ref_log_probs);
  batch.set("advantages", advantages);

  // 5. Policy updates: ppo_epochs x mini-batches (whole groups) x micro-batches.
  const algo::PolicyLossConfig lc = s.loss_config();
  const double lr = actor.optim.lr * s.schedule.factor(s.optimizer->step_count());
  const int64_t rows_per_mini = std::min<int64_t>(actor.ppo_mini_batch_size * n, batch.rows());
  std::map<std::string, std::vector<double>> loss_metrics;
  std::vector<double> grad_norms;
  int64_t skipped = 0;
  auto t_update = Clock::now();
  const bool want_entropy = actor.entropy_coeff != 0.0;
  s.updates.clear();
  for (int64_t e = 0; e < actor.ppo_epochs; ++e) {
    std::vector<int64_t> row_order(static_cast<size_t>(batch.rows()));
    std::iota(row_order.begin(), row_order.end(), 0);
    if (actor.shuffle && e > 0) {
      auto perm = random_permutation(batch.rows(), mix_key(static_cast<uint64_t>(cfg.trainer.seed), s.step, e));
      row_order = perm;
    }
    for (int64_t start = 0; start < batch.rows(); start += rows_per_mini) {
      std::vector<int64_t> mini_rows(row_order.begin() + start,
                                     row_order.begin() + std::min<int64_t>(batch.rows(), start + rows_per_mini));
      rollout::Batch mini = batch.select(mini_rows);
      const double normaliser = algo::loss_normaliser(mini.get("response_mask"), lc.loss_agg_mode);
      UpdateRecord record;
      if (s.recording) {
        record.rows = mini_rows;
        for (const auto& p : s.policy.model.parameters()) record.weights.push_back(p.detach().clone());
      }
      s.sync_compute_weights();
      for (const auto& rows : s.micro_batches(mini)) {
        rollout::Batch mb = mini.select(rows);
        model::LogProbOptions lo;
        lo.temperature = temperature;
        lo.with_entropy = true;
        auto lp = s.compute_model().log_probs(mb.get("input_ids"), mb.get("attention_mask"), mb.get("position_ids"),
                                              mb.get("responses"), lo);
        algo::PolicyLossInputs in;
        in.log_probs = lp.log_probs;
        in.old_log_probs = mb.get("old_log_probs");
        if (mb.has("ref_log_probs")) in.ref_log_probs = mb.get("ref_log_probs");
        in.rollout_log_probs = mb.get("rollout_log_probs");
        in.advantages = mb.get("advantages");
        in.response_mask = mb.get("response_mask");
        in.entropy = want_entropy ? lp.entropy : lp.entropy.detach();
        in.normaliser = normaliser;
        auto out = algo::compute_policy_loss(actor.policy_loss, in, lc);
        out.loss.backward();
        s.move_compute_grads();
        if (s.recording) record.loss += out.loss.item<double>();
        for (const auto& [k, v] : out.metrics) loss_metrics[k].push_back(v.item<double>());
      }
      if (s.recording) {
        for (const auto& p : s.policy.model.parameters())
          record.grads.push_back(p.grad().defined() ? p.grad().clone() : at::zeros_like(p));
        s.updates.push_back(std::move(record));
      }
      const double norm = clip_grad_norm(s.optimizer->params(), actor.grad_clip);
      grad_norms.push_back(norm);
      if (std::isfinite(norm)) {
        s.optimizer->step(lr);
        s.consecutive_skips = 0;
      } else {
        // A non-finite loss or gradient: the update is skipped, the weights stay as they were.
        ++skipped;
        ++s.consecutive_skips;
        log_warn(str("step ", s.step + 1, ": non-finite gradient norm, optimizer step skipped"));
      }
      s.optimizer->zero_grad();
      if (s.consecutive_skips >= cfg.trainer.max_consecutive_skips)
        throw Error(str("stopping: ", s.consecutive_skips, " optimizer steps in a row had a non-finite loss or "
                        "gradient (trainer.max_consecutive_skips); the last checkpoint in ",
                        s.run_dir.string(), " is intact"));
    }
  }
  const double update_seconds = seconds_since(t_update);

  // 6. Iterative reference: the reference becomes the current policy every ref_update_freq
  // steps, or (paper Section 5) when the moving-average token KL to it exceeds the target.
  ++s.step;
  if (s.reference && actor.use_iterative_ref_model) {
    const bool by_count = actor.ref_update_freq > 0 && s.step % actor.ref_update_freq == 0;
    const bool by_kl = actor.ref_kl_target > 0 && s.ref_kl_running && *s.ref_kl_running > actor.ref_kl_target;
    if (by_count || by_kl) {
      s.reference->copy_parameters_from(s.policy.model);  // the weights that sample, as pi_old
      ++s.ref_updates;
      s.ref_kl_running.reset();  // the KL to the new reference starts at zero
    }
  }
  if (s.reference && actor.use_iterative_ref_model) m["actor/ref_updates"] = static_cast<double>(s.ref_updates);

  // 7. Metrics, with verl's names.
  for (const auto& [k, v] : loss_metrics) m[k] = mean_of(v);
  m["actor/grad_norm"] = mean_of(grad_norms);
  m["actor/lr"] = lr;
  m["actor/skipped_steps"] = static_cast<double>(skipped);
  m["critic/score/mean"] = mean_of(flat_scores);
  m["critic/rewards/mean"] = token_level_rewards.sum(1).to(at::kDouble).mean().item<double>();
  m["critic/advantages/mean"] = masked_mean(advantages, mask);
  m["critic/advantages/max"] = (advantages * mask).max().item<double>();
  m["critic/advantages/min"] = (advantages * mask).min().item<double>();
  m["acc/mean"] = mean_of(all_acc);
  m["acc/generated_score_mean"] = mean_of(all_scores);
  m["response_length/mean"] = lengths.to(at::kDouble).mean().item<double>();
  m["response_length/max"] = lengths.max().item<double>();
  m["response_length/clip_ratio"] = static_cast<double>(finished_by_length) / static_cast<double>(batch.rows());
  m["prompt_length/mean"] = batch.get("attention_mask").sum(1).sub(lengths).to(at::kDouble).mean().item<double>();
  m["train/num_gen_batches"] = static_cast<double>(rounds);
  m["train/kept_group_ratio"] = static_cast<double>(kept.size()) / static_cast<double>(std::max<int64_t>(1, generated_groups));
  m["train/epoch"] = static_cast<double>(s.epoch);
  m["timing_s/gen"] = gen_seconds;
  m["timing_s/reward"] = reward_seconds;
  m["timing_s/old_log_prob"] = old_seconds;
  m["timing_s/ref"] = ref_seconds;
  m["timing_s/adv"] = adv_seconds;
  m["timing_s/update_actor"] = update_seconds;
  m["timing_s/step"] = seconds_since(t_step);
  m["perf/gen_tokens_per_s"] = gen_seconds > 0 ? static_cast<double>(gen_tokens) / gen_seconds : 0.0;
  s.last_batch = std::move(batch);
  s.logger->log(s.step, m);
  if (cfg.trainer.sample_log_freq > 0 && s.step % cfg.trainer.sample_log_freq == 0) {
    std::string lines;
    for (const auto& j : samples) lines += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    append_file(s.run_dir / "samples.jsonl", lines);
  }
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
  if (!fs::exists(s.run_dir / str("global_step_", s.step) / "train_state.json")) s.save_checkpoint();
}

}  // namespace rpg::train
