// CudaBackend's dispatcher: construction, destruction, and every op of the Backend table as one
// CudaOpScope (scratch reset, SPOOL_CUDA_SYNC, SPOOL_CUDA_PROFILE) around the op's function in its
// family's file (cuda_internal.h lists them). See cuda_backend.h for the memory model.
//
// One kernel per op, f32 accumulation. Decode GEMVs (T <= 8): packed codes (q2..q8) by k_gemv_quant (input
// built in shared memory by a fused prologue — gather, SwiGLU, Hadamard rotation — then chunk loads of 4 x bits
// bytes), f16/bf16 by k_gemv_16, ternary by the element-wise k_gemv. MoE experts in a packed format run as two
// grouped k_gemv_quant launches per layer (prefill too, in jobs of <= 8 rows); with every expert readable
// by the GPU the routing stays on the device (expert_ffn_routed) and KV rows are written on the device
// (kv_append defers the host copy). Known slow spots: dense T > 8 products dequantize W into scratch
// and run cuBLAS SGEMM; attention keeps a score row per query in scratch (no flash tiling); the delta
// rule runs the recurrence for every T; a decode step is ~200 small launches (no CUDA graphs yet).
// Small host inputs go up through a pinned staging ring, so they do not stall the stream.
#include "ops/cuda/cuda_internal.h"
#include "ops/lora.h"

namespace spool::ops {

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

// ---- The op table (backend.h), by family --------------------------------------------------------

void CudaBackend::matmul(const WeightView& w, const float* x, int64_t T, float* y) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::matmul(*impl_, w, x, T, y);
}

void CudaBackend::matmul_multi(std::span<const MatmulOut> outs, const float* x, int64_t T) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::matmul_multi(*impl_, outs, x, T);
}

void CudaBackend::matmul_heads(std::span<const WeightView> w, const float* x, int64_t ldx, int64_t hx, int64_t T, float* y, int64_t ldy,
                               int64_t hy, float* xs, float* ys) {
  // Outside the native case (host weights or activations, LoRA, prefill) the generic gather /
  // matmul / scatter, whose ops each open their own scope.
  if (!cu::matmul_heads_native(w, x, T, y)) {
    Backend::matmul_heads(w, x, ldx, hx, T, y, ldy, hy, xs, ys);
    return;
  }
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::matmul_heads(*impl_, w, x, ldx, hx, T, y, ldy, hy);
}

void CudaBackend::expert_ffn(std::span<const ExpertMats> experts, const ExpertGroups& groups, size_t g0, const float* x,
                             int64_t H, Activation act, float* y) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::expert_ffn(*impl_, experts, groups, g0, x, H, act, y);
}

void CudaBackend::moe_combine(const float* y, const ExpertGroups& groups, const float* weights, int64_t H, float* out) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::moe_combine(*impl_, y, groups, weights, H, out);
}

const void* CudaBackend::make_expert_table(std::span<const ExpertMats> experts) { return cu::make_expert_table(*impl_, experts); }

bool CudaBackend::routed_takes_shared(const void* table, const ExpertMats& shared, int64_t T) const {
  return cu::routed_takes_shared(*impl_, table, shared, T);
}

void CudaBackend::expert_ffn_routed(const void* table, const float* x, int64_t T, int64_t H, const int* ids, const float* weights, int K,
                                    float* out, const ExpertMats* shared, float* shared_out) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::expert_ffn_routed(*impl_, table, x, T, H, ids, weights, K, out, shared, shared_out);
}

void CudaBackend::route_softmax_top_k(float* logits, int64_t T, int E, int k, bool renormalize, int* ids, float* weights,
                                      float* margins) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::route_softmax_top_k(*impl_, logits, T, E, k, renormalize, ids, weights, margins);
}

void CudaBackend::kv_append(KvCache& cache, int64_t pos0, int64_t T, const float* k, const float* v) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::kv_append(*impl_, cache, pos0, T, k, v);
}

void CudaBackend::attention(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, float* out) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::attention(*impl_, q, T, n_heads, kv, pos0, scale, out);
}

void CudaBackend::attention_window(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, int64_t window,
                                   float* out) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::attention_window(*impl_, q, T, n_heads, kv, pos0, scale, window, out);
}

void CudaBackend::attention_sinks(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, int64_t window,
                                  const float* sinks, float* out) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::attention_sinks(*impl_, q, T, n_heads, kv, pos0, scale, window, sinks, out);
}

void CudaBackend::mla_attention(const float* q, int64_t T, int n_heads, const KvCache& latent, int64_t pos0, float scale, int dv,
                                float* out) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::mla_attention(*impl_, q, T, n_heads, latent, pos0, scale, dv, out);
}

void CudaBackend::rope(const Rope& rope, float* x, int64_t T, int64_t row_stride, int n_heads, int head_dim, int64_t pos0) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::rope(*impl_, rope, x, T, row_stride, n_heads, head_dim, pos0);
}

void CudaBackend::causal_conv1d_silu(const float* x, int64_t T, int64_t C, const float* w, int K, float* state, float* out) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::causal_conv1d_silu(*impl_, x, T, C, w, K, state, out);
}

void CudaBackend::gated_delta(const GatedDeltaArgs& a, int chunk) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::gated_delta(*impl_, a, chunk);
}

void CudaBackend::gdn_gates(const float* b, const float* a, const float* a_exp, const float* dt_bias, int64_t T, int n_v,
                            float* beta, float* g) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::gdn_gates(*impl_, b, a, a_exp, dt_bias, T, n_v, beta, g);
}

void CudaBackend::rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::rms_norm(*impl_, x, w, rows, n, eps, y);
}

void CudaBackend::l2_norm(float* x, int64_t rows, int64_t n, float eps, float post_scale) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::l2_norm(*impl_, x, rows, n, eps, post_scale);
}

void CudaBackend::rms_norm_gated(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::rms_norm_gated(*impl_, x, z, w, rows, n, eps);
}

void CudaBackend::add_rms_norm(float* h, const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::add_rms_norm(*impl_, h, x, w, rows, n, eps, y);
}

void CudaBackend::add(float* y, const float* x, int64_t n) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::add(*impl_, y, x, n);
}

void CudaBackend::add_bias(float* y, const float* b, int64_t rows, int64_t n) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::add_bias(*impl_, y, b, rows, n);
}

void CudaBackend::route_grouped_top_k(const float* logits, int64_t T, int E, int k, const RouterParams& r, int* ids, float* weights,
                                      float* margins) {
  if (k > cu::kMaxDeviceTopK || r.n_group > cu::kMaxDeviceRouteGroups) {  // beyond the kernel's shared arrays: the host's
    Backend::route_grouped_top_k(logits, T, E, k, r, ids, weights, margins);
    return;
  }
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::route_grouped_top_k(*impl_, logits, T, E, k, r, ids, weights, margins);
}

void CudaBackend::gelu_tanh_glu(const float* gate, const float* up, int64_t n, float* out) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::gelu_tanh_glu(*impl_, gate, up, n, out);
}

void CudaBackend::scale(float* x, int64_t n, float a) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::scale(*impl_, x, n, a);
}

void CudaBackend::softcap(float* x, int64_t n, float cap) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::softcap(*impl_, x, n, cap);
}

void CudaBackend::mul_indexed(float* w, const int* ids, const float* table, int64_t n) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::mul_indexed(*impl_, w, ids, table, n);
}

std::span<const char* const> CudaBackend::host_fallback_ops() const { return {}; }

void CudaBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::swiglu(*impl_, gate, up, n, out);
}

void CudaBackend::mul_sigmoid(float* x, const float* gate, int64_t n) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::mul_sigmoid(*impl_, x, gate, n);
}

void CudaBackend::add_gated_rows(float* out, const float* s, const float* x, const float* w, int64_t T, int64_t n) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::add_gated_rows(*impl_, out, s, x, w, T, n);
}

void CudaBackend::copy_2d(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::copy_2d(*impl_, dst, ld_dst, src, ld_src, rows, cols);
}

void CudaBackend::row_to_f32(WType t, const void* src, int64_t n, float* dst) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::row_to_f32(*impl_, t, src, n, dst);
}

void CudaBackend::to_host(const float* src, int64_t n, float* dst) {
  CudaOpScope scope(*impl_, __func__, strict_device());
  cu::to_host(*impl_, src, n, dst);
}

}  // namespace spool::ops
