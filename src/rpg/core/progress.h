// A progress bar on stderr: `label  42% |#####     | 42/100 [00:12<00:16, 3.4 it/s] postfix`.
// On a terminal it redraws one line in place; otherwise (logs, CI) it prints a line at most
// every `log_interval_s` seconds and at the end, so log files stay short. Thread-safe: any
// thread may advance it (tests/core/threads_test.cpp, also under ThreadSanitizer).
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace rpg {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, std::string unit = "it", double log_interval_s = 10.0,
              std::FILE* out = stderr);
  ~ProgressBar();
  // Advances by n and shows `postfix` (e.g. "reward=0.41 tok/s=812").
  void advance(int64_t n = 1, const std::string& postfix = {});
  void set_postfix(const std::string& postfix);
  // Draws the final state and ends the line. Called by the destructor if not before.
  void finish();
  int64_t done() const {
    std::lock_guard lock(mu_);
    return done_;
  }
  // The rendered line without any terminal control characters.
  std::string render() const {
    std::lock_guard lock(mu_);
    return render_locked();
  }

 private:
  std::string render_locked() const;
  void draw(bool force);
  mutable std::mutex mu_;
  std::string label_, unit_, postfix_;
  int64_t total_, done_ = 0;
  double log_interval_s_;
  std::FILE* out_;
  bool tty_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// "1:02:03" or "02:03" for a number of seconds.
std::string format_duration(double seconds);

}  // namespace rpg
