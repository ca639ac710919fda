// Shared by the robustness tests of `rpg train` (preemption, failing writes, run-dir lock):
// a tiny training run on the tiny chat model and what to check in its run directory.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "rpg/core/io.h"
#include "run_files.h"
#include "test_util.h"

namespace rpg::test {

// Every metric of every step except wall-clock ones (timing_s/*, timing_per_token_ms/*, perf/*), in step order;
// a checkpoint's timing-only record is not a step. Fails the test when a line is not a JSON object (a torn line).
inline std::vector<std::map<std::string, double>> step_metrics(const std::filesystem::path& metrics) {
  std::vector<std::map<std::string, double>> out;
  std::istringstream in(read_file(metrics));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    EXPECT_TRUE(j.is_object()) << metrics << ": torn or malformed line '" << line << "'";
    if (!j.is_object() || timing_only_record(j)) continue;
    std::map<std::string, double> m;
    for (const auto& [k, v] : j.items())
      if (v.is_number() && k.rfind("timing_s/", 0) != 0 && k.rfind("timing_per_token_ms/", 0) != 0 &&
          k.rfind("perf/", 0) != 0)
        m[k] = v.get<double>();
    out.push_back(std::move(m));
  }
  return out;
}

// A safetensors file is complete when its header's last data offset is the file's end.
inline bool complete_safetensors(const std::filesystem::path& file) {
  if (!std::filesystem::is_regular_file(file)) return false;
  const std::string bytes = read_file(file);
  if (bytes.size() < 8) return false;
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (8 + n > bytes.size()) return false;
  auto header = nlohmann::json::parse(bytes.substr(8, n), nullptr, false);
  if (!header.is_object()) return false;
  uint64_t end = 0;
  for (const auto& [name, info] : header.items())
    if (name != "__metadata__") end = std::max(end, info["data_offsets"][1].get<uint64_t>());
  return 8 + n + end == bytes.size();
}

// Checkpoint directories the loader may pick (global_step_<digits>), newest first.
inline std::vector<std::pair<int, std::filesystem::path>> loadable_checkpoints(const std::filesystem::path& run) {
  std::vector<std::pair<int, std::filesystem::path>> out;
  if (!std::filesystem::is_directory(run)) return out;
  for (const auto& e : std::filesystem::directory_iterator(run)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("global_step_", 0) == 0 && name.size() > 12 &&
        name.find_first_not_of("0123456789", 12) == std::string::npos)
      out.emplace_back(std::stoi(name.substr(12)), e.path());
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

// Every loadable checkpoint is complete. Returns the newest one's step (0: none).
inline int expect_only_complete_checkpoints(const std::filesystem::path& run) {
  const auto dirs = loadable_checkpoints(run);
  for (const auto& [n, dir] : dirs) {
    EXPECT_TRUE(std::filesystem::exists(dir / "train_state.json")) << dir;
    EXPECT_TRUE(complete_safetensors(dir / "train_state.safetensors")) << dir;
    EXPECT_TRUE(complete_safetensors(dir / "actor" / "model.safetensors")) << dir;
  }
  return dirs.empty() ? 0 : dirs.front().first;
}

// Names in `dir` (recursively) that hold ".tmp." (temporary files or directories).
inline std::vector<std::string> temporaries(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  if (!std::filesystem::is_directory(dir)) return out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) out.push_back(e.path().string());
  return out;
}

// `rpg train` arguments of a short run that moves the weights every step (the tiny model
// never answers right, so the entropy bonus and the KL loss supply the gradient).
inline std::vector<std::string> tiny_train_argv(const std::filesystem::path& fixture, const std::string& data,
                                                const std::filesystem::path& run, int steps, int save_freq) {
  return {rpg_binary().string(), "train", "-", "actor_rollout_ref.model.path=" + (fixture / "model").string(),
          "data.train_files=" + data, "data.train_batch_size=2", "data.max_prompt_length=256",
          "data.max_response_length=8", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
          "actor_rollout_ref.actor.policy_loss=rpg_reinforce", "actor_rollout_ref.actor.optim.lr=1e-2",
          "actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.use_kl_loss=true",
          "actor_rollout_ref.actor.kl_loss_coef=0.1", "algorithm.adv_estimator=rpg_batch",
          "trainer.total_training_steps=" + std::to_string(steps), "trainer.save_freq=" + std::to_string(save_freq),
          "trainer.max_actor_ckpt_to_keep=2", "trainer.device=cpu", "trainer.default_local_dir=" + run.string()};
}

// Lines of `text` that start with `prefix`.
inline std::vector<std::string> lines_starting(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
  return out;
}

}  // namespace rpg::test
