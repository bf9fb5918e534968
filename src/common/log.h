// Minimal stderr logging: info lines are suppressed by --quiet (set_log_level).
#pragma once

#include <cstdio>

#include "common/error.h"

namespace spool {

/// Log levels, most verbose last.
enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

/// Current process-wide log level (default kInfo).
LogLevel log_level();
/// Sets the process-wide log level.
void set_log_level(LogLevel level);

/// Writes "spool: <msg>\n" to stderr if `level` is enabled.
void log_line(LogLevel level, const std::string& msg);

template <typename... Args>
void log_info(const char* fmt, Args&&... args) {
  if (log_level() >= LogLevel::kInfo) log_line(LogLevel::kInfo, strfmt(fmt, args...));
}
template <typename... Args>
void log_warn(const char* fmt, Args&&... args) {
  if (log_level() >= LogLevel::kWarn) log_line(LogLevel::kWarn, strfmt(fmt, args...));
}
template <typename... Args>
void log_debug(const char* fmt, Args&&... args) {
  if (log_level() >= LogLevel::kDebug) log_line(LogLevel::kDebug, strfmt(fmt, args...));
}

}  // namespace spool
