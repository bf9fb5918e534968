// A fixed pool of worker threads for data-parallel kernels. The calling thread takes part,
// so ThreadPool(n) runs work on n threads in total. Workers spin up to 500 us between jobs (decode
// issues ~60 jobs per token with short serial work between them) and then sleep on a futex.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace spool::ops {

class ThreadPool {
 public:
  /// Creates a pool running jobs on `n_threads` threads (>= 1), the caller included.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Total threads a job runs on (workers + caller).
  int size() const { return n_threads_; }

  /// Runs fn(task, thread) for every task in [0, n_tasks), tasks claimed dynamically; blocks
  /// until all are done. `thread` is in [0, size()). Not reentrant: call from one thread only.
  /// The first exception thrown by a task is rethrown here after all tasks finish. The caller
  /// waits for the job's tasks, not for the workers: when a worker is descheduled (a machine
  /// with more runnable threads than cores) the caller runs the tasks it did not claim.
  /// n_tasks must be below 2^32.
  void run(int64_t n_tasks, const std::function<void(int64_t task, int thread)>& fn);

  /// Splits [0, n) into contiguous chunks whose sizes are multiples of `align` (except the
  /// last) and runs fn(begin, end, thread) on each; the chunks are claimed dynamically. Large
  /// ranges get up to kChunksPerThread chunks per thread (at least kMinUnitsPerChunk aligned
  /// units each) so that a thread that starts late or is descheduled does not hold up the job;
  /// small ones one chunk per thread; a one-thread pool runs fn(0, n, 0) once. fn may run several
  /// chunks on one thread.
  void parallel_for(int64_t n, int64_t align, const std::function<void(int64_t begin, int64_t end, int thread)>& fn);

  /// Most chunks per thread parallel_for() makes.
  static constexpr int64_t kChunksPerThread = 32;
  /// Fewest aligned units in a chunk of parallel_for() (when there are enough for one per thread).
  static constexpr int64_t kMinUnitsPerChunk = 8;

 private:
  void worker_loop(int thread);
  // Runs tasks of job `gen` until none is left to claim (or the job is no longer `gen`).
  void work(int thread, uint32_t gen);

  int n_threads_;
  std::vector<std::thread> workers_;
  std::atomic<uint32_t> generation_{0};
  // The job's generation (high 32 bits) and its next unclaimed task (low 32 bits), claimed by
  // compare-and-swap: a worker that wakes after its job ended claims nothing of the next one.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};  // tasks of the current job finished
  std::atomic<bool> stop_{false};
  bool oversubscribed_ = false;  // more threads than hardware threads: workers spin briefly
  std::atomic<int64_t> n_tasks_{0};
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  std::atomic<bool> has_error_{false};
  std::exception_ptr error_;
};

}  // namespace spool::ops
