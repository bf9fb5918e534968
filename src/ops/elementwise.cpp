#include "ops/elementwise.h"

#include <algorithm>

namespace spool::ops {

void rms_norm(const float* x, const float* w, int64_t n, float eps, float* y) {
  const double ss = sum_squares(x, n);
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * inv) * w[i];
}

void rms_norm_rows(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) rms_norm(x + r * n, w, n, eps, y + r * n);
}

void l2_norm(float* x, int64_t n, float eps) {
  const float inv = 1.0f / std::sqrt(static_cast<float>(sum_squares(x, n)) + eps);
  scale(inv, x, n);
}

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

void gelu_tanh_glu(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = gelu_tanh(gate[i]) * up[i];
}

void softcap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void clamped_swiglu(const float* u, const float* bias, int64_t I, float* out) {
  constexpr float kAlpha = 1.702f, kLimit = 7.0f;  // ops::kGptOssAlpha / kGptOssLimit
  for (int64_t j = 0; j < I; ++j) {
    float g = u[2 * j], v = u[2 * j + 1];
    if (bias != nullptr) {
      g += bias[2 * j];
      v += bias[2 * j + 1];
    }
    g = std::min(g, kLimit);
    v = std::clamp(v, -kLimit, kLimit);
    out[j] = (v + 1.0f) * (g * sigmoid(kAlpha * g));
  }
}

bool has_non_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return true;
  return false;
}

}  // namespace spool::ops
