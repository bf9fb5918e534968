#include "cli/probe.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "common/sysinfo.h"
#include "ops/vec.h"

namespace spool::plan {

double measure_memory_gbps(uint64_t bytes, int threads, double seconds) {
  threads = std::max(threads, 1);
  const size_t n = static_cast<size_t>(bytes / sizeof(uint64_t));
  std::unique_ptr<uint64_t[]> buf(new uint64_t[n]);  // not value-initialized: written once below
  for (size_t i = 0; i < n; ++i) buf[i] = i;          // touch every page
  double best = 0;
  const double t_end = now_seconds() + seconds;
  std::atomic<uint64_t> sink{0};
  do {
    const double t0 = now_seconds();
    std::vector<std::thread> th;
    for (int k = 0; k < threads; ++k) {
      th.emplace_back([&, k] {
        const size_t b = n * k / threads, e = n * (k + 1) / threads;
        sink += ops::read_sum(buf.get() + b, static_cast<int64_t>(e - b));  // SIMD loads, as the kernels read
      });
    }
    for (auto& t : th) t.join();
    const double dt = now_seconds() - t0;
    if (dt > 0) best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / dt / 1e9);
  } while (now_seconds() < t_end);
  return best;
}

namespace {

// First line of a small text file, whitespace trimmed; "" when it cannot be read.
std::string read_line(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::string s;
  if (!f || !std::getline(f, s)) return "";
  const auto b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// sysfs cache size text ("266240K", "32M", "512") in bytes; 0 when unparsable.
uint64_t parse_cache_size(const std::string& s) {
  size_t used = 0;
  uint64_t v = 0;
  try {
    v = std::stoull(s, &used);
  } catch (...) {
    return 0;
  }
  const std::string unit = s.substr(used);
  if (unit.empty()) return v;
  if (unit == "K") return v << 10;
  if (unit == "M") return v << 20;
  if (unit == "G") return v << 30;
  return 0;
}

// True for `prefix` followed by one or more digits ("cpu12", "index3").
bool numbered(const std::string& name, const char* prefix) {
  const size_t n = std::strlen(prefix);
  return name.size() > n && name.compare(0, n, prefix) == 0 &&
         std::all_of(name.begin() + static_cast<std::ptrdiff_t>(n), name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

uint64_t last_level_cache_bytes(const std::string& root) {
  namespace fs = std::filesystem;
  std::error_code ec;
  // level -> (shared_cpu_list -> size): one entry per cache instance of each level.
  std::map<int, std::map<std::string, uint64_t>> caches;
  for (const auto& cpu : fs::directory_iterator(root, ec)) {
    if (!numbered(cpu.path().filename().string(), "cpu")) continue;
    std::error_code ec2;
    for (const auto& idx : fs::directory_iterator(cpu.path() / "cache", ec2)) {
      if (!numbered(idx.path().filename().string(), "index")) continue;
      const std::string type = read_line(idx.path() / "type");
      if (type != "Data" && type != "Unified") continue;
      int level = 0;
      try {
        level = std::stoi(read_line(idx.path() / "level"));
      } catch (...) {
        continue;
      }
      const uint64_t size = parse_cache_size(read_line(idx.path() / "size"));
      if (level <= 0 || size == 0) continue;
      std::string shared = read_line(idx.path() / "shared_cpu_list");
      if (shared.empty()) shared = cpu.path().filename().string();  // unknown sharing: one per CPU
      caches[level][shared] = size;
    }
  }
  if (caches.empty()) return 0;
  uint64_t total = 0;
  for (const auto& [shared, size] : caches.rbegin()->second) total += size;
  return total;
}

uint64_t memory_probe_bytes(uint64_t llc_bytes, uint64_t available_bytes) {
  constexpr uint64_t kMiB = 1ull << 20;
  uint64_t b = std::max<uint64_t>(256 * kMiB, llc_bytes > (UINT64_MAX >> 2) ? UINT64_MAX : 4 * llc_bytes);
  b = std::min<uint64_t>(b, 2048 * kMiB);
  if (available_bytes > 0) b = std::min<uint64_t>(b, available_bytes / 4);
  return std::max<uint64_t>(b / kMiB * kMiB, 16 * kMiB);
}

DiskProbe measure_disk_gbps(const std::string& path, uint64_t bytes, uint64_t block, int depth, double seconds) {
  DiskProbe p;
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  p.direct = fd >= 0;
  if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    p.error = path + ": " + std::strerror(errno);
    return p;
  }
  struct stat st {};
  fstat(fd, &st);
  const uint64_t size = static_cast<uint64_t>(st.st_size) / 4096 * 4096;
  if (size < block) {
    p.error = path + ": too small for a read probe";
    ::close(fd);
    return p;
  }
  const uint64_t blocks_in_file = size / block;
  const uint64_t want = std::min<uint64_t>(bytes / block, blocks_in_file);
  std::atomic<uint64_t> next{0}, done_bytes{0};
  std::atomic<bool> failed{false};
  const double t0 = now_seconds();
  std::vector<std::thread> th;
  for (int k = 0; k < std::max(depth, 1); ++k) {
    th.emplace_back([&] {
      void* mem = std::aligned_alloc(4096, block);
      if (mem == nullptr) {
        failed = true;
        return;
      }
      for (;;) {
        const uint64_t i = next++;
        if (i >= want || now_seconds() - t0 > seconds) break;
        // Spread the blocks over the file (stride), as expert reads are.
        const uint64_t blk = (i * 7919) % blocks_in_file;
        const ssize_t r = ::pread(fd, mem, block, static_cast<off_t>(blk * block));
        if (r <= 0) {
          failed = true;
          break;
        }
        done_bytes += static_cast<uint64_t>(r);
        if (!p.direct) posix_fadvise(fd, static_cast<off_t>(blk * block), static_cast<off_t>(block), POSIX_FADV_DONTNEED);
      }
      std::free(mem);
    });
  }
  for (auto& t : th) t.join();
  const double dt = now_seconds() - t0;
  ::close(fd);
  if (failed || done_bytes == 0) {
    p.error = path + ": read failed";
    return p;
  }
  p.ok = true;
  p.bytes = done_bytes;
  p.gbps = static_cast<double>(done_bytes) / dt / 1e9;
  return p;
}

bool direct_io_supported(const std::string& dir, std::string* detail) {
  std::string path = dir + "/.spool-direct-probe-XXXXXX";
  std::vector<char> tmpl(path.begin(), path.end());
  tmpl.push_back('\0');
  const int wfd = mkstemp(tmpl.data());
  if (wfd < 0) {
    if (detail) *detail = dir + ": cannot create a probe file (" + std::strerror(errno) + ")";
    return false;
  }
  path = tmpl.data();
  std::vector<char> page(4096, 'x');
  const bool wrote = ::write(wfd, page.data(), page.size()) == static_cast<ssize_t>(page.size());
  ::close(wfd);
  bool ok = false;
  if (!wrote) {
    if (detail) *detail = dir + ": cannot write a probe file";
  } else {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (fd < 0) {
      if (detail) *detail = std::string("O_DIRECT open refused: ") + std::strerror(errno);
    } else {
      void* mem = std::aligned_alloc(4096, 4096);
      const ssize_t r = mem ? ::pread(fd, mem, 4096, 0) : -1;
      ok = r == 4096;
      if (!ok && detail) *detail = std::string("O_DIRECT read failed: ") + std::strerror(errno);
      std::free(mem);
      ::close(fd);
    }
  }
  ::unlink(path.c_str());
  return ok;
}

bool io_uring_supported(std::string* detail) {
  io_uring ring;
  const int rc = io_uring_queue_init(8, &ring, 0);
  if (rc < 0) {
    if (detail) *detail = std::strerror(-rc);
    return false;
  }
  io_uring_queue_exit(&ring);
  return true;
}

}  // namespace spool::plan
