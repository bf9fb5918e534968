// Per-sequence model state: attention KV caches, Gated DeltaNet conv and recurrent states,
// and the number of tokens processed. Owned by the caller (engine::Session); one per sequence.
//
// Besides the fields the forward pass reads and writes, State is the one interface for moving a
// sequence back and forth (the prompt cache and the disk cache use nothing else):
//   snapshot() / restore()   bring the state back to an earlier position (cheap: recurrent state
//                            and the few rows of sliding-window layers only);
//   truncate()               cut attention-only state back to an earlier position (any one
//                            without sliding-window layers: truncates_freely());
//   serialize() / deserialize()  a versioned, checked byte image of positions [0, n).
//
// Sliding-window layers (AttentionSpec::windowed with window_bounds_kv) keep a bounded cache
// (ops/kv_cache.h): at position pos only the rows [pos - W + 1, pos) a later query can see are
// guaranteed, older ones are dropped or overwritten as the window moves on. Such a layer is
// therefore treated like recurrent state: a snapshot copies its rows (at most W - 1 per layer),
// an image stores only them, and truncate() works only while they are still held.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "models/spec.h"
#include "ops/kv_cache.h"
#include "ops/workspace.h"

namespace spool::models {

/// KV cache of one attention layer (f32, f16 or int8; see ops/kv_cache.h). For an MLA layer
/// (DeepSeek) it is the latent cache: keys only, one head of kv_lora_rank + qk_rope_head_dim
/// ([normed c_kv | roped k_pe] per position); snapshots and images carry it like any KV cache.
using AttnCache = ops::KvCache;

/// One sequence's rows in a batched token-mixer call (Model::forward_batch): rows
/// [row0, row0 + T) of the layer's input and output, at positions [pos0, pos0 + T) of its own
/// cache (attention, MLA).
struct AttnSeg {
  int64_t row0 = 0, T = 0, pos0 = 0;
  AttnCache* cache = nullptr;
};
/// The same for a Gated DeltaNet layer: the sequence's conv state [conv_dim, K-1] and
/// recurrent state [n_v, d_k, d_v] (State::gdn_conv / gdn_recurrent; host or device memory).
struct GdnSeg {
  int64_t row0 = 0, T = 0;
  float* conv = nullptr;
  float* recurrent = nullptr;
  /// State::keep_step_trail: the states after each of the first trail_n tokens are written to
  /// trail slot j = [conv | recurrent] at trail + j * (conv + recurrent floats) (null: none kept).
  float* trail = nullptr;
  int64_t trail_n = 0;
};

/// State of one Gated DeltaNet layer (host arrays; while the State is placed on a GPU with
/// State::place they are stale and the device copy is the live one).
struct GdnState {
  std::vector<float> conv;       // [conv_dim, K-1] last K-1 pre-conv inputs per channel, oldest first
  std::vector<float> recurrent;  // [n_v, d_k, d_v] S per value head
};

/// What brings a State back to position pos(): the conv and recurrent state of every Gated
/// DeltaNet layer after pos() tokens, the rows [pos() - W + 1, pos()) of every sliding-window
/// layer (its whole bounded cache's worth, see state.h's top), and, only when taken with
/// `with_kv`, a copy of every other attention layer's KV rows [0, pos()).
///
/// A KV-less snapshot (the default) costs the recurrent state and the window rows only
/// (constant in the sequence length): it relies on the live state it was taken from still
/// holding the unbounded layers' KV rows [0, pos()).
/// Those layers only ever write rows at positions >= State::pos, so those rows stay valid
/// until the state is rewound below pos() by reset(), truncate(), restore() or deserialize();
/// the State records its rewinds and refuses (spool::Error) to restore a KV-less snapshot that a
/// rewind made stale, or one taken from another State object. A snapshot with KV is
/// self-contained and can be restored into any State of the same geometry.
class StateSnapshot {
 public:
  /// Position the snapshot restores (tokens processed); -1 for a default-constructed one.
  int64_t pos() const { return pos_; }
  /// Whether the attention KV rows [0, pos()) are held (snapshot(true)).
  bool has_kv() const { return has_kv_; }
  /// Bytes held (GDN floats, sliding-window layers' rows, plus all KV cache bytes when has_kv()).
  uint64_t bytes() const;

 private:
  friend class State;
  int64_t pos_ = -1;
  uint64_t owner_ = 0;  // State identity it was taken from
  uint64_t epoch_ = 0;  // that State's rewind count when taken
  bool has_kv_ = false;
  std::vector<GdnState> gdn_;      // [n_layers]; empty entries for attention layers
  std::vector<ops::KvCache> kv_;   // [n_layers] when has_kv_ or any layer is windowed (unconfigured for
                                   // GDN layers, and for unbounded ones without has_kv_)
};

/// All state of one sequence.
class State {
 public:
  State() = default;
  /// Allocates empty state for `spec` (attention caches grow on demand) with KV entries of
  /// `kv` (f32 by default: exact; f16 / int8 trade accuracy for memory). Layer l's cache is
  /// bounded by kv_window(spec, l).
  explicit State(const ModelSpec& spec, ops::KvType kv = ops::KvType::kF32);

  /// The window layer `layer`'s KV cache is bounded by (ops::KvCache::configure): the sliding
  /// window when the layer is windowed (AttentionSpec::windowed) and the family keeps a bounded
  /// cache (AttentionSpec::window_bounds_kv), else 0 (every position kept; MLA layers always).
  static int64_t kv_window(const ModelSpec& spec, int layer);

  /// Tokens processed so far (= position of the next token).
  int64_t pos = 0;
  /// Set when a forward() failed part-way (some layers advanced, others not): the state is
  /// unusable until reset() or restore().
  bool poisoned = false;
  std::vector<AttnCache> attn;  // [n_layers]; empty for non-attention layers; latent for MLA layers
  std::vector<GdnState> gdn;    // [n_layers]; empty for non-GDN layers

  /// Keeps the Gated DeltaNet states on `device` from now on: the forward pass reads and
  /// writes the device copy (gdn_conv / gdn_recurrent), and snapshot(), serialize(), restore(),
  /// deserialize() and reset() copy between it and the host arrays only when called. kCpu
  /// brings them back to the host arrays. Throws spool::Error when the device memory cannot be had.
  void place(ops::Device device);
  /// Layer l's conv state [conv_dim, K-1] where the forward pass reads it (device or host).
  float* gdn_conv(size_t l) { return gdn_dev_.empty() ? gdn[l].conv.data() : gdn_dev_[l].data(); }
  /// Layer l's recurrent state [n_v, d_k, d_v] where the forward pass reads it.
  float* gdn_recurrent(size_t l) {
    return gdn_dev_.empty() ? gdn[l].recurrent.data() : gdn_dev_[l].data() + gdn[l].conv.size();
  }
  /// Positions [0, mtp_pos) of the multi-token-prediction head's cache (Model::mtp_forward; the
  /// layers after the main stack) hold the head's rows for this sequence's tokens. Kept by the
  /// speculative decoder; every rewind lowers it to the position rewound to.
  int64_t mtp_pos = 0;

  /// Speculative decoding: from now on every forward step over this state (Model::forward_batch)
  /// armed by arm_step_trail() of T tokens with 2 <= T <= n + 1 (a verify step: a token and up to n drafts) keeps the
  /// Gated DeltaNet conv and recurrent states after each of its first T - 1 tokens, so
  /// rewind_in_step() can cut the step back without a snapshot (the recurrence then runs token by
  /// token for such a step, as decode does; longer steps, prefill chunks, run as before).
  /// n = 0 stops it and frees the trail. Throws spool::Error when the device memory cannot be had.
  void keep_step_trail(int n);
  /// Tokens per step whose states are kept (keep_step_trail).
  int step_trail() const { return trail_cap_; }
  /// Layer l's trail for the step now running (device or host memory, see GdnSeg::trail); null
  /// when the step keeps none.
  float* gdn_trail(size_t l) {
    if (step_kept_ == 0 || gdn[l].recurrent.empty()) return nullptr;
    return trail_dev_.empty() ? trail_[l].data() : trail_dev_[l].data();
  }
  /// Tokens of the step now running whose states are kept (0: none).
  int64_t step_kept() const { return step_kept_; }
  /// Marks the next forward step over this state as a verify step (a token and its drafts): only
  /// such a step keeps its trail (and runs the recurrence token by token); prefill chunks and plain
  /// steps keep the arithmetic of a run without speculation.
  void arm_step_trail() { trail_armed_ = true; }
  /// Called by the forward pass when a step of T tokens starts at position pos0.
  void begin_step(int64_t pos0, int64_t T) {
    step_pos0_ = pos0;
    step_kept_ = trail_armed_ && T >= 2 && T - 1 <= trail_cap_ ? T - 1 : 0;
    trail_armed_ = false;
  }
  /// Cuts the last forward step back to position p, step start < p <= pos and p <= step start +
  /// kept tokens: Gated DeltaNet states from the trail, attention rows after p left to be
  /// overwritten (a rewind, as truncate). Throws spool::Error, leaving the state untouched, for
  /// a p outside that range, a state with sliding-window layers (their window rows are
  /// overwritten by the step), or a poisoned state.
  void rewind_in_step(int64_t p);

  /// Makes room for `n_positions` positions in every attention cache (copying existing rows).
  void reserve(int64_t n_positions);
  /// Back to an empty sequence (zeroes GDN state, keeps allocations). Counts as a rewind to 0.
  void reset();
  /// Bytes held by caches and states.
  uint64_t bytes() const;

  /// Whether any layer keeps a recurrent (Gated DeltaNet) state, which cannot be rewound
  /// without a snapshot.
  bool has_recurrent() const;
  /// Whether any attention layer keeps a bounded sliding-window cache (kv_window > 0), which
  /// can be cut back only while its window's rows are held (truncate()).
  bool has_windowed_kv() const;
  /// Whether truncate(n) works for every n <= pos: no recurrent and no windowed layers. When
  /// false, callers rewind with snapshot() / restore() (the server's prompt and disk caches
  /// always do).
  bool truncates_freely() const { return !has_recurrent() && !has_windowed_kv(); }

  /// Snapshot at the current position (see StateSnapshot); `with_kv` also copies KV rows
  /// [0, pos). Throws spool::Error when the state is poisoned.
  StateSnapshot snapshot(bool with_kv = false) const;
  /// Brings the state to `s`: pos = s.pos(), GDN states from `s`, KV rows [0, s.pos()) from `s`
  /// when it has them (otherwise the live rows are kept); clears `poisoned` (a failed forward
  /// only writes rows at or after the position it started from). Rows after s.pos() are left
  /// as they are and are overwritten by later forwards. Throws spool::Error, leaving the state
  /// untouched, for a default-constructed snapshot, another geometry, or a KV-less snapshot
  /// that is stale or of another State.
  void restore(const StateSnapshot& s);
  /// Cuts the sequence back to its first `n` tokens (0 <= n <= pos). Valid for any n when
  /// truncates_freely(); for n == 0 (reset) or n == pos (no-op) always; with sliding-window
  /// layers (but no recurrent ones) for an n whose window rows [n - W + 1, n) every such layer
  /// still holds (ops::KvCache::holds); a state with GDN layers, or one whose window has moved
  /// past n, is rewound with restore() of a snapshot taken at n. Throws spool::Error otherwise,
  /// or when the state is poisoned and n > 0; the state is then untouched.
  void truncate(int64_t n);

  /// Appends the byte image of the current position (KV rows and GDN states) to `out`.
  /// Layout, little-endian (version 2; version 1 images are refused):
  ///   "SPST" | u32 version | i64 n | u32 n_layers | per layer:
  ///     attention: u32 1 | u32 kv type (0 f32, 1 f16, 2 int8) | u32 n_kv_heads | u32 head_dim |
  ///                u64 window (0: unbounded) | u64 byte count | KV rows [first, n) with first =
  ///                max(0, n - window + 1) for a windowed layer, else 0 (ops::KvCache::save_prefix)
  ///     GDN:       u32 2 | u64 conv floats | u64 recurrent floats | f32 conv | f32 recurrent
  /// Integrity (a checksum) is the container's job (server/disk_cache.h). Throws spool::Error
  /// when the state is poisoned.
  void serialize(std::string& out) const;
  /// The byte image at snapshot `at` instead: KV rows up to at.pos() (from `at` when it has them
  /// or the layer is windowed, else from the live state, with the same validity rules as
  /// restore()) and `at`'s GDN states.
  void serialize(const StateSnapshot& at, std::string& out) const;
  /// Loads an image written by serialize() of a state of the same geometry and KV type, which
  /// must hold exactly `n` positions: pos = n, KV rows and GDN states replaced, poisoned
  /// cleared. The whole image is checked first: a wrong magic, version, size, layer layout,
  /// KV geometry, window or KV type, or a position other than `n`, throws spool::Error naming the
  /// problem and leaves the state untouched. Counts as a rewind to n: KV-less snapshots at or
  /// before n stay restorable (the caller guarantees the image is of the same token prefix).
  void deserialize(std::string_view data, int64_t n);

 private:
  // Identity for KV-less snapshots: every State object, copies included, gets its own.
  struct Identity {
    uint64_t v;
    Identity();
    Identity(const Identity&) : Identity() {}
    Identity& operator=(const Identity&) {
      v = Identity().v;
      return *this;
    }
  };
  // Whether a KV-less snapshot's rows [0, s.pos_) are still those of the live state.
  void check_kv_less(const StateSnapshot& s, const char* what) const;
  void record_rewind(int64_t to);
  // Device copies of the GDN states: host arrays -> device (push), device -> `dst` (pull).
  void push_gdn();
  void pull_gdn(std::vector<GdnState>& dst) const;

  std::vector<ops::DeviceFloats> gdn_dev_;  // [n_layers] conv | recurrent when placed; empty on the host
  // keep_step_trail: per GDN layer trail_cap_ slots of [conv | recurrent] (host, or device when placed).
  int trail_cap_ = 0;
  std::vector<std::vector<float>> trail_;
  std::vector<ops::DeviceFloats> trail_dev_;
  int64_t step_pos0_ = -1, step_kept_ = 0;  // the last step's start and the tokens whose states are kept
  bool trail_armed_ = false;                 // arm_step_trail() before the next step
  ops::Device device_ = ops::Device::kCpu;  // where the GDN states live (place)
  void alloc_trail();

  std::vector<char> is_attn_;  // [n_layers]
  Identity id_;
  uint64_t epoch_ = 0;  // rewinds so far
  // (epoch, position) of rewinds, positions strictly increasing: the first entry with an epoch
  // after a snapshot's holds the lowest position rewound to since it was taken.
  std::vector<std::pair<uint64_t, int64_t>> rewinds_;
};

}  // namespace spool::models
