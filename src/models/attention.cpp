#include "models/attention.h"

#include <cmath>
#include <cstring>

#include "models/bind.h"
#include "ops/kv_cache.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace spool::models {

void AttentionLayer::bind(const io::Checkpoint& ck, const std::string& prefix, const ModelSpec& spec) {
  a_ = spec.attn;
  eps_ = spec.rms_norm_eps;
  const int64_t H = spec.hidden_size, hd = a_.head_dim;
  wq_ = bind_matrix(ck, prefix + "q_proj.weight", a_.n_heads * hd * (a_.output_gate ? 2 : 1), H);
  wk_ = bind_matrix(ck, prefix + "k_proj.weight", a_.n_kv_heads * hd, H);
  wv_ = bind_matrix(ck, prefix + "v_proj.weight", a_.n_kv_heads * hd, H);
  wo_ = bind_matrix(ck, prefix + "o_proj.weight", H, a_.n_heads * hd);
  if (a_.qk_norm) {
    q_norm_ = bind_norm(ck, prefix + "q_norm.weight", hd, spec.norm_one_plus);
    k_norm_ = bind_norm(ck, prefix + "k_norm.weight", hd, spec.norm_one_plus);
  }
  rope_ = ops::Rope(a_.rotary_dim, a_.rope_theta);
}

void AttentionLayer::forward(const float* x, int64_t T, int64_t pos0, AttnCache& cache, float* out,
                             ops::ThreadPool* pool) {
  const int nh = a_.n_heads, nkv = a_.n_kv_heads, hd = a_.head_dim;
  q_.resize(T * nh * hd);
  kx_.resize(T * nkv * hd);
  vx_.resize(T * nkv * hd);
  att_.resize(T * nh * hd);
  if (a_.output_gate) {
    // [T, nh, 2*hd] -> query [T, nh, hd] and gate [T, nh*hd].
    qg_.resize(T * nh * 2 * hd);
    gate_.resize(T * nh * hd);
    ops::matmul_multi({{&wq_, qg_.data()}, {&wk_, kx_.data()}, {&wv_, vx_.data()}}, x, T, pool);
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < nh; ++h) {
        const float* src = qg_.data() + (t * nh + h) * 2 * hd;
        std::memcpy(q_.data() + (t * nh + h) * hd, src, hd * sizeof(float));
        std::memcpy(gate_.data() + (t * nh + h) * hd, src + hd, hd * sizeof(float));
      }
  } else {
    ops::matmul_multi({{&wq_, q_.data()}, {&wk_, kx_.data()}, {&wv_, vx_.data()}}, x, T, pool);
  }
  for (int64_t t = 0; t < T; ++t) {
    float* qt = q_.data() + t * nh * hd;
    float* kt = kx_.data() + t * nkv * hd;
    if (a_.qk_norm) {
      ops::rms_norm_rows(qt, q_norm_.data(), nh, hd, eps_, qt);
      ops::rms_norm_rows(kt, k_norm_.data(), nkv, hd, eps_, kt);
    }
    rope_.apply(qt, nh, hd, pos0 + t);
    rope_.apply(kt, nkv, hd, pos0 + t);
    cache.write(pos0 + t, kt, vx_.data() + t * nkv * hd);  // k normed and rotated, v raw
  }
  ops::attention(q_.data(), T, nh, cache, pos0, 1.0f / std::sqrt(static_cast<float>(hd)), att_.data(), pool);
  if (a_.output_gate)
    for (int64_t i = 0; i < T * nh * hd; ++i) att_[i] *= ops::sigmoid(gate_[i]);
  ops::matmul(wo_, att_.data(), T, out, pool);
}

}  // namespace spool::models
