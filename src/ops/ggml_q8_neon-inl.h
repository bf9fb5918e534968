// NEON int8-activation kernels for Q4_K / Q6_K (see ggml_q8.h), included twice by
// ggml_q8_neon.cpp: SPOOL_Q8_DOTPROD 1 (compiled for the dot-product extension, namespace
// neon_dot) and 0 (baseline Armv8-A, namespace neon_base). No include guard.
//
// Dot16 (int32 lanes += sums of 4 products of signed bytes): sdot, or vmull_s8 / vmull_high_s8,
// vpaddq_s16 (pair sums of at most 2 * 63 * 127 in int16) and vpadalq_s16. Both give lane i the
// bytes 4 i .. 4 i + 3, so the prefill panels (codes interleaved as the activations, Q8Acts) work
// with either.
// Decode (T = 1): 4 rows at a time straight from the weights; per sub-block (Q4_K: 32 columns,
// two vectors; Q6_K: 16, one) the int32 dot (Q6_K's codes minus 32 as signed bytes, so no offset
// term), times the sub-block scale (vmlaq_n_s32), then acc += float(lanes) * (d * d_a) and, for
// Q4_K, -dmin * min * the sub-block's activation sum.
// Prefill (T >= 2): PanelBlocks (ggml_q8_panel.h) per 4 rows x 4 blocks, decoded once per tile of
// 64 tokens; a 4-row x 4-token tile per quarter block (4 groups, one int32 lane each) runs 4 Dot16
// per row and token, then acc += float(lanes) * sd * d_a + c * bs.


#define SPOOL_INLINE inline __attribute__((always_inline))

// int32 lanes += the sums of 4 products of signed bytes (lane i: bytes 4 i .. 4 i + 3).
SPOOL_INLINE int32x4_t Dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if SPOOL_Q8_DOTPROD
  return vdotq_s32(acc, a, b);
#else
  return vpadalq_s16(acc, vpaddq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)), vmull_high_s8(a, b)));
#endif
}

// The int32 dot of 32 (c0, c1 with a0, a1) or 16 (c0 with a0) signed bytes, in 4 lanes (lane i:
// bytes 4 i .. 4 i + 3 of each vector, with or without sdot: the same lanes, so the same f32 bits).
SPOOL_INLINE int32x4_t Dot32(int8x16_t c0, int8x16_t a0, int8x16_t c1, int8x16_t a1) {
  return Dot16(Dot16(vdupq_n_s32(0), c0, a0), c1, a1);
}
SPOOL_INLINE int32x4_t Dot16x1(int8x16_t c0, int8x16_t a0) { return Dot16(vdupq_n_s32(0), c0, a0); }

// Q4_K block at p against one token's column-order activation block qa (scale da); sub_lo /
// sub_hi: the token block's activation sums per 32-column sub-block 0..3 / 4..7.
SPOOL_INLINE float32x4_t DotQ4K(const uint8_t* p, const int8_t* qa, float da, float32x4_t sub_lo, float32x4_t sub_hi,
                                float32x4_t acc) {
  uint8_t sm[16];  // scales 0..7, mins 0..7
  ggml::unpack_k4_scales(p + 4, sm);
  const uint8x16_t m4 = vdupq_n_u8(0x0F);
  int32x4_t s = vdupq_n_s32(0);
  for (int j = 0; j < 4; ++j) {
    const uint8x16_t z0 = vld1q_u8(p + 16 + 32 * j), z1 = vld1q_u8(p + 32 + 32 * j);
    const int8_t* x = qa + 64 * j;
    const int8x16_t lo0 = vreinterpretq_s8_u8(vandq_u8(z0, m4)), lo1 = vreinterpretq_s8_u8(vandq_u8(z1, m4));
    const int8x16_t hi0 = vreinterpretq_s8_u8(vshrq_n_u8(z0, 4)), hi1 = vreinterpretq_s8_u8(vshrq_n_u8(z1, 4));
    s = vmlaq_n_s32(s, Dot32(lo0, vld1q_s8(x), lo1, vld1q_s8(x + 16)), sm[2 * j]);           // sub-block 2 j
    s = vmlaq_n_s32(s, Dot32(hi0, vld1q_s8(x + 32), hi1, vld1q_s8(x + 48)), sm[2 * j + 1]);  // sub-block 2 j + 1
  }
  acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), half_at(p) * da);
  const uint16x8_t m16 = vmovl_u8(vld1_u8(sm + 8));
  const float ndmin = -half_at(p + 2);
  acc = vfmaq_f32(acc, vmulq_n_f32(vcvtq_f32_u32(vmovl_u16(vget_low_u16(m16))), ndmin), sub_lo);
  return vfmaq_f32(acc, vmulq_n_f32(vcvtq_f32_u32(vmovl_high_u16(m16)), ndmin), sub_hi);
}

// Q6_K block at p against one token's column-order activation block qa (scale da).
SPOOL_INLINE float32x4_t DotQ6K(const uint8_t* p, const int8_t* qa, float da, float32x4_t acc) {
  const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
  const uint8x16_t m4 = vdupq_n_u8(0x0F), m30 = vdupq_n_u8(0x30);
  const int8x16_t bias = vdupq_n_s8(32);
  int32x4_t s = vdupq_n_s32(0);
  for (int h = 0; h < 2; ++h)
    for (int n = 0; n < 2; ++n) {
      const uint8x16_t l0 = vld1q_u8(p + 64 * h + 16 * n), l1 = vld1q_u8(p + 64 * h + 32 + 16 * n);
      const uint8x16_t qh = vld1q_u8(p + 128 + 32 * h + 16 * n);
      uint8x16_t c[4];
      c[0] = vorrq_u8(vandq_u8(l0, m4), vandq_u8(vshlq_n_u8(qh, 4), m30));
      c[1] = vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8(qh, 2), m30));
      c[2] = vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(qh, m30));
      c[3] = vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(vshrq_n_u8(qh, 2), m30));
      for (int m = 0; m < 4; ++m)  // columns 128 h + 32 m + 16 n + [0, 16): sub-block 8 h + 2 m + n
        s = vmlaq_n_s32(s, Dot16x1(vsubq_s8(vreinterpretq_s8_u8(c[m]), bias), vld1q_s8(qa + 128 * h + 32 * m + 16 * n)),
                        sc[8 * h + 2 * m + n]);
    }
  return vfmaq_n_f32(acc, vcvtq_f32_s32(s), half_at(p + 208) * da);
}

constexpr int kRows = 4;
constexpr int64_t kPrefetchBytes = 32768;

template <GgmlType Q, int R>
SPOOL_INLINE void GemvRows(const uint8_t* rows, int64_t rb, const Q8Acts& a, float* y, const uint8_t* pf) {
  constexpr int64_t kBytes = Q == GgmlType::Q4_K ? 144 : 210;
  float32x4_t acc[R];
  for (int i = 0; i < R; ++i) acc[i] = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < a.blocks(); ++b) {
    if (pf != nullptr)
      for (int i = 0; i < R; ++i)
        for (int64_t o = 0; o < kBytes + 63; o += 64) __builtin_prefetch(pf + i * rb + b * kBytes + o);
    const int8_t* qa = a.q.data() + b * kQ8Block;
    const float da = a.d[b];
    if constexpr (Q == GgmlType::Q4_K) {
      const float* bs = a.bs.data() + b * 16;
      const float32x4_t sub_lo = vpaddq_f32(vld1q_f32(bs), vld1q_f32(bs + 4));
      const float32x4_t sub_hi = vpaddq_f32(vld1q_f32(bs + 8), vld1q_f32(bs + 12));
      for (int i = 0; i < R; ++i) acc[i] = DotQ4K(rows + i * rb + b * kBytes, qa, da, sub_lo, sub_hi, acc[i]);
    } else {
      for (int i = 0; i < R; ++i) acc[i] = DotQ6K(rows + i * rb + b * kBytes, qa, da, acc[i]);
    }
  }
  for (int i = 0; i < R; ++i) y[i] = vaddvq_f32(acc[i]);
}

constexpr int64_t kTokenTile = 64;
constexpr int64_t kSegBlocks = 4;
constexpr int kPanelRows = 4, kPanelTok = 4;

// Prefill register tile: R panel rows (nb blocks each) x TT tokens from token t; acc [TT][R][16].
template <int R, int TT>
SPOOL_INLINE void PanelTile(const PanelBlock* panel, int64_t nb, const Q8Acts& a, int64_t b0, int64_t t, float* acc) {
  const int64_t anb = a.blocks();
  for (int64_t b = 0; b < nb; ++b)
    for (int m = 0; m < 4; ++m) {  // groups 4 m .. 4 m + 3
      int32x4_t s[R * TT];
      for (int i = 0; i < R * TT; ++i) s[i] = vdupq_n_s32(0);
      const int8_t* x0 = a.q.data() + t * a.cols + (b0 + b) * kQ8Block + 16 * m;
      for (int k = 0; k < 4; ++k) {
        int8x16_t x[TT];
        for (int j = 0; j < TT; ++j) x[j] = vld1q_s8(x0 + j * a.cols + 64 * k);
        for (int i = 0; i < R; ++i) {
          const int8x16_t wq = vreinterpretq_s8_u8(vld1q_u8(panel[i * kSegBlocks + b].q + 64 * k + 16 * m));
          for (int j = 0; j < TT; ++j) s[i * TT + j] = Dot16(s[i * TT + j], wq, x[j]);
        }
      }
      for (int j = 0; j < TT; ++j) {
        const int64_t ab = (t + j) * anb + b0 + b;
        const float da = a.d[ab];
        const float32x4_t bs = vld1q_f32(a.bs.data() + ab * 16 + 4 * m);
        for (int i = 0; i < R; ++i) {
          const PanelBlock& pb = panel[i * kSegBlocks + b];
          float* o = acc + (j * R + i) * 16 + 4 * m;
          const float32x4_t dot = vmulq_f32(vcvtq_f32_s32(s[i * TT + j]), vld1q_f32(pb.sd + 4 * m));
          vst1q_f32(o, vfmaq_f32(vfmaq_n_f32(vld1q_f32(o), dot, da), vld1q_f32(pb.c + 4 * m), bs));
        }
      }
    }
}

// The kernels of this variant for the shared row drivers.
struct Kernels {
  template <GgmlType Q, int R>
  static SPOOL_INLINE void Gemv(const uint8_t* rows, int64_t rb, const Q8Acts& a, float* y, const uint8_t* pf) {
    GemvRows<Q, R>(rows, rb, a, y, pf);
  }
  template <int R, int TT>
  static SPOOL_INLINE void Tile(const PanelBlock* panel, int64_t nb, const Q8Acts& a, int64_t b0, int64_t t, float* acc) {
    PanelTile<R, TT>(panel, nb, a, b0, t, acc);
  }
  static SPOOL_INLINE float Sum16(const float* o) {
    const float32x4_t v = vaddq_f32(vaddq_f32(vld1q_f32(o), vld1q_f32(o + 4)), vaddq_f32(vld1q_f32(o + 8), vld1q_f32(o + 12)));
    return vaddvq_f32(v);
  }
};

#include "ops/ggml_q8_rows-inl.h"  // IWYU pragma: keep (DecodeRowRange, PrefillRowRange)

template <GgmlType Q>
void TypedRows(const GgmlView& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (a.T == 1) return DecodeRowRange<Kernels, Q>(w, a, y, r0, r1);
  PrefillRowRange<Kernels, kPanelRows>(w, a, y, ldy, r0, r1);
}

void Rows(const GgmlView& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (w.type == GgmlType::Q4_K) return TypedRows<GgmlType::Q4_K>(w, a, y, ldy, r0, r1);
  return TypedRows<GgmlType::Q6_K>(w, a, y, ldy, r0, r1);
}

#undef SPOOL_INLINE
