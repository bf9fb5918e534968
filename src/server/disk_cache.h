// DiskCache: prompt-prefix snapshots persisted in a directory (--disk-cache DIR), so a restart
// or an evicted in-memory checkpoint does not force re-reading a long prompt.
//
// A snapshot holds the tokens [0, n) of a prefix and the models::State image of position n
// (State::serialize: attention KV rows [0, n) or a sliding-window layer's last rows, and the
// Gated DeltaNet states after n), taken at a prefill chunk boundary (see prompt_cache.h). File
// layout (little-endian, version 3):
//   "SPOOLPC3" | u64 access counter | u64 header length | header JSON {"fingerprint", "tokens"} |
//   i32 tokens[n] | state image | u64 checksum of the bytes after the access counter and before it.
// Files are written with write+fsync+rename (a reader never sees a partial file), named by a
// hash of the fingerprint and the tokens, and kept under a byte budget by evicting the least
// recently used. Recency is an explicit counter, not a clock: the cache keeps a monotonic u64
// that every save and load bumps and stores in the entry and in the file's access-counter slot
// (rewritten in place on a load; outside the checksum, so a torn update can only reorder
// eviction). At start the cache reads each file's counter and continues from the largest; ties
// are broken by file name. A file that fails any check (magic, sizes, checksum, state image) is
// deleted and never loaded. Files of another format version ("SPOOLPC2", ...) are deleted at
// start (not counted as corrupt). Snapshots of other models (another fingerprint) stay on
// disk, count toward the budget and are never matched.
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
  /// prompt[0, limit); 0 if none. `variant` (every method): what else the state depends on
  /// beyond the model fingerprint (the request's LoRA adapters and scales,
  /// lora::LoraSet::fingerprint; "" = none): only snapshots saved with the same one match.
  int64_t best_match(std::span<const int32_t> prompt, int64_t limit, const std::string& variant = "") const;

  /// Loads the snapshot best_match() names into `state` (State::deserialize: state.pos = n)
  /// and returns n, bumping its access counter; returns 0, deleting the file, when it is
  /// missing or fails a check (checksum, then the whole state image, are verified before `state`
  /// is touched: it is then left as it was).
  int64_t load(std::span<const int32_t> prompt, int64_t limit, models::State& state, const std::string& variant = "");

  /// Writes a snapshot of tokens[0, n) from `state` at snapshot `at` (at.pos() == n; see
  /// State::serialize(at, ...)), or bumps the access counter of the one that exists; then evicts
  /// down to the budget. A snapshot larger than the budget is not written. I/O and state errors
  /// are logged, not thrown (the cache is an optimisation).
  void save(std::span<const int32_t> tokens, const models::State& state, const models::StateSnapshot& at,
            const std::string& variant = "");

  /// Access counter of this model's snapshot of exactly `tokens` (larger = used more recently);
  /// 0 when there is none. For tests and debugging.
  uint64_t last_use(std::span<const int32_t> tokens, const std::string& variant = "") const;

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
    uint64_t access = 0;  // the cache's access counter at its last save or load
  };
  void index_file(const std::string& path);
  void evict_locked();
  void drop_locked(size_t i, bool corrupt);
  void touch_locked(size_t i);
  int best_index_locked(std::span<const int32_t> prompt, int64_t limit, const std::string& fp) const;
  std::string fingerprint_of(const std::string& variant) const;  // fp_ with the variant

  std::string dir_;
  uint64_t budget_;
  std::string fp_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
  uint64_t clock_ = 0;  // last access counter handed out
  DiskCacheStats st_;
};

}  // namespace spool::server
