#include "quant/pack.h"

#include <cstring>

#include "common/error.h"

namespace spool::quant {

int64_t group_bytes(QType t, int g) {
  if (g < 1) fail("group size %d must be positive", g);
  return spool::ops::qtype_group_bytes(t, g);
}

int64_t row_bytes(QType t, int64_t cols, int g) {
  if (g < 1 || cols < 0 || cols % g != 0)
    fail("group size %d does not divide the column count %lld", g, static_cast<long long>(cols));
  return (cols / g) * group_bytes(t, g);
}

void pack_group(QType t, const uint8_t* codes, int g, uint8_t* out) {
  const int64_t nb = group_bytes(t, g);
  const int L = levels(t);
  for (int j = 0; j < g; ++j)
    if (codes[j] >= L) fail("code %d at %d out of range for %s (%d levels)", codes[j], j, qtype_name(t), L);
  if (t == QType::kTernary) {
    for (int64_t i = 0; i < nb; ++i) {
      int v = 0;
      for (int d = 4; d >= 0; --d) {
        const int64_t j = i * 5 + d;
        v = v * 3 + (j < g ? codes[j] : 1);
      }
      out[i] = static_cast<uint8_t>(v);
    }
    return;
  }
  const int b = bits(t);
  std::memset(out, 0, static_cast<size_t>(nb));
  for (int j = 0; j < g; ++j) {
    const int64_t bit = static_cast<int64_t>(j) * b;
    const unsigned v = static_cast<unsigned>(codes[j]) << (bit & 7);
    out[bit >> 3] |= static_cast<uint8_t>(v);
    if ((bit & 7) + b > 8) out[(bit >> 3) + 1] |= static_cast<uint8_t>(v >> 8);
  }
}

void unpack_group(QType t, const uint8_t* in, int g, uint8_t* codes) {
  const int64_t nb = group_bytes(t, g);
  if (t == QType::kTernary) {
    for (int64_t i = 0; i < nb; ++i) {
      int v = in[i];
      if (v > 242) fail("ternary byte %d at %lld is not a valid base-3 code", v, static_cast<long long>(i));
      for (int d = 0; d < 5; ++d, v /= 3)
        if (i * 5 + d < g) codes[i * 5 + d] = static_cast<uint8_t>(v % 3);
    }
    return;
  }
  const int b = bits(t);
  const unsigned mask = (1u << b) - 1;
  for (int j = 0; j < g; ++j) {
    const int64_t bit = static_cast<int64_t>(j) * b;
    unsigned v = in[bit >> 3];
    if ((bit & 7) + b > 8) v |= static_cast<unsigned>(in[(bit >> 3) + 1]) << 8;
    codes[j] = static_cast<uint8_t>((v >> (bit & 7)) & mask);
  }
}

}  // namespace spool::quant
