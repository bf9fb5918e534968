#include "ops/thread_pool.h"

#include "common/error.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

// Spin loops re-read an atomic without the x86 PAUSE instruction: under KVM, PAUSE loops
// trigger pause-loop exits that deschedule the spinning vCPU, which made every job hand-off
// ~10 us slower (measured: 2 threads ran decode 8x slower than 1). Plain loads do not exit.
#define SPOOL_SPIN() asm volatile("" ::: "memory")

namespace spool::ops {

namespace {
// How long a worker spins for the next job before it sleeps on the futex. Decode runs ~60 jobs
// per token with serial work on the caller between them (norms, the conv, routing) of up to
// ~300 us, and waking a sleeping worker costs ~100 us under KVM: measured on the 8-layer
// Qwen3.6-35B-A3B-shaped Q4_K_M file (2 threads), a ~35 us spin let the worker fall asleep ~7
// times per token (context switches per 320 tokens ~2100; ~300 with a 500 us spin, which clears the
// largest gaps with a margin). A time limit, not a count: a spin iteration's cost differs between
// CPUs. A pool with more threads than the machine has hardware threads spins only briefly, so
// that its spinning workers do not take the cores its caller and other threads need.
constexpr auto kWorkerSpin = std::chrono::microseconds(500);
constexpr auto kOversubscribedSpin = std::chrono::microseconds(30);
constexpr int kMainSpinIters = 1 << 14;  // spins before the caller starts yielding
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  const unsigned hw = std::thread::hardware_concurrency();
  oversubscribed_ = hw != 0 && static_cast<unsigned>(n_threads_) > hw;
  for (int t = 1; t < n_threads_; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::work(int thread, uint32_t gen) {
  for (;;) {
    uint64_t c = claim_.load(std::memory_order_acquire);
    int64_t i = 0;
    for (;;) {
      if (static_cast<uint32_t>(c >> 32) != gen) return;  // that job is over
      i = static_cast<int64_t>(c & 0xffffffffu);
      if (i >= n_tasks_.load(std::memory_order_acquire)) return;  // (a newer job's count: claim_ moved on, the CAS fails)
      if (claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) break;
    }
    // Task i of job gen is ours: the caller does not return (nor reuse fn_) before it is done.
    try {
      (*fn_)(i, thread);
    } catch (...) {
      bool expected = false;
      if (has_error_.compare_exchange_strong(expected, true)) error_ = std::current_exception();
    }
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::worker_loop(int thread) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = generation_.load(std::memory_order_acquire);
    if (g == seen) {
      const auto until = std::chrono::steady_clock::now() + (oversubscribed_ ? kOversubscribedSpin : kWorkerSpin);
      for (uint32_t spin = 1; g == seen; ++spin) {
        SPOOL_SPIN();
        g = generation_.load(std::memory_order_acquire);
        if (spin % 1024 == 0 && std::chrono::steady_clock::now() >= until) break;
      }
    }
    if (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = g;
    if (stop_.load()) return;
    work(thread, g);
  }
}

void ThreadPool::run(int64_t n_tasks, const std::function<void(int64_t, int)>& fn) {
  if (n_tasks <= 0) return;
  if (n_threads_ == 1 || n_tasks == 1) {
    for (int64_t i = 0; i < n_tasks; ++i) fn(i, 0);
    return;
  }
  if (n_tasks >= (int64_t{1} << 32)) fail("ThreadPool::run: %lld tasks (at most 2^32 - 1)", static_cast<long long>(n_tasks));
  // The new generation goes into claim_ first: a worker still in the previous job's work() then
  // fails its gen check (or its compare-and-swap) instead of claiming an index of this job with
  // the previous one's count (n_tasks_ is stored after, with release; workers read it with
  // acquire, so a worker that sees this job's count also sees claim_'s new value).
  const uint32_t gen = generation_.load(std::memory_order_relaxed) + 1;
  claim_.store(static_cast<uint64_t>(gen) << 32, std::memory_order_relaxed);
  fn_ = &fn;
  has_error_.store(false);
  error_ = nullptr;
  done_.store(0, std::memory_order_relaxed);
  n_tasks_.store(n_tasks, std::memory_order_release);
  generation_.store(gen, std::memory_order_release);  // publishes the job to the workers
  generation_.notify_all();
  work(0, gen);
  // Wait for the tasks the workers claimed; yield once the wait gets long so an oversubscribed
  // machine (more runnable threads than cores) can run the worker we are waiting for.
  for (int spin = 0; done_.load(std::memory_order_acquire) != n_tasks; ++spin) {
    if (spin < kMainSpinIters) {
      SPOOL_SPIN();
    } else {
      std::this_thread::yield();
    }
  }
  fn_ = nullptr;
  if (has_error_.load()) std::rethrow_exception(error_);
}

void ThreadPool::parallel_for(int64_t n, int64_t align, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  if (n_threads_ == 1) return fn(0, n, 0);  // one chunk: nothing to balance
  align = std::max<int64_t>(1, align);
  int64_t units = (n + align - 1) / align;
  // Measured on decode (2 threads): with one static chunk per thread the caller waited ~6% of
  // the 417 MB output head's time for the other half (the other vCPU started late or lost time
  // to the host); chunks claimed dynamically end within about one chunk of each other.
  const int64_t most = n_threads_ * kChunksPerThread;
  int64_t chunks = std::clamp<int64_t>(units / kMinUnitsPerChunk, n_threads_, most);
  chunks = std::min(chunks, units);
  int64_t per = (units + chunks - 1) / chunks;
  run(chunks, [&](int64_t c, int thread) {
    int64_t b = c * per * align;
    int64_t e = std::min(n, (c + 1) * per * align);
    if (b < e) fn(b, e, thread);
  });
}

}  // namespace spool::ops
