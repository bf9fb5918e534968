// ExpertCache: one LRU of experts under a byte budget. Each entry owns one buffer of
// slot_bytes (4096-aligned, reusable for O_DIRECT). Entries in use by the current layer
// (pins > 0), entries still loading and --pin-file entries are never evicted; when nothing
// else can go, the cache grows past its budget rather than fail (peak_bytes() tells by how
// much; the extra buffers are freed as entries leave).
// Not thread-safe: the owner (StreamingExperts) serialises access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <utility>
#include <vector>

namespace spool::experts {

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

  /// budget_bytes: cache size; slot_bytes: bytes of one expert buffer.
  ExpertCache(uint64_t budget_bytes, uint64_t slot_bytes);
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
  uint8_t* block_ = nullptr;  // reserve_block()
  uint64_t block_bytes_ = 0;
  std::unordered_map<uint64_t, Entry*> map_;
  std::list<Entry*> lru_;  // front = most recently used
  std::vector<uint8_t*> free_;
  uint64_t evictions_ = 0, peak_ = 0;
};

}  // namespace spool::experts
