#include "common/log.h"

#include <atomic>

namespace spool {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
}

LogLevel log_level() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }

void log_line(LogLevel level, const std::string& msg) {
  const char* tag = level == LogLevel::kError ? "error: " : level == LogLevel::kWarn ? "warning: " : "";
  std::fprintf(stderr, "spool: %s%s\n", tag, msg.c_str());
}

}  // namespace spool
