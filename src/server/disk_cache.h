// DiskCache: prompt-prefix snapshots persisted in a directory (--disk-cache DIR), so a restart
// or an evicted in-memory checkpoint does not force re-reading a long prompt.
//
// A snapshot holds the tokens [0, n) of a prefix, the attention KV caches of positions [0, n)
// and the Gated DeltaNet states after position n, taken at a prefill chunk boundary (see
// prompt_cache.h). File layout (little-endian):
//   "SPOOLPC1" | u64 header length | header JSON {"fingerprint", "tokens"} | i32 tokens[n] |
//   per layer: u64 byte count + bytes (KV prefix, or GDN conv then recurrent floats) |
//   u64 checksum of everything before it.
// Files are written with write+fsync+rename (a reader never sees a partial file), named by a
// hash of the fingerprint and the tokens, and kept under a byte budget by evicting the least
// recently used (file mtime, refreshed on use). A file that fails any check (magic, sizes,
// checksum) is deleted and never loaded. Snapshots of other models (another fingerprint) stay
// on disk, count toward the budget and are never matched.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/state.h"

namespace spool::server {

/// Identity of everything that changes a prefix's state: config.json, the safetensors headers
/// (names, dtypes, shapes, offsets) and sizes of every shard, the KV type, the prefill step and
/// the expert cap. Hex text.
std::string model_fingerprint(const io::Checkpoint& ckpt, int kv_bits, int64_t prefill_step, int max_active_experts);

/// 64-bit checksum of `data` (not cryptographic; detects corruption).
uint64_t checksum64(std::string_view data);

/// Counters of a DiskCache (for /metrics and tests).
struct DiskCacheStats {
  uint64_t files = 0, bytes = 0;         ///< snapshots on disk now (all fingerprints)
  uint64_t hits = 0, saves = 0;          ///< snapshots loaded / written
  uint64_t evictions = 0, corrupt = 0;   ///< files deleted for the budget / for failing a check
};

/// The snapshot directory of one server: an index of its files (tokens and fingerprints, read
/// at start), loads and saves, and LRU eviction under the byte budget. Thread-safe.
class DiskCache {
 public:
  /// Opens (creating) `dir`, indexes its snapshots (reading only headers and tokens), deletes
  /// leftover temporary files and unreadable snapshots, and evicts down to `budget_bytes`.
  /// Throws spool::Error when the directory cannot be created or read.
  DiskCache(std::string dir, uint64_t budget_bytes, std::string fingerprint);

  /// Length of the longest snapshot of this model whose tokens are a prefix of
  /// prompt[0, limit); 0 if none.
  int64_t best_match(std::span<const int32_t> prompt, int64_t limit) const;

  /// Loads the snapshot best_match() names into `state` (KV positions [0, n), GDN states,
  /// state.pos = n) and returns n; returns 0, deleting the file, when it is missing or fails a
  /// check (checksum and sizes are verified first: `state` is then left untouched).
  int64_t load(std::span<const int32_t> prompt, int64_t limit, models::State& state);

  /// Writes a snapshot of tokens[0, n) from `state` (KV positions [0, n) must be valid) with GDN
  /// states `gdn` (one per layer, empty for attention layers), unless one exists; then evicts
  /// down to the budget. A snapshot larger than the budget is not written. I/O errors are
  /// logged, not thrown (the cache is an optimisation).
  void save(std::span<const int32_t> tokens, const models::State& state, const std::vector<models::GdnState>& gdn);

  /// The counters, with files and bytes counted now.
  DiskCacheStats stats() const;
  /// The directory (as given).
  const std::string& dir() const { return dir_; }

 private:
  struct Entry {
    std::string path;
    std::string fingerprint;
    std::vector<int32_t> tokens;
    uint64_t size = 0;
    int64_t mtime_ns = 0;
  };
  void index_file(const std::string& path);
  void evict_locked();
  void drop_locked(size_t i, bool corrupt);
  int best_index_locked(std::span<const int32_t> prompt, int64_t limit) const;

  std::string dir_;
  uint64_t budget_;
  std::string fp_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  DiskCacheStats st_;
};

}  // namespace spool::server
