#include "server/request_queue.h"

#include <chrono>

namespace spool::server {

RequestQueue::Turn::~Turn() {
  if (!q_) return;
  std::lock_guard lock(q_->mu_);
  q_->busy_ = false;
  q_->release_locked(q_->serving_);
}

void RequestQueue::release_locked(uint64_t ticket) {
  // Advance past `ticket` and any abandoned tickets after it.
  serving_ = ticket + 1;
  while (abandoned_.erase(serving_) > 0) ++serving_;
  cv_.notify_all();
}

std::optional<RequestQueue::Turn> RequestQueue::wait(const std::function<bool()>& alive, int poll_ms) {
  std::unique_lock lock(mu_);
  const uint64_t ticket = next_++;
  while (serving_ != ticket) {
    cv_.wait_for(lock, std::chrono::milliseconds(poll_ms));
    if (serving_ != ticket && alive && !alive()) {
      abandoned_.insert(ticket);
      return std::nullopt;
    }
  }
  busy_ = true;
  return Turn(this);
}

int RequestQueue::waiting() const {
  std::lock_guard lock(mu_);
  const uint64_t in_line = next_ - serving_ - (busy_ ? 1 : 0);
  return static_cast<int>(in_line - std::min<uint64_t>(abandoned_.size(), in_line));
}

bool RequestQueue::busy() const {
  std::lock_guard lock(mu_);
  return busy_;
}

}  // namespace spool::server
