#include "models/gated_deltanet.h"

#include <cmath>
#include <cstring>

#include "common/error.h"
#include "models/bind.h"
#include "ops/elementwise.h"
#include "ops/gated_delta.h"
#include "ops/matmul.h"

namespace spool::models {

namespace {
constexpr int kChunk = 64;  // HF chunk_size of torch_chunk_gated_delta_rule
}

void GatedDeltaNetLayer::bind(const io::Checkpoint& ck, const std::string& prefix, const ModelSpec& spec,
                              GdnLayout layout) {
  g_ = spec.gdn;
  eps_ = spec.rms_norm_eps;
  const int64_t H = spec.hidden_size;
  const int64_t vd = g_.value_dim(), cd = g_.conv_dim();
  if (layout == GdnLayout::kQwen3_5) {
    qkv_ = bind_matrix(ck, prefix + "in_proj_qkv.weight", cd, H);
    z_ = bind_matrix(ck, prefix + "in_proj_z.weight", vd, H);
    b_ = bind_matrix(ck, prefix + "in_proj_b.weight", g_.n_v, H);
    a_ = bind_matrix(ck, prefix + "in_proj_a.weight", g_.n_v, H);
  } else {
    // Per key head g: qkvz rows [q_g (d_k) | k_g (d_k) | v_g (r*d_v) | z_g (r*d_v)], ba rows [b_g (r) | a_g (r)].
    const int r = g_.n_v / g_.n_k;
    const int64_t blk = 2 * g_.d_k + 2 * r * g_.d_v;
    const ops::WeightView qkvz = bind_matrix(ck, prefix + "in_proj_qkvz.weight", g_.n_k * blk, H);
    const ops::WeightView ba = bind_matrix(ck, prefix + "in_proj_ba.weight", 2 * g_.n_v, H);
    std::vector<std::pair<int64_t, int64_t>> qkv_rows, z_rows, b_rows, a_rows;
    for (int part = 0; part < 3; ++part)  // q, k, v blocks of every group, in group order
      for (int grp = 0; grp < g_.n_k; ++grp)
        qkv_rows.emplace_back(grp * blk + (part == 0 ? 0 : part == 1 ? g_.d_k : 2 * g_.d_k), part == 2 ? r * g_.d_v : g_.d_k);
    for (int grp = 0; grp < g_.n_k; ++grp) {
      z_rows.emplace_back(grp * blk + 2 * g_.d_k + r * g_.d_v, r * g_.d_v);
      b_rows.emplace_back(grp * 2 * r, r);
      a_rows.emplace_back(grp * 2 * r + r, r);
    }
    qkv_ = gather_rows(qkvz, qkv_rows, &regrouped_[0]);
    z_ = gather_rows(qkvz, z_rows, &regrouped_[1]);
    b_ = gather_rows(ba, b_rows, &regrouped_[2]);
    a_ = gather_rows(ba, a_rows, &regrouped_[3]);
  }
  out_ = bind_matrix(ck, prefix + "out_proj.weight", H, vd);
  conv_w_ = bind_f32(ck, prefix + "conv1d.weight", {cd, 1, g_.conv_kernel});
  std::vector<float> a_log = bind_f32(ck, prefix + "A_log", {g_.n_v});
  a_log_exp_.resize(g_.n_v);
  for (int h = 0; h < g_.n_v; ++h) a_log_exp_[h] = std::exp(a_log[h]);
  dt_bias_ = bind_f32(ck, prefix + "dt_bias", {g_.n_v});
  norm_w_ = bind_norm(ck, prefix + "norm.weight", g_.d_v, /*one_plus=*/false);
}

void GatedDeltaNetLayer::forward(const float* x, int64_t T, GdnState& st, float* out, ops::ThreadPool* pool) {
  const int64_t kd = g_.key_dim(), vd = g_.value_dim(), cd = g_.conv_dim();
  const int nk = g_.n_k, nv = g_.n_v, dk = g_.d_k, dv = g_.d_v;
  mixed_.resize(T * cd);
  conv_out_.resize(T * cd);
  zx_.resize(T * vd);
  bx_.resize(T * nv);
  ax_.resize(T * nv);
  // mixed: [T, conv_dim]; z: [T, n_v * d_v]; b, a: [T, n_v]
  ops::matmul_multi({{&qkv_, mixed_.data()}, {&z_, zx_.data()}, {&b_, bx_.data()}, {&a_, ax_.data()}}, x, T, pool);
  ops::causal_conv1d_silu(mixed_.data(), T, cd, conv_w_.data(), g_.conv_kernel, st.conv.data(), conv_out_.data());

  q_.resize(T * kd);
  k_.resize(T * kd);
  v_.resize(T * vd);
  beta_.resize(T * nv);
  gate_.resize(T * nv);
  o_.resize(T * vd);
  const float qscale = 1.0f / std::sqrt(static_cast<float>(dk));
  for (int64_t t = 0; t < T; ++t) {
    const float* c = conv_out_.data() + t * cd;
    std::memcpy(q_.data() + t * kd, c, kd * sizeof(float));
    std::memcpy(k_.data() + t * kd, c + kd, kd * sizeof(float));
    std::memcpy(v_.data() + t * vd, c + 2 * kd, vd * sizeof(float));
    for (int h = 0; h < nk; ++h) {
      float* qh = q_.data() + t * kd + h * dk;
      ops::l2_norm(qh, dk, 1e-6f);
      for (int d = 0; d < dk; ++d) qh[d] *= qscale;
      ops::l2_norm(k_.data() + t * kd + h * dk, dk, 1e-6f);
    }
    for (int h = 0; h < nv; ++h) {
      beta_[t * nv + h] = ops::sigmoid(bx_[t * nv + h]);
      gate_[t * nv + h] = -a_log_exp_[h] * ops::softplus(ax_[t * nv + h] + dt_bias_[h]);
    }
  }
  ops::GatedDeltaArgs args;
  args.T = T;
  args.n_k = nk;
  args.n_v = nv;
  args.d_k = dk;
  args.d_v = dv;
  args.q = q_.data();
  args.k = k_.data();
  args.v = v_.data();
  args.beta = beta_.data();
  args.g = gate_.data();
  args.state = st.recurrent.data();
  args.out = o_.data();
  if (T == 1) {
    ops::gated_delta_recurrent(args, pool);
  } else {
    ops::gated_delta_chunked(args, kChunk, pool);
  }
  // Gated RMSNorm per value head: o = (o / rms(o)) * w * silu(z).
  for (int64_t i = 0; i < T * nv; ++i) {
    float* oh = o_.data() + i * dv;
    const float* zh = zx_.data() + i * dv;
    ops::rms_norm(oh, norm_w_.data(), dv, eps_, oh);
    for (int d = 0; d < dv; ++d) oh[d] *= ops::silu(zh[d]);
  }
  ops::matmul(out_, o_.data(), T, out, pool);  // [T, hidden]
}

}  // namespace spool::models
