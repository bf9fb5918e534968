// ExpertReader: reads expert byte ranges from the checkpoint shards, in parallel, with pread
// (a pool of --prefetch-workers threads) or io_uring (liburing), through the page cache or
// around it (O_DIRECT; where a filesystem refuses O_DIRECT, buffered reads followed by
// posix_fadvise(DONTNEED) so the page cache does not balloon).
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace spool::io {

/// How reads are issued.
enum class IoEngine { kPread, kUring };

/// One vectored read: `iov` buffers filled from `offset` of shard `shard`, in order.
struct ReadRequest {
  int shard = 0;
  uint64_t offset = 0;
  std::vector<iovec> iov;
  uint64_t length() const;
};

class ExpertReader {
 public:
  struct Options {
    IoEngine engine = IoEngine::kPread;
    int workers = 8;      // threads issuing reads (pread) / rings (uring)
    bool direct = false;  // O_DIRECT (buffers, offsets and lengths 4096-aligned)
  };
  /// Opens every shard (O_DIRECT when asked; falls back to buffered + DONTNEED per file when
  /// the filesystem refuses it). Throws spool::Error if a shard cannot be opened or io_uring
  /// cannot be set up.
  ExpertReader(std::vector<std::string> shard_paths, Options opt);
  ~ExpertReader();
  ExpertReader(const ExpertReader&) = delete;
  ExpertReader& operator=(const ExpertReader&) = delete;

  /// Completion handle of a submitted set of reads.
  class Batch {
   public:
    /// True once every read finished and on_done ran.
    bool done() const { return remaining_.load(std::memory_order_acquire) == 0; }

   private:
    friend class ExpertReader;
    std::atomic<int64_t> remaining_{0};  // 0 once every read finished and on_done ran
    int64_t pending_ = 0;                 // reads not yet finished (under mu_)
    std::mutex mu_;
    std::condition_variable cv_;
    std::exception_ptr error_;
    std::function<void(std::exception_ptr)> on_done_;
  };
  using BatchPtr = std::shared_ptr<Batch>;

  /// Starts `reqs` in the background. `on_done(error)` (optional) runs on an I/O thread
  /// when the last read finishes.
  BatchPtr submit(std::vector<ReadRequest> reqs, std::function<void(std::exception_ptr)> on_done = nullptr);
  /// Blocks until `b` is done; rethrows its first error (spool::Error naming file and offset).
  void wait(const BatchPtr& b);
  /// submit + wait.
  void read_all(std::vector<ReadRequest> reqs);

  /// True if reads bypass the page cache with O_DIRECT for every shard.
  bool direct() const { return direct_all_; }
  IoEngine engine() const { return opt_.engine; }
  /// Bytes read since construction.
  uint64_t bytes_read() const { return bytes_read_.load(); }
  /// Read calls issued (after coalescing) since construction.
  uint64_t reads_issued() const { return reads_.load(); }

 private:
  struct File {
    std::string path;
    int fd = -1;
    uint64_t size = 0;
    bool direct = false;
    bool fadvise = false;  // buffered fallback of a direct request: drop pages after reading
  };
  struct Task {
    BatchPtr batch;
    std::vector<ReadRequest> reqs;  // one request (pread) or the whole batch (uring)
  };
  void open_files(const std::vector<std::string>& shard_paths);
  void worker(int index);
  void run_pread(const ReadRequest& r);
  void run_uring(std::vector<ReadRequest>& reqs, void* ring);
  void finish(const BatchPtr& b, int64_t n, std::exception_ptr err);

  Options opt_;
  std::vector<File> files_;
  bool direct_all_ = false;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  std::atomic<uint64_t> bytes_read_{0}, reads_{0};
};

}  // namespace spool::io
