// The trainer's checkpoints (layout: RunDir in checkpoint.h): what a run saves after a step
// and how it resumes from it -- the settings fingerprint, the atomic write, choosing and
// checking the checkpoint to resume from, and loading it.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/log.h"
#include "rpg/model/lora.h"
#include "rpg/train/checkpoint.h"
#include "rpg/train/dp.h"
#include "rpg/train/resume_check.h"
#include "rpg/train/trainer_impl.h"

namespace rpg::train {

nlohmann::json Trainer::Impl::fingerprint() const {
  return {{"model_path", cfg.actor_rollout_ref.model.path},
          {"train_batch_size", cfg.data.train_batch_size},
          {"rollout_n", cfg.actor_rollout_ref.rollout.n},
          {"ppo_mini_batch_size", cfg.actor_rollout_ref.actor.ppo_mini_batch_size},
          {"optim_type", cfg.actor_rollout_ref.actor.optim.optim_type}};
}

nlohmann::json Trainer::Impl::fingerprint_with_layout() const {
  nlohmann::json f = fingerprint();
  // Only when set, so that checkpoints written before the key existed still resume by default.
  if (shard_master) f["shard_master_weights"] = true;
  if (lora) {
    const model::LoraConfig& c = *policy.model.lora();
    f["lora"] = {{"rank", c.rank}, {"alpha", c.alpha}, {"target_modules", c.target_modules}};
  }
  return f;
}

void Trainer::Impl::save_checkpoint() {
  const auto t_save = Clock::now();
  // Data-parallel (dp.h): every rank writes its optimizer shard into rank 0's
  // temporary directory; each part is agreed on (all_or_none), so a rank's failure stops all
  // of them at the same point; rank 0 writes the manifest (train_state.json) last and
  // publishes. A process alone runs the same code without collectives.
  const bool main = dp::writes_run_dir(), sharded = dp::shards_checkpoints();
  std::optional<AtomicDir> out;
  dp::all_or_none("checkpoint", [&] {
    if (main) out.emplace(run_dir.checkpoint(step));
  });
  const fs::path dir = dp::main_path(out ? out->path() : fs::path());
  rules->use_export_weights(*optimizer);
  dp::all_or_none("checkpoint", [&] {
    if (main) save_actor(dir / "actor");
  });
  optimizer->use_train_weights();
  nlohmann::json scalars, shard;
  dp::all_or_none("checkpoint", [&] {
    if (main) {
      std::map<std::string, at::Tensor> tensors;
      for (const auto& [name, p] : trainable(policy.model)) tensors["param." + name] = p;
      if (!sharded) {
        OptimizerState os = optimizer->state();
        for (const auto& [k, t] : os.tensors) tensors["optim." + k] = t;
        scalars = os.scalars;
      }
      if (reference)
        for (const auto& [name, p] : reference->state()) tensors["ref." + name] = p;
      save_tensor_file(dir / "train_state.safetensors", tensors);
    }
    if (sharded) shard = dp::write_optimizer_shard(*optimizer, dir);
  });
  nlohmann::json state = {{"step", step}, {"epoch", epoch}, {"cursor", cursor},
                          {"kl_in_reward_coef", kl_in_reward_coef}, {"config", fingerprint_with_layout()},
                          {"ref_updates", ref_updates},
                          {"ref_kl_running", ref_kl_running ? nlohmann::json(*ref_kl_running) : nlohmann::json()}};
  if (sharded) state["optimizer_shards"] = dp::gather_shard_manifest(shard, *optimizer);
  else state["optimizer"] = scalars;
  if (main) {
    write_train_state(dir, state);  // the manifest, last: the checkpoint is complete with it
    save_checkpoint_config(dir, cfg);
    out->commit();
    run_dir.mark_latest(step);
    run_dir.prune(cfg.trainer.max_actor_ckpt_to_keep);
  }
  dp::barrier();  // the other ranks go on once rank 0 has published it
  // A record of its own at the step it saved (as validation's): the step's line is written
  // before its checkpoint so that a complete checkpoint always has its step's metrics; this
  // one is best-effort (a crash right here loses a timing, never a step).
  logger->log(step, {{"timing_s/save_checkpoint", seconds_since(t_save)}});
}

std::vector<fs::path> Trainer::Impl::resume_candidates() const {
  const auto& t = cfg.trainer;
  if (cfg.choices.resume_mode == ResumeMode::kDisable) return {};
  if (cfg.choices.resume_mode == ResumeMode::kResumePath) {
    if (!RunDir::is_complete(*t.resume_path))
      throw ConfigError(str("trainer.resume_path: ", *t.resume_path, " is not a complete rpg checkpoint"));
    return {*t.resume_path};
  }
  return run_dir.resume_candidates();
}

bool Trainer::Impl::resume() {
  const auto candidates = resume_candidates();
  for (const auto& dir : candidates) {
    try {
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

void Trainer::Impl::check_train_state(const fs::path& dir, const nlohmann::json& state) const {
  const std::string file = (dir / "train_state.json").string();
  auto count = [&](const char* key) {
    if (!state.contains(key) || !state[key].is_number_integer())
      throw FormatError(str(file, ": '", key, "' is not an integer"));
    return state[key].get<int64_t>();
  };
  const int64_t st = count("step"), ep = count("epoch"), cur = count("cursor");
  if (st < 1) throw FormatError(str(file, ": step ", st, " (a checkpoint is written after step 1 or later)"));
  const std::string name = dir.filename().string(), prefix = "global_step_";
  if (name.rfind(prefix, 0) == 0 && name.substr(prefix.size()) != std::to_string(st))
    throw FormatError(str(file, ": step ", st, " in a directory named ", name));
  if (ep < 0) throw FormatError(str(file, ": epoch ", ep, " is negative"));
  if (cur < 0 || cur > static_cast<int64_t>(prompts.size()))
    throw FormatError(str(file, ": data cursor ", cur, " is outside the ", prompts.size(), " training prompts"));
  if (st > total_steps)
    throw ConfigError(str("cannot resume from ", dir.string(), ": it is at step ", st, ", beyond the ", total_steps,
                          " steps this config plans (trainer.total_training_steps / trainer.total_epochs); plan "
                          "more steps, or use trainer.resume_mode=disable or another trainer.default_local_dir"));
}

void Trainer::Impl::check_optimizer_steps(const fs::path& dir, int64_t training_steps, const OptimizerState& os) const {
  // Each training step takes at most ppo_epochs optimizer steps per response row (a
  // mini-batch holds at least one row); a count beyond that, negative or fractional was not
  // written by a run of this config and would skew Adam's bias correction and the schedule.
  auto it = os.scalars.find("step");
  if (it == os.scalars.end()) return;
  const auto& c = cfg;
  const double most = static_cast<double>(training_steps) * static_cast<double>(c.actor_rollout_ref.actor.ppo_epochs) *
                      static_cast<double>(c.data.train_batch_size) * static_cast<double>(c.actor_rollout_ref.rollout.n);
  const double s = it->second;
  if (!(s >= 0 && s == std::floor(s) && s <= most))
    throw FormatError(str((dir / "train_state.json").string(), ": the optimizer's step count ", s, " does not fit its ",
                          training_steps, " training steps (at most ", most, " optimizer steps)"));
}

void Trainer::Impl::load_checkpoint(const fs::path& dir) {
  // Read on every rank, agreed (a rank that cannot read it makes every rank skip it), then
  // applied: the sharded optimizer's load_state is collective.
  nlohmann::json state;
  std::map<std::string, at::Tensor> tensors;
  OptimizerState os;
  dp::all_or_none(str("resume from ", dir.string()), [&] {
    if (!RunDir::is_complete(dir)) throw FormatError(str(dir.string(), " is not a complete checkpoint"));
    state = read_train_state(dir);
    check_train_state(dir, state);
    const auto want = fingerprint_with_layout();
    auto refuse = [&](const std::string& key, const nlohmann::json& was, const nlohmann::json& now) {
      throw ConfigError(str("cannot resume from ", dir.string(), ": ", key, " was ", was.dump(), ", the config now says ",
                            now.dump(), " (use trainer.resume_mode=disable or another trainer.default_local_dir to "
                            "start over)"));
    };
    for (const auto& [key, value] : want.items())
      if (state["config"][key] != value) refuse(key, state["config"][key], value);
    // A layout the checkpoint was written in that the config no longer asks for
    // (dist.shard_master_weights on, then off: its fp32 masters live only in the optimizer
    // shards, and the bf16 weights alone would silently restart from rounded values).
    for (const auto& [key, value] : state["config"].items())
      if (!want.contains(key) && !value.is_null() && value != false) refuse(key, value, false);
    tensors = load_tensor_file(dir / "train_state.safetensors");
    auto check = [&](const std::string& prefix, const NamedTensors& live) {
      for (const auto& [name, p] : live) {
        auto it = tensors.find(prefix + name);
        if (it == tensors.end() || it->second.sizes() != p.sizes())
          throw FormatError(str(dir.string(), "/train_state.safetensors: missing or mis-shaped '", prefix, name, "'"));
      }
    };
    check("param.", trainable(policy.model));
    if (reference) check("ref.", reference->state());
    if (state.contains("optimizer_shards")) {
      os = dp::read_optimizer_shards(dir, state["optimizer_shards"], *optimizer);  // any world size or stage
    } else {
      for (const auto& [k, t] : tensors)
        if (k.rfind("optim.", 0) == 0) os.tensors[k.substr(6)] = t;
      os.scalars = state["optimizer"].get<std::map<std::string, double>>();
    }
    check_optimizer_steps(dir, state["step"].get<int64_t>(), os);
  });
  {
    c10::NoGradGuard no_grad;
    auto copy_into = [&](const std::string& prefix, const NamedTensors& live) {
      for (const auto& [name, p] : live) p.detach().copy_(tensors.at(prefix + name));
    };
    copy_into("param.", trainable(policy.model));
    if (reference) copy_into("ref.", reference->state());
  }
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

void Trainer::Impl::save_actor(const fs::path& dir) const {
  const auto& path = cfg.actor_rollout_ref.model.path;
  if (lora) {
    // PEFT's adapter directory (peft.PeftModel.from_pretrained(base, dir) loads it); its
    // base_model_name_or_path names the base.
    fs::create_directories(dir);
    model::write_lora_adapter(policy.model, dir, fs::absolute(path).string());
    return;
  }
  model::SaveOptions so;
  so.copy_files_from = path;
  policy.model.save_pretrained(dir, so);
}

}  // namespace rpg::train
