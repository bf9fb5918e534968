// ggml block formats: scalar reference dequantization (compiled once) and Highway kernels
// (compiled once per SIMD target by foreach_target, dispatched at runtime).
//
// Kernel design. Every quantized type is decoded, block by block, into "groups" of 16
// consecutive columns: a 128-bit vector of 16 int8 codes q plus one scale s and one offset m
// (w = s * q + m). A group is widened to f32 in chunks of N lanes (N = 4, 8 or 16) and turned
// into weights with one FMA (GroupWeight), with x loaded at the group's columns: no activation
// reordering. Decode (T = 1) runs 4 rows at a time (4 independent streams and FMA chains), the
// weights only in registers, multiplied straight into the accumulators (Sink). Prefill (T >= 2)
// of rows of more than 512 columns writes each row's weights once per token tile of 64 into an
// f32 panel (PanelSink; 1024 columns at a time, L1) and runs a 4-row x 2-token register tile
// over it (PanelTile: 6 loads per 8 FMAs); shorter rows run one row at a time against 8
// (AVX-512) or 4 tokens with the accumulators in registers for the whole row (QuantTile).
// On AVX-512 the 4-bit types (Q4_0, Q4_1, Q4_K, IQ4_NL, IQ4_XS, MXFP4) skip the widening: per
// sub-block scale a 16-entry f32 table of its weights is built with the scalar dequantizer's
// expression, and 16 codes become 16 weights with one vpermps (see kTables). Every output has
// 2 FMA chains (column vector c to chain c % 2, in column order) and one final reduction
// (ReduceChains), the same in every path and tile shape: prefill is bit-identical to one token
// at a time. Block scales are read as broadcast loads (InMemory); decode prefetches ~8 KiB
// ahead (the hardware prefetchers follow 4 interleaved rows poorly and stop at pages).
// The float types (F32 / F16 / BF16) use 16-row x TT-token tiles with N-lane weight loads and
// a scalar column tail. HWY_SCALAR falls back to the scalar reference (dequantize row, then dot).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/ggml_blocks.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/cache_control.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "ops/ggml_blocks.h"
#include "ops/ggml_iquants.h"
#include "ops/ggml_scales.h"
#include "ops/vec.h"
#include "ops/weights.h"

// ---- Target-independent part (compiled once) ----
#ifndef SPOOL_OPS_GGML_BLOCKS_SHARED
#define SPOOL_OPS_GGML_BLOCKS_SHARED
namespace spool::ops::ggml {

/// IEEE half bits -> float (exact: subnormals, inf, NaN); ops::f16_to_f32 (weights.h).
inline float half_to_float(uint16_t h) { return f16_to_f32(h); }

/// f16 stored at p (unaligned).
inline float load_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

/// E8M0 exponent -> half its value, 2^(e - 128), bit-exact as ggml_e8m0_to_fp32_half.
inline float e8m0_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// IQ4_NL / IQ4_XS non-linear codebook.
alignas(16) inline constexpr int8_t kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                  1,    13,   25,  38,  53,  69,  89,  113};
/// MXFP4 E2M1 values, doubled.
alignas(16) inline constexpr int8_t kMxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/// Q3_K 6-bit signed sub-block scales (16) from the 12 packed bytes b.
inline void q3k_scales(const uint8_t* b, int* s) {
  for (int i = 0; i < 16; ++i) {
    const int low4 = i < 8 ? (b[i] & 0xF) : (b[i - 8] >> 4);
    const int hi2 = (b[8 + (i % 4)] >> (2 * (i / 4))) & 3;
    s[i] = (low4 | (hi2 << 4)) - 32;
  }
}

/// Scalar dequantization of one block of type t at p into y[0, blck).
inline void dequant_block(GgmlType t, const uint8_t* p, float* y) {
  switch (t) {
    case GgmlType::Q4_0: {
      const float d = load_half(p);
      const uint8_t* qs = p + 2;
      for (int j = 0; j < 16; ++j) {
        y[j] = static_cast<float>((qs[j] & 0xF) - 8) * d;
        y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
      }
      return;
    }
    case GgmlType::Q4_1: {
      const float d = load_half(p), m = load_half(p + 2);
      const uint8_t* qs = p + 4;
      for (int j = 0; j < 16; ++j) {
        y[j] = static_cast<float>(qs[j] & 0xF) * d + m;
        y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
      }
      return;
    }
    case GgmlType::Q5_0: {
      const float d = load_half(p);
      uint32_t qh;
      std::memcpy(&qh, p + 2, 4);
      const uint8_t* qs = p + 6;
      for (int j = 0; j < 16; ++j) {
        const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
        y[j] = static_cast<float>(((qs[j] & 0xF) | h0) - 16) * d;
        y[j + 16] = static_cast<float>(((qs[j] >> 4) | h1) - 16) * d;
      }
      return;
    }
    case GgmlType::Q5_1: {
      const float d = load_half(p), m = load_half(p + 2);
      uint32_t qh;
      std::memcpy(&qh, p + 4, 4);
      const uint8_t* qs = p + 8;
      for (int j = 0; j < 16; ++j) {
        const int h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
        y[j] = static_cast<float>((qs[j] & 0xF) | h0) * d + m;
        y[j + 16] = static_cast<float>((qs[j] >> 4) | h1) * d + m;
      }
      return;
    }
    case GgmlType::Q8_0: {
      const float d = load_half(p);
      for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(p[2 + j])) * d;
      return;
    }
    case GgmlType::IQ4_NL: {
      const float d = load_half(p);
      const uint8_t* qs = p + 2;
      for (int j = 0; j < 16; ++j) {
        y[j] = d * static_cast<float>(kIq4nl[qs[j] & 0xF]);
        y[j + 16] = d * static_cast<float>(kIq4nl[qs[j] >> 4]);
      }
      return;
    }
    case GgmlType::MXFP4: {
      const float d = e8m0_half(p[0]);
      const uint8_t* qs = p + 1;
      for (int j = 0; j < 16; ++j) {
        y[j] = static_cast<float>(kMxfp4[qs[j] & 0xF]) * d;
        y[j + 16] = static_cast<float>(kMxfp4[qs[j] >> 4]) * d;
      }
      return;
    }
    case GgmlType::Q2_K: {
      const uint8_t* sc = p;
      const uint8_t* q = p + 16;
      const float d = load_half(p + 80), dmin = load_half(p + 82);
      int is = 0;
      for (int n = 0; n < 256; n += 128) {
        for (int j = 0; j < 4; ++j) {
          const int shift = 2 * j;
          for (int half = 0; half < 2; ++half) {
            const uint8_t s = sc[is++];
            const float dl = d * static_cast<float>(s & 0xF), ml = dmin * static_cast<float>(s >> 4);
            for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
          }
        }
        q += 32;
      }
      return;
    }
    case GgmlType::Q3_K: {
      const uint8_t* hm = p;
      const uint8_t* q = p + 32;
      int s[16];
      q3k_scales(p + 96, s);
      const float d = load_half(p + 108);
      int is = 0;
      uint8_t m = 1;
      for (int n = 0; n < 256; n += 128) {
        for (int j = 0; j < 4; ++j) {
          const int shift = 2 * j;
          for (int half = 0; half < 2; ++half) {
            const float dl = d * static_cast<float>(s[is++]);
            for (int l = 16 * half; l < 16 * half + 16; ++l)
              *y++ = dl * static_cast<float>(((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
          }
          m = static_cast<uint8_t>(m << 1);
        }
        q += 32;
      }
      return;
    }
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const bool five = t == GgmlType::Q5_K;
      const float d = load_half(p), dmin = load_half(p + 2);
      const uint8_t* scales = p + 4;
      const uint8_t* qh = p + 16;
      const uint8_t* q = five ? p + 48 : p + 16;
      int is = 0;
      for (int j = 0; j < 256; j += 64) {
        int sc, mn;
        scale_min_k4(is, scales, &sc, &mn);
        const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
        scale_min_k4(is + 1, scales, &sc, &mn);
        const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
        for (int l = 0; l < 32; ++l) {
          const int h = five && (qh[l] >> is) & 1 ? 16 : 0;
          *y++ = d1 * static_cast<float>((q[l] & 0xF) + h) - m1;
        }
        for (int l = 0; l < 32; ++l) {
          const int h = five && (qh[l] >> (is + 1)) & 1 ? 16 : 0;
          *y++ = d2 * static_cast<float>((q[l] >> 4) + h) - m2;
        }
        q += 32;
        is += 2;
      }
      return;
    }
    case GgmlType::Q6_K: {
      const uint8_t* ql = p;
      const uint8_t* qh = p + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
      const float d = load_half(p + 208);
      for (int n = 0; n < 256; n += 128) {
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
          const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
          const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
          y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
          y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
          y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
      }
      return;
    }
    case GgmlType::IQ4_XS: {
      const float d = load_half(p);
      uint16_t sh;
      std::memcpy(&sh, p + 2, 2);
      const uint8_t* sl = p + 4;
      const uint8_t* qs = p + 8;
      for (int ib = 0; ib < 8; ++ib) {
        const int ls = ((sl[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
        const float dl = d * static_cast<float>(ls - 32);
        for (int j = 0; j < 16; ++j) {
          y[j] = dl * static_cast<float>(kIq4nl[qs[j] & 0xF]);
          y[j + 16] = dl * static_cast<float>(kIq4nl[qs[j] >> 4]);
        }
        y += 32;
        qs += 16;
      }
      return;
    }
    case GgmlType::F32:
      std::memcpy(y, p, 4);
      return;
    case GgmlType::F16:
      *y = load_half(p);
      return;
    case GgmlType::BF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      const uint32_t u = static_cast<uint32_t>(h) << 16;
      std::memcpy(y, &u, 4);
      return;
    }
    default:
      if (iquant_type(t)) return iquant_dequantize_block(t, p, y);  // ops/ggml_iquants
      fail("ggml type %s (id %u) is not supported", ggml_type_name(t), static_cast<unsigned>(t));
  }
}

/// One HF MXFP4 block (gpt-oss layout, ops::Mxfp4View): 16 bytes, low nibble of byte j ->
/// element 2j, high nibble -> 2j + 1, times 2^(scale - 127) (kMxfp4 is doubled, e8m0_half halves).
inline void dequant_mx_block(const uint8_t* q, uint8_t scale, float* y) {
  const float d = e8m0_half(scale);
  for (int j = 0; j < 16; ++j) {
    y[2 * j] = static_cast<float>(kMxfp4[q[j] & 0xF]) * d;
    y[2 * j + 1] = static_cast<float>(kMxfp4[q[j] >> 4]) * d;
  }
}

}  // namespace spool::ops::ggml
#endif  // SPOOL_OPS_GGML_BLOCKS_SHARED

HWY_BEFORE_NAMESPACE();
namespace spool::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;
constexpr int64_t kN = static_cast<int64_t>(hn::MaxLanes(DF()));

// Everything but the exported entry points lives in gb:: (other kernel files of spool_ops
// define functions of the same names in HWY_NAMESPACE).
namespace gb {

// Reference path, and the path of the i-quant / ternary types: dequantize each row into a
// thread-local buffer (those types: the SIMD row decoders of ggml_iquant_kernels.cpp), then dot
// it with each token (ops::dot: the same accumulation order for any T).
void RowsByDequant(const GgmlView& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(w.cols));
  const int64_t rb = w.row_bytes();
  const GgmlTypeTraits tr = ggml_type_traits(w.type);
  const bool iq = iquant_type(w.type);  // (SIMD row decoders: ggml_iquant_kernels.cpp)
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* p = w.data + r * rb;
    if (iq) {
      iquant_decode_row(w.type, p, w.cols / tr.blck, row.data());
    } else {
      for (int64_t b = 0; b < w.cols / tr.blck; ++b) ggml::dequant_block(w.type, p + b * tr.size, row.data() + b * tr.blck);
    }
    for (int64_t t = 0; t < T; ++t) y[t * ldy + r] = ops::dot(row.data(), x + t * w.cols, w.cols);  // vec.h
  }
}

#if HWY_TARGET != HWY_SCALAR

using D8 = hn::Full128<int8_t>;
using DU8 = hn::Full128<uint8_t>;
using DU16 = hn::Full128<uint16_t>;
using V8 = hn::Vec<D8>;
using VU8 = hn::Vec<DU8>;
using DI = hn::RebindToSigned<DF>;

HWY_INLINE float Half(const uint8_t* p) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
#else
  return ggml::load_half(p);
#endif
}

HWY_INLINE VU8 Load16(const uint8_t* p) { return hn::LoadU(DU8(), p); }

// (v >> k) & mask per byte; mask must not have bits above 8 - k (shifts 16-bit lanes).
template <int k>
HWY_INLINE VU8 Shr(VU8 v, uint8_t mask) {
  const DU8 du8;
  if constexpr (k == 0) {
    return hn::And(v, hn::Set(du8, mask));
  } else {
    return hn::And(hn::BitCast(du8, hn::ShiftRight<k>(hn::BitCast(DU16(), v))), hn::Set(du8, mask));
  }
}
// (v << k) & mask per byte; mask must not have bits below k.
template <int k>
HWY_INLINE VU8 Shl(VU8 v, uint8_t mask) {
  const DU8 du8;
  if constexpr (k == 0) {
    return hn::And(v, hn::Set(du8, mask));
  } else {
    return hn::And(hn::BitCast(du8, hn::ShiftLeft<k>(hn::BitCast(DU16(), v))), hn::Set(du8, mask));
  }
}

HWY_INLINE V8 I8(VU8 v) { return hn::BitCast(D8(), v); }
HWY_INLINE V8 SubI8(VU8 v, int8_t c) { return hn::Sub(I8(v), hn::Set(D8(), c)); }

// Byte i of the result = (bit i of bits16) ? val : 0, for 16 bits.
HWY_INLINE VU8 BitsToBytes(uint32_t bits16, uint8_t val) {
  const DU8 du8;
  alignas(16) static constexpr uint8_t kIdx[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  alignas(16) static constexpr uint8_t kSel[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const VU8 b = hn::BitCast(du8, hn::Set(DU16(), static_cast<uint16_t>(bits16)));
  const VU8 spread = hn::TableLookupBytes(b, hn::Load(du8, kIdx));
  return hn::IfThenElseZero(hn::TestBit(spread, hn::Load(du8, kSel)), hn::Set(du8, val));
}

// Byte i = (bit `bit` of v[i]) ? val : 0.
HWY_INLINE VU8 BitOfBytes(VU8 v, uint8_t bit, uint8_t val) {
  const DU8 du8;
  return hn::IfThenElseZero(hn::TestBit(v, hn::Set(du8, bit)), hn::Set(du8, val));
}

// 16-entry int8 table lookup of 16 nibbles.
HWY_INLINE V8 Lut(V8 table, VU8 nib) { return hn::TableLookupBytes(table, I8(nib)); }

// Calls f(k, vf) for the 16 / N chunks of 16 int8 codes widened to f32 (chunk k = columns
// [k N, (k + 1) N) of the group). Q16 is D8; a template parameter so that only the branch of
// this target's N is instantiated.
template <class Q16, class F>
HWY_INLINE void ForChunks(hn::Vec<Q16> q, const F& f) {
  const DF df;
  const hn::Rebind<int32_t, DF> di;
  if constexpr (kN == 16) {
    f(0, hn::ConvertTo(df, hn::PromoteTo(di, q)));
  } else if constexpr (kN == 8) {
    const hn::Half<Q16> dh;
    f(0, hn::ConvertTo(df, hn::PromoteTo(di, hn::LowerHalf(dh, q))));
    f(1, hn::ConvertTo(df, hn::PromoteTo(di, hn::UpperHalf(dh, q))));
  } else {
    static_assert(kN == 4 && sizeof(Q16) > 0, "unexpected vector size");
    const hn::Half<Q16> dh;
    const hn::Half<hn::Half<Q16>> dq;
    const auto lo = hn::LowerHalf(dh, q), hi = hn::UpperHalf(dh, q);
    f(0, hn::ConvertTo(df, hn::PromoteTo(di, hn::LowerHalf(dq, lo))));
    f(1, hn::ConvertTo(df, hn::PromoteTo(di, hn::UpperHalf(dq, lo))));
    f(2, hn::ConvertTo(df, hn::PromoteTo(di, hn::LowerHalf(dq, hi))));
    f(3, hn::ConvertTo(df, hn::PromoteTo(di, hn::UpperHalf(dq, hi))));
  }
}

// Forces a kernel lambda inline: GCC otherwise outlines the per-group FMA lambda of the smaller
// tiles (a call per 16 columns, accumulators through memory; ~3% of a Q4_K_M prefill).
#if defined(__GNUC__) || defined(__clang__)
#define SPOOL_LAMBDA_INLINE __attribute__((always_inline))
#else
#define SPOOL_LAMBDA_INLINE
#endif

// The weights of a group's chunk of kN codes q (as floats): s * q + m (kMin) or s * q, the
// scalar dequantizer's expression (Sink and PanelSink both form weights with these).
template <bool kMin>
HWY_INLINE VF GroupWeight(VF q, VF vs, VF vm) {
  return kMin ? hn::MulAdd(q, vs, vm) : hn::Mul(q, vs);
}
// Calls f(off, w) for each chunk of kN weights w of a group of 16 codes q (scale s, offset m),
// off = the chunk's first column in the group.
template <bool kMin, class F>
HWY_INLINE void ForGroupWeights(V8 q, float s, float m, const F& f) {
  const DF df;
  const VF vs = hn::Set(df, s);
  const VF vm = hn::Set(df, m);
  ForChunks<D8>(q, [&](int k, VF v) SPOOL_LAMBDA_INLINE HWY_ATTR { f(k * kN, GroupWeight<kMin>(v, vs, vm)); });
}
// The kN weights of int8 codes read from memory at q, times the scale vs (Q8_0).
HWY_INLINE VF MemWeight(const int8_t* q, VF vs) {
  const DF df;
  const DI di;
  const hn::Rebind<int8_t, DI> d8n;
  return hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8n, q))), vs);
}

// Accumulators of one row against TT tokens; x points at the block's first column of token 0.
// K accumulators per token (a power of two): the chunk of kN columns at column c goes to
// accumulator (c / kN) % K of its token (acc[t * stride + that]), so that a token's FMAs form K
// independent chains.
template <int TT, int K = 1>
struct Sink {
  VF* acc;  // token t's accumulators at acc + t * stride
  int64_t stride;
  const float* x;
  int64_t ldx;

  HWY_INLINE VF& A(int t, int64_t col) const { return acc[t * stride + (col / kN) % K]; }

  // Group of 16 columns at `col` (relative to the block): w = s * q + m.
  template <bool kMin>
  HWY_INLINE void Group(int col, V8 q, float s, float m) const {
    ForGroupWeights<kMin>(q, s, m, [&](int off, VF wv) SPOOL_LAMBDA_INLINE HWY_ATTR {
      const int64_t c = col + off;
      for (int t = 0; t < TT; ++t) A(t, c) = hn::MulAdd(wv, hn::LoadU(DF(), x + c + t * ldx), A(t, c));
    });
  }
  // 16 f32 weights at `col` (kN == 16: one vector): their TT FMAs.
  HWY_INLINE void Vec(int col, VF wv) const {
    const DF df;
    for (int t = 0; t < TT; ++t) A(t, col) = hn::MulAdd(wv, hn::LoadU(df, x + col + t * ldx), A(t, col));
  }
  // 16 int8 codes read straight from memory (Q8_0): chunk loads widen from memory.
  HWY_INLINE void GroupMem(int col, const int8_t* q, float s) const {
    const DF df;
    const VF vs = hn::Set(df, s);
    for (int k = 0; k < 16 / kN; ++k) {
      const VF wv = MemWeight(q + k * kN, vs);
      const int64_t c = col + k * kN;
      for (int t = 0; t < TT; ++t) A(t, c) = hn::MulAdd(wv, hn::LoadU(df, x + c + t * ldx), A(t, c));
    }
  }
};

// p, opaque to the optimizer once the kCount floats it points at are in memory: reads through the
// result compile to broadcast loads. (Otherwise GCC keeps such a scale array in a register and
// broadcasts each element with a permute by an index vector built for it, 3-4 uops a scale:
// a good part of the Q4_K / Q6_K decode time.)
template <int kCount = 16>
HWY_INLINE const float* InMemory(const float* p) {
#if defined(__GNUC__) || defined(__clang__)
  asm("" : "+r"(p) : "m"(*reinterpret_cast<const float(*)[kCount]>(p)));
#endif
  return p;
}

// out[i] = (float(in[i]) + bias) * (i < 8 ? a : b) for 16 int8 values (block scales decoded
// with vector ops and kept in memory, so that the per-group broadcasts are loads); returns out
// through InMemory.
HWY_INLINE const float* Scales16(const int8_t* in, float bias, float a, float b, float* HWY_RESTRICT out) {
  const DF df;
  const DI di;
  const hn::Rebind<int8_t, DI> d8n;
  const VF vb = hn::Set(df, bias);
  for (int k = 0; k < 16; k += static_cast<int>(kN)) {
    VF mul;
    if constexpr (kN == 16) {
      mul = hn::IfThenElse(hn::FirstN(df, 8), hn::Set(df, a), hn::Set(df, b));
    } else {
      mul = hn::Set(df, k < 8 ? a : b);
    }
    const VF v = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8n, in + k)));
    hn::StoreU(hn::Mul(bias == 0.0f ? v : hn::Add(v, vb), mul), df, out + k);
  }
  return InMemory(out);
}

// Q3_K: the 16 6-bit scales of the 12 packed bytes, minus 32 not yet applied.
HWY_INLINE void UnpackQ3Scales(const uint8_t* b, uint8_t* out16) {
  constexpr uint32_t kM1 = 0x03030303, kM2 = 0x0f0f0f0f;
  uint32_t a[4];
  std::memcpy(a, b, 12);
  const uint32_t tmp = a[2];
  a[2] = ((a[0] >> 4) & kM2) | (((tmp >> 4) & kM1) << 4);
  a[3] = ((a[1] >> 4) & kM2) | (((tmp >> 6) & kM1) << 4);
  a[0] = (a[0] & kM2) | (((tmp >> 0) & kM1) << 4);
  a[1] = (a[1] & kM2) | (((tmp >> 2) & kM1) << 4);
  std::memcpy(out16, a, 16);
}

// ---- 16-entry f32 tables (AVX-512) ----
// On 16-lane x86 targets the 4-bit types decode by table: per scale (sub-block), the 16
// possible weights w(q) are computed once with the scalar dequantizer's own expression (so a
// weight has the bits ggml_dequantize_row gives it), and each 16 codes become weights with one
// vpermps (it reads only the low 4 bits of each 32-bit index: a zero-extended byte indexes by
// its low nibble as is, its high nibble after one shift). Per 16 weights: half a widening load,
// half a shift, a permute and the FMAs, instead of widen + convert + scale FMA + FMAs.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && HWY_MAX_BYTES == 64
constexpr bool kTables = kN == 16;
#else
constexpr bool kTables = false;
#endif

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3 && HWY_MAX_BYTES == 64
// Lane k = table[idx[k] & 15] (vpermps).
HWY_INLINE VF Perm16(VF table, __m512i idx) { return VF{_mm512_permutexvar_ps(idx, table.raw)}; }
// Lanes k = the 16 bytes at p zero-extended to 32 bits (vpmovzxbd).
HWY_INLINE __m512i Bytes16(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// The 32 codes of the 16 bytes at p: low nibbles -> columns [lo, lo + 16) by table tl, high
// nibbles -> [hi, hi + 16) by table th.
template <class S>
HWY_INLINE void NibblesByTable(const S& s, const uint8_t* p, int lo, VF tl, int hi, VF th) {
  const __m512i v = Bytes16(p);
  s.Vec(lo, Perm16(tl, v));
  s.Vec(hi, Perm16(th, _mm512_srli_epi32(v, 4)));
}
#endif
// The table c[q] * d (q = 0..15; c: 16 floats), as the scalar `float(c) * d`.
HWY_INLINE VF ScaledTable(const float* c, float d) { return hn::Mul(hn::LoadU(DF(), c), hn::Set(DF(), d)); }
// The table d * q + m (q = 0..15): one FMA, the same bits as the scalar `d * float(q) + m`
// (its product, an f16 scale times small integers, is exact).
HWY_INLINE VF AffineTable(float d, float m) {
  const DF df;
  return hn::MulAdd(hn::Iota(df, 0.0f), hn::Set(df, d), hn::Set(df, m));
}

// A 16-entry code table as floats (the tables path multiplies it by a block's scale).
struct FloatTable16 {
  alignas(64) float v[16];
};
constexpr FloatTable16 AsFloats(const int8_t (&codes)[16]) {
  FloatTable16 t{};
  for (int i = 0; i < 16; ++i) t.v[i] = codes[i];
  return t;
}
constexpr FloatTable16 kIq4nlF = AsFloats(ggml::kIq4nl), kMxfp4F = AsFloats(ggml::kMxfp4);
alignas(64) constexpr float kQ4_0F[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};

// IQ4_XS sub-block ib's 6-bit scale ls (its low 4 bits in scales_l at p + 4, the high 2 in
// scales_h = sh); the block's weights are d * (ls - 32) * kIq4nl[code].
HWY_INLINE int Iq4xsScale(const uint8_t* p, uint16_t sh, int ib) {
  return ((p[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
}

// Types whose block scales QuantTile decodes ahead, for all rows of a tile at once (BlockScales),
// before their DecodeBlock calls: the scale array of a block is stored and then read back as
// broadcasts, and that store-to-load latency, per row on the path from a block's bytes to its
// FMAs, limited the decode (Q4_K, Q6_K, IQ4_XS).
template <GgmlType Q>
constexpr bool kScalesAhead = ((Q == GgmlType::Q4_K || Q == GgmlType::IQ4_XS) && kTables) || Q == GgmlType::Q6_K;

// The block scales DecodeBlock<Q> reads (kScalesAhead types; at most 16 floats): Q4_K d * sc_j
// (j < 8) and -(dmin * mn_j) (8 + j); Q6_K d * sc_j (16); IQ4_XS d * (ls_j - 32) (8).
template <GgmlType Q>
HWY_INLINE void BlockScales(const uint8_t* HWY_RESTRICT p, float* HWY_RESTRICT out) {
  if constexpr (Q == GgmlType::Q4_K) {
    alignas(16) uint8_t raw[16];
    ggml::unpack_k4_scales(p + 4, raw);
    Scales16(reinterpret_cast<const int8_t*>(raw), 0.0f, Half(p), -Half(p + 2), out);
  } else if constexpr (Q == GgmlType::IQ4_XS) {
    const float d = Half(p);
    uint16_t sh;
    std::memcpy(&sh, p + 2, 2);
    for (int ib = 0; ib < 8; ++ib) out[ib] = d * static_cast<float>(Iq4xsScale(p, sh, ib) - 32);
  } else {
    static_assert(Q == GgmlType::Q6_K, "no scales ahead for this type");
    Scales16(reinterpret_cast<const int8_t*>(p + 192), 0.0f, Half(p + 208), Half(p + 208), out);
  }
}

// Decodes one block of type Q at p into groups of 16 columns; `sv`: the block's BlockScales
// (kScalesAhead types only).
template <GgmlType Q, class S>
HWY_INLINE void DecodeBlock(const uint8_t* HWY_RESTRICT p, const S& s, const float* sv = nullptr) {
  if constexpr (Q == GgmlType::Q8_0) {
    const float d = Half(p);
    s.GroupMem(0, reinterpret_cast<const int8_t*>(p + 2), d);
    s.GroupMem(16, reinterpret_cast<const int8_t*>(p + 18), d);
  } else if constexpr (Q == GgmlType::Q4_0) {
    if constexpr (kTables) {
      const VF t = ScaledTable(kQ4_0F, Half(p));  // float(q - 8) * d
      NibblesByTable(s, p + 2, 0, t, 16, t);
    } else {
      const float d = Half(p);
      const VU8 v = Load16(p + 2);
      s.template Group<false>(0, SubI8(Shr<0>(v, 0x0F), 8), d, 0.0f);
      s.template Group<false>(16, SubI8(Shr<4>(v, 0x0F), 8), d, 0.0f);
    }
  } else if constexpr (Q == GgmlType::Q4_1) {
    if constexpr (kTables) {
      const VF t = AffineTable(Half(p), Half(p + 2));  // float(q) * d + m
      NibblesByTable(s, p + 4, 0, t, 16, t);
    } else {
      const float d = Half(p), m = Half(p + 2);
      const VU8 v = Load16(p + 4);
      s.template Group<true>(0, I8(Shr<0>(v, 0x0F)), d, m);
      s.template Group<true>(16, I8(Shr<4>(v, 0x0F)), d, m);
    }
  } else if constexpr (Q == GgmlType::Q5_0 || Q == GgmlType::Q5_1) {
    constexpr bool k1 = Q == GgmlType::Q5_1;
    const float d = Half(p), m = k1 ? Half(p + 2) : 0.0f;
    const uint8_t* b = p + (k1 ? 4 : 2);
    uint32_t qh;
    std::memcpy(&qh, b, 4);
    const VU8 v = Load16(b + 4);
    const VU8 lo = hn::Or(Shr<0>(v, 0x0F), BitsToBytes(qh & 0xFFFF, 0x10));
    const VU8 hi = hn::Or(Shr<4>(v, 0x0F), BitsToBytes(qh >> 16, 0x10));
    if constexpr (k1) {
      s.template Group<true>(0, I8(lo), d, m);
      s.template Group<true>(16, I8(hi), d, m);
    } else {
      s.template Group<false>(0, SubI8(lo, 16), d, 0.0f);
      s.template Group<false>(16, SubI8(hi, 16), d, 0.0f);
    }
  } else if constexpr (Q == GgmlType::IQ4_NL || Q == GgmlType::MXFP4) {
    constexpr bool mx = Q == GgmlType::MXFP4;
    const float d = mx ? ggml::e8m0_half(p[0]) : Half(p);
    const uint8_t* q = p + (mx ? 1 : 2);
    if constexpr (kTables) {
      const VF t = ScaledTable(mx ? kMxfp4F.v : kIq4nlF.v, d);
      NibblesByTable(s, q, 0, t, 16, t);
    } else {
      const V8 table = hn::Load(D8(), mx ? ggml::kMxfp4 : ggml::kIq4nl);
      const VU8 v = Load16(q);
      s.template Group<false>(0, Lut(table, Shr<0>(v, 0x0F)), d, 0.0f);
      s.template Group<false>(16, Lut(table, Shr<4>(v, 0x0F)), d, 0.0f);
    }
  } else if constexpr (Q == GgmlType::IQ4_XS) {
    if constexpr (kTables) {
      for (int ib = 0; ib < 8; ++ib) {  // sv[ib] = d * (ls - 32) (BlockScales)
        const VF t = ScaledTable(kIq4nlF.v, sv[ib]);  // dl * float(code)
        NibblesByTable(s, p + 8 + 16 * ib, 32 * ib, t, 32 * ib + 16, t);
      }
    } else {
      const float d = Half(p);
      uint16_t sh;
      std::memcpy(&sh, p + 2, 2);
      const V8 table = hn::Load(D8(), ggml::kIq4nl);
      for (int ib = 0; ib < 8; ++ib) {
        const float dl = d * static_cast<float>(Iq4xsScale(p, sh, ib) - 32);
        const VU8 v = Load16(p + 8 + 16 * ib);
        s.template Group<false>(32 * ib, Lut(table, Shr<0>(v, 0x0F)), dl, 0.0f);
        s.template Group<false>(32 * ib + 16, Lut(table, Shr<4>(v, 0x0F)), dl, 0.0f);
      }
    }
  } else if constexpr (Q == GgmlType::Q2_K) {
    const float d = Half(p + 80), dmin = Half(p + 82);
    alignas(16) uint8_t lo[16], hi[16];
    const VU8 scv = Load16(p);
    hn::Store(Shr<0>(scv, 0x0F), DU8(), lo);
    hn::Store(Shr<4>(scv, 0x0F), DU8(), hi);
    alignas(64) float svb[16], mvb[16];
    const float* scl = Scales16(reinterpret_cast<const int8_t*>(lo), 0.0f, d, d, svb);
    const float* mv = Scales16(reinterpret_cast<const int8_t*>(hi), 0.0f, -dmin, -dmin, mvb);
    for (int h = 0; h < 2; ++h) {
      const VU8 a = Load16(p + 16 + 32 * h), b = Load16(p + 32 + 32 * h);
      auto sub = [&](auto jc) SPOOL_LAMBDA_INLINE HWY_ATTR {
        constexpr int j = decltype(jc)::value;
        const int i = 8 * h + 2 * j;
        s.template Group<true>(128 * h + 32 * j, I8(Shr<2 * j>(a, 3)), scl[i], mv[i]);
        s.template Group<true>(128 * h + 32 * j + 16, I8(Shr<2 * j>(b, 3)), scl[i + 1], mv[i + 1]);
      };
      sub(std::integral_constant<int, 0>());
      sub(std::integral_constant<int, 1>());
      sub(std::integral_constant<int, 2>());
      sub(std::integral_constant<int, 3>());
    }
  } else if constexpr (Q == GgmlType::Q3_K) {
    const float d = Half(p + 108);
    alignas(16) uint8_t raw[16];
    UnpackQ3Scales(p + 96, raw);
    alignas(64) float scb[16];
    const float* sc = Scales16(reinterpret_cast<const int8_t*>(raw), -32.0f, d, d, scb);
    const VU8 ha = Load16(p), hb = Load16(p + 16);
    for (int h = 0; h < 2; ++h) {
      const VU8 a = Load16(p + 32 + 32 * h), b = Load16(p + 48 + 32 * h);
      auto sub = [&](auto jc) SPOOL_LAMBDA_INLINE HWY_ATTR {
        constexpr int j = decltype(jc)::value;
        const int i = 8 * h + 2 * j;
        const uint8_t bit = static_cast<uint8_t>(1u << (4 * h + j));
        // q = low2 - 4 + (hbit ? 4 : 0)
        const V8 qa = SubI8(hn::Or(Shr<2 * j>(a, 3), BitOfBytes(ha, bit, 4)), 4);
        const V8 qb = SubI8(hn::Or(Shr<2 * j>(b, 3), BitOfBytes(hb, bit, 4)), 4);
        s.template Group<false>(128 * h + 32 * j, qa, sc[i], 0.0f);
        s.template Group<false>(128 * h + 32 * j + 16, qb, sc[i + 1], 0.0f);
      };
      sub(std::integral_constant<int, 0>());
      sub(std::integral_constant<int, 1>());
      sub(std::integral_constant<int, 2>());
      sub(std::integral_constant<int, 3>());
    }
  } else if constexpr (Q == GgmlType::Q4_K && kTables) {
    const uint8_t* q = p + 16;  // sv: d * sc_j (j < 8), -(dmin * mn_j) (8 + j)
    for (int c = 0; c < 4; ++c) {
      // d1 * float(q) - m1 of the scalar dequantizer (adding -m1 is the same subtraction)
      const VF t0 = AffineTable(sv[2 * c], sv[8 + 2 * c]), t1 = AffineTable(sv[2 * c + 1], sv[9 + 2 * c]);
      NibblesByTable(s, q + 32 * c, 64 * c, t0, 64 * c + 32, t1);
      NibblesByTable(s, q + 32 * c + 16, 64 * c + 16, t0, 64 * c + 48, t1);
    }
  } else if constexpr (Q == GgmlType::Q4_K || Q == GgmlType::Q5_K) {
    constexpr bool five = Q == GgmlType::Q5_K;
    const float d = Half(p), dmin = Half(p + 2);
    const uint8_t* scales = p + 4;
    const uint8_t* q = p + (five ? 48 : 16);
    VU8 ha, hb;
    if constexpr (five) {
      ha = Load16(p + 16);
      hb = Load16(p + 32);
    }
    alignas(16) uint8_t raw[16];
    ggml::unpack_k4_scales(scales, raw);
    alignas(64) float svb[16];  // d * sc_j (j < 8), -dmin * mn_j (8 + j)
    const float* scl = Scales16(reinterpret_cast<const int8_t*>(raw), 0.0f, d, -dmin, svb);
    for (int c = 0; c < 4; ++c) {
      const float s0 = scl[2 * c], m0 = scl[8 + 2 * c], s1 = scl[2 * c + 1], m1 = scl[9 + 2 * c];
      const VU8 a = Load16(q + 32 * c), b = Load16(q + 32 * c + 16);
      VU8 a0 = Shr<0>(a, 0x0F), b0 = Shr<0>(b, 0x0F), a1 = Shr<4>(a, 0x0F), b1 = Shr<4>(b, 0x0F);
      if constexpr (five) {
        const uint8_t bit0 = static_cast<uint8_t>(1u << (2 * c)), bit1 = static_cast<uint8_t>(2u << (2 * c));
        a0 = hn::Or(a0, BitOfBytes(ha, bit0, 16));
        b0 = hn::Or(b0, BitOfBytes(hb, bit0, 16));
        a1 = hn::Or(a1, BitOfBytes(ha, bit1, 16));
        b1 = hn::Or(b1, BitOfBytes(hb, bit1, 16));
      }
      s.template Group<true>(64 * c, I8(a0), s0, m0);
      s.template Group<true>(64 * c + 16, I8(b0), s0, m0);
      s.template Group<true>(64 * c + 32, I8(a1), s1, m1);
      s.template Group<true>(64 * c + 48, I8(b1), s1, m1);
    }
  } else if constexpr (Q == GgmlType::Q6_K) {
    for (int h = 0; h < 2; ++h) {  // sv: d * sc_j
      const uint8_t* ql = p + 64 * h;
      const uint8_t* qh = p + 128 + 32 * h;
      const VU8 l0 = Load16(ql), l1 = Load16(ql + 16), l2 = Load16(ql + 32), l3 = Load16(ql + 48);
      const VU8 h0 = Load16(qh), h1 = Load16(qh + 16);
      const float* s8 = sv + 8 * h;
      // t = 0: low nibbles of ql[0..32), qh bits 0-1
      s.template Group<false>(128 * h + 0, SubI8(hn::Or(Shr<0>(l0, 0x0F), Shl<4>(h0, 0x30)), 32), s8[0], 0.0f);
      s.template Group<false>(128 * h + 16, SubI8(hn::Or(Shr<0>(l1, 0x0F), Shl<4>(h1, 0x30)), 32), s8[1], 0.0f);
      // t = 1: low nibbles of ql[32..64), qh bits 2-3
      s.template Group<false>(128 * h + 32, SubI8(hn::Or(Shr<0>(l2, 0x0F), Shl<2>(h0, 0x30)), 32), s8[2], 0.0f);
      s.template Group<false>(128 * h + 48, SubI8(hn::Or(Shr<0>(l3, 0x0F), Shl<2>(h1, 0x30)), 32), s8[3], 0.0f);
      // t = 2: high nibbles of ql[0..32), qh bits 4-5
      s.template Group<false>(128 * h + 64, SubI8(hn::Or(Shr<4>(l0, 0x0F), Shr<0>(h0, 0x30)), 32), s8[4], 0.0f);
      s.template Group<false>(128 * h + 80, SubI8(hn::Or(Shr<4>(l1, 0x0F), Shr<0>(h1, 0x30)), 32), s8[5], 0.0f);
      // t = 3: high nibbles of ql[32..64), qh bits 6-7
      s.template Group<false>(128 * h + 96, SubI8(hn::Or(Shr<4>(l2, 0x0F), Shr<2>(h0, 0x30)), 32), s8[6], 0.0f);
      s.template Group<false>(128 * h + 112, SubI8(hn::Or(Shr<4>(l3, 0x0F), Shr<2>(h1, 0x30)), 32), s8[7], 0.0f);
    }
  }
}

constexpr int64_t BlockCols(GgmlType Q) { return ggml_type_traits(Q).blck; }
constexpr int64_t BlockBytes(GgmlType Q) { return ggml_type_traits(Q).size; }

// Accumulators per (row, token) of QuantTile: two FMA chains per token (one would make a
// decode row's 16 FMAs per Q4_K block a single latency-bound chain). The same in every tile
// shape, so that outputs do not depend on the tiling.
constexpr int kAccs = 2;

// An output from its kAccs chains a[0 .. kAccs): their sum, then across lanes (QuantTile and
// PanelRows alike: the same rounding in every path).
HWY_INLINE float ReduceChains(const VF* a) {
  VF sum = a[0];
  for (int k = 1; k < kAccs; ++k) sum = hn::Add(sum, a[k]);
  return hn::GetLane(hn::SumOfLanes(DF(), sum));
}

// out[t * ldo + r] = dot(row r, x_t) for R rows and TT tokens over `nb` blocks. `pf` (may be
// null): R contiguous rows read later, prefetched at the pace of this tile's reads (R blocks'
// bytes per block step).
template <GgmlType Q, int R, int TT>
HWY_INLINE void QuantTile(const uint8_t* const* rows, int64_t nb, const float* x, int64_t ldx, float* out,
                          int64_t ldo, const uint8_t* pf = nullptr) {
  const DF df;
  constexpr int K = kAccs;
  VF acc[R * TT * K];  // row r, token t, chain k at (r * TT + t) * K + k
  for (int i = 0; i < R * TT * K; ++i) acc[i] = hn::Zero(df);
  constexpr int64_t kB = BlockCols(Q), kS = BlockBytes(Q);
  for (int64_t b = 0; b < nb; ++b) {
    if (pf != nullptr)
      for (int64_t k = 0; k < R * kS; k += 64) hwy::Prefetch(pf + b * R * kS + k);
    // [R][16] block scales of the rows (the array lives for the whole block step: DecodeBlock reads it)
    alignas(64) float svb[kScalesAhead<Q> ? R * 16 : 1];
    const float* sv = nullptr;
    if constexpr (kScalesAhead<Q>) {
      for (int r = 0; r < R; ++r) BlockScales<Q>(rows[r] + b * kS, svb + 16 * r);
      sv = InMemory<R * 16>(svb);
    }
    for (int r = 0; r < R; ++r) {
      // The row's accumulators copied into a local array for the block: through acc the
      // compiler kept them in memory, a store and a reload around every FMA (a vector type may
      // alias x), so that each row's FMA chain ran at store-forwarding latency.
      VF a[TT * K];
      for (int i = 0; i < TT * K; ++i) a[i] = acc[r * TT * K + i];
      const Sink<TT, K> s{a, K, x + b * kB, ldx};
      DecodeBlock<Q>(rows[r] + b * kS, s, kScalesAhead<Q> ? sv + 16 * r : nullptr);
      for (int i = 0; i < TT * K; ++i) acc[r * TT * K + i] = a[i];
    }
  }
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) out[t * ldo + r] = ReduceChains(acc + (r * TT + t) * K);
}

// Float weights: W element type F (F32 / F16 / BF16) in chunks of N, scalar tail.
template <GgmlType Q>
HWY_INLINE VF LoadW(const uint8_t* p) {
  const DF df;
  if constexpr (Q == GgmlType::F32) {
    return hn::LoadU(df, reinterpret_cast<const float*>(p));
  } else if constexpr (Q == GgmlType::F16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
  } else {
    const hn::Rebind<hwy::bfloat16_t, DF> db;
    return hn::PromoteTo(df, hn::LoadU(db, reinterpret_cast<const hwy::bfloat16_t*>(p)));
  }
}

template <GgmlType Q, int R, int TT>
HWY_INLINE void FloatTile(const uint8_t* const* rows, int64_t cols, const float* x, int64_t ldx, float* out,
                          int64_t ldo) {
  const DF df;
  constexpr int64_t es = BlockBytes(Q);
  VF acc[TT * R];
  for (int i = 0; i < TT * R; ++i) acc[i] = hn::Zero(df);
  // Chunks of 256 columns, row by row inside a chunk: one row's TT accumulators stay in
  // registers over the chunk (an FMA per column vector with the accumulators of all R rows live
  // would keep them in memory), while the chunk's x (TT x 1 KiB) is reused from L1 by every row.
  constexpr int64_t kChunk = 256;
  const int64_t vec_end = cols / kN * kN;
  int64_t c = 0;
  for (int64_t c0 = 0; c0 < vec_end; c0 += kChunk) {
    const int64_t c1 = std::min(vec_end, c0 + kChunk);
    for (int r = 0; r < R; ++r) {
      VF a[TT];
      for (int t = 0; t < TT; ++t) a[t] = acc[t * R + r];
      for (c = c0; c < c1; c += kN) {
        const VF wv = LoadW<Q>(rows[r] + c * es);
        for (int t = 0; t < TT; ++t) a[t] = hn::MulAdd(wv, hn::LoadU(df, x + t * ldx + c), a[t]);
      }
      for (int t = 0; t < TT; ++t) acc[t * R + r] = a[t];
    }
  }
  c = vec_end;
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) {
      float sum = hn::GetLane(hn::SumOfLanes(df, acc[t * R + r]));
      for (int64_t k = c; k < cols; ++k) {
        float wk;
        ggml::dequant_block(Q, rows[r] + k * es, &wk);
        sum = std::fma(wk, x[t * ldx + k], sum);  // explicit: the same rounding in every tile shape
      }
      out[t * ldo + r] = sum;
    }
}

template <GgmlType Q, int R, int TT>
HWY_INLINE void Tile(const GgmlView& w, const uint8_t* const* rows, const float* x, float* out, int64_t ldo,
                     const uint8_t* pf = nullptr) {
  if constexpr (BlockCols(Q) == 1) {
    (void)pf;
    FloatTile<Q, R, TT>(rows, w.cols, x, w.cols, out, ldo);
  } else {
    QuantTile<Q, R, TT>(rows, w.cols / BlockCols(Q), x, w.cols, out, ldo, pf);
  }
}

constexpr int kGemmTokens = kN == 16 ? 8 : 4;  // tokens per prefill tile (Mxfp4Rows)
constexpr int64_t kTokenTile = 64;             // tokens whose x stays in L2 while rows stream

// Prefill tiles of TypedRows other than the panel's (float rows of more than kShortRow columns;
// rows of at most kShortRow columns of every type): kPR rows x kPT tokens, chunk by chunk (for
// each, every row's kPT accumulators; the compiler keeps those of one row in registers, the
// tile's in L1), each weight vector serving kPT FMAs and each slice of x reused from L1 by the
// other kPR - 1 rows. Rows of at most kShortRow columns run one at a time: kPT tokens of x then
// fit in L1 whole and the accumulators stay in registers for the whole row (quant_bench: faster
// there than the panel, whose per-tile accumulator loads and stores a short row does not repay).
constexpr int kPR = 16;
constexpr int kPT = kN == 16 ? 8 : 4;
constexpr int64_t kShortRow = 512;
constexpr int64_t kPrefetchBytes = 8192;  // decode prefetch distance (TypedRows)
constexpr int64_t kRowAhead = 4;          // one-row prefill tiles prefetch the row this far ahead

// Tokens [t, t1) of R rows (pointers `rows`, first row r): tiles of kPT tokens, then the rest
// in tiles of 4, 2 and 1 (at most one of each; kPT <= 8).
template <GgmlType Q, int R>
HWY_INLINE void TokenRun(const GgmlView& w, const uint8_t* const* rows, const float* x, int64_t t, int64_t t1, float* y,
                         int64_t ldy, int64_t r, const uint8_t* pf = nullptr) {
  static_assert(kPT <= 8, "the remainder covers at most 7 tokens");
  // The first tile reads the rows from memory (the later ones from cache): it prefetches `pf`.
  for (; t + kPT <= t1; t += kPT, pf = nullptr) Tile<Q, R, kPT>(w, rows, x + t * w.cols, y + t * ldy + r, ldy, pf);
  if constexpr (kPT > 4) {
    if (t + 4 <= t1) {
      Tile<Q, R, 4>(w, rows, x + t * w.cols, y + t * ldy + r, ldy, pf);
      t += 4;
      pf = nullptr;
    }
  }
  if (t + 2 <= t1) {
    Tile<Q, R, 2>(w, rows, x + t * w.cols, y + t * ldy + r, ldy, pf);
    t += 2;
    pf = nullptr;
  }
  if (t < t1) Tile<Q, R, 1>(w, rows, x + t * w.cols, y + t * ldy + r, ldy, pf);
}

// Prefill through an f32 panel (quantized types, T > 1). Each row's weights are decoded once
// per token tile into f32 (the same vectors QuantTile's Sink multiplies, bit for bit), kPanelSeg
// columns at a time, then a register tile of kPanelRows rows x kPanelTok tokens runs over the
// panel: per column vector kPanelRows weight loads and kPanelTok input loads feed
// kPanelRows * kPanelTok FMAs, against one input load per FMA (plus the decode) in QuantTile's
// one-row tiles, which held the prefill GEMM to about half of the FMA peak. Each output keeps
// QuantTile's kAccs chains (column vector c to chain c % kAccs, in column order) and its final
// reduction, so prefill stays bit-identical to one token at a time.
constexpr int kPanelRows = 4;
constexpr int kPanelTok = 2;  // PanelRows' token remainder is one token
static_assert(kPanelTok == 2, "PanelRows runs the tokens left after pairs as one");
constexpr int64_t kPanelSeg = 1024;  // columns decoded per panel pass (4 rows x 4 KiB: L1)

// Writes a block's decoded weight vectors to panel memory (w: the block's first column).
struct PanelSink {
  float* w;

  template <bool kMin>
  HWY_INLINE void Group(int col, V8 q, float s, float m) const {
    ForGroupWeights<kMin>(q, s, m, [&](int off, VF wv) SPOOL_LAMBDA_INLINE HWY_ATTR { hn::Store(wv, DF(), w + col + off); });
  }
  HWY_INLINE void Vec(int col, VF wv) const { hn::Store(wv, DF(), w + col); }
  HWY_INLINE void GroupMem(int col, const int8_t* q, float s) const {
    const DF df;
    const VF vs = hn::Set(df, s);
    for (int k = 0; k < 16 / kN; ++k) hn::Store(MemWeight(q + k * kN, vs), df, w + col + k * kN);
  }
};

// Decodes blocks [b0, b1) of R rows into panel rows of stride kPanelSeg.
template <GgmlType Q, int R>
HWY_INLINE void DecodePanel(const uint8_t* const* rows, int64_t b0, int64_t b1, float* panel) {
  constexpr int64_t kB = BlockCols(Q), kS = BlockBytes(Q);
  for (int r = 0; r < R; ++r)
    for (int64_t b = b0; b < b1; ++b) {
      const PanelSink s{panel + r * kPanelSeg + (b - b0) * kB};
      if constexpr (kScalesAhead<Q>) {
        alignas(64) float svb[16];
        BlockScales<Q>(rows[r] + b * kS, svb);
        DecodeBlock<Q>(rows[r] + b * kS, s, InMemory<16>(svb));
      } else {
        DecodeBlock<Q>(rows[r] + b * kS, s);
      }
    }
}

// acc[(t * R + r) * kAccs + k] += panel row r . x_t over n columns (n a multiple of kAccs * kN),
// column vector j to chain j % kAccs.
template <int R, int TT>
HWY_INLINE void PanelTile(const float* HWY_RESTRICT panel, int64_t n, const float* HWY_RESTRICT x, int64_t ldx,
                          VF* HWY_RESTRICT acc) {
  static_assert(kAccs == 2, "the loop below alternates two chains");
  const DF df;
  VF a[R * TT * 2];
  for (int i = 0; i < R * TT * 2; ++i) a[i] = acc[i];
  for (int64_t c = 0; c < n; c += 2 * kN) {
    for (int k = 0; k < 2; ++k) {
      VF wv[R];
      for (int r = 0; r < R; ++r) wv[r] = hn::Load(df, panel + r * kPanelSeg + c + k * kN);
      for (int t = 0; t < TT; ++t) {
        const VF xv = hn::LoadU(df, x + t * ldx + c + k * kN);
        for (int r = 0; r < R; ++r) a[(t * R + r) * 2 + k] = hn::MulAdd(wv[r], xv, a[(t * R + r) * 2 + k]);
      }
    }
  }
  for (int i = 0; i < R * TT * 2; ++i) acc[i] = a[i];
}

// Rows [r, r + R) against tokens [t0, t1) (t1 - t0 <= kTokenTile) through the panel.
template <GgmlType Q, int R>
HWY_INLINE void PanelRows(const GgmlView& w, int64_t r, int64_t t0, int64_t t1, const float* x, float* y, int64_t ldy,
                          float* panel, VF* acc) {
  const DF df;
  constexpr int64_t kB = BlockCols(Q);
  const int64_t rb = w.row_bytes(), nb = w.cols / kB, seg_blocks = std::max<int64_t>(1, kPanelSeg / kB);
  const uint8_t* rows[R];
  for (int i = 0; i < R; ++i) rows[i] = w.data + (r + i) * rb;
  const int64_t nt = t1 - t0;
  for (int64_t i = 0; i < nt * R * kAccs; ++i) acc[i] = hn::Zero(df);
  for (int64_t b0 = 0; b0 < nb; b0 += seg_blocks) {
    const int64_t b1 = std::min(nb, b0 + seg_blocks), c0 = b0 * kB, n = (b1 - b0) * kB;
    DecodePanel<Q, R>(rows, b0, b1, panel);
    const float* xs = x + t0 * w.cols + c0;
    int64_t t = 0;
    for (; t + kPanelTok <= nt; t += kPanelTok) PanelTile<R, kPanelTok>(panel, n, xs + t * w.cols, w.cols, acc + t * R * kAccs);
    if (t < nt) PanelTile<R, 1>(panel, n, xs + t * w.cols, w.cols, acc + t * R * kAccs);
  }
  for (int64_t t = 0; t < nt; ++t)
    for (int i = 0; i < R; ++i) y[(t0 + t) * ldy + r + i] = ReduceChains(acc + (t * R + i) * kAccs);
}

template <GgmlType Q>
void TypedRows(const GgmlView& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const int64_t rb = w.row_bytes();
  if (T == 1) {
    // Decode: 4 rows at a time (4 independent weight streams and FMA chains). The 4 rows are
    // contiguous but read interleaved block by block, which the hardware prefetchers follow
    // poorly (and they stop at 4 KiB pages of the mapped file): each tile prefetches the rows
    // ~kPrefetchBytes ahead at its own pace (measured: 2-3x the streamed GB/s without).
    const int64_t ahead = 4 * std::max<int64_t>(1, kPrefetchBytes / (4 * rb));
    int64_t r = r0;
    for (; r + 4 <= r1; r += 4) {
      const uint8_t* rows[4] = {w.data + r * rb, w.data + (r + 1) * rb, w.data + (r + 2) * rb, w.data + (r + 3) * rb};
      const uint8_t* pf = r + ahead + 4 <= r1 ? w.data + (r + ahead) * rb : nullptr;
      Tile<Q, 4, 1>(w, rows, x, y + r, 1, pf);
    }
    for (; r < r1; ++r) {
      const uint8_t* rows[1] = {w.data + r * rb};
      Tile<Q, 1, 1>(w, rows, x, y + r, 1);
    }
    return;
  }
  // Prefill: token tiles of kTokenTile (x in L2). Quantized rows of more than kShortRow columns
  // through the f32 panel, kPanelRows rows at a time; float rows of more than kShortRow columns
  // kPR rows at a time against all of a tile's tokens (the rows stay in L1 between register
  // tiles); short rows one by one (kPT tokens of x in L1, accumulators in registers over the
  // whole row). Every tile shape accumulates each output in the same order, so results do not
  // depend on T.
  if constexpr (BlockCols(Q) > 1) {
    if (w.cols > kShortRow) {
      alignas(64) float panel[kPanelRows * kPanelSeg];
      VF acc[kTokenTile * kPanelRows * kAccs];
      for (int64_t t0 = 0; t0 < T; t0 += kTokenTile) {
        const int64_t t1 = std::min(T, t0 + kTokenTile);
        int64_t r = r0;
        for (; r + kPanelRows <= r1; r += kPanelRows) PanelRows<Q, kPanelRows>(w, r, t0, t1, x, y, ldy, panel, acc);
        for (; r < r1; ++r) PanelRows<Q, 1>(w, r, t0, t1, x, y, ldy, panel, acc);
      }
      return;
    }
  }
  for (int64_t t0 = 0; t0 < T; t0 += kTokenTile) {
    const int64_t t1 = std::min(T, t0 + kTokenTile);
    int64_t r = r0;
    if constexpr (BlockCols(Q) == 1) {
      for (; w.cols > kShortRow && r + kPR <= r1; r += kPR) {
        const uint8_t* rows[kPR];
        for (int i = 0; i < kPR; ++i) rows[i] = w.data + (r + i) * rb;
        // the next row tile (contiguous), prefetched while this one's first token tile runs
        const uint8_t* pf = r + 2 * kPR <= r1 ? w.data + (r + kPR) * rb : nullptr;
        TokenRun<Q, kPR>(w, rows, x, t0, t1, y, ldy, r, pf);
      }
    }
    for (; r < r1; ++r) {
      const uint8_t* rows[1] = {w.data + r * rb};
      TokenRun<Q, 1>(w, rows, x, t0, t1, y, ldy, r, r + kRowAhead < r1 ? w.data + (r + kRowAhead) * rb : nullptr);
    }
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace gb

void GgmlRows(const GgmlView& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
#if HWY_TARGET != HWY_SCALAR
  switch (w.type) {
    case GgmlType::F32: return gb::TypedRows<GgmlType::F32>(w, x, T, y, ldy, r0, r1);
    case GgmlType::F16: return gb::TypedRows<GgmlType::F16>(w, x, T, y, ldy, r0, r1);
    case GgmlType::BF16: return gb::TypedRows<GgmlType::BF16>(w, x, T, y, ldy, r0, r1);
    case GgmlType::Q8_0: return gb::TypedRows<GgmlType::Q8_0>(w, x, T, y, ldy, r0, r1);
    case GgmlType::Q4_0: return gb::TypedRows<GgmlType::Q4_0>(w, x, T, y, ldy, r0, r1);
    case GgmlType::Q4_1: return gb::TypedRows<GgmlType::Q4_1>(w, x, T, y, ldy, r0, r1);
    case GgmlType::Q5_0: return gb::TypedRows<GgmlType::Q5_0>(w, x, T, y, ldy, r0, r1);
    case GgmlType::Q5_1: return gb::TypedRows<GgmlType::Q5_1>(w, x, T, y, ldy, r0, r1);
    case GgmlType::Q2_K: return gb::TypedRows<GgmlType::Q2_K>(w, x, T, y, ldy, r0, r1);
    case GgmlType::Q3_K: return gb::TypedRows<GgmlType::Q3_K>(w, x, T, y, ldy, r0, r1);
    case GgmlType::Q4_K: return gb::TypedRows<GgmlType::Q4_K>(w, x, T, y, ldy, r0, r1);
    case GgmlType::Q5_K: return gb::TypedRows<GgmlType::Q5_K>(w, x, T, y, ldy, r0, r1);
    case GgmlType::Q6_K: return gb::TypedRows<GgmlType::Q6_K>(w, x, T, y, ldy, r0, r1);
    case GgmlType::IQ4_NL: return gb::TypedRows<GgmlType::IQ4_NL>(w, x, T, y, ldy, r0, r1);
    case GgmlType::IQ4_XS: return gb::TypedRows<GgmlType::IQ4_XS>(w, x, T, y, ldy, r0, r1);
    case GgmlType::MXFP4: return gb::TypedRows<GgmlType::MXFP4>(w, x, T, y, ldy, r0, r1);
    default: break;
  }
#endif
  gb::RowsByDequant(w, x, T, y, ldy, r0, r1);
}

namespace gb {
#if HWY_TARGET != HWY_SCALAR
// The decode of MxTile with 16 f32 lanes (AVX-512) over a de-interleaved input: each byte of a
// block widened to a 32-bit lane; its low and high nibbles index the block's 16-entry value table
// (times the block's scale) with one permute each (vpermps), and multiply x's 16 even and 16 odd
// columns. `di` is the 16-lane int32 tag (a template parameter: only the 16-lane targets run it).
template <int R, int TT, class DI16>
HWY_INLINE void MxPermTile(DI16 di, V8 table, const uint8_t* const* rows, const uint8_t* const* srows, int64_t nb,
                           const float* xp, int64_t ldx, VF* acc) {
  const DF df;
  const hn::RebindToUnsigned<DI16> du;
  const hn::Rebind<uint8_t, DI16> du8;
  const VF tab = hn::ConvertTo(df, hn::PromoteTo(di, table));
  const auto low = hn::Set(du, 0xFu);
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = xp + b * 32;
    for (int r = 0; r < R; ++r) {
      const VF tbl = hn::Mul(tab, hn::Set(df, ggml::e8m0_half(srows[r][b])));
      const auto c = hn::PromoteTo(du, hn::LoadU(du8, rows[r] + b * 16));
      const VF w0 = hn::TableLookupLanes(tbl, hn::IndicesFromVec(df, hn::BitCast(di, hn::And(c, low))));
      const VF w1 = hn::TableLookupLanes(tbl, hn::IndicesFromVec(df, hn::BitCast(di, hn::ShiftRight<4>(c))));
      for (int t = 0; t < TT; ++t) {
        acc[t * R + r] = hn::MulAdd(w0, hn::LoadU(df, xb + t * ldx), acc[t * R + r]);
        acc[t * R + r] = hn::MulAdd(w1, hn::LoadU(df, xb + 16 + t * ldx), acc[t * R + r]);
      }
    }
  }
}

// HF MXFP4 (Mxfp4View): R rows against TT tokens over nb blocks of 32 columns. The block's low
// and high nibbles are looked up, then interleaved back into column order (InterleaveLower:
// columns 0..15, InterleaveUpper: 16..31), so x is read in place.
template <int R, int TT, bool kPerm = false>
HWY_INLINE void MxTile(const uint8_t* const* rows, const uint8_t* const* srows, int64_t nb, const float* x, int64_t ldx,
                       float* out, int64_t ldo) {
  const DF df;
  const D8 d8;
  VF acc[TT * R];
  for (int i = 0; i < TT * R; ++i) acc[i] = hn::Zero(df);
  const V8 table = hn::Load(d8, ggml::kMxfp4);
  if constexpr (kPerm) {  // 16 f32 lanes, x de-interleaved per block (MxPermuteInput)
    MxPermTile<R, TT>(DI(), table, rows, srows, nb, x, ldx, acc);
  } else {
  for (int64_t b = 0; b < nb; ++b) {
    for (int r = 0; r < R; ++r) {
      const Sink<TT> sk{acc + r, R, x + b * 32, ldx};
      const VU8 v = Load16(rows[r] + b * 16);
      const V8 lo = Lut(table, Shr<0>(v, 0x0F)), hi = Lut(table, Shr<4>(v, 0x0F));
      const float d = ggml::e8m0_half(srows[r][b]);
      sk.template Group<false>(0, hn::InterleaveLower(d8, lo, hi), d, 0.0f);
      sk.template Group<false>(16, hn::InterleaveUpper(d8, lo, hi), d, 0.0f);
    }
  }
  }
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) out[t * ldo + r] = hn::GetLane(hn::SumOfLanes(df, acc[t * R + r]));
}

// x [T, cols] -> xp with each block of 32 columns as [16 even columns | 16 odd columns], the
// order in which MxPermTile decodes a block (low nibbles, then high nibbles).
void MxPermuteInput(const float* x, int64_t T, int64_t cols, float* xp) {
  for (int64_t i = 0; i < T * cols; i += 32)
    for (int j = 0; j < 16; ++j) {
      xp[i + j] = x[i + 2 * j];
      xp[i + 16 + j] = x[i + 2 * j + 1];
    }
}
#endif

// Scalar path: dequantize each row, then dot.
void MxRowsByDequant(const Mxfp4View& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(w.cols));
  const int64_t nb = w.cols / 32;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t b = 0; b < nb; ++b) ggml::dequant_mx_block(w.blocks + (r * nb + b) * 16, w.scales[r * nb + b], row.data() + b * 32);
    for (int64_t t = 0; t < T; ++t) y[t * ldy + r] = ops::dot(row.data(), x + t * w.cols, w.cols);
  }
}
}  // namespace gb

// Same tiling as TypedRows: decode 4 rows x 1 token, prefill 1 row x kGemmTokens tokens.
template <bool kPerm>
void Mxfp4RowsT(const Mxfp4View& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1);

// Rows [r0, r1) of y = W x. `permuted`: x is already de-interleaved (gb::MxPermuteInput), as
// mxfp4_matmul does once for all threads where Mxfp4PermutesInput() says this target decodes
// that way (16 f32 lanes); otherwise such a target de-interleaves x here.
void Mxfp4Rows(const Mxfp4View& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1, bool permuted) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (kN == 16) {
    if (!permuted) {
      thread_local std::vector<float> xp;
      xp.resize(static_cast<size_t>(T * w.cols));
      gb::MxPermuteInput(x, T, w.cols, xp.data());
      return Mxfp4RowsT<true>(w, xp.data(), T, y, ldy, r0, r1);
    }
    return Mxfp4RowsT<true>(w, x, T, y, ldy, r0, r1);
  } else {
    (void)permuted;
    return Mxfp4RowsT<false>(w, x, T, y, ldy, r0, r1);
  }
#else
  (void)permuted;
  gb::MxRowsByDequant(w, x, T, y, ldy, r0, r1);
#endif
}

// Whether this target's Mxfp4Rows decodes from a de-interleaved input.
bool Mxfp4PermutesInput() {
#if HWY_TARGET != HWY_SCALAR
  return kN == 16;
#else
  return false;
#endif
}

template <bool kPerm>
void Mxfp4RowsT(const Mxfp4View& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
#if HWY_TARGET != HWY_SCALAR
  using namespace gb;
  const int64_t nb = w.cols / 32, rb = nb * 16;
  auto brow = [&](int64_t r) { return w.blocks + r * rb; };
  auto srow = [&](int64_t r) { return w.scales + r * nb; };
  if (T < kGemmTokens) {
    for (int64_t t = 0; t < T; ++t) {
      const float* xt = x + t * w.cols;
      float* yt = y + t * ldy;
      int64_t r = r0;
      for (; r + 4 <= r1; r += 4) {
        const uint8_t* rows[4] = {brow(r), brow(r + 1), brow(r + 2), brow(r + 3)};
        const uint8_t* srows[4] = {srow(r), srow(r + 1), srow(r + 2), srow(r + 3)};
        MxTile<4, 1, kPerm>(rows, srows, nb, xt, w.cols, yt + r, 1);
      }
      for (; r < r1; ++r) {
        const uint8_t* rows[1] = {brow(r)};
        const uint8_t* srows[1] = {srow(r)};
        MxTile<1, 1, kPerm>(rows, srows, nb, xt, w.cols, yt + r, 1);
      }
    }
    return;
  }
  for (int64_t t0 = 0; t0 < T; t0 += kTokenTile) {
    const int64_t t1 = std::min(T, t0 + kTokenTile);
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* rows[1] = {brow(r)};
      const uint8_t* srows[1] = {srow(r)};
      int64_t t = t0;
      for (; t + kGemmTokens <= t1; t += kGemmTokens)
        MxTile<1, kGemmTokens, kPerm>(rows, srows, nb, x + t * w.cols, w.cols, y + t * ldy + r, ldy);
      for (; t < t1; ++t) MxTile<1, 1, kPerm>(rows, srows, nb, x + t * w.cols, w.cols, y + t * ldy + r, ldy);
    }
  }
#else
  (void)w, (void)x, (void)T, (void)y, (void)ldy, (void)r0, (void)r1;
#endif
}

const char* GgmlKernelTarget() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace spool::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace spool::ops {

HWY_EXPORT(GgmlRows);
HWY_EXPORT(Mxfp4Rows);
HWY_EXPORT(Mxfp4PermutesInput);
HWY_EXPORT(GgmlKernelTarget);

void validate(const Mxfp4View& w) {
  if (w.rows < 0 || w.cols <= 0 || w.cols % 32 != 0)
    fail("MXFP4 weight %s: bad shape [%lld x %lld] (columns must be a positive multiple of 32)", w.name ? w.name : "(unnamed)",
         static_cast<long long>(w.rows), static_cast<long long>(w.cols));
  if (w.rows > 0 && (w.blocks == nullptr || w.scales == nullptr)) fail("MXFP4 weight %s: no data", w.name ? w.name : "(unnamed)");
}

void mxfp4_dequantize_row(const uint8_t* blocks, const uint8_t* scales, int64_t n, float* dst) {
  if (n < 0 || n % 32 != 0) fail("mxfp4_dequantize_row: %lld elements is not a multiple of 32", static_cast<long long>(n));
  for (int64_t b = 0; b < n / 32; ++b) ggml::dequant_mx_block(blocks + b * 16, scales[b], dst + b * 32);
}

void mxfp4_matmul_rows(const Mxfp4View& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  validate(w);
  if (r0 < 0 || r1 > w.rows)
    fail("mxfp4_matmul_rows: rows [%lld, %lld) outside [0, %lld)", static_cast<long long>(r0), static_cast<long long>(r1),
         static_cast<long long>(w.rows));
  if (r0 >= r1 || T <= 0) return;
  HWY_DYNAMIC_DISPATCH(Mxfp4Rows)(w, x, T, y, ldy, r0, r1, false);
}

void mxfp4_matmul(const Mxfp4View& w, const float* x, int64_t T, float* y, ThreadPool* pool) {
  validate(w);
  if (T <= 0 || w.rows == 0) return;
  // The input de-interleaved once for every thread's rows where the target decodes that way.
  std::vector<float> xp;
  const bool perm = HWY_DYNAMIC_DISPATCH(Mxfp4PermutesInput)();
  if (perm) {
    xp.resize(static_cast<size_t>(T * w.cols));
    for (int64_t i = 0; i < T * w.cols; i += 32)
      for (int j = 0; j < 16; ++j) {
        xp[i + j] = x[i + 2 * j];
        xp[i + 16 + j] = x[i + 2 * j + 1];
      }
  }
  const float* xin = perm ? xp.data() : x;
  const int64_t work = w.rows * w.cols * T;
  if (pool == nullptr || pool->size() == 1 || work < (1 << 15)) {
    HWY_DYNAMIC_DISPATCH(Mxfp4Rows)(w, xin, T, y, w.rows, 0, w.rows, perm);
    return;
  }
  pool->parallel_for(w.rows, 16, [&](int64_t b, int64_t e, int) { HWY_DYNAMIC_DISPATCH(Mxfp4Rows)(w, xin, T, y, w.rows, b, e, perm); });
}

void mxfp4_matmul_reference(const Mxfp4View& w, const float* x, int64_t T, float* y) {
  validate(w);
  std::vector<float> row(static_cast<size_t>(w.cols));
  const int64_t nb = w.cols / 32;
  for (int64_t r = 0; r < w.rows; ++r) {
    // Written from the definition (HF integrations/mxfp4.py convert_moe_packed_tensors), not
    // from the kernels' table: value = FP4(code) * 2^(scale - 127).
    static constexpr float kFp4[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                       -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    for (int64_t b = 0; b < nb; ++b) {
      const double m = std::ldexp(1.0, static_cast<int>(w.scales[r * nb + b]) - 127);
      const uint8_t* q = w.blocks + (r * nb + b) * 16;
      for (int j = 0; j < 16; ++j) {
        row[b * 32 + 2 * j] = static_cast<float>(kFp4[q[j] & 0xF] * m);
        row[b * 32 + 2 * j + 1] = static_cast<float>(kFp4[q[j] >> 4] * m);
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      double acc = 0;
      for (int64_t c = 0; c < w.cols; ++c) acc += static_cast<double>(row[c]) * x[t * w.cols + c];
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

bool ggml_supported(GgmlType t) {
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0: case GgmlType::Q4_0:
    case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1: case GgmlType::Q2_K: case GgmlType::Q3_K:
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: case GgmlType::IQ4_NL: case GgmlType::IQ4_XS:
    case GgmlType::MXFP4:
      return true;
    default:
      return iquant_type(t);
  }
}

std::string ggml_describe(const GgmlView& w) {
  const char* n = ggml_type_traits(w.type).name;
  std::string s = n != nullptr ? n : "unknown type id " + std::to_string(static_cast<unsigned>(w.type));
  if (w.name != nullptr) s += std::string(" tensor '") + w.name + "'";
  return s;
}

void validate(const GgmlView& w) {
  if (!ggml_supported(w.type))
    fail("%s: ggml type %s (id %u) is not supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, "
         "Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, TQ1_0, "
         "TQ2_0)",
         ggml_describe(w).c_str(), ggml_type_name(w.type), static_cast<unsigned>(w.type));
  const uint32_t blck = ggml_type_traits(w.type).blck;
  if (w.rows < 0 || w.cols <= 0 || w.cols % blck != 0)
    fail("%s: bad shape [%lld x %lld] (columns must be a positive multiple of the block size %u)",
         ggml_describe(w).c_str(), static_cast<long long>(w.rows), static_cast<long long>(w.cols), blck);
  if (w.rows > 0 && w.data == nullptr) fail("%s: no data", ggml_describe(w).c_str());
}

void ggml_dequantize_row(GgmlType t, const uint8_t* src, int64_t n, float* dst) {
  const GgmlTypeTraits tr = ggml_type_traits(t);
  if (!ggml_supported(t)) fail("ggml type %s (id %u) is not supported", ggml_type_name(t), static_cast<unsigned>(t));
  if (n < 0 || n % tr.blck != 0)
    fail("ggml_dequantize_row: %lld elements is not a multiple of the %s block size %u", static_cast<long long>(n),
         tr.name, tr.blck);
  for (int64_t b = 0; b < n / tr.blck; ++b) ggml::dequant_block(t, src + b * tr.size, dst + b * tr.blck);
}

void ggml_matmul_rows(const GgmlView& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  validate(w);
  if (r0 < 0 || r1 > w.rows)
    fail("ggml_matmul_rows (%s): rows [%lld, %lld) outside [0, %lld)", ggml_describe(w).c_str(),
         static_cast<long long>(r0), static_cast<long long>(r1), static_cast<long long>(w.rows));
  if (r0 >= r1 || T <= 0) return;
  HWY_DYNAMIC_DISPATCH(GgmlRows)(w, x, T, y, ldy, r0, r1);
}

void ggml_matmul(const GgmlView& w, const float* x, int64_t T, float* y, ThreadPool* pool) {
  validate(w);
  if (T <= 0 || w.rows == 0) return;
  const int64_t work = w.rows * w.cols * T;
  if (pool == nullptr || pool->size() == 1 || work < (1 << 15)) {
    HWY_DYNAMIC_DISPATCH(GgmlRows)(w, x, T, y, w.rows, 0, w.rows);
    return;
  }
  pool->parallel_for(w.rows, 16, [&](int64_t b, int64_t e, int) { HWY_DYNAMIC_DISPATCH(GgmlRows)(w, x, T, y, w.rows, b, e); });
}

void ggml_matmul_reference(const GgmlView& w, const float* x, int64_t T, float* y) {
  validate(w);
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    ggml_dequantize_row(w.type, w.data + r * w.row_bytes(), w.cols, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double acc = 0;
      for (int64_t c = 0; c < w.cols; ++c) acc += static_cast<double>(row[c]) * x[t * w.cols + c];
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

const char* ggml_kernel_target() { return HWY_DYNAMIC_DISPATCH(GgmlKernelTarget)(); }

}  // namespace spool::ops
#endif  // HWY_ONCE
