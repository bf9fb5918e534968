// KvCache: the keys and values of one attention layer for one sequence, stored as f32, f16
// or int8 (--kv-bits 32 | 16 | 8), in the layouts the attention kernels read:
//   keys transposed, one row per (head, dimension):  K[(h * head_dim + d) * capacity + p]
//   values one row per (head, position):             V[(h * capacity + p) * head_dim + d]
// int8 stores per-group scales (groups of kKvGroup dims of one position's vector, symmetric,
// scale = max|x| / 127): Ks[(h * groups + g) * capacity + p], Vs[(h * capacity + p) * groups + g].
//
// Rows are indexed by p - base(), not by the position itself: row r holds position base() + r.
// An unbounded cache (window 0) always has base() == 0 and holds positions [0, capacity()).
// A windowed cache (configure(..., window = W > 0), the layers of a sliding-window model)
// holds only the positions a query can still see: a query at q reads keys (q - W, q], so before
// a forward at positions [pos, pos + T) the rows [pos - W + 1, pos) are all that is kept.
// Layout: linear with a base offset. reserve(pos + T, pos) moves those W - 1 rows to the front
// (base() = pos - W + 1) when the new chunk would not fit behind them, and grows the buffer only
// when W - 1 + T rows do not fit; the capacity never exceeds about W - 1 + the largest T
// reserved (KvCache::window_rows: W - 1 + max(T, W / 8); rounded as for an unbounded cache while
// that is smaller), so it is independent of the context length. The kernels keep their
// contiguous access: they subtract base() from a position and read the same strided rows
// (every key row and value block moves together).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ops/thread_pool.h"

namespace spool::ops {

/// Element type of a KV cache.
enum class KvType { kF32, kF16, kI8 };

/// Dims per int8 scale group (or head_dim when it is smaller or not a multiple).
constexpr int kKvGroup = 32;

/// KvType for --kv-bits (32, 16 or 8); throws spool::UsageError otherwise.
KvType kv_type_from_bits(int bits);

class KvCache {
 public:
  KvCache() = default;
  /// Copies and moves settle() the source first (deferred rows are brought to its host storage;
  /// the new object has none deferred).
  KvCache(const KvCache& o);
  KvCache& operator=(const KvCache& o);
  KvCache(KvCache&& o) noexcept(false);
  KvCache& operator=(KvCache&& o) noexcept(false);
  ~KvCache() = default;

  /// Sets the geometry; drops contents. `keys_only`: the cache stores keys only (no value rows,
  /// write() ignores v): the MLA latent cache, one "key" of kv_lora_rank + qk_rope_head_dim per
  /// position whose first kv_lora_rank elements double as the value (Backend::mla_attention).
  /// `window` > 0: a windowed cache (see the top of this file) for attention that sees at most
  /// `window` positions; 0: every position is kept. Not with keys_only (MLA has no window).
  void configure(KvType type, int n_kv_heads, int head_dim, bool keys_only = false, int64_t window = 0);
  /// Makes room for positions up to `positions` (exclusive), keeping the positions before `keep`
  /// (the caller's current position) that a later query can see: all of them for an unbounded
  /// cache, [first_kept(keep), keep) for a windowed one (older rows are dropped: base() moves).
  void reserve(int64_t positions, int64_t keep);
  /// Forgets every position (base() = 0; the allocation stays): a windowed cache's state at
  /// position 0. An unbounded cache needs no clear (its rows are positions).
  void clear();
  /// Stores position `pos` of every KV head: k, v [n_kv_heads, head_dim] f32. The row of `pos`
  /// must be held (base() <= pos < base() + capacity(); reserve first); throws spool::Error otherwise.
  void write(int64_t pos, const float* k, const float* v);
  /// Makes this cache hold positions [first_kept(n), n) of `other` (same geometry and window;
  /// it must still hold them), growing as needed; base() becomes first_kept(n).
  void copy_prefix(const KvCache& other, int64_t n);
  /// Appends positions [first_kept(n), n) to `out` in a capacity-independent layout (key rows,
  /// value rows, then the int8 scales): exactly saved_bytes(n) bytes. Throws spool::Error unless
  /// the cache holds those positions.
  void save_prefix(int64_t n, std::string& out) const;
  /// Makes positions [first_kept(n), n) those of `data` written by save_prefix with the same
  /// geometry, type and window (base() becomes first_kept(n); later rows are left as they are).
  /// Throws spool::Error when `data` is not saved_bytes(n) bytes.
  void load_prefix(std::string_view data, int64_t n);
  /// Bytes save_prefix(n) writes: (n - first_kept(n)) * bytes_per_position().
  uint64_t saved_bytes(int64_t n) const;

  /// Dequantized key / value at position p (tests, debugging, the reference backend). Throws
  /// spool::Error when the cache does not hold position p.
  float key(int h, int64_t p, int d) const;
  float value(int h, int64_t p, int d) const;

  /// Sliding window this cache is bounded by (0: unbounded).
  int64_t window() const { return window_; }
  /// Position held in row 0 (0 for an unbounded cache).
  int64_t base() const { return base_; }
  /// First position a query at `n` or later can still see: max(0, n - window + 1) for a
  /// windowed cache, 0 for an unbounded one.
  int64_t first_kept(int64_t n) const { return window_ > 0 ? (n - window_ + 1 > 0 ? n - window_ + 1 : 0) : 0; }
  /// Whether positions [first_kept(n), n) are all held (rows are not checked for having been
  /// written: that is the caller's position bookkeeping).
  bool holds(int64_t n) const { return n >= 0 && (n == first_kept(n) || (first_kept(n) >= base_ && n <= base_ + cap_)); }
  /// Most rows a cache bounded by `window` allocates when no reserve() asks for more than
  /// `chunk` positions past its keep (the largest forward): window - 1 + max(chunk, window / 8).
  /// The window / 8 slack makes token-by-token decoding move the window - 1 rows only every
  /// window / 8 tokens. Independent of the context length.
  static int64_t window_rows(int64_t window, int64_t chunk);

  KvType type() const { return type_; }
  int n_kv_heads() const { return n_kv_; }
  int head_dim() const { return hd_; }
  /// Whether the cache holds keys only (configure(..., keys_only = true)).
  bool keys_only() const { return vd_ == 0 && hd_ > 0; }
  int groups() const { return groups_; }
  int group_dim() const { return hd_ / groups_; }
  /// Rows allocated (positions base() .. base() + capacity() - 1 can be held).
  int64_t capacity() const { return cap_; }
  /// Bytes held.
  uint64_t bytes() const { return k_.size() + v_.size() + (ks_.size() + vs_.size()) * sizeof(float); }
  /// Bytes per position (all heads, keys and values, scales included).
  uint64_t bytes_per_position() const;
  /// Changes whenever the contents or geometry change (a process-wide counter, so two caches
  /// never share a value unless one is a copy of the other with the same contents). A GPU
  /// backend keeps a device mirror of the cache and re-uploads it when this moves.
  uint64_t generation() const { return gen_; }

  /// Raw storage in the layouts at the top of this file (row index = position - base()).
  /// Deferred rows are settled first.
  const uint8_t* k_data() const { return settle(), k_.data(); }
  const uint8_t* v_data() const { return settle(), v_.data(); }
  const float* k_scales() const { return settle(), ks_.data(); }
  const float* v_scales() const { return settle(), vs_.data(); }

  // ---- Rows written on a device (a GPU backend's kv_append) --------------------------------
  /// Fills rows [lo, hi) of the host storage (the layouts above) from where a device wrote them.
  using RowFetch = std::function<void(KvCache& cache, int64_t lo, int64_t hi)>;
  /// Records that rows [lo, hi) (0 <= lo < hi <= capacity()) were written somewhere else (a
  /// GPU backend's mirror of this cache) and are stale in host storage until `fetch` brings
  /// them: a GPU decode step then needs no device->host round trip per attention layer.
  /// Consecutive calls with the same fetch widen the range. The contents count as written now
  /// (generation() moves); settle() runs the fetch before any host reader (key(), value(),
  /// k_data() ..., copy_prefix, save_prefix, load_prefix, reserve, write, copies). Throws
  /// spool::Error on a bad range.
  void defer_rows(int64_t lo, int64_t hi, RowFetch fetch);
  /// Brings deferred rows into host storage (no-op when none). Errors of the fetch propagate
  /// (the rows stay deferred). Not thread-safe while rows are deferred: code that reads a cache
  /// from several threads settles it first. The device that holds deferred rows must outlive
  /// them: a cache whose rows a destroyed backend wrote throws on every later host read.
  void settle() const;
  /// Whether rows are deferred (tests).
  bool has_deferred() const { return static_cast<bool>(fetch_); }
  /// Writable storage for a RowFetch (no settle).
  uint8_t* k_storage() { return k_.data(); }
  uint8_t* v_storage() { return v_.data(); }
  float* k_scale_storage() { return ks_.data(); }
  float* v_scale_storage() { return vs_.data(); }

 private:
  int elem() const { return type_ == KvType::kF32 ? 4 : type_ == KvType::kF16 ? 2 : 1; }
  void touch();  // new generation
  void take_shape(const KvCache& o);  // copy/move: o's generation, element type and row geometry (capacity, window,
                                      // base), nothing deferred; o settled first; the callers copy or move the buffers
  void reallocate(int64_t cap, int64_t from, int64_t n);  // new buffers of `cap` rows holding rows [from, from + n)
  void move_rows(int64_t from, int64_t n);               // rows [from, from + n) to the front, in place
  uint64_t gen_ = 0;
  KvType type_ = KvType::kF32;
  int n_kv_ = 0, hd_ = 0, vd_ = 0, groups_ = 1;  // vd_: value dims per head (hd_, or 0 keys-only)
  int64_t cap_ = 0;
  int64_t window_ = 0, base_ = 0;
  std::vector<uint8_t> k_, v_;
  std::vector<float> ks_, vs_;
  mutable RowFetch fetch_;               // deferred rows' fetch (empty: none)
  mutable int64_t def_lo_ = 0, def_hi_ = 0;  // deferred rows [def_lo_, def_hi_)
};

/// Capacity (rows) a cache bounded by `window` (0: unbounded) reaches when `prompt` positions
/// are written in chunks of `step` (reserve(p + chunk, p) before each) and then positions
/// [prompt, total) one at a time: KvCache::reserve's own growth, run on an empty geometry. The
/// planner's KV numbers (plan/footprint.cpp) come from here, so they are what the engine allocates.
int64_t kv_capacity_for(int64_t prompt, int64_t total, int64_t step, int64_t window = 0);

/// out[t, h, :] = softmax_p(scale * q[t, h] . k[kvh, p]) @ v[kvh, p] over p <= pos0 + t,
/// kvh = h / (n_heads / n_kv_heads) (HF repeat_kv). The cache must hold the positions the
/// queries see: [0, pos0 + T), or with a window [pos0 - window + 1, pos0 + T) (spool::Error otherwise).
/// q: [T, n_heads, head_dim] f32; out: [T, n_heads, head_dim]. Parallel over (KV head,
/// query tile); scores and softmax in f32.
/// window > 0 (sliding-window attention, HF Mixtral/Mistral): only keys p with
/// pos0 + t - p < window are seen. sinks (may be null; [n_heads], gpt-oss): per query head a
/// logit that joins each row's softmax denominator and has no value (rows sum to < 1).
void attention(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, float* out,
               ThreadPool* pool, int64_t window = 0, const float* sinks = nullptr);

}  // namespace spool::ops
