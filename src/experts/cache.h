// ExpertCache: one cache of experts under a byte budget, evicting by a replacement policy
// (CachePolicy: least recently used, or least frequently used with decay). Each entry owns one buffer of
// slot_bytes (4096-aligned, reusable for O_DIRECT). Entries in use by the current layer
// (pins > 0), entries still loading and --pin-file entries are never evicted; when nothing
// else can go, the cache grows past its budget rather than fail (peak_bytes() tells by how
// much; the extra buffers are freed as entries leave).
// Not thread-safe: the owner (StreamingExperts) serialises access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace spool::experts {

/// Which cached expert makes room for a new one (--cache-policy, docs/streaming.md).
enum class CachePolicy {
  kLru,  ///< the least recently used
  kLfu,  ///< the lowest decayed request count (ties: the least recently used)
};

/// Parses "lru" / "lfu"; throws spool::UsageError naming the value otherwise.
CachePolicy parse_cache_policy(const std::string& s);
/// "lru" / "lfu".
const char* cache_policy_name(CachePolicy p);

/// The replacement policy and its parameters.
struct CachePolicyOptions {
  CachePolicy policy = CachePolicy::kLru;
  /// kLfu: requests after which a request counts half (an exponential decay over the cache's
  /// request clock); 0 = no decay.
  double half_life = 0;
};

/// The options of `policy` with a half-life of `half_life_tokens` tokens, counted on the cache's
/// request clock as half_life_tokens x n_moe_layers x top_k requests (one sequence's token asks
/// each MoE layer for top_k experts). Throws spool::UsageError for a half-life that is not a
/// positive finite number.
CachePolicyOptions cache_policy_options(CachePolicy policy, double half_life_tokens, int n_moe_layers, int top_k);

/// A prior request count of one expert (a routing profile's decayed count: ExpertCache::seed).
struct ExpertCount {
  int layer = 0, expert = 0;
  double count = 0;
};

/// Decayed request counts per (layer, expert), for kLfu: every request adds 1 at the current
/// clock, and a request `a` requests old weighs 2^(-a / half_life). Kept for every expert ever
/// requested (cached or not: an evicted expert keeps its history), so a returning hot expert is
/// recognised. Stored scaled to a moving base time so comparisons need no exp(); rescaled every
/// 256 half-lives. Used by ExpertCache and CacheSim alike (the same numbers, the same victims).
class FrequencyScores {
 public:
  /// half_life: in requests, >= 0 (0 = plain counts).
  explicit FrequencyScores(double half_life = 0) : half_life_(half_life) {}
  /// One request of `key`; advances the clock by one request.
  void request(uint64_t key);
  /// Adds `count` requests' worth made at clock 0 (a routing profile's counts, before any request).
  void seed(uint64_t key, double count);
  /// The comparable score of `key` (0 when never requested): larger = more requests, recent ones weighing more.
  double score(uint64_t key) const {
    auto it = s_.find(key);
    return it == s_.end() ? 0.0 : it->second;
  }

 private:
  double weight_now() const;  // what one request adds now, at the current base
  double half_life_;
  double clock_ = 0, base_ = 0;  // requests so far; the clock the stored scores are scaled to
  std::unordered_map<uint64_t, double> s_;
};

class ExpertCache {
 public:
  enum class State { kLoading, kReady, kFailed };
  struct Entry {
    int layer = -1, expert = -1;
    uint8_t* data = nullptr;  // slot_bytes, 4096-aligned
    State state = State::kLoading;
    int pins = 0;             // users in the current layer
    bool pinned = false;      // --pin-file: permanently resident
    bool prefetched = false;  // loaded by prefetch-ahead, not yet requested
    bool prepared = false;    // read by prepare() for an acquire that has not come yet
    std::list<Entry*>::iterator lru;
  };

  /// budget_bytes: cache size; slot_bytes: bytes of one expert buffer; policy: which entry an
  /// insert evicts (kLru by default).
  ExpertCache(uint64_t budget_bytes, uint64_t slot_bytes, CachePolicyOptions policy = {});
  ~ExpertCache();
  ExpertCache(const ExpertCache&) = delete;
  ExpertCache& operator=(const ExpertCache&) = delete;

  /// Allocates the buffers of min(capacity(), max_entries) entries now, as one 4096-aligned
  /// block (so that a GPU backend can page-lock it once: Backend::pin_host), and returns it with
  /// its size in bytes. Entries take these buffers first; buffers of an over-budget burst are
  /// allocated and freed one by one as before. Call at most once, before the first insert.
  /// Throws spool::Error when the memory cannot be had.
  std::pair<uint8_t*, uint64_t> reserve_block(int64_t max_entries);
  /// The entry of (layer, expert), or nullptr.
  Entry* find(int layer, int expert);
  /// A new entry (state kLoading) for (layer, expert), which must not be present. Evicts
  /// least-recently-used evictable entries while the cache is at its budget.
  Entry* insert(int layer, int expert);
  /// Marks `e` most recently used.
  void touch(Entry* e);
  /// Counts one request of (layer, expert) for the kLfu policy (a layer asked for it; call once
  /// per expert per acquire, hit or miss). No effect on kLru's choices.
  void count(int layer, int expert) {
    if (policy_.policy == CachePolicy::kLfu) freq_.request(key(layer, expert));
  }
  /// Adds `count` requests' worth to (layer, expert)'s kLfu score before the first request (a
  /// routing profile's decayed counts: --expert-profile).
  void seed(int layer, int expert, double count) { freq_.seed(key(layer, expert), count); }
  /// The replacement policy (--cache-policy: kLru or kLfu).
  CachePolicy policy() const { return policy_.policy; }
  /// Removes `e` (e.g. after a failed read); its buffer is kept for reuse.
  void erase(Entry* e);

  uint64_t budget() const { return budget_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  /// Bytes held by entries (entries x slot_bytes).
  uint64_t bytes() const { return static_cast<uint64_t>(map_.size()) * slot_bytes_; }
  /// Largest number of entries the budget holds (at least 1).
  int64_t capacity() const;
  size_t size() const { return map_.size(); }
  uint64_t evictions() const { return evictions_; }
  /// Peak bytes held (may exceed the budget when everything was pinned).
  uint64_t peak_bytes() const { return peak_; }

 private:
  static uint64_t key(int layer, int expert) { return (static_cast<uint64_t>(layer) << 32) | static_cast<uint32_t>(expert); }
  uint8_t* take_buffer();
  bool in_block(const uint8_t* b) const { return block_ != nullptr && b >= block_ && b < block_ + block_bytes_; }
  uint64_t budget_, slot_bytes_;
  CachePolicyOptions policy_;
  FrequencyScores freq_;
  uint8_t* block_ = nullptr;  // reserve_block()
  uint64_t block_bytes_ = 0;
  std::unordered_map<uint64_t, Entry*> map_;
  std::list<Entry*> lru_;  // front = most recently used
  std::vector<uint8_t*> free_;
  uint64_t evictions_ = 0, peak_ = 0;
};

}  // namespace spool::experts
