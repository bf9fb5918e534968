// Scalar decoders of ggml's i-quant and ternary block types. Block layouts (ggml-common.h, gguf-py
// quants.py; QK_K = 256 elements per block, "sub-block" = 32 elements, f16 = IEEE half):
//   IQ2_XXS 66 B: d f16, qs u16[32]. Sub-block i: u32 at qs + 8i = 4 grid indices (bytes, 8
//           elements each), u32 at qs + 8i + 4 = 4 x 7-bit sign indices (ksigns) | scale << 28;
//           w = d * (0.5 + scale) * 0.25 * grid * sign.
//   IQ2_XS  74 B: d, qs u16[32] (9-bit grid index | 7-bit sign index << 9), scales u8[8] (a
//           4-bit scale per 16 elements); w = d * (0.5 + s) * 0.25 * grid * sign.
//   IQ2_S   82 B: d, qs u8[32] (grid index low 8 bits), signs u8[32] (one bit per element), qh
//           u8[8] (2 high index bits per group), scales u8[8]; w as IQ2_XS.
//   IQ3_XXS 98 B: d, qs u8[64] (grid indices, 4 elements each), u32[8] per sub-block: 4 x 7-bit
//           sign indices | scale << 28; w = d * (0.5 + scale) * 0.5 * grid * sign.
//   IQ3_S  110 B: d, qs u8[64] (index low bits), qh u8[8] (index bit 8), signs u8[32], scales
//           u8[4] (a 4-bit scale per sub-block); w = d * (1 + 2 s) * grid * sign.
//   IQ1_S   50 B: d, qs u8[32] (index low bits), qh u16[8] per sub-block: 4 x 3 high index bits,
//           scale << 12 (3 bits), bit 15 = delta sign; w = d * (2 s + 1) * (grid + delta),
//           delta = +-0.125, grid values -1, 0, 1.
//   IQ1_M   56 B: qs u8[32], qh u8[16] (a nibble per group of 8: 3 high index bits, bit 3 = delta
//           sign), scales u16[4] (3-bit scales per 16 elements; top nibbles = the f16 d).
//   TQ1_0   54 B: qs u8[48], qh u8[4], d f16. Each byte packs 5 (qh: 4) base-3 digits as a
//           fixed-point fraction: digit n = ((u8)(byte * 3^n) * 3) >> 8, value digit - 1.
//   TQ2_0   66 B: qs u8[64], d f16. 2-bit codes, value code - 1.
// The arithmetic is float32 in the order of gguf-py's dequantize (numpy float32), so the result
// is bit-identical to it: d * (0.5 + s) * 0.25 is ((d * (0.5 + s)) * 0.25), then * grid, then the
// sign (exact).
#include "ops/ggml_iquants.h"

#include <cstring>

#include "common/error.h"
#include "ops/ggml_iquant_tables.h"
#include "ops/weights.h"

namespace spool::ops {
namespace {

constexpr int kQK = 256;

float load_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// n (8 or 4) weights db * grid[j], negated where bit j of `signs` is set.
inline void put(float db, const uint8_t* grid, uint32_t signs, int n, float* y) {
  for (int j = 0; j < n; ++j) {
    const float v = db * static_cast<float>(grid[j]);
    y[j] = (signs >> j) & 1 ? -v : v;
  }
}

void iq2_xxs(const uint8_t* p, float* y) {
  const float d = load_half(p);
  const uint8_t* qs = p + 2;
  for (int ib = 0; ib < kQK / 32; ++ib) {
    const uint8_t* q = qs + 8 * ib;
    const uint32_t aux = load_u32(q + 4);
    const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.25f;
    for (int l = 0; l < 4; ++l)
      put(db, iq::kIq2xxsGrid + 8 * q[l], iq::kKsigns[(aux >> (7 * l)) & 127], 8, y + 32 * ib + 8 * l);
  }
}

void iq2_xs(const uint8_t* p, float* y) {
  const float d = load_half(p);
  const uint8_t* qs = p + 2;
  const uint8_t* scales = p + 66;
  for (int ib = 0; ib < kQK / 32; ++ib) {
    const float db[2] = {d * (0.5f + static_cast<float>(scales[ib] & 0xF)) * 0.25f,
                         d * (0.5f + static_cast<float>(scales[ib] >> 4)) * 0.25f};
    for (int l = 0; l < 4; ++l) {
      const uint16_t q = load_u16(qs + 2 * (4 * ib + l));
      put(db[l / 2], iq::kIq2xsGrid + 8 * (q & 511), iq::kKsigns[q >> 9], 8, y + 32 * ib + 8 * l);
    }
  }
}

void iq2_s(const uint8_t* p, float* y) {
  const float d = load_half(p);
  const uint8_t* qs = p + 2;
  const uint8_t* signs = p + 34;
  const uint8_t* qh = p + 66;
  const uint8_t* scales = p + 74;
  for (int ib = 0; ib < kQK / 32; ++ib) {
    const float db[2] = {d * (0.5f + static_cast<float>(scales[ib] & 0xF)) * 0.25f,
                         d * (0.5f + static_cast<float>(scales[ib] >> 4)) * 0.25f};
    for (int l = 0; l < 4; ++l) {
      const int idx = qs[4 * ib + l] | ((qh[ib] >> (2 * l)) & 3) << 8;
      put(db[l / 2], iq::kIq2sGrid + 8 * idx, signs[4 * ib + l], 8, y + 32 * ib + 8 * l);
    }
  }
}

void iq3_xxs(const uint8_t* p, float* y) {
  const float d = load_half(p);
  const uint8_t* qs = p + 2;
  const uint8_t* ss = p + 66;
  for (int ib = 0; ib < kQK / 32; ++ib) {
    const uint32_t aux = load_u32(ss + 4 * ib);
    const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
    for (int l = 0; l < 4; ++l) {
      const uint32_t s = iq::kKsigns[(aux >> (7 * l)) & 127];
      float* o = y + 32 * ib + 8 * l;
      put(db, iq::kIq3xxsGrid + 4 * qs[8 * ib + 2 * l], s, 4, o);
      put(db, iq::kIq3xxsGrid + 4 * qs[8 * ib + 2 * l + 1], s >> 4, 4, o + 4);
    }
  }
}

void iq3_s(const uint8_t* p, float* y) {
  const float d = load_half(p);
  const uint8_t* qs = p + 2;
  const uint8_t* qh = p + 66;
  const uint8_t* signs = p + 74;
  const uint8_t* scales = p + 106;
  for (int ib = 0; ib < kQK / 32; ++ib) {
    const int s = (scales[ib / 2] >> (4 * (ib % 2))) & 0xF;
    const float db = d * static_cast<float>(1 + 2 * s);
    for (int k = 0; k < 8; ++k) {  // groups of 4 elements
      const int g = 8 * ib + k;
      const int idx = qs[g] | ((qh[g / 8] >> (g % 8)) & 1) << 8;
      put(db, iq::kIq3sGrid + 4 * idx, signs[g / 2] >> (4 * (g % 2)), 4, y + 4 * g);
    }
  }
}

// IQ1 weights: dl * (grid + delta) for the 8 elements of grid entry idx.
inline void put1(float dl, int idx, float delta, float* y) {
  const int8_t* g = iq::kIq1sGrid + 8 * idx;
  for (int j = 0; j < 8; ++j) y[j] = dl * (static_cast<float>(g[j]) + delta);
}

void iq1_s(const uint8_t* p, float* y) {
  const float d = load_half(p);
  const uint8_t* qs = p + 2;
  const uint8_t* qh = p + 34;
  for (int ib = 0; ib < kQK / 32; ++ib) {
    const uint16_t h = load_u16(qh + 2 * ib);
    const float dl = d * static_cast<float>(2 * ((h >> 12) & 7) + 1);
    const float delta = h & 0x8000 ? -0.125f : 0.125f;
    for (int l = 0; l < 4; ++l) put1(dl, qs[4 * ib + l] | ((h >> (3 * l)) & 7) << 8, delta, y + 32 * ib + 8 * l);
  }
}

void iq1_m(const uint8_t* p, float* y) {
  const uint8_t* qs = p;
  const uint8_t* qh = p + 32;
  const float d = f16_to_f32(iq1m_get_d(p));
  uint16_t sc[4];
  std::memcpy(sc, p + 48, 8);
  for (int k = 0; k < 32; ++k) {  // groups of 8 elements
    const int s = (sc[k / 8] >> (3 * ((k / 2) % 4))) & 7;  // one scale per 16 elements
    const float dl = d * static_cast<float>(2 * s + 1);
    const int nib = (qh[k / 2] >> (4 * (k % 2))) & 0xF;
    put1(dl, qs[k] | (nib & 7) << 8, nib & 8 ? -0.125f : 0.125f, y + 8 * k);
  }
}

void tq1_0(const uint8_t* p, float* y) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const float d = load_half(p + 52);
  auto digit = [](uint8_t byte, int n) {
    const uint8_t q = static_cast<uint8_t>(byte * kPow3[n]);  // mod 256: the digit's fraction on top
    return static_cast<float>(((static_cast<uint16_t>(q) * 3) >> 8) - 1);
  };
  for (int n = 0; n < 5; ++n)
    for (int j = 0; j < 32; ++j) y[n * 32 + j] = d * digit(p[j], n);
  for (int n = 0; n < 5; ++n)
    for (int j = 0; j < 16; ++j) y[160 + n * 16 + j] = d * digit(p[32 + j], n);
  for (int n = 0; n < 4; ++n)
    for (int j = 0; j < 4; ++j) y[240 + n * 4 + j] = d * digit(p[48 + j], n);
}

void tq2_0(const uint8_t* p, float* y) {
  const float d = load_half(p + 64);
  for (int c = 0; c < 2; ++c)
    for (int s = 0; s < 4; ++s)
      for (int j = 0; j < 32; ++j)
        y[c * 128 + s * 32 + j] = d * static_cast<float>(((p[c * 32 + j] >> (2 * s)) & 3) - 1);
}

}  // namespace

bool iquant_type(GgmlType t) {
  switch (t) {
    case GgmlType::IQ1_S: case GgmlType::IQ1_M: case GgmlType::IQ2_XXS: case GgmlType::IQ2_XS: case GgmlType::IQ2_S:
    case GgmlType::IQ3_XXS: case GgmlType::IQ3_S: case GgmlType::TQ1_0: case GgmlType::TQ2_0:
      return true;
    default:
      return false;
  }
}

uint16_t iq1m_get_d(const uint8_t* block) {
  uint16_t sc[4];
  std::memcpy(sc, block + 48, 8);
  return static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
}

void iq1m_set_d(uint8_t* block, uint16_t d) {
  uint16_t sc[4];
  std::memcpy(sc, block + 48, 8);
  for (int w = 0; w < 4; ++w) sc[w] = static_cast<uint16_t>((sc[w] & 0x0FFF) | ((d >> (4 * w)) & 0xF) << 12);
  std::memcpy(block + 48, sc, 8);
}

void iquant_dequantize_block(GgmlType t, const uint8_t* block, float* y) {
  switch (t) {
    case GgmlType::IQ2_XXS: return iq2_xxs(block, y);
    case GgmlType::IQ2_XS: return iq2_xs(block, y);
    case GgmlType::IQ2_S: return iq2_s(block, y);
    case GgmlType::IQ3_XXS: return iq3_xxs(block, y);
    case GgmlType::IQ3_S: return iq3_s(block, y);
    case GgmlType::IQ1_S: return iq1_s(block, y);
    case GgmlType::IQ1_M: return iq1_m(block, y);
    case GgmlType::TQ1_0: return tq1_0(block, y);
    case GgmlType::TQ2_0: return tq2_0(block, y);
    default:
      fail("iquant_dequantize_block: ggml type %s (id %u) is not an i-quant or ternary type", ggml_type_name(t),
           static_cast<unsigned>(t));
  }
}

}  // namespace spool::ops
