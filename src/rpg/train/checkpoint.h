// Training-state files: named tensors in one safetensors file (the trainer's exact fp32
// parameters, optimizer moments, reference weights) next to a JSON file of scalars. The
// trainer writes both inside an AtomicDir, so a checkpoint is complete or absent.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace rpg::train {

// Writes every tensor (contiguous CPU copies; F32, F64, BF16, F16, I64, I32, BOOL) to `path`.
// Throws IoError. Test hook point `checkpoint_write` (core/test_hook.h): half the data written.
void save_tensor_file(const std::filesystem::path& path, const std::map<std::string, at::Tensor>& tensors);
// Reads a file written by save_tensor_file. Throws IoError / FormatError naming the file.
std::map<std::string, at::Tensor> load_tensor_file(const std::filesystem::path& path);

// The layout of a run directory (trainer.default_local_dir), in one place:
//   global_step_<N>/actor/                      Hugging Face model (evaluation weights)
//   global_step_<N>/train_state.safetensors     exact fp32 weights, optimizer, reference
//   global_step_<N>/train_state.json            scalars + "format_version"; written last
//   global_step_<N>/config.yaml                 the resolved config of the writing run
//   latest_checkpointed_iteration.txt           verl's marker: the newest step saved
// A checkpoint is written into a temporary sibling (global_step_<N>.tmp.*) and published by
// one rename, so a checkpoint directory is complete or absent.
class RunDir {
 public:
  // train_state.json's format: 1 added "format_version" (files without it are version 1).
  static constexpr int64_t kFormatVersion = 1;

  explicit RunDir(std::filesystem::path root) : root_(std::move(root)) {}
  const std::filesystem::path& root() const { return root_; }

  std::filesystem::path checkpoint(int64_t step) const;
  // N for a directory name "global_step_<N>" (digits only), else nothing.
  static std::optional<int64_t> step_of(std::string_view dir_name);
  // Published checkpoint directories, newest first.
  std::vector<std::pair<int64_t, std::filesystem::path>> checkpoints() const;
  // Whether checkpoint(step) is complete (its train_state.json exists).
  bool has_complete(int64_t step) const { return is_complete(checkpoint(step)); }
  static bool is_complete(const std::filesystem::path& checkpoint_dir);
  // Removes what killed writes left: checkpoint temporary directories, and temporary files of
  // write_file_atomic (report.html, ...) whose writing process is gone.
  void remove_partial() const;
  // Publishes `step` in latest_checkpointed_iteration.txt (atomically).
  void mark_latest(int64_t step) const;
  // Keeps the newest `keep` checkpoints (all when null or <= 0).
  void prune(std::optional<int64_t> keep) const;
  // Where resume_mode=auto looks, best first: the one the latest marker names, then every
  // other checkpoint, newest first (so a damaged newest one falls back to the previous).
  std::vector<std::filesystem::path> resume_candidates() const;

 private:
  std::filesystem::path root_;
};

// One run directory, one writer: `rpg train` holds <run dir>/rpg.lock ("pid <pid> host
// <host>\n", created with O_EXCL) while it runs and removes it on exit. A second process
// on the same directory is refused with a ConfigError naming the owner. A lock left by a
// process that died (same host, pid no longer alive) is taken over with a warning; a lock
// of another host is never taken over (its pid cannot be checked from here): the message
// says which file to delete once that job is known to be gone.
class RunDirLock {
 public:
  explicit RunDirLock(const std::filesystem::path& root);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  static constexpr const char* kFileName = "rpg.lock";

 private:
  std::filesystem::path file_;
  std::string content_;
};

// Writes checkpoint_dir/train_state.json atomically, adding "format_version".
void write_train_state(const std::filesystem::path& checkpoint_dir, nlohmann::json state);
// Reads checkpoint_dir/train_state.json. FormatError when it is not a JSON object;
// ConfigError when its format_version is newer than this rpg reads (not damage: a newer rpg
// wrote it). A file without format_version is version 1.
nlohmann::json read_train_state(const std::filesystem::path& checkpoint_dir);

}  // namespace rpg::train
