// PageCacheWarmer (--warm-page-cache): reads a checkpoint's files into the OS page cache on a
// background thread of the lowest CPU and I/O priority, so that the expert reads of a run that
// streams through the page cache find their bytes in memory instead of faulting them in from
// disk one miss at a time (the page-fault-bound cold start). The loader starts it only when the
// files fit in the memory the run leaves free (engine::load); it never blocks the caller.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace spool::io {

/// What a warmer did (a snapshot; final once done is true).
struct WarmResult {
  uint64_t bytes_total = 0;     // bytes of the files
  uint64_t bytes_resident = 0;  // bytes of chunks wholly in the page cache before their file was read (not read again)
  uint64_t bytes_read = 0;      // bytes read into the page cache
  double seconds = 0;           // from start to done (or to now)
  bool done = false;            // the thread has ended (finished, stopped or failed)
  bool stopped = false;         // stop() ended it before the last chunk
  std::string error;            // a file that could not be opened or read ("" = none)
};

class PageCacheWarmer {
 public:
  /// Bytes read per pread (the stop flag is checked between chunks).
  static constexpr uint64_t kChunk = 4ull << 20;
  /// Starts the thread, which reads `paths` in order, each sequentially in kChunk pieces,
  /// skipping pieces wholly resident before the file's reading began (mincore), at SCHED_IDLE and I/O class idle (where the
  /// kernel and its I/O scheduler allow them; refused priorities are ignored). Errors end the
  /// thread and are reported by result(), never thrown. `log`: log one line when it ends.
  explicit PageCacheWarmer(std::vector<std::string> paths, bool log = true);
  /// stop() and join.
  ~PageCacheWarmer();
  PageCacheWarmer(const PageCacheWarmer&) = delete;
  PageCacheWarmer& operator=(const PageCacheWarmer&) = delete;
  /// Asks the thread to end after its current chunk and waits for it (at most one chunk's read).
  void stop();
  /// Waits until the thread has ended on its own (tests, benchmarks).
  void wait();
  WarmResult result() const;

 private:
  void run();
  std::vector<std::string> paths_;
  bool log_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  WarmResult res_;
  double t0_ = 0;
  std::thread thread_;
};

}  // namespace spool::io
