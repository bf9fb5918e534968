// CudaBackend attention: the device mirror of each KV cache (the host cache's layout and element
// formats; kv_append writes new rows there and defers the host copy), causal GQA attention (a
// score row per query in scratch) and rotary embeddings.
#include "ops/cuda/cuda_internal.h"

namespace spool::ops::cu {
namespace {

// KV cache device mirror (layouts of ops::KvCache).
struct KvDev {
  int type;  // 0 f32, 1 f16, 2 i8
  int hd, groups, gd;
  int64_t cap;
  const void* k;
  const void* v;
  const float* ks;
  const float* vs;
};

__device__ __forceinline__ float kv_key(const KvDev& kv, int kvh, int d, int64_t p) {
  const int64_t i = (static_cast<int64_t>(kvh) * kv.hd + d) * kv.cap + p;
  if (kv.type == 0) return static_cast<const float*>(kv.k)[i];
  if (kv.type == 1) return __half2float(__ushort_as_half(static_cast<const uint16_t*>(kv.k)[i]));
  return static_cast<float>(static_cast<const int8_t*>(kv.k)[i]) * kv.ks[(static_cast<int64_t>(kvh) * kv.groups + d / kv.gd) * kv.cap + p];
}
__device__ __forceinline__ float kv_value(const KvDev& kv, int kvh, int64_t p, int d) {
  const int64_t row = static_cast<int64_t>(kvh) * kv.cap + p;
  const int64_t i = row * kv.hd + d;
  if (kv.type == 0) return static_cast<const float*>(kv.v)[i];
  if (kv.type == 1) return __half2float(__ushort_as_half(static_cast<const uint16_t*>(kv.v)[i]));
  return static_cast<float>(static_cast<const int8_t*>(kv.v)[i]) * kv.vs[row * kv.groups + d / kv.gd];
}

// Writes T positions (rows row0 .. row0 + T - 1) of k, v [T, n_kv * hd] into a KV mirror with the
// host cache's own element formats (ops::KvCache::write: f32; f16 by f32_to_f16; int8 with a
// scale of max|x| / 127 per group of gd dims and lrint(clamp(x / scale, +-127))), so a later
// download gives the host the bytes KvCache::write would have stored. One thread per (t, head, group).
__global__ void k_kv_write(KvDev kv, void* kd, void* vd, float* ksd, float* vsd, const float* k, const float* v, int64_t T,
                           int n_kv, int64_t row0) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int G = kv.groups, gd = kv.gd, hd = kv.hd;
  if (i >= T * n_kv * G) return;
  const int g = static_cast<int>(i % G), h = static_cast<int>((i / G) % n_kv);
  const int64_t t = i / (static_cast<int64_t>(G) * n_kv), row = row0 + t;
  const float* kh = k + (t * n_kv + h) * hd + g * gd;
  const float* vh = v != nullptr ? v + (t * n_kv + h) * hd + g * gd : nullptr;
  const int64_t vrow = (static_cast<int64_t>(h) * kv.cap + row) * hd + g * gd;
  const int64_t krow0 = (static_cast<int64_t>(h) * hd + g * gd) * kv.cap + row;  // key element d at krow0 + d * cap
  if (kv.type == 0) {
    for (int d = 0; d < gd; ++d) static_cast<float*>(kd)[krow0 + d * kv.cap] = kh[d];
    if (vh != nullptr)
      for (int d = 0; d < gd; ++d) static_cast<float*>(vd)[vrow + d] = vh[d];
  } else if (kv.type == 1) {
    for (int d = 0; d < gd; ++d) static_cast<uint16_t*>(kd)[krow0 + d * kv.cap] = f32_to_f16(kh[d]);
    if (vh != nullptr)
      for (int d = 0; d < gd; ++d) static_cast<uint16_t*>(vd)[vrow + d] = f32_to_f16(vh[d]);
  } else {
    const auto quant = [gd](const float* x, int8_t* out, int64_t stride) {
      float amax = 0.0f;
      for (int d = 0; d < gd; ++d) amax = fmaxf(amax, fabsf(x[d]));
      const float scale = amax / 127.0f;
      const float inv = scale > 0 ? 1.0f / scale : 0.0f;
      for (int d = 0; d < gd; ++d) out[d * stride] = static_cast<int8_t>(__float2int_rn(fminf(fmaxf(__fmul_rn(x[d], inv), -127.0f), 127.0f)));
      return scale;
    };
    ksd[(static_cast<int64_t>(h) * G + g) * kv.cap + row] = quant(kh, static_cast<int8_t*>(kd) + krow0, kv.cap);
    if (vh != nullptr) vsd[(static_cast<int64_t>(h) * kv.cap + row) * G + g] = quant(vh, static_cast<int8_t*>(vd) + vrow, 1);
  }
}

// The unnormalised softmax of one query row, by the whole block: s[p] = exp(scale q . key(row0 + p)
// - m) for p < n (q in shared memory, hd dims; key rows of KV head kvh), m the maximum of the
// scores and `sink` (-INFINITY: none; m into *max_out when given). Returns sum_p s[p] + exp(sink -
// m), the denominator; its last __syncthreads orders the writes of s before any thread reads them.
__device__ float block_softmax_scores(const float* qs, int hd, const KvDev& kv, int kvh, int64_t row0, int64_t n, float scale, float sink,
                                      float* s, float* max_out = nullptr) {
  float mx = sink;
  for (int64_t p = threadIdx.x; p < n; p += blockDim.x) {
    float d = 0.0f;
#pragma unroll 8
    for (int i = 0; i < hd; ++i) d += qs[i] * kv_key(kv, kvh, i, row0 + p);  // (unrolled: 8 loads in flight, same sum order)
    d *= scale;
    s[p] = d;
    mx = fmaxf(mx, d);
  }
  mx = block_max(mx);
  float z = 0.0f;
  for (int64_t p = threadIdx.x; p < n; p += blockDim.x) {
    const float e = expf(s[p] - mx);
    s[p] = e;
    z += e;
  }
  z = block_sum(z);
  if (max_out != nullptr) *max_out = mx;
  return sink == -INFINITY ? z : z + expf(sink - mx);
}

// Keys per block of split attention (flash-decoding): a query row seeing n keys is split into
// attn_splits(n) = min(kMaxAttnSplits, ceil(n / kAttnSplitKeys)) runs of ceil(n / splits) keys, each
// a block; a function of n alone, so a row's result does not depend on the batch (T) it runs in.
constexpr int kAttnSplitKeys = 64;
constexpr int kMaxAttnSplits = 64;
__host__ __device__ __forceinline__ int attn_splits(int64_t n) {
  const int64_t s = (n + kAttnSplitKeys - 1) / kAttnSplitKeys;
  return static_cast<int>(s < 1 ? 1 : s > kMaxAttnSplits ? kMaxAttnSplits : s);
}

// One block per query row (t, h) of a tile starting at token t0 and split blockIdx.y: scores into
// the row's scratch (its own slice of it), softmax, then out = P V. Query position pos0 + t sees the
// keys at positions [lo, pos0 + t] with lo = max(0, pos0 + t + 1 - window) (window <= 0: lo = 0),
// read at cache row position - base (a windowed cache holds only its last rows). sinks (device
// [n_heads] or null): head h's learned logit joins the softmax's max and denominator and has no
// value (HF GptOssAttention). A row of one split writes out directly; with several, split s writes
// its maximum, denominator and unnormalised P V to part [rows, ps, hd + 2] (ps >= its splits) and
// k_attention_merge combines them. Dynamic smem: (blockDim.x / 32) * head_dim floats (the query,
// then the warps' partial P V sums); head_dim <= kMaxAttnHd.
constexpr int kMaxAttnHd = 512;
constexpr int kAttnThreads = 128;
__global__ void k_attention(const float* q, int n_heads, int group, KvDev kv, int64_t pos0, int64_t t0, float scale, int64_t window,
                            int64_t base, const float* sinks, float* scores, int64_t ld_scores, float* part, int ps, float* out) {
  extern __shared__ float qs[];
  const int64_t qi = blockIdx.x;
  const int64_t t = t0 + qi / n_heads;
  const int h = static_cast<int>(qi % n_heads), kvh = h / group, hd = kv.hd;
  const int64_t end = pos0 + t + 1;
  const int64_t lo = window > 0 ? max(int64_t{0}, end - window) : 0;
  const int64_t n_all = end - lo;  // keys seen: positions lo .. end - 1, scores s[0 .. n_all)
  const int S = attn_splits(n_all), split = static_cast<int>(blockIdx.y);
  if (split >= S) return;
  const int64_t chunk = (n_all + S - 1) / S, p0 = split * chunk, n = max(int64_t{0}, min(n_all, p0 + chunk) - p0);
  const int64_t row0 = lo - base + p0;
  const float* qr = q + (t * n_heads + h) * hd;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = qr[i];
  __syncthreads();
  float* s = scores + qi * ld_scores + p0;
  const float sink = sinks != nullptr && S == 1 ? sinks[h] : -INFINITY;  // (several splits: the merge takes the sink)
  float mx = -INFINITY;
  const float z = n > 0 ? block_softmax_scores(qs, hd, kv, kvh, row0, n, scale, sink, s, &mx) : 0.0f;
  // out = P V: warp w sums positions w, w + nw, ... for dims lane, lane + 32, ... (coalesced rows of
  // V), then the warps' sums meet in shared memory (qs is free again), added in warp order.
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float acc[kMaxAttnHd / 32];
#pragma unroll
  for (int m = 0; m < kMaxAttnHd / 32; ++m) acc[m] = 0.0f;
  for (int64_t p = wid; p < n; p += nw) {
    const float sp = s[p];
#pragma unroll
    for (int m = 0; m < kMaxAttnHd / 32; ++m)
      if (lane + 32 * m < hd) acc[m] += sp * kv_value(kv, kvh, row0 + p, lane + 32 * m);
  }
  __syncthreads();  // (every thread is done with qs)
  float* wpart = qs;  // [nw][hd] (dynamic smem holds nw * hd floats)
#pragma unroll
  for (int m = 0; m < kMaxAttnHd / 32; ++m)
    if (lane + 32 * m < hd) wpart[wid * hd + lane + 32 * m] = acc[m];
  __syncthreads();
  if (S == 1) {
    const float inv = 1.0f / z;
    float* o = out + (t * n_heads + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
      float a = 0.0f;
      for (int w = 0; w < nw; ++w) a += wpart[w * hd + d];
      o[d] = a * inv;
    }
    return;
  }
  float* pp = part + (qi * ps + split) * (hd + 2);
  if (threadIdx.x == 0) {
    pp[0] = mx;
    pp[1] = z;
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float a = 0.0f;
    for (int w = 0; w < nw; ++w) a += wpart[w * hd + d];
    pp[2 + d] = a;
  }
}

// The splits of k_attention's rows seeing more than kAttnSplitKeys keys, one block per row:
// M = max(m_s, sink), out[d] = sum_s e^(m_s - M) acc_s[d] / (sum_s e^(m_s - M) z_s + e^(sink - M)),
// splits in order. Rows of one split return (k_attention wrote them).
__global__ void k_attention_merge(int n_heads, int64_t pos0, int64_t t0, int64_t window, int hd, const float* sinks, const float* part,
                                  int ps, float* out) {
  const int64_t qi = blockIdx.x;
  const int64_t t = t0 + qi / n_heads;
  const int h = static_cast<int>(qi % n_heads);
  const int64_t end = pos0 + t + 1;
  const int64_t lo = window > 0 ? max(int64_t{0}, end - window) : 0;
  const int S = attn_splits(end - lo);
  if (S == 1) return;
  const float* pp = part + qi * ps * (hd + 2);
  const float sink = sinks != nullptr ? sinks[h] : -INFINITY;
  float M = sink;
  for (int s = 0; s < S; ++s) M = fmaxf(M, pp[s * (hd + 2)]);
  float z = sink == -INFINITY ? 0.0f : expf(sink - M);
  for (int s = 0; s < S; ++s) z += expf(pp[s * (hd + 2)] - M) * pp[s * (hd + 2) + 1];
  const float inv = 1.0f / z;
  float* o = out + (t * n_heads + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float a = 0.0f;
    for (int s = 0; s < S; ++s) a += expf(pp[s * (hd + 2)] - M) * pp[s * (hd + 2) + 2 + d];
    o[d] = a * inv;
  }
}

// Weight-absorbed MLA attention (ops/mla.h) over a keys-only latent cache of one head of D dims:
// one block per query row (t, h) of a tile from token t0 and split blockIdx.y of its keys (the
// splits of k_attention: attn_splits(n) runs of ceil(n / splits) keys, a function of the row's key
// count n = pos0 + t + 1 alone). Scores softmax(scale q . key[p]) over the split's keys into the
// row's scratch, then out[d] = sum_p P[p] key[p][d] for d < dv (the value is the key's first dv
// dims): warp w takes dims w, w + nw, ..., its lanes the split's keys (the cache stores a key's dim d
// for consecutive positions together: coalesced). A row of one split writes out; with several,
// split s writes its maximum, denominator and unnormalised P V to part [rows, ps, dv + 2] and
// k_attention_merge combines them. Dynamic smem: D floats (the query).
constexpr int kMaxMlaDim = 8192;  // k_mla_attention's query in shared memory: at most 32 KiB
__global__ void k_mla_attention(const float* q, int n_heads, KvDev kv, int64_t pos0, int64_t t0, float scale, int dv, float* scores,
                                int64_t ld_scores, float* part, int ps, float* out) {
  extern __shared__ float qs[];
  const int64_t qi = blockIdx.x;
  const int64_t t = t0 + qi / n_heads;
  const int h = static_cast<int>(qi % n_heads), D = kv.hd;
  const int64_t n_all = pos0 + t + 1;
  const int S = attn_splits(n_all), split = static_cast<int>(blockIdx.y);
  if (split >= S) return;
  const int64_t chunk = (n_all + S - 1) / S, p0 = split * chunk, n = max(int64_t{0}, min(n_all, p0 + chunk) - p0);
  const float* qr = q + (t * n_heads + h) * D;
  for (int i = threadIdx.x; i < D; i += blockDim.x) qs[i] = qr[i];
  __syncthreads();
  float* s = scores + qi * ld_scores + p0;
  float mx = -INFINITY;
  const float z = n > 0 ? block_softmax_scores(qs, D, kv, 0, p0, n, scale, -INFINITY, s, &mx) : 0.0f;
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float* o = S == 1 ? out + (t * n_heads + h) * static_cast<int64_t>(dv) : part + (qi * ps + split) * (dv + 2) + 2;
  const float inv = S == 1 ? 1.0f / z : 1.0f;
  for (int d = wid; d < dv; d += nw) {
    float a = 0.0f;
    for (int64_t p = lane; p < n; p += 32) a += s[p] * kv_key(kv, 0, d, p0 + p);
    a = warp_sum(a);
    if (lane == 0) o[d] = a * inv;
  }
  if (S > 1 && threadIdx.x == 0) {
    o[-2] = mx;
    o[-1] = z;
  }
}

// NeoX rotate_half on the first 2*half dims of each head; angle f32(pos) * inv_freq in f32 (HF),
// cos / sin in double.
__global__ void k_rope(float* x, int64_t T, int64_t stride, int n_heads, int head_dim, int half, const float* inv_freq,
                       float scaling, int64_t pos0) {
  const int64_t n = T * n_heads * half;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(i % half);
    const int h = static_cast<int>((i / half) % n_heads);
    const int64_t t = i / (static_cast<int64_t>(half) * n_heads);
    float* v = x + t * stride + static_cast<int64_t>(h) * head_dim;
    const float ang = static_cast<float>(pos0 + t) * inv_freq[j];
    double sn, cs;
    sincos(static_cast<double>(ang), &sn, &cs);
    cs *= scaling;
    sn *= scaling;
    const double a = v[j], b = v[j + half];
    v[j] = static_cast<float>(a * cs - b * sn);
    v[j + half] = static_cast<float>(b * cs + a * sn);
  }
}

// Pairs mode (Rope::pairs): one block per (t, head) row; the rotary dims arrive as adjacent pairs
// and leave de-interleaved and rotated ([even | odd], then k_rope's arithmetic): the pairs go to
// shared memory first (dynamic smem: 2 * half floats), since a row's outputs overwrite its inputs.
__global__ void k_rope_pairs(float* x, int64_t stride, int n_heads, int head_dim, int half, const float* inv_freq, float scaling,
                             int64_t pos0) {
  extern __shared__ float pr[];
  const int64_t t = blockIdx.x / n_heads;
  const int h = static_cast<int>(blockIdx.x % n_heads);
  float* v = x + t * stride + static_cast<int64_t>(h) * head_dim;
  for (int i = threadIdx.x; i < 2 * half; i += blockDim.x) pr[i] = v[i];
  __syncthreads();
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    const float ang = static_cast<float>(pos0 + t) * inv_freq[j];
    double sn, cs;
    sincos(static_cast<double>(ang), &sn, &cs);
    cs *= scaling;
    sn *= scaling;
    const double a = pr[2 * j], b = pr[2 * j + 1];
    v[j] = static_cast<float>(a * cs - b * sn);
    v[j + half] = static_cast<float>(b * cs + a * sn);
  }
}

// The kernels' view of a mirror of `c`.
KvDev kv_dev(const KvCache& c, const KvMirror& m) {
  KvDev d{};
  d.type = c.type() == KvType::kF32 ? 0 : c.type() == KvType::kF16 ? 1 : 2;
  d.hd = c.head_dim();
  d.groups = c.groups();
  d.gd = c.group_dim();
  d.cap = c.capacity();
  d.k = m.k.get();
  d.v = m.v.get();
  d.ks = static_cast<const float*>(m.ks.get());
  d.vs = static_cast<const float*>(m.vs.get());
  return d;
}

}  // namespace
}  // namespace spool::ops::cu

namespace spool::ops {

KvMirror& CudaBackend::Impl::mirror(const KvCache& c, bool refresh) {
  KvMirror& m = kv[&c];
  const bool same_shape = m.cap == c.capacity() && m.type == c.type() && m.n_kv == c.n_kv_heads() && m.hd == c.head_dim();
  // Deferred rows (kv_append) live in this mirror, which they keep current (m.gen): they reach host
  // storage only when the mirror is about to be rebuilt or re-uploaded from it, never on a plain read.
  if (!same_shape || (refresh && m.gen != c.generation())) c.settle();
  if (!same_shape) {
    const size_t es = static_cast<size_t>(kv_elem(c.type()));
    const size_t kvn = static_cast<size_t>(c.n_kv_heads()) * c.head_dim() * static_cast<size_t>(c.capacity());
    m.k = CudaBuffer(std::max<size_t>(kvn * es, 1));
    m.v = CudaBuffer(std::max<size_t>(kvn * es, 1));
    const size_t sn = c.type() == KvType::kI8 ? static_cast<size_t>(c.n_kv_heads()) * c.groups() * c.capacity() : 0;
    m.ks = CudaBuffer(std::max<size_t>(sn * 4, 1));
    m.vs = CudaBuffer(std::max<size_t>(sn * 4, 1));
    m.cap = c.capacity();
    m.type = c.type();
    m.n_kv = c.n_kv_heads();
    m.hd = c.head_dim();
    m.groups = c.groups();
    m.gen = 0;
  }
  if (refresh && m.gen != c.generation()) {
    upload_rows(c, m, 0, c.capacity());
    m.gen = c.generation();
  }
  return m;
}

void CudaBackend::Impl::upload_rows(const KvCache& c, KvMirror& m, int64_t p0, int64_t n) {
  if (n <= 0 || c.capacity() == 0) return;
  const size_t es = static_cast<size_t>(kv_elem(c.type())), cap = static_cast<size_t>(c.capacity());
  const size_t hd = static_cast<size_t>(c.head_dim()), nkv = static_cast<size_t>(c.n_kv_heads()), g = static_cast<size_t>(c.groups());
  const size_t up0 = static_cast<size_t>(p0), un = static_cast<size_t>(n);
  // keys: nkv * hd rows of cap positions; values: nkv rows of cap * hd.
  CU(cudaMemcpy2DAsync(static_cast<char*>(m.k.get()) + up0 * es, cap * es, c.k_data() + up0 * es, cap * es, un * es, nkv * hd,
                       cudaMemcpyHostToDevice, stream));
  if (!c.keys_only())  // (a keys-only cache, e.g. MLA's latent, has no value rows)
    CU(cudaMemcpy2DAsync(static_cast<char*>(m.v.get()) + up0 * hd * es, cap * hd * es, c.v_data() + up0 * hd * es, cap * hd * es,
                         un * hd * es, nkv, cudaMemcpyHostToDevice, stream));
  if (c.type() == KvType::kI8) {
    CU(cudaMemcpy2DAsync(static_cast<float*>(m.ks.get()) + up0, cap * 4, c.k_scales() + up0, cap * 4, un * 4, nkv * g,
                         cudaMemcpyHostToDevice, stream));
    if (!c.keys_only())
      CU(cudaMemcpy2DAsync(static_cast<float*>(m.vs.get()) + up0 * g, cap * g * 4, c.v_scales() + up0 * g, cap * g * 4, un * g * 4,
                           nkv, cudaMemcpyHostToDevice, stream));
  }
  // The host vectors may change right after we return (the next write): wait for the copies.
  CU(cudaStreamSynchronize(stream));
}

void CudaBackend::Impl::download_rows(KvCache& c, int64_t lo, int64_t hi) {
  auto it = kv.find(&c);
  if (it == kv.end() || it->second.cap != c.capacity()) fail("KV cache: the CUDA mirror of deferred rows is gone");
  const KvMirror& m = it->second;
  const size_t es = static_cast<size_t>(kv_elem(c.type())), cap = static_cast<size_t>(c.capacity());
  const size_t hd = static_cast<size_t>(c.head_dim()), nkv = static_cast<size_t>(c.n_kv_heads()), g = static_cast<size_t>(c.groups());
  const size_t p0 = static_cast<size_t>(lo), un = static_cast<size_t>(hi - lo);
  CU(cudaMemcpy2DAsync(c.k_storage() + p0 * es, cap * es, static_cast<const char*>(m.k.get()) + p0 * es, cap * es, un * es, nkv * hd,
                       cudaMemcpyDeviceToHost, stream));
  if (!c.keys_only())
    CU(cudaMemcpy2DAsync(c.v_storage() + p0 * hd * es, cap * hd * es, static_cast<const char*>(m.v.get()) + p0 * hd * es, cap * hd * es,
                         un * hd * es, nkv, cudaMemcpyDeviceToHost, stream));
  if (c.type() == KvType::kI8) {
    CU(cudaMemcpy2DAsync(c.k_scale_storage() + p0, cap * 4, static_cast<const float*>(m.ks.get()) + p0, cap * 4, un * 4, nkv * g,
                         cudaMemcpyDeviceToHost, stream));
    if (!c.keys_only())
      CU(cudaMemcpy2DAsync(c.v_scale_storage() + p0 * g, cap * g * 4, static_cast<const float*>(m.vs.get()) + p0 * g, cap * g * 4,
                           un * g * 4, nkv, cudaMemcpyDeviceToHost, stream));
  }
  CU(cudaStreamSynchronize(stream));
}

}  // namespace spool::ops

namespace spool::ops::cu {

// ---- Attention (the ops) ------------------------------------------------------------------------------------

// The new rows are written into the cache's device mirror (k_kv_write: the host cache's element
// formats) and left there: the host rows are marked deferred (KvCache::defer_rows), and a host
// reader of the cache (a snapshot, serialization, a CPU kernel) downloads them first. A decode
// step thus makes no host round trip per attention layer.
void kv_append(CudaBackend::Impl& I, KvCache& cache, int64_t pos0, int64_t T, const float* k, const float* v) {
  if (T <= 0) return;
  // Rows are positions - base() (a windowed cache, ops/kv_cache.h, holds only its last rows).
  if (pos0 < cache.base() || pos0 + T - cache.base() > cache.capacity())
    fail("kv_append: positions [%lld, %lld) do not fit the cache's rows [%lld, %lld)", (long long)pos0, (long long)(pos0 + T),
         (long long)cache.base(), (long long)(cache.base() + cache.capacity()));
  const int64_t w = static_cast<int64_t>(cache.n_kv_heads()) * cache.head_dim();
  const float* kd = I.in(k, T * w);
  const float* vd = cache.keys_only() ? nullptr : I.in(v, T * w);
  KvMirror& m = I.mirror(cache, true);  // current with the host rows (uploads them when they changed)
  const KvDev d = kv_dev(cache, m);
  const int64_t row0 = pos0 - cache.base(), n = T * cache.n_kv_heads() * cache.groups();
  k_kv_write<<<blocks_for(n), 256, 0, I.stream>>>(d, m.k.get(), m.v.get(), static_cast<float*>(m.ks.get()), static_cast<float*>(m.vs.get()), kd,
                                                  vd, T, cache.n_kv_heads(), row0);
  CU_LAUNCHED("k_kv_write");
  std::shared_ptr<bool> alive = I.alive;
  cache.defer_rows(row0, row0 + T, [&I, alive](KvCache& c, int64_t lo, int64_t hi) {
    if (!*alive) fail("KV cache: rows [%lld, %lld) were written on a CUDA device that is gone", (long long)lo, (long long)hi);
    I.download_rows(c, lo, hi);
  });
  m.gen = cache.generation();  // the mirror holds the deferred rows: it is current
}

// Causal attention over [lo, pos0 + t] per query row (window <= 0: from 0), with optional sinks
// (host [n_heads]): attention(), attention_window() and attention_sinks() on the device.
void attention_general(CudaBackend::Impl& I, const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale,
                       int64_t window, const float* sinks, float* out, const char* op) {
  if (T <= 0) return;
  const int hd = kv.head_dim();
  if (kv.keys_only()) fail("%s: the cache holds keys only (an MLA latent cache: use mla_attention)", op);
  if (kv.n_kv_heads() <= 0 || n_heads % kv.n_kv_heads() != 0) fail("%s: %d heads over %d KV heads", op, n_heads, kv.n_kv_heads());
  if (hd > kMaxAttnHd) fail("%s: head dimension %d is above the CUDA kernel's %d", op, hd, kMaxAttnHd);
  // The cache must hold every key a query sees: [first, pos0 + T) (row = position - base).
  const int64_t first = window > 0 ? std::max<int64_t>(0, pos0 + 1 - window) : 0;
  if (first < kv.base() || pos0 + T - kv.base() > kv.capacity())
    fail("%s: positions [%lld, %lld) are needed, the cache holds [%lld, %lld)", op, (long long)first, (long long)(pos0 + T),
         (long long)kv.base(), (long long)(kv.base() + kv.capacity()));
  const KvMirror& m = I.mirror(kv, true);
  const KvDev d = kv_dev(kv, m);
  const float* qd = I.in(q, T * n_heads * hd);
  const float* sd = sinks != nullptr ? I.in(sinks, n_heads, false) : nullptr;
  auto oo = I.out(out, T * n_heads * hd, false);
  const int64_t nmax = pos0 + T - first;  // the most keys a query row sees
  // Query tiles whose score rows fit 64 MiB of scratch.
  // Rows seeing more than kAttnSplitKeys keys run in splits (the longest row the most) and merge;
  // their partial sums [tile rows, splits, hd + 2] take at most 64 MiB too.
  const int splits = attn_splits(nmax);
  const int64_t tile_t = std::max<int64_t>(
      1, std::min<int64_t>({T, (int64_t{16} << 20) / (nmax * n_heads), splits > 1 ? (int64_t{16} << 20) / (int64_t{splits} * n_heads * (hd + 2)) : T}));
  float* scores = I.arena->get_n<float>(tile_t * n_heads * nmax);
  float* part = splits > 1 ? I.arena->get_n<float>(tile_t * n_heads * splits * (hd + 2)) : nullptr;
  for (int64_t t0 = 0; t0 < T; t0 += tile_t) {
    const int64_t nt = std::min(tile_t, T - t0);
    k_attention<<<dim3(static_cast<unsigned>(nt * n_heads), static_cast<unsigned>(splits)), kAttnThreads,
                  static_cast<size_t>(hd) * sizeof(float) * (kAttnThreads / 32), I.stream>>>(qd, n_heads, n_heads / kv.n_kv_heads(), d, pos0, t0,
                                                                                            scale, window, kv.base(), sd, scores, nmax, part, splits,
                                                                                            oo.d);
    CU_LAUNCHED("k_attention");
    if (splits > 1) {
      k_attention_merge<<<static_cast<unsigned>(nt * n_heads), 128, 0, I.stream>>>(n_heads, pos0, t0, window, hd, sd, part, splits, oo.d);
      CU_LAUNCHED("k_attention_merge");
    }
  }
  I.finish(oo);
}

void attention(CudaBackend::Impl& I, const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, float* out) {
  attention_general(I, q, T, n_heads, kv, pos0, scale, 0, nullptr, out, "attention");
}

void attention_window(CudaBackend::Impl& I, const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale,
                      int64_t window, float* out) {
  attention_general(I, q, T, n_heads, kv, pos0, scale, window, nullptr, out, "attention_window");
}

void attention_sinks(CudaBackend::Impl& I, const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale,
                     int64_t window, const float* sinks, float* out) {
  if (sinks == nullptr) fail("attention_sinks: no sinks given");
  attention_general(I, q, T, n_heads, kv, pos0, scale, window, sinks, out, "attention_sinks");
}

void mla_attention(CudaBackend::Impl& I, const float* q, int64_t T, int n_heads, const KvCache& latent, int64_t pos0, float scale, int dv,
                   float* out) {
  if (T <= 0) return;
  const int D = latent.head_dim();
  if (!latent.keys_only() || latent.n_kv_heads() != 1)
    fail("mla_attention: the latent cache must be keys-only with one head (got %d heads%s)", latent.n_kv_heads(),
         latent.keys_only() ? "" : ", with values");
  if (dv <= 0 || dv > D) fail("mla_attention: value width %d outside (0, %d]", dv, D);
  if (D > kMaxMlaDim) fail("mla_attention: latent width %d is above the CUDA kernel's %d (its query is held in shared memory)", D, kMaxMlaDim);
  if (latent.base() != 0 || pos0 + T > latent.capacity())
    fail("mla_attention: positions [0, %lld) are needed, the cache holds [%lld, %lld)", (long long)(pos0 + T), (long long)latent.base(),
         (long long)(latent.base() + latent.capacity()));
  const KvMirror& m = I.mirror(latent, true);
  const KvDev d = kv_dev(latent, m);
  const float* qd = I.in(q, T * n_heads * D);
  auto oo = I.out(out, T * n_heads * dv, false);
  const int64_t nmax = pos0 + T;
  // Rows seeing more than kAttnSplitKeys keys run in splits and merge (k_attention's scheme); the
  // scores and the partial sums [tile rows, splits, dv + 2] each take at most 64 MiB.
  const int splits = attn_splits(nmax);
  const int64_t tile_t = std::max<int64_t>(
      1, std::min<int64_t>({T, (int64_t{16} << 20) / (nmax * n_heads), splits > 1 ? (int64_t{16} << 20) / (int64_t{splits} * n_heads * (dv + 2)) : T}));
  float* scores = I.arena->get_n<float>(tile_t * n_heads * nmax);
  float* part = splits > 1 ? I.arena->get_n<float>(tile_t * n_heads * splits * (dv + 2)) : nullptr;
  for (int64_t t0 = 0; t0 < T; t0 += tile_t) {
    const int64_t nt = std::min(tile_t, T - t0);
    k_mla_attention<<<dim3(static_cast<unsigned>(nt * n_heads), static_cast<unsigned>(splits)), kAttnThreads,
                      static_cast<size_t>(D) * sizeof(float), I.stream>>>(qd, n_heads, d, pos0, t0, scale, dv, scores, nmax, part, splits, oo.d);
    CU_LAUNCHED("k_mla_attention");
    if (splits > 1) {
      k_attention_merge<<<static_cast<unsigned>(nt * n_heads), 128, 0, I.stream>>>(n_heads, pos0, t0, 0, dv, nullptr, part, splits, oo.d);
      CU_LAUNCHED("k_attention_merge");
    }
  }
  I.finish(oo);
}

void rope(CudaBackend::Impl& I, const Rope& rope, float* x, int64_t T, int64_t row_stride, int n_heads, int head_dim, int64_t pos0) {
  const int half = rope.rotary_dim() / 2;
  if (T <= 0 || half == 0) return;
  const float* inv = rope.placed_inv_freq() != nullptr ? rope.placed_inv_freq() : I.in(rope.inv_freq().data(), half, false);
  auto xo = I.out(x, (T - 1) * row_stride + static_cast<int64_t>(n_heads) * head_dim, true);
  if (rope.pairs()) {
    const unsigned threads = static_cast<unsigned>(std::min(256, (half + 31) / 32 * 32));
    k_rope_pairs<<<static_cast<unsigned>(T * n_heads), threads, 2 * static_cast<size_t>(half) * sizeof(float), I.stream>>>(
        xo.d, row_stride, n_heads, head_dim, half, inv, rope.scaling(), pos0);
    CU_LAUNCHED("k_rope_pairs");
  } else {
    k_rope<<<blocks_for(T * n_heads * half), 256, 0, I.stream>>>(xo.d, T, row_stride, n_heads, head_dim, half, inv, rope.scaling(), pos0);
    CU_LAUNCHED("k_rope");
  }
  I.finish(xo);
}

}  // namespace spool::ops::cu
