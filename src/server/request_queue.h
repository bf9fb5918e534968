// RequestQueue: first-come, first-served admission to the engine, one request at a time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <set>

namespace spool::server {

class RequestQueue {
 public:
  /// Holding a Turn means owning the engine; destroying it admits the next request.
  class Turn {
   public:
    Turn(Turn&& o) noexcept : q_(o.q_) { o.q_ = nullptr; }
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;
    Turn& operator=(Turn&&) = delete;
    ~Turn();

   private:
    friend class RequestQueue;
    explicit Turn(RequestQueue* q) : q_(q) {}
    RequestQueue* q_;
  };

  /// Waits (FIFO) for the engine. `alive` is polled every `poll_ms`; when it returns false the
  /// place in the queue is given up and nullptr-like std::nullopt is returned instead.
  std::optional<Turn> wait(const std::function<bool()>& alive, int poll_ms = 50);

  /// Requests waiting now (not counting the one running).
  int waiting() const;
  /// True while a request holds a Turn.
  bool busy() const;

 private:
  void release_locked(uint64_t ticket);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_ = 0, serving_ = 0;
  bool busy_ = false;
  std::set<uint64_t> abandoned_;
};

}  // namespace spool::server
