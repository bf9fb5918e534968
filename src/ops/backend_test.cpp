// Backend op test (the pattern of llama.cpp's test-backend-ops): every op of ops::Backend, on
// every backend compiled in, against ReferenceBackend (plain double-precision loops), over a
// table of shapes and weight / KV types, on every SIMD target of this CPU. A new backend
// adds itself to backends() and is checked by the same table.
//
// The table runs once per backend group (the test parameter): "cpu" (CpuBackend, 1 and 3
// threads, every SIMD target) and, in a build with SPOOL_CUDA, "cuda": CudaBackend through a
// harness that copies the host inputs to the device and the results back (so the ops see device
// pointers, uploaded weights and the host parameters of the contract), and CudaBackend called
// directly with host pointers (its staging path, and weights copied per call). Tolerances are the
// table's, unchanged for CUDA: matmul / matmul_multi 1e-4 and expert_ffn 2e-4 for every weight
// type (f32, bf16, f16, q2/q3/q4/ternary, rotated or not), attention 1e-5 for f32/f16/int8 KV,
// norms and routing 1e-5, rope and elementwise 1e-6, copies exact (relative to 1 + |want|).
// Without a GPU the "cuda" cases are SKIPPED with a message (the one allowed skip).
//
// Also here: the ops every model family calls are all in the table (a counting backend runs
// each tiny fixture family and the demo model), and the reference backend itself reproduces
// the transformers goldens (so it is a trustworthy oracle).
//
// The test is one executable over several files, by op family: backend_test.h (the harness and
// the weights of every type), backend_test_matmul_moe.cpp, backend_test_attention.cpp,
// backend_test_gdn_norms.cpp, backend_test_models.cpp, and this file (the instantiation of the
// table per backend group and the CUDA harness).
#include "ops/backend_test.h"

#include "support/backends.h"
#ifdef SPOOL_HAVE_CUDA
#include "experts/device_experts.h"
#include "experts/streaming.h"
#endif

namespace spool::ops {
namespace {

using namespace op_table;

INSTANTIATE_TEST_SUITE_P(All, BackendOpTable, ::testing::ValuesIn(spool::testing::backend_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

#ifdef SPOOL_HAVE_CUDA
// ---- CUDA: host-side harness and model forward ------------------------------------------------

// CudaBackend seen from the host: every op copies its host inputs to device buffers, runs on
// CudaBackend with device pointers (weights through upload()), and copies the results back. The
// contract's host arrays (norm weights, conv kernels, gate parameters, routing ids, expert groups,
// KV caches' host copy) are passed as they are.
class CudaHarness final : public Backend {
 public:
  CudaHarness() : be_(std::make_unique<CudaBackend>(0)) {}
  Device device() const override { return Device::kCpu; }
  const char* name() const override { return "cuda-harness"; }
  int threads() const override { return 1; }

  void matmul(const WeightView& w, const float* x, int64_t T, float* y) override {
    const WeightView dw = be_->upload(w);
    EXPECT_EQ(dw.device, Device::kCuda);
    CudaBuffer xd = up(x, T * w.cols), yd = zeros(T * w.rows);
    be_->matmul(dw, f(xd), T, f(yd));
    down(yd, y, T * w.rows);
  }
  void matmul_multi(std::span<const MatmulOut> outs, const float* x, int64_t T) override {
    CudaBuffer xd = up(x, T * outs[0].w->cols);
    std::vector<WeightView> ws;
    std::vector<CudaBuffer> ys;
    for (const MatmulOut& o : outs) {
      ws.push_back(be_->upload(*o.w));
      ys.push_back(zeros(T * o.w->rows));
    }
    std::vector<MatmulOut> d;
    for (size_t i = 0; i < outs.size(); ++i) d.push_back({&ws[i], f(ys[i])});
    be_->matmul_multi(d, f(xd), T);
    for (size_t i = 0; i < outs.size(); ++i) down(ys[i], outs[i].y, T * outs[i].w->rows);
  }
  void matmul_heads(std::span<const WeightView> w, const float* x, int64_t ldx, int64_t hx, int64_t T, float* y, int64_t ldy, int64_t hy,
                    float* xs, float* ys) override {
    std::vector<WeightView> dw;
    for (const WeightView& v : w) dw.push_back(be_->upload(v));
    CudaBuffer xd = up(x, T * ldx), yd = up(y, T * ldy), xsd = zeros(T * w[0].cols), ysd = zeros(T * w[0].rows);
    be_->matmul_heads(dw, f(xd), ldx, hx, T, f(yd), ldy, hy, f(xsd), f(ysd));
    (void)xs, (void)ys;
    down(yd, y, T * ldy);
  }
  void expert_ffn(std::span<const ExpertMats> experts, const ExpertGroups& groups, size_t g0, const float* x, int64_t H,
                  Activation act, float* y) override {
    std::vector<ExpertMats> d;
    std::vector<CudaBuffer> biases;  // gpt-oss expert biases, on the device like the model places them
    for (const ExpertMats& e : experts) {
      ExpertMats m{be_->upload(e.gate), be_->upload(e.up), be_->upload(e.down)};
      if (e.gate_bias) {
        biases.push_back(up(e.gate_bias, e.gate.rows));
        m.gate_bias = f(biases.back());
      }
      if (e.down_bias) {
        biases.push_back(up(e.down_bias, H));
        m.down_bias = f(biases.back());
      }
      d.push_back(m);
    }
    const int64_t ny = groups.T * groups.K * H;
    CudaBuffer xd = up(x, groups.T * H), yd = up(y, ny);  // y: rows of other batches kept
    be_->expert_ffn(d, groups, g0, f(xd), H, act, f(yd));
    down(yd, y, ny);
  }
  void moe_combine(const float* y, const ExpertGroups& groups, const float* weights, int64_t H, float* out) override {
    CudaBuffer yd = up(y, groups.T * groups.K * H), wd = up(weights, groups.T * groups.K), od = zeros(groups.T * H);
    be_->moe_combine(f(yd), groups, f(wd), H, f(od));
    down(od, out, groups.T * H);
  }
  void route_softmax_top_k(float* logits, int64_t T, int E, int k, bool renormalize, int* ids, float* weights,
                           float* margins) override {
    CudaBuffer ld = up(logits, T * E), wd = zeros(T * k), md = zeros(T);
    be_->route_softmax_top_k(f(ld), T, E, k, renormalize, ids, f(wd), margins ? f(md) : nullptr);
    down(wd, weights, T * k);
    if (margins) down(md, margins, T);
  }
  void kv_append(KvCache& cache, int64_t pos0, int64_t T, const float* k, const float* v) override {
    const int64_t w = static_cast<int64_t>(cache.n_kv_heads()) * cache.head_dim();
    CudaBuffer kd = up(k, T * w), vd = up(v, T * w);
    be_->kv_append(cache, pos0, T, f(kd), f(vd));
  }
  void attention(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, float* out) override {
    const int64_t n = T * n_heads * kv.head_dim();
    CudaBuffer qd = up(q, n), od = zeros(n);
    be_->attention(f(qd), T, n_heads, kv, pos0, scale, f(od));
    down(od, out, n);
  }
  void rope(const Rope& rope, float* x, int64_t T, int64_t row_stride, int n_heads, int head_dim, int64_t pos0) override {
    const int64_t n = (T - 1) * row_stride + static_cast<int64_t>(n_heads) * head_dim;
    CudaBuffer xd = up(x, n);
    be_->rope(rope, f(xd), T, row_stride, n_heads, head_dim, pos0);
    down(xd, x, n);
  }
  void causal_conv1d_silu(const float* x, int64_t T, int64_t C, const float* w, int K, float* state, float* out) override {
    CudaBuffer xd = up(x, T * C), sd = up(state, C * (K - 1)), od = zeros(T * C);
    be_->causal_conv1d_silu(f(xd), T, C, w, K, f(sd), f(od));
    down(sd, state, C * (K - 1));
    down(od, out, T * C);
  }
  void gated_delta(const GatedDeltaArgs& a, int chunk) override {
    const int64_t nq = a.T * a.n_k * a.d_k, nv = a.T * a.n_v * a.d_v, ns = static_cast<int64_t>(a.n_v) * a.d_k * a.d_v;
    CudaBuffer q = up(a.q, nq), k = up(a.k, nq), v = up(a.v, nv), b = up(a.beta, a.T * a.n_v), g = up(a.g, a.T * a.n_v);
    CudaBuffer s = up(a.state, ns), o = zeros(nv);
    GatedDeltaArgs d = a;
    d.q = f(q);
    d.k = f(k);
    d.v = f(v);
    d.beta = f(b);
    d.g = f(g);
    d.state = f(s);
    d.out = f(o);
    be_->gated_delta(d, chunk);
    down(s, a.state, ns);
    down(o, a.out, nv);
  }
  void gdn_gates(const float* b, const float* a, const float* a_exp, const float* dt_bias, int64_t T, int n_v, float* beta,
                 float* g) override {
    CudaBuffer bd = up(b, T * n_v), ad = up(a, T * n_v), betad = zeros(T * n_v), gd = zeros(T * n_v);
    be_->gdn_gates(f(bd), f(ad), a_exp, dt_bias, T, n_v, f(betad), f(gd));
    down(betad, beta, T * n_v);
    down(gd, g, T * n_v);
  }
  void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) override {
    CudaBuffer xd = up(x, rows * n), yd = zeros(rows * n);
    float* yp = x == y ? f(xd) : f(yd);
    be_->rms_norm(f(xd), w, rows, n, eps, yp);
    down(x == y ? xd : yd, y, rows * n);
  }
  void l2_norm(float* x, int64_t rows, int64_t n, float eps, float post_scale) override {
    CudaBuffer xd = up(x, rows * n);
    be_->l2_norm(f(xd), rows, n, eps, post_scale);
    down(xd, x, rows * n);
  }
  void rms_norm_gated(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) override {
    CudaBuffer xd = up(x, rows * n), zd = up(z, rows * n);
    be_->rms_norm_gated(f(xd), f(zd), w, rows, n, eps);
    down(xd, x, rows * n);
  }
  void attention_sinks(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, int64_t window,
                       const float* sinks, float* out) override {
    const int64_t n = T * n_heads * kv.head_dim();
    CudaBuffer qd = up(q, n), od = zeros(n);
    be_->attention_sinks(f(qd), T, n_heads, kv, pos0, scale, window, sinks, f(od));  // sinks: a host array
    down(od, out, n);
  }
  void add(float* y, const float* x, int64_t n) override {
    CudaBuffer yd = up(y, n), xd = up(x, n);
    be_->add(f(yd), f(xd), n);
    down(yd, y, n);
  }
  void add_rms_norm(float* h, const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) override {
    CudaBuffer hd = up(h, rows * n), xd = up(x, rows * n), yd = zeros(rows * n);
    be_->add_rms_norm(f(hd), f(xd), w, rows, n, eps, f(yd));
    down(hd, h, rows * n);
    down(yd, y, rows * n);
  }
  void add_bias(float* y, const float* b, int64_t rows, int64_t n) override {
    CudaBuffer yd = up(y, rows * n);
    be_->add_bias(f(yd), b, rows, n);  // b: a host parameter vector, as the contract allows
    down(yd, y, rows * n);
  }
  void swiglu(const float* gate, const float* up_, int64_t n, float* out) override {
    CudaBuffer gd = up(gate, n), ud = up(up_, n), od = zeros(n);
    float* op = out == gate ? f(gd) : f(od);
    be_->swiglu(f(gd), f(ud), n, op);
    down(out == gate ? gd : od, out, n);
  }
  void mul_sigmoid(float* x, const float* gate, int64_t n) override {
    CudaBuffer xd = up(x, n), gd = up(gate, n);
    be_->mul_sigmoid(f(xd), f(gd), n);
    down(xd, x, n);
  }
  void add_gated_rows(float* out, const float* s, const float* x, const float* w, int64_t T, int64_t n) override {
    CudaBuffer od = up(out, T * n), sd = up(s, T * n), xd = up(x, T * n);
    be_->add_gated_rows(f(od), f(sd), f(xd), w, T, n);
    down(od, out, T * n);
  }
  void copy_2d(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) override {
    const int64_t nd = (rows - 1) * ld_dst + cols, ns = (rows - 1) * ld_src + cols;
    CudaBuffer dd = up(dst, nd), sd = up(src, ns);
    be_->copy_2d(f(dd), ld_dst, f(sd), ld_src, rows, cols);
    down(dd, dst, nd);
  }
  void row_to_f32(WType t, const void* src, int64_t n, float* dst) override {
    CudaBuffer dd = zeros(n);
    be_->row_to_f32(t, src, n, f(dd));  // src: a host row (the embedding table stays on the host)
    down(dd, dst, n);
  }
  void to_host(const float* src, int64_t n, float* dst) override {
    CudaBuffer sd = up(src, n);
    be_->to_host(f(sd), n, dst);
  }

 private:
  static CudaBuffer up(const float* p, int64_t n) {
    CudaBuffer b(static_cast<size_t>(std::max<int64_t>(n, 1)) * 4);
    b.upload(p, static_cast<size_t>(n) * 4);
    return b;
  }
  static CudaBuffer zeros(int64_t n) {
    std::vector<float> nan(static_cast<size_t>(std::max<int64_t>(n, 1)), NAN);  // unwritten outputs show as NaN
    return up(nan.data(), static_cast<int64_t>(nan.size()));
  }
  static float* f(const CudaBuffer& b) { return static_cast<float*>(b.get()); }
  void down(const CudaBuffer& b, float* dst, int64_t n) {
    be_->synchronize();
    b.download(dst, static_cast<size_t>(n) * 4);
  }
  std::unique_ptr<CudaBackend> be_;
};

#endif  // SPOOL_HAVE_CUDA

}  // namespace

#ifdef SPOOL_HAVE_CUDA
std::unique_ptr<Backend> op_table::make_cuda_harness() { return std::make_unique<CudaHarness>(); }
#endif

}  // namespace spool::ops
