// Process and machine memory facts, read from /proc and cgroup files (Linux).
#pragma once

#include <cstdint>
#include <string>

namespace spool {

/// Peak resident set size of this process in bytes (VmHWM from /proc/self/status); 0 if unknown.
uint64_t peak_rss_bytes();
/// Current resident set size in bytes (VmRSS); 0 if unknown.
uint64_t current_rss_bytes();
/// Memory available to this process in bytes: min(MemAvailable, cgroup limit - cgroup usage).
uint64_t available_memory_bytes();
/// Total physical memory in bytes (MemTotal), capped by the cgroup limit if one is set.
uint64_t total_memory_bytes();
/// cgroup v2/v1 memory limit in bytes, or 0 if none is set.
uint64_t cgroup_memory_limit_bytes();
/// Seconds since an arbitrary fixed point (steady clock).
double now_seconds();
/// Human-readable byte count, e.g. "1.23 GiB".
std::string format_bytes(uint64_t bytes);

}  // namespace spool
