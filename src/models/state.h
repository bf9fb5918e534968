// Per-sequence model state: attention KV caches, Gated DeltaNet conv and recurrent states,
// and the number of tokens processed. Owned by the caller (engine::Session); one per sequence.
#pragma once

#include <cstdint>
#include <vector>

#include "models/spec.h"
#include "ops/kv_cache.h"

namespace spool::models {

/// KV cache of one attention layer (f32, f16 or int8; see ops/kv_cache.h).
using AttnCache = ops::KvCache;

/// State of one Gated DeltaNet layer.
struct GdnState {
  std::vector<float> conv;       // [conv_dim, K-1] last K-1 pre-conv inputs per channel, oldest first
  std::vector<float> recurrent;  // [n_v, d_k, d_v] S per value head
};

/// All state of one sequence.
class State {
 public:
  State() = default;
  /// Allocates empty state for `spec` (attention caches grow on demand) with KV entries of
  /// `kv` (f32 by default: exact; f16 / int8 trade accuracy for memory).
  explicit State(const ModelSpec& spec, ops::KvType kv = ops::KvType::kF32);

  /// Tokens processed so far (= position of the next token).
  int64_t pos = 0;
  /// Set when a forward() failed part-way (some layers advanced, others not): the state is
  /// unusable until reset().
  bool poisoned = false;
  std::vector<AttnCache> attn;  // [n_layers]; empty for non-attention layers
  std::vector<GdnState> gdn;    // [n_layers]; empty for non-GDN layers

  /// Makes room for `n_positions` positions in every attention cache (copying existing rows).
  void reserve(int64_t n_positions);
  /// Back to an empty sequence (zeroes GDN state, keeps allocations).
  void reset();
  /// Bytes held by caches and states.
  uint64_t bytes() const;

 private:
  std::vector<char> is_attn_;  // [n_layers]
};

}  // namespace spool::models
