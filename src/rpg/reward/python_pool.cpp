#include "rpg/reward/python_pool.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "rpg/core/error.h"

extern char** environ;

namespace rpg::reward {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

// The worker's end of the socket becomes this descriptor (reward_worker.py reads fd 3).
constexpr int kChannelFd = 3;

std::string exit_description(int status) {
  if (WIFSIGNALED(status)) return str("killed by signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  if (WIFEXITED(status)) return str("exited with status ", WEXITSTATUS(status));
  return "stopped";
}

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

struct Worker {
  enum class State { kDead, kStarting, kIdle, kBusy };
  State state = State::kDead;
  pid_t pid = -1;
  int fd = -1;
  std::string received;  // bytes read and not yet a whole line
  std::string to_send;   // bytes of the pending request not yet written
  std::vector<size_t> items;  // request indices of the batch in flight, in order
  size_t done = 0;            // how many of `items` have been answered
  Clock::time_point deadline;
};

class PythonPool final : public RewardScorer {
 public:
  explicit PythonPool(PythonRewardOptions options) : o_(std::move(options)) {
    const size_t n = o_.num_workers > 0 ? static_cast<size_t>(o_.num_workers)
                                        : std::max(1u, std::thread::hardware_concurrency());
    workers_.resize(n);
    try {
      for (auto& w : workers_) start(w);
      wait_until([&] {
        return std::none_of(workers_.begin(), workers_.end(),
                            [](const Worker& w) { return w.state == Worker::State::kStarting; });
      });
    } catch (...) {
      stop_all();
      throw;
    }
  }
  ~PythonPool() override { stop_all(); }
  PythonPool(const PythonPool&) = delete;
  PythonPool& operator=(const PythonPool&) = delete;

  void check_data_source(std::string_view) const override {}

  std::string describe() const override { return str("custom_reward_function ", o_.path, ":", o_.name); }

  RewardScores score(std::span<const ScoreRequest> requests) override {
    // The workers serve one batch at a time; callers on other threads wait their turn.
    std::lock_guard lock(mutex_);
    if (broken_) throw ValueError(str(describe(), ": the worker pool stopped after an earlier error"));
    try {
      return score_all(requests);
    } catch (...) {
      broken_ = true;
      stop_all();
      throw;
    }
  }

 private:
  void start(Worker& w) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      throw IoError(str(describe(), ": socketpair: ", std::strerror(errno)));
    // posix_spawn's dup2 onto the same number would keep close-on-exec set.
    int child = sv[1];
    if (child == kChannelFd) {
      child = fcntl(sv[1], F_DUPFD_CLOEXEC, 10);
      ::close(sv[1]);
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, child, kChannelFd);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    // Its own process group: Ctrl-C reaches rpg, which finishes the step (and so still needs
    // its scorers), not the workers.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    const std::string source = reward_worker_source();
    std::vector<std::string> args{o_.python, "-c", source, o_.path, o_.name, o_.kwargs_json};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    const bool search = o_.python.find('/') == std::string::npos;
    const int rc = search ? posix_spawnp(&pid, o_.python.c_str(), &actions, &attr, argv.data(), environ)
                          : posix_spawn(&pid, o_.python.c_str(), &actions, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    ::close(child);
    if (rc != 0) {
      ::close(sv[0]);
      throw ConfigError(str("custom_reward_function.python: cannot start '", o_.python, "': ", std::strerror(rc)));
    }
    fcntl(sv[0], F_SETFL, fcntl(sv[0], F_GETFL) | O_NONBLOCK);
    w = Worker{};
    w.state = Worker::State::kStarting;
    w.pid = pid;
    w.fd = sv[0];
    w.deadline = Clock::now() + seconds(o_.start_timeout_s);
  }

  // Kills and reaps one worker; returns its wait status. The whole process group goes: a
  // function that started processes of its own (a sandbox, a verifier binary) leaves none.
  static int stop(Worker& w) {
    int status = 0;
    if (w.fd >= 0) ::close(w.fd);
    if (w.pid > 0) {
      ::kill(-w.pid, SIGKILL);
      ::kill(w.pid, SIGKILL);
      while (::waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
      }
    }
    w = Worker{};
    return status;
  }

  void stop_all() {
    for (auto& w : workers_) stop(w);
  }

  // Runs the event loop until `finished()`; every event is handled by on_line / on_exit /
  // on_deadline, which throw for what stops the run.
  template <class Finished>
  void wait_until(Finished finished) {
    std::vector<pollfd> fds;
    std::vector<Worker*> owners;
    while (!finished()) {
      fill_idle_workers();
      fds.clear();
      owners.clear();
      Clock::time_point next = Clock::time_point::max();
      for (auto& w : workers_) {
        if (w.state == Worker::State::kDead) continue;
        short events = POLLIN;
        if (!w.to_send.empty()) events |= POLLOUT;
        fds.push_back({w.fd, events, 0});
        owners.push_back(&w);
        if (w.state == Worker::State::kStarting || w.state == Worker::State::kBusy) next = std::min(next, w.deadline);
      }
      if (fds.empty()) throw ValueError(str(describe(), ": no worker is running"));
      int timeout_ms = -1;
      if (next != Clock::time_point::max()) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count();
        timeout_ms = static_cast<int>(std::clamp<int64_t>(left + 1, 0, 60'000));
      }
      const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
      if (ready < 0 && errno != EINTR) throw IoError(str(describe(), ": poll: ", std::strerror(errno)));
      for (size_t i = 0; ready > 0 && i < fds.size(); ++i) {
        Worker& w = *owners[i];
        if (fds[i].revents & POLLOUT) write_some(w);
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_some(w);
      }
      const auto now = Clock::now();
      for (auto& w : workers_)
        if ((w.state == Worker::State::kStarting || w.state == Worker::State::kBusy) && now >= w.deadline)
          on_deadline(w);
    }
  }

  void write_some(Worker& w) {
    while (!w.to_send.empty()) {
      const ssize_t k = ::send(w.fd, w.to_send.data(), w.to_send.size(), MSG_NOSIGNAL);
      if (k < 0) return;  // full (EAGAIN): poll again; gone: the read side reports it
      w.to_send.erase(0, static_cast<size_t>(k));
    }
  }

  void read_some(Worker& w) {
    char buf[65536];
    while (w.state != Worker::State::kDead) {
      const ssize_t k = ::recv(w.fd, buf, sizeof buf, 0);
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        on_exit(w);
        return;
      }
      if (k == 0) {
        on_exit(w);
        return;
      }
      w.received.append(buf, static_cast<size_t>(k));
      size_t nl;
      while (w.state != Worker::State::kDead && (nl = w.received.find('\n')) != std::string::npos) {
        std::string line = w.received.substr(0, nl);
        w.received.erase(0, nl + 1);
        on_line(w, line);
      }
    }
  }

  void on_line(Worker& w, const std::string& line) {
    Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) throw FormatError(str(describe(), ": the worker sent an unreadable line"));
    if (w.state == Worker::State::kStarting) {
      if (j.contains("fatal")) throw ConfigError(str(describe(), ": ", j["fatal"].get<std::string>()));
      w.state = Worker::State::kIdle;
      return;
    }
    if (w.state != Worker::State::kBusy || w.done >= w.items.size())
      throw FormatError(str(describe(), ": the worker answered a request it was not sent"));
    const size_t i = w.items[w.done];
    if (j.contains("error"))
      throw ValueError(str(describe(), " ", j["error"].get<std::string>(), " (response ", i, ", data_source '",
                           (*requests_)[i].data_source, "')"));
    ScoreResult& r = out_->results[i];
    r.score = j.at("score").get<double>();
    r.acc = j.contains("acc") ? j["acc"].get<bool>() : r.score > 0;
    if (j.contains("pred")) r.pred = j["pred"].get<std::string>();
    if (j.contains("extra"))
      for (auto it = j["extra"].begin(); it != j["extra"].end(); ++it) {
        auto [slot, added] = out_->extra.try_emplace(it.key());
        if (added) slot->second.assign(requests_->size(), std::numeric_limits<double>::quiet_NaN());
        slot->second[i] = it.value().get<double>();
      }
    --remaining_;
    if (++w.done == w.items.size()) {
      w.state = Worker::State::kIdle;
      w.items.clear();
    } else {
      w.deadline = Clock::now() + seconds(o_.timeout_s);
    }
  }

  // The worker closed its end: it crashed (or the user's code called os._exit).
  void on_exit(Worker& w) {
    const Worker::State state = w.state;
    std::vector<size_t> unanswered(w.items.begin() + static_cast<std::ptrdiff_t>(w.done), w.items.end());
    const int status = stop(w);
    if (state == Worker::State::kStarting)
      throw ConfigError(str(describe(), ": the worker ", exit_description(status),
                            " while importing the file (its output is above)"));
    if (!unanswered.empty()) {
      const size_t i = unanswered.front();
      if (++crashes_[i] >= o_.max_crashes)
        throw ValueError(str(describe(), ": the worker ", exit_description(status), " ", crashes_[i],
                             " times scoring response ", i, " (data_source '", (*requests_)[i].data_source,
                             "'; its output is above)"));
      requeue(unanswered);
    }
    start(w);
  }

  void on_deadline(Worker& w) {
    if (w.state == Worker::State::kStarting)
      throw ConfigError(str(describe(), ": the worker did not finish importing the file within ", o_.start_timeout_s, " s"));
    const size_t i = w.items[w.done];
    out_->results[i] = ScoreResult{o_.timeout_score, false, std::nullopt};
    ++out_->timeouts;
    --remaining_;
    std::vector<size_t> rest(w.items.begin() + static_cast<std::ptrdiff_t>(w.done) + 1, w.items.end());
    stop(w);
    requeue(rest);
    start(w);
  }

  void requeue(const std::vector<size_t>& items) { queue_.insert(queue_.begin(), items.begin(), items.end()); }

  void fill_idle_workers() {
    for (auto& w : workers_) {
      if (w.state != Worker::State::kIdle || queue_.empty()) continue;
      Json items = Json::array();
      while (!queue_.empty() && w.items.size() < chunk_) {
        const size_t i = queue_.front();
        queue_.pop_front();
        const ScoreRequest& q = (*requests_)[i];
        Json extra = q.extra_info.empty() ? Json(nullptr) : Json::parse(q.extra_info);
        items.push_back({{"data_source", q.data_source},
                         {"solution_str", q.response},
                         {"ground_truth", q.ground_truth},
                         {"extra_info", std::move(extra)}});
        w.items.push_back(i);
      }
      // A response cut inside a UTF-8 sequence reaches Python as U+FFFD, as verl's decode gives it.
      w.to_send = Json{{"items", std::move(items)}}.dump(-1, ' ', true, Json::error_handler_t::replace) + "\n";
      w.done = 0;
      w.state = Worker::State::kBusy;
      w.deadline = Clock::now() + seconds(o_.timeout_s);
      write_some(w);
    }
  }

  RewardScores score_all(std::span<const ScoreRequest> requests) {
    RewardScores out;
    out.results.resize(requests.size());
    requests_ = &requests;
    out_ = &out;
    remaining_ = requests.size();
    crashes_.clear();
    queue_.clear();
    for (size_t i = 0; i < requests.size(); ++i) queue_.push_back(i);
    // Small batches keep the workers evenly loaded and a timeout's requeue short.
    const size_t per_worker = (requests.size() + 4 * workers_.size() - 1) / (4 * workers_.size());
    chunk_ = std::clamp<size_t>(per_worker, 1, 64);
    wait_until([&] { return remaining_ == 0; });
    requests_ = nullptr;
    out_ = nullptr;
    return out;
  }

  PythonRewardOptions o_;
  std::mutex mutex_;
  std::vector<Worker> workers_;
  bool broken_ = false;
  // State of the score() call in progress.
  const std::span<const ScoreRequest>* requests_ = nullptr;
  RewardScores* out_ = nullptr;
  size_t remaining_ = 0, chunk_ = 1;
  std::deque<size_t> queue_;
  std::map<size_t, int64_t> crashes_;
};

}  // namespace

std::unique_ptr<RewardScorer> make_python_scorer(const PythonRewardOptions& options) {
  if (options.path.empty()) throw ConfigError("custom_reward_function.path: empty");
  std::error_code ec;
  if (!std::filesystem::is_regular_file(options.path, ec))
    throw ConfigError(str("custom_reward_function.path: ", options.path, ": no such file"));
  if (options.name.empty()) throw ConfigError("custom_reward_function.name: empty");
  if (!(options.timeout_s > 0)) throw ConfigError("reward_model.timeout_s: must be > 0");
  if (!std::isfinite(options.timeout_score)) throw ConfigError("reward_model.timeout_score: must be finite");
  if (options.num_workers < 0) throw ConfigError("reward_model.num_workers: must be >= 0 (0: one per core)");
  Json kwargs = Json::parse(options.kwargs_json, nullptr, false);
  if (!kwargs.is_object()) throw ConfigError("custom_reward_function.reward_kwargs: must be a mapping");
  return std::make_unique<PythonPool>(options);
}

}  // namespace rpg::reward
