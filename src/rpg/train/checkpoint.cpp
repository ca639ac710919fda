#include "rpg/train/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/log.h"
#include "rpg/core/test_hook.h"
#include "rpg/model/tensor_file.h"

namespace rpg::train {
void save_tensor_file(const std::filesystem::path& path, const std::map<std::string, at::Tensor>& tensors) {
  const auto list = model::as_list(tensors);
  // Kill-and-resume tests die once half the tensors are written, the file half on disk, to
  // prove that such a checkpoint is never picked up (test_hook.h).
  model::write_tensor_file(path, list, {.dtype = {}, .metadata = {}, .after_tensor = [&](size_t written) {
                             if (written == list.size() / 2 + 1) test_hook::kill_point("checkpoint_write");
                           }});
}

std::map<std::string, at::Tensor> load_tensor_file(const std::filesystem::path& path) {
  return model::read_tensor_file(path);
}

namespace {
constexpr std::string_view kStepPrefix = "global_step_";
constexpr const char* kLatestMarker = "latest_checkpointed_iteration.txt";
constexpr const char* kStateJson = "train_state.json";
}  // namespace

std::filesystem::path RunDir::checkpoint(int64_t step) const {
  return root_ / (std::string(kStepPrefix) + std::to_string(step));
}

std::optional<int64_t> RunDir::step_of(std::string_view name) {
  if (!name.starts_with(kStepPrefix)) return std::nullopt;
  const std::string_view digits = name.substr(kStepPrefix.size());
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit))
    return std::nullopt;
  return std::stoll(std::string(digits));
}

std::vector<std::pair<int64_t, std::filesystem::path>> RunDir::checkpoints() const {
  std::vector<std::pair<int64_t, std::filesystem::path>> steps;
  if (!std::filesystem::is_directory(root_)) return steps;
  for (const auto& e : std::filesystem::directory_iterator(root_))
    if (auto n = step_of(e.path().filename().string()); n && e.is_directory()) steps.emplace_back(*n, e.path());
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

bool RunDir::is_complete(const std::filesystem::path& dir) { return std::filesystem::exists(dir / kStateJson); }

void RunDir::remove_partial() const {
  if (!std::filesystem::is_directory(root_)) return;
  for (const auto& e : std::filesystem::directory_iterator(root_)) {
    const std::string name = e.path().filename().string();
    const size_t tmp = name.find(".tmp.");
    if (tmp == std::string::npos) continue;
    if (name.starts_with(kStepPrefix)) {
      std::filesystem::remove_all(e.path());
      continue;
    }
    // A file of write_file_atomic (<name>.tmp.<pid>.<n>, e.g. report.html) whose writer was
    // killed before its rename: removed once that process is gone.
    const std::string rest = name.substr(tmp + 5);
    const size_t dot = rest.find('.');
    const std::string pid_text = rest.substr(0, dot);
    if (pid_text.empty() || !std::all_of(pid_text.begin(), pid_text.end(), ::isdigit) || pid_text.size() > 9) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    if (pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH) {
      std::error_code ec;
      std::filesystem::remove(e.path(), ec);
    }
  }
}

void RunDir::mark_latest(int64_t step) const { write_file_atomic(root_ / kLatestMarker, std::to_string(step) + "\n"); }

void RunDir::prune(std::optional<int64_t> keep) const {
  if (!keep || *keep <= 0) return;
  const auto steps = checkpoints();
  for (size_t i = static_cast<size_t>(*keep); i < steps.size(); ++i) {
    // Renamed out of the loadable names first: a run killed while deleting must not leave a
    // half-deleted global_step_<N> behind (remove_partial() finishes the job on restart).
    std::filesystem::path doomed = steps[i].second;
    doomed += ".tmp.pruned";
    std::filesystem::rename(steps[i].second, doomed);
    std::filesystem::remove_all(doomed);
  }
}

std::vector<std::filesystem::path> RunDir::resume_candidates() const {
  std::vector<std::filesystem::path> out;
  const std::filesystem::path marker = root_ / kLatestMarker;
  if (std::filesystem::exists(marker)) {
    const std::string text = read_file(marker);
    out.push_back(root_ / (std::string(kStepPrefix) + text.substr(0, text.find_first_of("\r\n"))));
  }
  for (const auto& [n, p] : checkpoints())
    if (out.empty() || p != out.front()) out.push_back(p);
  return out;
}

namespace {

std::string this_host() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "unknown";
  return host;
}

// Creates `file` with `content` only when it does not exist. False when it exists.
bool create_exclusive(const std::filesystem::path& file, const std::string& content) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) return false;
    throw IoError(str("cannot create ", file.string(), ": ", std::strerror(errno)));
  }
  try {
    write_fd(fd, content, file);  // core/io: under the write-fault hook
  } catch (...) {
    ::close(fd);
    ::unlink(file.c_str());
    throw;
  }
  ::close(fd);
  return true;
}

}  // namespace

RunDirLock::RunDirLock(const std::filesystem::path& root) : file_(root / kFileName) {
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  if (ec) throw IoError(str("cannot create directory ", root.string(), ": ", ec.message()));
  const std::string host = this_host();
  content_ = str("pid ", ::getpid(), " host ", host, "\n");
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (create_exclusive(file_, content_)) {
      // Two processes taking over the same stale lock at once: the loser finds the
      // winner's content here and is refused below on its next attempt.
      std::string now;
      try {
        now = read_file(file_);
      } catch (const IoError&) {
      }
      if (now == content_) return;
      continue;
    }
    std::string owner;
    try {
      owner = read_file(file_);
    } catch (const IoError&) {
      continue;  // removed meanwhile: try again
    }
    long long pid = 0;
    char owner_host[256] = {};
    const bool parsed = std::sscanf(owner.c_str(), "pid %lld host %255s", &pid, owner_host) == 2 && pid > 0;
    const std::string who = parsed ? str("pid ", pid, " on host ", owner_host) : str("'", owner, "'");
    const bool dead = parsed && owner_host == host && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    if (!dead)
      throw ConfigError(str("trainer.default_local_dir: ", root.string(), " is in use by another rpg (", who,
                            ", lock file ", file_.string(),
                            "); use another directory, or delete the lock file if that process is gone"));
    log_warn(str("taking over the lock of a process that is gone (", who, "): ", file_.string()));
    // Renamed away (atomic) rather than unlinked, then checked: when two processes take
    // over at once, the slower one may have moved the faster one's fresh lock; it puts it
    // back (link fails if a third took the name) and is refused on its next attempt.
    std::filesystem::path aside = file_;
    aside += str(".stale.", ::getpid());
    if (::rename(file_.c_str(), aside.c_str()) != 0) continue;
    std::string moved;
    try {
      moved = read_file(aside);
    } catch (const IoError&) {
    }
    if (moved != owner) (void)::link(aside.c_str(), file_.c_str());
    ::unlink(aside.c_str());
  }
  throw IoError(str("cannot take the lock ", file_.string(), ": it keeps changing (another rpg starting?)"));
}

RunDirLock::~RunDirLock() {
  // Only our own lock: never one a second process took over after declaring us dead.
  try {
    if (read_file(file_) == content_) ::unlink(file_.c_str());
  } catch (...) {
  }
}

void write_train_state(const std::filesystem::path& checkpoint_dir, nlohmann::json state) {
  state["format_version"] = RunDir::kFormatVersion;
  write_file_atomic(checkpoint_dir / kStateJson, state.dump(2) + "\n");
}

nlohmann::json read_train_state(const std::filesystem::path& checkpoint_dir) {
  const std::filesystem::path file = checkpoint_dir / kStateJson;
  auto state = nlohmann::json::parse(read_file(file), nullptr, false);
  if (!state.is_object()) throw FormatError(str(file.string(), ": malformed JSON"));
  const auto version = state.value("format_version", nlohmann::json(1));
  if (!version.is_number_integer() || version.get<int64_t>() < 1)
    throw FormatError(str(file.string(), ": format_version must be a positive integer, got ", version.dump()));
  if (version.get<int64_t>() > RunDir::kFormatVersion)
    throw ConfigError(str(file.string(), ": format_version ", version.get<int64_t>(),
                          " was written by a newer rpg; this one reads versions <= ", RunDir::kFormatVersion,
                          " (upgrade rpg, or set trainer.resume_mode=disable to start over)"));
  return state;
}

}  // namespace rpg::train
