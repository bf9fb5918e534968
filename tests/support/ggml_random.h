// Test helper: random valid ggml blocks of a given weight rms (kernel and model tests).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/ggml_types.h"
#include "ops/ggml_blocks.h"
#include "ops/ggml_iquants.h"
#include "ops/weights.h"

namespace spool::testing {

/// rows x cols random ggml blocks of type t (row-major, ggml_row_bytes(t, cols) per row): random
/// bytes, then the f16 scale fields (and MXFP4's shared exponent, IQ1_M's split d) rescaled so that the weights'
/// rms is about `rms` and products stay O(1). cols must be a multiple of t's block size.
inline std::vector<uint8_t> random_ggml_blocks(GgmlType t, int64_t rows, int64_t cols, uint64_t seed,
                                               double rms = 0.1) {
  const GgmlTypeTraits tr = ggml_type_traits(t);
  std::mt19937_64 g(seed);
  std::vector<uint8_t> m(static_cast<size_t>(rows * ggml_row_bytes(t, cols)));
  for (auto& b : m) b = static_cast<uint8_t>(g());
  const size_t nb = m.size() / tr.size;
  for (size_t b = 0; b < nb; ++b) {
    uint8_t* p = m.data() + b * tr.size;
    for (int off : ggml_half_fields(t)) {
      const uint16_t h = static_cast<uint16_t>((g() & 1) << 15 | (10 + g() % 5) << 10 | (g() & 0x3ff));
      std::memcpy(p + off, &h, 2);
    }
    if (t == GgmlType::MXFP4) p[0] = static_cast<uint8_t>(125 + g() % 3);
    if (t == GgmlType::IQ1_M) ops::iq1m_set_d(p, static_cast<uint16_t>((g() & 1) << 15 | (10 + g() % 5) << 10 | (g() & 0x3ff)));
  }
  std::vector<float> f(static_cast<size_t>(rows * cols));
  ops::ggml_dequantize_row(t, m.data(), rows * cols, f.data());
  double ss = 0;
  for (float v : f) ss += static_cast<double>(v) * v;
  const double scale = rms / std::sqrt(ss / static_cast<double>(f.size()) + 1e-30);
  for (size_t b = 0; b < nb; ++b) {
    uint8_t* p = m.data() + b * tr.size;
    for (int off : ggml_half_fields(t)) {
      uint16_t h;
      std::memcpy(&h, p + off, 2);
      h = ops::f32_to_f16(static_cast<float>(ops::f16_to_f32(h) * scale));
      std::memcpy(p + off, &h, 2);
    }
    if (t == GgmlType::IQ1_M) ops::iq1m_set_d(p, ops::f32_to_f16(static_cast<float>(ops::f16_to_f32(ops::iq1m_get_d(p)) * scale)));
    if (t == GgmlType::MXFP4)
      p[0] = static_cast<uint8_t>(std::clamp<int>(p[0] + static_cast<int>(std::lround(std::log2(scale))), 1, 254));
  }
  return m;
}

}  // namespace spool::testing
