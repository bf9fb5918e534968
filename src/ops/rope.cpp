#include "ops/rope.h"

#include <algorithm>
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

std::vector<float> proportional_inv_freq(double theta, int head_dim, double partial_rotary_factor, double factor) {
  std::vector<float> f(static_cast<size_t>(head_dim / 2), 0.0f);
  const int n = std::min(static_cast<int>(partial_rotary_factor * head_dim) / 2, head_dim / 2);  // HF rope_angles
  for (int i = 0; i < n; ++i) {
    // HF: 1.0 / (base ** (arange(0, 2 * rope_angles, 2).float() / head_dim)), f32, then / factor.
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    f[i] = 1.0f / std::pow(static_cast<float>(theta), e) / static_cast<float>(factor);
  }
  return f;
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
  float tmp_small[1024];
  std::vector<float> tmp_big;
  float* tmp = tmp_small;
  if (pairs_ && rotary_dim_ > 1024) {
    tmp_big.resize(static_cast<size_t>(rotary_dim_));
    tmp = tmp_big.data();
  }
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    if (pairs_) {  // [x0 x1 x2 x3 ...] -> [x0 x2 ... | x1 x3 ...]
      for (int i = 0; i < half; ++i) {
        tmp[i] = v[2 * i];
        tmp[half + i] = v[2 * i + 1];
      }
      std::copy(tmp, tmp + rotary_dim_, v);
    }
    for (int i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * c[i] - b * s[i];
      v[i + half] = b * c[i] + a * s[i];
    }
  }
}

}  // namespace spool::ops
