// What the tests of whole `rpg train` runs read back: the small prompt set they train on, a
// safetensors file's tensors as doubles (checkpoint weights, optimizer shards), and each
// step's metrics from metrics.jsonl. Torch-free: the runs are subprocesses.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "rpg/core/io.h"
#include "test_util.h"

namespace rpg::test {

// Eight problems "i+1?" (answer i+1) written as DIR/p.jsonl and prepared by `rpg data
// prepare` into DIR/p.parquet, whose path is returned.
inline std::string prepare_prompts(const std::filesystem::path& dir) {
  std::string jsonl;
  for (int i = 0; i < 8; ++i)
    jsonl += "{\"problem\": \"" + std::to_string(i) + "+1?\", \"answer\": \"" + std::to_string(i + 1) + "\"}\n";
  write_text(dir / "p.jsonl", jsonl);
  const std::string data = (dir / "p.parquet").string();
  const auto r =
      run_process({rpg_binary().string(), "data", "prepare", (dir / "p.jsonl").string(), data, "--data-source", "math_dapo"});
  if (r.exit_code != 0) throw std::runtime_error("rpg data prepare failed: " + r.err);
  return data;
}

// `rpg [launch LAUNCH... --] train -` of the data-parallel tests, into `run`: the tiny chat
// model under FIXTURE/model on `data` (prepare_prompts), 4 prompts x 2 responses per step, 2
// mini-batches of 4 rows, micro-batches of 2 rows (one per rank of 2), KL loss to the
// iterative reference refreshed every step, lr 1e-2, `steps` steps, a checkpoint and every
// sample logged each step; `more` overrides come last.
inline std::vector<std::string> dp_train_argv(const std::filesystem::path& fixture, const std::string& data,
                                              const std::vector<std::string>& launch, const std::filesystem::path& run,
                                              int steps, const std::vector<std::string>& more = {}) {
  std::vector<std::string> argv = {rpg_binary().string()};
  if (!launch.empty()) {
    argv.push_back("launch");
    argv.insert(argv.end(), launch.begin(), launch.end());
    argv.push_back("--");
  }
  for (const std::string& a :
       {std::string("train"), std::string("-"), "actor_rollout_ref.model.path=" + (fixture / "model").string(),
        "data.train_files=" + data, std::string("data.train_batch_size=4"), std::string("data.max_prompt_length=256"),
        std::string("data.max_response_length=8"), std::string("actor_rollout_ref.rollout.n=2"),
        std::string("actor_rollout_ref.actor.ppo_mini_batch_size=2"),
        std::string("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"),
        std::string("actor_rollout_ref.actor.policy_loss=rpg_reinforce"),
        std::string("actor_rollout_ref.actor.optim.lr=1e-2"), std::string("actor_rollout_ref.actor.entropy_coeff=0.01"),
        std::string("actor_rollout_ref.actor.use_kl_loss=true"), std::string("actor_rollout_ref.actor.kl_loss_coef=0.1"),
        std::string("algorithm.adv_estimator=rpg_batch"), "trainer.total_training_steps=" + std::to_string(steps),
        std::string("trainer.save_freq=1"), std::string("trainer.device=cpu"), std::string("trainer.sample_log_freq=1"),
        std::string("trainer.sample_log_count=100"), "trainer.default_local_dir=" + run.string()})
    argv.push_back(a);
  argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

// A safetensors file's F32 / BF16 tensors: name -> values (as double) and name -> dtype.
struct SafetensorsValues {
  std::map<std::string, std::vector<double>> values;
  std::map<std::string, std::string> dtypes;
};

inline SafetensorsValues read_safetensors_values(const std::filesystem::path& file) {
  const std::string bytes = read_file(file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  SafetensorsValues out;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string dtype = info["dtype"];
    out.dtypes[name] = dtype;
    const size_t begin = 8 + n + info["data_offsets"][0].get<size_t>(), end = 8 + n + info["data_offsets"][1].get<size_t>();
    std::vector<double>& v = out.values[name];
    for (size_t p = begin; p < end; p += dtype == "F32" ? 4 : 2) {
      uint32_t bits = 0;
      if (dtype == "F32") {
        std::memcpy(&bits, bytes.data() + p, 4);
      } else if (dtype == "BF16") {
        uint16_t h;
        std::memcpy(&h, bytes.data() + p, 2);
        bits = uint32_t{h} << 16;
      } else {
        throw std::runtime_error("unexpected dtype " + dtype + " in " + file.string());
      }
      float f;
      std::memcpy(&f, &bits, 4);
      v.push_back(f);
    }
  }
  return out;
}

// kCompared: every number of a step except the wall-clock ones (timing_s/*,
// timing_per_token_ms/*, perf/*) and the per-rank token counts (global_seqlen/*, which
// depend on the world size): what two runs of the same training must agree on.
// kMemory: the perf/memory/* byte counts (dist/memory.h), named without that prefix.
enum class StepMetrics { kCompared, kMemory };

// A record of metrics.jsonl that holds only timings (a checkpoint's timing_s/save_checkpoint,
// written after the step's own line).
inline bool timing_only_record(const nlohmann::json& j) {
  for (const auto& [k, v] : j.items())
    if (k != "step" && !k.starts_with("timing_s/")) return false;
  return true;
}

// One map per step line of metrics.jsonl (timing-only records skipped), in step order.
inline std::vector<std::map<std::string, double>> read_step_metrics(const std::filesystem::path& file, StepMetrics which) {
  std::vector<std::map<std::string, double>> out;
  std::istringstream in(read_file(file));
  std::string line;
  while (std::getline(in, line)) {
    std::map<std::string, double> m;
    const auto j = nlohmann::json::parse(line);
    if (timing_only_record(j)) continue;
    for (const auto& [k, v] : j.items()) {
      if (!v.is_number()) continue;
      if (which == StepMetrics::kMemory) {
        if (k.starts_with("perf/memory/")) m[k.substr(12)] = v.get<double>();
      } else if (!(k.starts_with("timing_s/") || k.starts_with("timing_per_token_ms/") || k.starts_with("perf/") ||
                   k.starts_with("global_seqlen/"))) {
        m[k] = v.get<double>();
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace rpg::test
