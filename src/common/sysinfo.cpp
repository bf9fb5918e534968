#include "common/sysinfo.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "common/error.h"

namespace spool {

namespace {

// Reads "<key>: <n> kB" from a /proc file; returns bytes or 0.
uint64_t read_kb_field(const char* path, const char* key) {
  std::ifstream f(path);
  std::string line;
  size_t klen = std::strlen(key);
  while (std::getline(f, line)) {
    if (line.compare(0, klen, key) == 0 && line.size() > klen && line[klen] == ':') {
      return std::strtoull(line.c_str() + klen + 1, nullptr, 10) * 1024ull;
    }
  }
  return 0;
}

// Reads a single integer from a file; returns 0 for "max", missing or unparsable files.
uint64_t read_u64_file(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s == "max") return 0;
  return std::strtoull(s.c_str(), nullptr, 10);
}

}  // namespace

uint64_t peak_rss_bytes() { return read_kb_field("/proc/self/status", "VmHWM"); }

uint64_t current_rss_bytes() { return read_kb_field("/proc/self/status", "VmRSS"); }

uint64_t cgroup_memory_limit_bytes() {
  uint64_t v = read_u64_file("/sys/fs/cgroup/memory.max");
  if (v == 0) v = read_u64_file("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  // cgroup v1 reports "no limit" as a huge number.
  if (v > (1ull << 60)) v = 0;
  return v;
}

uint64_t total_memory_bytes() {
  uint64_t total = read_kb_field("/proc/meminfo", "MemTotal");
  uint64_t lim = cgroup_memory_limit_bytes();
  if (lim != 0 && (total == 0 || lim < total)) total = lim;
  return total;
}

uint64_t available_memory_bytes() {
  uint64_t avail = read_kb_field("/proc/meminfo", "MemAvailable");
  uint64_t lim = cgroup_memory_limit_bytes();
  if (lim != 0) {
    uint64_t used = read_u64_file("/sys/fs/cgroup/memory.current");
    if (used == 0) used = read_u64_file("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    uint64_t left = lim > used ? lim - used : 0;
    if (avail == 0 || left < avail) avail = left;
  }
  return avail;
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? strfmt("%llu B", static_cast<unsigned long long>(bytes)) : strfmt("%.2f %s", v, units[u]);
}

}  // namespace spool
