#include "ops/gated_delta.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/vec.h"
#include "ops/elementwise.h"

#if defined(__SSE__) || defined(_M_X64)
#include <xmmintrin.h>
#define SPOOL_GDN_FLUSH_DENORMALS 1
#else
#define SPOOL_GDN_FLUSH_DENORMALS 0
#endif

namespace spool::ops {

namespace {

// causal_conv1d_silu for channels [c0, c1), token by token (rows of x read contiguously; the
// caller's formula per element, the same operations in the same order).
void conv1d_silu_channels(const float* x, int64_t T, int64_t C, const float* w, int K, float* state, float* out, int64_t c0,
                          int64_t c1) {
  const int S = K - 1;
  const int64_t n = c1 - c0;
  if (T == 1) {
    // One token (decode): each channel straight from its kernel row and carried inputs, no
    // time-major copies (those cost more than the products at T = 1). The same products summed in
    // the same order as below, so the result is bit-identical.
    for (int64_t c = c0; c < c1; ++c) {
      const float* wc = w + c * K;
      float* st = state + c * S;
      float acc = 0.0f;
      for (int j = 0; j < S; ++j) acc += wc[j] * st[j];
      acc += wc[S] * x[c];
      out[c] = silu(acc);
      for (int j = 0; j + 1 < S; ++j) st[j] = st[j + 1];
      if (S > 0) st[S - 1] = x[c];
    }
    return;
  }
  // wT [K, n], hist [S, n]: the kernel and the carried inputs of these channels, time-major
  // (per-thread buffers, grown only: decode calls this once per token and layer)
  thread_local std::vector<float> wT, hist, acc;
  for (auto* v : {&wT, &hist, &acc}) v->resize(std::max(v->size(), static_cast<size_t>(K * n)));
  for (int64_t c = 0; c < n; ++c) {
    for (int j = 0; j < K; ++j) wT[j * n + c] = w[(c0 + c) * K + j];
    for (int j = 0; j < S; ++j) hist[j * n + c] = state[(c0 + c) * S + j];
  }
  // input row i of the sequence [state, x] (i < S: the carried state)
  auto row = [&](int64_t i) { return i < S ? hist.data() + i * n : x + (i - S) * C + c0; };
  for (int64_t t = 0; t < T; ++t) {
    std::fill(acc.begin(), acc.begin() + n, 0.0f);
    for (int j = 0; j < K; ++j) {
      const float* r = row(t + j);
      const float* wj = wT.data() + j * n;
      for (int64_t c = 0; c < n; ++c) acc[c] += wj[c] * r[c];
    }
    for (int64_t c = 0; c < n; ++c) out[t * C + c0 + c] = silu(acc[c]);
  }
  for (int j = 0; j < S; ++j) {
    const float* r = row(T + j);
    for (int64_t c = 0; c < n; ++c) state[(c0 + c) * S + j] = r[c];
  }
}

}  // namespace

void causal_conv1d_silu(const float* x, int64_t T, int64_t C, const float* w, int K, float* state, float* out, ThreadPool* pool) {
  // Parallel from 4096 channel-tokens: a decode step's 8192 channels (Qwen3.6's DeltaNet) took ~75 us on
  // one thread (a SiLU per channel), serial work between two parallel jobs while the other thread waits.
  if (pool == nullptr || pool->size() == 1 || T * C < (1 << 12)) return conv1d_silu_channels(x, T, C, w, K, state, out, 0, C);
  pool->parallel_for(C, 64, [&](int64_t b, int64_t e, int) { conv1d_silu_channels(x, T, C, w, K, state, out, b, e); });
}

namespace {

// Flush-to-zero and denormals-are-zero (x86 MXCSR bits FTZ 0x8000, DAZ 0x0040) on this thread
// for the guard's lifetime; the caller's MXCSR comes back on exit. The decays e^{gamma} shrink the
// chunk products geometrically, and x86 cores take a microcode assist for every subnormal operand
// or result (about a hundred cycles): on the Qwen3.6-shaped test file (4 layers, Q4_K_M) a quarter
// of a one-thread pp512 went to the chunks' FMAs; with the guard its CPU time fell 5.4 -> 4.0 s.
// (The one-token recurrence showed no change in decode speed, so it runs without.) Subnormals are below 1.2e-38, far under the f32 rounding
// of the sums they enter, so flushing them moves results by less than the tests' tolerances
// against the double-precision definition. No-op on other architectures (NEON handles them at
// full speed on the cores we target).
class FlushDenormals {
 public:
#if SPOOL_GDN_FLUSH_DENORMALS
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040u); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#else
  FlushDenormals() = default;
#endif
 public:
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;
};

// One value head, token-by-token.
void recurrent_head(const GatedDeltaArgs& a, int h) {
  const int kh = h / (a.n_v / a.n_k);
  const int dk = a.d_k, dv = a.d_v;
  float* S = a.state + static_cast<int64_t>(h) * dk * dv;
  thread_local std::vector<float> u;  // scratch [dv], grown only: decode calls this per head and token
  if (u.size() < static_cast<size_t>(dv)) u.resize(dv);
  for (int64_t t = 0; t < a.T; ++t) {
    const float* q = a.q + (t * a.n_k + kh) * dk;
    const float* k = a.k + (t * a.n_k + kh) * dk;
    const float* v = a.v + (t * a.n_v + h) * dv;
    const float beta = a.beta[t * a.n_v + h];
    const float decay = std::exp(a.g[t * a.n_v + h]);
    delta_rule_step(S, dk, dv, decay, k, q, v, beta, u.data(), a.out + (t * a.n_v + h) * dv);
  }
}

// One value head, chunk by chunk (see header). Local index i, j within a chunk of L tokens.
void chunked_head(const GatedDeltaArgs& a, int h, int chunk) {
  const FlushDenormals flush;
  const int kh = h / (a.n_v / a.n_k);
  const int dk = a.d_k, dv = a.d_v;
  float* S = a.state + static_cast<int64_t>(h) * dk * dv;
  const int C = chunk;
  std::vector<float> gam(C), M(static_cast<size_t>(C) * C), A(static_cast<size_t>(C) * C);
  std::vector<float> U(static_cast<size_t>(C) * dv), W(static_cast<size_t>(C) * dk), Vn(static_cast<size_t>(C) * dv);
  std::vector<float> kb(static_cast<size_t>(C) * dk);
  std::vector<float> Mb(static_cast<size_t>(C) * C), Me(static_cast<size_t>(C) * C), Cm(static_cast<size_t>(C) * C);
  std::vector<float> Qs(static_cast<size_t>(C) * dk), Kt(static_cast<size_t>(dk) * C);
  auto qrow = [&](int64_t t) { return a.q + (t * a.n_k + kh) * dk; };
  auto krow = [&](int64_t t) { return a.k + (t * a.n_k + kh) * dk; };
  auto vrow = [&](int64_t t) { return a.v + (t * a.n_v + h) * dv; };
  for (int64_t t0 = 0; t0 < a.T; t0 += C) {
    const int L = static_cast<int>(std::min<int64_t>(C, a.T - t0));
    // gamma = cumsum(g) within the chunk.
    float acc = 0.0f;
    for (int i = 0; i < L; ++i) {
      acc += a.g[(t0 + i) * a.n_v + h];
      gam[i] = acc;
    }
    // kb_i = beta_i k_i.
    for (int i = 0; i < L; ++i) {
      const float b = a.beta[(t0 + i) * a.n_v + h];
      const float* k = krow(t0 + i);
      for (int d = 0; d < dk; ++d) kb[i * dk + d] = b * k[d];
    }
    // A_ij = -(kb_i . k_j) e^{gam_i - gam_j} for j < i; M = (I + L)^-1 by forward substitution:
    // M_ij = A_ij + sum_{m=j+1}^{i-1} A_im M_mj (strictly lower part), then M += I.
    for (int i = 0; i < L; ++i) {
      for (int j = 0; j < i; ++j) A[i * C + j] = -dot(kb.data() + i * dk, krow(t0 + j), dk) * std::exp(gam[i] - gam[j]);
    }
    for (int i = 0; i < L; ++i) {
      for (int j = 0; j < i; ++j) {
        float s = A[i * C + j];
        for (int m = j + 1; m < i; ++m) s += A[i * C + m] * M[m * C + j];
        M[i * C + j] = s;
      }
      M[i * C + i] = 1.0f;
    }
    // The products with S and across the chunk below are register-tiled GEMMs (accumulate_rows:
    // 4 rows x one vector per FMA chain) instead of one axpy per row pair; each output element
    // still sums its terms in the same order with the same products, so results are unchanged.
    // U = M (beta v); -W = (-M) (beta e^{gam} k): Mb_ij = M_ij beta_j, Me_ij = -M_ij e^{gam_j}
    // (zero above the diagonal).
    for (int i = 0; i < L; ++i) {
      for (int j = 0; j < L; ++j) {
        const float mij = j <= i ? M[i * C + j] : 0.0f;
        Mb[i * C + j] = mij * a.beta[(t0 + j) * a.n_v + h];
        Me[i * C + j] = -(mij * std::exp(gam[j]));
      }
    }
    std::fill(U.begin(), U.begin() + static_cast<int64_t>(L) * dv, 0.0f);
    std::fill(W.begin(), W.begin() + static_cast<int64_t>(L) * dk, 0.0f);
    accumulate_rows(Mb.data(), C, L, vrow(t0), static_cast<int64_t>(a.n_v) * dv, L, dv, U.data(), dv);
    accumulate_rows(Me.data(), C, L, kb.data(), dk, L, dk, W.data(), dk);  // W holds -W
    // V_new = U - W S.
    std::copy_n(U.data(), static_cast<int64_t>(L) * dv, Vn.data());
    accumulate_rows(W.data(), dk, L, S, dv, dk, dv, Vn.data(), dv);
    // O_i = e^{gam_i} q_i S + sum_{j<=i} (q_i . k_j) e^{gam_i - gam_j} V_new_j.
    for (int i = 0; i < L; ++i) {
      const float* q = qrow(t0 + i);
      const float eg = std::exp(gam[i]);
      for (int d = 0; d < dk; ++d) Qs[i * dk + d] = q[d] * eg;
      for (int j = 0; j < L; ++j) Cm[i * C + j] = j <= i ? dot(q, krow(t0 + j), dk) * std::exp(gam[i] - gam[j]) : 0.0f;
    }
    float* o0 = a.out + (t0 * a.n_v + h) * dv;
    const int64_t ldo = static_cast<int64_t>(a.n_v) * dv;
    for (int i = 0; i < L; ++i) std::fill(o0 + i * ldo, o0 + i * ldo + dv, 0.0f);
    accumulate_rows(Qs.data(), dk, L, S, dv, dk, dv, o0, ldo);
    accumulate_rows(Cm.data(), C, L, Vn.data(), dv, L, dv, o0, ldo);
    // S = e^{gam_L} S + sum_i (k_i e^{gam_L - gam_i}) V_new_i^T: Kt_di = k_i[d] e^{gam_L - gam_i}.
    const float gl = gam[L - 1];
    const float el = std::exp(gl);
    for (int64_t x = 0; x < static_cast<int64_t>(dk) * dv; ++x) S[x] *= el;
    for (int i = 0; i < L; ++i) {
      const float* k = krow(t0 + i);
      const float f = std::exp(gl - gam[i]);
      for (int d = 0; d < dk; ++d) Kt[d * C + i] = k[d] * f;
    }
    accumulate_rows(Kt.data(), C, dk, Vn.data(), dv, L, dv, S, dv);
  }
}

}  // namespace

void gated_delta_recurrent(const GatedDeltaArgs& a, ThreadPool* pool) {
  if (pool == nullptr || a.n_v == 1) {
    for (int h = 0; h < a.n_v; ++h) recurrent_head(a, h);
    return;
  }
  pool->run(a.n_v, [&](int64_t h, int) { recurrent_head(a, static_cast<int>(h)); });
}

void gated_delta_chunked(const GatedDeltaArgs& a, int chunk, ThreadPool* pool) {
  if (pool == nullptr || a.n_v == 1) {
    for (int h = 0; h < a.n_v; ++h) chunked_head(a, h, chunk);
    return;
  }
  pool->run(a.n_v, [&](int64_t h, int) { chunked_head(a, static_cast<int>(h), chunk); });
}

}  // namespace spool::ops
