// CudaBackend Gated DeltaNet ops (ops/gated_delta.h): the causal depthwise conv1d + SiLU with its
// carried state, the delta-rule recurrence (state columns in registers), the beta / g gates.
#include "ops/cuda/cuda_internal.h"

namespace spool::ops::cu {
namespace {

constexpr int kMaxConvK = 16;
// One thread per channel: out[t, c] = silu(sum_j w[c, j] in[t - (K-1) + j, c]); state <- last K-1 inputs.
__global__ void k_conv1d_silu(const float* x, int64_t T, int64_t C, const float* w, int K, float* state, float* out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int S = K - 1;
  float* st = state + c * S;
  auto in = [&](int64_t i) { return i < 0 ? st[S + i] : x[i * C + c]; };
  for (int64_t t = 0; t < T; ++t) {
    float acc = 0.0f;
    for (int j = 0; j < K; ++j) acc += w[c * K + j] * in(t - (K - 1) + j);
    out[t * C + c] = silu_f(acc);
  }
  float last[kMaxConvK];
  for (int j = 0; j < S; ++j) last[j] = in(T - S + j);
  for (int j = 0; j < S; ++j) st[j] = last[j];
}
// Gated DeltaNet recurrence (the recurrent form, any T): per value head h, state S [d_k, d_v];
// for each token S = S * exp(g); u = (v - k^T S) * beta; S += k u^T; out = q^T S (ops/gated_delta.h).
// A block owns 32 state columns of one head and keeps them in registers for all T tokens: thread
// (x, y) holds rows [32 y, 32 y + 32) of column x (blockDim.y = ceil(d_k / 32)); the column sums
// k^T S and q^T S are added over y through shared memory. Dynamic smem: (2 d_k + 32 blockDim.y) floats.
constexpr int kGdnRows = 32;  // state rows per thread
__global__ void k_gated_delta(int64_t T, int n_k, int n_v, int d_k, int d_v, const float* q, const float* k, const float* v,
                              const float* beta, const float* g, float* state, float* out) {
  extern __shared__ float sm[];
  float* qs = sm;
  float* ks = sm + d_k;
  float* part = ks + d_k;  // [blockDim.y][32]
  const int nchunk = (d_v + 31) / 32;
  const int h = blockIdx.x / nchunk, kh = h / (n_v / n_k);
  const int x = threadIdx.x, y = threadIdx.y, G = blockDim.y;
  const int j = (blockIdx.x % nchunk) * 32 + x, i0 = y * kGdnRows;
  const bool col = j < d_v;
  float* S = state + static_cast<int64_t>(h) * d_k * d_v;
  float s[kGdnRows];
#pragma unroll
  for (int r = 0; r < kGdnRows; ++r) s[r] = col && i0 + r < d_k ? S[static_cast<int64_t>(i0 + r) * d_v + j] : 0.0f;
  const int tid = y * 32 + x, nt = 32 * G;
  for (int64_t t = 0; t < T; ++t) {
    __syncthreads();
    for (int i = tid; i < d_k; i += nt) {
      qs[i] = q[(t * n_k + kh) * d_k + i];
      ks[i] = k[(t * n_k + kh) * d_k + i];
    }
    __syncthreads();
    const float decay = expf(g[t * n_v + h]), b = beta[t * n_v + h];
    float kS = 0.0f;
#pragma unroll
    for (int r = 0; r < kGdnRows; ++r)
      if (i0 + r < d_k) {
        s[r] = s[r] * decay;
        kS += ks[i0 + r] * s[r];
      }
    part[tid] = kS;
    __syncthreads();
    float kst = 0.0f;
    for (int yy = 0; yy < G; ++yy) kst += part[yy * 32 + x];
    const float u = col ? (v[(t * n_v + h) * d_v + j] - kst) * b : 0.0f;
    float o = 0.0f;
#pragma unroll
    for (int r = 0; r < kGdnRows; ++r)
      if (i0 + r < d_k) {
        s[r] = s[r] + ks[i0 + r] * u;
        o += qs[i0 + r] * s[r];
      }
    __syncthreads();  // every thread has read the k^T S sums
    part[tid] = o;
    __syncthreads();
    if (y == 0 && col) {
      float ot = 0.0f;
      for (int yy = 0; yy < G; ++yy) ot += part[yy * 32 + x];
      out[(t * n_v + h) * d_v + j] = ot;
    }
  }
#pragma unroll
  for (int r = 0; r < kGdnRows; ++r)
    if (col && i0 + r < d_k) S[static_cast<int64_t>(i0 + r) * d_v + j] = s[r];
}

__global__ void k_gdn_gates(const float* b, const float* a, const float* a_exp, const float* dt_bias, int64_t T, int n_v,
                            float* beta, float* g) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < T * n_v; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int h = static_cast<int>(i % n_v);
    beta[i] = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(b[i]))));
    const double x = static_cast<double>(a[i]) + dt_bias[h];
    const double sp = x > 20.0 ? x : log1p(exp(x));
    g[i] = static_cast<float>(-static_cast<double>(a_exp[h]) * sp);
  }
}

}  // namespace
}  // namespace spool::ops::cu

namespace spool::ops::cu {

void causal_conv1d_silu(CudaBackend::Impl& I, const float* x, int64_t T, int64_t C, const float* w, int K, float* state, float* out) {
  if (K < 1 || K > kMaxConvK) fail("causal_conv1d: kernel size %d outside 1..%d", K, kMaxConvK);
  const float* xd = I.in(x, T * C);
  const float* wd = I.in(w, C * K, false);
  auto so = I.out(state, C * (K - 1), true);
  auto oo = I.out(out, T * C, false);
  k_conv1d_silu<<<blocks_for(C, 128), 128, 0, I.stream>>>(xd, T, C, wd, K, so.d, oo.d);
  CU_LAUNCHED("k_conv1d_silu");
  I.copy_back(so);
  I.copy_back(oo);
  if (so.host != nullptr || oo.host != nullptr) CU(cudaStreamSynchronize(I.stream));
}

void gated_delta(CudaBackend::Impl& I, const GatedDeltaArgs& a, int /*chunk*/) {
  if (a.T <= 0) return;
  if (a.n_k <= 0 || a.n_v % a.n_k != 0) fail("gated_delta: %d value heads over %d key heads", a.n_v, a.n_k);
  const float* q = I.in(a.q, a.T * a.n_k * a.d_k);
  const float* k = I.in(a.k, a.T * a.n_k * a.d_k);
  const float* v = I.in(a.v, a.T * a.n_v * a.d_v);
  const float* beta = I.in(a.beta, a.T * a.n_v);
  const float* g = I.in(a.g, a.T * a.n_v);
  auto so = I.out(a.state, static_cast<int64_t>(a.n_v) * a.d_k * a.d_v, true);
  auto oo = I.out(a.out, a.T * a.n_v * a.d_v, false);
  const int G = (a.d_k + kGdnRows - 1) / kGdnRows;  // row groups of a block (32 columns each)
  if (G * 32 > 1024) fail("gated_delta: key head dimension %d is above the kernel's %d", a.d_k, 1024 / 32 * kGdnRows);
  const unsigned blocks = static_cast<unsigned>(a.n_v) * static_cast<unsigned>((a.d_v + 31) / 32);
  const size_t smem = (2 * static_cast<size_t>(a.d_k) + 32 * static_cast<size_t>(G)) * 4;
  if (smem > (48 << 10)) CU(cudaFuncSetAttribute(k_gated_delta, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  k_gated_delta<<<blocks, dim3(32, static_cast<unsigned>(G)), smem, I.stream>>>(a.T, a.n_k, a.n_v, a.d_k, a.d_v, q, k, v, beta, g, so.d,
                                                                               oo.d);
  CU_LAUNCHED("k_gated_delta");
  I.copy_back(so);
  I.copy_back(oo);
  if (so.host != nullptr || oo.host != nullptr) CU(cudaStreamSynchronize(I.stream));
}

void gdn_gates(CudaBackend::Impl& I, const float* b, const float* a, const float* a_exp, const float* dt_bias, int64_t T, int n_v,
                            float* beta, float* g) {
  if (T <= 0) return;
  const float* bd = I.in(b, T * n_v);
  const float* ad = I.in(a, T * n_v);
  const float* aed = I.in(a_exp, n_v, false);
  const float* dtd = I.in(dt_bias, n_v, false);
  auto bo = I.out(beta, T * n_v, false);
  auto go = I.out(g, T * n_v, false);
  k_gdn_gates<<<blocks_for(T * n_v), 256, 0, I.stream>>>(bd, ad, aed, dtd, T, n_v, bo.d, go.d);
  CU_LAUNCHED("k_gdn_gates");
  I.finish(bo);
  I.finish(go);
}

}  // namespace spool::ops::cu
