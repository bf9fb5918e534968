// Multi-head latent attention (DeepSeek-V2/V3, HF DeepseekV3Attention) in the weight-absorbed
// form (DeepSeek inference/model.py, attn_impl="absorb"), used for prefill and decode alike:
//   q = q_b(RMSNorm(q_a(x)))  (or q_proj(x) without q_lora)   per head [q_nope | q_pe]
//   [c_kv | k_pe] = kv_a_proj_with_mqa(x);  c = RMSNorm(c_kv);  RoPE on q_pe and k_pe
//   cache per position: [c | k_pe]  (kv_lora_rank + qk_rope_head_dim, a keys-only KvCache)
//   per head h: q~_h = W_UK_h^T q_nope_h;  s = scale (q~_h . c_t + q_pe_h . k_pe_t);
//   o_h = W_UV_h (sum_t softmax(s)_t c_t);  out = o_proj(concat_h o_h)
// with kv_b_proj viewed [n_heads, qk_nope + v, kv_lora_rank]: W_UK_h its first qk_nope rows,
// W_UV_h the next v rows. Interleaved RoPE (RopeLayout::kInterleavedPairs) rotates adjacent pairs: q_pe and
// k_pe are de-interleaved ([even dims | odd dims]) and rotated the rotate_half way by RoPE's pairs
// mode (ops::Rope::pairs), which gives the same scores (q and k get the same permutation).
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/layer.h"
#include "models/spec.h"
#include "models/state.h"
#include "ops/backend.h"
#include "ops/lora.h"
#include "ops/rope.h"
#include "ops/weights.h"
#include "ops/workspace.h"

namespace spool::models {

/// Multi-head latent attention (MixerKind::kMLA) as a TokenMixer.
class MlaLayer final : public TokenMixer {
 public:
  /// Scratch of one forward over T tokens (nh heads, R = kv_lora_rank, P = qk_rope_head_dim,
  /// N = qk_nope_head_dim, V = v_head_dim, Q = q_lora_rank): qa [T, Q] (q_lora only), q
  /// [T, nh*(N+P)], kva and key [T, R+P], ckv [T, R], kpe [T, P], qpe [T*nh, P], qn [T, N], qabs [T, R], qfull [T, nh*(R+P)], att [T, nh*R], ah [T, R],
  /// oh [T, V], o [T, nh*V].
  struct Scratch {
    float *qa = nullptr, *q, *kva, *key, *ckv, *kpe, *qpe, *qn, *qabs, *qfull, *att, *ah, *oh, *o;
    static Scratch take(ops::Workspace& ws, const ModelSpec& s, int64_t T);
  };

  /// Binds `{prefix}{q_a_proj,q_a_layernorm,q_b_proj | q_proj, kv_a_proj_with_mqa,
  /// kv_a_layernorm, kv_b_proj, o_proj}` (prefix e.g. "layers.0.self_attn."). kv_b_proj must be
  /// a float tensor (spool convert keeps it bf16); W_UK^T is copied per head at load.
  void bind(const io::Checkpoint& ck, const std::string& prefix, const ModelSpec& spec);
  /// Moves every weight (projections, the per-head W_UK^T / W_UV views) and the latent norms
  /// to where `be` reads them, once after bind(); a no-op on host backends. Without it a device
  /// backend would stage each weight over PCIe on every call.
  void place(ops::Backend& be) override;
  /// TokenMixer (layer.h): bind() under `layers.{layer}.self_attn.`, the scratch above, and
  /// forward() over the step's sequences on their states' layer `layer`.
  void bind_layer(const io::Checkpoint& ck, const ModelSpec& spec, int layer) override;
  void take_scratch(ops::Workspace& ws, const ModelSpec& spec, int layer, int64_t T) const override;
  void forward_rows(const float* x, std::span<const SeqRows> seqs, int64_t N, float* out, ops::Backend& be,
                    ops::Workspace& ws) const override;

  /// x: [T, hidden] (normed input) at positions [pos0, pos0 + T); appends the latent rows to
  /// `cache` (keys-only, one head of R+P; capacity for pos0 + T); out: [T, hidden].
  void forward(const float* x, int64_t T, int64_t pos0, AttnCache& cache, float* out, ops::Backend& be, ops::Workspace& ws) const;
  /// Several sequences at once: x, out [N, hidden], segs their row ranges (together N rows).
  /// Projections and the per-head absorbed products run over all N rows; RoPE, the latent
  /// cache append and attention per sequence, on its own cache.
  void forward(const float* x, std::span<const AttnSeg> segs, int64_t N, float* out, ops::Backend& be,
               ops::Workspace& ws) const;

 private:

  AttentionSpec a_;
  MlaSpec m_;
  int layer_ = -1;  // bind_layer()'s layer: the index of its caches in a State
  float eps_ = 1e-6f;  // of the latent norms (MlaSpec::latent_norm_eps)
  ops::WeightView wqa_, wqb_, wq_, wkva_, wo_;
  std::vector<ops::WeightView> uk_t_, uv_;  // per head: W_UK_h^T [R, N] (copy), W_UV_h [V, R] (view)
  std::vector<uint8_t> uk_t_data_;          // storage of uk_t_ (kv_b_proj's element type)
  // LoRA on kv_b_proj (dW = s B A, A [r, R], B [nh*(N+V), r]) split per head like the weight:
  // W_UK_h^T gets s A^T (B_UK_h^T q) (a term with A' = B_UK_h^T [r, N], B' = A^T [R, r]),
  // W_UV_h gets s B_UV_h (A x) (A' = A, B' = B's rows of head h's values). Unmerged, per adapter.
  std::vector<ops::LoraDelta> uk_lora_, uv_lora_;  // per head
  std::vector<std::vector<float>> lora_store_;     // the B_UK_h^T copies
  std::vector<float> q_a_norm_, kv_a_norm_;
  const float *q_a_norm_p_ = nullptr, *kv_a_norm_p_ = nullptr;  // the latent norms where the backend reads them (place())
  ops::Rope rope_;
};

}  // namespace spool::models
