// SIMD row decoders of the i-quant and ternary block types (Highway, compiled once per target by
// foreach_target, dispatched at runtime): the matmul kernels of ops/ggml_blocks decode a row with
// these into f32 and dot it with each token (see ggml_blocks.cpp RowsByDequant). Each group of 8
// weights is formed with the scalar decoder's expression (ggml_iquants.cpp): grid types
// (db * grid) then the sign bit flipped, IQ1 dl * (grid + delta), ternary d * (code - 1); one
// Mul per weight and no fused operation, so the output is bit-identical to
// iquant_dequantize_block's, which the kernel tests check through unit inputs.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/ggml_iquant_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cstring>

#include "ops/ggml_iquant_tables.h"
#include "ops/ggml_iquants.h"
#include "ops/weights.h"

HWY_BEFORE_NAMESPACE();
namespace spool::ops {
namespace HWY_NAMESPACE {
namespace iqk {  // (other kernel files of spool_ops define functions in HWY_NAMESPACE)
namespace hn = hwy::HWY_NAMESPACE;

using D8F = hn::CappedTag<float, 8>;  // a group of 8 weights: 1 vector (AVX2, AVX-512) or 2 (NEON, SSE4)
using DI32 = hn::RebindToSigned<D8F>;
using DU32 = hn::RebindToUnsigned<D8F>;
using DU8 = hn::Rebind<uint8_t, D8F>;
using DI8 = hn::Rebind<int8_t, D8F>;

alignas(32) constexpr uint32_t kBit[8] = {1, 2, 4, 8, 16, 32, 64, 128};

HWY_INLINE float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// out[0, 8) = db * mag[j], sign bit set where bit j of `signs` is (the scalar decoder negates).
HWY_INLINE void Signed8(float db, const uint8_t* HWY_RESTRICT mag, uint32_t signs, float* HWY_RESTRICT out) {
  const D8F df;
  const DU32 du;
  const DI32 di;
  const DU8 du8;
  const auto vdb = hn::Set(df, db);
  const auto vs = hn::Set(du, signs);
  const auto top = hn::Set(du, 0x80000000u);
  for (size_t j = 0; j < 8; j += hn::Lanes(df)) {
    const auto m = hn::ConvertTo(df, hn::BitCast(di, hn::PromoteTo(du, hn::LoadU(du8, mag + j))));
    const auto w = hn::BitCast(du, hn::Mul(vdb, m));
    const auto neg = hn::Ne(hn::And(vs, hn::LoadU(du, kBit + j)), hn::Zero(du));
    hn::StoreU(hn::BitCast(df, hn::Xor(w, hn::IfThenElseZero(neg, top))), df, out + j);
  }
}

// out[0, 8) = dl * (g[j] + delta) (IQ1 grid values -1, 0, 1).
HWY_INLINE void Iq1Group(float dl, const int8_t* HWY_RESTRICT g, float delta, float* HWY_RESTRICT out) {
  const D8F df;
  const DI32 di;
  const DI8 di8;
  const auto vdl = hn::Set(df, dl), vdelta = hn::Set(df, delta);
  for (size_t j = 0; j < 8; j += hn::Lanes(df))
    hn::StoreU(hn::Mul(vdl, hn::Add(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(di8, g + j))), vdelta)), df, out + j);
}

// +-0.125 from a sign bit at bit 31, by integer ops only (the sign bits are random data: a branch
// or a select the compiler turns into one mispredicts half the time).
HWY_INLINE float Delta(uint32_t sign31) {
  const uint32_t bits = 0x3E000000u | (sign31 & 0x80000000u);  // 0.125f
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// 8 magnitudes of two 4-entry grid rows (IQ3) side by side.
HWY_INLINE void Pair4(const uint8_t* a, const uint8_t* b, uint8_t* out8) {
  std::memcpy(out8, a, 4);
  std::memcpy(out8 + 4, b, 4);
}

void Iq2xxs(const uint8_t* p, float* y) {
  const float d = Half(p);
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t* q = p + 2 + 8 * ib;
    uint32_t aux;
    std::memcpy(&aux, q + 4, 4);
    const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.25f;
    for (int l = 0; l < 4; ++l) Signed8(db, iq::kIq2xxsGrid + 8 * q[l], iq::kKsigns[(aux >> (7 * l)) & 127], y + 32 * ib + 8 * l);
  }
}

void Iq2xs(const uint8_t* p, float* y) {
  const float d = Half(p);
  const uint8_t* scales = p + 66;
  for (int ib = 0; ib < 8; ++ib) {
    const float db[2] = {d * (0.5f + static_cast<float>(scales[ib] & 0xF)) * 0.25f,
                         d * (0.5f + static_cast<float>(scales[ib] >> 4)) * 0.25f};
    for (int l = 0; l < 4; ++l) {
      uint16_t q;
      std::memcpy(&q, p + 2 + 2 * (4 * ib + l), 2);
      Signed8(db[l / 2], iq::kIq2xsGrid + 8 * (q & 511), iq::kKsigns[q >> 9], y + 32 * ib + 8 * l);
    }
  }
}

void Iq2s(const uint8_t* p, float* y) {
  const float d = Half(p);
  const uint8_t *qs = p + 2, *signs = p + 34, *qh = p + 66, *scales = p + 74;
  for (int ib = 0; ib < 8; ++ib) {
    const float db[2] = {d * (0.5f + static_cast<float>(scales[ib] & 0xF)) * 0.25f,
                         d * (0.5f + static_cast<float>(scales[ib] >> 4)) * 0.25f};
    for (int l = 0; l < 4; ++l)
      Signed8(db[l / 2], iq::kIq2sGrid + 8 * (qs[4 * ib + l] | ((qh[ib] >> (2 * l)) & 3) << 8), signs[4 * ib + l],
              y + 32 * ib + 8 * l);
  }
}

void Iq3xxs(const uint8_t* p, float* y) {
  const float d = Half(p);
  const uint8_t* qs = p + 2;
  alignas(8) uint8_t mag[8];
  for (int ib = 0; ib < 8; ++ib) {
    uint32_t aux;
    std::memcpy(&aux, p + 66 + 4 * ib, 4);
    const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
    for (int l = 0; l < 4; ++l) {
      Pair4(iq::kIq3xxsGrid + 4 * qs[8 * ib + 2 * l], iq::kIq3xxsGrid + 4 * qs[8 * ib + 2 * l + 1], mag);
      Signed8(db, mag, iq::kKsigns[(aux >> (7 * l)) & 127], y + 32 * ib + 8 * l);
    }
  }
}

void Iq3s(const uint8_t* p, float* y) {
  const float d = Half(p);
  const uint8_t *qs = p + 2, *qh = p + 66, *signs = p + 74, *scales = p + 106;
  alignas(8) uint8_t mag[8];
  for (int ib = 0; ib < 8; ++ib) {
    const float db = d * static_cast<float>(1 + 2 * ((scales[ib / 2] >> (4 * (ib % 2))) & 0xF));
    for (int l = 0; l < 4; ++l) {  // 8 elements: grid groups g = 8 ib + 2 l and g + 1 (qh byte ib)
      const int g = 8 * ib + 2 * l;
      Pair4(iq::kIq3sGrid + 4 * (qs[g] | ((qh[ib] >> (2 * l)) & 1) << 8),
            iq::kIq3sGrid + 4 * (qs[g + 1] | ((qh[ib] >> (2 * l + 1)) & 1) << 8), mag);
      Signed8(db, mag, signs[4 * ib + l], y + 32 * ib + 8 * l);
    }
  }
}

void Iq1s(const uint8_t* p, float* y) {
  const float d = Half(p);
  for (int ib = 0; ib < 8; ++ib) {
    uint16_t h;
    std::memcpy(&h, p + 34 + 2 * ib, 2);
    const float dl = d * static_cast<float>(2 * ((h >> 12) & 7) + 1);
    const float delta = Delta(static_cast<uint32_t>(h) << 16);
    for (int l = 0; l < 4; ++l) Iq1Group(dl, iq::kIq1sGrid + 8 * (p[2 + 4 * ib + l] | ((h >> (3 * l)) & 7) << 8), delta, y + 32 * ib + 8 * l);
  }
}

void Iq1m(const uint8_t* p, float* y) {
  const float d = f16_to_f32(iq1m_get_d(p));
  uint16_t sc[4];
  std::memcpy(sc, p + 48, 8);
  float dl[16];  // one scale per 16 elements
  for (int i = 0; i < 16; ++i) dl[i] = d * static_cast<float>(2 * ((sc[i / 4] >> (3 * (i % 4))) & 7) + 1);
  for (int k = 0; k < 32; ++k) {
    const int nib = (p[32 + k / 2] >> (4 * (k % 2))) & 0xF;
    Iq1Group(dl[k / 2], iq::kIq1sGrid + 8 * (p[k] | (nib & 7) << 8), Delta(static_cast<uint32_t>(nib) << 28), y + 8 * k);
  }
}

// TQ1_0: 5 (the last 4 bytes: 4) base-3 digits per byte, digit n = ((u8)(byte * 3^n) * 3) >> 8.
template <class DF, class DI, class DU8>
HWY_INLINE void Tq1Digits(DF df, DI di, DU8 du8, const uint8_t* q, int nbytes, int ndigits, hn::Vec<DF> vd, float* y) {
  static constexpr int kPow3[5] = {1, 3, 9, 27, 81};
  const size_t N = hn::Lanes(df);
  const auto ff = hn::Set(di, 0xFF), three = hn::Set(di, 3), one = hn::Set(di, 1);
  for (int n = 0; n < ndigits; ++n)
    for (size_t j = 0; j < static_cast<size_t>(nbytes); j += N) {
      const auto b = hn::And(hn::Mul(hn::PromoteTo(di, hn::LoadU(du8, q + j)), hn::Set(di, kPow3[n])), ff);
      const auto v = hn::Sub(hn::ShiftRight<8>(hn::Mul(b, three)), one);
      hn::StoreU(hn::Mul(vd, hn::ConvertTo(df, v)), df, y + n * nbytes + j);
    }
}

void Tq1(const uint8_t* p, float* y) {
  const hn::CappedTag<float, 16> d16;  // 16 or fewer lanes: the 16-byte and 4-byte runs
  const hn::CappedTag<float, 4> d4;
  const auto vd16 = hn::Set(d16, Half(p + 52));
  const auto vd4 = hn::Set(d4, Half(p + 52));
  const hn::RebindToSigned<decltype(d16)> di16;
  const hn::Rebind<uint8_t, decltype(d16)> du16;
  const hn::RebindToSigned<decltype(d4)> di4;
  const hn::Rebind<uint8_t, decltype(d4)> du4;
  Tq1Digits(d16, di16, du16, p, 32, 5, vd16, y);
  Tq1Digits(d16, di16, du16, p + 32, 16, 5, vd16, y + 160);
  Tq1Digits(d4, di4, du4, p + 48, 4, 4, vd4, y + 240);
}

void Tq2(const uint8_t* p, float* y) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> du8;
  const auto vd = hn::Set(df, Half(p + 64));
  const auto three = hn::Set(di, 3), one = hn::Set(di, 1);
  const size_t N = hn::Lanes(df);
  for (int c = 0; c < 2; ++c)
    for (int s = 0; s < 4; ++s)
      for (size_t j = 0; j < 32; j += N) {
        const auto q = hn::PromoteTo(di, hn::LoadU(du8, p + c * 32 + j));
        const auto v = hn::Sub(hn::And(hn::ShiftRightSame(q, 2 * s), three), one);
        hn::StoreU(hn::Mul(vd, hn::ConvertTo(df, v)), df, y + c * 128 + s * 32 + j);
      }
}

void DecodeRow(GgmlType t, const uint8_t* src, int64_t nblocks, float* dst) {
  const int64_t bs = ggml_type_traits(t).size;
  for (int64_t b = 0; b < nblocks; ++b) {
    const uint8_t* p = src + b * bs;
    float* y = dst + b * 256;
    switch (t) {
      case GgmlType::IQ2_XXS: Iq2xxs(p, y); break;
      case GgmlType::IQ2_XS: Iq2xs(p, y); break;
      case GgmlType::IQ2_S: Iq2s(p, y); break;
      case GgmlType::IQ3_XXS: Iq3xxs(p, y); break;
      case GgmlType::IQ3_S: Iq3s(p, y); break;
      case GgmlType::IQ1_S: Iq1s(p, y); break;
      case GgmlType::IQ1_M: Iq1m(p, y); break;
      case GgmlType::TQ1_0: Tq1(p, y); break;
      case GgmlType::TQ2_0: Tq2(p, y); break;
      default: iquant_dequantize_block(t, p, y); break;  // (an error for other types)
    }
  }
}

}  // namespace iqk

void IquantDecodeRow(GgmlType t, const uint8_t* src, int64_t nblocks, float* dst) { iqk::DecodeRow(t, src, nblocks, dst); }

}  // namespace HWY_NAMESPACE
}  // namespace spool::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace spool::ops {

HWY_EXPORT(IquantDecodeRow);

void iquant_decode_row(GgmlType t, const uint8_t* src, int64_t nblocks, float* dst) {
  HWY_DYNAMIC_DISPATCH(IquantDecodeRow)(t, src, nblocks, dst);
}

}  // namespace spool::ops
#endif  // HWY_ONCE
