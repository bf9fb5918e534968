#include "models/attention.h"

#include <cmath>

#include "common/error.h"
#include "models/bind.h"

namespace spool::models {

AttentionLayer::Scratch AttentionLayer::Scratch::take(ops::Workspace& ws, const AttentionSpec& a, int64_t T) {
  const int64_t q = static_cast<int64_t>(a.n_heads) * a.head_dim, kv = static_cast<int64_t>(a.n_kv_heads) * a.head_dim;
  Scratch s;
  s.q = ws.floats(T * q);
  s.k = ws.floats(T * kv);
  s.v = ws.floats(T * kv);
  s.att = ws.floats(T * q);
  if (a.output_gate) {
    s.qg = ws.floats(T * 2 * q);
    s.gate = ws.floats(T * q);
  }
  return s;
}

void AttentionLayer::bind(const io::Checkpoint& ck, const std::string& prefix, const ModelSpec& spec, int layer) {
  a_ = spec.attn_of(layer);
  layer_ = layer;
  window_ = a_.windowed(layer) ? a_.sliding_window : 0;
  eps_ = spec.rms_norm_eps;
  const int64_t H = spec.hidden_size, hd = a_.head_dim;
  wq_ = bind_matrix(ck, prefix + "q_proj.weight", a_.n_heads * hd * (a_.output_gate ? 2 : 1), H);
  wk_ = bind_matrix(ck, prefix + "k_proj.weight", a_.n_kv_heads * hd, H);
  if (!a_.k_eq_v) wv_ = bind_matrix(ck, prefix + "v_proj.weight", a_.n_kv_heads * hd, H);
  if (a_.k_eq_v && a_.qkv_bias) fail("%s: k_eq_v attention with q/k/v biases is not supported", ck.dir().c_str());
  if (a_.value_norm) ones_.assign(static_cast<size_t>(hd), 1.0f);
  ones_p_ = ones_.data();
  wo_ = bind_matrix(ck, prefix + "o_proj.weight", H, a_.n_heads * hd);
  if (a_.qk_norm != QkNorm::kNone) {  // per head, or over the whole projection
    const bool whole = a_.qk_norm == QkNorm::kWholeProjection;
    q_norm_ = bind_norm(ck, prefix + "q_norm.weight", whole ? a_.n_heads * hd : hd, spec.norm_one_plus);
    k_norm_ = bind_norm(ck, prefix + "k_norm.weight", whole ? a_.n_kv_heads * hd : hd, spec.norm_one_plus);
  }
  if (a_.qkv_bias) {  // GLM-4.5, gpt-oss
    if (a_.output_gate) fail("%s: q/k/v biases with an output-gated q_proj are not supported", ck.dir().c_str());
    bq_ = bind_f32(ck, prefix + "q_proj.bias", {a_.n_heads * hd});
    bk_ = bind_f32(ck, prefix + "k_proj.bias", {a_.n_kv_heads * hd});
    bv_ = bind_f32(ck, prefix + "v_proj.bias", {a_.n_kv_heads * hd});
  }
  if (a_.o_bias) bo_ = bind_f32(ck, prefix + "o_proj.bias", {H});  // gpt-oss
  bq_p_ = bq_.data();
  bk_p_ = bk_.data();
  bv_p_ = bv_.data();
  bo_p_ = bo_.data();
  q_norm_p_ = q_norm_.data();
  k_norm_p_ = k_norm_.data();
  if (a_.sinks) sinks_ = bind_f32(ck, prefix + "sinks", {a_.n_heads});
  if (a_.rope_layout == RopeLayout::kInterleavedPairs && a_.rotary_dim % 2 != 0)
    fail("%s: interleaved RoPE needs an even number of rotary dims (got %d)", ck.dir().c_str(), a_.rotary_dim);
  rope_ = (a_.inv_freq.empty() ? ops::Rope(a_.rotary_dim, a_.rope_theta, a_.rope_attention_scaling)
                               : ops::Rope(a_.inv_freq, a_.rope_attention_scaling))
              .with_pairs(a_.rope_layout == RopeLayout::kInterleavedPairs);
}

void AttentionLayer::place(ops::Backend& be) {
  wq_ = be.upload(wq_);
  wk_ = be.upload(wk_);
  if (!a_.k_eq_v) wv_ = be.upload(wv_);
  if (a_.value_norm) ones_p_ = be.upload_floats(ones_);
  wo_ = be.upload(wo_);
  if (a_.qk_norm != QkNorm::kNone) {
    q_norm_p_ = be.upload_floats(q_norm_);
    k_norm_p_ = be.upload_floats(k_norm_);
  }
  if (a_.qkv_bias) {
    bq_p_ = be.upload_floats(bq_);
    bk_p_ = be.upload_floats(bk_);
    bv_p_ = be.upload_floats(bv_);
  }
  if (a_.o_bias) bo_p_ = be.upload_floats(bo_);
  rope_.set_placed_inv_freq(be.upload_floats(rope_.inv_freq()));
}

void AttentionLayer::forward(const float* x, int64_t T, int64_t pos0, AttnCache& cache, float* out, ops::Backend& be,
                             ops::Workspace& ws) const {
  const AttnSeg one{0, T, pos0, &cache};
  forward(x, std::span<const AttnSeg>(&one, 1), T, out, be, ws);
}

void AttentionLayer::forward(const float* x, std::span<const AttnSeg> segs, int64_t T, float* out, ops::Backend& be,
                             ops::Workspace& ws) const {
  ops::WorkspaceScope scope(ws);
  const int nh = a_.n_heads, nkv = a_.n_kv_heads, hd = a_.head_dim;
  const Scratch s = Scratch::take(ws, a_, T);
  if (a_.output_gate) {
    // [T, nh, 2*hd] -> query [T, nh, hd] and gate [T, nh, hd].
    const ops::MatmulOut qkv[] = {{&wq_, s.qg}, {&wk_, s.k}, {&wv_, s.v}};
    be.matmul_multi(qkv, x, T);
    be.copy_2d(s.q, hd, s.qg, 2 * hd, T * nh, hd);
    be.copy_2d(s.gate, hd, s.qg + hd, 2 * hd, T * nh, hd);
  } else if (a_.k_eq_v) {  // V = the K projection (before the k norm and RoPE)
    const ops::MatmulOut qk[] = {{&wq_, s.q}, {&wk_, s.k}};
    be.matmul_multi(qk, x, T);
    be.copy_2d(s.v, static_cast<int64_t>(nkv) * hd, s.k, static_cast<int64_t>(nkv) * hd, T, static_cast<int64_t>(nkv) * hd);
  } else {
    const ops::MatmulOut qkv[] = {{&wq_, s.q}, {&wk_, s.k}, {&wv_, s.v}};
    be.matmul_multi(qkv, x, T);
  }
  if (a_.qkv_bias) {  // before the q/k norms and RoPE (HF: Linear with bias)
    be.add_bias(s.q, bq_p_, T, static_cast<int64_t>(nh) * hd);
    be.add_bias(s.k, bk_p_, T, static_cast<int64_t>(nkv) * hd);
    be.add_bias(s.v, bv_p_, T, static_cast<int64_t>(nkv) * hd);
  }
  if (a_.qk_norm == QkNorm::kWholeProjection) {
    be.rms_norm(s.q, q_norm_p_, T, static_cast<int64_t>(nh) * hd, eps_, s.q);
    be.rms_norm(s.k, k_norm_p_, T, static_cast<int64_t>(nkv) * hd, eps_, s.k);
  } else if (a_.qk_norm == QkNorm::kPerHead) {
    be.rms_norm(s.q, q_norm_p_, T * nh, hd, eps_, s.q);
    be.rms_norm(s.k, k_norm_p_, T * nkv, hd, eps_, s.k);
  }
  if (a_.value_norm) be.rms_norm(s.v, ones_p_, T * nkv, hd, eps_, s.v);  // weightless, per head
  const float scale = a_.softmax_scale > 0 ? a_.softmax_scale : 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t qw = static_cast<int64_t>(nh) * hd, kw = static_cast<int64_t>(nkv) * hd;
  for (const AttnSeg& g : segs) {  // per sequence: its positions, its cache
    float* q = s.q + g.row0 * qw;
    float* k = s.k + g.row0 * kw;
    float* att = s.att + g.row0 * qw;
    be.rope(rope_, q, g.T, qw, nh, hd, g.pos0);
    be.rope(rope_, k, g.T, kw, nkv, hd, g.pos0);
    be.kv_append(*g.cache, g.pos0, g.T, k, s.v + g.row0 * kw);  // k normed and rotated, v raw
    if (a_.sinks) {
      be.attention_sinks(q, g.T, nh, *g.cache, g.pos0, scale, window_, sinks_.data(), att);
    } else if (window_ > 0 && g.pos0 + g.T > window_) {
      be.attention_window(q, g.T, nh, *g.cache, g.pos0, scale, window_, att);
    } else {
      be.attention(q, g.T, nh, *g.cache, g.pos0, scale, att);
    }
  }
  if (a_.output_gate) be.mul_sigmoid(s.att, s.gate, T * nh * hd);
  be.matmul(wo_, s.att, T, out);
  if (a_.o_bias) be.add_bias(out, bo_p_, T, wo_.rows);
}

void AttentionLayer::bind_layer(const io::Checkpoint& ck, const ModelSpec& spec, int layer) {
  bind(ck, "layers." + std::to_string(layer) + ".self_attn.", spec, layer);
}

void AttentionLayer::take_scratch(ops::Workspace& ws, const ModelSpec& spec, int layer, int64_t T) const {
  Scratch::take(ws, spec.attn_of(layer), T);
}

void AttentionLayer::forward_rows(const float* x, std::span<const SeqRows> seqs, int64_t N, float* out, ops::Backend& be,
                                  ops::Workspace& ws) const {
  forward(x, attn_segments(seqs, layer_), N, out, be, ws);
}

}  // namespace spool::models
