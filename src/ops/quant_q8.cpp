// Int8-activation kernels for spool's q4 matrices (see quant_q8.h), compiled once per Highway
// target and dispatched at runtime.
#define HWY_WANT_AVX3_DL  // VNNI where the CPU has it (before highway.h)
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/quant_q8.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/cache_control.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__aarch64__)
#include <arm_neon.h>
#endif

#include "common/error.h"
#include "ops/ggml_q8.h"
#include "ops/quant_q8.h"

// ---- Target-independent helpers (compiled once) ----
#ifndef SPOOL_OPS_QUANT_Q8_SHARED
#define SPOOL_OPS_QUANT_Q8_SHARED
namespace spool::ops::qq8 {

/// Columns per lane (8 codes of one group, one activation scale), and the multiple of them the
/// kernels need (an AVX-512 super-block: 16 lanes).
inline constexpr int64_t kLane = 8, kColumns = 128;

/// The matrix's codebook in int8: c8[k] = round(c_k / dc), dc = max |c_k| / 127 (0 for an all-zero
/// codebook: every product is then 0; NaN for a non-finite one, codes 0: every product is NaN).
struct Codebook8 {
  alignas(16) int8_t c8[16] = {};
  float dc = 0.0f;
};

inline Codebook8 codebook8(const QuantView& w) {
  Codebook8 cb;
  float cmax = 0.0f;
  bool finite = true;
  for (int k = 0; k < 16; ++k) {
    finite = finite && std::isfinite(w.centroid(k));
    cmax = std::max(cmax, std::fabs(w.centroid(k)));
  }
  if (!finite) {
    cb.dc = std::nanf("");
    return cb;
  }
  if (cmax == 0.0f) return cb;
  cb.dc = cmax / 127.0f;
  const float inv = 127.0f / cmax;
  for (int k = 0; k < 16; ++k)
    cb.c8[k] = static_cast<int8_t>(std::clamp(std::lrint(w.centroid(k) * inv), -127L, 127L));
  return cb;
}

/// True when w is a q8 matrix on the format's grid c_k = (2k - 255) / 64 (ops::q8_grid(); spool
/// convert writes no other): c_k = (2 (k - 128) + 1) / 64, so with s = k - 128 (a signed byte) a
/// 4-column dot is (2 dot(s, q) + sum q) / 64, exact in int32.
inline bool q8_on_grid(const QuantView& w) {
  if (w.type != QType::kQ8) return false;
  if (w.codebook == q8_grid()) return true;
  return std::memcmp(w.codebook, q8_grid(), 256 * sizeof(float)) == 0;
}

/// 2 dot(s, q) + sum q over the 4 columns 4 j .. 4 j + 3 of a q8 row (s = code - 128): 64 times the
/// columns' centroid-weighted activation codes.
inline int32_t q8_quad(const uint8_t* row, const int8_t* q, int64_t j) {
  int32_t s = 0;
  for (int64_t c = 4 * j; c < 4 * j + 4; ++c) s += (2 * (static_cast<int32_t>(row[c]) - 128) + 1) * q[c];
  return s;
}

/// Integer dot of lane `lane` (columns 8 lane .. 8 lane + 7) of row bytes `row` with token codes
/// even / odd (the token's QuantQ8Acts vectors).
inline int32_t lane_dot(const Codebook8& cb, const uint8_t* row, const int8_t* even, const int8_t* odd, int64_t lane) {
  int32_t s = 0;
  for (int64_t b = 4 * lane; b < 4 * lane + 4; ++b) {
    s += cb.c8[row[b] & 15] * even[b];
    s += cb.c8[row[b] >> 4] * odd[b];
  }
  return s;
}

}  // namespace spool::ops::qq8
#endif  // SPOOL_OPS_QUANT_Q8_SHARED

HWY_BEFORE_NAMESPACE();
namespace spool::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Row r's group scales as f32 at out[0, ng); out must have room for ng + 16 floats: the SIMD kernels
// load 16 at a group and use only the lanes of that super-block's groups, so what lies past ng is
// never used (a grow-only buffer: earlier rows' values). Called once per row: no library calls
// (a 64-byte memset per row cost ~2.5% of a decode step's CPU time).
HWY_INLINE void RowScales(const QuantView& w, int64_t r, float* out) {
  const int64_t ng = w.groups_per_row();
  int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<float> df;
  const hn::Rebind<hwy::float16_t, decltype(df)> dh;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const uint16_t* src = w.scales + r * ng;
  for (; i + n <= ng; i += n) hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(src + i))), df, out + i);
  // The rest (a 512-column row has 8 groups of 64): one whole vector when the matrix's scales go on
  // that far (the next row's scales land past ng, unused), else one at a time below.
  if (i < ng && r * ng + i + n <= w.rows * ng) {
    hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(src + i))), df, out + i);
    i = ng;
  }
#endif
  for (; i < ng; ++i) out[i] = w.scale(r * ng + i);
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#if HWY_TARGET <= HWY_AVX3_DL && !HWY_COMPILER_CLANG
// As in ggml_q8.cpp: Highway 1.0.3's AVX3_DL target string lacks "avx512vnni" although its runtime
// check requires it; HWY_AFTER_NAMESPACE pops this.
#pragma GCC target("avx512vnni")
#define SPOOL_QQ8_VNNI_INTRINSICS 1
#else
#define SPOOL_QQ8_VNNI_INTRINSICS 0
#endif
namespace qq8x {

constexpr bool kVnni = HWY_TARGET <= HWY_AVX3_DL;

// int32 lanes += the sums of 4 products of unsigned bytes u and signed bytes s (vpdpbusd).
HWY_INLINE __m512i Dpbusd(__m512i acc, __m512i u, __m512i s) {
#if SPOOL_QQ8_VNNI_INTRINSICS
  return _mm512_dpbusd_epi32(acc, u, s);
#else
  asm("vpdpbusd %[s], %[u], %[acc]" : [acc] "+v"(acc) : [u] "v"(u), [s] "v"(s));
  return acc;
#endif
}

// One super-block (SB): 64 code bytes = 16 lanes of 8 columns = 128 columns. R rows x TT tokens
// per pass; acc[r][t] += float(lane dots) * s_g * d_lane.
template <int R, int TT>
HWY_INLINE void Block(const uint8_t* const* qrow, const float* const* sc, const QuantQ8Acts& a, int64_t t0,
                      int group, __m512i tbl, float dc, float* y, int64_t ldy, int64_t r, const uint8_t* pf) {
  const int64_t nsb = a.cols / 128, half = a.cols / 2, lanes = a.cols / 8;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const __m512i ones = _mm512_set1_epi16(1);
  // Lane k's group relative to the SB's first group: 8k / group (every lane in one group when group >= 128).
  const __m512i rel = group >= 128 ? _mm512_setzero_si512()
                                   : _mm512_srli_epi32(_mm512_setr_epi32(0, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120),
                                                       group == 32 ? 5 : 6);
  __m512 acc[R][TT];
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < TT; ++t) acc[i][t] = _mm512_setzero_ps();
  for (int64_t j = 0; j < nsb; ++j) {
    if (pf != nullptr)
      for (int64_t k = 0; k < R * 64; k += 64) hwy::Prefetch(pf + j * R * 64 + k);
    const int64_t g0 = j * 128 / group;
    __m512i xe[TT], xo[TT], off[TT];
    __m512 dv[TT];
    for (int t = 0; t < TT; ++t) {
      const int64_t tt = t0 + t;
      xe[t] = _mm512_loadu_si512(a.even.data() + tt * half + 64 * j);
      xo[t] = _mm512_loadu_si512(a.odd.data() + tt * half + 64 * j);
      if constexpr (kVnni) off[t] = _mm512_loadu_si512(a.lane_sum.data() + tt * lanes + 16 * j);
      dv[t] = _mm512_loadu_ps(a.d.data() + tt * lanes + 16 * j);
    }
    for (int i = 0; i < R; ++i) {
      const __m512i v = _mm512_loadu_si512(qrow[i] + 64 * j);
      const __m512i cl = _mm512_shuffle_epi8(tbl, _mm512_and_si512(v, m4));
      const __m512i ch = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(v, 4), m4));
      const __m512 scv = _mm512_permutexvar_ps(rel, _mm512_loadu_ps(sc[i] + g0));
      if constexpr (kVnni) {
        // tbl holds c8 + 128 (unsigned): sum (c8 + 128) q - 128 sum q, the offset preloaded in off.
        for (int t = 0; t < TT; ++t) {
          const __m512i s = Dpbusd(Dpbusd(off[t], cl, xe[t]), ch, xo[t]);
          acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(scv, dv[t]), acc[i][t]);
        }
      } else {
        // tbl holds c8: |c8| (unsigned) against q with c8's sign; pairs <= 2 * 127 * 127 fit int16.
        const __m512i al = _mm512_abs_epi8(cl), ah = _mm512_abs_epi8(ch);
        const __mmask64 nl = _mm512_movepi8_mask(cl), nh = _mm512_movepi8_mask(ch);
        const __m512i z = _mm512_setzero_si512();
        for (int t = 0; t < TT; ++t) {
          const __m512i pl = _mm512_maddubs_epi16(al, _mm512_mask_sub_epi8(xe[t], nl, z, xe[t]));
          const __m512i ph = _mm512_maddubs_epi16(ah, _mm512_mask_sub_epi8(xo[t], nh, z, xo[t]));
          const __m512i s = _mm512_add_epi32(_mm512_madd_epi16(pl, ones), _mm512_madd_epi16(ph, ones));
          acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(scv, dv[t]), acc[i][t]);
        }
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < TT; ++t) y[(t0 + t) * ldy + r + i] = dc * _mm512_reduce_add_ps(acc[i][t]);
}

// q8 on the grid: 64 columns (64 code bytes) per step = 16 lanes of 4 columns. Lane k's int32 is
// dot(s, q) (s = code - 128): VNNI vpdpbusd of the unsigned codes minus 128 sum q, else the sign
// trick on s (|s| <= 128: pairs <= 2 * 128 * 127 fit int16); then t = 2 dot + sum q, and
// acc += float(t) * s_g * d (the lane's 8-column activation scale); y = acc / 64.
template <int R, int TT>
HWY_INLINE void BlockQ8(const uint8_t* const* qrow, const float* const* sc, const QuantQ8Acts& a, int64_t t0, int group,
                        float* y, int64_t ldy, int64_t r, const uint8_t* pf) {
  const int64_t nst = a.cols / 64, lanes8 = a.cols / 8, quads = a.cols / 4;
  const __m512i ones = _mm512_set1_epi16(1);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i rel = group == 32 ? _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1) : _mm512_setzero_si512();
  const __m512i pair = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  __m512 acc[R][TT];
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < TT; ++t) acc[i][t] = _mm512_setzero_ps();
  for (int64_t j = 0; j < nst; ++j) {
    if (pf != nullptr)
      for (int64_t k = 0; k < R * 64; k += 64) hwy::Prefetch(pf + j * R * 64 + k);
    const int64_t g0 = j * 64 / group;
    __m512i xq[TT], s4[TT];
    __m512 dv[TT];
    for (int t = 0; t < TT; ++t) {
      const int64_t tt = t0 + t;
      xq[t] = _mm512_loadu_si512(a.q.data() + tt * a.cols + 64 * j);
      s4[t] = _mm512_loadu_si512(a.quad_sum.data() + tt * quads + 16 * j);
      dv[t] = _mm512_permutexvar_ps(pair, _mm512_castps256_ps512(_mm256_loadu_ps(a.d.data() + tt * lanes8 + 8 * j)));
    }
    for (int i = 0; i < R; ++i) {
      const __m512i v = _mm512_loadu_si512(qrow[i] + 64 * j);
      const __m512 scv = _mm512_permutexvar_ps(rel, _mm512_loadu_ps(sc[i] + g0));
      for (int t = 0; t < TT; ++t) {
        __m512i d;
        if constexpr (kVnni) {
          d = Dpbusd(_mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s4[t], 7)), v, xq[t]);
        } else {
          const __m512i sv = _mm512_xor_si512(v, flip);
          const __mmask64 neg = _mm512_movepi8_mask(sv);
          const __m512i p = _mm512_maddubs_epi16(_mm512_abs_epi8(sv), _mm512_mask_sub_epi8(xq[t], neg, _mm512_setzero_si512(), xq[t]));
          d = _mm512_madd_epi16(p, ones);
        }
        const __m512i tq = _mm512_add_epi32(_mm512_slli_epi32(d, 1), s4[t]);
        acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(tq), _mm512_mul_ps(scv, dv[t]), acc[i][t]);
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < TT; ++t) y[(t0 + t) * ldy + r + i] = _mm512_reduce_add_ps(acc[i][t]) * (1.0f / 64.0f);
}

}  // namespace qq8x
#endif  // HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3

#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
namespace qq8x {

// int32 lanes += the sums of 4 products of unsigned bytes u and signed bytes s: AVX-VNNI's VEX-encoded
// vpdpbusd (the AVX2 target's flags do not enable the intrinsic; the caller checked the CPU).
HWY_INLINE __m256i DpbusdVex(__m256i acc, __m256i u, __m256i s) {
  asm("%{vex%} vpdpbusd %[s], %[u], %[acc]" : [acc] "+x"(acc) : [u] "x"(u), [s] "x"(s));
  return acc;
}

// One SB: 32 code bytes = 8 lanes = 64 columns; R rows x TT tokens (1 or 2: AVX2 has 16 registers;
// each decoded row serves TT tokens). kVnni: tbl holds c8 + 128 and the dots are vpdpbusd minus 128
// times the lane sums (as AVX-512 VNNI); else tbl holds c8 and the sign trick runs (the same int32
// lanes, so the same bits).
template <int R, int TT, bool kVnni>
HWY_INLINE void Block1(const uint8_t* const* qrow, const float* const* sc, const QuantQ8Acts& a, int64_t t0, int group,
                       __m256i tbl, float dc, float* y, int64_t ldy, int64_t r, const uint8_t* pf) {
  const int64_t nsb = a.cols / 64, half = a.cols / 2, lanes = a.cols / 8;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i rel = group >= 64 ? _mm256_setzero_si256() : _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
  __m256 acc[R][TT];
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < TT; ++t) acc[i][t] = _mm256_setzero_ps();
  for (int64_t j = 0; j < nsb; ++j) {
    if (pf != nullptr)
      for (int64_t k = 0; k < R * 32; k += 64) hwy::Prefetch(pf + j * R * 32 + k);
    const int64_t g0 = j * 64 / group;
    __m256i xe[TT], xo[TT], off[TT];
    __m256 dv[TT];
    for (int t = 0; t < TT; ++t) {
      xe[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.even.data() + (t0 + t) * half + 32 * j));
      xo[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.odd.data() + (t0 + t) * half + 32 * j));
      dv[t] = _mm256_loadu_ps(a.d.data() + (t0 + t) * lanes + 8 * j);
      if constexpr (kVnni) off[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.lane_sum.data() + (t0 + t) * lanes + 8 * j));
    }
    for (int i = 0; i < R; ++i) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qrow[i] + 32 * j));
      const __m256i cl = _mm256_shuffle_epi8(tbl, _mm256_and_si256(v, m4));
      const __m256i ch = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
      const __m256 scv = _mm256_permutevar8x32_ps(_mm256_loadu_ps(sc[i] + g0), rel);
      if constexpr (kVnni) {
        for (int t = 0; t < TT; ++t) {
          const __m256i s = DpbusdVex(DpbusdVex(off[t], cl, xe[t]), ch, xo[t]);
          acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(scv, dv[t]), acc[i][t]);
        }
      } else {
        const __m256i al = _mm256_abs_epi8(cl), ah = _mm256_abs_epi8(ch);
        for (int t = 0; t < TT; ++t) {
          const __m256i pl = _mm256_maddubs_epi16(al, _mm256_sign_epi8(xe[t], cl));
          const __m256i ph = _mm256_maddubs_epi16(ah, _mm256_sign_epi8(xo[t], ch));
          const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(pl, ones), _mm256_madd_epi16(ph, ones));
          acc[i][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(scv, dv[t]), acc[i][t]);
        }
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < TT; ++t) {
      __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[i][t]), _mm256_extractf128_ps(acc[i][t], 1));
      s = _mm_add_ps(s, _mm_movehl_ps(s, s));
      s = _mm_add_ss(s, _mm_movehdup_ps(s));
      y[(t0 + t) * ldy + r + i] = dc * _mm_cvtss_f32(s);
    }
}

// q8 on the grid (see BlockQ8 of AVX-512): 32 columns per step = 8 lanes of 4, one token; VEX
// vpdpbusd minus 128 sum q (kVnni) or the sign trick on code - 128.
template <int R, bool kVnni>
HWY_INLINE void BlockQ8One(const uint8_t* const* qrow, const float* const* sc, const QuantQ8Acts& a, int64_t t, int group,
                           float* y, int64_t ldy, int64_t r, const uint8_t* pf) {
  const int64_t nst = a.cols / 32;
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  const __m256i pair = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
  const int8_t* xq = a.q.data() + t * a.cols;
  const int32_t* s4p = a.quad_sum.data() + t * (a.cols / 4);
  const float* dp = a.d.data() + t * (a.cols / 8);
  __m256 acc[R];
  for (int i = 0; i < R; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t j = 0; j < nst; ++j) {
    if (pf != nullptr)
      for (int64_t k = 0; k < R * 32; k += 64) hwy::Prefetch(pf + j * R * 32 + k);
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * j));
    const __m256i s4 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s4p + 8 * j));
    const __m256 dv = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(dp + 4 * j)), pair);
    const int64_t g0 = j * 32 / group;  // (a 32-column step lies in one group)
    for (int i = 0; i < R; ++i) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qrow[i] + 32 * j));
      __m256i d;
      if constexpr (kVnni) {
        d = DpbusdVex(_mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(s4, 7)), v, x);
      } else {
        const __m256i sv = _mm256_xor_si256(v, flip);
        d = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(sv), _mm256_sign_epi8(x, sv)), ones);
      }
      const __m256i tq = _mm256_add_epi32(_mm256_slli_epi32(d, 1), s4);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(tq), _mm256_mul_ps(_mm256_set1_ps(sc[i][g0]), dv), acc[i]);
    }
  }
  for (int i = 0; i < R; ++i) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc[i]), _mm256_extractf128_ps(acc[i], 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    y[t * ldy + r + i] = _mm_cvtss_f32(s) * (1.0f / 64.0f);
  }
}

}  // namespace qq8x
#endif  // HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2

#if HWY_ARCH_ARM_A64 && HWY_TARGET == HWY_NEON  // (Advanced SIMD intrinsics; SVE targets take the scalar sums)
#define SPOOL_QQ8_NEON 1
namespace qq8n {

// The 4 int32 sums of 4 adjacent byte products of a and b (16 signed bytes each): vmull_s8 (|c8 q|
// <= 127 * 128 fits int16), then two pairwise widening adds. Baseline Armv8-A (no dot product
// extension): the same int32 lanes as vpdpbusd / vdotq_s32.
HWY_INLINE int32x4_t Dot4(int8x16_t a, int8x16_t b) {
  const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
  const int32x4_t hi = vpaddlq_s16(vmull_high_s8(a, b));
  return vpaddq_s32(lo, hi);
}

// q4: one step = 16 code bytes = 4 lanes of 8 columns = 32 columns (inside one group); R rows, one token.
template <int R>
HWY_INLINE void Block1(const uint8_t* const* qrow, const float* const* sc, const QuantQ8Acts& a, int64_t t, int group,
                       int8x16_t tbl, float dc, float* y, int64_t ldy, int64_t r) {
  const int64_t nst = a.cols / 32, half = a.cols / 2;
  const int8_t* even = a.even.data() + t * half;
  const int8_t* odd = a.odd.data() + t * half;
  const float* dp = a.d.data() + t * (a.cols / 8);
  float32x4_t acc[R];
  for (int i = 0; i < R; ++i) acc[i] = vdupq_n_f32(0.0f);
  for (int64_t j = 0; j < nst; ++j) {
    const int8x16_t xe = vld1q_s8(even + 16 * j), xo = vld1q_s8(odd + 16 * j);
    const float32x4_t dv = vld1q_f32(dp + 4 * j);
    const int64_t g = j * 32 / group;
    for (int i = 0; i < R; ++i) {
      const uint8x16_t v = vld1q_u8(qrow[i] + 16 * j);
      const int8x16_t cl = vqtbl1q_s8(tbl, vandq_u8(v, vdupq_n_u8(0x0F)));
      const int8x16_t ch = vqtbl1q_s8(tbl, vshrq_n_u8(v, 4));
      const int32x4_t s = vaddq_s32(Dot4(cl, xe), Dot4(ch, xo));
      acc[i] = vfmaq_f32(acc[i], vcvtq_f32_s32(s), vmulq_n_f32(dv, sc[i][g]));
    }
  }
  for (int i = 0; i < R; ++i) y[t * ldy + r + i] = dc * vaddvq_f32(acc[i]);
}

// q8 on the grid: one step = 16 code bytes = 4 quads of 4 columns; s = code - 128 (a signed byte),
// t = 2 dot(s, q) + sum q per quad, y = sum t s_g d / 64.
template <int R>
HWY_INLINE void BlockQ8One(const uint8_t* const* qrow, const float* const* sc, const QuantQ8Acts& a, int64_t t, int group,
                           float* y, int64_t ldy, int64_t r) {
  const int64_t nst = a.cols / 16;
  const int8_t* xq = a.q.data() + t * a.cols;
  const int32_t* s4p = a.quad_sum.data() + t * (a.cols / 4);
  const float* dp = a.d.data() + t * (a.cols / 8);
  float32x4_t acc[R];
  for (int i = 0; i < R; ++i) acc[i] = vdupq_n_f32(0.0f);
  for (int64_t j = 0; j < nst; ++j) {
    const int8x16_t x = vld1q_s8(xq + 16 * j);
    const int32x4_t s4 = vld1q_s32(s4p + 4 * j);
    const float32x2_t d2 = vld1_f32(dp + 2 * j);
    const float32x4_t dv = vcombine_f32(vdup_lane_f32(d2, 0), vdup_lane_f32(d2, 1));  // quads 2k, 2k+1 share lane k's d
    const int64_t g = j * 16 / group;
    for (int i = 0; i < R; ++i) {
      const int8x16_t sv = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(qrow[i] + 16 * j), vdupq_n_u8(0x80)));
      const int32x4_t tq = vaddq_s32(vshlq_n_s32(Dot4(sv, x), 1), s4);
      acc[i] = vfmaq_f32(acc[i], vcvtq_f32_s32(tq), vmulq_n_f32(dv, sc[i][g]));
    }
  }
  for (int i = 0; i < R; ++i) y[t * ldy + r + i] = vaddvq_f32(acc[i]) * (1.0f / 64.0f);
}

}  // namespace qq8n
#else
#define SPOOL_QQ8_NEON 0
#endif

// Scalar sums (targets without SIMD kernels): per lane the exact integer dot, then the f32 rescale.
void RowsScalar(const QuantView& w, const QuantQ8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (w.type == QType::kQ8) {
    std::vector<float> sc(static_cast<size_t>(w.groups_per_row() + 16));
    for (int64_t r = r0; r < r1; ++r) {
      RowScales(w, r, sc.data());
      const uint8_t* row = w.qweight + r * w.row_bytes();
      for (int64_t t = 0; t < a.T; ++t) {
        float acc = 0.0f;
        for (int64_t j = 0; j < a.cols / 4; ++j)
          acc += static_cast<float>(qq8::q8_quad(row, a.q.data() + t * a.cols, j)) *
                 (sc[static_cast<size_t>(j * 4 / w.group)] * a.d[static_cast<size_t>(t * (a.cols / 8) + j / 2)]);
        y[t * ldy + r] = acc * (1.0f / 64.0f);
      }
    }
    return;
  }
  const qq8::Codebook8 cb = qq8::codebook8(w);
  const int64_t rb = w.row_bytes(), half = a.cols / 2, lanes = a.cols / 8;
  std::vector<float> sc(static_cast<size_t>(w.groups_per_row() + 16));
  for (int64_t r = r0; r < r1; ++r) {
    RowScales(w, r, sc.data());
    const uint8_t* row = w.qweight + r * rb;
    for (int64_t t = 0; t < a.T; ++t) {
      float acc = 0.0f;
      for (int64_t i = 0; i < lanes; ++i) {
        const int32_t s = qq8::lane_dot(cb, row, a.even.data() + t * half, a.odd.data() + t * half, i);
        acc += static_cast<float>(s) * (sc[static_cast<size_t>(i * 8 / w.group)] * a.d[static_cast<size_t>(t * lanes + i)]);
      }
      y[t * ldy + r] = cb.dc * acc;
    }
  }
}

void Rows(const QuantView& w, const QuantQ8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
#if SPOOL_QQ8_NEON
  const qq8::Codebook8 cb = w.type == QType::kQ4 ? qq8::codebook8(w) : qq8::Codebook8{};
  const int8x16_t tbl = vld1q_s8(cb.c8);
  const int64_t rb = w.row_bytes(), ng = w.groups_per_row();
  constexpr int kR = 4;
  thread_local std::vector<float> scales;
  if (scales.size() < static_cast<size_t>(kR * (ng + 16))) scales.resize(static_cast<size_t>(kR * (ng + 16)));  // grow only
  const uint8_t* qrow[kR];
  const float* sc[kR];
  auto block = [&](auto rows, int64_t r) {
    constexpr int R = decltype(rows)::value;
    for (int i = 0; i < R; ++i) {
      qrow[i] = w.qweight + (r + i) * rb;
      float* s = scales.data() + i * (ng + 16);
      RowScales(w, r + i, s);
      sc[i] = s;
    }
    for (int64_t t = 0; t < a.T; ++t) {
      if (w.type == QType::kQ8) qq8n::BlockQ8One<R>(qrow, sc, a, t, w.group, y, ldy, r);
      else qq8n::Block1<R>(qrow, sc, a, t, w.group, tbl, cb.dc, y, ldy, r);
    }
  };
  int64_t r = r0;
  for (; r + kR <= r1; r += kR) block(std::integral_constant<int, kR>{}, r);
  for (; r < r1; ++r) block(std::integral_constant<int, 1>{}, r);
#elif HWY_ARCH_X86 && (HWY_TARGET <= HWY_AVX3 || HWY_TARGET == HWY_AVX2)
  const qq8::Codebook8 cb = w.type == QType::kQ4 ? qq8::codebook8(w) : qq8::Codebook8{};
  // AVX2: AVX-VNNI where the CPU has it and q8_allow_dot_extension() allows it (ggml_q8's check).
  [[maybe_unused]] const bool vnni = HWY_TARGET == HWY_AVX2 && std::strcmp(q8_variant(), "avx2-vnni") == 0;
  const int64_t rb = w.row_bytes(), ng = w.groups_per_row();
  constexpr int kR = 4;
  thread_local std::vector<float> scales;
  if (scales.size() < static_cast<size_t>(kR * (ng + 16))) scales.resize(static_cast<size_t>(kR * (ng + 16)));  // grow only
  const uint8_t* qrow[kR];
  const float* sc[kR];
  // Prefetch whole blocks ~8 KiB ahead (at least one block), as the f32 decode kernel does.
  const int64_t pf_blocks = std::max<int64_t>(1, 8192 / (kR * rb));
  auto block = [&](auto rows, int64_t r) {
    constexpr int R = decltype(rows)::value;
    for (int i = 0; i < R; ++i) {
      qrow[i] = w.qweight + (r + i) * rb;
      float* s = scales.data() + i * (ng + 16);
      RowScales(w, r + i, s);
      sc[i] = s;
    }
    const int64_t rp = r + R * pf_blocks;
    const uint8_t* pf = rp + R <= w.rows ? w.qweight + rp * rb : nullptr;
    if (w.type == QType::kQ8) {
#if HWY_TARGET <= HWY_AVX3
      int64_t t = 0;
      for (; t + 4 <= a.T; t += 4) qq8x::BlockQ8<R, 4>(qrow, sc, a, t, w.group, y, ldy, r, pf);
      for (; t + 2 <= a.T; t += 2) qq8x::BlockQ8<R, 2>(qrow, sc, a, t, w.group, y, ldy, r, pf);
      for (; t < a.T; ++t) qq8x::BlockQ8<R, 1>(qrow, sc, a, t, w.group, y, ldy, r, pf);
#else
      for (int64_t t = 0; t < a.T; ++t) {
        if (vnni) qq8x::BlockQ8One<R, true>(qrow, sc, a, t, w.group, y, ldy, r, pf);
        else qq8x::BlockQ8One<R, false>(qrow, sc, a, t, w.group, y, ldy, r, pf);
      }
#endif
      return;
    }
#if HWY_TARGET <= HWY_AVX3
    alignas(16) int8_t t8[16];
    for (int k = 0; k < 16; ++k) t8[k] = qq8x::kVnni ? static_cast<int8_t>(cb.c8[k] ^ 0x80) : cb.c8[k];  // c8 + 128 as u8
    const __m512i tbl = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(t8)));
    int64_t t = 0;
    for (; t + 4 <= a.T; t += 4) qq8x::Block<R, 4>(qrow, sc, a, t, w.group, tbl, cb.dc, y, ldy, r, pf);
    for (; t + 2 <= a.T; t += 2) qq8x::Block<R, 2>(qrow, sc, a, t, w.group, tbl, cb.dc, y, ldy, r, pf);
    for (; t < a.T; ++t) qq8x::Block<R, 1>(qrow, sc, a, t, w.group, tbl, cb.dc, y, ldy, r, pf);
#else
    alignas(16) int8_t t8[16];
    for (int k = 0; k < 16; ++k) t8[k] = vnni ? static_cast<int8_t>(cb.c8[k] ^ 0x80) : cb.c8[k];  // c8 + 128 as u8
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(t8)));
    int64_t t = 0;
    for (; t + 2 <= a.T; t += 2) {
      if (vnni) qq8x::Block1<R, 2, true>(qrow, sc, a, t, w.group, tbl, cb.dc, y, ldy, r, pf);
      else qq8x::Block1<R, 2, false>(qrow, sc, a, t, w.group, tbl, cb.dc, y, ldy, r, pf);
    }
    for (; t < a.T; ++t) {
      if (vnni) qq8x::Block1<R, 1, true>(qrow, sc, a, t, w.group, tbl, cb.dc, y, ldy, r, pf);
      else qq8x::Block1<R, 1, false>(qrow, sc, a, t, w.group, tbl, cb.dc, y, ldy, r, pf);
    }
#endif
  };
  int64_t r = r0;
  for (; r + kR <= r1; r += kR) block(std::integral_constant<int, kR>{}, r);
  for (; r < r1; ++r) block(std::integral_constant<int, 1>{}, r);
#else
  RowsScalar(w, a, y, ldy, r0, r1);
#endif
}

const char* Variant() {
#if SPOOL_QQ8_NEON
  return "neon";
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3_DL
  return "avx512vnni";
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return "avx512bw";
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  return std::strcmp(q8_variant(), "avx2-vnni") == 0 ? "avx2-vnni" : "avx2";
#else
  return "scalar";
#endif
}

bool Fast() {
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2) || SPOOL_QQ8_NEON
  return true;
#else
  return false;
#endif
}


}  // namespace HWY_NAMESPACE
}  // namespace spool::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace spool::ops {

HWY_EXPORT(Rows);
HWY_EXPORT(Fast);
HWY_EXPORT(Variant);

void quant_q8_prepare(const float* x_rot, int64_t T, int64_t cols, QuantQ8Acts& a) {
  if (T < 0 || cols <= 0 || cols % qq8::kColumns != 0)
    fail("quant_q8_prepare: %lld columns (must be a positive multiple of %lld), %lld tokens", static_cast<long long>(cols),
         static_cast<long long>(qq8::kColumns), static_cast<long long>(T));
  a.T = T;
  a.cols = cols;
  const int64_t half = cols / 2, lanes = cols / qq8::kLane;
  const auto grow = [](auto& v, int64_t n) {
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  };
  grow(a.even, T * half);
  grow(a.odd, T * half);
  grow(a.lane_sum, T * lanes);
  grow(a.d, T * lanes);
  grow(a.q, T * cols);
  grow(a.quad_sum, T * cols / 4);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < lanes; ++i) {
      const float* x = x_rot + t * cols + qq8::kLane * i;
      float amax = 0.0f;
      bool finite = true;
      for (int64_t k = 0; k < qq8::kLane; ++k) {
        finite = finite && std::isfinite(x[k]);
        amax = std::max(amax, std::fabs(x[k]));
      }
      const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
      int8_t q[qq8::kLane] = {};
      int32_t sum = 0;
      if (finite && std::isfinite(inv))
        for (int64_t k = 0; k < qq8::kLane; ++k) {
          // Round half to even without a libm call (this code is built for the baseline target): adding
          // and subtracting 1.5 * 2^23 leaves the nearest integer for |v| <= 2^22 (here |v| <= 127).
          const float v = x[k] * inv;
          q[k] = static_cast<int8_t>(static_cast<int>((v + 12582912.0f) - 12582912.0f));
          sum += q[k];
        }
      a.d[static_cast<size_t>(t * lanes + i)] = !finite ? std::nanf("") : std::isfinite(inv) ? amax / 127.0f : 0.0f;
      for (int64_t b = 0; b < 4; ++b) {
        a.even[static_cast<size_t>(t * half + 4 * i + b)] = q[2 * b];
        a.odd[static_cast<size_t>(t * half + 4 * i + b)] = q[2 * b + 1];
      }
      std::copy_n(q, qq8::kLane, a.q.data() + t * cols + qq8::kLane * i);
      for (int64_t h = 0; h < 2; ++h)
        a.quad_sum[static_cast<size_t>(t * cols / 4 + 2 * i + h)] = q[4 * h] + q[4 * h + 1] + q[4 * h + 2] + q[4 * h + 3];
      a.lane_sum[static_cast<size_t>(t * lanes + i)] = -128 * sum;
    }
}

bool quant_q8_supported(const QuantView& w) {
  return (w.type == QType::kQ4 || (w.type == QType::kQ8 && w.codebook != nullptr && qq8::q8_on_grid(w))) && w.cols > 0 &&
         w.cols % qq8::kColumns == 0 && (w.group == 32 || w.group == 64 || w.group == 128 || w.group == w.cols);
}

bool quant_q8_fast() { return HWY_DYNAMIC_DISPATCH(Fast)(); }
const char* quant_q8_variant() { return HWY_DYNAMIC_DISPATCH(Variant)(); }
// The same CPUs as the GGUF int8 kernels' auto (x86 AVX2 / AVX-512, measured faster there for both;
// not NEON: no aarch64 machine measured yet).
bool quant_q8_auto() { return q8_auto(); }

namespace {
void check(const QuantView& w, const QuantQ8Acts& a, int64_t r0, int64_t r1) {
  validate(w);
  if (!quant_q8_supported(w))
    fail("quant_q8_matmul: a q4 matrix, or a q8 one on the format's grid, with a multiple of 128 columns is needed (got type %d, %lld columns)",
         static_cast<int>(w.type), static_cast<long long>(w.cols));
  if (a.cols != w.cols)
    fail("quant_q8_matmul: activations of %lld columns for a matrix of %lld", static_cast<long long>(a.cols),
         static_cast<long long>(w.cols));
  const auto short_of = [&](size_t have, int64_t per_token) { return a.T < 0 || static_cast<int64_t>(have) < a.T * per_token; };
  if (short_of(a.even.size(), a.cols / 2) || short_of(a.odd.size(), a.cols / 2) || short_of(a.lane_sum.size(), a.cols / 8) ||
      short_of(a.d.size(), a.cols / 8) || short_of(a.q.size(), a.cols) || short_of(a.quad_sum.size(), a.cols / 4))
    fail("quant_q8_matmul: activations of %lld tokens x %lld columns hold fewer codes or scales than that (not from quant_q8_prepare)",
         static_cast<long long>(a.T), static_cast<long long>(a.cols));
  if (r0 < 0 || r0 > r1 || r1 > w.rows)
    fail("quant_q8_matmul: rows [%lld, %lld) outside [0, %lld)", static_cast<long long>(r0), static_cast<long long>(r1),
         static_cast<long long>(w.rows));
}
}  // namespace

void quant_q8_matmul_rows(const QuantView& w, const QuantQ8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  check(w, a, r0, r1);
  if (r0 == r1 || a.T == 0) return;
  HWY_DYNAMIC_DISPATCH(Rows)(w, a, y, ldy, r0, r1);
}

void quant_q8_matmul_reference(const QuantView& w, const QuantQ8Acts& a, float* y) {
  check(w, a, 0, w.rows);
  if (w.type == QType::kQ8) {
    const int64_t rb = w.row_bytes(), ng = w.groups_per_row();
    for (int64_t r = 0; r < w.rows; ++r)
      for (int64_t t = 0; t < a.T; ++t) {
        double acc = 0;
        for (int64_t j = 0; j < a.cols / 4; ++j)
          acc += static_cast<double>(qq8::q8_quad(w.qweight + r * rb, a.q.data() + t * a.cols, j)) * w.scale(r * ng + j * 4 / w.group) *
                 a.d[static_cast<size_t>(t * (a.cols / 8) + j / 2)];
        y[t * w.rows + r] = static_cast<float>(acc / 64.0);
      }
    return;
  }
  const qq8::Codebook8 cb = qq8::codebook8(w);
  const int64_t rb = w.row_bytes(), ng = w.groups_per_row(), half = a.cols / 2, lanes = a.cols / 8;
  for (int64_t r = 0; r < w.rows; ++r)
    for (int64_t t = 0; t < a.T; ++t) {
      double acc = 0;
      for (int64_t i = 0; i < lanes; ++i)
        acc += static_cast<double>(qq8::lane_dot(cb, w.qweight + r * rb, a.even.data() + t * half, a.odd.data() + t * half, i)) *
               w.scale(r * ng + i * 8 / w.group) * a.d[static_cast<size_t>(t * lanes + i)];
      y[t * w.rows + r] = static_cast<float>(static_cast<double>(cb.dc) * acc);
    }
}

}  // namespace spool::ops
#endif  // HWY_ONCE
