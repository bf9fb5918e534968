#include "ops/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include <hwy/aligned_allocator.h>

#include "common/error.h"
#include "ops/elementwise.h"
#include "ops/lora.h"
#include "ops/matmul.h"
#include "ops/mla.h"
#include "ops/routing.h"
#include "ops/vec.h"

namespace spool::ops {

void CpuBackend::matmul(const WeightView& w, const float* x, int64_t T, float* y) {
  ops::matmul(w, x, T, y, pool_, options_.int8_activations);
}

void CpuBackend::matmul_multi(std::span<const MatmulOut> outs, const float* x, int64_t T) {
  ops::matmul_multi(outs, x, T, pool_, options_.int8_activations);
}

namespace {

/// Growable 64-byte aligned float scratch (one per use site and thread): the GEMM kernels load
/// whole vectors of activations, and a 64-byte vector that straddles two cache lines costs two
/// L1 accesses (std::vector's 16-byte alignment made every such load straddle; prefill ~1.5x slower).
struct AlignedFloats {
  hwy::AlignedFreeUniquePtr<float[]> p;
  int64_t n = 0;
  float* get(int64_t need) {
    if (need > n) {
      p = hwy::AllocateAligned<float>(static_cast<size_t>(need));
      n = need;
    }
    return p.get();
  }
};

}  // namespace

uint64_t expert_ffn_thread_bytes(int64_t rows, int64_t H, int64_t I) {
  return static_cast<uint64_t>(rows) * static_cast<uint64_t>(H + 2 * I) * sizeof(float);
}

uint64_t expert_ffn_split_bytes(int64_t H, int64_t I, int64_t n_experts) {
  const uint64_t rows = static_cast<uint64_t>(kSplitRows), h = static_cast<uint64_t>(H), i = static_cast<uint64_t>(I);
  const uint64_t buf = (rows * (h + 2 * i) + 16 * static_cast<uint64_t>(std::max<int64_t>(n_experts, 1))) * sizeof(float);
  const uint64_t prep = 3 * rows * h * (sizeof(float) + 4), down = rows * i * (sizeof(float) + 4);
  return buf + prep + down;
}

void CpuBackend::expert_ffn(std::span<const ExpertMats> experts, const ExpertGroups& groups, size_t g0, const float* x,
                            int64_t H, Activation act, float* y) {
  const int64_t n_experts = static_cast<int64_t>(experts.size());
  // Decode-sized calls only (at most 64 token rows): the split's scratch (per expert its rows'
  // input and gate/up) stays small, and a prefill has enough experts to keep every thread busy.
  const int64_t call_rows = n_experts > 0 ? groups.first[g0 + n_experts] - groups.first[g0] : 0;
  // (Experts with LoRA terms take the per-expert path: the low-rank products want whole rows.)
  const bool lora = std::any_of(experts.begin(), experts.end(), [](const ExpertMats& w) {
    return w.gate.lora != nullptr || w.up.lora != nullptr || w.down.lora != nullptr;
  });
  if (pool_ != nullptr && n_experts > 0 && pool_->size() > 1 && call_rows <= kSplitRows && act != Activation::kClampedSwiGLU && !lora) {
    expert_ffn_split(experts, groups, g0, x, H, act, y);
    return;
  }
  const int K = groups.K;
  // Per-row adapter scales (ops/lora.h) are in scope on this thread, not on the workers: each
  // expert gathers its rows' scales and hands them to its LoRA products.
  const LoraRowScales* step_rows = lora ? lora_rows() : nullptr;
  auto run_expert = [&](int64_t bi, int) {
    const size_t gi = g0 + static_cast<size_t>(bi);
    const ExpertMats& w = experts[bi];
    const int64_t r0 = groups.first[gi], n = groups.first[gi + 1] - r0;
    thread_local AlignedFloats xe_buf, g_buf, u_buf;  // expert_ffn_thread_bytes
    float* xe = xe_buf.get(n * H);
    float* g = nullptr;
    for (int64_t j = 0; j < n; ++j) std::copy_n(x + (groups.rows[r0 + j] / K) * H, H, xe + j * H);
    thread_local std::vector<float> scales_buf;
    LoraRowScales expert_rows;
    const LoraRowScales* rs = nullptr;
    if (step_rows != nullptr) {
      const int nA = step_rows->n_adapters;
      scales_buf.resize(static_cast<size_t>(n * nA));
      for (int64_t j = 0; j < n; ++j) {
        const int64_t t = groups.rows[r0 + j] / K;
        if (t >= step_rows->rows)
          fail("LoRA: expert row %lld is outside the %lld rows of the per-row adapter scales", (long long)t, (long long)step_rows->rows);
        std::copy_n(step_rows->scales + t * nA, nA, scales_buf.data() + j * nA);
      }
      expert_rows = {scales_buf.data(), n, nA};
      rs = &expert_rows;
    }
    switch (act) {
      case Activation::kSwiGLU:
      case Activation::kGeluTanhGLU: {
        const int64_t I = w.gate.rows;
        g = g_buf.get(n * I);
        float* u = u_buf.get(n * I);
        matmul_rows_pair(w.gate, g, w.up, u, xe, n, options_.int8_activations);  // [n, I] each
        if (w.gate.lora != nullptr && w.up.lora != nullptr && w.gate.cols == w.up.cols) {
          lora_add_pair(*w.gate.lora, g, *w.up.lora, u, xe, n, w.gate.cols, I, I, rs);  // one A x when they share A
        } else {
          if (w.gate.lora != nullptr) lora_add(w.gate, xe, n, g, I, rs);
          if (w.up.lora != nullptr) lora_add(w.up, xe, n, u, I, rs);
        }
        if (act == Activation::kSwiGLU) {
          ops::swiglu(g, u, n * I, g);
        } else {
          ops::gelu_tanh_glu(g, u, n * I, g);
        }
        break;
      }
      case Activation::kClampedSwiGLU: {  // fused interleaved gate_up [2I, H] -> h [n, I] in place
        const int64_t I2 = w.gate.rows;
        g = g_buf.get(n * I2);
        matmul_rows(w.gate, xe, n, g, I2, 0, I2, options_.int8_activations);
        if (w.gate.lora != nullptr) lora_add(w.gate, xe, n, g, I2, rs);
        // Row j's output [j*I, (j+1)*I) never overlaps the unread input of rows >= j.
        for (int64_t j = 0; j < n; ++j) clamped_swiglu(g + j * I2, w.gate_bias, I2 / 2, g + j * (I2 / 2));
        break;
      }
    }
    matmul_rows(w.down, g, n, y + r0 * H, H, 0, H, options_.int8_activations);  // [n, H]
    if (w.down.lora != nullptr) lora_add(w.down, g, n, y + r0 * H, H, rs);
    if (w.down_bias)
      for (int64_t j = 0; j < n; ++j) axpy(1.0f, w.down_bias, H, y + (r0 + j) * H);
  };
  const int64_t nb = static_cast<int64_t>(experts.size());
  if (pool_ == nullptr) {
    for (int64_t i = 0; i < nb; ++i) run_expert(i, 0);
  } else {
    pool_->run(nb, run_expert);
  }
}

void CpuBackend::expert_ffn_split(std::span<const ExpertMats> experts, const ExpertGroups& groups, size_t g0,
                                  const float* x, int64_t H, Activation act, float* y) {
  const int K = groups.K;
  const bool int8 = options_.int8_activations;
  const int64_t nb = static_cast<int64_t>(experts.size());
  // Tasks per expert and phase: at least 8 per thread in all (9 experts on 2 threads: 18 tasks, which
  // end within one small task of each other; one task per expert left a thread idle for a whole expert).
  const int64_t parts = std::max<int64_t>(1, (8 * pool_->size() + nb - 1) / nb);
  // Scratch layout per expert e: xe [n_e, H], g [n_e, I_e], u [n_e, I_e], 16-float aligned.
  std::vector<int64_t> off(static_cast<size_t>(nb) + 1, 0);
  auto rows_of = [&](int64_t e) { return groups.first[g0 + e + 1] - groups.first[g0 + e]; };
  for (int64_t e = 0; e < nb; ++e)
    off[e + 1] = off[e] + (rows_of(e) * (H + 2 * experts[e].gate.rows) + 15) / 16 * 16;
  if (off[nb] > split_n_) {
    split_buf_ = hwy::AllocateAligned<float>(static_cast<size_t>(off[nb]));
    split_n_ = off[nb];
  }
  float* buf = split_buf_.get();
  for (int64_t e = 0; e < nb; ++e) {
    const int64_t r0 = groups.first[g0 + e], n = rows_of(e);
    for (int64_t j = 0; j < n; ++j) std::copy_n(x + (groups.rows[r0 + j] / K) * H, H, buf + off[e] + j * H);
  }
  // Gate / up inputs, each prepared once (rotated, int8-quantized) per distinct token rows and
  // rotation: in a decode step every routed expert has the token's one row and the layer's gate/up
  // sign vector, so one preparation serves them all (was one per expert, on its thread).
  auto same_rows = [&](int64_t a, int64_t b) {
    const int64_t n = rows_of(a);
    if (rows_of(b) != n) return false;
    for (int64_t j = 0; j < n; ++j)
      if (groups.rows[groups.first[g0 + a] + j] / K != groups.rows[groups.first[g0 + b] + j] / K) return false;
    return true;
  };
  std::vector<int64_t> owner;  // owner[k]: the expert whose gathered rows prep_[k] was made from
  auto input_for = [&](int64_t e, const WeightView& w) -> int {
    for (size_t k = 0; k < owner.size(); ++k)
      if (same_rows(owner[k], e) && prepared_for(prep_[k], w, int8)) return static_cast<int>(k);
    const size_t k = owner.size();
    owner.push_back(e);
    if (prep_.size() <= k) prep_.resize(k + 1);
    prepare_input(w, buf + off[e], rows_of(e), int8, prep_[k]);
    return static_cast<int>(k);
  };
  std::vector<int> gate_in(static_cast<size_t>(nb), -1), up_in(static_cast<size_t>(nb), -1);
  for (int64_t e = 0; e < nb; ++e) {
    if (rows_of(e) == 0) continue;
    gate_in[e] = input_for(e, experts[e].gate);
    up_in[e] = input_for(e, experts[e].up);
  }
  if (static_cast<int64_t>(down_in_.size()) < nb) down_in_.resize(static_cast<size_t>(nb));
  std::vector<std::atomic<int64_t>> done(static_cast<size_t>(nb));
  // [b, e) of `rows` for part p of `parts`, in 16-row units (the kernels' row tiles).
  auto range = [&](int64_t rows, int64_t p, int64_t& b, int64_t& e) {
    const int64_t units = (rows + 15) / 16, per = (units + parts - 1) / parts;
    b = std::min(rows, p * per * 16);
    e = std::min(rows, (p + 1) * per * 16);
  };
  pool_->run(nb * parts, [&](int64_t task, int) {  // gate, up and the activation, rows [b, e) of I
    const int64_t ei = task / parts, n = rows_of(ei);
    if (n == 0) return;
    const ExpertMats& w = experts[ei];
    const int64_t I = w.gate.rows;
    int64_t b, e;
    range(I, task % parts, b, e);
    float* g = buf + off[ei] + n * H;
    float* u = g + n * I;
    if (b < e) {
      matmul_prepared_rows(w.gate, prep_[gate_in[ei]], g, I, b, e, int8);
      matmul_prepared_rows(w.up, prep_[up_in[ei]], u, I, b, e, int8);
      for (int64_t t = 0; t < n; ++t) {
        if (act == Activation::kSwiGLU) {
          ops::swiglu(g + t * I + b, u + t * I + b, e - b, g + t * I + b);
        } else {
          ops::gelu_tanh_glu(g + t * I + b, u + t * I + b, e - b, g + t * I + b);
        }
      }
    }
    // The expert's last part prepares its down input (every part's rows are visible to it: the
    // counter's release / acquire), so the next job starts without a serial step on this thread.
    if (done[ei].fetch_add(1, std::memory_order_acq_rel) + 1 == parts) prepare_input(w.down, g, n, int8, down_in_[ei]);
  });
  pool_->run(nb * parts, [&](int64_t task, int) {  // down, rows [b, e) of H
    const int64_t ei = task / parts, n = rows_of(ei);
    if (n == 0) return;
    const ExpertMats& w = experts[ei];
    int64_t b, e;
    range(H, task % parts, b, e);
    if (b >= e) return;
    const int64_t r0 = groups.first[g0 + ei];
    matmul_prepared_rows(w.down, down_in_[ei], y + r0 * H, H, b, e, int8);
    if (w.down_bias)
      for (int64_t j = 0; j < n; ++j) axpy(1.0f, w.down_bias + b, e - b, y + (r0 + j) * H + b);
  });
}

void CpuBackend::moe_combine(const float* y, const ExpertGroups& groups, const float* weights, int64_t H, float* out) {
  const int64_t T = groups.T;
  const int K = groups.K;
  std::fill(out, out + T * H, 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int s = 0; s < K; ++s) axpy(weights[t * K + s], y + groups.row_of[t * K + s] * H, H, out + t * H);
}

void CpuBackend::route_softmax_top_k(float* logits, int64_t T, int E, int k, bool renormalize, int* ids, float* weights,
                                     float* margins) {
  for (int64_t t = 0; t < T; ++t)
    route_top_k(logits + t * E, E, k, renormalize, ids + t * k, weights + t * k, margins ? margins + t : nullptr);
}

void CpuBackend::kv_append(KvCache& cache, int64_t pos0, int64_t T, const float* k, const float* v) {
  const int64_t w = static_cast<int64_t>(cache.n_kv_heads()) * cache.head_dim();
  for (int64_t t = 0; t < T; ++t) cache.write(pos0 + t, k + t * w, v + t * w);
}

void CpuBackend::attention(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, float* out) {
  ops::attention(q, T, n_heads, kv, pos0, scale, out, pool_);
}

void CpuBackend::route_grouped_top_k(const float* logits, int64_t T, int E, int k, const RouterParams& r, int* ids,
                                     float* weights, float* margins) {
  for (int64_t t = 0; t < T; ++t)
    route_grouped(logits + t * E, E, k, r, ids + t * k, weights + t * k, margins ? margins + t : nullptr);
}

void CpuBackend::attention_window(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale,
                                  int64_t window, float* out) {
  ops::attention(q, T, n_heads, kv, pos0, scale, out, pool_, window);
}

void CpuBackend::attention_sinks(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale,
                                 int64_t window, const float* sinks, float* out) {
  ops::attention(q, T, n_heads, kv, pos0, scale, out, pool_, window, sinks);
}

void CpuBackend::mla_attention(const float* q, int64_t T, int n_heads, const KvCache& latent, int64_t pos0, float scale,
                               int dv, float* out) {
  ops::mla_attention(q, T, n_heads, latent, pos0, scale, dv, out, pool_);
}

void CpuBackend::rope(const Rope& rope, float* x, int64_t T, int64_t row_stride, int n_heads, int head_dim, int64_t pos0) {
  for (int64_t t = 0; t < T; ++t) rope.apply(x + t * row_stride, n_heads, head_dim, pos0 + t);
}

void CpuBackend::causal_conv1d_silu(const float* x, int64_t T, int64_t C, const float* w, int K, float* state, float* out) {
  ops::causal_conv1d_silu(x, T, C, w, K, state, out, pool_);
}

void CpuBackend::gated_delta(const GatedDeltaArgs& a, int chunk) {
  if (a.T == 1) {
    gated_delta_recurrent(a, pool_);
  } else {
    gated_delta_chunked(a, chunk, pool_);
  }
}

void CpuBackend::gdn_gates(const float* b, const float* a, const float* a_exp, const float* dt_bias, int64_t T, int n_v,
                           float* beta, float* g) {
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < n_v; ++h) {
      beta[t * n_v + h] = sigmoid(b[t * n_v + h]);
      g[t * n_v + h] = -a_exp[h] * softplus(a[t * n_v + h] + dt_bias[h]);
    }
}

void CpuBackend::rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) {
  rms_norm_rows(x, w, rows, n, eps, y);
}

void CpuBackend::l2_norm(float* x, int64_t rows, int64_t n, float eps, float post_scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * n;
    ops::l2_norm(row, n, eps);
    if (post_scale != 1.0f)
      for (int64_t d = 0; d < n; ++d) row[d] *= post_scale;
  }
}

void CpuBackend::rms_norm_gated(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x + r * n;
    const float* zr = z + r * n;
    ops::rms_norm(xr, w, n, eps, xr);
    for (int64_t d = 0; d < n; ++d) xr[d] *= silu(zr[d]);
  }
}

void CpuBackend::add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void CpuBackend::add_bias(float* y, const float* b, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) y[r * n + i] += b[i];
}

void CpuBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) { ops::swiglu(gate, up, n, out); }

void CpuBackend::gelu_tanh_glu(const float* gate, const float* up, int64_t n, float* out) {
  ops::gelu_tanh_glu(gate, up, n, out);
}

void CpuBackend::scale(float* x, int64_t n, float a) {
  for (int64_t i = 0; i < n; ++i) x[i] *= a;
}

void CpuBackend::softcap(float* x, int64_t n, float cap) { ops::softcap(x, n, cap); }

void CpuBackend::mul_indexed(float* w, const int* ids, const float* table, int64_t n) {
  for (int64_t i = 0; i < n; ++i) w[i] *= table[ids[i]];
}

void CpuBackend::mul_sigmoid(float* x, const float* gate, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= sigmoid(gate[i]);
}

void CpuBackend::add_gated_rows(float* out, const float* s, const float* x, const float* w, int64_t T, int64_t n) {
  for (int64_t t = 0; t < T; ++t) {
    const float gate = w == nullptr ? 1.0f : sigmoid(dot(x + t * n, w, n));
    axpy(gate, s + t * n, n, out + t * n);
  }
}

void CpuBackend::copy_2d(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * ld_dst, src + r * ld_src, static_cast<size_t>(cols) * sizeof(float));
}

void CpuBackend::row_to_f32(WType t, const void* src, int64_t n, float* dst) { ops::row_to_f32(t, src, n, dst); }

void CpuBackend::to_host(const float* src, int64_t n, float* dst) {
  if (src != dst) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

}  // namespace spool::ops
