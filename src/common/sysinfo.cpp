#include "common/sysinfo.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

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

namespace {

// Memory-controller directories of this process's cgroup and its ancestors (innermost
// first), for cgroup v2 ("0::/path") and v1 ("N:...memory...:/path").
struct CgroupDirs {
  std::vector<std::string> v2, v1;
};

CgroupDirs cgroup_dirs() {
  CgroupDirs d;
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  auto ancestors = [](const std::string& root, std::string path, std::vector<std::string>* out) {
    for (;;) {
      out->push_back(root + (path == "/" ? "" : path));
      if (path == "/" || path.empty()) break;
      size_t p = path.find_last_of('/');
      path = p == 0 ? "/" : path.substr(0, p);
    }
  };
  while (std::getline(f, line)) {
    size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string ctrl = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && ctrl.empty()) {
      ancestors("/sys/fs/cgroup", path, &d.v2);
      ancestors("/sys/fs/cgroup/unified", path, &d.v2);
    } else if ((',' + ctrl + ',').find(",memory,") != std::string::npos) {
      ancestors("/sys/fs/cgroup/memory", path, &d.v1);
    }
  }
  return d;
}

}  // namespace

uint64_t cgroup_memory_limit_bytes() {
  // The tightest limit on the path from this cgroup to the root.
  uint64_t best = 0;
  CgroupDirs d = cgroup_dirs();
  for (const auto& dir : d.v2) {
    uint64_t v = read_u64_file((dir + "/memory.max").c_str());
    if (v != 0 && (best == 0 || v < best)) best = v;
  }
  for (const auto& dir : d.v1) {
    uint64_t v = read_u64_file((dir + "/memory.limit_in_bytes").c_str());
    if (v > (1ull << 60)) v = 0;  // v1 reports "no limit" as a huge number
    if (v != 0 && (best == 0 || v < best)) best = v;
  }
  return best;
}

// Usage of the cgroup whose limit is the tightest (0 if none).
static uint64_t cgroup_memory_usage_bytes() {
  uint64_t best_limit = 0, usage = 0;
  CgroupDirs d = cgroup_dirs();
  for (const auto& dir : d.v2) {
    uint64_t v = read_u64_file((dir + "/memory.max").c_str());
    if (v != 0 && (best_limit == 0 || v < best_limit)) {
      best_limit = v;
      usage = read_u64_file((dir + "/memory.current").c_str());
    }
  }
  for (const auto& dir : d.v1) {
    uint64_t v = read_u64_file((dir + "/memory.limit_in_bytes").c_str());
    if (v > (1ull << 60)) v = 0;
    if (v != 0 && (best_limit == 0 || v < best_limit)) {
      best_limit = v;
      usage = read_u64_file((dir + "/memory.usage_in_bytes").c_str());
    }
  }
  return usage;
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
    const uint64_t used = cgroup_memory_usage_bytes();
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
