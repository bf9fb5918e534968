// Small f32 vector kernels: norms, activations, softmax. Row-wise; callers loop over tokens.
#pragma once

#include <cmath>
#include <cstdint>

#include "ops/vec.h"

namespace spool::ops {

/// y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], over n elements (HF RMSNorm in f32).
/// `w` is the effective weight: Gemma-style "(1 + w)" norms pass 1 + w precomputed.
/// Safe in place (y == x).
void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y);

/// Applies rms_norm independently to `rows` consecutive rows of length n (in place allowed).
void rms_norm_rows(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y);

/// x *= 1 / sqrt(sum(x^2) + eps) (the Gated DeltaNet l2norm, eps = 1e-6), in place.
void l2_norm(float* x, int64_t n, float eps);

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
/// log(1 + e^x) with PyTorch's threshold: x when x > 20.
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

/// out[i] = silu(gate[i]) * up[i].
void swiglu(const float* gate, const float* up, int64_t n, float* out);

/// tanh-approximated GELU (PyTorch gelu(approximate="tanh"), HF "gelu_pytorch_tanh"):
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), computed in f32.
inline float gelu_tanh(float x) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(kC * (x + 0.044715f * x * x * x)));
}

/// out[i] = gelu_tanh(gate[i]) * up[i] (the gated MLP with act_fn gelu_pytorch_tanh, HF
/// Gemma4TextMLP / Gemma4TextExperts). out may alias gate.
void gelu_tanh_glu(const float* gate, const float* up, int64_t n, float* out);

/// x[i] = cap * tanh(x[i] / cap) (final logit soft-capping, HF Gemma final_logit_softcapping),
/// in place; cap > 0.
void softcap(float* x, int64_t n, float cap);

/// gpt-oss clamped SwiGLU of one row (HF GptOssExperts._apply_gate, alpha 1.702, limit 7):
/// u [2I] interleaved (u[2j] gate, u[2j+1] up), bias [2I] added first (may be null);
/// out[j] = (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g) with g = min(gate, 7). out [I]
/// (may alias u: element j is written after u[2j], u[2j+1] are read).
void clamped_swiglu(const float* u, const float* bias, int64_t I, float* out);

/// In-place softmax over n elements (max-subtracted, f32).
inline void softmax(float* x, int64_t n) { softmax_inplace(x, n); }

/// Returns true if any element is NaN or infinite.
bool has_non_finite(const float* x, int64_t n);

}  // namespace spool::ops
