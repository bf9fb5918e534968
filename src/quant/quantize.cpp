#include "quant/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "ops/weights.h"
#include "quant/hadamard.h"
#include "quant/fit.h"
#include "quant/pack.h"

namespace spool::quant {

spool::ops::QuantView QuantizedMatrix::view() const {
  spool::ops::QuantView v;
  v.type = type;
  v.rows = rows;
  v.cols = cols;
  v.group = group;
  v.qweight = qweight.data();
  v.scales = scales.data();
  v.codebook = codebook.data();
  v.signs = signs.empty() ? nullptr : signs.data();
  return v;
}

void check_group(int64_t cols, int g) {
  if (cols <= 0) fail("quantize: column count %lld must be positive", static_cast<long long>(cols));
  if (g <= 0 || g > cols || cols % g != 0 || !(g == 32 || g == 64 || g == 128 || g == cols))
    fail("quantize: group size %d must be 32, 64 or 128 (or the column count) and divide the column count %lld", g,
         static_cast<long long>(cols));
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00 : 0x7c00);  // NaN, inf
  if (a >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds to inf
  if (a < 0x38800000u) {                        // below 2^-14: subnormal half (or zero)
    float m;
    std::memcpy(&m, &a, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(m * 16777216.0f));  // units of 2^-24, exact scaling
  }
  uint32_t h = ((((a >> 23) - 127 + 15)) << 10) | ((a & 0x7fffffu) >> 13);
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

void quantize_rows(const float* W, int64_t cols, QType t, int g, const int8_t* signs, int64_t r0, int64_t r1,
                   uint8_t* qweight, uint16_t* scales) {
  quantize_rows(W, cols, t, g, signs, r0, r1, qweight, scales, Coder(codebook(t)), ScaleSearch::kNone);
}

void quantize_rows(const float* W, int64_t cols, QType t, int g, const int8_t* signs, int64_t r0, int64_t r1,
                   uint8_t* qweight, uint16_t* scales, const Coder& coder, ScaleSearch mode) {
  check_group(cols, g);
  if (static_cast<int64_t>(coder.cb.size()) != levels(t))
    fail("quantize: a %zu-entry codebook for type %s (%d entries)", coder.cb.size(), qtype_name(t), levels(t));
  const int64_t ng = cols / g, gb = group_bytes(t, g), rb = ng * gb;
  std::vector<float> row(static_cast<size_t>(cols));
  std::vector<uint8_t> codes(static_cast<size_t>(g));
  for (int64_t r = r0; r < r1; ++r) {
    const float* src = W + r * cols;
    for (int64_t c = 0; c < cols; ++c)
      if (!std::isfinite(src[c]))
        fail("quantize: weight [%lld, %lld] is not finite", static_cast<long long>(r), static_cast<long long>(c));
    if (signs != nullptr) {
      rotate_input(signs, src, cols, row.data());
    } else {
      std::copy_n(src, cols, row.data());
    }
    for (int64_t gi = 0; gi < ng; ++gi) {
      GroupScale gs;
      try {
        gs = search_scale(row.data() + gi * g, g, coder, mode, codes.data());
      } catch (const Error& e) {
        fail("quantize: row %lld group %lld: %s", static_cast<long long>(r), static_cast<long long>(gi), e.what());
      }
      scales[r * ng + gi] = gs.scale;
      pack_group(t, codes.data(), g, qweight + r * rb + gi * gb);
    }
  }
}

QuantizedMatrix quantize(const float* W, int64_t rows, int64_t cols, QType t, int g, const int8_t* signs,
                         spool::ops::ThreadPool* pool, const QuantOptions& opts) {
  check_group(cols, g);
  if (rows < 0) fail("quantize: negative row count %lld", static_cast<long long>(rows));
  QuantizedMatrix q;
  q.type = t;
  q.rows = rows;
  q.cols = cols;
  q.group = g;
  q.qweight.assign(static_cast<size_t>(rows * row_bytes(t, cols, g)), 0);
  q.scales.assign(static_cast<size_t>(rows * (cols / g)), 0);
  if (opts.codebook == CodebookSource::kFit) {  // (q8 keeps its grid: fit_codebook)
    q.codebook = fit_codebook(t, g, rows, cols, [&](int64_t r, float* out) {
      if (signs != nullptr) rotate_input(signs, W + r * cols, cols, out);
      else std::copy_n(W + r * cols, cols, out);
    }, opts.scale_search);
  } else {
    const std::span<const float> cb = codebook(t);
    q.codebook.assign(cb.begin(), cb.end());
  }
  const Coder coder(q.codebook);
  if (signs != nullptr) q.signs.assign(signs, signs + cols);
  if (pool == nullptr || pool->size() == 1 || rows < 2) {
    quantize_rows(W, cols, t, g, signs, 0, rows, q.qweight.data(), q.scales.data(), coder, opts.scale_search);
  } else {
    pool->parallel_for(rows, 1, [&](int64_t b, int64_t e, int) {
      quantize_rows(W, cols, t, g, signs, b, e, q.qweight.data(), q.scales.data(), coder, opts.scale_search);
    });
  }
  return q;
}

void dequantize_row(const spool::ops::QuantView& w, int64_t r, float* out) {
  spool::ops::validate(w);
  if (r < 0 || r >= w.rows)
    fail("dequantize_row: row %lld outside [0, %lld)", static_cast<long long>(r), static_cast<long long>(w.rows));
  const int64_t ng = w.groups_per_row(), gb = group_bytes(w.type, w.group);
  std::vector<uint8_t> codes(static_cast<size_t>(w.group));
  for (int64_t gi = 0; gi < ng; ++gi) {
    unpack_group(w.type, w.qweight + (r * ng + gi) * gb, w.group, codes.data());
    const float s = w.scale(r * ng + gi);
    for (int j = 0; j < w.group; ++j) out[gi * w.group + j] = w.centroid(codes[static_cast<size_t>(j)]) * s;
  }
}

void dequantize(const spool::ops::QuantView& w, float* out) {
  for (int64_t r = 0; r < w.rows; ++r) {
    float* row = out + r * w.cols;
    dequantize_row(w, r, row);
    if (w.signs != nullptr) unrotate(w.signs, row, w.cols, row);
  }
}

}  // namespace spool::quant
