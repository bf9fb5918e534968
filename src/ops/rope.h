// Rotary position embedding, NeoX / HF "rotate_half" convention: dim j pairs with j + d_r/2
// within the first d_r (rotary) dims of a head; the remaining dims pass through.
// Numerics follow HF: inv_freq[i] = 1 / theta^(2i/d_r) in f32, angle = f32(pos) * inv_freq[i]
// rounded to f32, then cos/sin (times attention_scaling).
#pragma once

#include <cstdint>
#include <vector>

namespace spool::ops {

/// Precomputed frequencies for one rotary configuration.
class Rope {
 public:
  Rope() = default;
  /// rotary_dim: even number of rotated dims per head; theta: base; scaling: factor on cos/sin.
  Rope(int rotary_dim, double theta, float attention_scaling = 1.0f);
  /// Builds from explicit inverse frequencies (e.g. YaRN), rotary_dim = 2 * inv_freq.size().
  explicit Rope(std::vector<float> inv_freq, float attention_scaling = 1.0f);

  int rotary_dim() const { return rotary_dim_; }
  /// Pairs mode (HF `rope_interleave`, GPT-J / complex form; DeepSeek-V3's
  /// apply_rotary_pos_emb_interleave, ERNIE-4.5): the rotary dims of a head arrive as adjacent
  /// pairs (x0, x1), (x2, x3), ... and leave de-interleaved, [x0' x2' ... | x1' x3' ...], rotated by
  /// rotate_half exactly as HF does after its view/transpose/reshape: dim i of the even half pairs
  /// with dim i of the odd half. q and k both leave in that order, so their dot products are
  /// those of the interleaved rotation. Off by default (rotate_half on the dims as they are).
  bool pairs() const { return pairs_; }
  /// Returns a copy in pairs mode (`on`) or not.
  Rope with_pairs(bool on) const {
    Rope r = *this;
    r.pairs_ = on;
    return r;
  }
  const std::vector<float>& inv_freq() const { return inv_freq_; }
  /// The backend's copy of inv_freq() (Backend::upload_floats, set by a layer's place()), or null:
  /// a device backend then stages inv_freq() on every call.
  const float* placed_inv_freq() const { return placed_; }
  void set_placed_inv_freq(const float* p) { placed_ = p; }
  /// Factor on cos/sin (YaRN attention scaling; 1 otherwise).
  float scaling() const { return scaling_; }

  /// Rotates `n_heads` heads of `head_dim` values at `x` (head h at x + h * head_dim) in place
  /// for position `pos` (in pairs mode the rotary dims are de-interleaved first, see pairs()).
  void apply(float* x, int n_heads, int head_dim, int64_t pos) const;

 private:
  int rotary_dim_ = 0;
  float scaling_ = 1.0f;
  bool pairs_ = false;
  const float* placed_ = nullptr;
  std::vector<float> inv_freq_;  // [rotary_dim / 2]
};

/// Inverse frequencies of "proportional" RoPE (HF _compute_proportional_rope_parameters,
/// modeling_rope_utils.py; Gemma 4's full-attention layers) over a whole head of `head_dim`
/// (even): the first n = int(partial_rotary_factor * head_dim) / 2 frequencies are
/// theta^(-2i / head_dim) / factor (f32, as HF), the remaining head_dim/2 - n are 0, so with the
/// rotate_half pairing dims (j, j + head_dim/2) rotate for j < n and the rest pass unchanged.
/// Not the same as partial rotary (rotary_dim = n*2 pairs (j, j + n) at theta^(-2i / (2n))).
std::vector<float> proportional_inv_freq(double theta, int head_dim, double partial_rotary_factor, double factor = 1.0);

}  // namespace spool::ops
