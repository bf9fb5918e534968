#include "ops/rope.h"

#include <cmath>

namespace spool::ops {

Rope::Rope(int rotary_dim, double theta, float attention_scaling) : rotary_dim_(rotary_dim), scaling_(attention_scaling) {
  inv_freq_.resize(rotary_dim / 2);
  for (int i = 0; i < rotary_dim / 2; ++i) {
    // HF: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all in f32.
    const float e = static_cast<float>(2 * i) / static_cast<float>(rotary_dim);
    const float p = std::pow(static_cast<float>(theta), e);
    inv_freq_[i] = 1.0f / p;
  }
}

Rope::Rope(std::vector<float> inv_freq, float attention_scaling)
    : rotary_dim_(static_cast<int>(inv_freq.size() * 2)), scaling_(attention_scaling), inv_freq_(std::move(inv_freq)) {}

void Rope::apply(float* x, int n_heads, int head_dim, int64_t pos) const {
  const int half = rotary_dim_ / 2;
  float cs[512], sn[512];
  float* c = cs;
  float* s = sn;
  std::vector<float> big;
  if (half > 512) {
    big.resize(2 * half);
    c = big.data();
    s = big.data() + half;
  }
  const float fp = static_cast<float>(pos);
  for (int i = 0; i < half; ++i) {
    const float ang = fp * inv_freq_[i];  // f32 product, as HF's f32 matmul of [d/2,1] x [1,T]
    c[i] = static_cast<float>(std::cos(static_cast<double>(ang))) * scaling_;
    s[i] = static_cast<float>(std::sin(static_cast<double>(ang))) * scaling_;
  }
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * c[i] - b * s[i];
      v[i + half] = b * c[i] + a * s[i];
    }
  }
}

}  // namespace spool::ops
