// tests/oracles/reward_http_server.py as a child process of a test: started with the
// venv's Python, its port read from its first line of output, killed and reaped when the
// object dies (however the test ends). Used by the reward service client's tests and by
// `rpg train reward_model.url=...` end to end.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_util.h"

extern char** environ;

namespace rpg::test {

// The server process, killed and reaped when the test ends however it ends.
class RewardServer {
 public:
  explicit RewardServer(const std::vector<std::string>& flags = {}) {
    int out[2];
    if (pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
    std::vector<std::string> argv = {python().string(), (source_dir() / "tests/oracles/reward_http_server.py").string()};
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    const int rc = posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    stdout_ = out[0];
    if (rc != 0) {
      pid_ = -1;
      throw std::runtime_error("posix_spawn " + argv[0] + ": " + std::strerror(rc));
    }
    // The port is the first line; a server that cannot start must fail the test, not hang it.
    std::string line;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (line.find('\n') == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{stdout_, POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0)
        throw std::runtime_error("reward_http_server.py did not print its port within 60 s");
      char buf[256];
      const ssize_t n = read(stdout_, buf, sizeof buf);
      if (n <= 0) throw std::runtime_error("reward_http_server.py exited before printing its port");
      line.append(buf, static_cast<size_t>(n));
    }
    port_ = std::stoi(line);
  }

  ~RewardServer() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    if (stdout_ >= 0) close(stdout_);
  }

  RewardServer(const RewardServer&) = delete;
  RewardServer& operator=(const RewardServer&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/score"; }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int stdout_ = -1;
  int port_ = 0;
};

}  // namespace rpg::test
