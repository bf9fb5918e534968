// CudaBackend: ops::Backend on one NVIDIA GPU (CUDA kernels; cuBLAS for plain f32 GEMMs and for
// large-T products after a dequantization pass). Built when SPOOL_CUDA is on.
//
// Memory. Activations are device pointers (a Workspace(bytes, Device::kCuda) arena, whose
// allocator this backend registers when it is created). Every op also accepts host pointers
// for its activations and copies them through device scratch (correct, slow: counted in
// staged_bytes()); the model's logits buffer is such a host pointer. The contract's host arrays
// (norm weights, conv kernels, gate parameters, routing ids, expert groups) are copied up per
// call unless the model placed them with upload_floats(). Weights: upload() makes a device copy owned by the backend; a host weight (an expert
// handed out by a streaming cache) is copied into scratch for the one call. KV caches keep their
// host storage (ops::KvCache stays authoritative for snapshots and serialization); the backend
// keeps a device mirror per cache, written together with the host copy by kv_append and
// re-uploaded whole when KvCache::generation() shows a change made elsewhere (restore, load,
// a windowed cache's reserve() moving its rows: the mirror has the host's row layout, row =
// position - KvCache::base()).
// Gated DeltaNet states (conv, recurrent) may be host or device memory; host states are copied
// up before and back after the op.
//
// Numerics: f32 accumulation everywhere; softmax, norms and the delta rule in f32; rope angles
// in f32 as HF (cos/sin in double); quantized weights dequantized exactly (codebook * fp16 scale)
// and inputs Hadamard-rotated in f32 as CpuBackend. Tolerances against ReferenceBackend are
// those of the backend op table (backend_test.cpp).
//
// Capabilities (Backend::capabilities): every op of the table runs on the GPU (windowed attention,
// attention sinks and MLA attention over the latent cache included: cuda_attention.cu). In strict
// device mode (Backend::set_strict_device, SPOOL_STRICT_DEVICE=1, --strict-device) an op that
// would copy a host weight to the GPU for one call throws.
//
// Sources: cuda_backend.cu dispatches each op to its family's file (see cuda_internal.h).
//
// All work runs in order on one CUDA stream owned by the backend; ops that hand results to the
// host (to_host, routing ids, host outputs) synchronize it. Weight-slot copies (copy_weight_into)
// run on a second stream, ordered with events (weight_copy_fence / wait_weight_copies). Not thread-safe: one backend per
// thread of work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "ops/backend.h"

namespace spool::ops {

/// Number of CUDA devices the runtime sees (0 when there is no GPU or no driver).
int cuda_device_count();

/// Name of CUDA device `index`, its memory and the memory free now (cudaMemGetInfo, which other
/// processes' allocations reduce), in bytes ("" / 0 when absent).
struct CudaDeviceInfo {
  char name[256] = {};
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;
  int major = 0, minor = 0;
};
CudaDeviceInfo cuda_device_info(int index);

/// Host-to-device copy bandwidth of CUDA device `index` in GB/s (1e9 bytes per second): the best
/// of `reps` synchronous cudaMemcpy calls of `bytes` from pinned (cudaMallocHost) or pageable
/// host memory. Throws spool::Error when the device or the memory cannot be had.
double cuda_h2d_gbps(int index, size_t bytes, bool pinned, int reps = 5);

/// A device allocation (RAII), for tests and tools that move host data to and from the GPU.
class CudaBuffer {
 public:
  CudaBuffer() = default;
  /// `bytes` of device memory on the current device; throws spool::Error when it cannot be had.
  explicit CudaBuffer(size_t bytes);
  CudaBuffer(CudaBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  CudaBuffer& operator=(CudaBuffer&& o) noexcept;
  ~CudaBuffer();
  void* get() const { return p_; }
  size_t size() const { return n_; }
  /// Copies n bytes from host `src` to the start of the buffer (synchronous).
  void upload(const void* src, size_t n);
  /// Copies n bytes from the start of the buffer to host `dst` (synchronous).
  void download(void* dst, size_t n) const;

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

class CudaBackend final : public Backend {
 public:
  /// Uses CUDA device `device_index` (throws spool::Error when it does not exist) and registers
  /// the device allocator for Workspace.
  explicit CudaBackend(int device_index = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::kCuda; }
  const char* name() const override { return "cuda"; }
  int threads() const override { return 1; }
  /// Device copy of `w` (float or quantized), owned by this backend; a device view is returned
  /// as it is.
  WeightView upload(const WeightView& w) override;
  void* alloc_weight_slot(uint64_t bytes) override;
  /// On the copy stream, after the compute work issued so far (see Backend::copy_weight_into).
  WeightView copy_weight_into(const WeightView& w, void* slot) override;
  /// An event on the copy stream; tickets grow.
  uint64_t weight_copy_fence() override;
  /// cudaStreamWaitEvent of the compute stream on the ticket's event (no host wait), between two
  /// timing events whose elapsed time is added to the stall.
  void wait_weight_copies(uint64_t ticket) override;
  bool weight_copies_done(uint64_t ticket, bool block) override;
  double weight_copy_stall_seconds() const override;
  /// cudaHostRegister / cudaHostUnregister.
  bool pin_host(void* p, uint64_t bytes) override;
  void unpin_host(void* p) override;
  /// Device copy of v, owned by this backend.
  const float* upload_floats(std::span<const float> v) override;

  void matmul(const WeightView& w, const float* x, int64_t T, float* y) override;
  void matmul_multi(std::span<const MatmulOut> outs, const float* x, int64_t T) override;
  void matmul_heads(std::span<const WeightView> w, const float* x, int64_t ldx, int64_t hx, int64_t T, float* y, int64_t ldy, int64_t hy,
                    float* xs, float* ys) override;
  void expert_ffn(std::span<const ExpertMats> experts, const ExpertGroups& groups, size_t g0, const float* x, int64_t H,
                  Activation act, float* y) override;
  void moe_combine(const float* y, const ExpertGroups& groups, const float* weights, int64_t H, float* out) override;
  void* alloc_host_mapped(uint64_t bytes) override;
  const void* make_expert_table(std::span<const ExpertMats> experts) override;
  /// Tokens x top-k pairs of one expert_ffn_routed() call.
  static constexpr int64_t kMaxRoutedPairs = 64;
  int64_t max_routed_pairs() const override { return kMaxRoutedPairs; }
  bool routed_takes_shared(const void* table, const ExpertMats& shared, int64_t T) const override;
  void expert_ffn_routed(const void* table, const float* x, int64_t T, int64_t H, const int* ids, const float* weights, int K,
                         float* out, const ExpertMats* shared = nullptr, float* shared_out = nullptr) override;
  void route_softmax_top_k(float* logits, int64_t T, int E, int k, bool renormalize, int* ids, float* weights,
                           float* margins) override;
  void route_grouped_top_k(const float* logits, int64_t T, int E, int k, const RouterParams& r, int* ids, float* weights,
                           float* margins) override;
  void gelu_tanh_glu(const float* gate, const float* up, int64_t n, float* out) override;
  void scale(float* x, int64_t n, float a) override;
  void softcap(float* x, int64_t n, float cap) override;
  void mul_indexed(float* w, const int* ids, const float* table, int64_t n) override;
  /// The generic ops it leaves to the host: none (every op of the table runs on the GPU).
  std::span<const char* const> host_fallback_ops() const override;
  void upload_lora(const LoraDelta& d) override;
  void kv_append(KvCache& cache, int64_t pos0, int64_t T, const float* k, const float* v) override;
  void attention(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, float* out) override;
  void attention_window(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, int64_t window,
                        float* out) override;
  void attention_sinks(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, int64_t window,
                       const float* sinks, float* out) override;
  void mla_attention(const float* q, int64_t T, int n_heads, const KvCache& latent, int64_t pos0, float scale, int dv,
                     float* out) override;
  void rope(const Rope& rope, float* x, int64_t T, int64_t row_stride, int n_heads, int head_dim, int64_t pos0) override;
  void causal_conv1d_silu(const float* x, int64_t T, int64_t C, const float* w, int K, float* state, float* out) override;
  void gated_delta(const GatedDeltaArgs& a, int chunk) override;
  void gdn_gates(const float* b, const float* a, const float* a_exp, const float* dt_bias, int64_t T, int n_v, float* beta,
                 float* g) override;
  void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) override;
  void l2_norm(float* x, int64_t rows, int64_t n, float eps, float post_scale) override;
  void rms_norm_gated(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) override;
  void add(float* y, const float* x, int64_t n) override;
  /// One kernel (k_norm's add mode): the bits of add() then rms_norm().
  void add_rms_norm(float* h, const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) override;
  void add_bias(float* y, const float* b, int64_t rows, int64_t n) override;
  void swiglu(const float* gate, const float* up, int64_t n, float* out) override;
  void mul_sigmoid(float* x, const float* gate, int64_t n) override;
  void add_gated_rows(float* out, const float* s, const float* x, const float* w, int64_t T, int64_t n) override;
  void copy_2d(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) override;
  void row_to_f32(WType t, const void* src, int64_t n, float* dst) override;
  void to_host(const float* src, int64_t n, float* dst) override;

  /// Waits for all work queued so far; throws spool::Error naming a failed kernel's error.
  void synchronize();
  /// The compute stream every op of this backend runs on (a cudaStream_t): for a communicator
  /// that queues its collectives in order with the ops (dist::NcclComm), so no extra sync.
  void* stream_handle() const;
  /// The CUDA device this backend uses (the constructor's device_index).
  int device_index() const;
  /// Bytes copied between host and device for host-resident activations, states and weights
  /// (the slow paths above; 0 when everything lives on the device).
  uint64_t staged_bytes() const;
  /// Bytes copied host -> device into weight slots (copy_weight_into) so far.
  uint64_t slot_copied_bytes() const;
  /// Bytes of device memory held by upload() copies.
  uint64_t uploaded_bytes() const;
  /// Bytes of page-locked host memory handed out by alloc_host_mapped().
  uint64_t host_mapped_bytes() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace spool::ops
