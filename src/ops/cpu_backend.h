// CpuBackend: the Backend on host memory, running spool's Highway kernels (runtime dispatch to
// the best SIMD target of the CPU) on a ThreadPool.
#pragma once

#include <hwy/aligned_allocator.h>

#include <vector>

#include "ops/backend.h"
#include "ops/matmul.h"
#include "ops/thread_pool.h"

namespace spool::ops {

/// Options of a CpuBackend, fixed for its life (one model's backend; another model in the same
/// process has its own).
struct CpuOptions {
  /// Q4_K / Q6_K products take int8 activations where the CPU has the int8 kernels (--act-bits 8,
  /// or auto on a GGUF file with such weights: ops::int8_activations_from_bits); false: f32
  /// activations, exact against the dequantized weights. See ops::matmul.
  bool int8_activations = false;
};

class CpuBackend : public Backend {
 public:
  /// `pool` (may be null: single-threaded) must outlive the backend.
  explicit CpuBackend(ThreadPool* pool, CpuOptions options = {}) : pool_(pool), options_(options) {}

  Device device() const override { return Device::kCpu; }
  const char* name() const override { return "cpu"; }
  int threads() const override { return pool_ ? pool_->size() : 1; }
  /// The pool kernels run on (null: the calling thread only).
  ThreadPool* pool() const { return pool_; }
  /// The options it was made with.
  const CpuOptions& options() const { return options_; }

  void matmul(const WeightView& w, const float* x, int64_t T, float* y) override;
  void matmul_multi(std::span<const MatmulOut> outs, const float* x, int64_t T) override;
  void expert_ffn(std::span<const ExpertMats> experts, const ExpertGroups& groups, size_t g0, const float* x, int64_t H,
                  Activation act, float* y) override;
  void moe_combine(const float* y, const ExpertGroups& groups, const float* weights, int64_t H, float* out) override;
  void route_softmax_top_k(float* logits, int64_t T, int E, int k, bool renormalize, int* ids, float* weights,
                           float* margins) override;
  void kv_append(KvCache& cache, int64_t pos0, int64_t T, const float* k, const float* v) override;
  void attention(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, float* out) override;
  void rope(const Rope& rope, float* x, int64_t T, int64_t row_stride, int n_heads, int head_dim, int64_t pos0) override;
  void causal_conv1d_silu(const float* x, int64_t T, int64_t C, const float* w, int K, float* state, float* out) override;
  void gated_delta(const GatedDeltaArgs& a, int chunk) override;
  void gdn_gates(const float* b, const float* a, const float* a_exp, const float* dt_bias, int64_t T, int n_v, float* beta,
                 float* g) override;
  void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) override;
  void l2_norm(float* x, int64_t rows, int64_t n, float eps, float post_scale) override;
  void rms_norm_gated(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) override;
  void add(float* y, const float* x, int64_t n) override;
  void add_bias(float* y, const float* b, int64_t rows, int64_t n) override;
  void swiglu(const float* gate, const float* up, int64_t n, float* out) override;
  void mul_sigmoid(float* x, const float* gate, int64_t n) override;
  void gelu_tanh_glu(const float* gate, const float* up, int64_t n, float* out) override;
  void scale(float* x, int64_t n, float a) override;
  void softcap(float* x, int64_t n, float cap) override;
  void mul_indexed(float* w, const int* ids, const float* table, int64_t n) override;
  void add_gated_rows(float* out, const float* s, const float* x, const float* w, int64_t T, int64_t n) override;
  void copy_2d(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) override;
  void route_grouped_top_k(const float* logits, int64_t T, int E, int k, const RouterParams& r, int* ids, float* weights,
                           float* margins) override;
  void attention_window(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, int64_t window,
                        float* out) override;
  void attention_sinks(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, int64_t window,
                       const float* sinks, float* out) override;
  void mla_attention(const float* q, int64_t T, int n_heads, const KvCache& latent, int64_t pos0, float scale, int dv,
                     float* out) override;
  /// Every op runs natively here (the generic host fallbacks are all overridden): none.
  std::span<const char* const> host_fallback_ops() const override { return {}; }
  void row_to_f32(WType t, const void* src, int64_t n, float* dst) override;
  void to_host(const float* src, int64_t n, float* dst) override;

 private:
  /// expert_ffn for decode-sized calls (at most 64 token rows) on a pool of several threads: two
  /// jobs, one for every expert's gate/up rows (and the activation), one for every expert's down
  /// rows, each split into enough tasks per expert (at least 8 per thread in all) that no thread idles
  /// for long. The gate/up input is prepared (rotated, int8-quantized) once per distinct token rows and
  /// rotation before the first job (decode: once for every routed expert), an expert's down input by
  /// whichever task finishes its gate/up rows. Same values as the one-task-per-expert path (every
  /// output row is computed by the same kernel from the same prepared input). Its scratch is members:
  /// like every Backend call, one caller at a time (the pipelined decode's two groups take turns,
  /// models/decoder.cpp run_pipelined).
  void expert_ffn_split(std::span<const ExpertMats> experts, const ExpertGroups& groups, size_t g0, const float* x,
                        int64_t H, Activation act, float* y);

  ThreadPool* pool_;
  CpuOptions options_;
  /// expert_ffn_split's scratch: per expert its gathered input [n, H] and gate/up [n, I] each.
  hwy::AlignedFreeUniquePtr<float[]> split_buf_;
  int64_t split_n_ = 0;
  /// expert_ffn_split's prepared gate/up inputs (distinct ones first) and each expert's down input.
  std::vector<PreparedInput> prep_, down_in_;
};

/// Per-thread scratch (bytes) of CpuBackend::expert_ffn when one expert gets up to `rows` token
/// rows: the gathered input [rows, H] and gate/up [rows, I] each. Taken from thread-local
/// buffers that grow to this size; the planner counts them once per pool thread.
uint64_t expert_ffn_thread_bytes(int64_t rows, int64_t H, int64_t I);

/// Scratch (bytes) CpuBackend keeps for its decode-sized expert calls (expert_ffn_split, at most
/// kSplitRows token rows over `n_experts` experts, the shared expert included where the MoE layer
/// folds it in): the gathered inputs and gate/up rows (16-float aligned per expert), the prepared
/// gate/up inputs (a rotated f32 copy and its int8 activations, 4 bytes a column, for each of up to
/// three sign vectors: the routed experts' gate/up, the shared expert's gate and up) and each
/// expert's prepared down input. `I` is the widest expert's intermediate size. Members grown
/// only: counted once, not per thread.
uint64_t expert_ffn_split_bytes(int64_t H, int64_t I, int64_t n_experts);

/// Most token rows (all experts' together) that CpuBackend::expert_ffn runs as expert_ffn_split.
inline constexpr int64_t kSplitRows = 64;

}  // namespace spool::ops
