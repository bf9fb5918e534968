// Backend: the only door from model code to compute. Model files (src/models/) state the math
// of a layer as calls on a Backend and never loop over activations themselves; a backend runs
// each op where its data lives (CpuBackend: the Highway kernels of src/ops on host memory;
// CudaBackend: the CUDA kernels of src/ops/cuda on device memory). ReferenceBackend is a plain scalar implementation of every op that the
// backend op test (backend_test.cpp) checks every other backend against, in the manner of
// llama.cpp's test-backend-ops.
//
// Conventions: activations are f32, row-major, on the backend's device (a Workspace of the same
// device holds them); shapes are given beside each op as [rows, cols]. Index arrays (routing,
// expert groups) are host arrays on every backend (small, written per step by the host); the
// per-layer parameter vectors (norm weights, conv kernels, gate parameters) are host arrays or,
// once the model has placed them with upload_floats(), the backend's own copies.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "ops/gated_delta.h"
#include "ops/kv_cache.h"
#include "ops/matmul.h"
#include "ops/rope.h"
#include "ops/routing.h"
#include "ops/weights.h"

namespace spool::ops {

struct LoraDelta;

/// The three projections of one routed expert: gate/up [I, H], down [H, I]. With
/// Activation::kClampedSwiGLU (gpt-oss) `gate` is the fused gate_up matrix [2I, H] with gate
/// and up rows interleaved (row 2j gate_j, row 2j+1 up_j), `up` is empty, and the optional
/// biases are added: gate_bias [2I] (interleaved like the rows) after gate_up, down_bias [H]
/// after down. Biases are f32 where the backend reads them (Backend::upload_floats).
struct ExpertMats {
  WeightView gate, up, down;
  const float* gate_bias = nullptr;
  const float* down_bias = nullptr;
};

/// Activation between an expert's gate/up and down projections.
enum class Activation : uint8_t {
  kSwiGLU,  ///< silu(gate) * up (HF Qwen2MoeMLP / LlamaMLP act_fn "silu")
  /// gpt-oss (HF GptOssExperts._apply_gate): u = gate_up x + b; g = min(u[2j], limit),
  /// v = clamp(u[2j+1], -limit, limit); h_j = (v + 1) * g * sigmoid(1.702 g); limit 7.
  kClampedSwiGLU,
  /// gelu_tanh(gate) * up (HF act_fn "gelu_pytorch_tanh": Gemma 4's MLP and experts; ops::gelu_tanh).
  kGeluTanhGLU,
};

/// gpt-oss clamped SwiGLU constants (HF modeling_gpt_oss.py GptOssExperts: alpha, limit).
constexpr float kGptOssAlpha = 1.702f;
constexpr float kGptOssLimit = 7.0f;

/// Rows of a MoE layer's routing, grouped by expert (the gather of the expert path).
/// Routing of T tokens to K experts each gives T*K (token, slot) pairs r = token * K + slot.
/// Experts with at least one pair are `active` (ascending id); the pairs of active[i] are
/// rows[first[i] .. first[i+1]) (ascending r), and row_of[r] is the position of pair r in
/// `rows` (= the row of its output in the expert path's y buffer).
struct ExpertGroups {
  int64_t T = 0;
  int K = 0;
  std::vector<int> active;       // [n_active] expert ids, ascending
  std::vector<int64_t> first;    // [n_active + 1] offsets into rows
  std::vector<int64_t> rows;     // [T*K] pairs r = token * K + slot, grouped by expert
  std::vector<int64_t> row_of;   // [T*K] inverse of rows
};

/// Groups routed pairs by expert: ids [T, K] expert ids in [0, n_experts). Host bookkeeping
/// shared by every backend. Throws spool::Error for an id outside [0, n_experts).
ExpertGroups group_by_expert(const int* ids, int64_t T, int K, int n_experts);

/// Name of a device ("cpu", "cuda").
const char* device_name(Device d);

/// Bytes a packed copy of `w` takes (pack_weight): each part (float rows; MXFP4 blocks, scales;
/// quantized codes, scales, codebook, signs; ggml blocks) rounded up to 256 bytes.
uint64_t packed_weight_bytes(const WeightView& w);
/// Copies the parts of `w` to `dst` (packed_weight_bytes(w) bytes; 256-byte aligned parts) with
/// copy(to, from, bytes) per part and returns the view of the copy, marked as living on `device`.
WeightView pack_weight(const WeightView& w, void* dst, Device device,
                       const std::function<void(void* to, const void* from, size_t bytes)>& copy);

/// The ops of the Backend table below, by method name, in declaration order: the rows of the
/// capability table (Backend::capabilities). Uploads, weight slots and the other bookkeeping
/// methods are not ops (they move no activations).
std::span<const char* const> backend_op_names();

/// The generic host-fallback implementations of backend.cpp (route_grouped_top_k, gelu_tanh_glu,
/// scale, softcap, mul_indexed, attention_window, attention_sinks, mla_attention): the ops a backend runs on the host unless it
/// overrides them (Backend::host_fallback_ops' default).
std::span<const char* const> generic_host_fallback_ops();

/// How a backend runs one op of the table.
enum class OpRun : uint8_t {
  kNative,        ///< its own kernels, where its data lives
  kHostFallback,  ///< the generic implementation: activations to the host (to_host), the host kernel, back
  kUnavailable,   ///< not offered (expert_ffn_routed on a backend whose make_expert_table gives no table)
};
/// Name of an OpRun ("native", "host fallback", "unavailable").
const char* op_run_name(OpRun r);
/// One row of the capability table.
struct OpCapability {
  const char* op;  ///< a name of backend_op_names()
  OpRun run;
};

/// Whether SPOOL_STRICT_DEVICE=1 is set (the default of Backend::strict_device for every backend
/// created while it is).
bool strict_device_from_env();

class Backend {
 public:
  virtual ~Backend() = default;
  /// Where this backend's activations and KV caches live.
  virtual Device device() const = 0;
  /// Short name for logs and test names ("cpu", "reference").
  virtual const char* name() const = 0;
  /// Threads the backend runs host work on (for workspace sizing: per-thread scratch).
  virtual int threads() const = 0;

  /// A view of `w` that this backend's kernels read fastest: on a GPU backend a device copy
  /// (owned by the backend, valid until it is destroyed; view.device == device()), made once
  /// at load time for resident weights. Host backends return `w` unchanged. Weights left on
  /// the host still work on every backend (a GPU backend then copies them per call).
  virtual WeightView upload(const WeightView& w) { return w; }
  /// Copies the matrices of LoRA delta `d` (ops/lora.h: each term's A and B^T) to where this
  /// backend's LoRA products read them, now rather than at their first use, so that they count in
  /// the memory placed at load time (a GPU backend: device memory, in uploaded_bytes()). Host
  /// backends read the host matrices: nothing to do. Throws spool::Error when memory cannot be had.
  virtual void upload_lora(const LoraDelta& d) { (void)d; }
  /// The parameter vector v (norm weights, conv kernels, gate parameters) where this backend's
  /// ops read it fastest, made once at load: on a GPU backend a device copy owned by the
  /// backend (valid until it is destroyed); host backends return v.data() unchanged. Ops take
  /// either pointer.
  virtual const float* upload_floats(std::span<const float> v) { return v.data(); }

  // ---- Matrix products -------------------------------------------------------------------
  /// y[t, r] = sum_c x[t, c] W[r, c]: x [T, W.cols], y [T, W.rows]. Any WType (float or
  /// quantized; quantized inputs are rotated by the backend when the weight carries signs).
  virtual void matmul(const WeightView& w, const float* x, int64_t T, float* y) = 0;
  /// Several products of the same x (all W of x's width), as one job where possible.
  virtual void matmul_multi(std::span<const MatmulOut> outs, const float* x, int64_t T) = 0;
  /// Per-head products (MLA's absorbed W_UK^T / W_UV, HF DeepSeek-V2/V3 kv_b_proj per head): for
  /// h < w.size(), t < T, r < rows: y[t * ldy + h * hy + r] = sum_c W_h[r, c] x[t * ldx + h * hx + c],
  /// every W_h of one shape (rows x cols) and type; x and y are strided views (row strides ldx,
  /// ldy; head strides hx, hy, in floats). xs [T, cols] and ys [T, rows] are scratch: the generic
  /// version gathers head h's rows into xs (copy_2d), runs matmul into ys and scatters them, so
  /// its results are matmul's bits; a native one may ignore them.
  virtual void matmul_heads(std::span<const WeightView> w, const float* x, int64_t ldx, int64_t hx, int64_t T, float* y, int64_t ldy,
                            int64_t hy, float* xs, float* ys);

  // ---- MoE expert path -------------------------------------------------------------------
  /// For the active experts i in [g0, g0 + experts.size()) of `groups`: gathers the token rows
  /// of their pairs from x [T, H], computes y[row] = down(act(gate x, up x)) for each, written
  /// to y at the pair's row (y [T*K, H], rows grouped as groups.rows). experts[j] holds the
  /// weights of groups.active[g0 + j].
  virtual void expert_ffn(std::span<const ExpertMats> experts, const ExpertGroups& groups, size_t g0, const float* x,
                          int64_t H, Activation act, float* y) = 0;
  /// out[t] = sum_{s<K} weights[t, s] * y[row_of[t*K + s]], summed in slot order (best first):
  /// y [T*K, H] from expert_ffn, weights [T, K], out [T, H] (overwritten).
  virtual void moe_combine(const float* y, const ExpertGroups& groups, const float* weights, int64_t H, float* out) = 0;
  /// `bytes` of page-locked host memory that this backend's kernels read in place, over the host
  /// link (CUDA: mapped pinned memory whose device address is its host address), for weights a
  /// GPU streams per use without copying them (experts::DeviceExperts' host share). Owned by the
  /// backend until it is destroyed. nullptr when the backend has none (host backends) or the
  /// memory cannot be had.
  virtual void* alloc_host_mapped(uint64_t bytes) {
    (void)bytes;
    return nullptr;
  }
  /// A table of one MoE layer's routed experts (experts[e] = expert e, views this backend
  /// uploaded) in this backend's memory, for expert_ffn_routed(); nullptr when the backend has
  /// no such path or these experts do not fit it (the caller then groups on the host). Owned
  /// by the backend (valid until it is destroyed).
  virtual const void* make_expert_table(std::span<const ExpertMats> experts) {
    (void)experts;
    return nullptr;
  }
  /// Most token x top-k pairs one expert_ffn_routed() call takes (0: no such path).
  virtual int64_t max_routed_pairs() const { return 0; }
  /// Whether expert_ffn_routed() over `table` can also run `shared` (an MoE layer's shared expert,
  /// SwiGLU, views this backend uploaded) on T tokens in its own launches, with the bits that
  /// matmul_multi (gate, up) + swiglu + matmul (down) give. False when the backend has no routed
  /// path or the shared expert does not fit it (another shape, type or group size).
  virtual bool routed_takes_shared(const void* table, const ExpertMats& shared, int64_t T) const {
    (void)table, (void)shared, (void)T;
    return false;
  }
  /// out[t] = sum_{s<K} weights[t, s] * FFN_{ids[t, s]}(x[t]) for SwiGLU experts found through
  /// `table` (make_expert_table), summed in slot order as moe_combine: the expert path with the
  /// routing's ids [T, K] and weights [T, K] left in this backend's memory (no host round trip,
  /// no grouping on the host). Same values as expert_ffn + moe_combine. Throws spool::Error for a
  /// foreign table, T * K above max_routed_pairs() or host ids. With `shared` (only where
  /// routed_takes_shared() said so, else spool::Error) also shared_out [T, H] = the shared
  /// expert's FFN(x), computed in the same launches (the caller adds it, add_gated_rows).
  virtual void expert_ffn_routed(const void* table, const float* x, int64_t T, int64_t H, const int* ids, const float* weights, int K,
                                 float* out, const ExpertMats* shared = nullptr, float* shared_out = nullptr);
  /// Router selection for T tokens: logits [T, E] (clobbered) -> ids [T, k] (best first) and
  /// weights [T, k] (softmax probabilities, renormalised over the k kept when `renormalize`);
  /// margins [T] (may be null): p_k - p_{k+1} of the full softmax. Ties go to the lower id.
  /// HF Qwen3MoeSparseMoeBlock routing (softmax, topk, optional norm_topk_prob).
  virtual void route_softmax_top_k(float* logits, int64_t T, int E, int k, bool renormalize, int* ids, float* weights,
                                   float* margins) = 0;

  // ---- Attention ---------------------------------------------------------------------------
  /// Stores positions [pos0, pos0 + T) of k, v [T, n_kv_heads * head_dim] into `cache` (its
  /// rows must hold them: base() <= pos0, pos0 + T <= base() + capacity(); a windowed cache's
  /// rows are positions - base(), see kv_cache.h).
  virtual void kv_append(KvCache& cache, int64_t pos0, int64_t T, const float* k, const float* v) = 0;
  /// Causal softmax attention of q [T, n_heads, head_dim] at positions [pos0, pos0 + T) over
  /// cache positions [0, pos0 + t] (GQA: head h reads KV head h / (n_heads / n_kv_heads)),
  /// scores scaled by `scale`; out [T, n_heads, head_dim]. The cache must hold them all (a
  /// windowed cache only before it first drops rows); spool::Error otherwise.
  virtual void attention(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, float* out) = 0;
  /// Rotary embedding of T rows, each of `n_heads` heads of head_dim at x + t * row_stride,
  /// row t at position pos0 + t (NeoX rotate_half convention, see rope.h).
  virtual void rope(const Rope& rope, float* x, int64_t T, int64_t row_stride, int n_heads, int head_dim, int64_t pos0) = 0;

  // ---- Gated DeltaNet ------------------------------------------------------------------------
  /// Causal depthwise conv1d + SiLU with carried state (gated_delta.h causal_conv1d_silu):
  /// x [T, C], w [C, K] (host), state [C, K-1], out [T, C].
  virtual void causal_conv1d_silu(const float* x, int64_t T, int64_t C, const float* w, int K, float* state, float* out) = 0;
  /// Gated delta rule over a.T tokens: recurrent form when a.T == 1, else chunked with `chunk`
  /// tokens per chunk (algebraically the same). See gated_delta.h for the arguments.
  virtual void gated_delta(const GatedDeltaArgs& a, int chunk) = 0;
  /// Gated DeltaNet gates per (token, value head): beta = sigmoid(b), g = -a_exp[h] *
  /// softplus(a + dt_bias[h]). b, a [T, n_v]; a_exp, dt_bias [n_v] (host); beta, g [T, n_v].
  /// HF Qwen3_5MoeGatedDeltaNet.forward.
  virtual void gdn_gates(const float* b, const float* a, const float* a_exp, const float* dt_bias, int64_t T, int n_v,
                         float* beta, float* g) = 0;

  // ---- Norms ---------------------------------------------------------------------------------
  /// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w for `rows` rows of n (w [n] host; in place ok).
  virtual void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) = 0;
  /// x[r] = x[r] / sqrt(sum(x[r]^2) + eps), then * post_scale when post_scale != 1; in place.
  virtual void l2_norm(float* x, int64_t rows, int64_t n, float eps, float post_scale) = 0;
  /// Gated RMSNorm: x[r] = rms_norm(x[r], w) * silu(z[r]) for rows of n (w [n] host).
  virtual void rms_norm_gated(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) = 0;
  /// The residual add and the next norm of a pre-norm block in one op: h[i] += x[i] for rows x n,
  /// then y[r] = rms_norm(h[r]) * w (w [n] as rms_norm's). The same bits as add() then rms_norm();
  /// the default is those two calls (a backend fuses them to save a pass and a launch). y must
  /// not alias h or x.
  virtual void add_rms_norm(float* h, const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y);

  // ---- Elementwise ---------------------------------------------------------------------------
  /// y[i] += x[i] for i < n.
  virtual void add(float* y, const float* x, int64_t n) = 0;
  /// y[r, c] += b[c] for `rows` rows of n: y [rows, n], b [n] (a parameter vector: host or
  /// upload_floats). Linear-layer biases (HF Glm4MoeAttention q/k/v_proj.bias, gpt-oss q/k/v/o and router).
  virtual void add_bias(float* y, const float* b, int64_t rows, int64_t n) = 0;
  /// out[i] = silu(gate[i]) * up[i] (out may alias gate).
  virtual void swiglu(const float* gate, const float* up, int64_t n, float* out) = 0;
  /// x[i] *= sigmoid(gate[i]).
  virtual void mul_sigmoid(float* x, const float* gate, int64_t n) = 0;
  /// out[t] += sigmoid(x[t] . w) * s[t] for T rows of n (w [n] host; the shared expert's gate).
  /// With w == nullptr the gate is 1.
  virtual void add_gated_rows(float* out, const float* s, const float* x, const float* w, int64_t T, int64_t n) = 0;
  /// dst[r * ld_dst + c] = src[r * ld_src + c] for r < rows, c < cols (head splits).
  virtual void copy_2d(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) = 0;

  // ---- DeepSeek / Mixtral ops -----------------------------------------------------------------
  // Each has a generic implementation here (backend.cpp) that works on any backend through
  // to_host / row_to_f32 and the host kernels (slow on a device, but correct); CpuBackend and
  // ReferenceBackend override them. host_fallback_ops() says which a backend leaves generic;
  // in strict device mode they throw on a device backend.
  /// Router of the DeepSeek family (RouterParams, routing.h) for T tokens: logits [T, E]
  /// (device; not modified) -> ids [T, k] (host ints, best first), weights [T, k] (device),
  /// margins [T] (device, may be null).
  virtual void route_grouped_top_k(const float* logits, int64_t T, int E, int k, const RouterParams& r, int* ids,
                                   float* weights, float* margins);
  /// out[i] = gelu_tanh(gate[i]) * up[i] (ops::gelu_tanh_glu; out may alias gate).
  virtual void gelu_tanh_glu(const float* gate, const float* up, int64_t n, float* out);
  /// x[i] *= a for i < n (a host scalar: a per-layer residual scale, HF Gemma 4 layer_scalar).
  virtual void scale(float* x, int64_t n, float a);
  /// x[i] = cap * tanh(x[i] / cap) for i < n, cap > 0 (final logit soft-capping; ops::softcap).
  virtual void softcap(float* x, int64_t n, float cap);
  /// w[i] *= table[ids[i]] for i < n: routing weights [T, k] times a per-expert factor (HF Gemma 4
  /// router.per_expert_scale). ids host ints in [0, table size), table a host array.
  virtual void mul_indexed(float* w, const int* ids, const float* table, int64_t n);
  /// attention() with a sliding window (HF Mixtral/Mistral sliding_window): row t sees cache
  /// positions p with pos0 + t - window < p <= pos0 + t. window <= 0: as attention(). The
  /// cache may be one bounded by the window (KvCache::configure): only those positions are read.
  virtual void attention_window(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale,
                                int64_t window, float* out);
  /// attention_window() with attention sinks (HF GptOssAttention eager): each query head h has
  /// a learned logit sinks[h] (host array [n_heads]) that joins the softmax denominator and has
  /// no value: p_j = exp(l_j) / (exp(sinks[h]) + sum_m exp(l_m)). window <= 0: no window.
  virtual void attention_sinks(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale,
                               int64_t window, const float* sinks, float* out);
  /// Weight-absorbed MLA attention over a keys-only latent cache (ops/mla.h): q [T, n_heads, D],
  /// out [T, n_heads, dv] = softmax(scale q.key) . key[:dv] per head, causal.
  virtual void mla_attention(const float* q, int64_t T, int n_heads, const KvCache& latent, int64_t pos0, float scale,
                             int dv, float* out);

  // ---- Embeddings and logits -----------------------------------------------------------------
  /// Converts n elements of a host row of type t (F32/F16/BF16) into dst (device).
  virtual void row_to_f32(WType t, const void* src, int64_t n, float* dst) = 0;
  /// Copies n floats of device memory to host memory (the sampler's input).
  virtual void to_host(const float* src, int64_t n, float* dst) = 0;

  // ---- Weight slots (experts::DeviceExpertCache) ----------------------------------------------
  /// Memory for one weight slot of `bytes` where this backend's kernels read weights fastest
  /// (device memory on a GPU backend, host memory on host backends), owned by the backend until
  /// it is destroyed. Throws spool::Error when it cannot be had.
  virtual void* alloc_weight_slot(uint64_t bytes);
  /// Copies host weight `w` into `slot` (alloc_weight_slot memory of at least
  /// packed_weight_bytes(w) bytes) and returns the view of the copy. The copy is ordered after
  /// the backend's work issued so far (so a slot may be refilled once the ops that read its
  /// previous contents were issued), but it is not visible to later ops until the caller orders
  /// them after it with weight_copy_fence() + wait_weight_copies(). Host backends copy with
  /// memcpy before returning; a GPU backend issues it on a copy stream, so it runs while the
  /// compute stream works. `w`'s host bytes must stay unchanged until weight_copies_done() says
  /// the copy finished (pinned memory is read by the DMA engine as the copy runs).
  virtual WeightView copy_weight_into(const WeightView& w, void* slot);
  /// A ticket for the weight copies issued so far (copy_weight_into): tickets grow, and a later
  /// ticket covers every earlier copy. 0 when there is nothing to wait for (host backends).
  virtual uint64_t weight_copy_fence() { return 0; }
  /// Orders the backend's later work after the copies of `ticket` (a GPU backend: its compute
  /// stream waits on the copy stream's event, cudaStreamWaitEvent; the host does not block).
  /// The time the compute stream spends waiting is added to weight_copy_stall_seconds().
  virtual void wait_weight_copies(uint64_t ticket) { (void)ticket; }
  /// Whether the copies of `ticket` have finished reading their host bytes; with `block`, waits
  /// until they have (and returns true).
  virtual bool weight_copies_done(uint64_t ticket, bool block) {
    (void)ticket, (void)block;
    return true;
  }
  /// Seconds the backend's compute waited for weight copies so far: on a GPU backend the
  /// compute stream's waits on copy events (CUDA event timing, counted once they completed);
  /// on host backends the time spent in copy_weight_into (the copies are synchronous).
  virtual double weight_copy_stall_seconds() const { return copy_stall_s_; }
  /// Page-locks `bytes` of host memory at `p` (cudaHostRegister on CUDA) so that copies from it
  /// run at the link's full speed and asynchronously. Returns false when this backend has no
  /// such notion (host backends) or the memory could not be locked (the copies still work, from
  /// pageable memory). A true return must be paired with unpin_host(p) before the memory is freed.
  virtual bool pin_host(void* p, uint64_t bytes) {
    (void)p, (void)bytes;
    return false;
  }
  /// Undoes a successful pin_host(p).
  virtual void unpin_host(void* p) { (void)p; }

  // ---- Capabilities and strict device mode ---------------------------------------------------
  /// The ops of the table that this backend runs through the host: the generic implementations it
  /// does not override (generic_host_fallback_ops(), by name). Host backends (CpuBackend,
  /// ReferenceBackend) override all of them: none. A backend that overrides some overrides this.
  /// On CUDA: none.
  virtual std::span<const char* const> host_fallback_ops() const { return generic_host_fallback_ops(); }
  /// How this backend runs op `op` (a name of backend_op_names()); throws spool::Error for
  /// another name.
  OpRun op_run(std::string_view op) const;
  /// The capability table: every op of backend_op_names() with how this backend runs it.
  std::vector<OpCapability> capabilities() const;

  /// Strict device mode (a device backend's promise that a step never leaves the device): a
  /// generic host fallback (an activation's to_host round trip, host_fallback_ops()) or a host
  /// weight copied to the device for one call (a GPU backend's per-call staging of a weight that
  /// was not uploaded) throws spool::Error naming the op / weight instead of running. Explicit
  /// transfers stay allowed: to_host, row_to_f32 of host rows, host outputs (the logits), the
  /// contract's host index arrays, weight slots (copy_weight_into). No effect on host backends.
  /// Default: strict_device_from_env() (SPOOL_STRICT_DEVICE=1); spool's --strict-device sets it.
  void set_strict_device(bool on) { strict_device_ = on; }
  bool strict_device() const { return strict_device_; }
  /// Generic host fallbacks run so far (each call of one counted once; the capability test's
  /// evidence of what a backend really does).
  uint64_t host_fallback_calls() const { return host_fallback_calls_; }

 protected:
  /// Entry of a generic host fallback `op`: counts it, and in strict device mode on a device
  /// backend throws spool::Error naming `op` and this backend.
  void enter_host_fallback(const char* op);

  double copy_stall_s_ = 0;  // host backends: seconds in copy_weight_into

 private:
  std::vector<std::unique_ptr<uint64_t[]>> host_slots_;  // alloc_weight_slot on host backends
  bool strict_device_ = strict_device_from_env();
  uint64_t host_fallback_calls_ = 0;
};

}  // namespace spool::ops
