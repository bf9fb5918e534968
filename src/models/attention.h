// Softmax attention layer with optional per-head q/k RMSNorm, partial RoPE and output gate.
// Qwen3.5-MoE / Qwen3-Next gated attention (HF Qwen3_5MoeAttention): q_proj emits per head
// [query (head_dim) | gate (head_dim)]; q,k normed with (1+w) RMSNorm; RoPE on the first
// rotary_dim dims; out = o_proj(attn * sigmoid(gate)). Qwen3-MoE (HF Qwen3MoeAttention): no
// gate, plain-weight q/k norms, full RoPE. OLMoE and MiniMax-M2: q/k norms over the whole
// projection. GLM-4.5 (HF Glm4MoeAttention): q/k/v_proj biases (AttentionSpec::qkv_bias),
// optional per-head q/k norms, RoPE on the first half of each head.
// Mixtral: a sliding window (AttentionSpec::sliding_window) masks keys older than the window.
// gpt-oss (HF GptOssAttention): biases on q/k/v/o, per-head attention sinks, the window only on
// the layers layer_types marks "sliding_attention" (AttentionSpec::window_layers).
// Gemma 4 (HF Gemma4TextAttention): per-layer geometry (ModelSpec::attn_of), V from the K
// projection on layers without v_proj (AttentionSpec::k_eq_v), weightless per-head RMSNorm of V
// (AttentionSpec::value_norm), scale 1 (softmax_scale), proportional RoPE (explicit inv_freq
// with zero tail frequencies).
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/layer.h"
#include "models/spec.h"
#include "models/state.h"
#include "ops/backend.h"
#include "ops/rope.h"
#include "ops/weights.h"
#include "ops/workspace.h"

namespace spool::models {

/// Softmax attention (MixerKind::kAttention) as a TokenMixer.
class AttentionLayer final : public TokenMixer {
 public:
  /// Scratch of one forward over T tokens (nh = n_heads, nkv = n_kv_heads, hd = head_dim):
  /// q [T, nh*hd], k and v [T, nkv*hd], att [T, nh*hd]; with an output gate also the fused
  /// projection qg [T, nh*2*hd] and gate [T, nh*hd].
  struct Scratch {
    float *q, *k, *v, *att, *qg = nullptr, *gate = nullptr;
    static Scratch take(ops::Workspace& ws, const AttentionSpec& a, int64_t T);
  };

  /// Binds `{prefix}{q,k,v,o}_proj.weight` and `{prefix}{q,k}_norm.weight` (prefix e.g.
  /// "layers.3.self_attn."), with AttentionSpec::qkv_bias `{prefix}{q,k,v}_proj.bias`, with
  /// AttentionSpec::o_bias `{prefix}o_proj.bias` and with
  /// AttentionSpec::sinks `{prefix}sinks` [n_heads]; with AttentionSpec::k_eq_v no v_proj. `layer`
  /// selects the geometry (ModelSpec::attn_of) and whether the sliding window applies
  /// (AttentionSpec::windowed).
  void bind(const io::Checkpoint& ck, const std::string& prefix, const ModelSpec& spec, int layer = -1);
  /// Moves the weights and parameter vectors to where `be` reads them (Backend::upload /
  /// upload_floats; a no-op on host backends). Call once after bind(), with the backend that
  /// forward() will get.
  void place(ops::Backend& be) override;
  /// TokenMixer (layer.h): bind() under `layers.{layer}.self_attn.`, the scratch above, and
  /// forward() over the step's sequences on their states' layer `layer`.
  void bind_layer(const io::Checkpoint& ck, const ModelSpec& spec, int layer) override;
  void take_scratch(ops::Workspace& ws, const ModelSpec& spec, int layer, int64_t T) const override;
  void forward_rows(const float* x, std::span<const SeqRows> seqs, int64_t N, float* out, ops::Backend& be,
                    ops::Workspace& ws) const override;
  /// x: [T, hidden] (normed input) at positions [pos0, pos0 + T); appends k/v to `cache`
  /// (capacity must already hold pos0 + T); out: [T, hidden]. Scratch from `ws`.
  void forward(const float* x, int64_t T, int64_t pos0, AttnCache& cache, float* out, ops::Backend& be,
               ops::Workspace& ws) const;
  /// Several sequences at once: x, out [N, hidden], segs their row ranges (together N rows).
  /// The projections, norms and the output projection run over all N rows (their weights read
  /// once); RoPE, the cache append and attention per sequence, on its own cache.
  void forward(const float* x, std::span<const AttnSeg> segs, int64_t N, float* out, ops::Backend& be,
               ops::Workspace& ws) const;

 private:
  AttentionSpec a_;
  int layer_ = -1;  // bind()'s layer: the index of its caches in a State
  float eps_ = 1e-6f;
  ops::WeightView wq_, wk_, wv_, wo_;
  std::vector<float> q_norm_, k_norm_;
  const float* q_norm_p_ = nullptr;  // q_norm_ where the backend reads it (place())
  const float* k_norm_p_ = nullptr;
  int64_t window_ = 0;  // this layer's sliding window (0: none)
  std::vector<float> bq_, bk_, bv_, bo_;  // projection biases [nh*hd], [nkv*hd] x2, [H] (qkv_bias, o_bias)
  const float *bq_p_ = nullptr, *bk_p_ = nullptr, *bv_p_ = nullptr, *bo_p_ = nullptr;  // where the backend reads them
  std::vector<float> ones_;  // [head_dim] of 1: the weight of the weightless value norm (value_norm)
  const float* ones_p_ = nullptr;  // ones_ where the backend reads it
  std::vector<float> sinks_;  // [n_heads] host (AttentionSpec::sinks)
  ops::Rope rope_;
};

}  // namespace spool::models
