// CudaBackend matrix products: the decode GEMV kernels (q4 with a fused prologue, f16/bf16, other
// code widths element-wise) and cuBLAS SGEMM for f32 weights and for T > kMaxGemvT after a
// dequantization pass; matmul / matmul_multi.
#include "ops/cuda/cuda_internal.h"

namespace spool::ops::cu {
namespace {

WDev make_wdev(const WeightView& w) {
  check_supported(w);
  WDev d{};
  d.rows = w.rows;
  d.cols = w.cols;
  switch (w.type) {
    case WType::kF32: d.kind = kWF32; break;
    case WType::kF16: d.kind = kWF16; break;
    case WType::kBF16: d.kind = kWBF16; break;
    case WType::kQuant:
      d.kind = kWQuant;
      d.qtype = static_cast<int>(w.quant.type);
      d.group = w.quant.group;
      d.ng = w.quant.groups_per_row();
      d.gb = static_cast<int>(qtype_group_bytes(w.quant.type, w.quant.group));
      d.q = w.quant.qweight;
      d.scales = w.quant.scales;
      d.cb = w.quant.codebook;
      break;
    case WType::kMxfp4:
      d.kind = kWMxfp4;
      d.mxs = w.mx_scales;
      break;
    case WType::kGgml:
      fail("cuda: weight %s has ggml block type %s, which the CUDA backend does not run yet (use --device cpu)",
           w.name ? w.name : "(unnamed)", ggml_type_name(w.ggml));
  }
  d.data = w.data;
  return d;
}

__device__ __forceinline__ int code_at(int type, const uint8_t* grp, int64_t j) {
  if (type == static_cast<int>(QType::kTernary)) {
    int v = grp[j / 5];
    for (int64_t d = j % 5; d > 0; --d) v /= 3;
    return v % 3;
  }
  const int b = qtype_bits(static_cast<QType>(type));  // 2, 3, 4, 5, 6 or 8
  const int64_t bit = j * b;
  const int sh = static_cast<int>(bit & 7);
  unsigned v = grp[bit >> 3];
  if (sh + b > 8) v |= static_cast<unsigned>(grp[(bit >> 3) + 1]) << 8;
  return static_cast<int>((v >> sh) & ((1u << b) - 1));
}

// W[r, c] as f32 (exact: f16/bf16 widen exactly; quantized = codebook entry * fp16 group scale).
__device__ __forceinline__ float wval(const WDev& w, int64_t r, int64_t c) {
  switch (w.kind) {
    case kWF32: return static_cast<const float*>(w.data)[r * w.cols + c];
    case kWF16: return __half2float(__ushort_as_half(static_cast<const uint16_t*>(w.data)[r * w.cols + c]));
    case kWBF16: return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(w.data)[r * w.cols + c]) << 16);
    case kWMxfp4: {  // HF MXFP4 (ops::Mxfp4View): low nibble = even column, 2^(scale - 127)
      const int64_t nb = w.cols >> 5, b = c >> 5, j = (c & 31) >> 1;
      const uint8_t byte = static_cast<const uint8_t*>(w.data)[(r * nb + b) * 16 + j];
      const int code = (c & 1) ? (byte >> 4) : (byte & 0xF);
      const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
      const float v = mag[code & 7];
      return ldexpf((code & 8) ? -v : v, static_cast<int>(w.mxs[r * nb + b]) - 127);
    }
    default: {
      const int64_t gi = c / w.group, j = c - gi * w.group;
      const uint8_t* grp = w.q + (r * w.ng + gi) * w.gb;
      return w.cb[code_at(w.qtype, grp, j)] * __half2float(__ushort_as_half(w.scales[r * w.ng + gi]));
    }
  }
}

// out[row] = H_blk(signs .* x[row]) / sqrt(B) for one row per block (dynamic smem: n floats).
// In-place blockwise Walsh-Hadamard butterflies over v[0, n) in shared memory (blocks of B, a power
// of two dividing n), unnormalised: stage h pairs (i, i + h) of each 2h-run with a + c, a - c, in
// the order of ops::hadamard_transform. 32-bit shift indexing (n < 2^31); ends with __syncthreads().
__device__ __forceinline__ void fwht_smem(float* v, int n, int B) {
  __syncthreads();
  for (int s = 0; (1 << s) < B; ++s) {
    const int h = 1 << s;
    for (int idx = threadIdx.x; idx < n / 2; idx += blockDim.x) {
      const int i = ((idx >> s) << (s + 1)) + (idx & (h - 1));
      const float a = v[i], c = v[i + h];
      v[i] = a + c;
      v[i + h] = a - c;
    }
    __syncthreads();
  }
}

// Threads of a block running fwht_smem over n elements: one butterfly each per stage (n / 2, at
// most 1024, a multiple of 32), so a decode step's single-row rotation is a few short stages.
inline unsigned fwht_threads(int64_t n) { return static_cast<unsigned>(std::clamp<int64_t>((n / 2 + 31) / 32 * 32, 32, 1024)); }

__global__ void k_rotate(const float* x, const int8_t* signs, int64_t n, int64_t B, float norm, float* out) {
  extern __shared__ float v[];
  const float* xr = x + blockIdx.x * n;
  float* o = out + blockIdx.x * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] = signs ? xr[i] * static_cast<float>(signs[i]) : xr[i];
  fwht_smem(v, static_cast<int>(n), static_cast<int>(B));
  for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = v[i] * norm;
}

// y[t, r] = sum_c W[r, c] x[t, c] for T <= kMaxGemvT: one warp per row.
__global__ void k_gemv(WDev w, const float* x, int T, float* y) {
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= w.rows) return;
  float acc[kMaxGemvT];
#pragma unroll
  for (int t = 0; t < kMaxGemvT; ++t) acc[t] = 0.0f;
  for (int64_t c = lane; c < w.cols; c += 32) {
    const float wv = wval(w, r, c);
#pragma unroll
    for (int t = 0; t < kMaxGemvT; ++t)
      if (t < T) acc[t] += wv * x[t * w.cols + c];
  }
#pragma unroll
  for (int t = 0; t < kMaxGemvT; ++t) {
    if (t >= T) break;
    const float s = warp_sum(acc[t]);
    if (lane == 0) y[t * w.rows + r] = s;
  }
}


// Decode GEMV (T <= kMaxGemvT rows of x', f32 accumulation) for the packed types (q2, q3, q4, q5,
// q6, q8: BITS bits per code, LSB first) that reads each weight byte once: LPR lanes (a power of two
// <= 32) share a row and each takes chunks of 32 codes (4 * BITS bytes: 16-byte loads for q4 / q8,
// 8-byte for q2 / q6, 4-byte for q3 / q5) strided by LPR, so a q4 row of 2048 codes is 2 loads per
// lane of a full warp and a row of 512 is 1 load per lane of half a warp; partial sums meet by
// shuffles. Each octet of 8 codes is looked up in the codebook (shared memory), dotted with x' and
// scaled once by its group's scale (group % 32 == 0: one scale per chunk). x' sits in shared memory in the chunk-interleaved order of chunk_xpos, so the
// lanes of a warp read consecutive 16-byte pieces (no bank conflicts). Needs cols % 32 == 0.
//
// Position in shared memory of x' column c (per row; nch = cols / 32 chunks): the 4 floats of
// column quad (word k, half h) of chunk ch sit at ((2k + h) * nch + ch) * 4, so lane ch's float4 of
// a given (k, h) is next to lane ch + 1's.
__device__ __forceinline__ int chunk_xpos(int c, int nch) {
  const int ch = c >> 5, k = (c >> 3) & 3, h = (c >> 2) & 1;
  return (((k << 1) | h) * nch + ch) * 4 + (c & 3);
}

// One chunk of 32 BITS-bit codes (4 * BITS bytes) as BITS little-endian 32-bit words.
template <int BITS>
struct Chunk {
  uint32_t w[BITS];
};

// Chunk c of a row at `row` (4 * BITS * c bytes in; the row 4-, 8- or 16-byte aligned as BITS is
// odd, 2 mod 4 or 0 mod 4), in the widest loads its alignment allows.
template <int BITS>
__device__ __forceinline__ Chunk<BITS> load_chunk(const uint8_t* row, int c) {
  Chunk<BITS> k;
  if constexpr (BITS % 4 == 0) {
    const uint4* p = reinterpret_cast<const uint4*>(row) + c * (BITS / 4);
#pragma unroll
    for (int i = 0; i < BITS / 4; ++i) {
      const uint4 v = __ldg(p + i);
      k.w[4 * i] = v.x, k.w[4 * i + 1] = v.y, k.w[4 * i + 2] = v.z, k.w[4 * i + 3] = v.w;
    }
  } else if constexpr (BITS % 2 == 0) {
    const uint2* p = reinterpret_cast<const uint2*>(row) + c * (BITS / 2);
#pragma unroll
    for (int i = 0; i < BITS / 2; ++i) {
      const uint2 v = __ldg(p + i);
      k.w[2 * i] = v.x, k.w[2 * i + 1] = v.y;
    }
  } else {
    const uint32_t* p = reinterpret_cast<const uint32_t*>(row) + c * BITS;
#pragma unroll
    for (int i = 0; i < BITS; ++i) k.w[i] = __ldg(p + i);
  }
  return k;
}

// Code e (0..31, a compile-time constant after unrolling) of a chunk: bits [e BITS, e BITS + BITS).
template <int BITS>
__device__ __forceinline__ uint32_t chunk_code(const Chunk<BITS>& k, int e) {
  const int bit = e * BITS, wi = bit >> 5, sh = bit & 31;
  uint32_t v = k.w[wi] >> sh;
  if (sh + BITS > 32) v |= k.w[wi + 1] << (32 - sh);
  return v & ((1u << BITS) - 1u);
}

// Bytes of one row of a packed weight: cols / 32 chunks of 4 * BITS bytes.
__host__ __device__ constexpr int64_t packed_row_bytes(int bits, int64_t cols) { return cols / 32 * 4 * bits; }

// Whether gemv_quant_rows pipelines its loads for BITS-bit codes and R rows per lane group (the
// registers allow it; q8 with R = 4 would spill and loads one chunk at a time).
template <int BITS, int R>
constexpr bool gemv_pipelined() { return BITS * R <= 24; }

// The first chunk (chunk `sub` of the lane) of R rows and its group scales, loaded ahead of use.
template <int BITS, int R>
struct FirstChunk {
  Chunk<BITS> w[R];
  uint16_t s[R];
};
template <int BITS, int R>
__device__ __forceinline__ void load_first(FirstChunk<BITS, R>& f, const QGemvJob& j, int64_t rows, int64_t cols, int group, int64_t r0,
                                           int sub) {
  const int64_t ng = cols / group;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t rr = min(r0 + i, rows - 1);
    f.w[i] = load_chunk<BITS>(j.q + rr * packed_row_bytes(BITS, cols), sub);
    f.s[i] = __ldg(j.scales + rr * ng + (sub * 32) / group);
  }
}

// R consecutive rows r0 .. r0 + R - 1 per group of LPR lanes: each chunk of x' (one float4 pair per
// word and row of x') is read from shared memory once for the R rows, whose weight chunks are all
// loaded first (R 16-byte loads in flight per lane). Row r's products and their order depend only
// on cols (LPR) and the row itself, not on R, TM or the job's other rows.
// `first` holds these rows' first chunk (loaded by the caller); where the registers allow (kPipe)
// the loop is software pipelined: chunk c + LPR's codes and scales are loaded before chunk c's
// products, and during the last chunk the next row block's first chunk (rows next_r0.., when
// next_r0 >= 0) is loaded into `first`, so a lane keeps 2 R loads in flight across row blocks.
template <int BITS, int LPR, int R, int TM>
__device__ __forceinline__ void gemv_quant_rows(const QGemvJob& j, const float* cbs, const float* xs, int64_t rows, int64_t cols, int group,
                                             int64_t r0, FirstChunk<BITS, R>& first, int64_t next_r0) {
  const int sub = threadIdx.x & (LPR - 1);
  const int nch = static_cast<int>(cols / 32);
  const int64_t ng = cols / group;
  const int T = TM == 1 ? 1 : j.T;
  const uint8_t* qr[R];
  const uint16_t* sr[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t rr = min(r0 + i, rows - 1);  // (rows past the last run it again for the shuffles, store nothing)
    qr[i] = j.q + rr * packed_row_bytes(BITS, cols);
    sr[i] = j.scales + rr * ng;
  }
  float acc[R][TM];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int t = 0; t < TM; ++t) acc[i][t] = 0.0f;
  constexpr bool kPipe = gemv_pipelined<BITS, R>();
  Chunk<BITS> wq[R];
  uint16_t sq[R];  // (group % 32 == 0: one scale per chunk of 32 codes)
#pragma unroll
  for (int i = 0; i < R; ++i) {
    wq[i] = first.w[i];
    sq[i] = first.s[i];
  }
  for (int c = sub; c < nch; c += LPR) {
    Chunk<BITS> wn[R];
    uint16_t sn[R];
    const bool more = kPipe && c + LPR < nch;
    if (!kPipe && c != sub) {
#pragma unroll
      for (int i = 0; i < R; ++i) {
        wq[i] = load_chunk<BITS>(qr[i], c);
        sq[i] = __ldg(sr[i] + (c * 32) / group);
      }
    }
    if (more) {
#pragma unroll
      for (int i = 0; i < R; ++i) {
        wn[i] = load_chunk<BITS>(qr[i], c + LPR);
        sn[i] = __ldg(sr[i] + ((c + LPR) * 32) / group);
      }
    } else if (kPipe && next_r0 >= 0 && c + LPR >= nch) {
      load_first<BITS, R>(first, j, rows, cols, group, next_r0, sub);
    }
    float sc[R];
#pragma unroll
    for (int i = 0; i < R; ++i) sc[i] = __half2float(__ushort_as_half(sq[i]));
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float wv[R][8];
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int e = 0; e < 8; ++e) wv[i][e] = cbs[chunk_code<BITS>(wq[i], 8 * k + e)];
#pragma unroll
      for (int t = 0; t < TM; ++t) {
        if (t >= T) break;
        const float4 a = *reinterpret_cast<const float4*>(xs + t * cols + ((2 * k) * nch + c) * 4);
        const float4 b = *reinterpret_cast<const float4*>(xs + t * cols + ((2 * k + 1) * nch + c) * 4);
        // The word's dot product, then one multiply-add by the group scale, in explicitly rounded
        // operations: every variant (R, TM) and path computes a row with the same instructions.
#pragma unroll
        for (int i = 0; i < R; ++i) {
          float d = __fmul_rn(wv[i][0], a.x);
          d = __fmaf_rn(wv[i][1], a.y, d);
          d = __fmaf_rn(wv[i][2], a.z, d);
          d = __fmaf_rn(wv[i][3], a.w, d);
          d = __fmaf_rn(wv[i][4], b.x, d);
          d = __fmaf_rn(wv[i][5], b.y, d);
          d = __fmaf_rn(wv[i][6], b.z, d);
          d = __fmaf_rn(wv[i][7], b.w, d);
          acc[i][t] = __fmaf_rn(sc[i], d, acc[i][t]);
        }
      }
    }
    if (more) {
#pragma unroll
      for (int i = 0; i < R; ++i) {
        wq[i] = wn[i];
        sq[i] = sn[i];
      }
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int t = 0; t < TM; ++t) {
      if (t >= T) break;
      float v = acc[i][t];
#pragma unroll
      for (int o = LPR / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (sub == 0 && r0 + i < rows) j.y[t * rows + r0 + i] = v;
    }
}

// Blockwise Walsh-Hadamard butterflies of fwht_smem (same pairs, same order) over a row stored in
// chunk_xpos order.
__device__ __forceinline__ void fwht_smem_chunked(float* v, int n, int B, int nch) {
  __syncthreads();
  for (int s = 0; (1 << s) < B; ++s) {
    const int h = 1 << s;
    for (int idx = threadIdx.x; idx < n / 2; idx += blockDim.x) {
      const int i = ((idx >> s) << (s + 1)) + (idx & (h - 1));
      const int pi = chunk_xpos(i, nch), ph = chunk_xpos(i + h, nch);
      const float a = v[pi], c = v[ph];
      v[pi] = a + c;
      v[ph] = a - c;
    }
    __syncthreads();
  }
}

constexpr int kGemvThreads = 512;

// One row of x' for a weight whose Hadamard block is the whole row (B == n, n = E * kGemvThreads
// columns, E in {1, 2, 4, 8, 16}): the butterflies of fwht_smem, stage by stage with the same
// pairs and operations (so the same bits as fwht_smem_chunked and k_rotate), mostly in registers.
// Thread t holds columns [t E, t E + E): stages 0 .. log2(E) - 1 run in its registers, the next
// five across the lanes of its warp (shuffles: the lower column of a pair takes a + c, the upper
// a - c), then the last four (the columns' top 4 bits, across the 16 warps) on n / 16 runs of 16
// columns read back from shared memory, scaled by norm as they are written (chunk_xpos order).
// Two barriers instead of log2(n). The caller's __syncthreads() publishes the row.
__device__ __forceinline__ void rotate_row_regs(const float* src, const float* src2, const int8_t* signs, float* v, int n, int nch,
                                                float norm) {
  const int E = n / kGemvThreads, t = threadIdx.x, i0 = t * E;
  float r[16];
#pragma unroll
  for (int k = 0; k < 16; ++k)
    if (k < E) {
      const float e = src2 != nullptr ? silu_f(src[i0 + k]) * src2[i0 + k] : src[i0 + k];
      r[k] = e * static_cast<float>(signs[i0 + k]);
    }
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const int h = 1 << s;
    if (h >= E) break;
#pragma unroll
    for (int k = 0; k < 16; ++k)
      if ((k & h) == 0 && k + h < E) {
        const float a = r[k], c = r[k + h];
        r[k] = a + c;
        r[k + h] = a - c;
      }
  }
#pragma unroll
  for (int b = 0; b < 5; ++b) {
    const bool upper = ((t >> b) & 1) != 0;
#pragma unroll
    for (int k = 0; k < 16; ++k)
      if (k < E) {  // (E is the same for the whole block: every lane shuffles)
        const float o = __shfl_xor_sync(0xffffffffu, r[k], 1 << b);
        r[k] = upper ? o - r[k] : r[k] + o;
      }
  }
#pragma unroll
  for (int k = 0; k < 16; ++k)
    if (k < E) v[chunk_xpos(i0 + k, nch)] = r[k];
  __syncthreads();
  const int Q = n / 16;  // column c = j + k Q: k holds the top 4 bits
  for (int j = t; j < Q; j += kGemvThreads) {
    float u[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) u[k] = v[chunk_xpos(j + k * Q, nch)];
#pragma unroll
    for (int s = 0; s < 4; ++s)
#pragma unroll
      for (int k = 0; k < 16; ++k)
        if ((k & (1 << s)) == 0) {
          const float a = u[k], c = u[k + (1 << s)];
          u[k] = a + c;
          u[k + (1 << s)] = a - c;
        }
#pragma unroll
    for (int k = 0; k < 16; ++k) v[chunk_xpos(j + k * Q, nch)] = u[k] * norm;
  }
}

// y = x' W^T for one job (jobs == null: `one`) or many (blockIdx.y picks the job: all experts'
// projections of an MoE layer in one launch). x' is built in shared memory once per block (dynamic
// smem: T * cols floats): row t is x row tok[t] (row t without tok), then silu(x) * x2 when x2 is
// set (k_swiglu's formula), then rotated when signs is set (k_rotate's arithmetic), so the products
// are those of separate launches. Blocks of kGemvThreads cover kGemvThreads / LPR * R rows at a
// time and stride over the row blocks by gridDim.x: a grid of about one block per SM (per job) builds
// x' rarely. TM: 1 (T == 1) or kMaxGemvT (any T up to it).
constexpr size_t kGemvStaticSmem = 256 * sizeof(float);  // k_gemv_quant's codebook (beside the dynamic x'; q8's 256 entries)
// Rows per lane group R: 4 or 1 for one row of x' (decode; 1 spreads a small weight over more
// blocks), 2 for up to kMaxGemvT rows of x' (registers).
template <int BITS, int LPR, int TM, int R>
__global__ void __launch_bounds__(kGemvThreads, 1) k_gemv_quant(const QGemvJob* jobs, QGemvJob one, int64_t rows, int64_t cols, int group, int64_t B,
                                                           float norm) {
  const QGemvJob j = jobs != nullptr ? jobs[blockIdx.y] : one;
  extern __shared__ float xs[];
  __shared__ float cbs[1 << BITS];
  const int64_t rpb = kGemvThreads / LPR * R, nrb = (rows + rpb - 1) / rpb;
  const int n = static_cast<int>(cols), nch = n / 32;
  // The first chunk of this block's first rows is loaded before the prologue (its latency overlaps it).
  FirstChunk<BITS, R> first;
  const int sub = threadIdx.x & (LPR - 1);
  const int64_t lane_rows = threadIdx.x / LPR * R;
  load_first<BITS, R>(first, j, rows, cols, group, static_cast<int64_t>(blockIdx.x) * rpb + lane_rows, sub);
  for (int i = threadIdx.x; i < (1 << BITS); i += blockDim.x) cbs[i] = j.cb[i];
  for (int t = 0; t < j.T; ++t) {
    float* v = xs + t * n;
    const int64_t row = j.tok != nullptr ? j.tok[t] : t;
    const float* src = j.x + row * cols;
    const float* src2 = j.x2 != nullptr ? j.x2 + row * cols : nullptr;
    if (j.signs != nullptr && B == n && n >= kGemvThreads && n <= 16 * kGemvThreads) {
      rotate_row_regs(src, src2, j.signs, v, n, nch, norm);
      continue;
    }
#pragma unroll 4
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      float e = src2 != nullptr ? silu_f(src[i]) * src2[i] : src[i];
      if (j.signs != nullptr) e *= static_cast<float>(j.signs[i]);
      v[chunk_xpos(i, nch)] = e;
    }
    if (j.signs != nullptr) {
      fwht_smem_chunked(v, n, static_cast<int>(B), nch);
      for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] *= norm;  // (every element once: order does not matter)
    }
  }
  __syncthreads();
  constexpr bool kPipe = gemv_pipelined<BITS, R>();
  for (int64_t rb = blockIdx.x; rb < nrb; rb += gridDim.x) {
    const int64_t nrb_next = rb + gridDim.x;
    gemv_quant_rows<BITS, LPR, R, TM>(j, cbs, xs, rows, cols, group, rb * rpb + lane_rows, first,
                                      nrb_next < nrb ? nrb_next * rpb + lane_rows : -1);
    if (!kPipe && nrb_next < nrb) load_first<BITS, R>(first, j, rows, cols, group, nrb_next * rpb + lane_rows, sub);
  }
}

// Up to kMaxGemv16 f16 / bf16 weights of one input in one launch (blockIdx.y picks the weight).
constexpr int kMaxGemv16 = 4;
struct Gemv16Set {
  const uint16_t* w[kMaxGemv16];
  int64_t rows[kMaxGemv16];
  float* y[kMaxGemv16];
};

// The same for f16 / bf16 weights: each lane reads 8 elements (16 bytes) per step, a warp 512
// consecutive bytes, one warp per row; needs cols % 8 == 0, W and x 16-byte aligned. Weight
// blockIdx.y of `set` (blocks past its rows return).
template <bool kBf16>
__global__ void k_gemv_16(const __grid_constant__ Gemv16Set set, int64_t cols, const float* x, int T) {
  const uint16_t* w = set.w[blockIdx.y];
  const int64_t rows = set.rows[blockIdx.y];
  float* y = set.y[blockIdx.y];
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (r >= rows) return;
  const uint4* wr = reinterpret_cast<const uint4*>(w + r * cols);
  float acc[kMaxGemvT];
#pragma unroll
  for (int t = 0; t < kMaxGemvT; ++t) acc[t] = 0.0f;
#pragma unroll 4
  for (int64_t c0 = lane * 8; c0 < cols; c0 += 256) {
    const uint4 p = __ldg(wr + c0 / 8);
    const uint32_t u[4] = {p.x, p.y, p.z, p.w};
    float wv[8];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (kBf16) {
        wv[2 * j] = __uint_as_float(u[j] << 16);
        wv[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
      } else {
        wv[2 * j] = __half2float(__ushort_as_half(static_cast<unsigned short>(u[j] & 0xffffu)));
        wv[2 * j + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(u[j] >> 16)));
      }
    }
#pragma unroll
    for (int t = 0; t < kMaxGemvT; ++t) {
      if (t >= T) break;
      const float4 a = *reinterpret_cast<const float4*>(x + t * cols + c0);
      const float4 b = *reinterpret_cast<const float4*>(x + t * cols + c0 + 4);
      acc[t] += wv[0] * a.x + wv[1] * a.y + wv[2] * a.z + wv[3] * a.w + wv[4] * b.x + wv[5] * b.y + wv[6] * b.z + wv[7] * b.w;
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxGemvT; ++t) {
    if (t >= T) break;
    const float s = warp_sum(acc[t]);
    if (lane == 0) y[t * rows + r] = s;
  }
}

// Decode GEMV for MXFP4 weights (HF gpt-oss layout, ops::Mxfp4View): blocks [rows, cols/32, 16]
// (byte k: low nibble = column 2k, high = 2k + 1, E2M1 codes) and E8M0 scales [rows, cols/32]. LPR
// lanes (a power of two <= 32) share a row; each takes whole 32-column blocks (one 16-byte load
// and one scale byte) strided by LPR, forms the block's dot with x in f32 and adds it times
// 2^(scale - 127); partial sums meet by shuffles. T <= kMaxGemvT rows of x [T, cols].
__global__ void k_gemv_mxfp4(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t cols, int lpr, const float* x, int T,
                             float* y) {
  __shared__ float lut[16];
  if (threadIdx.x < 16) {
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    lut[threadIdx.x] = threadIdx.x < 8 ? mag[threadIdx.x] : -mag[threadIdx.x - 8];
  }
  __syncthreads();
  const int sub = threadIdx.x & (lpr - 1);
  const int64_t r_raw = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / lpr;
  const int64_t r = min(r_raw, rows - 1);  // (rows past the last run for the shuffles, store nothing)
  const int64_t nb = cols / 32;
  const uint4* br = reinterpret_cast<const uint4*>(blocks + r * nb * 16);
  const uint8_t* sr = scales + r * nb;
  float acc[kMaxGemvT];
#pragma unroll
  for (int t = 0; t < kMaxGemvT; ++t) acc[t] = 0.0f;
  for (int64_t b = sub; b < nb; b += lpr) {
    const uint4 p = __ldg(br + b);
    const float sc = ldexpf(1.0f, static_cast<int>(__ldg(sr + b)) - 127);
    const uint32_t u[4] = {p.x, p.y, p.z, p.w};
    float wv[32];
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const uint32_t byte = (u[k >> 2] >> (8 * (k & 3))) & 0xffu;
      wv[2 * k] = lut[byte & 15u];
      wv[2 * k + 1] = lut[byte >> 4];
    }
#pragma unroll
    for (int t = 0; t < kMaxGemvT; ++t) {
      if (t >= T) break;
      const float4* xt = reinterpret_cast<const float4*>(x + t * cols + b * 32);
      float d = 0.0f;
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const float4 a = xt[q];
        d = fmaf(wv[4 * q], a.x, d);
        d = fmaf(wv[4 * q + 1], a.y, d);
        d = fmaf(wv[4 * q + 2], a.z, d);
        d = fmaf(wv[4 * q + 3], a.w, d);
      }
      acc[t] = fmaf(sc, d, acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxGemvT; ++t) {
    if (t >= T) break;
    float v = acc[t];
    for (int o = lpr / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (sub == 0 && r_raw < rows) y[t * rows + r] = v;
  }
}

// Per-head decode GEMVs (Backend::matmul_heads, MLA's absorbed products): weight blockIdx.y of
// `set` ([rows, cols], f32 / f16 / bf16 as KIND 0 / 1 / 2) against head blockIdx.y's slice of x.
// LPR lanes (a power of two <= 32) share a row; each reads VECN consecutive weights (16 bytes when
// VECN > 1) per step, strided by LPR * VECN; partial sums meet by shuffles. T <= kMaxGemvT.
constexpr int kMaxHeadsLaunch = 128;
struct HeadsSet {
  const void* w[kMaxHeadsLaunch];
};
template <int KIND>
__device__ __forceinline__ float head_w(const void* base, int64_t i) {
  if constexpr (KIND == 0) return static_cast<const float*>(base)[i];
  else if constexpr (KIND == 1) return __half2float(__ushort_as_half(static_cast<const uint16_t*>(base)[i]));
  else return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(base)[i]) << 16);
}
template <int KIND, int VECN>
__global__ void k_gemv_heads(const __grid_constant__ HeadsSet set, int64_t rows, int64_t cols, int lpr, const float* x, int64_t ldx,
                             int64_t hx, int T, float* y, int64_t ldy, int64_t hy) {
  const int h = blockIdx.y;
  const int sub = threadIdx.x & (lpr - 1);
  const int64_t r_raw = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / lpr;
  const int64_t r = min(r_raw, rows - 1);  // (rows past the last run for the shuffles, store nothing)
  const void* wb = set.w[h];
  const float* xh = x + static_cast<int64_t>(h) * hx;
  float acc[kMaxGemvT];
#pragma unroll
  for (int t = 0; t < kMaxGemvT; ++t) acc[t] = 0.0f;
  for (int64_t c0 = static_cast<int64_t>(sub) * VECN; c0 < cols; c0 += static_cast<int64_t>(lpr) * VECN) {
    float wv[VECN];
    if constexpr (VECN == 1) {
      wv[0] = head_w<KIND>(wb, r * cols + c0);
    } else {
      const uint4 p = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(wb) + (r * cols + c0) * (KIND == 0 ? 4 : 2)));
      const uint32_t u[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (KIND == 0) {
          wv[j] = __uint_as_float(u[j]);
        } else if constexpr (KIND == 1) {
          wv[2 * j] = __half2float(__ushort_as_half(static_cast<unsigned short>(u[j] & 0xffffu)));
          wv[2 * j + 1] = __half2float(__ushort_as_half(static_cast<unsigned short>(u[j] >> 16)));
        } else {
          wv[2 * j] = __uint_as_float(u[j] << 16);
          wv[2 * j + 1] = __uint_as_float(u[j] & 0xffff0000u);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kMaxGemvT; ++t) {
      if (t >= T) break;
      const float* xt = xh + t * ldx + c0;
#pragma unroll
      for (int e = 0; e < VECN; ++e) acc[t] = fmaf(wv[e], xt[e], acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxGemvT; ++t) {
    if (t >= T) break;
    float v = acc[t];
    for (int o = lpr / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (sub == 0 && r_raw < rows) y[t * ldy + static_cast<int64_t>(h) * hy + r] = v;
  }
}

// out[(r - r0) * cols + c] = W[r, c] for rows [r0, r0 + nr).
__global__ void k_dequant(WDev w, int64_t r0, int64_t nr, float* out) {
  const int64_t n = nr * w.cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = wval(w, r0 + i / w.cols, i % w.cols);
}

}  // namespace
}  // namespace spool::ops::cu

namespace spool::ops {

cublasHandle_t CudaBackend::Impl::cublas() {
  if (blas == nullptr) {
    check_blas(cublasCreate(&blas), "cublasCreate");
    check_blas(cublasSetStream(blas, stream), "cublasSetStream");
    check_blas(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");  // no TF32: f32 products stay f32
  }
  return blas;
}

void CudaBackend::Impl::rotate(const int8_t* signs, const float* x, int64_t T, int64_t n, float* out) {
  const int64_t B = n & -n;
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(B)));
  const size_t smem = static_cast<size_t>(n) * sizeof(float);
  if (smem > static_cast<size_t>(smem_optin))
    fail("cuda backend: a rotated input of %lld columns needs %zu bytes of shared memory (device has %d)", (long long)n, smem, smem_optin);
  if (smem > (48 << 10)) CU(cudaFuncSetAttribute(k_rotate, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  k_rotate<<<static_cast<unsigned>(T), fwht_threads(n), smem, stream>>>(x, signs, n, B, norm, out);
  CU_LAUNCHED("k_rotate");
}

namespace cu {
bool gemv_quant_type(QType t) { return t != QType::kTernary; }

uintptr_t gemv_quant_align(QType t) {
  const int b = qtype_bits(t);
  return b % 4 == 0 ? 16 : b % 2 == 0 ? 8 : 4;
}
}  // namespace cu

void CudaBackend::Impl::gemv_quant(const QGemvJob* jobs, const QGemvJob& one, int64_t n_jobs, int t_max, int64_t rows, int64_t cols, QFmt f) {
  const int group = f.group;
  const int64_t nc = cols / 32;
  int lpr = 1;
  while (lpr < 32 && lpr * 2 <= nc) lpr *= 2;
  // Rows per lane group: 2 for several rows of x'; 4 for one, unless that leaves fewer than half the
  // SMs a block (a small weight), then 1.
  const int64_t per_block = kGemvThreads / lpr;
  const auto blocks_for_r = [&](int r) { return n_jobs * ((rows + per_block * r - 1) / (per_block * r)); };
  const int R = t_max > 1 ? 2 : blocks_for_r(4) >= sms / 2 ? 4 : 1;
  const int64_t nrb = (rows + per_block * R - 1) / (per_block * R);
  const int64_t B = cols & -cols;
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(B)));
  const size_t smem = static_cast<size_t>(t_max) * static_cast<size_t>(cols) * sizeof(float);
  if (smem + kGemvStaticSmem > static_cast<size_t>(smem_optin))
    fail("cuda backend: a GEMV input of %d x %lld needs %zu bytes of shared memory (device has %d)", t_max, (long long)cols, smem, smem_optin);
  const int64_t gx = std::min<int64_t>(nrb, std::max<int64_t>(1, sms / std::max<int64_t>(n_jobs, 1)));
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(n_jobs));
  const auto go = [&](auto kern) {
    // Above the default 48 KiB (static + dynamic) a kernel needs the opt-in, raised once to the device's limit.
    if (smem + kGemvStaticSmem > (48 << 10) && raised_smem.insert(reinterpret_cast<const void*>(kern)).second)
      CU(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin - static_cast<int>(kGemvStaticSmem)));
    kern<<<grid, kGemvThreads, smem, stream>>>(jobs, one, rows, cols, group, B, norm);
  };
  const auto by_lpr = [&](auto bits, auto tm, auto r) {
    constexpr int BITS = decltype(bits)::value, TM = decltype(tm)::value, RR = decltype(r)::value;
    switch (lpr) {
      case 1: go(k_gemv_quant<BITS, 1, TM, RR>); break;
      case 2: go(k_gemv_quant<BITS, 2, TM, RR>); break;
      case 4: go(k_gemv_quant<BITS, 4, TM, RR>); break;
      case 8: go(k_gemv_quant<BITS, 8, TM, RR>); break;
      case 16: go(k_gemv_quant<BITS, 16, TM, RR>); break;
      default: go(k_gemv_quant<BITS, 32, TM, RR>); break;
    }
  };
  const auto by_r = [&](auto bits) {
    using I1 = std::integral_constant<int, 1>;
    if (R == 2) {
      by_lpr(bits, std::integral_constant<int, kMaxGemvT>{}, std::integral_constant<int, 2>{});
    } else if (R == 4) {
      by_lpr(bits, I1{}, std::integral_constant<int, 4>{});
    } else {
      by_lpr(bits, I1{}, I1{});
    }
  };
  switch (f.type) {
    case QType::kQ2: by_r(std::integral_constant<int, 2>{}); break;
    case QType::kQ3: by_r(std::integral_constant<int, 3>{}); break;
    case QType::kQ4: by_r(std::integral_constant<int, 4>{}); break;
    case QType::kQ5: by_r(std::integral_constant<int, 5>{}); break;
    case QType::kQ6: by_r(std::integral_constant<int, 6>{}); break;
    case QType::kQ8: by_r(std::integral_constant<int, 8>{}); break;
    case QType::kTernary: fail("gemv_quant: ternary codes are not packed in whole chunks of 32 (k_gemv takes them)");
  }
  CU_LAUNCHED("k_gemv_quant");
}

bool CudaBackend::Impl::gemv16_ok(const WeightView& w, const float* x, int64_t T) {
  return T <= kMaxGemvT && w.cols % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         (w.type == WType::kBF16 || w.type == WType::kF16) && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
}

void CudaBackend::Impl::gemv_16(std::span<const WeightView* const> ws, std::span<float* const> ys, const float* x, int64_t T) {
  Gemv16Set set{};
  int64_t max_rows = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    set.w[i] = static_cast<const uint16_t*>(ws[i]->data);
    set.rows[i] = ws[i]->rows;
    set.y[i] = ys[i];
    max_rows = std::max(max_rows, ws[i]->rows);
  }
  const int threads = max_rows * 32 / 256 * static_cast<int64_t>(ws.size()) < sms ? 64 : 256;
  const dim3 grid(static_cast<unsigned>((max_rows * 32 + threads - 1) / threads), static_cast<unsigned>(ws.size()));
  const int64_t cols = ws[0]->cols;
  if (ws[0]->type == WType::kBF16) {
    k_gemv_16<true><<<grid, threads, 0, stream>>>(set, cols, x, static_cast<int>(T));
  } else {
    k_gemv_16<false><<<grid, threads, 0, stream>>>(set, cols, x, static_cast<int>(T));
  }
  CU_LAUNCHED("k_gemv_16");
}

int CudaBackend::Impl::gemv_rows_fit(int64_t cols) const {
  const int64_t room = static_cast<int64_t>(smem_optin) - static_cast<int64_t>(kGemvStaticSmem);
  return static_cast<int>(std::clamp<int64_t>(room / (4 * std::max<int64_t>(cols, 1)), 0, kMaxGemvT));
}

void CudaBackend::Impl::mm(const WeightView& w_in, const float* x, int64_t T, float* y, const int64_t* row_tok) {
  mm_base(w_in, x, T, y);
  if (w_in.lora != nullptr) lora_add(*w_in.lora, x, T, w_in.cols, y, w_in.rows, w_in.rows, row_tok);
}

void CudaBackend::Impl::mm_base(const WeightView& w_in, const float* x, int64_t T, float* y) {
  if (T <= 0 || w_in.rows == 0) return;
  const Arena::Mark m = arena->mark();
  const WeightView w = dev_weight(w_in);
  const int64_t rows = w.rows, cols = w.cols;
  // Packed-code decode GEMV (k_gemv_quant: q2..q8; the rotation, if any, runs in its prologue), in
  // launches of at most gemv_rows_fit(cols) rows of x (a row's result does not depend on the others
  // of its launch).
  const int fit = gemv_rows_fit(cols);
  if (T <= kMaxGemvT && fit >= 1 && w.type == WType::kQuant && gemv_quant_type(w.quant.type) && cols % 32 == 0 && w.quant.group % 32 == 0 &&
      reinterpret_cast<uintptr_t>(w.quant.qweight) % gemv_quant_align(w.quant.type) == 0) {
    for (int64_t t0 = 0; t0 < T; t0 += fit) {
      const int n = static_cast<int>(std::min<int64_t>(fit, T - t0));
      const QGemvJob one{w.quant.qweight, w.quant.scales, w.quant.codebook, x + t0 * cols, y + t0 * rows, n, nullptr, nullptr, w.quant.signs};
      gemv_quant(nullptr, one, 1, n, rows, cols, QFmt{w.quant.type, w.quant.group});
    }
    arena->release(m);
    return;
  }
  if (w.type == WType::kQuant && w.quant.signs != nullptr) {
    float* xr = arena->get_n<float>(T * cols);
    rotate(w.quant.signs, x, T, cols, xr);
    x = xr;
  }
  const float one = 1.0f, zero = 0.0f;
  if (w.type == WType::kF32) {
    check_blas(cublasSgemm(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(T), static_cast<int>(cols), &one,
                           static_cast<const float*>(w.data), static_cast<int>(cols), x, static_cast<int>(cols), &zero, y,
                           static_cast<int>(rows)),
               "cublasSgemm");
  } else if (gemv16_ok(w, x, T)) {
    const WeightView* one[] = {&w};
    float* ys[] = {y};
    gemv_16(one, ys, x, T);
  } else if (w.type == WType::kMxfp4 && T <= kMaxGemvT && cols % 32 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
             reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    int lpr = 1;
    while (lpr < 32 && lpr * 2 <= cols / 32) lpr *= 2;
    constexpr int threads = 256;
    k_gemv_mxfp4<<<static_cast<unsigned>((rows * lpr + threads - 1) / threads), threads, 0, stream>>>(
        static_cast<const uint8_t*>(w.data), w.mx_scales, rows, cols, lpr, x, static_cast<int>(T), y);
    CU_LAUNCHED("k_gemv_mxfp4");
  } else if (T <= kMaxGemvT) {
    const WDev wd = make_wdev(w);
    const int64_t threads = rows * 32;
    k_gemv<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(wd, x, static_cast<int>(T), y);
    CU_LAUNCHED("k_gemv");
  } else {
    // Dequantize row chunks (<= 64 MiB of f32) and multiply with SGEMM.
    const WDev wd = make_wdev(w);
    const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(rows, (int64_t{64} << 20) / 4 / cols));
    float* deq = arena->get_n<float>(chunk * cols);
    for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const int64_t nr = std::min(chunk, rows - r0);
      k_dequant<<<blocks_for(nr * cols), 256, 0, stream>>>(wd, r0, nr, deq);
      CU_LAUNCHED("k_dequant");
      check_blas(cublasSgemm(cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(nr), static_cast<int>(T), static_cast<int>(cols), &one,
                             deq, static_cast<int>(cols), x, static_cast<int>(cols), &zero, y + r0, static_cast<int>(rows)),
                 "cublasSgemm");
    }
  }
  arena->release(m);
}

}  // namespace spool::ops

namespace spool::ops::cu {

bool matmul_heads_native(std::span<const WeightView> w, const float* x, int64_t T, const float* y) {
  if (w.empty() || w.size() > static_cast<size_t>(kMaxHeadsLaunch) || T <= 0 || T > kMaxGemvT || !is_device_ptr(x) || !is_device_ptr(y))
    return false;
  for (const WeightView& v : w)
    if (v.device != Device::kCuda || v.lora != nullptr || v.type != w[0].type || v.rows != w[0].rows || v.cols != w[0].cols ||
        (v.type != WType::kF32 && v.type != WType::kF16 && v.type != WType::kBF16))
      return false;
  return true;
}

void matmul_heads(CudaBackend::Impl& I, std::span<const WeightView> w, const float* x, int64_t ldx, int64_t hx, int64_t T, float* y,
                  int64_t ldy, int64_t hy) {
  const int64_t rows = w[0].rows, cols = w[0].cols;
  if (rows == 0) return;
  HeadsSet set{};
  bool vec = true;
  const int vecn = w[0].type == WType::kF32 ? 4 : 8;
  for (size_t h = 0; h < w.size(); ++h) {
    set.w[h] = w[h].data;
    vec = vec && reinterpret_cast<uintptr_t>(w[h].data) % 16 == 0;
  }
  vec = vec && cols % vecn == 0;
  const int64_t steps = vec ? cols / vecn : cols;
  int lpr = 1;
  while (lpr < 32 && lpr * 2 <= steps) lpr *= 2;
  constexpr int threads = 256;
  const dim3 grid(static_cast<unsigned>((rows * lpr + threads - 1) / threads), static_cast<unsigned>(w.size()));
  const auto go = [&](auto kern) { kern<<<grid, threads, 0, I.stream>>>(set, rows, cols, lpr, x, ldx, hx, static_cast<int>(T), y, ldy, hy); };
  switch (w[0].type) {
    case WType::kF32: vec ? go(k_gemv_heads<0, 4>) : go(k_gemv_heads<0, 1>); break;
    case WType::kF16: vec ? go(k_gemv_heads<1, 8>) : go(k_gemv_heads<1, 1>); break;
    default: vec ? go(k_gemv_heads<2, 8>) : go(k_gemv_heads<2, 1>); break;
  }
  CU_LAUNCHED("k_gemv_heads");
}

void matmul(CudaBackend::Impl& I, const WeightView& w, const float* x, int64_t T, float* y) {
  const float* xd = I.in(x, T * w.cols);
  auto yo = I.out(y, T * w.rows, false);
  I.mm(w, xd, T, yo.d);
  I.finish(yo);
}

void matmul_multi(CudaBackend::Impl& I, std::span<const MatmulOut> outs, const float* x, int64_t T) {
  if (outs.empty()) return;
  const float* xd = I.in(x, T * outs[0].w->cols);
  for (const MatmulOut& o : outs)
    if (o.w->cols != outs[0].w->cols) fail("matmul_multi: weights of %lld and %lld columns share one input", (long long)outs[0].w->cols, (long long)o.w->cols);
  // Device-resident f16 / bf16 weights with device outputs share one k_gemv_16 launch (e.g. a
  // DeltaNet layer's b and a projections); the rest run one by one.
  std::vector<const WeightView*> w16;
  std::vector<float*> y16;
  for (const MatmulOut& o : outs) {
    if (o.w->lora == nullptr && o.w->device == Device::kCuda && o.w->rows > 0 && T > 0 && is_device_ptr(o.y) &&
        CudaBackend::Impl::gemv16_ok(*o.w, xd, T) && w16.size() < kMaxGemv16 &&
        (w16.empty() || w16[0]->type == o.w->type)) {
      w16.push_back(o.w);
      y16.push_back(o.y);
      continue;
    }
    auto yo = I.out(o.y, T * o.w->rows, false);
    I.mm(*o.w, xd, T, yo.d);
    I.finish(yo);
  }
  if (!w16.empty()) I.gemv_16(w16, y16, xd, T);
}

}  // namespace spool::ops::cu
