// CudaBackend kernels and bookkeeping (see cuda_backend.h for the memory model).
//
// One kernel per op, f32 accumulation. Decode GEMVs (T <= 8): q4 weights by k_gemv_q4 (input built in
// shared memory by a fused prologue — gather, SwiGLU, Hadamard rotation — then 16-byte weight loads),
// f16/bf16 by k_gemv_16, other code widths by the element-wise k_gemv. MoE experts in q4 run as two
// grouped k_gemv_q4 launches per layer (prefill too, in jobs of <= 8 rows); with every expert readable
// by the GPU the routing stays on the device (expert_ffn_routed) and KV rows are written on the device
// (kv_append defers the host copy). Known slow spots: dense T > 8 products dequantize W into scratch
// and run cuBLAS SGEMM; attention keeps a score row per query in scratch (no flash tiling); the delta
// rule runs the recurrence for every T; a decode step is ~200 small launches (no CUDA graphs yet).
// Small host inputs go up through a pinned staging ring, so they do not stall the stream.
#include "ops/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <map>
#include <set>
#include <mutex>
#include <cmath>
#include <cstring>
#include <deque>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "ops/kv_cache.h"
#include "ops/quant_matmul.h"
#include "ops/rope.h"
#include "ops/weights.h"
#include "ops/workspace.h"

namespace spool::ops {

namespace {

void check_cuda(cudaError_t e, const char* what, int line) {
  // (cudaGetLastError clears a non-sticky error, so a refused call does not fail the next launch check)
  if (e != cudaSuccess) (void)cudaGetLastError();
  if (e != cudaSuccess) fail("CUDA error %s (%s) in %s (cuda_backend.cu:%d)", cudaGetErrorName(e), cudaGetErrorString(e), what, line);
}
#define CU(call) check_cuda((call), #call, __LINE__)
#define CU_LAUNCHED(what) check_cuda(cudaGetLastError(), what, __LINE__)

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cuBLAS error %d in %s", static_cast<int>(s), what);
}

// Every allocation dev_alloc made and dev_free has not given back: [start, end) by start, so that
// is_device_ptr answers for them without a CUDA call (an op checks each of its pointers; a decode
// step makes hundreds of such checks).
std::mutex g_ranges_mu;
std::map<uintptr_t, uintptr_t> g_ranges;

void* dev_alloc(size_t n) {
  void* p = nullptr;
  if (n == 0) n = 1;
  if (cudaMalloc(&p, n) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_ranges_mu);
  g_ranges[reinterpret_cast<uintptr_t>(p)] = reinterpret_cast<uintptr_t>(p) + n;
  return p;
}
void dev_free(void* p) {
  if (p == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(g_ranges_mu);
    g_ranges.erase(reinterpret_cast<uintptr_t>(p));
  }
  (void)cudaFree(p);
}
// Whether p lies in an allocation of dev_alloc's.
bool in_dev_alloc(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_ranges_mu);
  auto it = g_ranges.upper_bound(a);
  if (it == g_ranges.begin()) return false;
  --it;
  return a < it->second;
}
// Synchronous copy between any host / device memory (after the device's queued work: the legacy
// default stream orders it after the backend's blocking stream).
void dev_copy(void* dst, const void* src, size_t n) {
  if (n == 0) return;
  check_cuda(cudaMemcpy(dst, src, n, cudaMemcpyDefault), "cudaMemcpy (device buffer)", __LINE__);
}

// Whether p is device memory (cudaMalloc / managed); host memory (pageable or pinned) is not.
std::atomic<uint64_t> g_pointer_queries{0};  // cudaPointerGetAttributes calls (SPOOL_CUDA_PROFILE reports them)

bool is_device_ptr(const void* p) {
  if (p == nullptr) return false;
  if (in_dev_alloc(p)) return true;
  ++g_pointer_queries;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

constexpr size_t kAlignDev = 256;
// Threads of a one-block-per-row kernel over rows of n: long rows (a hidden state) get 1024, so
// each thread's loop is a couple of loads rather than a chain of dependent ones. (By n alone: a
// row's reduction order, hence its bits, do not depend on how many rows share the launch.)
unsigned row_threads(int64_t n) { return n >= 2048 ? 1024u : 256u; }
size_t round_up(size_t n, size_t a = kAlignDev) { return (n + a - 1) / a * a; }
unsigned blocks_for(int64_t n, int threads = 256) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, 1 << 20)));
}

// Bump allocator of device scratch, reset at the start of every public op (all work is ordered on
// one stream, so memory freed by reset() is reused only by later work). Grows by adding blocks;
// reset() merges them into one (synchronizing first, since earlier work may still read them).
class Arena {
 public:
  explicit Arena(cudaStream_t s) : s_(s) {}
  ~Arena() {
    for (Block& b : blocks_) dev_free(b.p);
  }
  void* get(size_t bytes) {
    bytes = round_up(std::max<size_t>(bytes, 1));
    if (!blocks_.empty() && blocks_.back().used + bytes <= blocks_.back().cap) {
      Block& b = blocks_.back();
      void* p = static_cast<char*>(b.p) + b.used;
      b.used += bytes;
      return p;
    }
    const size_t cap = std::max(bytes, blocks_.empty() ? size_t{8} << 20 : 2 * blocks_.back().cap);
    void* p = dev_alloc(cap);
    if (p == nullptr) fail("cuda backend: out of device memory for %zu bytes of scratch", cap);
    blocks_.push_back({p, cap, bytes});
    return p;
  }
  template <class T>
  T* get_n(int64_t n) {
    return static_cast<T*>(get(static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T)));
  }
  struct Mark {
    size_t block, used;
  };
  Mark mark() const { return blocks_.empty() ? Mark{0, 0} : Mark{blocks_.size() - 1, blocks_.back().used}; }
  // Gives back what was taken after m (blocks added since stay, empty, until reset()).
  void release(Mark m) {
    if (blocks_.empty()) return;
    if (m.block == blocks_.size() - 1) {
      blocks_.back().used = m.used;
    } else {
      for (size_t i = m.block + 1; i < blocks_.size(); ++i) blocks_[i].used = 0;
    }
  }
  void reset() {
    if (blocks_.size() > 1) {
      size_t total = 0;
      for (Block& b : blocks_) total += b.cap;
      CU(cudaStreamSynchronize(s_));
      for (Block& b : blocks_) dev_free(b.p);
      blocks_.clear();
      void* p = dev_alloc(total);
      if (p == nullptr) fail("cuda backend: out of device memory for %zu bytes of scratch", total);
      blocks_.push_back({p, total, 0});
    } else if (!blocks_.empty()) {
      blocks_[0].used = 0;
    }
  }

 private:
  struct Block {
    void* p;
    size_t cap, used;
  };
  cudaStream_t s_;
  std::vector<Block> blocks_;
};

// ---- Device views of weights --------------------------------------------------------------------

enum WKindDev : int { kWF32 = 0, kWF16 = 1, kWBF16 = 2, kWQuant = 3, kWMxfp4 = 4 };

struct WDev {
  int kind;
  int qtype;  // QType as int (quant only)
  int64_t rows, cols;
  int group;
  int64_t ng;  // groups per row
  int gb;      // bytes per packed group
  const void* data;
  const uint8_t* q;
  const uint16_t* scales;
  const float* cb;
  const uint8_t* mxs;  // kWMxfp4: E8M0 scales [rows, cols/32] (data = blocks [rows, cols/32, 16])
};

// ggml block weights (GGUF checkpoints) have no CUDA kernels yet: a clear error, never a guess.
void check_supported(const WeightView& w) {
  if (w.type == WType::kGgml)
    fail("cuda backend: weight %s is in a ggml block type (GGUF), which has no CUDA kernels yet; run it with --device cpu",
         w.name ? w.name : "(unnamed)");
}

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
  const int b = type == static_cast<int>(QType::kQ2) ? 2 : type == static_cast<int>(QType::kQ3) ? 3 : 4;
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

// ---- Kernels -----------------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float part[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) part[wid] = v;
  __syncthreads();
  if (wid == 0) {
    float s = lane < nw ? part[lane] : 0.0f;
    s = warp_sum(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}
__device__ float block_max(float v) {
  __shared__ float part[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) part[wid] = v;
  __syncthreads();
  if (wid == 0) {
    float s = lane < nw ? part[lane] : -INFINITY;
    s = warp_max(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

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
constexpr int kMaxGemvT = 8;
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

// One q4 GEMV job: y [T, rows] = x' [T, cols] W^T for a q4 weight (codes 2 per byte, low nibble
// first; f16 scales per group; a 16-entry f32 codebook). x' is built by k_gemv_q4's prologue in
// shared memory: row t is x row tok[t] (t without tok), then silu(x) * x2 when x2 is set (k_swiglu's
// formula), then rotated when signs is set (k_rotate's H_blk(signs .* x) / sqrt(B), same
// butterflies), so fused and separate launches give the same bits. All jobs of a launch share rows,
// cols and group.
struct Q4Job {
  const uint8_t* q;
  const uint16_t* scales;
  const float* cb;
  const float* x;
  float* y;
  int T;
  const int64_t* tok;   // prologue: source row of x for each of the T rows (null: row t)
  const float* x2;      // prologue: SwiGLU's up rows (same rows as x), or null
  const int8_t* signs;  // prologue: the weight's rotation signs [cols], or null
};

// Decode GEMV (T <= kMaxGemvT rows of x', f32 accumulation) that reads each weight byte once in
// 16-byte loads: LPR lanes (a power of two <= 32) share a row and each takes chunks of 32 codes (4
// words) strided by LPR, so a row of 2048 codes is 2 loads per lane of a full warp and a row of 512
// is 1 load per lane of half a warp; partial sums meet by shuffles. Each word's 8 codes are looked
// up in the codebook (shared memory), dotted with x' and scaled once by their group's scale
// (group % 32 == 0: one scale per chunk). x' sits in shared memory in the chunk-interleaved order of q4_xpos, so the
// lanes of a warp read consecutive 16-byte pieces (no bank conflicts). Needs cols % 32 == 0.
//
// Position in shared memory of x' column c (per row; nch = cols / 32 chunks): the 4 floats of
// column quad (word k, half h) of chunk ch sit at ((2k + h) * nch + ch) * 4, so lane ch's float4 of
// a given (k, h) is next to lane ch + 1's.
__device__ __forceinline__ int q4_xpos(int c, int nch) {
  const int ch = c >> 5, k = (c >> 3) & 3, h = (c >> 2) & 1;
  return (((k << 1) | h) * nch + ch) * 4 + (c & 3);
}

// R consecutive rows r0 .. r0 + R - 1 per group of LPR lanes: each chunk of x' (one float4 pair per
// word and row of x') is read from shared memory once for the R rows, whose weight chunks are all
// loaded first (R 16-byte loads in flight per lane). Row r's products and their order depend only
// on cols (LPR) and the row itself, not on R, TM or the job's other rows.
template <int LPR, int R, int TM>
__device__ __forceinline__ void gemv_q4_rows(const Q4Job& j, const float* cbs, const float* xs, int64_t rows, int64_t cols, int group,
                                             int64_t r0, const uint4 (&pre)[R], bool use_pre) {
  const int sub = threadIdx.x & (LPR - 1);
  const int nch = static_cast<int>(cols / 32);
  const int64_t ng = cols / group;
  const int T = TM == 1 ? 1 : j.T;
  const uint4* qr[R];
  const uint16_t* sr[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int64_t rr = min(r0 + i, rows - 1);  // (rows past the last run it again for the shuffles, store nothing)
    qr[i] = reinterpret_cast<const uint4*>(j.q + rr * (cols / 2));
    sr[i] = j.scales + rr * ng;
  }
  float acc[R][TM];
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int t = 0; t < TM; ++t) acc[i][t] = 0.0f;
  for (int c = sub; c < nch; c += LPR) {
    uint4 wq[R];
#pragma unroll
    for (int i = 0; i < R; ++i) wq[i] = use_pre && c == sub ? pre[i] : __ldg(qr[i] + c);
    float sc[R];  // (group % 32 == 0: one scale per chunk of 32 codes)
#pragma unroll
    for (int i = 0; i < R; ++i) sc[i] = __half2float(__ushort_as_half(__ldg(sr[i] + (c * 32) / group)));
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float wv[R][8];
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const uint32_t w = k == 0 ? wq[i].x : k == 1 ? wq[i].y : k == 2 ? wq[i].z : wq[i].w;
#pragma unroll
        for (int e = 0; e < 8; ++e) wv[i][e] = cbs[(w >> (4 * e)) & 15u];
      }
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
// q4_xpos order.
__device__ __forceinline__ void fwht_smem_q4(float* v, int n, int B, int nch) {
  __syncthreads();
  for (int s = 0; (1 << s) < B; ++s) {
    const int h = 1 << s;
    for (int idx = threadIdx.x; idx < n / 2; idx += blockDim.x) {
      const int i = ((idx >> s) << (s + 1)) + (idx & (h - 1));
      const int pi = q4_xpos(i, nch), ph = q4_xpos(i + h, nch);
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
// pairs and operations (so the same bits as fwht_smem_q4 and k_rotate), mostly in registers.
// Thread t holds columns [t E, t E + E): stages 0 .. log2(E) - 1 run in its registers, the next
// five across the lanes of its warp (shuffles: the lower column of a pair takes a + c, the upper
// a - c), then the last four (the columns' top 4 bits, across the 16 warps) on n / 16 runs of 16
// columns read back from shared memory, scaled by norm as they are written (q4_xpos order).
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
    if (k < E) v[q4_xpos(i0 + k, nch)] = r[k];
  __syncthreads();
  const int Q = n / 16;  // column c = j + k Q: k holds the top 4 bits
  for (int j = t; j < Q; j += kGemvThreads) {
    float u[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) u[k] = v[q4_xpos(j + k * Q, nch)];
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
    for (int k = 0; k < 16; ++k) v[q4_xpos(j + k * Q, nch)] = u[k] * norm;
  }
}

// y = x' W^T for one job (jobs == null: `one`) or many (blockIdx.y picks the job: all experts'
// projections of an MoE layer in one launch). x' is built in shared memory once per block (dynamic
// smem: T * cols floats): row t is x row tok[t] (row t without tok), then silu(x) * x2 when x2 is
// set (k_swiglu's formula), then rotated when signs is set (k_rotate's arithmetic), so the products
// are those of separate launches. Blocks of kGemvThreads cover kGemvThreads / LPR * R rows at a
// time and stride over the row blocks by gridDim.x: a grid of about one block per SM (per job) builds
// x' rarely. TM: 1 (T == 1) or kMaxGemvT (any T up to it).
constexpr size_t kGemvStaticSmem = 16 * sizeof(float);  // k_gemv_q4's codebook (beside the dynamic x')
// Rows per lane group R: 4 or 1 for one row of x' (decode; 1 spreads a small weight over more
// blocks), 2 for up to kMaxGemvT rows of x' (registers).
template <int LPR, int TM, int R>
__global__ void __launch_bounds__(kGemvThreads, 1) k_gemv_q4(const Q4Job* jobs, Q4Job one, int64_t rows, int64_t cols, int group, int64_t B,
                                                           float norm) {
  const Q4Job j = jobs != nullptr ? jobs[blockIdx.y] : one;
  extern __shared__ float xs[];
  __shared__ float cbs[16];
  const int64_t rpb = kGemvThreads / LPR * R, nrb = (rows + rpb - 1) / rpb;
  const int n = static_cast<int>(cols), nch = n / 32;
  // The first chunk of this block's first rows is loaded before the prologue (its latency overlaps it).
  uint4 pre[R];
  const int sub = threadIdx.x & (LPR - 1);
  const int64_t r_first = static_cast<int64_t>(blockIdx.x) * rpb + threadIdx.x / LPR * R;
  const bool prefetch = blockIdx.x < nrb && sub < nch;
  if (prefetch) {
#pragma unroll
    for (int i = 0; i < R; ++i) pre[i] = __ldg(reinterpret_cast<const uint4*>(j.q + min(r_first + i, rows - 1) * (cols / 2)) + sub);
  }
  if (threadIdx.x < 16) cbs[threadIdx.x] = j.cb[threadIdx.x];
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
      v[q4_xpos(i, nch)] = e;
    }
    if (j.signs != nullptr) {
      fwht_smem_q4(v, n, static_cast<int>(B), nch);
      for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] *= norm;  // (every element once: order does not matter)
    }
  }
  __syncthreads();
  for (int64_t rb = blockIdx.x; rb < nrb; rb += gridDim.x)
    gemv_q4_rows<LPR, R, TM>(j, cbs, xs, rows, cols, group, rb * rpb + threadIdx.x / LPR * R,
                             pre, rb == blockIdx.x && prefetch);
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

// out[(r - r0) * cols + c] = W[r, c] for rows [r0, r0 + nr).
__global__ void k_dequant(WDev w, int64_t r0, int64_t nr, float* out) {
  const int64_t n = nr * w.cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = wval(w, r0 + i / w.cols, i % w.cols);
}

// xg[i, :] = x[tok[i], :] for n rows of H.
__global__ void k_gather(const float* x, const int64_t* tok, int64_t n, int64_t H, float* xg) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n * H; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    xg[i] = x[tok[i / H] * H + i % H];
}

__global__ void k_swiglu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = silu_f(gate[i]) * up[i];
}

// gpt-oss clamped SwiGLU (ops::clamped_swiglu): u [n, 2I] interleaved, bias [2I] or null -> out [n, I].
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

__global__ void k_add(float* y, const float* x, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

// y[r, c] += b[c] over rows of n (grid-stride over rows * n elements).
__global__ void k_add_bias(float* y, const float* b, int64_t rows, int64_t n) {
  const int64_t total = rows * n;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += b[i % n];
}

__global__ void k_mul_sigmoid(float* x, const float* g, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] *= sigmoid_f(g[i]);
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

// One block per token: softmax over E logits, the k best (ties: lower id), their probabilities
// (renormalised over the k when asked) and the margin p_k - p_{k+1}. Selection compares logits
// (same order as the probabilities). Dynamic smem: E floats + E bytes.
constexpr int kMaxTopK = 64;
[[maybe_unused]] constexpr int kMaxRoutedPairs = static_cast<int>(CudaBackend::kMaxRoutedPairs);  // (one block builds the job lists)
__global__ void k_route(const float* logits, int E, int k, bool renorm, int* ids, float* weights, float* margins) {
  extern __shared__ float sm[];
  float* l = sm;
  unsigned char* taken = reinterpret_cast<unsigned char*>(sm + E);
  __shared__ int sel[kMaxTopK + 1];
  __shared__ float wv[32];
  __shared__ int wi[32];
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
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int s = 0; s < n_sel; ++s) {
    float bv = -INFINITY;
    int bi = INT_MAX;
    for (int e = threadIdx.x; e < E; e += blockDim.x)
      if (!taken[e]) better(bv, bi, l[e], e);
    for (int o = 16; o > 0; o >>= 1) better(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    if (lane == 0) {
      wv[wid] = bv;
      wi[wid] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float v = wv[0];
      int i = wi[0];
      for (int w = 1; w < nw; ++w) better(v, i, wv[w], wi[w]);
      sel[s] = i;
      taken[i] = 1;
    }
    __syncthreads();
  }
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

// One routed expert of a device table (CudaBackend::make_expert_table): gate, up, down q4 parts.
struct ExpertRef {
  const uint8_t* q[3];
  const uint16_t* s[3];
  const float* cb[3];
  const int8_t* sg[3];
};

// The job lists of expert_ffn_routed from the routing ids on the device: pair p = t * K + slot runs
// expert ids[p] on token t as its own one-row jobs (gate and up jobs 2p, 2p + 1: token t's row of x,
// rotated in the GEMV's prologue; down job p: SwiGLU of the pair's gate and up rows, rotated).
// Pairs P .. P + S - 1 run the shared expert `sh` on token p - P the same way, its down rows going
// to sy [S, H].
__global__ void k_routed_jobs(const int* ids, const ExpertRef* table, int E, int64_t P, int K, int64_t H, int64_t I, const float* x,
                              float* gate, float* up, float* yd, Q4Job* jgu, Q4Job* jd, int64_t* row_of, ExpertRef sh, int64_t S,
                              float* sy) {
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= P + S) return;
  if (p >= P) {
    const int64_t t = p - P;
    const float* xt = x + t * H;
    jgu[2 * p] = Q4Job{sh.q[0], sh.s[0], sh.cb[0], xt, gate + p * I, 1, nullptr, nullptr, sh.sg[0]};
    jgu[2 * p + 1] = Q4Job{sh.q[1], sh.s[1], sh.cb[1], xt, up + p * I, 1, nullptr, nullptr, sh.sg[1]};
    jd[p] = Q4Job{sh.q[2], sh.s[2], sh.cb[2], gate + p * I, sy + t * H, 1, nullptr, up + p * I, sh.sg[2]};
    return;
  }
  const int e = min(max(ids[p], 0), E - 1);  // (ids come from k_route: always in range)
  const ExpertRef r = table[e];
  const float* xt = x + (p / K) * H;
  jgu[2 * p] = Q4Job{r.q[0], r.s[0], r.cb[0], xt, gate + p * I, 1, nullptr, nullptr, r.sg[0]};
  jgu[2 * p + 1] = Q4Job{r.q[1], r.s[1], r.cb[1], xt, up + p * I, 1, nullptr, nullptr, r.sg[1]};
  jd[p] = Q4Job{r.q[2], r.s[2], r.cb[2], gate + p * I, yd + p * H, 1, nullptr, up + p * I, r.sg[2]};
  row_of[p] = p;
}

// One block per query row (t, h) of a tile starting at token t0: scores into a scratch row,
// softmax, then out = P V. Dynamic smem: (blockDim.x / 32) * head_dim floats (the query, then the
// warps' partial P V sums); head_dim <= kMaxAttnHd.
constexpr int kMaxAttnHd = 512;
constexpr int kAttnThreads = 128;
__global__ void k_attention(const float* q, int n_heads, int group, KvDev kv, int64_t pos0, int64_t t0, float scale,
                            float* scores, int64_t ld_scores, float* out) {
  extern __shared__ float qs[];
  const int64_t qi = blockIdx.x;
  const int64_t t = t0 + qi / n_heads;
  const int h = static_cast<int>(qi % n_heads), kvh = h / group, hd = kv.hd;
  const int64_t n = pos0 + t + 1;
  const float* qr = q + (t * n_heads + h) * hd;
  for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = qr[i];
  __syncthreads();
  float* s = scores + qi * ld_scores;
  float mx = -INFINITY;
  for (int64_t p = threadIdx.x; p < n; p += blockDim.x) {
    float d = 0.0f;
    for (int i = 0; i < hd; ++i) d += qs[i] * kv_key(kv, kvh, i, p);
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
  z = block_sum(z);  // (its __syncthreads also orders the score writes before the reads below)
  const float inv = 1.0f / z;
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
      if (lane + 32 * m < hd) acc[m] += sp * kv_value(kv, kvh, p, lane + 32 * m);
  }
  __syncthreads();  // (every thread is done with qs)
  float* part = qs;  // [nw][hd] (dynamic smem holds nw * hd floats)
#pragma unroll
  for (int m = 0; m < kMaxAttnHd / 32; ++m)
    if (lane + 32 * m < hd) part[wid * hd + lane + 32 * m] = acc[m];
  __syncthreads();
  float* o = out + (t * n_heads + h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float a = 0.0f;
    for (int w = 0; w < nw; ++w) a += part[w * hd + d];
    o[d] = a * inv;
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

// One block per row. mode 0: y = x / sqrt(mean(x^2) + eps) * w; 1: x = x / sqrt(sum(x^2) + eps) * post;
// 2: x = rms_norm(x) * w * silu(z).
__global__ void __launch_bounds__(1024) k_norm(int mode, const float* x, const float* w, const float* z, int64_t n, float eps, float post, float* y) {
  const float* xr = x + blockIdx.x * n;
  float* yr = y + blockIdx.x * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss);
  if (mode == 1) {
    const float inv = 1.0f / sqrtf(ss + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * inv * post;
    return;
  }
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  if (mode == 0) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * inv * w[i];
  } else {
    const float* zr = z + blockIdx.x * n;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * inv * w[i] * silu_f(zr[i]);
  }
}

// One block per row: out[t] += sigmoid(x[t] . w) * s[t] (gate 1 without w).
__global__ void __launch_bounds__(1024) k_add_gated_rows(float* out, const float* s, const float* x, const float* w, int64_t n) {
  const int64_t t = blockIdx.x;
  float gate = 1.0f;
  if (w != nullptr) {
    float d = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) d += x[t * n + i] * w[i];
    gate = sigmoid_f(block_sum(d));
  }
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[t * n + i] += gate * s[t * n + i];
}

__global__ void k_row_to_f32(int type, const void* src, int64_t n, float* dst) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (type == kWF32) {
      dst[i] = static_cast<const float*>(src)[i];
    } else {
      const uint16_t h = static_cast<const uint16_t*>(src)[i];
      dst[i] = type == kWF16 ? __half2float(__ushort_as_half(h)) : __uint_as_float(static_cast<uint32_t>(h) << 16);
    }
  }
}

// Bytes of the device copy of w: float data, or codes | scales | codebook | signs (each aligned).
size_t weight_bytes(const WeightView& w) { return static_cast<size_t>(packed_weight_bytes(w)); }

// Copies host weight w into device memory at dst (weight_bytes(w) bytes) on stream s.
WeightView copy_weight(const WeightView& w, void* dst, cudaStream_t s) {
  return pack_weight(w, dst, Device::kCuda, [s](void* to, const void* from, size_t n) { CU(cudaMemcpyAsync(to, from, n, cudaMemcpyDefault, s)); });
}

struct KvMirror {
  uint64_t gen = 0;
  int64_t cap = -1;
  KvType type = KvType::kF32;
  int n_kv = 0, hd = 0, groups = 0;
  CudaBuffer k, v, ks, vs;
};

int kv_elem(KvType t) { return t == KvType::kF32 ? 4 : t == KvType::kF16 ? 2 : 1; }

}  // namespace

// ---- Public helpers ------------------------------------------------------------------------------

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

CudaDeviceInfo cuda_device_info(int index) {
  CudaDeviceInfo info;
  cudaDeviceProp p{};
  if (index < 0 || index >= cuda_device_count() || cudaGetDeviceProperties(&p, index) != cudaSuccess) {
    (void)cudaGetLastError();
    return info;
  }
  std::snprintf(info.name, sizeof info.name, "%s", p.name);
  info.total_bytes = p.totalGlobalMem;
  int prev = 0;
  size_t free_b = 0, total_b = 0;
  if (cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(index) == cudaSuccess) {
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) info.free_bytes = free_b;
    (void)cudaSetDevice(prev);
  }
  (void)cudaGetLastError();
  info.major = p.major;
  info.minor = p.minor;
  return info;
}

CudaBuffer::CudaBuffer(size_t bytes) : n_(bytes) {
  p_ = dev_alloc(bytes);
  if (p_ == nullptr) fail("cuda: cannot allocate %zu bytes of device memory", bytes);
}
CudaBuffer& CudaBuffer::operator=(CudaBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) dev_free(p_);
    p_ = o.p_;
    n_ = o.n_;
    o.p_ = nullptr;
    o.n_ = 0;
  }
  return *this;
}
CudaBuffer::~CudaBuffer() {
  if (p_) dev_free(p_);
}
double cuda_h2d_gbps(int index, size_t bytes, bool pinned, int reps) {
  if (index < 0 || index >= cuda_device_count()) fail("cuda: no CUDA device %d", index);
  CU(cudaSetDevice(index));
  CudaBuffer d(bytes);
  void* h = nullptr;
  std::vector<uint8_t> pageable;
  if (pinned) {
    CU(cudaMallocHost(&h, bytes));
  } else {
    pageable.resize(bytes);
    h = pageable.data();
  }
  std::memset(h, 1, bytes);
  double best = 0;
  cudaEvent_t a, b;
  CU(cudaEventCreate(&a));
  CU(cudaEventCreate(&b));
  for (int i = 0; i < std::max(1, reps) + 1; ++i) {  // the first copy warms up
    CU(cudaEventRecord(a));
    CU(cudaMemcpy(d.get(), h, bytes, cudaMemcpyHostToDevice));
    CU(cudaEventRecord(b));
    CU(cudaEventSynchronize(b));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, a, b));
    if (i > 0 && ms > 0) best = std::max(best, static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
  }
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  if (pinned) (void)cudaFreeHost(h);
  return best;
}

void CudaBuffer::upload(const void* src, size_t n) {
  if (n > n_) fail("cuda: upload of %zu bytes into a buffer of %zu", n, n_);
  if (n) CU(cudaMemcpy(p_, src, n, cudaMemcpyHostToDevice));
}
void CudaBuffer::download(void* dst, size_t n) const {
  if (n > n_) fail("cuda: download of %zu bytes from a buffer of %zu", n, n_);
  if (n) CU(cudaMemcpy(dst, p_, n, cudaMemcpyDeviceToHost));
}

// ---- Backend state ------------------------------------------------------------------------------

struct CudaBackend::Impl {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  std::unique_ptr<Arena> arena;
  std::vector<void*> uploads;
  uint64_t uploaded = 0, staged = 0, slot_copied = 0;
  std::unordered_map<const KvCache*, KvMirror> kv;
  int smem_optin = 48 << 10;
  int64_t sms = 1;  // multiprocessors (gemv_q4 sizes its grids by them)
  std::set<const void*> raised_smem;  // kernels whose dynamic shared memory limit was raised to smem_optin
  // False once the backend is destroyed: a KV cache's deferred rows (kv_append) then cannot be fetched.
  std::shared_ptr<bool> alive = std::make_shared<bool>(true);
  std::vector<ExpertRef*> expert_tables;  // make_expert_table's device tables (freed with the backend)
  std::vector<void*> host_mapped;         // alloc_host_mapped's blocks (cudaFreeHost with the backend)
  uint64_t host_mapped_bytes = 0;
  bool sync_each = false;  // SPOOL_CUDA_SYNC=1: synchronize after every op (debugging)

  // SPOOL_CUDA_PROFILE=1: host time spent inside each public op (launches, staging copies and the
  // waits of the ops that synchronize), printed to stderr when the backend is destroyed, beside
  // the backend's lifetime: what the ops do not account for is host code between them.
  struct OpTime {
    uint64_t calls = 0;
    double seconds = 0;
    double gpu_seconds = 0;  // stream time between events recorded at the op's start and end
  };
  // Per-op events of the profile's GPU times: (op, start, end), harvested when completed.
  std::deque<std::tuple<const char*, cudaEvent_t, cudaEvent_t>> op_events;
  std::vector<cudaEvent_t> spare_op_events;
  cudaEvent_t op_ev0 = nullptr;
  void harvest_op_events(bool block) {
    while (!op_events.empty()) {
      auto [name, a, b] = op_events.front();
      if (block) {
        CU(cudaEventSynchronize(b));
      } else {
        const cudaError_t r = cudaEventQuery(b);
        if (r == cudaErrorNotReady) break;
        CU(r);
      }
      float ms = 0;
      CU(cudaEventElapsedTime(&ms, a, b));
      op_times[name].gpu_seconds += static_cast<double>(ms) * 1e-3;
      spare_op_events.push_back(a);
      spare_op_events.push_back(b);
      op_events.pop_front();
    }
  }
  cudaEvent_t op_event() {
    if (!spare_op_events.empty()) {
      cudaEvent_t e = spare_op_events.back();
      spare_op_events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    CU(cudaEventCreate(&e));
    return e;
  }
  bool profile = false;
  std::map<std::string, OpTime> op_times;
  const char* op = nullptr;
  std::chrono::steady_clock::time_point op_t0, created = std::chrono::steady_clock::now();

  // Weight-slot copies (copy_weight_into) run on their own stream, so they overlap the compute
  // stream's kernels. Each copy first waits on an event recorded on the compute stream (the
  // kernels issued before it, which may read the slot's old contents); weight_copy_fence()
  // records an event on the copy stream (a ticket), and wait_weight_copies() makes the compute
  // stream wait on it, between two timing events whose distance is the stall.
  cudaStream_t copy_stream = nullptr;
  cudaEvent_t compute_point = nullptr;     // reused: "compute work issued so far"
  uint64_t next_ticket = 1, done_ticket = 0, last_fence = 0;
  bool copies_since_fence = false;
  std::deque<std::pair<uint64_t, cudaEvent_t>> fences;  // tickets not known complete, ascending
  std::vector<cudaEvent_t> spare_events;                 // completed fence events for reuse
  std::deque<std::pair<cudaEvent_t, cudaEvent_t>> stalls;  // timing events around compute waits
  std::vector<cudaEvent_t> spare_timing;
  double stall_s = 0;

  cudaEvent_t take_event(bool timing) {
    std::vector<cudaEvent_t>& pool = timing ? spare_timing : spare_events;
    if (!pool.empty()) {
      cudaEvent_t e = pool.back();
      pool.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    CU(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
    return e;
  }
  // Drops the fences that have completed (all of them with `block`... up to `upto`).
  void poll_fences(uint64_t upto, bool block) {
    while (!fences.empty()) {
      auto [t, e] = fences.front();
      if (block && t <= upto) {
        CU(cudaEventSynchronize(e));
      } else {
        const cudaError_t r = cudaEventQuery(e);
        if (r == cudaErrorNotReady) break;
        CU(r);
      }
      done_ticket = t;
      spare_events.push_back(e);
      fences.pop_front();
    }
  }
  // Adds the stall of the compute-stream waits that have completed.
  void harvest_stalls() {
    while (!stalls.empty()) {
      auto [a, b] = stalls.front();
      const cudaError_t r = cudaEventQuery(b);
      if (r == cudaErrorNotReady) break;
      CU(r);
      float ms = 0;
      CU(cudaEventElapsedTime(&ms, a, b));
      stall_s += static_cast<double>(ms) * 1e-3;
      spare_timing.push_back(a);
      spare_timing.push_back(b);
      stalls.pop_front();
    }
  }

  // Start of a public op: scratch of the previous op is free again.
  void begin(const char* name = nullptr) {
    arena->reset();
    if (profile) {
      if (op != nullptr && op_ev0 != nullptr) spare_op_events.push_back(op_ev0);  // (an op that returned before end())
      op = name;
      op_t0 = std::chrono::steady_clock::now();
      if (name != nullptr) {
        op_ev0 = op_event();
        CU(cudaEventRecord(op_ev0, stream));
      }
    }
  }
  void end() {
    if (sync_each) CU(cudaStreamSynchronize(stream));
    if (profile && op != nullptr) {
      OpTime& t = op_times[op];
      ++t.calls;
      t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - op_t0).count();
      cudaEvent_t e1 = op_event();
      CU(cudaEventRecord(e1, stream));
      op_events.emplace_back(op, op_ev0, e1);
      if (op_events.size() > 4096) harvest_op_events(false);
      op = nullptr;
    }
  }
  void report() const {
    const_cast<Impl*>(this)->harvest_op_events(true);
    const double life = std::chrono::duration<double>(std::chrono::steady_clock::now() - created).count();
    double total = 0, gpu = 0;
    std::vector<std::pair<double, std::string>> rows;
    for (const auto& [name, t] : op_times) {
      total += t.seconds;
      gpu += t.gpu_seconds;
      rows.emplace_back(t.gpu_seconds, name);
    }
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "cuda profile: %.3f s host / %.3f s stream time in backend ops of a %.3f s backend lifetime; %llu pointer queries\n",
                 total, gpu, life, (unsigned long long)g_pointer_queries.load());
    for (const auto& [g, name] : rows) {
      const OpTime& t = op_times.at(name);
      const double n = static_cast<double>(std::max<uint64_t>(t.calls, 1));
      std::fprintf(stderr, "  %-24s %9llu calls  host %8.3f s %8.2f us/call  stream %8.3f s %8.2f us/call\n", name.c_str(),
                   (unsigned long long)t.calls, t.seconds, 1e6 * t.seconds / n, g, 1e6 * g / n);
    }
  }

  // Pinned staging ring for host->device copies: a copy from pageable memory makes the host wait
  // until the stream has drained, so each small per-op upload (routing rows, expert token
  // lists, host parameters) would stall the queue. Host bytes are first put in the ring (a
  // memcpy) and copied from there asynchronously; when the ring wraps, the stream is
  // synchronized first, so no queued copy still reads the bytes being overwritten.
  static constexpr size_t kPinnedRing = size_t{16} << 20;
  uint8_t* pinned = nullptr;
  size_t pinned_at = 0;
  void h2d(void* dst, const void* src, size_t bytes) {
    if (pinned == nullptr || bytes > kPinnedRing / 4) {
      CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
      return;
    }
    size_t at = round_up(pinned_at, 64);
    if (at + bytes > kPinnedRing) {
      CU(cudaStreamSynchronize(stream));
      at = 0;
    }
    std::memcpy(pinned + at, src, bytes);
    CU(cudaMemcpyAsync(dst, pinned + at, bytes, cudaMemcpyHostToDevice, stream));
    pinned_at = at + bytes;
  }

  // A device pointer holding n elements of p: p itself when it is device memory, else a copy.
  // `count` says whether this is a slow-path staging (activations) or a contract parameter.
  template <class T>
  const T* in(const T* p, int64_t n, bool count = true) {
    if (p == nullptr || n <= 0 || is_device_ptr(p)) return p;
    T* d = arena->get_n<T>(n);
    h2d(d, p, static_cast<size_t>(n) * sizeof(T));
    if (count) staged += static_cast<uint64_t>(n) * sizeof(T);
    return d;
  }
  // An output (copy_in: in/out) buffer: the device pointer to write; finish() copies it back.
  template <class T>
  struct Out {
    T* host = nullptr;
    T* d = nullptr;
    int64_t n = 0;
  };
  template <class T>
  Out<T> out(T* p, int64_t n, bool copy_in, bool count = true) {
    Out<T> o;
    o.n = n;
    if (p == nullptr || n <= 0 || is_device_ptr(p)) {
      o.d = p;
      return o;
    }
    o.host = p;
    o.d = arena->get_n<T>(n);
    if (copy_in) h2d(o.d, p, static_cast<size_t>(n) * sizeof(T));
    if (count) staged += static_cast<uint64_t>(n) * sizeof(T) * (copy_in ? 2 : 1);
    return o;
  }
  template <class T>
  void finish(const Out<T>& o) {
    if (o.host == nullptr) return;
    copy_back(o);
    CU(cudaStreamSynchronize(stream));
  }
  // finish() without the wait: several outputs copied back, then one synchronization.
  template <class T>
  void copy_back(const Out<T>& o) {
    if (o.host == nullptr) return;
    CU(cudaMemcpyAsync(o.host, o.d, static_cast<size_t>(o.n) * sizeof(T), cudaMemcpyDeviceToHost, stream));
  }

  // A device view of w: w itself when uploaded, else a copy in scratch for this op.
  WeightView dev_weight(const WeightView& w) {
    check_supported(w);
    if (w.type == WType::kQuant) validate(w.quant);
    if (w.device == Device::kCuda) return w;
    const size_t n = weight_bytes(w);
    staged += n;
    return copy_weight(w, arena->get(n), stream);
  }

  cublasHandle_t cublas() {
    if (blas == nullptr) {
      check_blas(cublasCreate(&blas), "cublasCreate");
      check_blas(cublasSetStream(blas, stream), "cublasSetStream");
      check_blas(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");  // no TF32: f32 products stay f32
    }
    return blas;
  }

  // x_rot[t] = H_blk(signs .* x[t]) for T rows of n (device pointers).
  void rotate(const int8_t* signs, const float* x, int64_t T, int64_t n, float* out) {
    const int64_t B = n & -n;
    const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(B)));
    const size_t smem = static_cast<size_t>(n) * sizeof(float);
    if (smem > static_cast<size_t>(smem_optin))
      fail("cuda backend: a rotated input of %lld columns needs %zu bytes of shared memory (device has %d)", (long long)n, smem, smem_optin);
    if (smem > (48 << 10)) CU(cudaFuncSetAttribute(k_rotate, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    k_rotate<<<static_cast<unsigned>(T), fwht_threads(n), smem, stream>>>(x, signs, n, B, norm, out);
    CU_LAUNCHED("k_rotate");
  }

  // Launches k_gemv_q4 over n_jobs jobs (the device table `jobs`, or `one` when jobs is null), each
  // of at most t_max rows (t_max <= q4_rows_fit(cols)), all [rows, cols] with groups of `group`
  // (a multiple of 32); about one block per SM in all, each covering several row blocks.
  void gemv_q4(const Q4Job* jobs, const Q4Job& one, int64_t n_jobs, int t_max, int64_t rows, int64_t cols, int group) {
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
    const auto by_lpr = [&](auto tm, auto r) {
      constexpr int TM = decltype(tm)::value, RR = decltype(r)::value;
      switch (lpr) {
        case 1: go(k_gemv_q4<1, TM, RR>); break;
        case 2: go(k_gemv_q4<2, TM, RR>); break;
        case 4: go(k_gemv_q4<4, TM, RR>); break;
        case 8: go(k_gemv_q4<8, TM, RR>); break;
        case 16: go(k_gemv_q4<16, TM, RR>); break;
        default: go(k_gemv_q4<32, TM, RR>); break;
      }
    };
    using I1 = std::integral_constant<int, 1>;
    if (R == 2) {
      by_lpr(std::integral_constant<int, kMaxGemvT>{}, std::integral_constant<int, 2>{});
    } else if (R == 4) {
      by_lpr(I1{}, std::integral_constant<int, 4>{});
    } else {
      by_lpr(I1{}, I1{});
    }
    CU_LAUNCHED("k_gemv_q4");
  }
  // Whether k_gemv_16 takes w with T rows of x (device pointers).
  static bool gemv16_ok(const WeightView& w, const float* x, int64_t T) {
    return T <= kMaxGemvT && w.cols % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
           (w.type == WType::kBF16 || w.type == WType::kF16) && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
  }
  // y_i [T, rows_i] = x [T, cols] W_i^T for 1..kMaxGemv16 device weights of one type and width
  // (gemv16_ok each) in one k_gemv_16 launch: 64-thread blocks (2 rows) while that leaves the
  // SMs idle, so small weights spread over more of them.
  void gemv_16(std::span<const WeightView* const> ws, std::span<float* const> ys, const float* x, int64_t T) {
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

  // Rows of x a fused-prologue GEMV job of `cols` columns may take (<= kMaxGemvT; 0: none fit).
  int q4_rows_fit(int64_t cols) const {
    const int64_t room = static_cast<int64_t>(smem_optin) - static_cast<int64_t>(kGemvStaticSmem);
    return static_cast<int>(std::clamp<int64_t>(room / (4 * std::max<int64_t>(cols, 1)), 0, kMaxGemvT));
  }

  // The grouped path of expert_ffn (SwiGLU experts in q4 on the device, one shape): two launches for
  // all experts instead of eight per expert — every gate and up GEMV in one grouped launch (each
  // job gathers its tokens' rows of x and rotates them with its weight's signs in the prologue),
  // then every down GEMV (prologue: SwiGLU of the gate and up rows, rotated). An expert with more
  // rows than a job takes (q4_rows_fit) runs as several jobs: each row's arithmetic does not depend
  // on the other rows of its job, so the results are the same bits as one row per job (the routed
  // path's). Returns false (nothing launched) when the experts do not qualify.
  bool expert_ffn_grouped(std::span<const ExpertMats> experts, const ExpertGroups& groups, size_t g0, const float* xd,
                          const std::vector<int64_t>& tok, int64_t H, float* yd) {
    const ExpertMats& e0 = experts[0];
    const int64_t I = e0.gate.rows;
    const int64_t r_begin = groups.first[g0];
    const int per_job = q4_rows_fit(std::max(H, I));
    const int64_t R = static_cast<int64_t>(tok.size());
    if (per_job < 1 || R == 0) return false;
    for (const ExpertMats& e : experts)
      if (!q4_expert_ok(e, H, I, e0.gate.quant.group, e0.down.quant.group, false)) return false;
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
        const size_t o_jd = round_up(2 * n_jobs * sizeof(Q4Job), 16), bytes = o_jd + n_jobs * sizeof(Q4Job);
        std::vector<uint8_t> blob(bytes);
        uint8_t* dblob = arena->get_n<uint8_t>(static_cast<int64_t>(bytes));
        auto* hjgu = reinterpret_cast<Q4Job*>(blob.data());
        auto* hjd = reinterpret_cast<Q4Job*>(blob.data() + o_jd);
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
            hjgu[2 * k] = Q4Job{e.gate.quant.qweight, e.gate.quant.scales, e.gate.quant.codebook, xd, gate + r0 * I, n, dtok + r0, nullptr,
                                e.gate.quant.signs};
            hjgu[2 * k + 1] = Q4Job{e.up.quant.qweight, e.up.quant.scales, e.up.quant.codebook, xd, up + r0 * I, n, dtok + r0, nullptr,
                                    e.up.quant.signs};
            hjd[k] = Q4Job{e.down.quant.qweight, e.down.quant.scales, e.down.quant.codebook, gate + r0 * I, yd + r0 * H, n, nullptr,
                           up + r0 * I, e.down.quant.signs};
          }
        }
        h2d(dblob, blob.data(), bytes);
        grouped_swiglu(reinterpret_cast<const Q4Job*>(dblob), reinterpret_cast<const Q4Job*>(dblob + o_jd), n_jobs, t_max, H, I,
                       e0.gate.quant.group, e0.down.quant.group);
        arena->release(mark);
      }
      j0 = j1;
    }
    return true;
  }

  // The launches of a grouped q4 SwiGLU FFN once its job tables are on the device: the gate|up GEMV
  // jobs (2 * n_jobs, [I, H], groups of group_gu), then the down jobs (n_jobs, [H, I], group_d), each
  // of at most t_max rows, inputs built in the prologue.
  void grouped_swiglu(const Q4Job* jgu, const Q4Job* jd, int64_t n_jobs, int t_max, int64_t H, int64_t I, int group_gu, int group_d) {
    gemv_q4(jgu, Q4Job{}, 2 * n_jobs, t_max, I, H, group_gu);
    gemv_q4(jd, Q4Job{}, n_jobs, t_max, H, I, group_d);
  }

  // Whether expert e's gate [I, H], up [I, H], down [H, I] run on the grouped q4 kernels: q4 (in device
  // memory when need_device; a host view is copied up by expert_ffn_grouped), group sizes group_gu
  // (gate, up) and group_d (down), multiples of 32, 16-byte aligned codes, no biases, H and I multiples
  // of 32 whose rows fit k_gemv_q4's shared memory.
  bool q4_expert_ok(const ExpertMats& e, int64_t H, int64_t I, int group_gu, int group_d, bool need_device = true) const {
    const auto ok = [&](const WeightView& w, int64_t rows, int64_t cols, int group) {
      return w.type == WType::kQuant && (w.device == Device::kCuda || !need_device) && w.quant.type == QType::kQ4 && w.rows == rows &&
             w.cols == cols && w.quant.group == group && group % 32 == 0 &&
             (w.device != Device::kCuda || reinterpret_cast<uintptr_t>(w.quant.qweight) % 16 == 0);
    };
    return e.gate_bias == nullptr && e.down_bias == nullptr && ok(e.gate, I, H, group_gu) && ok(e.up, I, H, group_gu) && ok(e.down, H, I, group_d) &&
           H % 32 == 0 && I % 32 == 0 && q4_rows_fit(std::max(H, I)) >= 1;
  }

  // make_expert_table's tables: what expert_ffn_routed needs to know of each.
  struct TableMeta {
    int E = 0, group_gu = 0, group_d = 0;
    int64_t H = 0, I = 0;
  };
  std::map<const void*, TableMeta> table_meta;

  // y [T, rows] = x [T, cols] W^T, all device pointers (w may be a host view: copied for the call).
  void mm(const WeightView& w_in, const float* x, int64_t T, float* y) {
    if (T <= 0 || w_in.rows == 0) return;
    const Arena::Mark m = arena->mark();
    const WeightView w = dev_weight(w_in);
    const int64_t rows = w.rows, cols = w.cols;
    // q4 decode GEMV (k_gemv_q4; the rotation, if any, runs in its prologue), in launches of at most
    // q4_rows_fit(cols) rows of x (a row's result does not depend on the others of its launch).
    const int fit = q4_rows_fit(cols);
    if (T <= kMaxGemvT && fit >= 1 && w.type == WType::kQuant && w.quant.type == QType::kQ4 && cols % 32 == 0 && w.quant.group % 32 == 0 &&
        reinterpret_cast<uintptr_t>(w.quant.qweight) % 16 == 0) {
      for (int64_t t0 = 0; t0 < T; t0 += fit) {
        const int n = static_cast<int>(std::min<int64_t>(fit, T - t0));
        const Q4Job one{w.quant.qweight, w.quant.scales, w.quant.codebook, x + t0 * cols, y + t0 * rows, n, nullptr, nullptr, w.quant.signs};
        gemv_q4(nullptr, one, 1, n, rows, cols, w.quant.group);
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

  // The device mirror of `c`, brought up to date with the host copy when its generation moved.
  KvMirror& mirror(const KvCache& c, bool refresh) {
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

  // Copies rows [p0, p0 + n) (positions base() + p0 ...) of the host cache into its mirror.
  void upload_rows(const KvCache& c, KvMirror& m, int64_t p0, int64_t n) {
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

  // The kernels' view of a mirror of `c`.
  static KvDev kv_dev(const KvCache& c, const KvMirror& m) {
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

  // Copies rows [lo, hi) of c's mirror into c's host storage (the inverse of upload_rows; the
  // RowFetch of kv_append's deferred rows). Waits for the queued work that writes them.
  void download_rows(KvCache& c, int64_t lo, int64_t hi) {
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
};

CudaBackend::CudaBackend(int device_index) : impl_(std::make_unique<Impl>()) {
  const int n = cuda_device_count();
  if (device_index < 0 || device_index >= n) fail("cuda: no CUDA device %d (this machine has %d)", device_index, n);
  impl_->device = device_index;
  CU(cudaSetDevice(device_index));
  CU(cudaStreamCreate(&impl_->stream));
  CU(cudaStreamCreateWithFlags(&impl_->copy_stream, cudaStreamNonBlocking));
  CU(cudaEventCreateWithFlags(&impl_->compute_point, cudaEventDisableTiming));
  impl_->arena = std::make_unique<Arena>(impl_->stream);
  void* pinned = nullptr;
  if (cudaMallocHost(&pinned, Impl::kPinnedRing) == cudaSuccess) {
    impl_->pinned = static_cast<uint8_t*>(pinned);
  } else {
    (void)cudaGetLastError();  // no pinned ring: pageable copies (slower, same results)
  }
  CU(cudaDeviceGetAttribute(&impl_->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_index));
  int sms = 1;
  CU(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_index));
  impl_->sms = std::max(1, sms);
  const char* e = std::getenv("SPOOL_CUDA_SYNC");
  impl_->sync_each = e != nullptr && e[0] == '1';
  const char* prof = std::getenv("SPOOL_CUDA_PROFILE");
  impl_->profile = prof != nullptr && prof[0] == '1';
  set_device_allocator(Device::kCuda, DeviceAllocator{dev_alloc, dev_free, dev_copy});
}

CudaBackend::~CudaBackend() {
  if (!impl_) return;
  *impl_->alive = false;
  (void)cudaStreamSynchronize(impl_->stream);  // (no kernel may still read the tables or the mapped blocks)
  for (ExpertRef* t : impl_->expert_tables) dev_free(t);
  for (void* p : impl_->host_mapped) (void)cudaFreeHost(p);
  (void)cudaStreamSynchronize(impl_->stream);
  if (impl_->profile) impl_->report();
  for (auto& [name, a, b] : impl_->op_events) (void)cudaEventDestroy(a), (void)cudaEventDestroy(b);
  for (cudaEvent_t e : impl_->spare_op_events) (void)cudaEventDestroy(e);
  (void)cudaStreamSynchronize(impl_->copy_stream);
  for (auto& f : impl_->fences) (void)cudaEventDestroy(f.second);
  for (cudaEvent_t e : impl_->spare_events) (void)cudaEventDestroy(e);
  for (auto& st : impl_->stalls) (void)cudaEventDestroy(st.first), (void)cudaEventDestroy(st.second);
  for (cudaEvent_t e : impl_->spare_timing) (void)cudaEventDestroy(e);
  (void)cudaEventDestroy(impl_->compute_point);
  (void)cudaStreamDestroy(impl_->copy_stream);
  impl_->kv.clear();
  impl_->arena.reset();
  if (impl_->pinned) (void)cudaFreeHost(impl_->pinned);
  for (void* p : impl_->uploads) dev_free(p);
  if (impl_->blas) cublasDestroy(impl_->blas);
  (void)cudaStreamDestroy(impl_->stream);
}

void CudaBackend::synchronize() {
  CU(cudaStreamSynchronize(impl_->copy_stream));
  CU(cudaStreamSynchronize(impl_->stream));
}
uint64_t CudaBackend::staged_bytes() const { return impl_->staged; }
uint64_t CudaBackend::uploaded_bytes() const { return impl_->uploaded; }

const float* CudaBackend::upload_floats(std::span<const float> v) {
  if (v.empty() || is_device_ptr(v.data())) return v.data();
  const size_t n = v.size() * sizeof(float);
  void* p = dev_alloc(n);
  if (p == nullptr) fail("cuda: cannot allocate %zu bytes of device memory for a parameter vector", n);
  impl_->uploads.push_back(p);
  impl_->uploaded += n;
  CU(cudaMemcpy(p, v.data(), n, cudaMemcpyHostToDevice));
  return static_cast<const float*>(p);
}

WeightView CudaBackend::upload(const WeightView& w) {
  if (w.device == Device::kCuda || w.empty()) return w;
  check_supported(w);
  if (w.type == WType::kQuant) validate(w.quant);
  const size_t n = weight_bytes(w);
  void* p = dev_alloc(n);
  if (p == nullptr) fail("cuda: cannot allocate %zu bytes of device memory for a [%lld x %lld] weight", n, (long long)w.rows, (long long)w.cols);
  impl_->uploads.push_back(p);
  impl_->uploaded += n;
  const WeightView d = copy_weight(w, p, impl_->stream);
  CU(cudaStreamSynchronize(impl_->stream));  // the host view may be unmapped after return
  return d;
}

void* CudaBackend::alloc_weight_slot(uint64_t bytes) {
  void* p = dev_alloc(static_cast<size_t>(bytes));
  if (p == nullptr) fail("cuda: cannot allocate %llu bytes of device memory for a weight slot", (unsigned long long)bytes);
  impl_->uploads.push_back(p);
  impl_->uploaded += bytes;  // VRAM held (the budget counts it like uploads)
  return p;
}

WeightView CudaBackend::copy_weight_into(const WeightView& w, void* slot) {
  Impl& I = *impl_;
  check_supported(w);
  if (w.type == WType::kQuant) validate(w.quant);
  I.slot_copied += weight_bytes(w);
  // After the kernels issued so far (they may read the slot's previous contents), on the copy
  // stream: it overlaps whatever the compute stream is given next, until wait_weight_copies().
  CU(cudaEventRecord(I.compute_point, I.stream));
  CU(cudaStreamWaitEvent(I.copy_stream, I.compute_point, 0));
  I.copies_since_fence = true;
  return copy_weight(w, slot, I.copy_stream);
}

uint64_t CudaBackend::weight_copy_fence() {
  Impl& I = *impl_;
  if (!I.copies_since_fence) return I.last_fence;
  cudaEvent_t e = I.take_event(false);
  CU(cudaEventRecord(e, I.copy_stream));
  I.fences.emplace_back(I.next_ticket, e);
  I.last_fence = I.next_ticket++;
  I.copies_since_fence = false;
  return I.last_fence;
}

void CudaBackend::wait_weight_copies(uint64_t ticket) {
  Impl& I = *impl_;
  I.harvest_stalls();
  I.poll_fences(ticket, false);
  if (ticket <= I.done_ticket) return;  // finished already: nothing to wait for
  cudaEvent_t fence = nullptr;
  for (auto& [t, e] : I.fences)  // the first fence at or after the ticket covers it
    if (t >= ticket) {
      fence = e;
      break;
    }
  if (fence == nullptr) fail("cuda: wait for weight copies of ticket %llu, which was never issued", (unsigned long long)ticket);
  cudaEvent_t a = I.take_event(true), b = I.take_event(true);
  CU(cudaEventRecord(a, I.stream));
  CU(cudaStreamWaitEvent(I.stream, fence, 0));
  CU(cudaEventRecord(b, I.stream));
  I.stalls.emplace_back(a, b);
}

bool CudaBackend::weight_copies_done(uint64_t ticket, bool block) {
  Impl& I = *impl_;
  I.poll_fences(ticket, block);
  return ticket <= I.done_ticket;
}

double CudaBackend::weight_copy_stall_seconds() const {
  impl_->harvest_stalls();
  return impl_->stall_s;
}

bool CudaBackend::pin_host(void* p, uint64_t bytes) {
  if (p == nullptr || bytes == 0) return false;
  if (cudaHostRegister(p, static_cast<size_t>(bytes), cudaHostRegisterDefault) == cudaSuccess) return true;
  (void)cudaGetLastError();  // not pinned: copies from it stay pageable (slower, same bytes)
  return false;
}

void CudaBackend::unpin_host(void* p) {
  if (p != nullptr && cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

uint64_t CudaBackend::slot_copied_bytes() const { return impl_->slot_copied; }

// ---- Matrix products ------------------------------------------------------------------------------

void CudaBackend::matmul(const WeightView& w, const float* x, int64_t T, float* y) {
  Impl& I = *impl_;
  I.begin(__func__);
  const float* xd = I.in(x, T * w.cols);
  auto yo = I.out(y, T * w.rows, false);
  I.mm(w, xd, T, yo.d);
  I.finish(yo);
  I.end();
}

void CudaBackend::matmul_multi(std::span<const MatmulOut> outs, const float* x, int64_t T) {
  Impl& I = *impl_;
  I.begin(__func__);
  if (outs.empty()) return;
  const float* xd = I.in(x, T * outs[0].w->cols);
  for (const MatmulOut& o : outs)
    if (o.w->cols != outs[0].w->cols) fail("matmul_multi: weights of %lld and %lld columns share one input", (long long)outs[0].w->cols, (long long)o.w->cols);
  // Device-resident f16 / bf16 weights with device outputs share one k_gemv_16 launch (e.g. a
  // DeltaNet layer's b and a projections); the rest run one by one.
  std::vector<const WeightView*> w16;
  std::vector<float*> y16;
  for (const MatmulOut& o : outs) {
    if (o.w->device == Device::kCuda && o.w->rows > 0 && T > 0 && is_device_ptr(o.y) && Impl::gemv16_ok(*o.w, xd, T) && w16.size() < kMaxGemv16 &&
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
  I.end();
}

// ---- MoE ------------------------------------------------------------------------------------------

void CudaBackend::expert_ffn(std::span<const ExpertMats> experts, const ExpertGroups& groups, size_t g0, const float* x,
                             int64_t H, Activation act, float* y) {
  Impl& I = *impl_;
  I.begin(__func__);
  if (experts.empty()) return;
  if (g0 + experts.size() > groups.active.size()) fail("expert_ffn: experts [%zu, %zu) beyond the %zu active", g0, g0 + experts.size(), groups.active.size());
  const int64_t r_begin = groups.first[g0], r_end = groups.first[g0 + experts.size()];
  const float* xd = I.in(x, groups.T * H);
  // Rows of y written here: [r_begin, r_end) (y itself may be larger: other batches).
  auto yo = I.out(y + r_begin * H, (r_end - r_begin) * H, false);
  std::vector<int64_t> tok(static_cast<size_t>(r_end - r_begin));
  for (int64_t r = r_begin; r < r_end; ++r) tok[r - r_begin] = groups.rows[r] / groups.K;
  if (act == Activation::kSwiGLU && I.expert_ffn_grouped(experts, groups, g0, xd, tok, H, yo.d)) {
    I.finish(yo);
    I.end();
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
    switch (act) {
      case Activation::kSwiGLU:
        I.mm(e.gate, xg, n, gate);
        I.mm(e.up, xg, n, up);
        k_swiglu<<<blocks_for(n * Idim), 256, 0, I.stream>>>(gate, up, n * Idim, gate);
        CU_LAUNCHED("k_swiglu");
        break;
      case Activation::kGeluTanhGLU:  // no kernel yet: the model's CUDA path is not enabled for it
        fail("cuda backend: expert_ffn with the tanh-GELU activation (Gemma 4) has no CUDA kernel yet; run it with --device cpu");
      case Activation::kClampedSwiGLU:
        I.mm(e.gate, xg, n, up);  // [n, 2I]
        k_clamped_swiglu<<<blocks_for(n * Idim), 256, 0, I.stream>>>(up, e.gate_bias, n, Idim, gate);
        CU_LAUNCHED("k_clamped_swiglu");
        break;
    }
    float* yd = yo.d + (r0 - r_begin) * H;
    I.mm(e.down, gate, n, yd);
    if (e.down_bias != nullptr) {
      k_add_rows<<<blocks_for(n * H), 256, 0, I.stream>>>(yd, e.down_bias, n, H);
      CU_LAUNCHED("k_add_rows");
    }
    I.arena->release(m);
  }
  I.finish(yo);
  I.end();
}

void CudaBackend::moe_combine(const float* y, const ExpertGroups& groups, const float* weights, int64_t H, float* out) {
  Impl& I = *impl_;
  I.begin(__func__);
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
  I.end();
}

void* CudaBackend::alloc_host_mapped(uint64_t bytes) {
  void* p = nullptr;
  // Write-combined: the host only writes it (once); the GPU reads it over PCIe without snooping CPU caches.
  if (cudaHostAlloc(&p, std::max<uint64_t>(bytes, 1), cudaHostAllocMapped | cudaHostAllocWriteCombined) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  void* d = nullptr;
  if (cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess || d != p) {  // kernels take the host address (unified addressing)
    (void)cudaGetLastError();
    (void)cudaFreeHost(p);
    return nullptr;
  }
  impl_->host_mapped.push_back(p);
  impl_->host_mapped_bytes += bytes;
  return p;
}

uint64_t CudaBackend::host_mapped_bytes() const { return impl_->host_mapped_bytes; }

namespace {
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

const void* CudaBackend::make_expert_table(std::span<const ExpertMats> experts) {
  Impl& I = *impl_;
  if (experts.empty()) return nullptr;
  const ExpertMats& e0 = experts[0];
  const int64_t H = e0.gate.cols, Id = e0.gate.rows;
  const int group_gu = e0.gate.type == WType::kQuant ? e0.gate.quant.group : 0;
  const int group_d = e0.down.type == WType::kQuant ? e0.down.quant.group : 0;
  std::vector<ExpertRef> h(experts.size());
  for (size_t e = 0; e < experts.size(); ++e) {
    const ExpertMats& x = experts[e];
    if (!I.q4_expert_ok(x, H, Id, group_gu, group_d)) return nullptr;  // not all on the grouped q4 path: the caller groups on the host
    validate(x.gate.quant), validate(x.up.quant), validate(x.down.quant);
    h[e] = expert_ref(x);
  }
  auto* d = static_cast<ExpertRef*>(dev_alloc(h.size() * sizeof(ExpertRef)));
  if (d == nullptr) fail("cuda: out of device memory for an expert table of %zu experts", h.size());
  I.expert_tables.push_back(d);
  dev_copy(d, h.data(), h.size() * sizeof(ExpertRef));
  I.table_meta[d] = Impl::TableMeta{static_cast<int>(experts.size()), group_gu, group_d, H, Id};
  return d;
}

bool CudaBackend::routed_takes_shared(const void* table, const ExpertMats& shared, int64_t T) const {
  const Impl& I = *impl_;
  const auto it = I.table_meta.find(table);
  if (it == I.table_meta.end()) return false;
  const Impl::TableMeta& tm = it->second;
  // Up to kMaxGemvT tokens: then matmul_multi / matmul run the shared expert as GEMVs too (one-row
  // jobs give the bits of those), and a shape, type and groups the table's launches take.
  return T >= 1 && T <= kMaxGemvT && I.q4_expert_ok(shared, tm.H, tm.I, tm.group_gu, tm.group_d);
}

void CudaBackend::expert_ffn_routed(const void* table, const float* x, int64_t T, int64_t H, const int* ids, const float* weights, int K,
                                    float* out, const ExpertMats* shared, float* shared_out) {
  Impl& I = *impl_;
  I.begin(__func__);
  const auto it = I.table_meta.find(table);
  if (it == I.table_meta.end()) fail("expert_ffn_routed: not an expert table of this backend");
  const Impl::TableMeta& tm = it->second;
  const int64_t P = T * K, Id = tm.I;
  if (T <= 0) return;
  if (K < 1 || P > kMaxRoutedPairs) fail("expert_ffn_routed: %lld tokens x top-%d exceed the %d pairs of the routed path", (long long)T, K, kMaxRoutedPairs);
  if (H != tm.H) fail("expert_ffn_routed: hidden size %lld, the table's experts take %lld", (long long)H, (long long)tm.H);
  if (!is_device_ptr(ids) || !is_device_ptr(weights)) fail("expert_ffn_routed: ids and weights must be in device memory");
  if (shared != nullptr && (shared_out == nullptr || !routed_takes_shared(table, *shared, T)))
    fail("expert_ffn_routed: a shared expert this path does not take (see routed_takes_shared), or no output for it");
  if (shared != nullptr) validate(shared->gate.quant), validate(shared->up.quant), validate(shared->down.quant);
  const int64_t S = shared != nullptr ? T : 0;  // the shared expert's pairs, after the routed ones
  const float* xd = I.in(x, T * H);
  auto oo = I.out(out, T * H, false);
  auto so = I.out(shared_out, S * H, false);
  float* gate = I.arena->get_n<float>((P + S) * Id);
  float* up = I.arena->get_n<float>((P + S) * Id);
  float* yd = I.arena->get_n<float>(P * H);
  Q4Job* jgu = I.arena->get_n<Q4Job>(2 * (P + S));
  Q4Job* jd = I.arena->get_n<Q4Job>(P + S);
  int64_t* row_of = I.arena->get_n<int64_t>(P);
  const ExpertRef sh = shared != nullptr ? expert_ref(*shared) : ExpertRef{};
  constexpr int kJobThreads = 128;
  k_routed_jobs<<<static_cast<unsigned>((P + S + kJobThreads - 1) / kJobThreads), kJobThreads, 0, I.stream>>>(
      ids, static_cast<const ExpertRef*>(table), tm.E, P, K, H, Id, xd, gate, up, yd, jgu, jd, row_of, sh, S, so.d);
  CU_LAUNCHED("k_routed_jobs");
  I.grouped_swiglu(jgu, jd, P + S, 1, H, Id, tm.group_gu, tm.group_d);
  k_moe_combine<<<blocks_for(T * H), 256, 0, I.stream>>>(yd, row_of, weights, T, K, H, oo.d);
  CU_LAUNCHED("k_moe_combine");
  I.copy_back(so);
  I.copy_back(oo);
  if (so.host != nullptr || oo.host != nullptr) CU(cudaStreamSynchronize(I.stream));
  I.end();
}

void CudaBackend::route_softmax_top_k(float* logits, int64_t T, int E, int k, bool renormalize, int* ids, float* weights,
                                      float* margins) {
  Impl& I = *impl_;
  I.begin(__func__);
  if (T == 0) return;
  if (k < 1 || k > E || k > kMaxTopK) fail("routing: top-k %d must be in 1..min(%d, %d)", k, E, kMaxTopK);
  const float* ld = I.in(logits, T * E);
  auto io = I.out(ids, T * k, false, false);
  auto wo = I.out(weights, T * k, false);
  auto mo = I.out(margins, T, false);
  const size_t smem = static_cast<size_t>(E) * (sizeof(float) + 1);
  if (smem > static_cast<size_t>(I.smem_optin)) fail("routing: %d experts need more shared memory than the device has", E);
  if (smem > (48 << 10)) CU(cudaFuncSetAttribute(k_route, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  k_route<<<static_cast<unsigned>(T), 256, smem, I.stream>>>(ld, E, k, renormalize, io.d, wo.d, mo.d);
  CU_LAUNCHED("k_route");
  I.copy_back(io);
  I.copy_back(wo);
  I.copy_back(mo);
  // The host reads host outputs right after (group_by_expert): one wait for all three. Outputs in
  // device memory (expert_ffn_routed's ids) need no wait.
  if (io.host != nullptr || wo.host != nullptr || mo.host != nullptr) CU(cudaStreamSynchronize(I.stream));
  I.end();
}

// ---- Attention ------------------------------------------------------------------------------------

// The new rows are written into the cache's device mirror (k_kv_write: the host cache's element
// formats) and left there: the host rows are marked deferred (KvCache::defer_rows), and a host
// reader of the cache (a snapshot, serialization, a CPU kernel) downloads them first. A decode
// step thus makes no host round trip per attention layer.
void CudaBackend::kv_append(KvCache& cache, int64_t pos0, int64_t T, const float* k, const float* v) {
  Impl& I = *impl_;
  I.begin(__func__);
  if (T <= 0) return;
  // Rows are positions - base() (a windowed cache, ops/kv_cache.h, holds only its last rows).
  if (pos0 < cache.base() || pos0 + T - cache.base() > cache.capacity())
    fail("kv_append: positions [%lld, %lld) do not fit the cache's rows [%lld, %lld)", (long long)pos0, (long long)(pos0 + T),
         (long long)cache.base(), (long long)(cache.base() + cache.capacity()));
  const int64_t w = static_cast<int64_t>(cache.n_kv_heads()) * cache.head_dim();
  const float* kd = I.in(k, T * w);
  const float* vd = cache.keys_only() ? nullptr : I.in(v, T * w);
  KvMirror& m = I.mirror(cache, true);  // current with the host rows (uploads them when they changed)
  const KvDev d = I.kv_dev(cache, m);
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
  I.end();
}

void CudaBackend::attention(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, float* out) {
  Impl& I = *impl_;
  I.begin(__func__);
  if (T <= 0) return;
  const int hd = kv.head_dim();
  if (kv.n_kv_heads() <= 0 || n_heads % kv.n_kv_heads() != 0) fail("attention: %d heads over %d KV heads", n_heads, kv.n_kv_heads());
  if (hd > kMaxAttnHd) fail("attention: head dimension %d is above the CUDA kernel's %d", hd, kMaxAttnHd);
  // Every position from 0 is read: the cache must hold [0, pos0 + T) (row = position; a
  // windowed cache reaches here only before it first drops rows, Backend::attention_window).
  if (kv.base() != 0 || pos0 + T > kv.capacity())
    fail("attention: positions [0, %lld) are needed, the cache holds [%lld, %lld)", (long long)(pos0 + T), (long long)kv.base(),
         (long long)(kv.base() + kv.capacity()));
  const KvMirror& m = I.mirror(kv, true);
  const KvDev d = Impl::kv_dev(kv, m);
  const float* qd = I.in(q, T * n_heads * hd);
  auto oo = I.out(out, T * n_heads * hd, false);
  const int64_t nmax = pos0 + T;
  // Query tiles whose score rows fit 64 MiB of scratch.
  const int64_t tile_t = std::max<int64_t>(1, std::min<int64_t>(T, (int64_t{16} << 20) / (nmax * n_heads)));
  float* scores = I.arena->get_n<float>(tile_t * n_heads * nmax);
  for (int64_t t0 = 0; t0 < T; t0 += tile_t) {
    const int64_t nt = std::min(tile_t, T - t0);
    k_attention<<<static_cast<unsigned>(nt * n_heads), kAttnThreads, static_cast<size_t>(hd) * sizeof(float) * (kAttnThreads / 32), I.stream>>>(
        qd, n_heads, n_heads / kv.n_kv_heads(), d, pos0, t0, scale, scores, nmax, oo.d);
    CU_LAUNCHED("k_attention");
  }
  I.finish(oo);
  I.end();
}

void CudaBackend::rope(const Rope& rope, float* x, int64_t T, int64_t row_stride, int n_heads, int head_dim, int64_t pos0) {
  Impl& I = *impl_;
  I.begin(__func__);
  const int half = rope.rotary_dim() / 2;
  if (T <= 0 || half == 0) return;
  const float* inv = I.in(rope.inv_freq().data(), half, false);
  auto xo = I.out(x, (T - 1) * row_stride + static_cast<int64_t>(n_heads) * head_dim, true);
  k_rope<<<blocks_for(T * n_heads * half), 256, 0, I.stream>>>(xo.d, T, row_stride, n_heads, head_dim, half, inv, rope.scaling(), pos0);
  CU_LAUNCHED("k_rope");
  I.finish(xo);
  I.end();
}

// ---- Gated DeltaNet --------------------------------------------------------------------------------

void CudaBackend::causal_conv1d_silu(const float* x, int64_t T, int64_t C, const float* w, int K, float* state, float* out) {
  Impl& I = *impl_;
  I.begin(__func__);
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
  I.end();
}

void CudaBackend::gated_delta(const GatedDeltaArgs& a, int /*chunk*/) {
  Impl& I = *impl_;
  I.begin(__func__);
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
  I.end();
}

void CudaBackend::gdn_gates(const float* b, const float* a, const float* a_exp, const float* dt_bias, int64_t T, int n_v,
                            float* beta, float* g) {
  Impl& I = *impl_;
  I.begin(__func__);
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
  I.end();
}

// ---- Norms -----------------------------------------------------------------------------------------

void CudaBackend::rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) {
  Impl& I = *impl_;
  I.begin(__func__);
  if (rows <= 0) return;
  const float* xd = I.in(x, rows * n);
  const float* wd = I.in(w, n, false);
  auto yo = I.out(y, rows * n, false);
  k_norm<<<static_cast<unsigned>(rows), row_threads(n), 0, I.stream>>>(0, xd, wd, nullptr, n, eps, 1.0f, yo.d);
  CU_LAUNCHED("k_norm");
  I.finish(yo);
  I.end();
}

void CudaBackend::l2_norm(float* x, int64_t rows, int64_t n, float eps, float post_scale) {
  Impl& I = *impl_;
  I.begin(__func__);
  if (rows <= 0) return;
  auto xo = I.out(x, rows * n, true);
  k_norm<<<static_cast<unsigned>(rows), row_threads(n), 0, I.stream>>>(1, xo.d, nullptr, nullptr, n, eps, post_scale, xo.d);
  CU_LAUNCHED("k_norm");
  I.finish(xo);
  I.end();
}

void CudaBackend::rms_norm_gated(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) {
  Impl& I = *impl_;
  I.begin(__func__);
  if (rows <= 0) return;
  auto xo = I.out(x, rows * n, true);
  const float* zd = I.in(z, rows * n);
  const float* wd = I.in(w, n, false);
  k_norm<<<static_cast<unsigned>(rows), row_threads(n), 0, I.stream>>>(2, xo.d, wd, zd, n, eps, 1.0f, xo.d);
  CU_LAUNCHED("k_norm");
  I.finish(xo);
  I.end();
}

// ---- Elementwise -----------------------------------------------------------------------------------

void CudaBackend::add(float* y, const float* x, int64_t n) {
  Impl& I = *impl_;
  I.begin(__func__);
  if (n <= 0) return;
  const float* xd = I.in(x, n);
  auto yo = I.out(y, n, true);
  k_add<<<blocks_for(n), 256, 0, I.stream>>>(yo.d, xd, n);
  CU_LAUNCHED("k_add");
  I.finish(yo);
  I.end();
}

void CudaBackend::add_bias(float* y, const float* b, int64_t rows, int64_t n) {
  Impl& I = *impl_;
  I.begin(__func__);
  if (rows <= 0 || n <= 0) return;
  const float* bd = I.in(b, n, false);  // a parameter vector: host or uploaded
  auto yo = I.out(y, rows * n, true);
  k_add_bias<<<blocks_for(rows * n), 256, 0, I.stream>>>(yo.d, bd, rows, n);
  CU_LAUNCHED("k_add_bias");
  I.finish(yo);
  I.end();
}

void CudaBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) {
  Impl& I = *impl_;
  I.begin(__func__);
  if (n <= 0) return;
  const float* ud = I.in(up, n);
  // out may alias gate: copy gate in first when out is a host buffer.
  auto oo = I.out(out, n, out == gate);
  const float* gd = out == gate ? oo.d : I.in(gate, n);
  k_swiglu<<<blocks_for(n), 256, 0, I.stream>>>(gd, ud, n, oo.d);
  CU_LAUNCHED("k_swiglu");
  I.finish(oo);
  I.end();
}

void CudaBackend::mul_sigmoid(float* x, const float* gate, int64_t n) {
  Impl& I = *impl_;
  I.begin(__func__);
  if (n <= 0) return;
  const float* gd = I.in(gate, n);
  auto xo = I.out(x, n, true);
  k_mul_sigmoid<<<blocks_for(n), 256, 0, I.stream>>>(xo.d, gd, n);
  CU_LAUNCHED("k_mul_sigmoid");
  I.finish(xo);
  I.end();
}

void CudaBackend::add_gated_rows(float* out, const float* s, const float* x, const float* w, int64_t T, int64_t n) {
  Impl& I = *impl_;
  I.begin(__func__);
  if (T <= 0) return;
  const float* sd = I.in(s, T * n);
  const float* xd = w ? I.in(x, T * n) : nullptr;
  const float* wd = I.in(w, n, false);
  auto oo = I.out(out, T * n, true);
  k_add_gated_rows<<<static_cast<unsigned>(T), row_threads(n), 0, I.stream>>>(oo.d, sd, xd, wd, n);
  CU_LAUNCHED("k_add_gated_rows");
  I.finish(oo);
  I.end();
}

void CudaBackend::copy_2d(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) {
  Impl& I = *impl_;
  I.begin(__func__);
  if (rows <= 0 || cols <= 0) return;
  CU(cudaMemcpy2DAsync(dst, static_cast<size_t>(ld_dst) * 4, src, static_cast<size_t>(ld_src) * 4, static_cast<size_t>(cols) * 4,
                       static_cast<size_t>(rows), cudaMemcpyDefault, I.stream));
  if (!is_device_ptr(dst) || !is_device_ptr(src)) {
    I.staged += static_cast<uint64_t>(rows * cols) * 4;
    CU(cudaStreamSynchronize(I.stream));
  }
  I.end();
}

// ---- Embeddings and logits ----------------------------------------------------------------------------

void CudaBackend::row_to_f32(WType t, const void* src, int64_t n, float* dst) {
  Impl& I = *impl_;
  I.begin(__func__);
  if (n <= 0) return;
  if (t == WType::kQuant) fail("row_to_f32: rows of quantized tables cannot be read");
  const int64_t bytes = n * wtype_size(t);
  const void* sd = I.in(static_cast<const uint8_t*>(src), bytes, false);
  auto dd = I.out(dst, n, false);
  k_row_to_f32<<<blocks_for(n), 256, 0, I.stream>>>(t == WType::kF32 ? kWF32 : t == WType::kF16 ? kWF16 : kWBF16, sd, n, dd.d);
  CU_LAUNCHED("k_row_to_f32");
  I.finish(dd);
  I.end();
}

void CudaBackend::to_host(const float* src, int64_t n, float* dst) {
  Impl& I = *impl_;
  I.begin(__func__);
  if (n <= 0) return;
  CU(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * 4, cudaMemcpyDefault, I.stream));
  CU(cudaStreamSynchronize(I.stream));
  I.end();
}

}  // namespace spool::ops
