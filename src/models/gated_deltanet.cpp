#include "models/gated_deltanet.h"

#include <cmath>
#include <cstring>

#include "common/error.h"
#include "models/bind.h"

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
  if (layout == GdnLayout::kSplit) {
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
    if (qkvz.lora != nullptr || ba.lora != nullptr)
      fail("%s: LoRA on %sin_proj_qkvz / in_proj_ba (the fused Qwen3-Next layout, regrouped at load) is not supported yet",
           ck.dir().c_str(), prefix.c_str());
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
  conv_w_p_ = conv_w_.data();
  a_log_exp_p_ = a_log_exp_.data();
  dt_bias_p_ = dt_bias_.data();
  norm_w_p_ = norm_w_.data();
}

void GatedDeltaNetLayer::place(ops::Backend& be) {
  qkv_ = be.upload(qkv_);
  z_ = be.upload(z_);
  b_ = be.upload(b_);
  a_ = be.upload(a_);
  out_ = be.upload(out_);
  conv_w_p_ = be.upload_floats(conv_w_);
  a_log_exp_p_ = be.upload_floats(a_log_exp_);
  dt_bias_p_ = be.upload_floats(dt_bias_);
  norm_w_p_ = be.upload_floats(norm_w_);
}

GatedDeltaNetLayer::Scratch GatedDeltaNetLayer::Scratch::take(ops::Workspace& ws, const GdnSpec& g, int64_t T) {
  const int64_t kd = g.key_dim(), vd = g.value_dim(), cd = g.conv_dim(), nv = g.n_v;
  Scratch s;
  s.mixed = ws.floats(T * cd);
  s.conv_out = ws.floats(T * cd);
  s.z = ws.floats(T * vd);
  s.b = ws.floats(T * nv);
  s.a = ws.floats(T * nv);
  s.q = ws.floats(T * kd);
  s.k = ws.floats(T * kd);
  s.v = ws.floats(T * vd);
  s.beta = ws.floats(T * nv);
  s.g = ws.floats(T * nv);
  s.o = ws.floats(T * vd);
  return s;
}

void GatedDeltaNetLayer::forward(const float* x, int64_t T, float* conv_state, float* recurrent_state, float* out,
                                 ops::Backend& be, ops::Workspace& ws) const {
  const GdnSeg one{0, T, conv_state, recurrent_state};
  forward(x, std::span<const GdnSeg>(&one, 1), T, out, be, ws);
}

void GatedDeltaNetLayer::forward(const float* x, std::span<const GdnSeg> segs, int64_t T, float* out, ops::Backend& be,
                                 ops::Workspace& ws) const {
  ops::WorkspaceScope scope(ws);
  const int64_t kd = g_.key_dim(), vd = g_.value_dim(), cd = g_.conv_dim();
  const int nk = g_.n_k, nv = g_.n_v, dk = g_.d_k, dv = g_.d_v;
  const Scratch s = Scratch::take(ws, g_, T);
  // mixed: [T, conv_dim]; z: [T, n_v * d_v]; b, a: [T, n_v]
  const ops::MatmulOut proj[] = {{&qkv_, s.mixed}, {&z_, s.z}, {&b_, s.b}, {&a_, s.a}};
  be.matmul_multi(proj, x, T);
  const int64_t n_conv = cd * (g_.conv_kernel - 1), n_rec = static_cast<int64_t>(nv) * dk * dv;
  for (const GdnSeg& q : segs) {  // the causal conv runs along each sequence, on its own state
    if (q.trail == nullptr) {
      be.causal_conv1d_silu(s.mixed + q.row0 * cd, q.T, cd, conv_w_p_, g_.conv_kernel, q.conv, s.conv_out + q.row0 * cd);
      continue;
    }
    // A step whose states are kept (State::keep_step_trail): token by token, each token's conv
    // state into its trail slot.
    for (int64_t j = 0; j < q.T; ++j) {
      const int64_t r = q.row0 + j;
      be.causal_conv1d_silu(s.mixed + r * cd, 1, cd, conv_w_p_, g_.conv_kernel, q.conv, s.conv_out + r * cd);
      if (j < q.trail_n && n_conv > 0) be.copy_2d(q.trail + j * (n_conv + n_rec), n_conv, q.conv, n_conv, 1, n_conv);
    }
  }
  // conv_out rows [q (kd) | k (kd) | v (vd)] -> q, k [T, n_k, d_k] (L2-normalised, q / sqrt(d_k)), v [T, n_v, d_v]:
  // one row is already three contiguous parts (decode: no copies).
  float* const sq = T == 1 ? s.conv_out : s.q;
  float* const sk = T == 1 ? s.conv_out + kd : s.k;
  float* const sv = T == 1 ? s.conv_out + 2 * kd : s.v;
  if (T > 1) {
    be.copy_2d(sq, kd, s.conv_out, cd, T, kd);
    be.copy_2d(sk, kd, s.conv_out + kd, cd, T, kd);
    be.copy_2d(sv, vd, s.conv_out + 2 * kd, cd, T, vd);
  }
  be.l2_norm(sq, T * nk, dk, 1e-6f, 1.0f / std::sqrt(static_cast<float>(dk)));
  be.l2_norm(sk, T * nk, dk, 1e-6f, 1.0f);
  be.gdn_gates(s.b, s.a, a_log_exp_p_, dt_bias_p_, T, nv, s.beta, s.g);
  for (const GdnSeg& q : segs) {  // the recurrence: per sequence
    if (q.trail != nullptr) {  // token by token (decode's recurrent form), each state into its slot
      for (int64_t j = 0; j < q.T; ++j) {
        const int64_t r = q.row0 + j;
        ops::GatedDeltaArgs args;
        args.T = 1;
        args.n_k = nk;
        args.n_v = nv;
        args.d_k = dk;
        args.d_v = dv;
        args.q = sq + r * kd;
        args.k = sk + r * kd;
        args.v = sv + r * vd;
        args.beta = s.beta + r * nv;
        args.g = s.g + r * nv;
        args.state = q.recurrent;
        args.out = s.o + r * vd;
        be.gated_delta(args, kChunk);
        if (j < q.trail_n) be.copy_2d(q.trail + j * (n_conv + n_rec) + n_conv, n_rec, q.recurrent, n_rec, 1, n_rec);
      }
      continue;
    }
    ops::GatedDeltaArgs args;
    args.T = q.T;
    args.n_k = nk;
    args.n_v = nv;
    args.d_k = dk;
    args.d_v = dv;
    args.q = sq + q.row0 * kd;
    args.k = sk + q.row0 * kd;
    args.v = sv + q.row0 * vd;
    args.beta = s.beta + q.row0 * nv;
    args.g = s.g + q.row0 * nv;
    args.state = q.recurrent;
    args.out = s.o + q.row0 * vd;
    be.gated_delta(args, kChunk);
  }
  // Gated RMSNorm per value head: o = (o / rms(o)) * w * silu(z).
  be.rms_norm_gated(s.o, s.z, norm_w_p_, T * nv, dv, eps_);
  be.matmul(out_, s.o, T, out);  // [T, hidden]
}

void GatedDeltaNetLayer::bind_layer(const io::Checkpoint& ck, const ModelSpec& spec, int layer) {
  layer_ = layer;
  bind(ck, "layers." + std::to_string(layer) + ".linear_attn.", spec, layout_);
}

void GatedDeltaNetLayer::take_scratch(ops::Workspace& ws, const ModelSpec& spec, int, int64_t T) const {
  Scratch::take(ws, spec.gdn, T);
}

void GatedDeltaNetLayer::forward_rows(const float* x, std::span<const SeqRows> seqs, int64_t N, float* out,
                                      ops::Backend& be, ops::Workspace& ws) const {
  std::vector<GdnSeg> segs;
  segs.reserve(seqs.size());
  for (const SeqRows& q : seqs) {
    float* trail = q.state->gdn_trail(layer_);
    segs.push_back({q.row0, q.T, q.state->gdn_conv(layer_), q.state->gdn_recurrent(layer_), trail,
                     q.state->step_kept()});
  }
  forward(x, segs, N, out, be, ws);
}

}  // namespace spool::models
