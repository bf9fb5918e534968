// Gated DeltaNet token mixer (linear_attention layers of Qwen3.5-MoE and Qwen3-Next).
// HF Qwen3_5MoeGatedDeltaNet: qkv = in_proj_qkv(x) -> causal conv1d + SiLU -> split q|k|v;
// z = in_proj_z(x); beta = sigmoid(in_proj_b(x)); g = -exp(A_log) * softplus(in_proj_a(x) + dt_bias);
// q, k L2-normalised (eps 1e-6), q /= sqrt(d_k); gated delta rule; o = RMSNorm_w(o) * silu(z)
// per value head; out = out_proj(o).
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/layer.h"
#include "models/spec.h"
#include "models/state.h"
#include "ops/backend.h"
#include "ops/weights.h"
#include "ops/workspace.h"

namespace spool::models {

/// Gated DeltaNet (MixerKind::kGatedDeltaNet) as a TokenMixer; GdnLayout is in models/spec.h.
class GatedDeltaNetLayer final : public TokenMixer {
 public:
  /// `layout`: how bind_layer() reads the input projections.
  explicit GatedDeltaNetLayer(GdnLayout layout = GdnLayout::kSplit) : layout_(layout) {}

  /// Scratch of one forward over T tokens (cd = conv_dim, kd = key_dim, vd = value_dim):
  /// mixed and conv_out [T, cd], z [T, vd], b and a [T, n_v], q and k [T, kd], v [T, vd],
  /// beta and g [T, n_v], o [T, vd].
  struct Scratch {
    float *mixed, *conv_out, *z, *b, *a, *q, *k, *v, *beta, *g, *o;
    static Scratch take(ops::Workspace& ws, const GdnSpec& g, int64_t T);
  };

  /// Binds `{prefix}...` (prefix e.g. "layers.0.linear_attn."). The Qwen3-Next layout is
  /// regrouped once at load into the flat Qwen3.5 layout (a copy of those two tensors).
  void bind(const io::Checkpoint& ck, const std::string& prefix, const ModelSpec& spec, GdnLayout layout);
  /// Moves the weights and parameter vectors to where `be` reads them (Backend::upload /
  /// upload_floats; a no-op on host backends). Call once after bind().
  void place(ops::Backend& be) override;
  /// TokenMixer (layer.h): bind() under `layers.{layer}.linear_attn.`, the scratch above, and
  /// forward() over the step's sequences on their states' layer `layer`.
  void bind_layer(const io::Checkpoint& ck, const ModelSpec& spec, int layer) override;
  void take_scratch(ops::Workspace& ws, const ModelSpec& spec, int layer, int64_t T) const override;
  void forward_rows(const float* x, std::span<const SeqRows> seqs, int64_t N, float* out, ops::Backend& be,
                    ops::Workspace& ws) const override;

  /// x: [T, hidden] (normed input); updates `st`; out: [T, hidden]. T == 1 runs the
  /// recurrent form, T > 1 the chunked form (chunks of 64 tokens, as HF). Scratch from `ws`.
  void forward(const float* x, int64_t T, GdnState& st, float* out, ops::Backend& be, ops::Workspace& ws) const {
    forward(x, T, st.conv.data(), st.recurrent.data(), out, be, ws);
  }
  /// The same on a state given as its two arrays (conv [conv_dim, K-1], recurrent [n_v, d_k,
  /// d_v]), host or device memory (State::gdn_conv / gdn_recurrent).
  void forward(const float* x, int64_t T, float* conv_state, float* recurrent_state, float* out, ops::Backend& be,
               ops::Workspace& ws) const;
  /// Several sequences at once: x, out [N, hidden], segs their row ranges (together N rows).
  /// The projections, gates, norms and out_proj run over all N rows (their weights read once);
  /// the causal conv and the delta-rule recurrence per sequence, on its own state.
  void forward(const float* x, std::span<const GdnSeg> segs, int64_t N, float* out, ops::Backend& be,
               ops::Workspace& ws) const;

 private:
  GdnSpec g_;
  GdnLayout layout_;
  int layer_ = -1;  // bind_layer()'s layer: the index of its states in a State
  float eps_ = 1e-6f;
  ops::WeightView qkv_, z_, b_, a_, out_;
  std::vector<uint8_t> regrouped_[4];  // owns the qkv, z, b, a rows of the Qwen3-Next layout
  std::vector<float> conv_w_;       // [conv_dim, K]
  std::vector<float> a_log_exp_;    // [n_v] exp(A_log)
  std::vector<float> dt_bias_;      // [n_v]
  std::vector<float> norm_w_;       // [d_v]
  // The four vectors above where the backend reads them (host data() until place()).
  const float *conv_w_p_ = nullptr, *a_log_exp_p_ = nullptr, *dt_bias_p_ = nullptr, *norm_w_p_ = nullptr;
};

}  // namespace spool::models
