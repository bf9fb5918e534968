// Gated DeltaNet kernels (Yang et al., "Gated Delta Networks", 2024; HF
// transformers models/qwen3_5_moe modeling: torch_causal_conv1d_update,
// torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule). All f32.
#pragma once

#include <cstdint>

#include "ops/thread_pool.h"

namespace spool::ops {

/// Causal depthwise conv1d over time followed by SiLU, with a carried state.
/// x: [T, C] new inputs; w: [C, K] kernel; state: [C, K-1] the previous K-1 inputs per channel
/// (oldest first; zeros for a fresh sequence), replaced by the last K-1 inputs on return;
/// out: [T, C], out[t, c] = silu(sum_j w[c, j] * in[t - (K-1) + j, c]). Token by token over
/// blocks of channels, parallel over channel blocks when a pool is given (results do not depend
/// on it). `out` must not alias `x`.
void causal_conv1d_silu(const float* x, int64_t T, int64_t C, const float* w, int K, float* state, float* out,
                        ThreadPool* pool = nullptr);

/// Inputs of the gated delta rule for T tokens. Value head h reads key head h / (n_v / n_k).
struct GatedDeltaArgs {
  int64_t T = 0;
  int n_k = 0, n_v = 0, d_k = 0, d_v = 0;
  const float* q = nullptr;     // [T, n_k, d_k], L2-normalised and scaled by 1/sqrt(d_k)
  const float* k = nullptr;     // [T, n_k, d_k], L2-normalised
  const float* v = nullptr;     // [T, n_v, d_v]
  const float* beta = nullptr;  // [T, n_v], sigmoid(b)
  const float* g = nullptr;     // [T, n_v], log decay (<= 0)
  float* state = nullptr;       // [n_v, d_k, d_v] recurrent state S, updated in place
  float* out = nullptr;         // [T, n_v, d_v]
};

/// Token-by-token recurrence (decode): S <- e^g S; u = beta (v - S^T k); S <- S + k u^T; o = S^T q.
void gated_delta_recurrent(const GatedDeltaArgs& a, ThreadPool* pool);

/// Chunked form (prefill), algebraically identical to the recurrence: chunks of `chunk`
/// tokens (64 in HF), WY representation via forward substitution of (I + L), inter-chunk
/// state carried. Parallel over value heads.
void gated_delta_chunked(const GatedDeltaArgs& a, int chunk, ThreadPool* pool);

}  // namespace spool::ops
