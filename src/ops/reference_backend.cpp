#include "ops/reference_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "ops/lora.h"
#include "ops/matmul.h"

namespace spool::ops {

namespace {

double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double silu_d(double x) { return x * sig(x); }
double softplus_d(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

}  // namespace

// matmul_reference: dequantize / convert each row, dot in double (matmul.cpp, quant_matmul.cpp).
void ReferenceBackend::matmul(const WeightView& w, const float* x, int64_t T, float* y) { matmul_reference(w, x, T, y); }

void ReferenceBackend::matmul_multi(std::span<const MatmulOut> outs, const float* x, int64_t T) {
  for (const MatmulOut& o : outs) matmul_reference(*o.w, x, T, o.y);
}

void ReferenceBackend::expert_ffn(std::span<const ExpertMats> experts, const ExpertGroups& groups, size_t g0,
                                  const float* x, int64_t H, Activation act, float* y) {
  const LoraRowScales* step_rows = lora_rows();  // per-row adapter scales of the step (ops/lora.h), if any
  for (size_t j = 0; j < experts.size(); ++j) {
    const ExpertMats& w = experts[j];
    const bool oai = act == Activation::kClampedSwiGLU;  // fused interleaved gate_up [2I, H], biases
    const int64_t I = oai ? w.gate.rows / 2 : w.gate.rows;
    std::vector<float> g(w.gate.rows), u(I), h(I);
    for (int64_t r = groups.first[g0 + j]; r < groups.first[g0 + j + 1]; ++r) {
      const float* xt = x + (groups.rows[r] / groups.K) * H;
      LoraRowScales one;  // this token's row of the step's adapter scales
      if (step_rows != nullptr) one = {step_rows->scales + (groups.rows[r] / groups.K) * step_rows->n_adapters, 1, step_rows->n_adapters};
      const LoraRowsScope row_scope(step_rows != nullptr ? &one : nullptr);
      matmul_reference(w.gate, xt, 1, g.data());
      if (!oai) matmul_reference(w.up, xt, 1, u.data());
      for (int64_t i = 0; i < I; ++i) {
        switch (act) {
          case Activation::kSwiGLU: h[i] = static_cast<float>(silu_d(g[i]) * u[i]); break;
          case Activation::kGeluTanhGLU: {
            const double x = g[i];
            h[i] = static_cast<float>(0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * u[i]);
            break;
          }
          case Activation::kClampedSwiGLU: {
            double gi = static_cast<double>(g[2 * i]) + (w.gate_bias ? w.gate_bias[2 * i] : 0.0f);
            double ui = static_cast<double>(g[2 * i + 1]) + (w.gate_bias ? w.gate_bias[2 * i + 1] : 0.0f);
            gi = std::min(gi, static_cast<double>(kGptOssLimit));
            ui = std::clamp(ui, -static_cast<double>(kGptOssLimit), static_cast<double>(kGptOssLimit));
            h[i] = static_cast<float>((ui + 1.0) * gi * sig(static_cast<double>(kGptOssAlpha) * gi));
            break;
          }
        }
      }
      matmul_reference(w.down, h.data(), 1, y + r * H);
      if (w.down_bias)
        for (int64_t d = 0; d < H; ++d) y[r * H + d] += w.down_bias[d];
    }
  }
}

void ReferenceBackend::moe_combine(const float* y, const ExpertGroups& groups, const float* weights, int64_t H, float* out) {
  const int K = groups.K;
  for (int64_t t = 0; t < groups.T; ++t)
    for (int64_t d = 0; d < H; ++d) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += static_cast<double>(weights[t * K + k]) * y[groups.row_of[t * K + k] * H + d];
      out[t * H + d] = static_cast<float>(s);
    }
}

void ReferenceBackend::route_softmax_top_k(float* logits, int64_t T, int E, int k, bool renormalize, int* ids,
                                           float* weights, float* margins) {
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    const double m = *std::max_element(l, l + E);
    std::vector<double> p(E);
    double z = 0;
    for (int e = 0; e < E; ++e) z += (p[e] = std::exp(l[e] - m));
    for (int e = 0; e < E; ++e) p[e] /= z;
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    double kept = 0;
    for (int i = 0; i < k; ++i) kept += p[order[i]];
    for (int i = 0; i < k; ++i) {
      ids[t * k + i] = order[i];
      weights[t * k + i] = static_cast<float>(renormalize ? p[order[i]] / kept : p[order[i]]);
    }
    if (margins) margins[t] = k < E ? static_cast<float>(p[order[k - 1]] - p[order[k]]) : 1.0f;
  }
}

// Written from RouterParams' definition (routing.h) in double precision; group masking to 0.0
// or -inf.
void ReferenceBackend::gelu_tanh_glu(const float* gate, const float* up, int64_t n, float* out) {
  // gelu_pytorch_tanh(g) * u = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) u
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * up[i]);
  }
}

void ReferenceBackend::scale(float* x, int64_t n, float a) {
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(static_cast<double>(x[i]) * a);
}

void ReferenceBackend::softcap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(cap * std::tanh(static_cast<double>(x[i]) / cap));
}

void ReferenceBackend::mul_indexed(float* w, const int* ids, const float* table, int64_t n) {
  for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(static_cast<double>(w[i]) * table[ids[i]]);
}

void ReferenceBackend::route_grouped_top_k(const float* logits, int64_t T, int E, int k, const RouterParams& r, int* ids,
                                           float* weights, float* margins) {
  for (int64_t t = 0; t < T; ++t) {
    const float* l = logits + t * E;
    std::vector<double> s(E), sel(E);
    if (r.sigmoid) {
      for (int e = 0; e < E; ++e) s[e] = sig(l[e]);
    } else {
      const double m = *std::max_element(l, l + E);
      double z = 0;
      for (int e = 0; e < E; ++e) z += (s[e] = std::exp(l[e] - m));
      for (int e = 0; e < E; ++e) s[e] /= z;
    }
    for (int e = 0; e < E; ++e) sel[e] = s[e] + (r.bias ? r.bias[e] : 0.0);
    const int G = std::max(1, r.n_group);
    if (G > 1 && r.topk_group < G && E % G == 0) {
      const int per = E / G;
      std::vector<double> gs(G);
      for (int g = 0; g < G; ++g) {
        std::vector<double> v(sel.begin() + g * per, sel.begin() + (g + 1) * per);
        std::sort(v.rbegin(), v.rend());
        gs[g] = r.group_top2_sum ? v[0] + (per > 1 ? v[1] : 0.0) : v[0];
      }
      std::vector<int> go(G);
      std::iota(go.begin(), go.end(), 0);
      std::stable_sort(go.begin(), go.end(), [&](int a, int b) { return gs[a] > gs[b]; });
      for (int i = r.topk_group; i < G; ++i)
        for (int e = go[i] * per; e < (go[i] + 1) * per; ++e) sel[e] = r.mask_neg_inf ? -INFINITY : 0.0;
    }
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return sel[a] > sel[b]; });
    double kept = 0;
    for (int i = 0; i < k; ++i) kept += s[order[i]];
    for (int i = 0; i < k; ++i) {
      ids[t * k + i] = order[i];
      weights[t * k + i] = static_cast<float>((r.renormalize ? s[order[i]] / (kept + 1e-20) : s[order[i]]) * r.scaling);
    }
    if (margins) margins[t] = k < E && std::isfinite(sel[order[k]]) ? static_cast<float>(sel[order[k - 1]] - sel[order[k]]) : 1.0f;
  }
}

void ReferenceBackend::attention_window(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale,
                                        int64_t window, float* out) {
  const int hd = kv.head_dim(), group = n_heads / kv.n_kv_heads();
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < n_heads; ++h) {
      const float* qh = q + (t * n_heads + h) * hd;
      const int kvh = h / group;
      const int64_t n = pos0 + t + 1, lo = window > 0 ? std::max<int64_t>(0, n - window) : 0;
      std::vector<double> s(n - lo);
      double m = -INFINITY;
      for (int64_t p = lo; p < n; ++p) {
        double d = 0;
        for (int i = 0; i < hd; ++i) d += static_cast<double>(qh[i]) * kv.key(kvh, p, i);
        s[p - lo] = d * scale;
        m = std::max(m, s[p - lo]);
      }
      double z = 0;
      for (auto& e : s) z += (e = std::exp(e - m));
      for (int i = 0; i < hd; ++i) {
        double acc = 0;
        for (int64_t p = lo; p < n; ++p) acc += s[p - lo] / z * kv.value(kvh, p, i);
        out[(t * n_heads + h) * hd + i] = static_cast<float>(acc);
      }
    }
}

void ReferenceBackend::attention_sinks(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale,
                                       int64_t window, const float* sinks, float* out) {
  const int hd = kv.head_dim(), group = n_heads / kv.n_kv_heads();
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < n_heads; ++h) {
      const float* qh = q + (t * n_heads + h) * hd;
      const int kvh = h / group;
      const int64_t n = pos0 + t + 1, lo = window > 0 ? std::max<int64_t>(0, n - window) : 0;
      std::vector<double> s(n - lo);
      double m = sinks[h];
      for (int64_t p = lo; p < n; ++p) {
        double d = 0;
        for (int i = 0; i < hd; ++i) d += static_cast<double>(qh[i]) * kv.key(kvh, p, i);
        s[p - lo] = d * scale;
        m = std::max(m, s[p - lo]);
      }
      double z = std::exp(sinks[h] - m);
      for (auto& e : s) z += (e = std::exp(e - m));
      for (int i = 0; i < hd; ++i) {
        double acc = 0;
        for (int64_t p = lo; p < n; ++p) acc += s[p - lo] / z * kv.value(kvh, p, i);
        out[(t * n_heads + h) * hd + i] = static_cast<float>(acc);
      }
    }
}

void ReferenceBackend::mla_attention(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale,
                                     int dv, float* out) {
  const int D = kv.head_dim();
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < n_heads; ++h) {
      const float* qh = q + (t * n_heads + h) * D;
      const int64_t n = pos0 + t + 1;
      std::vector<double> s(n);
      double m = -INFINITY;
      for (int64_t p = 0; p < n; ++p) {
        double d = 0;
        for (int i = 0; i < D; ++i) d += static_cast<double>(qh[i]) * kv.key(0, p, i);
        s[p] = d * scale;
        m = std::max(m, s[p]);
      }
      double z = 0;
      for (auto& e : s) z += (e = std::exp(e - m));
      for (int i = 0; i < dv; ++i) {
        double acc = 0;
        for (int64_t p = 0; p < n; ++p) acc += s[p] / z * kv.key(0, p, i);
        out[(t * n_heads + h) * dv + i] = static_cast<float>(acc);
      }
    }
}

// The cache's storage format (f32 / f16 / int8 with scales) belongs to KvCache itself.
void ReferenceBackend::kv_append(KvCache& cache, int64_t pos0, int64_t T, const float* k, const float* v) {
  const int64_t w = static_cast<int64_t>(cache.n_kv_heads()) * cache.head_dim();
  for (int64_t t = 0; t < T; ++t) cache.write(pos0 + t, k + t * w, v + t * w);
}

void ReferenceBackend::attention(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale,
                                 float* out) {
  const int hd = kv.head_dim(), group = n_heads / kv.n_kv_heads();
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < n_heads; ++h) {
      const float* qh = q + (t * n_heads + h) * hd;
      const int kvh = h / group;
      const int64_t n = pos0 + t + 1;
      std::vector<double> s(n);
      double m = -INFINITY;
      for (int64_t p = 0; p < n; ++p) {
        double d = 0;
        for (int i = 0; i < hd; ++i) d += static_cast<double>(qh[i]) * kv.key(kvh, p, i);
        s[p] = d * scale;
        m = std::max(m, s[p]);
      }
      double z = 0;
      for (auto& e : s) z += (e = std::exp(e - m));
      for (int i = 0; i < hd; ++i) {
        double acc = 0;
        for (int64_t p = 0; p < n; ++p) acc += s[p] / z * kv.value(kvh, p, i);
        out[(t * n_heads + h) * hd + i] = static_cast<float>(acc);
      }
    }
}

void ReferenceBackend::rope(const Rope& rope, float* x, int64_t T, int64_t row_stride, int n_heads, int head_dim,
                            int64_t pos0) {
  const int half = rope.rotary_dim() / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + t * row_stride + static_cast<int64_t>(h) * head_dim;
      if (rope.pairs()) {  // HF apply_rotary_pos_emb_interleave: view(d/2, 2).transpose -> [even | odd]
        std::vector<float> even(half), odd(half);
        for (int i = 0; i < half; ++i) even[i] = v[2 * i], odd[i] = v[2 * i + 1];
        std::copy(even.begin(), even.end(), v);
        std::copy(odd.begin(), odd.end(), v + half);
      }
      for (int i = 0; i < half; ++i) {
        // HF: the angle is an f32 product of position and inverse frequency.
        const double ang = static_cast<float>(static_cast<float>(pos0 + t) * rope.inv_freq()[i]);
        const double c = std::cos(ang) * rope.scaling(), s = std::sin(ang) * rope.scaling();
        const double a = v[i], b = v[i + half];
        v[i] = static_cast<float>(a * c - b * s);
        v[i + half] = static_cast<float>(b * c + a * s);
      }
    }
}

void ReferenceBackend::causal_conv1d_silu(const float* x, int64_t T, int64_t C, const float* w, int K, float* state,
                                          float* out) {
  const int S = K - 1;
  for (int64_t c = 0; c < C; ++c) {
    auto in = [&](int64_t i) {  // input at time i, i < 0 from the state
      return i < 0 ? static_cast<double>(state[c * S + (S + i)]) : static_cast<double>(x[i * C + c]);
    };
    for (int64_t t = 0; t < T; ++t) {
      double acc = 0;
      for (int j = 0; j < K; ++j) acc += static_cast<double>(w[c * K + j]) * in(t - (K - 1) + j);
      out[t * C + c] = static_cast<float>(silu_d(acc));
    }
    std::vector<float> last(S);
    for (int j = 0; j < S; ++j) last[j] = static_cast<float>(in(T - S + j));
    std::copy(last.begin(), last.end(), state + c * S);
  }
}

// The recurrence itself for every T (the chunked form is an algebraic rewrite of it).
void ReferenceBackend::gated_delta(const GatedDeltaArgs& a, int /*chunk*/) {
  const int dk = a.d_k, dv = a.d_v;
  for (int h = 0; h < a.n_v; ++h) {
    const int kh = h / (a.n_v / a.n_k);
    std::vector<double> S(static_cast<size_t>(dk) * dv);
    float* St = a.state + static_cast<int64_t>(h) * dk * dv;
    for (size_t i = 0; i < S.size(); ++i) S[i] = St[i];
    for (int64_t t = 0; t < a.T; ++t) {
      const float* q = a.q + (t * a.n_k + kh) * dk;
      const float* k = a.k + (t * a.n_k + kh) * dk;
      const float* v = a.v + (t * a.n_v + h) * dv;
      const double beta = a.beta[t * a.n_v + h], decay = std::exp(static_cast<double>(a.g[t * a.n_v + h]));
      for (auto& s : S) s *= decay;
      for (int j = 0; j < dv; ++j) {
        double kS = 0;
        for (int i = 0; i < dk; ++i) kS += k[i] * S[i * dv + j];
        const double u = (v[j] - kS) * beta;
        for (int i = 0; i < dk; ++i) S[i * dv + j] += k[i] * u;
      }
      for (int j = 0; j < dv; ++j) {
        double o = 0;
        for (int i = 0; i < dk; ++i) o += q[i] * S[i * dv + j];
        a.out[(t * a.n_v + h) * dv + j] = static_cast<float>(o);
      }
    }
    for (size_t i = 0; i < S.size(); ++i) St[i] = static_cast<float>(S[i]);
  }
}

void ReferenceBackend::gdn_gates(const float* b, const float* a, const float* a_exp, const float* dt_bias, int64_t T,
                                 int n_v, float* beta, float* g) {
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < n_v; ++h) {
      beta[t * n_v + h] = static_cast<float>(sig(b[t * n_v + h]));
      g[t * n_v + h] = static_cast<float>(-static_cast<double>(a_exp[h]) * softplus_d(static_cast<double>(a[t * n_v + h]) + dt_bias[h]));
    }
}

void ReferenceBackend::rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[r * n + i]) * x[r * n + i];
    const double inv = 1.0 / std::sqrt(ss / n + eps);
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = static_cast<float>(x[r * n + i] * inv * w[i]);
  }
}

void ReferenceBackend::l2_norm(float* x, int64_t rows, int64_t n, float eps, float post_scale) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[r * n + i]) * x[r * n + i];
    const double inv = 1.0 / std::sqrt(ss + eps);
    for (int64_t i = 0; i < n; ++i) x[r * n + i] = static_cast<float>(x[r * n + i] * inv * post_scale);
  }
}

void ReferenceBackend::rms_norm_gated(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) {
  rms_norm(x, w, rows, n, eps, x);
  for (int64_t i = 0; i < rows * n; ++i) x[i] = static_cast<float>(x[i] * silu_d(z[i]));
}

void ReferenceBackend::add(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(static_cast<double>(y[i]) + x[i]);
}

void ReferenceBackend::add_bias(float* y, const float* b, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = static_cast<float>(static_cast<double>(y[r * n + i]) + b[i]);
}

void ReferenceBackend::swiglu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(silu_d(gate[i]) * up[i]);
}

void ReferenceBackend::mul_sigmoid(float* x, const float* gate, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(x[i] * sig(gate[i]));
}

void ReferenceBackend::add_gated_rows(float* out, const float* s, const float* x, const float* w, int64_t T, int64_t n) {
  for (int64_t t = 0; t < T; ++t) {
    double d = 0;
    if (w != nullptr)
      for (int64_t i = 0; i < n; ++i) d += static_cast<double>(x[t * n + i]) * w[i];
    const double gate = w == nullptr ? 1.0 : sig(d);
    for (int64_t i = 0; i < n; ++i) out[t * n + i] = static_cast<float>(out[t * n + i] + gate * s[t * n + i]);
  }
}

void ReferenceBackend::copy_2d(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * ld_dst + c] = src[r * ld_src + c];
}

void ReferenceBackend::row_to_f32(WType t, const void* src, int64_t n, float* dst) {
  const auto* b = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    switch (t) {
      case WType::kF32: std::memcpy(dst + i, b + 4 * i, 4); break;
      case WType::kBF16: std::memcpy(&h, b + 2 * i, 2); dst[i] = bf16_to_f32(h); break;
      case WType::kF16: std::memcpy(&h, b + 2 * i, 2); dst[i] = f16_to_f32(h); break;
      case WType::kQuant:
      case WType::kGgml:
      case WType::kMxfp4: dst[i] = NAN; break;  // rows of quantized tables are not read (bind refuses them)
    }
  }
}

void ReferenceBackend::to_host(const float* src, int64_t n, float* dst) { std::copy_n(src, n, dst); }

}  // namespace spool::ops
