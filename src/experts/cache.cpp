#include "experts/cache.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>

#include "common/error.h"

namespace spool::experts {

CachePolicy parse_cache_policy(const std::string& s) {
  if (s == "lru") return CachePolicy::kLru;
  if (s == "lfu") return CachePolicy::kLfu;
  throw UsageError("--cache-policy must be lru or lfu, not '" + s + "'");
}

const char* cache_policy_name(CachePolicy p) { return p == CachePolicy::kLfu ? "lfu" : "lru"; }

CachePolicyOptions cache_policy_options(CachePolicy policy, double half_life_tokens, int n_moe_layers, int top_k) {
  if (!(half_life_tokens > 0) || !std::isfinite(half_life_tokens))
    throw UsageError(strfmt("--cache-half-life must be a positive number of tokens (got %g)", half_life_tokens));
  CachePolicyOptions o;
  o.policy = policy;
  o.half_life = half_life_tokens * std::max(1, n_moe_layers) * std::max(1, top_k);
  return o;
}

double FrequencyScores::weight_now() const { return half_life_ > 0 ? std::exp2((clock_ - base_) / half_life_) : 1.0; }

void FrequencyScores::request(uint64_t key) {
  if (half_life_ > 0 && clock_ - base_ > 256 * half_life_) {  // rescale before 2^x grows large
    const double f = std::exp2(-(clock_ - base_) / half_life_);
    for (auto& [k, v] : s_) v *= f;
    base_ = clock_;
  }
  s_[key] += weight_now();
  clock_ += 1;
}

void FrequencyScores::seed(uint64_t key, double count) {
  if (!(count > 0)) return;
  // Made at clock 0: scaled to the base (before any request, base = clock = 0: weight 1).
  s_[key] += count * (half_life_ > 0 ? std::exp2(-base_ / half_life_) : 1.0);
}

ExpertCache::ExpertCache(uint64_t budget_bytes, uint64_t slot_bytes, CachePolicyOptions policy)
    : budget_(budget_bytes), slot_bytes_(slot_bytes), policy_(policy), freq_(policy.half_life) {}

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
  // Evict while at the budget: kLru the least recently used evictable entry; kLfu the evictable
  // entry of the lowest score, the least recently used of equal ones (scanned from the LRU end).
  while (static_cast<int64_t>(map_.size()) >= capacity()) {
    Entry* victim = nullptr;
    double best = 0;
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
      Entry* c = *it;
      if (c->pins != 0 || c->pinned || c->state == State::kLoading) continue;
      if (policy_.policy == CachePolicy::kLru) {
        victim = c;
        break;
      }
      const double s = freq_.score(key(c->layer, c->expert));
      if (victim == nullptr || s < best) victim = c, best = s;
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
