#include "server/responses_store.h"

namespace spool::server {

ResponsesStore::ResponsesStore(size_t capacity, size_t max_bytes) : capacity_(capacity), max_bytes_(max_bytes) {}

bool ResponsesStore::put(const std::string& id, StoredResponse r) {
  // The bytes the JSON takes as compact text (replacing invalid UTF-8 rather than throwing).
  const size_t n = id.size() + r.response.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).size() +
                   r.conversation.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).size();
  std::lock_guard lock(mu_);
  if (auto it = index_.find(id); it != index_.end()) {
    bytes_ -= it->second->bytes;
    lru_.erase(it->second);
    index_.erase(it);
  }
  if (capacity_ == 0 || n > max_bytes_) return false;
  lru_.push_front(Entry{id, std::move(r), n});
  index_[id] = lru_.begin();
  bytes_ += n;
  evict_locked();
  return true;
}

void ResponsesStore::evict_locked() {
  while (!lru_.empty() && (lru_.size() > capacity_ || bytes_ > max_bytes_)) {
    bytes_ -= lru_.back().bytes;
    index_.erase(lru_.back().id);
    lru_.pop_back();
  }
}

std::optional<StoredResponse> ResponsesStore::get(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->value;
}

bool ResponsesStore::erase(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  bytes_ -= it->second->bytes;
  lru_.erase(it->second);
  index_.erase(it);
  return true;
}

size_t ResponsesStore::size() const {
  std::lock_guard lock(mu_);
  return lru_.size();
}

size_t ResponsesStore::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

}  // namespace spool::server
