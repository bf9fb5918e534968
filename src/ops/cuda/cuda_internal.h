// Internals of CudaBackend shared by its source files (not a public header: only src/ops/cuda/*.cu
// include it). The backend is split by op family:
//
//   cuda_backend.cu      the dispatcher: constructor, destructor and every op of the Backend table,
//                        each a CudaOpScope around the op's function in its family's file
//   cuda_memory.cu       device allocations, the pinned staging ring, uploads, weight slots and
//                        their copy stream, mapped host memory, the public CUDA helpers
//   cuda_profile.cu      the op scope (scratch reset, SPOOL_CUDA_SYNC, SPOOL_CUDA_PROFILE timings)
//   cuda_gemv.cu         matrix products: decode GEMVs (q4, f16/bf16, other codes), cuBLAS GEMMs
//   cuda_moe.cu          the MoE expert path (grouped, routed) and the softmax top-k router
//   cuda_attention.cu    KV-cache device mirrors, kv_append, attention, rope
//   cuda_gdn.cu          Gated DeltaNet: causal conv1d, the delta rule, its gates
//   cuda_elementwise.cu  norms, elementwise ops, copies, row_to_f32 / to_host
//
// A kernel lives in the file of the ops that launch it (the build compiles each .cu on its own,
// CUDA_SEPARABLE_COMPILATION OFF); device helpers used by several families are inline here.
#pragma once

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "ops/cuda/cuda_backend.h"
#include "ops/kv_cache.h"
#include "ops/lora.h"
#include "ops/quant_matmul.h"
#include "ops/rope.h"
#include "ops/weights.h"
#include "ops/workspace.h"

namespace spool::ops::cu {

/// Throws spool::Error naming the failed CUDA call `what` at file:line (clears a non-sticky error
/// first, so a refused call does not fail the next launch check).
void check_cuda(cudaError_t e, const char* what, const char* file, int line);
#define CU(call) ::spool::ops::cu::check_cuda((call), #call, __FILE_NAME__, __LINE__)
#define CU_LAUNCHED(what) ::spool::ops::cu::check_cuda(cudaGetLastError(), what, __FILE_NAME__, __LINE__)

/// Throws spool::Error naming the failed cuBLAS call `what`.
inline void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cuBLAS error %d in %s", static_cast<int>(s), what);
}

/// cudaMalloc of n bytes (1 when n is 0), recorded so that is_device_ptr answers without a CUDA
/// call; nullptr when the memory cannot be had.
void* dev_alloc(size_t n);
/// Frees an allocation of dev_alloc (nullptr: nothing).
void dev_free(void* p);
/// Synchronous copy of n bytes between any host / device memory (after the device's queued work:
/// the legacy default stream orders it after the backend's blocking stream).
void dev_copy(void* dst, const void* src, size_t n);
/// Whether p is device memory (cudaMalloc / managed); host memory (pageable or pinned) is not.
bool is_device_ptr(const void* p);
/// cudaPointerGetAttributes calls made by is_device_ptr (SPOOL_CUDA_PROFILE reports them).
extern std::atomic<uint64_t> g_pointer_queries;

constexpr size_t kAlignDev = 256;
// Threads of a one-block-per-row kernel over rows of n: long rows (a hidden state) get 1024, so
// each thread's loop is a couple of loads rather than a chain of dependent ones. (By n alone: a
// row's reduction order, hence its bits, do not depend on how many rows share the launch.)
inline unsigned row_threads(int64_t n) { return n >= 2048 ? 1024u : 256u; }
inline size_t round_up(size_t n, size_t a = kAlignDev) { return (n + a - 1) / a * a; }
inline unsigned blocks_for(int64_t n, int threads = 256) {
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
inline void check_supported(const WeightView& w) {
  if (w.type == WType::kGgml)
    fail("cuda backend: weight %s is in ggml block type %s (GGUF), which has no CUDA kernels yet; run it with --device cpu",
         w.name ? w.name : "(unnamed)", ggml_type_name(w.ggml));
}

// ---- Device helpers shared by several op families -------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
struct WarpSum {
  __device__ __forceinline__ float operator()(float v) const { return warp_sum(v); }
};
struct WarpMax {
  __device__ __forceinline__ float operator()(float v) const { return warp_max(v); }
};
// Reduction over the block (blockDim.x a multiple of 32, <= 1024) with the warp reduction `warp`
// (WarpSum / WarpMax), `none` (its identity) standing in for the lanes past the last warp: each
// warp reduces, then warp 0 reduces the warps' results; every thread gets the result.
template <class Warp>
__device__ inline float block_reduce(float v, float none, Warp warp) {
  __shared__ float part[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp(v);
  __syncthreads();
  if (lane == 0) part[wid] = v;
  __syncthreads();
  if (wid == 0) {
    float s = lane < nw ? part[lane] : none;
    s = warp(s);
    if (lane == 0) total = s;
  }
  __syncthreads();
  return total;
}
// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
__device__ inline float block_sum(float v) { return block_reduce(v, 0.0f, WarpSum{}); }
// Maximum over the block (as block_sum).
__device__ inline float block_max(float v) { return block_reduce(v, -INFINITY, WarpMax{}); }

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// ---- Types and limits shared by several op families ----------------------------------------------

// Rows of x the decode GEMV kernels take at once (T <= kMaxGemvT: one launch, else cuBLAS or jobs).
constexpr int kMaxGemvT = 8;

// The format of the weights of one k_gemv_quant launch: a packed type (q2, q3, q4, q5, q6, q8) and
// its group size (a multiple of 32).
struct QFmt {
  QType type = QType::kQ4;
  int group = 0;
  bool operator==(const QFmt&) const = default;
};

// Whether k_gemv_quant takes type t (every packed type: all but ternary, whose base-3 bytes do not
// end on chunks of 32 codes), and the alignment in bytes its code rows need (16 for q4 / q8, 8 for
// q2 / q6, 4 for q3 / q5: the widest loads of a 4 * bits-byte chunk).
bool gemv_quant_type(QType t);
uintptr_t gemv_quant_align(QType t);
// The format of a quantized weight; a non-quantized one gets {ternary, 0}, which no launch takes.
inline QFmt fmt_of(const WeightView& w) { return w.type == WType::kQuant ? QFmt{w.quant.type, w.quant.group} : QFmt{QType::kTernary, 0}; }

// One quantized GEMV job: y [T, rows] = x' [T, cols] W^T for a packed weight (bits-bit codes, LSB
// first, ops::QuantView's layout; f16 scales per group; a 2^bits-entry f32 codebook). x' is built by k_gemv_quant's prologue in
// shared memory: row t is x row tok[t] (t without tok), then silu(x) * x2 when x2 is set (k_swiglu's
// formula), then rotated when signs is set (k_rotate's H_blk(signs .* x) / sqrt(B), same
// butterflies), so fused and separate launches give the same bits. All jobs of a launch share rows,
// cols and group.
struct QGemvJob {
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

// One routed expert of a device table (CudaBackend::make_expert_table): gate, up, down q4 parts.
struct ExpertRef {
  const uint8_t* q[3];
  const uint16_t* s[3];
  const float* cb[3];
  const int8_t* sg[3];
};

// Bytes of the device copy of w: float data, or codes | scales | codebook | signs (each aligned).
inline size_t weight_bytes(const WeightView& w) { return static_cast<size_t>(packed_weight_bytes(w)); }

// Copies host weight w into device memory at dst (weight_bytes(w) bytes) on stream s.
inline WeightView copy_weight(const WeightView& w, void* dst, cudaStream_t s) {
  return pack_weight(w, dst, Device::kCuda, [s](void* to, const void* from, size_t n) { CU(cudaMemcpyAsync(to, from, n, cudaMemcpyDefault, s)); });
}

// The device mirror of one KV cache (CudaBackend::Impl::mirror): the host layout, row = position - base().
struct KvMirror {
  uint64_t gen = 0;
  int64_t cap = -1;
  KvType type = KvType::kF32;
  int n_kv = 0, hd = 0, groups = 0;
  CudaBuffer k, v, ks, vs;
};

inline int kv_elem(KvType t) { return t == KvType::kF32 ? 4 : t == KvType::kF16 ? 2 : 1; }

/// out[i] = silu(gate[i]) * up[i] for i < n on `stream` (device pointers; out may alias gate):
/// k_swiglu, shared by the elementwise op and the MoE expert path (cuda_elementwise.cu).
void launch_swiglu(cudaStream_t stream, const float* gate, const float* up, int64_t n, float* out);

}  // namespace spool::ops::cu

namespace spool::ops {

using namespace cu;  // (the backend's own files: the internals above unqualified)

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
  int64_t sms = 1;  // multiprocessors (gemv_quant sizes its grids by them)
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
  void harvest_op_events(bool block);
  cudaEvent_t op_event();
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

  cudaEvent_t take_event(bool timing);
  // Drops the fences that have completed (all of them with `block`... up to `upto`).
  void poll_fences(uint64_t upto, bool block);
  // Adds the stall of the compute-stream waits that have completed.
  void harvest_stalls();

  // Strict device mode (Backend::strict_device, copied here by the dispatcher's op scope): a host
  // weight that an op would copy to the device for the one call (dev_weight) throws instead.
  bool strict = false;
  // The public op running now (its name, set by CudaOpScope; null between ops): strict mode's errors name it.
  const char* current_op = nullptr;

  // Start of a public op (CudaOpScope): scratch of the previous op is free again; the profile
  // clock starts.
  void begin(const char* name);
  // End of a public op that returned (CudaOpScope): SPOOL_CUDA_SYNC's wait, the profile's times.
  void end();
  // SPOOL_CUDA_PROFILE's table, to stderr.
  void report() const;

  // Pinned staging ring for host->device copies: a copy from pageable memory makes the host wait
  // until the stream has drained, so each small per-op upload (routing rows, expert token
  // lists, host parameters) would stall the queue. Host bytes are first put in the ring (a
  // memcpy) and copied from there asynchronously; when the ring wraps, the stream is
  // synchronized first, so no queued copy still reads the bytes being overwritten.
  static constexpr size_t kPinnedRing = size_t{16} << 20;
  uint8_t* pinned = nullptr;
  size_t pinned_at = 0;
  void h2d(void* dst, const void* src, size_t bytes);

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

  WeightView dev_weight(const WeightView& w);

  // The cuBLAS handle on the compute stream (made at first use).
  cublasHandle_t cublas();

  // ---- Matrix products (cuda_gemv.cu) ----
  // x_rot[t] = H_blk(signs .* x[t]) for T rows of n (device pointers).
  void rotate(const int8_t* signs, const float* x, int64_t T, int64_t n, float* out);
  // Launches k_gemv_quant over n_jobs jobs (the device table `jobs`, or `one` when jobs is null), each
  // of at most t_max rows (t_max <= gemv_rows_fit(cols)), all [rows, cols] in format f (a packed
  // type, groups a multiple of 32); about one block per SM in all, each covering several row blocks.
  void gemv_quant(const QGemvJob* jobs, const QGemvJob& one, int64_t n_jobs, int t_max, int64_t rows, int64_t cols, QFmt f);
  // Whether k_gemv_16 takes w with T rows of x (device pointers).
  static bool gemv16_ok(const WeightView& w, const float* x, int64_t T);
  // y_i [T, rows_i] = x [T, cols] W_i^T for 1..kMaxGemv16 device weights of one type and width
  // (gemv16_ok each) in one k_gemv_16 launch: 64-thread blocks (2 rows) while that leaves the
  // SMs idle, so small weights spread over more of them.
  void gemv_16(std::span<const WeightView* const> ws, std::span<float* const> ys, const float* x, int64_t T);
  // Rows of x a fused-prologue GEMV job of `cols` columns may take (<= kMaxGemvT; 0: none fit).
  int gemv_rows_fit(int64_t cols) const;
  // y [T, rows] = x [T, cols] W^T, all device pointers (w may be a host view: copied for the call),
  // plus w's LoRA terms (lora_add; row t's adapter scales are token row_tok[t]'s, null: t's).
  void mm(const WeightView& w_in, const float* x, int64_t T, float* y, const int64_t* row_tok = nullptr);
  // mm() without the LoRA terms.
  void mm_base(const WeightView& w_in, const float* x, int64_t T, float* y);

  // ---- LoRA (cuda_lora.cu) ----
  // Device copies of the LoRA terms' A and B^T (ops/lora.h), by host address: made at first use
  // (uploaded, like weights) and kept for the backend's life, as the adapters are the model's.
  std::unordered_map<const float*, std::pair<float*, size_t>> lora_dev;  // host -> (device copy, floats)
  const float* lora_matrix(const float* host, size_t n);
  // y [T, rows] (row stride ldy) += the terms of d over x [T, cols] (device pointers, f32 cuBLAS):
  // s(t) B (A x_t), s(t) = term.scale x the user scale of token row_tok[t] (null: t) in the
  // LoraRowScales in scope (ops::lora_rows), else the adapter's default. Throws spool::Error as
  // ops::lora_add does for scales that do not cover the rows or the adapter.
  void lora_add(const LoraDelta& d, const float* x, int64_t T, int64_t cols, float* y, int64_t rows, int64_t ldy, const int64_t* row_tok);

  // ---- MoE (cuda_moe.cu) ----
  // The grouped path of expert_ffn (SwiGLU experts in one packed format per projection, one shape): two launches for
  // all experts instead of eight per expert — every gate and up GEMV in one grouped launch (each
  // job gathers its tokens' rows of x and rotates them with its weight's signs in the prologue),
  // then every down GEMV (prologue: SwiGLU of the gate and up rows, rotated). An expert with more
  // rows than a job takes (gemv_rows_fit) runs as several jobs: each row's arithmetic does not depend
  // on the other rows of its job, so the results are the same bits as one row per job (the routed
  // path's). Returns false (nothing launched) when the experts do not qualify.
  bool expert_ffn_grouped(std::span<const ExpertMats> experts, const ExpertGroups& groups, size_t g0, const float* xd,
                          const std::vector<int64_t>& tok, int64_t H, float* yd);
  // The launches of a grouped SwiGLU FFN once its job tables are on the device: the gate|up GEMV
  // jobs (2 * n_jobs, [I, H], format gu), then the down jobs (n_jobs, [H, I], format d), each
  // of at most t_max rows, inputs built in the prologue.
  void grouped_swiglu(const QGemvJob* jgu, const QGemvJob* jd, int64_t n_jobs, int t_max, int64_t H, int64_t I, QFmt gu, QFmt d);
  // Whether expert e's gate [I, H], up [I, H], down [H, I] run on the grouped kernels: formats gu
  // (gate, up) and d (down), packed types with groups a multiple of 32 (in device memory when
  // need_device; a host view is copied up by expert_ffn_grouped), codes aligned as gemv_quant_align
  // says, no biases, H and I multiples of 32 whose rows fit k_gemv_quant's shared memory.
  bool quant_expert_ok(const ExpertMats& e, int64_t H, int64_t I, QFmt gu, QFmt d, bool need_device = true) const;
  // make_expert_table's tables: what expert_ffn_routed needs to know of each.
  struct TableMeta {
    int E = 0;
    QFmt gu, d;
    int64_t H = 0, I = 0;
  };
  std::map<const void*, TableMeta> table_meta;

  // ---- KV mirrors (cuda_attention.cu) ----
  // The device mirror of `c`, brought up to date with the host copy when its generation moved.
  KvMirror& mirror(const KvCache& c, bool refresh);
  // Copies rows [p0, p0 + n) (positions base() + p0 ...) of the host cache into its mirror.
  void upload_rows(const KvCache& c, KvMirror& m, int64_t p0, int64_t n);
  // Copies rows [lo, hi) of c's mirror into c's host storage (the inverse of upload_rows; the
  // RowFetch of kv_append's deferred rows). Waits for the queued work that writes them.
  void download_rows(KvCache& c, int64_t lo, int64_t hi);
};

// ---- The op scope -----------------------------------------------------------------------------------

/// One public op of CudaBackend (RAII; the dispatcher opens one around every op of the Backend
/// table): Impl::begin on entry (scratch of the previous op free again, the profile's clock and
/// start event), Impl::end when the op returns (SPOOL_CUDA_SYNC's wait, the profile's times). When
/// the op throws, end() is skipped (its wait could throw again during unwinding) and the next
/// begin() starts afresh. `strict` is Backend::strict_device(), for this op.
class CudaOpScope {
 public:
  CudaOpScope(CudaBackend::Impl& I, const char* name, bool strict) : I_(I), exceptions_(std::uncaught_exceptions()) {
    I_.strict = strict;
    I_.begin(name);
  }
  ~CudaOpScope() noexcept(false) {
    if (std::uncaught_exceptions() == exceptions_) {
      I_.end();
    } else {
      I_.current_op = nullptr;
    }
  }
  CudaOpScope(const CudaOpScope&) = delete;
  CudaOpScope& operator=(const CudaOpScope&) = delete;

 private:
  CudaBackend::Impl& I_;
  int exceptions_;
};

}  // namespace spool::ops

// ---- The ops, by family (the dispatcher's targets; same arguments and contracts as the Backend ---
// ---- methods of the same name, backend.h) ---------------------------------------------------------

namespace spool::ops::cu {

// cuda_gemv.cu
void matmul(CudaBackend::Impl& I, const WeightView& w, const float* x, int64_t T, float* y);
void matmul_multi(CudaBackend::Impl& I, std::span<const MatmulOut> outs, const float* x, int64_t T);
// Whether matmul_heads runs natively (k_gemv_heads): device-resident f32 / f16 / bf16 heads of one
// shape and type without LoRA, at most 128, T <= kMaxGemvT, x and y in device memory.
bool matmul_heads_native(std::span<const WeightView> w, const float* x, int64_t T, const float* y);
void matmul_heads(CudaBackend::Impl& I, std::span<const WeightView> w, const float* x, int64_t ldx, int64_t hx, int64_t T, float* y,
                  int64_t ldy, int64_t hy);

// cuda_moe.cu
void expert_ffn(CudaBackend::Impl& I, std::span<const ExpertMats> experts, const ExpertGroups& groups, size_t g0, const float* x,
    int64_t H, Activation act, float* y);
void moe_combine(CudaBackend::Impl& I, const float* y, const ExpertGroups& groups, const float* weights, int64_t H, float* out);
/// CudaBackend::make_expert_table / routed_takes_shared (backend.h).
const void* make_expert_table(CudaBackend::Impl& I, std::span<const ExpertMats> experts);
bool routed_takes_shared(const CudaBackend::Impl& I, const void* table, const ExpertMats& shared, int64_t T);
void expert_ffn_routed(CudaBackend::Impl& I, const void* table, const float* x, int64_t T, int64_t H, const int* ids, const float* weights, int K,
    float* out, const ExpertMats* shared, float* shared_out);
void route_softmax_top_k(CudaBackend::Impl& I, float* logits, int64_t T, int E, int k, bool renormalize, int* ids, float* weights,
    float* margins);
// (k <= kMaxDeviceTopK and n_group <= kMaxDeviceRouteGroups; CudaBackend sends other routers to the host.)
constexpr int kMaxDeviceTopK = 64, kMaxDeviceRouteGroups = 64;
void route_grouped_top_k(CudaBackend::Impl& I, const float* logits, int64_t T, int E, int k, const RouterParams& r, int* ids, float* weights,
    float* margins);
void gelu_tanh_glu(CudaBackend::Impl& I, const float* gate, const float* up, int64_t n, float* out);

// cuda_attention.cu
void kv_append(CudaBackend::Impl& I, KvCache& cache, int64_t pos0, int64_t T, const float* k, const float* v);
void attention(CudaBackend::Impl& I, const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, float* out);
void attention_window(CudaBackend::Impl& I, const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale,
                      int64_t window, float* out);
void attention_sinks(CudaBackend::Impl& I, const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale,
                     int64_t window, const float* sinks, float* out);
void mla_attention(CudaBackend::Impl& I, const float* q, int64_t T, int n_heads, const KvCache& latent, int64_t pos0, float scale, int dv,
                   float* out);
void rope(CudaBackend::Impl& I, const Rope& rope, float* x, int64_t T, int64_t row_stride, int n_heads, int head_dim, int64_t pos0);

// cuda_gdn.cu
void causal_conv1d_silu(CudaBackend::Impl& I, const float* x, int64_t T, int64_t C, const float* w, int K, float* state, float* out);
void gated_delta(CudaBackend::Impl& I, const GatedDeltaArgs& a, int /*chunk*/);
void gdn_gates(CudaBackend::Impl& I, const float* b, const float* a, const float* a_exp, const float* dt_bias, int64_t T, int n_v,
    float* beta, float* g);

// cuda_elementwise.cu
void rms_norm(CudaBackend::Impl& I, const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y);
void l2_norm(CudaBackend::Impl& I, float* x, int64_t rows, int64_t n, float eps, float post_scale);
void rms_norm_gated(CudaBackend::Impl& I, float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps);
void add(CudaBackend::Impl& I, float* y, const float* x, int64_t n);
void add_rms_norm(CudaBackend::Impl& I, float* h, const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y);
void add_bias(CudaBackend::Impl& I, float* y, const float* b, int64_t rows, int64_t n);
void swiglu(CudaBackend::Impl& I, const float* gate, const float* up, int64_t n, float* out);
void mul_sigmoid(CudaBackend::Impl& I, float* x, const float* gate, int64_t n);
void scale(CudaBackend::Impl& I, float* x, int64_t n, float a);
void softcap(CudaBackend::Impl& I, float* x, int64_t n, float cap);
void mul_indexed(CudaBackend::Impl& I, float* w, const int* ids, const float* table, int64_t n);
void add_gated_rows(CudaBackend::Impl& I, float* out, const float* s, const float* x, const float* w, int64_t T, int64_t n);
void copy_2d(CudaBackend::Impl& I, float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols);
void row_to_f32(CudaBackend::Impl& I, WType t, const void* src, int64_t n, float* dst);
void to_host(CudaBackend::Impl& I, const float* src, int64_t n, float* dst);

}  // namespace spool::ops::cu
