#include "ops/backend.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "ops/elementwise.h"
#include "ops/mla.h"

namespace spool::ops {

const char* device_name(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

namespace {
// Declaration order of backend.h's op table.
constexpr const char* kOpNames[] = {
    "matmul",          "matmul_multi",      "matmul_heads",   "expert_ffn",     "moe_combine",      "expert_ffn_routed", "route_softmax_top_k",
    "kv_append",       "attention",         "rope",           "causal_conv1d_silu", "gated_delta",     "gdn_gates",
    "rms_norm",        "l2_norm",           "rms_norm_gated", "add_rms_norm",     "add",              "add_bias",          "swiglu",
    "mul_sigmoid",     "add_gated_rows",    "copy_2d",        "route_grouped_top_k", "gelu_tanh_glu",   "scale",
    "softcap",         "mul_indexed",       "attention_window", "attention_sinks", "mla_attention",   "row_to_f32",
    "to_host"};
constexpr const char* kGenericFallbacks[] = {"route_grouped_top_k", "gelu_tanh_glu", "scale", "softcap", "mul_indexed",
                                             "attention_window", "attention_sinks", "mla_attention"};
}  // namespace

std::span<const char* const> backend_op_names() { return kOpNames; }
std::span<const char* const> generic_host_fallback_ops() { return kGenericFallbacks; }

const char* op_run_name(OpRun r) {
  switch (r) {
    case OpRun::kNative: return "native";
    case OpRun::kHostFallback: return "host fallback";
    case OpRun::kUnavailable: return "unavailable";
  }
  return "?";
}

bool strict_device_from_env() {
  const char* e = std::getenv("SPOOL_STRICT_DEVICE");
  return e != nullptr && e[0] == '1' && e[1] == '\0';
}

OpRun Backend::op_run(std::string_view op) const {
  if (std::find(std::begin(kOpNames), std::end(kOpNames), op) == std::end(kOpNames))
    fail("%s backend: '%.*s' is not an op of the backend table", name(), static_cast<int>(op.size()), op.data());
  for (const char* f : host_fallback_ops())
    if (op == f) return OpRun::kHostFallback;
  if (op == "expert_ffn_routed" && max_routed_pairs() == 0) return OpRun::kUnavailable;
  return OpRun::kNative;
}

std::vector<OpCapability> Backend::capabilities() const {
  std::vector<OpCapability> t;
  for (const char* op : kOpNames) t.push_back({op, op_run(op)});
  return t;
}

void Backend::enter_host_fallback(const char* op) {
  ++host_fallback_calls_;
  if (strict_device_ && device() != Device::kCpu)
    fail("%s backend (strict device mode): %s has no %s kernel and would run on the host (a to_host round trip of its "
         "activations); run without SPOOL_STRICT_DEVICE / --strict-device",
         name(), op, name());
}

namespace {

constexpr uint64_t kPackAlign = 256;
uint64_t pack_round(uint64_t n) { return (n + kPackAlign - 1) / kPackAlign * kPackAlign; }

// The parts of w as (source, bytes), in packing order; each setter re-points one part of a view.
struct PackPart {
  const void* src;
  uint64_t bytes;
  void (*set)(WeightView&, const void*);
};

std::vector<PackPart> pack_parts(const WeightView& w) {
  std::vector<PackPart> parts;
  if (w.type == WType::kMxfp4) {
    parts.push_back({w.data, static_cast<uint64_t>(w.rows * (w.cols / 2)), [](WeightView& v, const void* p) { v.data = p; }});
    parts.push_back({w.mx_scales, static_cast<uint64_t>(w.rows * (w.cols / 32)),
                     [](WeightView& v, const void* p) { v.mx_scales = static_cast<const uint8_t*>(p); }});
  } else if (w.type == WType::kQuant) {
    const QuantView& q = w.quant;
    parts.push_back({q.qweight, static_cast<uint64_t>(q.rows * q.row_bytes()),
                     [](WeightView& v, const void* p) { v.quant.qweight = static_cast<const uint8_t*>(p); }});
    parts.push_back({q.scales, static_cast<uint64_t>(q.rows * q.groups_per_row()) * 2,
                     [](WeightView& v, const void* p) { v.quant.scales = static_cast<const uint16_t*>(p); }});
    parts.push_back({q.codebook, static_cast<uint64_t>(qtype_levels(q.type)) * 4,
                     [](WeightView& v, const void* p) { v.quant.codebook = static_cast<const float*>(p); }});
    if (q.signs)
      parts.push_back({q.signs, static_cast<uint64_t>(q.cols), [](WeightView& v, const void* p) { v.quant.signs = static_cast<const int8_t*>(p); }});
  } else {
    parts.push_back({w.data, w.nbytes(), [](WeightView& v, const void* p) { v.data = p; }});
  }
  return parts;
}

}  // namespace

uint64_t packed_weight_bytes(const WeightView& w) {
  uint64_t n = 0;
  for (const PackPart& p : pack_parts(w)) n += pack_round(p.bytes);
  return n;
}

WeightView pack_weight(const WeightView& w, void* dst, Device device,
                       const std::function<void(void* to, const void* from, size_t bytes)>& copy) {
  WeightView d = w;
  d.device = device;
  char* at = static_cast<char*>(dst);
  for (const PackPart& p : pack_parts(w)) {
    copy(at, p.src, static_cast<size_t>(p.bytes));
    p.set(d, at);
    at += pack_round(p.bytes);
  }
  return d;
}

void* Backend::alloc_weight_slot(uint64_t bytes) {
  host_slots_.push_back(std::make_unique<uint64_t[]>((std::max<uint64_t>(bytes, 1) + 7) / 8));
  return host_slots_.back().get();
}

WeightView Backend::copy_weight_into(const WeightView& w, void* slot) {
  const auto t0 = std::chrono::steady_clock::now();
  WeightView v = pack_weight(w, slot, device(), [](void* to, const void* from, size_t n) { std::memcpy(to, from, n); });
  copy_stall_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return v;
}

ExpertGroups group_by_expert(const int* ids, int64_t T, int K, int n_experts) {
  ExpertGroups g;
  g.T = T;
  g.K = K;
  const int64_t n = T * K;
  std::vector<int64_t> count(static_cast<size_t>(n_experts), 0);
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= n_experts) fail("routing chose expert %d, outside 0..%d", ids[i], n_experts - 1);
    ++count[ids[i]];
  }
  std::vector<int64_t> start(static_cast<size_t>(n_experts), 0);
  g.first.push_back(0);
  for (int e = 0; e < n_experts; ++e) {
    if (count[e] == 0) continue;
    start[e] = g.first.back();
    g.active.push_back(e);
    g.first.push_back(g.first.back() + count[e]);
  }
  g.rows.resize(n);
  g.row_of.resize(n);
  for (int64_t r = 0; r < n; ++r) {  // ascending r within each expert's block
    const int64_t j = start[ids[r]]++;
    g.rows[j] = r;
    g.row_of[r] = j;
  }
  return g;
}

void Backend::expert_ffn_routed(const void*, const float*, int64_t, int64_t, const int*, const float*, int, float*, const ExpertMats*,
                                float*) {
  fail("%s backend: no routed expert path (make_expert_table gives no table here)", name());
}

// Generic implementations: device data comes to the host (to_host), the host kernel runs, the
// result goes back (row_to_f32 of an f32 row copies host memory to the backend's device).
void Backend::route_grouped_top_k(const float* logits, int64_t T, int E, int k, const RouterParams& r, int* ids, float* weights,
                                  float* margins) {
  enter_host_fallback("route_grouped_top_k");
  std::vector<float> l(static_cast<size_t>(T * E)), w(static_cast<size_t>(T * k)), m(static_cast<size_t>(T));
  to_host(logits, T * E, l.data());
  for (int64_t t = 0; t < T; ++t) route_grouped(l.data() + t * E, E, k, r, ids + t * k, w.data() + t * k, margins ? m.data() + t : nullptr);
  row_to_f32(WType::kF32, w.data(), T * k, weights);
  if (margins) row_to_f32(WType::kF32, m.data(), T, margins);
}

void Backend::matmul_heads(std::span<const WeightView> w, const float* x, int64_t ldx, int64_t hx, int64_t T, float* y, int64_t ldy,
                           int64_t hy, float* xs, float* ys) {
  for (size_t h = 0; h < w.size(); ++h) {
    const int64_t rows = w[h].rows, cols = w[h].cols;
    if (rows != w[0].rows || cols != w[0].cols)
      fail("matmul_heads: head %zu is %lld x %lld, head 0 %lld x %lld", h, (long long)rows, (long long)cols, (long long)w[0].rows,
           (long long)w[0].cols);
    copy_2d(xs, cols, x + static_cast<int64_t>(h) * hx, ldx, T, cols);
    matmul(w[h], xs, T, ys);
    copy_2d(y + static_cast<int64_t>(h) * hy, ldy, ys, rows, T, rows);
  }
}

void Backend::add_rms_norm(float* h, const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) {
  add(h, x, rows * n);
  rms_norm(h, w, rows, n, eps, y);
}

void Backend::gelu_tanh_glu(const float* gate, const float* up, int64_t n, float* out) {
  enter_host_fallback("gelu_tanh_glu");
  std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
  to_host(gate, n, g.data());
  to_host(up, n, u.data());
  ops::gelu_tanh_glu(g.data(), u.data(), n, g.data());
  row_to_f32(WType::kF32, g.data(), n, out);
}

void Backend::scale(float* x, int64_t n, float a) {
  enter_host_fallback("scale");
  std::vector<float> h(static_cast<size_t>(n));
  to_host(x, n, h.data());
  for (float& v : h) v *= a;
  row_to_f32(WType::kF32, h.data(), n, x);
}

void Backend::softcap(float* x, int64_t n, float cap) {
  enter_host_fallback("softcap");
  std::vector<float> h(static_cast<size_t>(n));
  to_host(x, n, h.data());
  ops::softcap(h.data(), n, cap);
  row_to_f32(WType::kF32, h.data(), n, x);
}

void Backend::mul_indexed(float* w, const int* ids, const float* table, int64_t n) {
  enter_host_fallback("mul_indexed");
  std::vector<float> h(static_cast<size_t>(n));
  to_host(w, n, h.data());
  for (int64_t i = 0; i < n; ++i) h[i] *= table[ids[i]];
  row_to_f32(WType::kF32, h.data(), n, w);
}

void Backend::attention_window(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale,
                               int64_t window, float* out) {
  if (window <= 0 || pos0 + T <= window) return attention(q, T, n_heads, kv, pos0, scale, out);
  enter_host_fallback("attention_window");
  const int64_t n = T * n_heads * kv.head_dim();
  std::vector<float> qh(static_cast<size_t>(n)), oh(static_cast<size_t>(n));
  to_host(q, n, qh.data());
  ops::attention(qh.data(), T, n_heads, kv, pos0, scale, oh.data(), nullptr, window);
  row_to_f32(WType::kF32, oh.data(), n, out);
}

void Backend::attention_sinks(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale,
                              int64_t window, const float* sinks, float* out) {
  enter_host_fallback("attention_sinks");
  const int64_t n = T * n_heads * kv.head_dim();
  std::vector<float> qh(static_cast<size_t>(n)), oh(static_cast<size_t>(n));
  to_host(q, n, qh.data());
  ops::attention(qh.data(), T, n_heads, kv, pos0, scale, oh.data(), nullptr, window, sinks);
  row_to_f32(WType::kF32, oh.data(), n, out);
}

void Backend::mla_attention(const float* q, int64_t T, int n_heads, const KvCache& latent, int64_t pos0, float scale, int dv,
                            float* out) {
  enter_host_fallback("mla_attention");
  std::vector<float> qh(static_cast<size_t>(T * n_heads * latent.head_dim())), oh(static_cast<size_t>(T * n_heads * dv));
  to_host(q, static_cast<int64_t>(qh.size()), qh.data());
  ops::mla_attention(qh.data(), T, n_heads, latent, pos0, scale, dv, oh.data(), nullptr);
  row_to_f32(WType::kF32, oh.data(), static_cast<int64_t>(oh.size()), out);
}

}  // namespace spool::ops
