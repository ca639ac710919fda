// What changed in the configuration between the run that wrote a checkpoint and the run
// resuming from it. Changes that break resume (model, batch sizes, optimizer type) are
// refused by the trainer (its checkpoint fingerprint); every other change is allowed and
// reported, one log line per key, so the log of a resumed run says how it differs from the
// run it continues. Each checkpoint keeps the resolved config it was written with.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "rpg/train/config.h"

namespace rpg::train {

struct ConfigChange {
  std::string key;     // dotted, e.g. actor_rollout_ref.actor.optim.lr
  std::string before;  // the value in YAML flow syntax; "(absent)" when the key did not exist
  std::string after;
  bool operator==(const ConfigChange&) const = default;
};

// Leaf values that differ between two YAML documents (as config_to_yaml writes them),
// sorted by key. Lists compare as a whole. Throws ConfigError when a text is not YAML.
std::vector<ConfigChange> config_changes(std::string_view before_yaml, std::string_view after_yaml);

// "resume: config changed: <key> <before> -> <after>"
std::string format_change(const ConfigChange& change);

// Writes `cfg` resolved to checkpoint_dir/config.yaml (inside the checkpoint being written).
void save_checkpoint_config(const std::filesystem::path& checkpoint_dir, const TrainConfig& cfg);

// Logs format_change() for every key that differs between checkpoint_dir/config.yaml and
// `cfg`, except the keys that only say where to resume from (trainer.resume_mode,
// trainer.resume_path); returns those changes. A checkpoint without a readable config.yaml
// (written by an older rpg, or damaged: it is not needed to resume) gets one line saying so.
std::vector<ConfigChange> report_config_changes(const std::filesystem::path& checkpoint_dir, const TrainConfig& cfg);

}  // namespace rpg::train
