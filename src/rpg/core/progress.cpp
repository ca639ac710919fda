#include "rpg/core/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <exception>

#include "rpg/core/error.h"

namespace rpg {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%02lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit, double log_interval_s, std::FILE* out)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(std::max<int64_t>(total, 0)),
      log_interval_s_(log_interval_s),
      out_(out),
      tty_(out && isatty(fileno(out))),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {
  draw(true);
}

ProgressBar::~ProgressBar() {
  // Unwinding from an error: the error message is the last word, not a final bar.
  if (std::uncaught_exceptions() > 0) {
    if (tty_ && out_ && !finished_) std::fputc('\n', out_);
    return;
  }
  finish();
}

void ProgressBar::advance(int64_t n, const std::string& postfix) {
  std::lock_guard lock(mu_);
  done_ += n;
  if (!postfix.empty()) postfix_ = postfix;
  draw(false);
}

void ProgressBar::set_postfix(const std::string& postfix) {
  std::lock_guard lock(mu_);
  postfix_ = postfix;
  draw(false);
}

void ProgressBar::finish() {
  std::lock_guard lock(mu_);
  if (finished_) return;
  finished_ = true;
  draw(true);
  if (tty_ && out_) std::fputc('\n', out_);
}

std::string ProgressBar::render_locked() const {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
  double remaining = rate > 0 ? static_cast<double>(total_ - done_) / rate : NAN;
  double frac = total_ > 0 ? std::min(1.0, static_cast<double>(done_) / static_cast<double>(total_)) : 1.0;
  const int width = 20;
  int filled = static_cast<int>(frac * width);
  std::string bar = std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(width - filled), ' ');
  char rate_buf[32];
  std::snprintf(rate_buf, sizeof rate_buf, "%.2f", rate);
  return str(label_, " ", static_cast<int>(frac * 100), "% |", bar, "| ", done_, "/", total_, " [",
             format_duration(elapsed), "<", done_ >= total_ ? "00:00" : format_duration(remaining), ", ", rate_buf, " ",
             unit_, "/s]", postfix_.empty() ? "" : " " + postfix_);
}

void ProgressBar::draw(bool force) {
  if (!out_) return;
  auto now = std::chrono::steady_clock::now();
  double since = std::chrono::duration<double>(now - last_draw_).count();
  double min_interval = tty_ ? 0.1 : log_interval_s_;
  if (!force && since < min_interval) return;
  last_draw_ = now;
  std::string line = render_locked();
  if (tty_) std::fprintf(out_, "\r\033[2K%s", line.c_str());
  else std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

}  // namespace rpg
