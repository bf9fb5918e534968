// Causal grouped-query softmax attention over a KV cache (f32).
#pragma once

#include <cstdint>

#include "ops/thread_pool.h"
#include "ops/vec.h"

namespace spool::ops {

/// Keys/values of one attention layer for one sequence. Keys are stored transposed, one row
/// per (head, dimension): k[(h * head_dim + d) * capacity + p]; values one row per position:
/// v[(h * capacity + p) * v_dim + d].
struct KVView {
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t capacity = 0;  // positions allocated per head
  int n_kv_heads = 0;
  int head_dim = 0;
  int v_dim = 0;
};

/// out[t, h, :] = softmax_p(scale * q[t, h] . k[kvh, p]) @ v[kvh, p] over p <= pos0 + t,
/// with kvh = h / (n_heads / n_kv_heads) (HF repeat_kv). The cache must already hold
/// positions [0, pos0 + T). q: [T, n_heads, head_dim]; out: [T, n_heads, v_dim].
/// Scores and softmax in f32 (SIMD exp, f32 normaliser). Parallel over (KV head, query tile).
void attention(const float* q, int64_t T, int n_heads, const KVView& kv, int64_t pos0, float scale, float* out,
               ThreadPool* pool);

}  // namespace spool::ops
