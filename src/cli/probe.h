// Quick measurements of the machine: memory read bandwidth, direct-read disk bandwidth,
// O_DIRECT and io_uring support. Used by `spool plan`, `spool doctor` and `spool bench`.
#pragma once

#include <cstdint>
#include <string>

namespace spool::plan {

/// Memory read bandwidth in GB/s (1e9 bytes/s): `threads` threads sum a `bytes`-sized
/// buffer (touched first; each thread a contiguous share, with SIMD loads: ops::read_sum)
/// repeatedly for about `seconds`; the best pass counts.
double measure_memory_gbps(uint64_t bytes = 512ull << 20, int threads = 1, double seconds = 0.5);

/// Size in bytes of the machine's last-level cache, read from a sysfs CPU tree (`root`, normally
/// /sys/devices/system/cpu): among the cpu<N>/cache/index<M> entries of type Data or Unified,
/// those of the highest `level`; each distinct cache instance (its `shared_cpu_list`, so a cache
/// shared by several CPUs counts once) adds its `size` ("266240K"; K, M, G suffixes are binary
/// units, none means bytes). Two sockets' L3s, or the L3s of several AMD CCDs, thus sum. Returns 0
/// when the tree is missing or holds no readable cache entry (never throws).
uint64_t last_level_cache_bytes(const std::string& root = "/sys/devices/system/cpu");

/// Buffer size in bytes for measure_memory_gbps to stream from DRAM rather than from cache:
/// 4 x `llc_bytes` (last_level_cache_bytes()), at least 256 MiB, at most 2 GiB and at most a
/// quarter of `available_bytes` (memory available to the process, MemAvailable / cgroup; 0 =
/// unknown, no cap), never below 16 MiB; a multiple of 1 MiB.
uint64_t memory_probe_bytes(uint64_t llc_bytes, uint64_t available_bytes);

/// Result of a disk read probe.
struct DiskProbe {
  bool ok = false;
  double gbps = 0;          // GB/s achieved
  uint64_t bytes = 0;       // bytes read
  bool direct = false;      // the reads bypassed the page cache (O_DIRECT)
  std::string error;        // why the probe failed (ok == false)
};

/// Reads up to `bytes` of `path` (a large existing file, e.g. a model shard) with O_DIRECT in
/// `block`-sized reads spread over the file, `depth` reads in flight (threads), for at most
/// `seconds`. Falls back to buffered reads + posix_fadvise(DONTNEED) when O_DIRECT is
/// refused (direct = false then). Never throws.
DiskProbe measure_disk_gbps(const std::string& path, uint64_t bytes = 256ull << 20, uint64_t block = 4ull << 20,
                            int depth = 4, double seconds = 2.0);

/// True if `dir`'s filesystem accepts O_DIRECT opens and aligned reads (a scratch file is
/// created and removed in `dir`); `detail` says why not.
bool direct_io_supported(const std::string& dir, std::string* detail);

/// True if an io_uring ring can be set up (kernel support, not blocked by seccomp or
/// io_uring_disabled); `detail` says why not.
bool io_uring_supported(std::string* detail);

}  // namespace spool::plan
