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

bool has_non_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return true;
  return false;
}

}  // namespace spool::ops
