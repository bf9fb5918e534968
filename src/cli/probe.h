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
