#include "experts/cache.h"

#include <algorithm>
#include <cstdlib>
#include <new>

#include "common/error.h"

namespace spool::experts {

ExpertCache::ExpertCache(uint64_t budget_bytes, uint64_t slot_bytes) : budget_(budget_bytes), slot_bytes_(slot_bytes) {}

ExpertCache::~ExpertCache() {
  for (auto& [k, e] : map_) {
    if (!in_block(e->data)) std::free(e->data);
    delete e;
  }
  for (uint8_t* b : free_)
    if (!in_block(b)) std::free(b);
  std::free(block_);
}

std::pair<uint8_t*, uint64_t> ExpertCache::reserve_block(int64_t max_entries) {
  if (block_ != nullptr || !map_.empty()) fail("expert cache: reserve_block() after the cache was used");
  const int64_t n = std::max<int64_t>(1, std::min(capacity(), max_entries));
  const uint64_t bytes = static_cast<uint64_t>(n) * slot_bytes_;
  void* p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (p == nullptr) fail("out of memory allocating the %llu-byte expert cache", (unsigned long long)bytes);
  block_ = static_cast<uint8_t*>(p);
  block_bytes_ = bytes;
  for (uint8_t* b : free_) std::free(b);
  free_.clear();
  for (int64_t i = n - 1; i >= 0; --i) free_.push_back(block_ + static_cast<uint64_t>(i) * slot_bytes_);  // first slot on top
  return {block_, bytes};
}

int64_t ExpertCache::capacity() const {
  const int64_t n = static_cast<int64_t>(budget_ / slot_bytes_);
  return n < 1 ? 1 : n;
}

ExpertCache::Entry* ExpertCache::find(int layer, int expert) {
  auto it = map_.find(key(layer, expert));
  return it == map_.end() ? nullptr : it->second;
}

void ExpertCache::touch(Entry* e) { lru_.splice(lru_.begin(), lru_, e->lru); }

uint8_t* ExpertCache::take_buffer() {
  if (!free_.empty()) {
    uint8_t* b = free_.back();
    free_.pop_back();
    return b;
  }
  void* p = std::aligned_alloc(4096, slot_bytes_);
  if (p == nullptr) fail("out of memory allocating a %llu-byte expert cache slot", (unsigned long long)slot_bytes_);
  return static_cast<uint8_t*>(p);
}

ExpertCache::Entry* ExpertCache::insert(int layer, int expert) {
  // Evict from the LRU end while at the budget.
  while (static_cast<int64_t>(map_.size()) >= capacity()) {
    Entry* victim = nullptr;
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
      Entry* c = *it;
      if (c->pins == 0 && !c->pinned && c->state != State::kLoading) {
        victim = c;
        break;
      }
    }
    if (victim == nullptr) break;  // everything is in use: grow past the budget
    erase(victim);
    ++evictions_;
  }
  uint8_t* buf = take_buffer();
  Entry* e = nullptr;
  try {
    e = new Entry;
  } catch (...) {
    free_.push_back(buf);
    throw;
  }
  e->layer = layer;
  e->expert = expert;
  e->data = buf;
  lru_.push_front(e);
  e->lru = lru_.begin();
  map_[key(layer, expert)] = e;
  if (bytes() > peak_) peak_ = bytes();
  return e;
}

void ExpertCache::erase(Entry* e) {
  map_.erase(key(e->layer, e->expert));
  lru_.erase(e->lru);
  // Keep the buffer for reuse only while entries + spare buffers fit the budget; buffers of
  // an over-budget burst (everything pinned) go back to the allocator. reserve_block()'s
  // buffers are always kept, and the burst's are never.
  if (in_block(e->data)) {
    free_.push_back(e->data);
  } else if (block_ == nullptr && static_cast<int64_t>(map_.size() + free_.size()) < capacity()) {
    free_.push_back(e->data);
  } else {
    std::free(e->data);
  }
  delete e;
}

}  // namespace spool::experts
