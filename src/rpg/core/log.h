// Console logging to stderr: `[rpg HH:MM:SS] message`. Thread-safe, one line per call.
// Level from set_log_level() or the RPG_LOG_LEVEL environment variable
// (debug, info, warn, error; default info).
#pragma once

#include <string>
#include <string_view>

#include "rpg/core/error.h"

namespace rpg {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3, Off = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
// Parses "debug" / "info" / "warn" / "error" / "off"; throws ConfigError otherwise.
LogLevel parse_log_level(std::string_view name);
void log_line(LogLevel level, std::string_view message);

template <class... Args>
void log_debug(Args&&... args) {
  if (log_level() <= LogLevel::Debug) log_line(LogLevel::Debug, str(std::forward<Args>(args)...));
}
template <class... Args>
void log_info(Args&&... args) {
  if (log_level() <= LogLevel::Info) log_line(LogLevel::Info, str(std::forward<Args>(args)...));
}
template <class... Args>
void log_warn(Args&&... args) {
  if (log_level() <= LogLevel::Warn) log_line(LogLevel::Warn, str(std::forward<Args>(args)...));
}

}  // namespace rpg
