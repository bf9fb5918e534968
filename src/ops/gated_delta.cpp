#include "ops/gated_delta.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/vec.h"
#include "ops/elementwise.h"

namespace spool::ops {

void causal_conv1d_silu(const float* x, int64_t T, int64_t C, const float* w, int K, float* state, float* out) {
  const int S = K - 1;
  std::vector<float> seq(static_cast<size_t>(S + T));
  for (int64_t c = 0; c < C; ++c) {
    // seq = [state (S values), x[:, c] (T values)]
    for (int j = 0; j < S; ++j) seq[j] = state[c * S + j];
    for (int64_t t = 0; t < T; ++t) seq[S + t] = x[t * C + c];
    const float* wc = w + c * K;
    for (int64_t t = 0; t < T; ++t) {
      float acc = 0.0f;
      for (int j = 0; j < K; ++j) acc += wc[j] * seq[t + j];
      out[t * C + c] = silu(acc);
    }
    for (int j = 0; j < S; ++j) state[c * S + j] = seq[T + j];
  }
}

namespace {

// One value head, token-by-token.
void recurrent_head(const GatedDeltaArgs& a, int h) {
  const int kh = h / (a.n_v / a.n_k);
  const int dk = a.d_k, dv = a.d_v;
  float* S = a.state + static_cast<int64_t>(h) * dk * dv;
  std::vector<float> u(dv);
  for (int64_t t = 0; t < a.T; ++t) {
    const float* q = a.q + (t * a.n_k + kh) * dk;
    const float* k = a.k + (t * a.n_k + kh) * dk;
    const float* v = a.v + (t * a.n_v + h) * dv;
    const float beta = a.beta[t * a.n_v + h];
    const float decay = std::exp(a.g[t * a.n_v + h]);
    for (int64_t i = 0; i < static_cast<int64_t>(dk) * dv; ++i) S[i] *= decay;
    std::fill(u.begin(), u.end(), 0.0f);
    for (int i = 0; i < dk; ++i) axpy(k[i], S + i * dv, dv, u.data());  // u = S^T k
    for (int j = 0; j < dv; ++j) u[j] = (v[j] - u[j]) * beta;
    for (int i = 0; i < dk; ++i) axpy(k[i], u.data(), dv, S + i * dv);  // S += k u^T
    float* o = a.out + (t * a.n_v + h) * dv;
    std::fill(o, o + dv, 0.0f);
    for (int i = 0; i < dk; ++i) axpy(q[i], S + i * dv, dv, o);  // o = S^T q
  }
}

// One value head, chunk by chunk (see header). Local index i, j within a chunk of L tokens.
void chunked_head(const GatedDeltaArgs& a, int h, int chunk) {
  const int kh = h / (a.n_v / a.n_k);
  const int dk = a.d_k, dv = a.d_v;
  float* S = a.state + static_cast<int64_t>(h) * dk * dv;
  const int C = chunk;
  std::vector<float> gam(C), M(static_cast<size_t>(C) * C), A(static_cast<size_t>(C) * C);
  std::vector<float> U(static_cast<size_t>(C) * dv), W(static_cast<size_t>(C) * dk), Vn(static_cast<size_t>(C) * dv);
  std::vector<float> kb(static_cast<size_t>(C) * dk);
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
    // U = M (beta v); W = M (beta e^{gam} k).
    for (int i = 0; i < L; ++i) {
      float* u = U.data() + i * dv;
      float* w = W.data() + i * dk;
      std::fill(u, u + dv, 0.0f);
      std::fill(w, w + dk, 0.0f);
      for (int j = 0; j <= i; ++j) {
        const float mij = M[i * C + j];
        if (mij == 0.0f) continue;
        const float b = a.beta[(t0 + j) * a.n_v + h];
        axpy(mij * b, vrow(t0 + j), dv, u);
        axpy(mij * std::exp(gam[j]), kb.data() + j * dk, dk, w);
      }
    }
    // V_new = U - W S.
    for (int i = 0; i < L; ++i) {
      float* vn = Vn.data() + i * dv;
      std::copy_n(U.data() + i * dv, dv, vn);
      for (int d = 0; d < dk; ++d) axpy(-W[i * dk + d], S + d * dv, dv, vn);
    }
    // O_i = e^{gam_i} q_i S + sum_{j<=i} (q_i . k_j) e^{gam_i - gam_j} V_new_j.
    for (int i = 0; i < L; ++i) {
      const float* q = qrow(t0 + i);
      float* o = a.out + ((t0 + i) * a.n_v + h) * dv;
      std::fill(o, o + dv, 0.0f);
      const float eg = std::exp(gam[i]);
      for (int d = 0; d < dk; ++d) axpy(q[d] * eg, S + d * dv, dv, o);
      for (int j = 0; j <= i; ++j) {
        const float c = dot(q, krow(t0 + j), dk) * std::exp(gam[i] - gam[j]);
        axpy(c, Vn.data() + j * dv, dv, o);
      }
    }
    // S = e^{gam_L} S + sum_i (k_i e^{gam_L - gam_i}) V_new_i^T.
    const float gl = gam[L - 1];
    const float el = std::exp(gl);
    for (int64_t x = 0; x < static_cast<int64_t>(dk) * dv; ++x) S[x] *= el;
    for (int i = 0; i < L; ++i) {
      const float* k = krow(t0 + i);
      const float f = std::exp(gl - gam[i]);
      for (int d = 0; d < dk; ++d) axpy(k[d] * f, Vn.data() + i * dv, dv, S + d * dv);
    }
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
