// CudaBackend MoE expert path: the host-grouped path (gathered rows per expert, or every q4 expert
// of a layer in two grouped GEMV launches), the device-routed path over an expert table
// (expert_ffn_routed: routing ids never leave the GPU), moe_combine and the softmax top-k router.
#include "ops/cuda/cuda_internal.h"

namespace spool::ops::cu {
namespace {

// xg[i, :] = x[tok[i], :] for n rows of H.
__global__ void k_gather(const float* x, const int64_t* tok, int64_t n, int64_t H, float* xg) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n * H; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    xg[i] = x[tok[i / H] * H + i % H];
}

// gpt-oss clamped SwiGLU (ops::clamped_swiglu): u [n, 2I] interleaved, bias [2I] or null -> out [n, I].
// y = gelu_pytorch_tanh(g) * u elementwise: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) u
// (HF ACT2FN["gelu_pytorch_tanh"], the Gemma 4 experts' activation). y may alias g.
__global__ void k_gelu_tanh_glu(const float* g, const float* u, int64_t n, float* y) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = g[i];
    y[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))) * u[i];
  }
}

__global__ void k_clamped_swiglu(const float* u, const float* bias, int64_t n, int64_t I, float* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n * I; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / I, j = i % I;
    float g = u[r * 2 * I + 2 * j], v = u[r * 2 * I + 2 * j + 1];
    if (bias != nullptr) {
      g += bias[2 * j];
      v += bias[2 * j + 1];
    }
    g = fminf(g, kGptOssLimit);
    v = fminf(fmaxf(v, -kGptOssLimit), kGptOssLimit);
    out[i] = (v + 1.0f) * (g / (1.0f + expf(-kGptOssAlpha * g)));
  }
}

// y[r, :] += b for n rows of H.
__global__ void k_add_rows(float* y, const float* b, int64_t n, int64_t H) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n * H; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += b[i % H];
}

// out[t, d] = sum_k w[t, k] y[row_of[t K + k], d], k in slot order.
__global__ void k_moe_combine(const float* y, const int64_t* row_of, const float* w, int64_t T, int K, int64_t H, float* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < T * H; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / H, d = i % H;
    float s = 0.0f;
    for (int k = 0; k < K; ++k) s += w[t * K + k] * y[row_of[t * K + k] * H + d];
    out[i] = s;
  }
}

__device__ __forceinline__ void better(float& v, int& i, float v2, int i2) {
  if (v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}

// The n best of v [E] not yet taken, best first, into sel (ties and -inf: the lower index, as
// the host's sorts), marking them taken; every thread of the block calls it (shared v, taken).
__device__ void block_top_n(const float* v, unsigned char* taken, int E, int n, int* sel) {
  __shared__ float wv[32];
  __shared__ int wi[32];
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int s = 0; s < n; ++s) {
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
      if (!taken[e]) better(bv, bi, v[e], e);
    for (int o = 16; o > 0; o >>= 1) better(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    if (lane == 0) {
      wv[wid] = bv;
      wi[wid] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float b = wv[0];
      int i = wi[0];
      for (int w = 1; w < nw; ++w) better(b, i, wv[w], wi[w]);
      sel[s] = i;
      taken[i] = 1;
    }
    __syncthreads();
  }
}

// One block per token: softmax over E logits, the k best (ties: lower id), their probabilities
// (renormalised over the k when asked) and the margin p_k - p_{k+1}. Selection compares logits
// (same order as the probabilities). Dynamic smem: E floats + E bytes.
constexpr int kMaxTopK = kMaxDeviceTopK;
[[maybe_unused]] constexpr int kMaxRoutedPairs = static_cast<int>(CudaBackend::kMaxRoutedPairs);  // (one block builds the job lists)
__global__ void k_route(const float* logits, int E, int k, bool renorm, int* ids, float* weights, float* margins) {
  extern __shared__ float sm[];
  float* l = sm;
  unsigned char* taken = reinterpret_cast<unsigned char*>(sm + E);
  __shared__ int sel[kMaxTopK + 1];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * E;
  float mx = -INFINITY;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    l[e] = row[e];
    taken[e] = 0;
    mx = fmaxf(mx, l[e]);
  }
  mx = block_max(mx);
  float z = 0.0f;
  for (int e = threadIdx.x; e < E; e += blockDim.x) z += expf(l[e] - mx);
  z = block_sum(z);
  const int n_sel = k < E ? k + 1 : k;
  block_top_n(l, taken, E, n_sel, sel);
  if (threadIdx.x == 0) {
    const int64_t t = blockIdx.x;
    float kept = 0.0f;
    for (int s = 0; s < k; ++s) kept += expf(l[sel[s]] - mx) / z;
    for (int s = 0; s < k; ++s) {
      const float p = expf(l[sel[s]] - mx) / z;
      ids[t * k + s] = sel[s];
      weights[t * k + s] = renorm ? p / kept : p;
    }
    if (margins) margins[t] = k < E ? expf(l[sel[k - 1]] - mx) / z - expf(l[sel[k]] - mx) / z : 1.0f;
  }
}

// k_route with one warp per token, for E <= 32 * kRouteWarpJ experts: lane l holds the logits of
// experts l, l + 32, ... in registers, and each of the k (+ 1 for the margin) selections is one
// warp-wide arg-max over the experts not yet taken (shuffles; no barriers, no shared memory).
// The selection (ties and -inf: the lower id), the probabilities and the margin are k_route's;
// only the softmax denominator is summed in another order (each lane's experts, then the warp
// tree). Blocks of kRouteWarpTokens warps, token t = warp index; t >= T: nothing.
constexpr int kRouteWarpJ = 16, kRouteWarpTokens = 4;
__global__ void k_route_warp(const float* logits, int64_t T, int E, int k, bool renorm, int* ids, float* weights, float* margins) {
  const int lane = threadIdx.x & 31;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarpTokens + (threadIdx.x >> 5);
  if (t >= T) return;  // (the whole warp: t is the warp's)
  const float* row = logits + t * E;
  float v[kRouteWarpJ];
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < kRouteWarpJ; ++j) {
    const int e = lane + 32 * j;
    v[j] = e < E ? row[e] : -INFINITY;
    if (e < E) mx = fmaxf(mx, v[j]);
  }
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float z = 0.0f;
#pragma unroll
  for (int j = 0; j < kRouteWarpJ; ++j)
    if (lane + 32 * j < E) z += expf(v[j] - mx);
  for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
  uint32_t taken = 0;  // bit j: expert lane + 32 j is selected
  int sel[kMaxTopK + 1];
  float selv[kMaxTopK + 1];
  const int n_sel = k < E ? k + 1 : k;
  for (int s = 0; s < n_sel; ++s) {
    float bv = -INFINITY;
    int bi = INT_MAX;
#pragma unroll
    for (int j = 0; j < kRouteWarpJ; ++j) {
      const int e = lane + 32 * j;
      if (e < E && ((taken >> j) & 1u) == 0) better(bv, bi, v[j], e);
    }
    for (int o = 16; o > 0; o >>= 1) better(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    sel[s] = bi < E ? bi : 0;  // (no expert left only when every logit is NaN)
    selv[s] = bv;
    if (bi < E && (bi & 31) == lane) taken |= 1u << (bi >> 5);
  }
  if (lane == 0) {
    float kept = 0.0f;
    for (int s = 0; s < k; ++s) kept += expf(selv[s] - mx) / z;
    for (int s = 0; s < k; ++s) {
      const float p = expf(selv[s] - mx) / z;
      ids[t * k + s] = sel[s];
      weights[t * k + s] = renorm ? p / kept : p;
    }
    if (margins) margins[t] = k < E ? expf(selv[k - 1] - mx) / z - expf(selv[k] - mx) / z : 1.0f;
  }
}

// One block per token: DeepSeek-family routing (ops::route_grouped, RouterParams) — scores s
// (sigmoid, or softmax over the E logits), selection scores s' = s + bias, groups ranked by their
// best (or best two summed) s' with the topk_group best kept and the others' s' set to 0 (or
// -inf), the k best s' (ties: lower id; k + 1 for the margin), weights s of those (renormalised
// over the k when asked, sums in double as the host's) times `scaling`. Dynamic smem: 2 E floats +
// E bytes. n_group <= kMaxRouteGroups.
constexpr int kMaxRouteGroups = kMaxDeviceRouteGroups;
__global__ void k_route_grouped(const float* logits, int E, int k, bool sigmoid, const float* bias, int G, int topk_group, bool top2,
                                bool neg_inf, bool renorm, float scaling, int* ids, float* weights, float* margins) {
  extern __shared__ float sm[];
  float* sc = sm;
  float* s2 = sm + E;
  unsigned char* taken = reinterpret_cast<unsigned char*>(sm + 2 * E);
  __shared__ int sel[kMaxTopK + 1];
  __shared__ float gs[kMaxRouteGroups];
  __shared__ unsigned char keep[kMaxRouteGroups];
  __shared__ double zsum;
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * E;
  if (sigmoid) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) sc[e] = 1.0f / (1.0f + expf(-row[e]));
  } else {
    float mx = -INFINITY;
    for (int e = threadIdx.x; e < E; e += blockDim.x) mx = fmaxf(mx, row[e]);
    mx = block_max(mx);
    for (int e = threadIdx.x; e < E; e += blockDim.x) sc[e] = expf(row[e] - mx);
    __syncthreads();
    if (threadIdx.x == 0) {  // (the host's order: one double sum)
      double z = 0.0;
      for (int e = 0; e < E; ++e) z += sc[e];
      zsum = z;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) sc[e] = static_cast<float>(sc[e] / zsum);
  }
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    s2[e] = sc[e] + (bias != nullptr ? bias[e] : 0.0f);
    taken[e] = 0;
  }
  __syncthreads();
  if (G > 1 && topk_group < G && E % G == 0) {
    const int per = E / G;
    for (int g = threadIdx.x; g < G; g += blockDim.x) {
      const float* s = s2 + g * per;
      float a = -INFINITY, b = -INFINITY;
      for (int i = 0; i < per; ++i) {
        if (s[i] > a) {
          b = a;
          a = s[i];
        } else if (s[i] > b) {
          b = s[i];
        }
      }
      gs[g] = top2 && per > 1 ? a + b : a;
      keep[g] = 0;
    }
    __syncthreads();
    if (threadIdx.x == 0)
      for (int j = 0; j < topk_group; ++j) {
        int bi = -1;
        for (int g = 0; g < G; ++g)
          if (!keep[g] && (bi < 0 || gs[g] > gs[bi])) bi = g;  // (ties: the lower group)
        keep[bi] = 1;
      }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
      if (!keep[e / per]) s2[e] = neg_inf ? -INFINITY : 0.0f;
    __syncthreads();
  }
  const int n_sel = margins != nullptr && k < E ? k + 1 : k;
  block_top_n(s2, taken, E, n_sel, sel);
  if (threadIdx.x == 0) {
    const int64_t t = blockIdx.x;
    double z = 0.0;
    for (int s = 0; s < k; ++s) z += sc[sel[s]];
    for (int s = 0; s < k; ++s) {
      ids[t * k + s] = sel[s];
      const float w = renorm ? static_cast<float>(sc[sel[s]] / (z + 1e-20)) : sc[sel[s]];
      weights[t * k + s] = w * scaling;
    }
    if (margins) margins[t] = k < E && isfinite(s2[sel[k]]) ? s2[sel[k - 1]] - s2[sel[k]] : 1.0f;
  }
}

// The job lists of expert_ffn_routed from the routing ids on the device: pair p = t * K + slot runs
// expert ids[p] on token t as its own one-row jobs (gate and up jobs 2p, 2p + 1: token t's row of x,
// rotated in the GEMV's prologue; down job p: SwiGLU of the pair's gate and up rows, rotated).
// Pairs P .. P + S - 1 run the shared expert `sh` on token p - P the same way, its down rows going
// to sy [S, H].
__global__ void k_routed_jobs(const int* ids, const ExpertRef* table, int E, int64_t P, int K, int64_t H, int64_t I, const float* x,
                              float* gate, float* up, float* yd, QGemvJob* jgu, QGemvJob* jd, int64_t* row_of, ExpertRef sh, int64_t S,
                              float* sy) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= P + S) return;
  if (p >= P) {
    const int64_t t = p - P;
    const float* xt = x + t * H;
    jgu[2 * p] = QGemvJob{sh.q[0], sh.s[0], sh.cb[0], xt, gate + p * I, 1, nullptr, nullptr, sh.sg[0]};
    jgu[2 * p + 1] = QGemvJob{sh.q[1], sh.s[1], sh.cb[1], xt, up + p * I, 1, nullptr, nullptr, sh.sg[1]};
    jd[p] = QGemvJob{sh.q[2], sh.s[2], sh.cb[2], gate + p * I, sy + t * H, 1, nullptr, up + p * I, sh.sg[2]};
    return;
  }
  const int e = min(max(ids[p], 0), E - 1);  // (ids come from k_route: always in range)
  const ExpertRef r = table[e];
  const float* xt = x + (p / K) * H;
  jgu[2 * p] = QGemvJob{r.q[0], r.s[0], r.cb[0], xt, gate + p * I, 1, nullptr, nullptr, r.sg[0]};
  jgu[2 * p + 1] = QGemvJob{r.q[1], r.s[1], r.cb[1], xt, up + p * I, 1, nullptr, nullptr, r.sg[1]};
  jd[p] = QGemvJob{r.q[2], r.s[2], r.cb[2], gate + p * I, yd + p * H, 1, nullptr, up + p * I, r.sg[2]};
  row_of[p] = p;
}

// The device pointers of an expert's three q4 parts (the row of an expert table).
ExpertRef expert_ref(const ExpertMats& x) {
  ExpertRef r{};
  const WeightView* w[3] = {&x.gate, &x.up, &x.down};
  for (int j = 0; j < 3; ++j) {
    r.q[j] = w[j]->quant.qweight;
    r.s[j] = w[j]->quant.scales;
    r.cb[j] = w[j]->quant.codebook;
    r.sg[j] = w[j]->quant.signs;
  }
  return r;
}

}  // namespace
}  // namespace spool::ops::cu

namespace spool::ops {

bool CudaBackend::Impl::expert_ffn_grouped(std::span<const ExpertMats> experts, const ExpertGroups& groups, size_t g0, const float* xd,
                                           const std::vector<int64_t>& tok, int64_t H, float* yd) {
  const ExpertMats& e0 = experts[0];
  const int64_t I = e0.gate.rows;
  const int64_t r_begin = groups.first[g0];
  const int per_job = gemv_rows_fit(std::max(H, I));
  const int64_t R = static_cast<int64_t>(tok.size());
  if (per_job < 1 || R == 0) return false;
  for (const ExpertMats& e : experts)
    if (!quant_expert_ok(e, H, I, fmt_of(e0.gate), fmt_of(e0.down), false)) return false;
  // Device scratch for every row: gate and up outputs [R, I] each, and the rows' tokens [R].
  float* gate = arena->get_n<float>(R * I);
  float* up = arena->get_n<float>(R * I);
  int64_t* dtok = arena->get_n<int64_t>(R);
  h2d(dtok, tok.data(), static_cast<size_t>(R) * sizeof(int64_t));
  // Launches over batches of experts: at most kMaxStagedExpertBytes of host experts copied up at once
  // (experts in host memory, e.g. a streamed host tier's, are copied for the call, as mm does, so
  // they take the same kernels, bit for bit, as uploaded ones; the arena reuses their scratch for the
  // next batch, which the stream orders after this one's kernels) and at most 32767 jobs (grid.y).
  constexpr uint64_t kMaxStagedExpertBytes = uint64_t{256} << 20;
  const auto rows_of = [&](size_t j) { return groups.first[g0 + j + 1] - groups.first[g0 + j]; };
  for (size_t j0 = 0; j0 < experts.size();) {
    size_t j1 = j0;
    uint64_t staged_bytes = 0;
    int64_t n_jobs = 0;
    int t_max = 1;
    while (j1 < experts.size()) {
      const ExpertMats& e = experts[j1];
      const uint64_t b = (e.gate.device != Device::kCuda ? weight_bytes(e.gate) : 0) + (e.up.device != Device::kCuda ? weight_bytes(e.up) : 0) +
                         (e.down.device != Device::kCuda ? weight_bytes(e.down) : 0);
      const int64_t jobs = (rows_of(j1) + per_job - 1) / per_job;
      if (j1 > j0 && (staged_bytes + b > kMaxStagedExpertBytes || n_jobs + jobs > 32767)) break;
      staged_bytes += b;
      n_jobs += jobs;
      t_max = static_cast<int>(std::max<int64_t>(t_max, std::min<int64_t>(per_job, rows_of(j1))));
      ++j1;
    }
    if (n_jobs > 0) {
      const Arena::Mark mark = arena->mark();
      // Host tables, one upload: gate|up jobs [2 n_jobs], down jobs [n_jobs].
      const size_t o_jd = round_up(2 * n_jobs * sizeof(QGemvJob), 16), bytes = o_jd + n_jobs * sizeof(QGemvJob);
      std::vector<uint8_t> blob(bytes);
      uint8_t* dblob = arena->get_n<uint8_t>(static_cast<int64_t>(bytes));
      auto* hjgu = reinterpret_cast<QGemvJob*>(blob.data());
      auto* hjd = reinterpret_cast<QGemvJob*>(blob.data() + o_jd);
      int64_t k = 0;
      for (size_t j = j0; j < j1; ++j) {
        ExpertMats e = experts[j];
        if (rows_of(j) == 0) continue;
        if (e.gate.device != Device::kCuda) e.gate = dev_weight(e.gate);
        if (e.up.device != Device::kCuda) e.up = dev_weight(e.up);
        if (e.down.device != Device::kCuda) e.down = dev_weight(e.down);
        validate(e.gate.quant), validate(e.up.quant), validate(e.down.quant);
        const int64_t r_lo = groups.first[g0 + j] - r_begin, r_hi = groups.first[g0 + j + 1] - r_begin;
        for (int64_t r0 = r_lo; r0 < r_hi; r0 += per_job, ++k) {
          const int n = static_cast<int>(std::min<int64_t>(per_job, r_hi - r0));
          hjgu[2 * k] = QGemvJob{e.gate.quant.qweight, e.gate.quant.scales, e.gate.quant.codebook, xd, gate + r0 * I, n, dtok + r0, nullptr,
                              e.gate.quant.signs};
          hjgu[2 * k + 1] = QGemvJob{e.up.quant.qweight, e.up.quant.scales, e.up.quant.codebook, xd, up + r0 * I, n, dtok + r0, nullptr,
                                  e.up.quant.signs};
          hjd[k] = QGemvJob{e.down.quant.qweight, e.down.quant.scales, e.down.quant.codebook, gate + r0 * I, yd + r0 * H, n, nullptr,
                         up + r0 * I, e.down.quant.signs};
        }
      }
      h2d(dblob, blob.data(), bytes);
      grouped_swiglu(reinterpret_cast<const QGemvJob*>(dblob), reinterpret_cast<const QGemvJob*>(dblob + o_jd), n_jobs, t_max, H, I,
                     fmt_of(e0.gate), fmt_of(e0.down));
      arena->release(mark);
    }
    j0 = j1;
  }
  return true;
}

void CudaBackend::Impl::grouped_swiglu(const QGemvJob* jgu, const QGemvJob* jd, int64_t n_jobs, int t_max, int64_t H, int64_t I, QFmt gu, QFmt d) {
  gemv_quant(jgu, QGemvJob{}, 2 * n_jobs, t_max, I, H, gu);
  gemv_quant(jd, QGemvJob{}, n_jobs, t_max, H, I, d);
}

bool CudaBackend::Impl::quant_expert_ok(const ExpertMats& e, int64_t H, int64_t I, QFmt gu, QFmt d, bool need_device) const {
  const auto ok = [&](const WeightView& w, int64_t rows, int64_t cols, QFmt f) {
    return w.type == WType::kQuant && (w.device == Device::kCuda || !need_device) && gemv_quant_type(f.type) && fmt_of(w) == f &&
           w.rows == rows && w.cols == cols && f.group % 32 == 0 &&
           (w.device != Device::kCuda || reinterpret_cast<uintptr_t>(w.quant.qweight) % gemv_quant_align(f.type) == 0);
  };
  return e.gate_bias == nullptr && e.down_bias == nullptr && ok(e.gate, I, H, gu) && ok(e.up, I, H, gu) && ok(e.down, H, I, d) &&
         H % 32 == 0 && I % 32 == 0 && gemv_rows_fit(std::max(H, I)) >= 1;
}

}  // namespace spool::ops

namespace spool::ops::cu {

void expert_ffn(CudaBackend::Impl& I, std::span<const ExpertMats> experts, const ExpertGroups& groups, size_t g0, const float* x,
                             int64_t H, Activation act, float* y) {
  if (experts.empty()) return;
  if (g0 + experts.size() > groups.active.size()) fail("expert_ffn: experts [%zu, %zu) beyond the %zu active", g0, g0 + experts.size(), groups.active.size());
  const int64_t r_begin = groups.first[g0], r_end = groups.first[g0 + experts.size()];
  const float* xd = I.in(x, groups.T * H);
  // Rows of y written here: [r_begin, r_end) (y itself may be larger: other batches).
  auto yo = I.out(y + r_begin * H, (r_end - r_begin) * H, false);
  std::vector<int64_t> tok(static_cast<size_t>(r_end - r_begin));
  for (int64_t r = r_begin; r < r_end; ++r) tok[r - r_begin] = groups.rows[r] / groups.K;
  // (LoRA terms: the per-expert products below, which add them; the grouped launches do not.)
  const bool lora = std::any_of(experts.begin(), experts.end(), [](const ExpertMats& e) {
    return e.gate.lora != nullptr || e.up.lora != nullptr || e.down.lora != nullptr;
  });
  if (!lora && act == Activation::kSwiGLU && I.expert_ffn_grouped(experts, groups, g0, xd, tok, H, yo.d)) {
    I.finish(yo);
    return;
  }
  const int64_t* tokd = I.in(tok.data(), static_cast<int64_t>(tok.size()), false);
  for (size_t j = 0; j < experts.size(); ++j) {
    const ExpertMats& e = experts[j];
    const bool oai = act == Activation::kClampedSwiGLU;  // fused interleaved gate_up [2I, H]
    const int64_t r0 = groups.first[g0 + j], n = groups.first[g0 + j + 1] - r0, Idim = oai ? e.gate.rows / 2 : e.gate.rows;
    if (n == 0) continue;
    const Arena::Mark m = I.arena->mark();
    float* xg = I.arena->get_n<float>(n * H);
    k_gather<<<blocks_for(n * H), 256, 0, I.stream>>>(xd, tokd + (r0 - r_begin), n, H, xg);
    CU_LAUNCHED("k_gather");
    float* gate = I.arena->get_n<float>(n * Idim);
    float* up = I.arena->get_n<float>(n * Idim * (oai ? 2 : 1));
    const int64_t* rt = tok.data() + (r0 - r_begin);  // the rows' tokens: their LoRA scales
    switch (act) {
      case Activation::kSwiGLU:
        I.mm(e.gate, xg, n, gate, rt);
        I.mm(e.up, xg, n, up, rt);
        launch_swiglu(I.stream, gate, up, n * Idim, gate);
        break;
      case Activation::kGeluTanhGLU:  // Gemma 4: gelu_pytorch_tanh(gate) * up
        I.mm(e.gate, xg, n, gate, rt);
        I.mm(e.up, xg, n, up, rt);
        k_gelu_tanh_glu<<<blocks_for(n * Idim), 256, 0, I.stream>>>(gate, up, n * Idim, gate);
        CU_LAUNCHED("k_gelu_tanh_glu");
        break;
      case Activation::kClampedSwiGLU:
        I.mm(e.gate, xg, n, up, rt);  // [n, 2I]
        k_clamped_swiglu<<<blocks_for(n * Idim), 256, 0, I.stream>>>(up, e.gate_bias, n, Idim, gate);
        CU_LAUNCHED("k_clamped_swiglu");
        break;
    }
    float* yd = yo.d + (r0 - r_begin) * H;
    I.mm(e.down, gate, n, yd, rt);
    if (e.down_bias != nullptr) {
      k_add_rows<<<blocks_for(n * H), 256, 0, I.stream>>>(yd, e.down_bias, n, H);
      CU_LAUNCHED("k_add_rows");
    }
    I.arena->release(m);
  }
  I.finish(yo);
}

void moe_combine(CudaBackend::Impl& I, const float* y, const ExpertGroups& groups, const float* weights, int64_t H, float* out) {
  const int64_t T = groups.T;
  const int K = groups.K;
  if (T == 0) return;
  const float* yd = I.in(y, T * K * H);
  const float* wd = I.in(weights, T * K);
  const int64_t* rod = I.in(groups.row_of.data(), T * K, false);
  auto oo = I.out(out, T * H, false);
  k_moe_combine<<<blocks_for(T * H), 256, 0, I.stream>>>(yd, rod, wd, T, K, H, oo.d);
  CU_LAUNCHED("k_moe_combine");
  I.finish(oo);
}

const void* make_expert_table(CudaBackend::Impl& I, std::span<const ExpertMats> experts) {
  if (experts.empty()) return nullptr;
  const ExpertMats& e0 = experts[0];
  const int64_t H = e0.gate.cols, Id = e0.gate.rows;
  const QFmt gu = fmt_of(e0.gate), dn = fmt_of(e0.down);
  std::vector<ExpertRef> h(experts.size());
  for (size_t e = 0; e < experts.size(); ++e) {
    const ExpertMats& x = experts[e];
    if (!I.quant_expert_ok(x, H, Id, gu, dn)) return nullptr;  // not all on the grouped path: the caller groups on the host
    validate(x.gate.quant), validate(x.up.quant), validate(x.down.quant);
    h[e] = expert_ref(x);
  }
  auto* d = static_cast<ExpertRef*>(dev_alloc(h.size() * sizeof(ExpertRef)));
  if (d == nullptr) fail("cuda: out of device memory for an expert table of %zu experts", h.size());
  I.expert_tables.push_back(d);
  dev_copy(d, h.data(), h.size() * sizeof(ExpertRef));
  I.table_meta[d] = CudaBackend::Impl::TableMeta{static_cast<int>(experts.size()), gu, dn, H, Id};
  return d;
}

bool routed_takes_shared(const CudaBackend::Impl& I, const void* table, const ExpertMats& shared, int64_t T) {
  const auto it = I.table_meta.find(table);
  if (it == I.table_meta.end()) return false;
  const CudaBackend::Impl::TableMeta& tm = it->second;
  // Up to kMaxGemvT tokens: then matmul_multi / matmul run the shared expert as GEMVs too (one-row
  // jobs give the bits of those), and a shape, type and groups the table's launches take.
  // A shared expert with LoRA terms runs as matmuls (Impl::mm adds them; the table's launches do not).
  if (shared.gate.lora != nullptr || shared.up.lora != nullptr || shared.down.lora != nullptr) return false;
  return T >= 1 && T <= kMaxGemvT && I.quant_expert_ok(shared, tm.H, tm.I, tm.gu, tm.d);
}

void expert_ffn_routed(CudaBackend::Impl& I, const void* table, const float* x, int64_t T, int64_t H, const int* ids, const float* weights, int K,
                                    float* out, const ExpertMats* shared, float* shared_out) {
  const auto it = I.table_meta.find(table);
  if (it == I.table_meta.end()) fail("expert_ffn_routed: not an expert table of this backend");
  const CudaBackend::Impl::TableMeta& tm = it->second;
  const int64_t P = T * K, Id = tm.I;
  if (T <= 0) return;
  if (K < 1 || P > kMaxRoutedPairs) fail("expert_ffn_routed: %lld tokens x top-%d exceed the %d pairs of the routed path", (long long)T, K, kMaxRoutedPairs);
  if (H != tm.H) fail("expert_ffn_routed: hidden size %lld, the table's experts take %lld", (long long)H, (long long)tm.H);
  if (!is_device_ptr(ids) || !is_device_ptr(weights)) fail("expert_ffn_routed: ids and weights must be in device memory");
  if (shared != nullptr && (shared_out == nullptr || !routed_takes_shared(I, table, *shared, T)))
    fail("expert_ffn_routed: a shared expert this path does not take (see routed_takes_shared), or no output for it");
  if (shared != nullptr) validate(shared->gate.quant), validate(shared->up.quant), validate(shared->down.quant);
  const int64_t S = shared != nullptr ? T : 0;  // the shared expert's pairs, after the routed ones
  const float* xd = I.in(x, T * H);
  auto oo = I.out(out, T * H, false);
  auto so = I.out(shared_out, S * H, false);
  float* gate = I.arena->get_n<float>((P + S) * Id);
  float* up = I.arena->get_n<float>((P + S) * Id);
  float* yd = I.arena->get_n<float>(P * H);
  QGemvJob* jgu = I.arena->get_n<QGemvJob>(2 * (P + S));
  QGemvJob* jd = I.arena->get_n<QGemvJob>(P + S);
  int64_t* row_of = I.arena->get_n<int64_t>(P);
  const ExpertRef sh = shared != nullptr ? expert_ref(*shared) : ExpertRef{};
  constexpr int kJobThreads = 128;
  k_routed_jobs<<<static_cast<unsigned>((P + S + kJobThreads - 1) / kJobThreads), kJobThreads, 0, I.stream>>>(
      ids, static_cast<const ExpertRef*>(table), tm.E, P, K, H, Id, xd, gate, up, yd, jgu, jd, row_of, sh, S, so.d);
  CU_LAUNCHED("k_routed_jobs");
  I.grouped_swiglu(jgu, jd, P + S, 1, H, Id, tm.gu, tm.d);
  k_moe_combine<<<blocks_for(T * H), 256, 0, I.stream>>>(yd, row_of, weights, T, K, H, oo.d);
  CU_LAUNCHED("k_moe_combine");
  I.copy_back(so);
  I.copy_back(oo);
  if (so.host != nullptr || oo.host != nullptr) CU(cudaStreamSynchronize(I.stream));
}

void route_softmax_top_k(CudaBackend::Impl& I, float* logits, int64_t T, int E, int k, bool renormalize, int* ids, float* weights,
                                      float* margins) {
  if (T == 0) return;
  if (k < 1 || k > E || k > kMaxTopK) fail("routing: top-k %d must be in 1..min(%d, %d)", k, E, kMaxTopK);
  const float* ld = I.in(logits, T * E);
  auto io = I.out(ids, T * k, false, false);
  auto wo = I.out(weights, T * k, false);
  auto mo = I.out(margins, T, false);
  if (E <= 32 * kRouteWarpJ) {  // a warp per token (the usual 64 .. 512 experts)
    k_route_warp<<<static_cast<unsigned>((T + kRouteWarpTokens - 1) / kRouteWarpTokens), 32 * kRouteWarpTokens, 0, I.stream>>>(
        ld, T, E, k, renormalize, io.d, wo.d, mo.d);
    CU_LAUNCHED("k_route_warp");
  } else {
    const size_t smem = static_cast<size_t>(E) * (sizeof(float) + 1);
    if (smem > static_cast<size_t>(I.smem_optin)) fail("routing: %d experts need more shared memory than the device has", E);
    if (smem > (48 << 10)) CU(cudaFuncSetAttribute(k_route, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    k_route<<<static_cast<unsigned>(T), 256, smem, I.stream>>>(ld, E, k, renormalize, io.d, wo.d, mo.d);
    CU_LAUNCHED("k_route");
  }
  I.copy_back(io);
  I.copy_back(wo);
  I.copy_back(mo);
  // The host reads host outputs right after (group_by_expert): one wait for all three. Outputs in
  // device memory (expert_ffn_routed's ids) need no wait.
  if (io.host != nullptr || wo.host != nullptr || mo.host != nullptr) CU(cudaStreamSynchronize(I.stream));
}

void route_grouped_top_k(CudaBackend::Impl& I, const float* logits, int64_t T, int E, int k, const RouterParams& r, int* ids, float* weights,
                         float* margins) {
  if (T == 0) return;
  if (k < 1 || k > E) fail("routing: top-k %d must be in 1..%d", k, E);
  const int G = std::max(1, r.n_group);
  const float* ld = I.in(logits, T * E);
  const float* bd = r.bias != nullptr ? I.in(r.bias, E, false) : nullptr;  // a parameter vector: host or uploaded
  auto io = I.out(ids, T * k, false, false);
  auto wo = I.out(weights, T * k, false);
  auto mo = I.out(margins, T, false);
  const size_t smem = static_cast<size_t>(E) * (2 * sizeof(float) + 1);
  if (smem > static_cast<size_t>(I.smem_optin)) fail("routing: %d experts need more shared memory than the device has", E);
  if (smem > (48 << 10)) CU(cudaFuncSetAttribute(k_route_grouped, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  k_route_grouped<<<static_cast<unsigned>(T), 256, smem, I.stream>>>(ld, E, k, r.sigmoid, bd, G, r.topk_group, r.group_top2_sum, r.mask_neg_inf,
                                                                    r.renormalize, r.scaling, io.d, wo.d, mo.d);
  CU_LAUNCHED("k_route_grouped");
  I.copy_back(io);
  I.copy_back(wo);
  I.copy_back(mo);
  if (io.host != nullptr || wo.host != nullptr || mo.host != nullptr) CU(cudaStreamSynchronize(I.stream));
}

void gelu_tanh_glu(CudaBackend::Impl& I, const float* gate, const float* up, int64_t n, float* out) {
  if (n <= 0) return;
  const float* ud = I.in(up, n);
  auto oo = I.out(out, n, out == gate);  // (out may alias gate)
  const float* gd = out == gate ? oo.d : I.in(gate, n);
  k_gelu_tanh_glu<<<blocks_for(n), 256, 0, I.stream>>>(gd, ud, n, oo.d);
  CU_LAUNCHED("k_gelu_tanh_glu");
  I.finish(oo);
}

}  // namespace spool::ops::cu
