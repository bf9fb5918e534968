// Multi-head latent attention (DeepSeek-V2/V3 MLA) in its weight-absorbed form over a latent
// cache: per position one vector of kv_lora_rank + qk_rope_head_dim elements,
// [c (normed KV latent) | k_pe (roped key part shared by all heads)], stored as a keys-only
// KvCache with one head (kv_cache.h). Source: DeepSeek inference/model.py attn_impl="absorb".
#pragma once

#include <cstdint>

#include "ops/kv_cache.h"
#include "ops/thread_pool.h"

namespace spool::ops {

/// out[t, h, :dv] = sum_p softmax_p(scale * q[t, h] . key[p]) * key[p][:dv] over p <= pos0 + t.
/// q: [T, n_heads, D] f32 (D = latent.head_dim(): [W_UK^T q_nope | q_pe] per head); latent: a
/// keys-only cache of one head of D dims holding [0, pos0 + T); out: [T, n_heads, dv], dv <= D.
/// Scores and softmax in f32. Parallel over (token, head) tiles. Throws spool::Error for a
/// cache that is not keys-only with one head, or dv outside (0, D].
void mla_attention(const float* q, int64_t T, int n_heads, const KvCache& latent, int64_t pos0, float scale, int dv,
                   float* out, ThreadPool* pool);

}  // namespace spool::ops
