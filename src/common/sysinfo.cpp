#include "common/sysinfo.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
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

}  // namespace

uint64_t peak_rss_bytes() { return read_kb_field("/proc/self/status", "VmHWM"); }

uint64_t current_rss_bytes() { return read_kb_field("/proc/self/status", "VmRSS"); }

namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  if (!f) return {};
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The first whitespace-separated word of `text` as an unsigned integer; 0 if it is not one.
uint64_t first_u64(const std::string& text) {
  std::stringstream ss(text);
  std::string s;
  if (!(ss >> s)) return 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  return end == s.c_str() || *end != '\0' ? 0 : v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t b = 0;
  for (;;) {
    size_t e = s.find(sep, b);
    out.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) return out;
    b = e + 1;
  }
}

// A mount of a cgroup hierarchy: the hierarchy path `root` appears at `point`.
struct CgroupMount {
  std::string root, point;
};

// The directories of `path` and its ancestors up to the mount's root, innermost first.
void walk_up(const CgroupMount& m, const std::string& path, int version, std::vector<CgroupDir>* out) {
  const std::string& root = m.root == "/" ? std::string() : m.root;
  const bool inside = path.find("/..") == std::string::npos &&
                      (root.empty() ? !path.empty() && path[0] == '/' : path == root || path.compare(0, root.size() + 1, root + "/") == 0);
  if (!inside) {  // another cgroup namespace's view: only the mount point is ours to read
    out->push_back({m.point, version});
    return;
  }
  std::string rel = path.substr(root.size());  // "" or "/a/b"
  for (;;) {
    out->push_back({m.point + (rel == "/" ? "" : rel), version});
    if (rel.empty() || rel == "/") break;
    const size_t p = rel.find_last_of('/');
    rel = rel.substr(0, p);
  }
}

}  // namespace

uint64_t parse_cgroup_limit(const std::string& text) {
  const uint64_t v = first_u64(text);  // "max" and junk: 0
  return v >= (1ull << 60) ? 0 : v;
}

uint64_t parse_inactive_file(const std::string& memory_stat, int version) {
  std::stringstream ss(memory_stat);
  std::string key;
  unsigned long long value = 0;
  uint64_t local = 0, total = 0;
  bool has_total = false;
  while (ss >> key >> value) {
    if (key == "inactive_file") local = value;
    if (key == "total_inactive_file") total = value, has_total = true;
  }
  return version == 1 && has_total ? total : local;
}

std::vector<CgroupDir> cgroup_memory_dirs(const std::string& proc_cgroup, const std::string& mountinfo) {
  // Mounts: "id parent maj:min root point options [optional...] - fstype source super_options".
  std::optional<CgroupMount> v1, v2;
  std::stringstream mi(mountinfo);
  std::string line;
  while (std::getline(mi, line)) {
    const std::vector<std::string> f = split(line, ' ');
    size_t dash = 0;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (dash < 5 || dash + 3 > f.size()) continue;
    const std::string& fstype = f[dash + 1];
    const std::string super = "," + f[dash + 3] + ",";
    if (fstype == "cgroup2" && !v2) v2 = CgroupMount{f[3], f[4]};
    if (fstype == "cgroup" && super.find(",memory,") != std::string::npos && !v1) v1 = CgroupMount{f[3], f[4]};
  }
  std::vector<CgroupDir> dirs;
  std::stringstream pc(proc_cgroup);
  while (std::getline(pc, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), ctrl = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (id == "0" && ctrl.empty()) walk_up(v2.value_or(CgroupMount{"/", "/sys/fs/cgroup"}), path, 2, &dirs);
    else if (("," + ctrl + ",").find(",memory,") != std::string::npos)
      walk_up(v1.value_or(CgroupMount{"/", "/sys/fs/cgroup/memory"}), path, 1, &dirs);
  }
  return dirs;
}

uint64_t CgroupMemory::available() const {
  if (version == 0) return 0;
  const uint64_t used = usage > inactive_file ? usage - inactive_file : 0;
  return limit > used ? limit - used : 0;
}

std::string CgroupMemory::describe() const {
  if (version == 0) return "no cgroup memory limit";
  return strfmt("cgroup v%d %s: limit %s - (usage %s - inactive file %s)", version, dir.c_str(), format_bytes(limit).c_str(),
                format_bytes(usage).c_str(), format_bytes(inactive_file).c_str());
}

CgroupMemory cgroup_memory(const std::vector<CgroupDir>& dirs) {
  CgroupMemory best;
  for (const auto& d : dirs) {
    const bool v2 = d.version == 2;
    const uint64_t limit = parse_cgroup_limit(read_text(d.path + (v2 ? "/memory.max" : "/memory.limit_in_bytes")));
    if (limit == 0) continue;
    CgroupMemory c;
    c.version = d.version;
    c.dir = d.path;
    c.limit = limit;
    c.usage = first_u64(read_text(d.path + (v2 ? "/memory.current" : "/memory.usage_in_bytes")));
    c.inactive_file = parse_inactive_file(read_text(d.path + "/memory.stat"), d.version);
    const uint64_t tight = best.tightest_limit == 0 ? limit : std::min(best.tightest_limit, limit);
    if (best.version == 0 || c.available() < best.available()) best = c;
    best.tightest_limit = tight;
  }
  return best;
}

CgroupMemory cgroup_memory() { return cgroup_memory(cgroup_memory_dirs(read_text("/proc/self/cgroup"), read_text("/proc/self/mountinfo"))); }

uint64_t cgroup_memory_limit_bytes() { return cgroup_memory().tightest_limit; }

uint64_t total_memory_bytes() {
  uint64_t total = read_kb_field("/proc/meminfo", "MemTotal");
  uint64_t lim = cgroup_memory_limit_bytes();
  if (lim != 0 && (total == 0 || lim < total)) total = lim;
  return total;
}

uint64_t available_memory_bytes() {
  uint64_t avail = read_kb_field("/proc/meminfo", "MemAvailable");
  const CgroupMemory cg = cgroup_memory();
  if (cg.version != 0) {
    const uint64_t left = cg.available();
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
