#include "models/mla.h"

#include <cstring>

#include "common/error.h"
#include "models/attention.h"
#include "models/bind.h"

namespace spool::models {

MlaLayer::Scratch MlaLayer::Scratch::take(ops::Workspace& ws, const ModelSpec& s, int64_t T) {
  const MlaSpec& m = s.mla;
  const int64_t nh = s.attn.n_heads, R = m.kv_lora_rank, P = m.qk_rope_head_dim, N = m.qk_nope_head_dim, V = m.v_head_dim;
  Scratch r;
  if (m.q_lora_rank > 0) r.qa = ws.floats(T * m.q_lora_rank);
  r.q = ws.floats(T * nh * (N + P));
  r.kva = ws.floats(T * (R + P));
  r.key = ws.floats(T * (R + P));
  r.ckv = ws.floats(T * R);
  r.kpe = ws.floats(T * P);
  r.qpe = ws.floats(T * nh * P);
  r.qn = ws.floats(T * N);
  r.qabs = ws.floats(T * R);
  r.qfull = ws.floats(T * nh * (R + P));
  r.att = ws.floats(T * nh * R);
  r.ah = ws.floats(T * R);
  r.oh = ws.floats(T * V);
  r.o = ws.floats(T * nh * V);
  return r;
}

void MlaLayer::bind(const io::Checkpoint& ck, const std::string& prefix, const ModelSpec& spec) {
  a_ = spec.attn;
  m_ = spec.mla;
  eps_ = m_.latent_norm_eps > 0 ? m_.latent_norm_eps : spec.rms_norm_eps;  // q_a / kv_a layernorms only
  const int64_t H = spec.hidden_size, nh = a_.n_heads, R = m_.kv_lora_rank, P = m_.qk_rope_head_dim, N = m_.qk_nope_head_dim,
                V = m_.v_head_dim;
  if (m_.q_lora_rank > 0) {
    wqa_ = bind_matrix(ck, prefix + "q_a_proj.weight", m_.q_lora_rank, H);
    q_a_norm_ = bind_norm(ck, prefix + "q_a_layernorm.weight", m_.q_lora_rank, false);
    wqb_ = bind_matrix(ck, prefix + "q_b_proj.weight", nh * (N + P), m_.q_lora_rank);
  } else {
    wq_ = bind_matrix(ck, prefix + "q_proj.weight", nh * (N + P), H);
  }
  wkva_ = bind_matrix(ck, prefix + "kv_a_proj_with_mqa.weight", R + P, H);
  kv_a_norm_ = bind_norm(ck, prefix + "kv_a_layernorm.weight", R, false);
  wo_ = bind_matrix(ck, prefix + "o_proj.weight", H, nh * V);
  const ops::WeightView kvb = bind_float_matrix(ck, prefix + "kv_b_proj.weight", nh * (N + V), R);
  const size_t es = static_cast<size_t>(ops::wtype_size(kvb.type));
  const uint8_t* src = static_cast<const uint8_t*>(kvb.data);
  uk_t_data_.resize(static_cast<size_t>(nh * R * N) * es);
  uk_t_.resize(nh);
  uv_.resize(nh);
  for (int64_t h = 0; h < nh; ++h) {
    uint8_t* dst = uk_t_data_.data() + static_cast<size_t>(h * R * N) * es;
    for (int64_t d = 0; d < N; ++d)  // W_UK_h^T[r, d] = kv_b[h*(N+V) + d, r]
      for (int64_t r = 0; r < R; ++r) std::memcpy(dst + (r * N + d) * es, src + ((h * (N + V) + d) * R + r) * es, es);
    ops::WeightView& uk = uk_t_[h];
    uk.type = kvb.type;
    uk.rows = R;
    uk.cols = N;
    uk.data = dst;
    ops::WeightView& uv = uv_[h];
    uv.type = kvb.type;
    uv.rows = V;
    uv.cols = R;
    uv.data = src + static_cast<size_t>((h * (N + V) + N) * R) * es;
  }
  uk_lora_.assign(nh, {});
  uv_lora_.assign(nh, {});
  lora_store_.clear();
  if (kvb.lora != nullptr) {
    for (const ops::LoraTerm& t : kvb.lora->terms) {  // t.bt = B^T [r, nh*(N+V)] (row stride ld)
      const int64_t r = t.rank, ld = t.ldbt > 0 ? t.ldbt : nh * (N + V);
      for (int64_t h = 0; h < nh; ++h) {
        // W_UK_h^T [R, N] += s A^T B_UK_h^T: A' = B_UK_h^T [r, N] (a copy), B'^T = A [r, R].
        std::vector<float>& ukt = lora_store_.emplace_back(static_cast<size_t>(r * N));
        for (int64_t k = 0; k < r; ++k)
          for (int64_t d = 0; d < N; ++d) ukt[k * N + d] = t.bt[k * ld + h * (N + V) + d];
        uk_lora_[h].terms.push_back({ukt.data(), t.a, r, t.scale, 0, t.adapter, t.user});
        // W_UV_h [V, R] += s B_UV_h A: B_UV_h^T = columns h*(N+V)+N .. of B^T.
        uv_lora_[h].terms.push_back({t.a, t.bt + h * (N + V) + N, r, t.scale, ld, t.adapter, t.user});
      }
    }
    for (int64_t h = 0; h < nh; ++h) {
      uk_t_[h].lora = &uk_lora_[h];
      uv_[h].lora = &uv_lora_[h];
    }
  }
  rope_ = (a_.inv_freq.empty() ? ops::Rope(static_cast<int>(P), a_.rope_theta, a_.rope_attention_scaling)
                               : ops::Rope(a_.inv_freq, a_.rope_attention_scaling))
              .with_pairs(m_.rope_layout == RopeLayout::kInterleavedPairs);
  q_a_norm_p_ = q_a_norm_.data();
  kv_a_norm_p_ = kv_a_norm_.data();
}

void MlaLayer::place(ops::Backend& be) {
  if (m_.q_lora_rank > 0) {
    wqa_ = be.upload(wqa_);
    wqb_ = be.upload(wqb_);
    q_a_norm_p_ = be.upload_floats(q_a_norm_);
  } else {
    wq_ = be.upload(wq_);
  }
  wkva_ = be.upload(wkva_);
  wo_ = be.upload(wo_);
  kv_a_norm_p_ = be.upload_floats(kv_a_norm_);
  rope_.set_placed_inv_freq(be.upload_floats(rope_.inv_freq()));
  for (ops::WeightView& w : uk_t_) w = be.upload(w);
  for (ops::WeightView& w : uv_) w = be.upload(w);
}

void MlaLayer::forward(const float* x, int64_t T, int64_t pos0, AttnCache& cache, float* out, ops::Backend& be,
                       ops::Workspace& ws) const {
  const AttnSeg one{0, T, pos0, &cache};
  forward(x, std::span<const AttnSeg>(&one, 1), T, out, be, ws);
}

void MlaLayer::forward(const float* x, std::span<const AttnSeg> segs, int64_t T, float* out, ops::Backend& be,
                       ops::Workspace& ws) const {
  ops::WorkspaceScope scope(ws);
  const int nh = a_.n_heads;
  const int64_t R = m_.kv_lora_rank, P = m_.qk_rope_head_dim, N = m_.qk_nope_head_dim, V = m_.v_head_dim, QD = N + P;
  ModelSpec probe;  // Scratch::take reads these fields only
  probe.attn = a_;
  probe.mla = m_;
  const Scratch s = Scratch::take(ws, probe, T);
  // Projections.
  if (m_.q_lora_rank > 0) {
    const ops::MatmulOut first[] = {{&wqa_, s.qa}, {&wkva_, s.kva}};
    be.matmul_multi(first, x, T);
    be.rms_norm(s.qa, q_a_norm_p_, T, m_.q_lora_rank, eps_, s.qa);
    be.matmul(wqb_, s.qa, T, s.q);
  } else {
    const ops::MatmulOut first[] = {{&wq_, s.q}, {&wkva_, s.kva}};
    be.matmul_multi(first, x, T);
  }
  // Latent rows: [RMSNorm(c_kv) | RoPE(k_pe)].
  be.copy_2d(s.ckv, R, s.kva, R + P, T, R);
  be.rms_norm(s.ckv, kv_a_norm_p_, T, R, eps_, s.ckv);
  be.copy_2d(s.kpe, P, s.kva + R, R + P, T, P);
  for (const AttnSeg& g : segs) be.rope(rope_, s.kpe + g.row0 * P, g.T, P, 1, static_cast<int>(P), g.pos0);
  be.copy_2d(s.key, R + P, s.ckv, R, T, R);
  be.copy_2d(s.key + R, R + P, s.kpe, P, T, P);
  for (const AttnSeg& g : segs)  // keys-only cache: the value argument is ignored
    be.kv_append(*g.cache, g.pos0, g.T, s.key + g.row0 * (R + P), s.key + g.row0 * (R + P));
  // Queries: q_pe roped per head; q~_h = W_UK_h^T q_nope_h; qfull per head [q~_h | q_pe_h].
  be.copy_2d(s.qpe, P, s.q + N, QD, T * nh, P);
  for (const AttnSeg& g : segs) be.rope(rope_, s.qpe + g.row0 * nh * P, g.T, nh * P, nh, static_cast<int>(P), g.pos0);
  be.matmul_heads(uk_t_, s.q, nh * QD, QD, T, s.qfull, nh * (R + P), R + P, s.qn, s.qabs);
  be.copy_2d(s.qfull + R, R + P, s.qpe, P, T * nh, P);  // q_pe of every (t, h) row after its q~_h
  for (const AttnSeg& g : segs)
    be.mla_attention(s.qfull + g.row0 * nh * (R + P), g.T, nh, *g.cache, g.pos0, a_.softmax_scale, static_cast<int>(R),
                     s.att + g.row0 * nh * R);
  // o_h = W_UV_h (attention-weighted latent); out = o_proj(concat o_h).
  be.matmul_heads(uv_, s.att, nh * R, R, T, s.o, nh * V, V, s.ah, s.oh);
  be.matmul(wo_, s.o, T, out);
}

void MlaLayer::bind_layer(const io::Checkpoint& ck, const ModelSpec& spec, int layer) {
  layer_ = layer;
  bind(ck, "layers." + std::to_string(layer) + ".self_attn.", spec);
}

void MlaLayer::take_scratch(ops::Workspace& ws, const ModelSpec& spec, int, int64_t T) const { Scratch::take(ws, spec, T); }

void MlaLayer::forward_rows(const float* x, std::span<const SeqRows> seqs, int64_t N, float* out, ops::Backend& be,
                            ops::Workspace& ws) const {
  forward(x, attn_segments(seqs, layer_), N, out, be, ws);
}

}  // namespace spool::models
