#include "rpg/core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

namespace rpg {
namespace {

LogLevel initial_level() {
  const char* env = std::getenv("RPG_LOG_LEVEL");
  if (!env || !*env) return LogLevel::Info;
  try {
    return parse_log_level(env);
  } catch (const ConfigError&) {
    return LogLevel::Info;
  }
}

std::atomic<LogLevel>& level_ref() {
  static std::atomic<LogLevel> level{initial_level()};
  return level;
}

}  // namespace

void set_log_level(LogLevel level) { level_ref().store(level); }
LogLevel log_level() { return level_ref().load(std::memory_order_relaxed); }

LogLevel parse_log_level(std::string_view name) {
  if (name == "debug") return LogLevel::Debug;
  if (name == "info") return LogLevel::Info;
  if (name == "warn" || name == "warning") return LogLevel::Warn;
  if (name == "error") return LogLevel::Error;
  if (name == "off") return LogLevel::Off;
  throw ConfigError(str("log level: expected debug, info, warn, error or off, got '", name, "'"));
}

void log_line(LogLevel level, std::string_view message) {
  static std::mutex mu;
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[16];
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", &tm);
  const char* tag = level == LogLevel::Warn ? " warning:" : level == LogLevel::Error ? " error:" : "";
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[rpg %s]%s %.*s\n", stamp, tag, static_cast<int>(message.size()), message.data());
  std::fflush(stderr);
}

}  // namespace rpg
