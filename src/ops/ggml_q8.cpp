// Int8-activation kernels for Q4_K / Q6_K (see ggml_q8.h): activation quantization, a scalar
// reference (compiled once) and AVX-512 kernels (compiled per Highway target; AVX3 without and
// AVX3_DL with VNNI, other targets use the scalar sums).
//
// Kernel design. A weight block (256 columns) is decoded into a Block8: its codes as unsigned
// bytes in column order (4 vectors of 64: Q4_K's nibbles and Q6_K's low / high bit planes are
// rearranged with byte masks, 16-bit shifts and 128-bit lane shuffles), the int16 scale of each
// column pair's sub-block (4 vectors of 32 lanes, matching vpmaddubsw's output), the block scale
// d and a 16-lane f32 vector c of the format's per-16-column offset (Q4_K: -dmin * min of the
// sub-block; Q6_K: -32 * d * scale, the codes' bias), applied as c * bs (bs = d_a * the
// activation codes' sums per 16 columns).
// Decode (T = 1): 4 rows at a time straight from the weights (prefetched 32 KiB ahead); one
// token's dot is 4 x (vpmaddubsw, vpdpwssd) into int32 lanes, then
// acc += float(lanes) * (d * d_a) + c * bs. Q4_K dots its codes in nibble order against the
// activations' copy in that order (Q8Acts::q_k4): no lane shuffles per weight block (measured
// 5.3 -> 3.7 ns per block, L2-resident, one core), and its packed 6-bit scales unpack in SSE.
// Prefill (T >= 2): the activations are stored interleaved (Q8Acts) so that each 32-bit lane of
// a 64-byte vector holds 4 columns of one 16-column group; 4 rows x 4 blocks are decoded into a
// PanelBlock panel (codes interleaved the same way, f32 group scales d * s) once per tile of 64
// tokens, and a 4-row x 4-token register tile runs 4 vpdpbusd per block, row and token (16
// independent int32 chains), then acc += float(lanes) * (d s) * d_a + c * bs once per block.
// Q4_K prefill merges pairs of blocks into 32-column sub-block lanes (PairMerge: its scales change
// every 32 columns), so that rescale runs once per two blocks. The tiles keep each activation
// vector in a register across the rows (KeepInRegister): GCC otherwise folds its load into every
// vpdpbusd, and the loads, not the multiplies, bound the loop. Measured on one core of the
// 2-vCPU Xeon VM (CPU time, 3 interleaved rounds, quant_bench BM_GgmlQ8Gemm): Q4_K 1.16x
// (512 x 2048, 16 tokens), 1.23x (2048 x 512, 16 tokens), 1.33x (2048 x 2048, 512 tokens).
#include <cstdint>
#define HWY_WANT_AVX3_DL  // this file's kernels use VNNI where the CPU has it (before highway.h)
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/ggml_q8.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/aligned_allocator.h>
#include <hwy/cache_control.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/error.h"
#include "ops/ggml_q8.h"
#include "ops/ggml_q8_panel.h"
#include "ops/ggml_scales.h"
#include "ops/weights.h"
#if HWY_ARCH_X86
#include <cpuid.h>
#endif

// ---- Target-independent part (compiled once) ----
#ifndef SPOOL_OPS_GGML_Q8_SHARED
#define SPOOL_OPS_GGML_Q8_SHARED
namespace spool::ops::q8 {

/// f16 at p (unaligned).
inline float load_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

/// One output, from the format's definition: per sub-block the exact integer dot of weight codes
/// and activation codes, then the scales in double. Q4_K: w = d sc q - dmin m (8 sub-blocks of
/// 32); Q6_K: w = d sc (q - 32) (16 sub-blocks of 16). Rows of w at `row`, token t of a.
inline double dot_row(GgmlType t, const uint8_t* row, const Q8Acts& a, int64_t tok) {
  const int64_t nb = a.blocks();
  const size_t bsz = ggml_type_traits(t).size;
  double sum = 0;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* p = row + b * bsz;
    const int8_t* qb = a.q.data() + tok * a.cols + b * kQ8Block;
    int qa[kQ8Block];  // codes in column order
    for (int64_t c = 0; c < kQ8Block; ++c) qa[c] = qb[a.interleaved ? q8_pos(c) : c];
    const double da = a.d[tok * nb + b];
    int codes[kQ8Block];
    if (t == GgmlType::Q4_K) {
      const double d = load_half(p), dmin = load_half(p + 2);
      const uint8_t* qs = p + 16;
      for (int j = 0; j < 4; ++j)
        for (int l = 0; l < 32; ++l) {
          codes[64 * j + l] = qs[32 * j + l] & 0xF;
          codes[64 * j + 32 + l] = qs[32 * j + l] >> 4;
        }
      for (int s = 0; s < 8; ++s) {
        int sc, mn;
        ggml::scale_min_k4(s, p + 4, &sc, &mn);
        int64_t dot = 0, asum = 0;
        for (int c = 32 * s; c < 32 * s + 32; ++c) {
          dot += codes[c] * qa[c];
          asum += qa[c];
        }
        sum += da * (d * sc * static_cast<double>(dot) - dmin * mn * static_cast<double>(asum));
      }
    } else {  // Q6_K
      const uint8_t *ql = p, *qh = p + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
      const double d = load_half(p + 208);
      for (int h = 0; h < 2; ++h)
        for (int l = 0; l < 32; ++l) {
          const uint8_t hb = qh[32 * h + l];
          codes[128 * h + l] = (ql[64 * h + l] & 0xF) | ((hb & 3) << 4);
          codes[128 * h + 32 + l] = (ql[64 * h + 32 + l] & 0xF) | (((hb >> 2) & 3) << 4);
          codes[128 * h + 64 + l] = (ql[64 * h + l] >> 4) | (((hb >> 4) & 3) << 4);
          codes[128 * h + 96 + l] = (ql[64 * h + 32 + l] >> 4) | (((hb >> 6) & 3) << 4);
        }
      for (int s = 0; s < 16; ++s) {
        int64_t dot = 0;
        for (int c = 16 * s; c < 16 * s + 16; ++c) dot += (codes[c] - 32) * qa[c];
        sum += da * d * sc[s] * static_cast<double>(dot);
      }
    }
  }
  return sum;
}

/// Scalar ggml_q8_matmul_rows (targets without the SIMD kernels, and the reference).
inline void rows_scalar(const GgmlView& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t t = 0; t < a.T; ++t) y[t * ldy + r] = static_cast<float>(dot_row(w.type, w.data + r * w.row_bytes(), a, t));
}

/// One block of q8_quantize_reference: x [256] -> q (column order or interleaved), d, bs [16].
inline void quantize_block(const float* x, int8_t* q, float* d, float* bs, bool interleaved) {
  float amax = 0;
  bool finite = true;
  for (int64_t c = 0; c < kQ8Block; ++c) {
    amax = std::max(amax, std::fabs(x[c]));
    finite = finite && std::isfinite(x[c]);
  }
  float id = amax > 0 ? 127.0f / amax : 0.0f;
  *d = amax / 127.0f;
  if (!finite || !std::isfinite(id)) {  // NaN / inf: d = NaN, codes 0; a max below ~3.7e-37: zeros
    *d = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    id = 0.0f;
  }
  for (int g = 0; g < 16; ++g) {
    int sum = 0;
    for (int c = 16 * g; c < 16 * g + 16; ++c) {
      const int v = static_cast<int>(std::nearbyint(x[c] * id));
      q[interleaved ? q8_pos(c) : c] = static_cast<int8_t>(v);
      sum += v;
    }
    bs[g] = *d * static_cast<float>(sum);
  }
}

/// q8_quantize's definition for all tokens (the reference, and targets without the SIMD one).
inline void quantize_scalar(const float* x, int64_t T, int64_t cols, Q8Acts& a) {
  const int64_t nb = cols / kQ8Block;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < nb; ++b)
      quantize_block(x + t * cols + b * kQ8Block, a.q.data() + t * cols + b * kQ8Block, &a.d[t * nb + b],
                     &a.bs[(t * nb + b) * 16], a.interleaved);
  if (T == 1)
    for (int64_t c = 0; c < cols; ++c) a.q_k4[(c / kQ8Block) * kQ8Block + q8_pos_k4(c % kQ8Block)] = a.q[c];
}

}  // namespace spool::ops::q8
#endif  // SPOOL_OPS_GGML_Q8_SHARED

// ---- Per-target kernels ----
HWY_BEFORE_NAMESPACE();
namespace spool::ops {
namespace HWY_NAMESPACE {

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#if HWY_TARGET <= HWY_AVX3_DL && !HWY_COMPILER_CLANG
// Highway 1.0.3's AVX3_DL target string names "avxvnni" (the VEX form) rather than "avx512vnni";
// the target's runtime check does require AVX-512 VNNI (every AVX3_DL CPU has it), so the rest of
// this target's functions may use its intrinsics (HWY_AFTER_NAMESPACE pops this).
#pragma GCC target("avx512vnni")
#define SPOOL_Q8_VNNI_INTRINSICS 1
#else
#define SPOOL_Q8_VNNI_INTRINSICS 0
#endif
namespace q8k {

// int32 lanes += the int16 pair products of a and b.
HWY_INLINE __m512i Dpwssd(__m512i acc, __m512i a, __m512i b) {
#if HWY_TARGET <= HWY_AVX3_DL
  // AVX-512 VNNI vpdpwssd. Highway 1.0.3's AVX3_DL target string names "avxvnni" (the VEX form)
  // rather than "avx512vnni", so the intrinsic does not compile here; its runtime check of the
  // target does require AVX-512 VNNI.
  asm("vpdpwssd %[b], %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a), [b] "v"(b));
  return acc;
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(a, b));
#endif
}

// int32 lanes += the sums of 4 products of unsigned bytes u and signed bytes s.
HWY_INLINE __m512i Dpbusd(__m512i acc, __m512i u, __m512i s) {
#if SPOOL_Q8_VNNI_INTRINSICS
  return _mm512_dpbusd_epi32(acc, u, s);
#elif HWY_TARGET <= HWY_AVX3_DL
  asm("vpdpbusd %[s], %[u], %[acc]" : [acc] "+v"(acc) : [u] "v"(u), [s] "v"(s));  // (see Dpwssd)
  return acc;
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}

// Makes v a register value here (an empty asm that "changes" it): the compiler cannot re-read it
// from memory at each use. In the register tiles, without this GCC folds an activation load into
// every vpdpbusd (R loads per vector instead of one: load-port bound, 1.25 loads per vpdpbusd).
HWY_INLINE void KeepInRegister(__m512i& v) { asm("" : "+v"(v)); }

// 4 vectors of a block in column order -> interleaved (Q8Acts): 32-bit lane g of vector k takes
// lane 4 (g % 4) + k of vector g / 4. A dword transpose inside each vector (4 x 4 over its
// 128-bit lanes), then a 4 x 4 transpose of 128-bit lanes across the vectors.
HWY_INLINE void Interleave(__m512i v[4]) {
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  __m512i x[4];
  for (int i = 0; i < 4; ++i) x[i] = _mm512_permutexvar_epi32(idx, v[i]);
  const __m512i p = _mm512_shuffle_i64x2(x[0], x[1], _MM_SHUFFLE(1, 0, 1, 0)), q = _mm512_shuffle_i64x2(x[0], x[1], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512i r = _mm512_shuffle_i64x2(x[2], x[3], _MM_SHUFFLE(1, 0, 1, 0)), s = _mm512_shuffle_i64x2(x[2], x[3], _MM_SHUFFLE(3, 2, 3, 2));
  v[0] = _mm512_shuffle_i64x2(p, r, _MM_SHUFFLE(2, 0, 2, 0));
  v[1] = _mm512_shuffle_i64x2(p, r, _MM_SHUFFLE(3, 1, 3, 1));
  v[2] = _mm512_shuffle_i64x2(q, s, _MM_SHUFFLE(2, 0, 2, 0));
  v[3] = _mm512_shuffle_i64x2(q, s, _MM_SHUFFLE(3, 1, 3, 1));
}

HWY_INLINE float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// One weight block decoded for int8 dots (see the file comment).
// Decode: q in column order; DecodeGemv: in the order of the activations the one-token kernel
// reads (Q4_K: nibble order, Q8Acts::q_k4; Q6_K: column order). s follows q's order.
struct Block8 {
  __m512i q[4];  // codes, unsigned bytes: vector k = columns 64k .. 64k + 63 in column order
  __m512i s[4];  // int16 scale of the sub-block of the column pair in bytes (2i, 2i + 1) of vector k, lane i
  __m512 c;      // per 16 columns: offset coefficient, multiplied by bs
  __m512i g;     // per 16 columns: the sub-block scale (int32)
  float d;       // block scale of the integer dots
};

// A weight block in a prefill panel: codes interleaved as the activations (Q8Acts), and per
// 16-column group g the f32 scale d * (the group's sub-block scale), exact (11 x 8 bits).
struct PanelBlock {
  __m512i q[4];
  __m512 sd;
  __m512 c;
};

// Lane i of vector k takes scale (k * 64 + 2 i) / G of a 16-lane int16 vector (G = sub-block
// columns: 32 for Q4_K, 16 for Q6_K): vpermw indices.
template <int G>
struct ScaleIdx {
  alignas(64) int16_t v[4][32];
  constexpr ScaleIdx() : v() {
    for (int k = 0; k < 4; ++k)
      for (int i = 0; i < 32; ++i) v[k][i] = static_cast<int16_t>((k * 64 + 2 * i) / G);
  }
};
template <int G>
inline constexpr ScaleIdx<G> kScaleIdx{};
template <int G>
HWY_INLINE __m512i ScaleIndex(int k) {
  return _mm512_load_si512(kScaleIdx<G>.v[k]);
}

template <GgmlType Q>
struct Format;

// Lane i of vector k = 2 h + e in Q4_K nibble order (Q8Acts::q_k4) takes sub-block scale
// 4 h + e (i < 16) or 4 h + 2 + e (i >= 16): vpermw indices.
struct ScaleIdxK4 {
  alignas(64) int16_t v[4][32];
  constexpr ScaleIdxK4() : v() {
    for (int k = 0; k < 4; ++k)
      for (int i = 0; i < 32; ++i) v[k][i] = static_cast<int16_t>(4 * (k / 2) + k % 2 + (i >= 16 ? 2 : 0));
  }
};
inline constexpr ScaleIdxK4 kScaleIdxK4{};

// The 12 packed scale bytes at q -> bytes 0..7 scales, 8..15 mins (ggml::unpack_k4_scales in
// vector form: the 16-byte load stays inside the 144-byte block).
HWY_INLINE __m128i UnpackK4Scales(const uint8_t* HWY_RESTRICT q) {
  const __m128i u = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));  // dwords u0 u1 u2 (u3 unused)
  const __m128i lo_src = _mm_shuffle_epi32(u, _MM_SHUFFLE(2, 1, 2, 0));     // u0 u2 u1 u2
  const __m128i hi_src = _mm_shuffle_epi32(u, _MM_SHUFFLE(1, 1, 0, 0));     // - u0 - u1
  const __m128i lo = _mm_and_si128(_mm_srlv_epi32(lo_src, _mm_setr_epi32(0, 0, 0, 4)),
                                   _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
  const __m128i hi = _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(hi_src, 6), _mm_setr_epi32(0, 0x03030303, 0, 0x03030303)), 4);
  return _mm_or_si128(lo, hi);
}

template <>
struct Format<GgmlType::Q4_K> {
  static constexpr int64_t kBytes = 144;
  static constexpr bool kK4Order = true;  // DecodeGemv's codes are in Q8Acts::q_k4's order
  // Column order (the prefill panel).
  HWY_INLINE static void Decode(const uint8_t* HWY_RESTRICT p, Block8& b) {
    DecodeGemv(p, b);
    for (int h = 0; h < 2; ++h) {  // the nibble-order halves regrouped into column order
      const __m512i lo = b.q[2 * h], hi = b.q[2 * h + 1];
      b.q[2 * h] = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(1, 0, 1, 0));
      b.q[2 * h + 1] = _mm512_shuffle_i64x2(lo, hi, _MM_SHUFFLE(3, 2, 3, 2));
    }
    const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(UnpackK4Scales(p + 4)));
    for (int k = 0; k < 4; ++k) b.s[k] = _mm512_permutexvar_epi16(ScaleIndex<32>(k), sc);
  }
  // Q4_K nibble order (one token): qs bytes 64h .. 64h + 63, low nibbles = columns 128h +
  // [0, 32) and [64, 96), high nibbles = [32, 64) and [96, 128).
  HWY_INLINE static void DecodeGemv(const uint8_t* HWY_RESTRICT p, Block8& b) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int h = 0; h < 2; ++h) {
      const __m512i z = _mm512_loadu_si512(p + 16 + 64 * h);
      b.q[2 * h] = _mm512_and_si512(z, m4);
      b.q[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
    }
    const __m128i v = UnpackK4Scales(p + 4);  // scales 0..7, mins 0..7
    const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(v));
    for (int k = 0; k < 4; ++k) b.s[k] = _mm512_permutexvar_epi16(_mm512_load_si512(kScaleIdxK4.v[k]), sc);
    b.g = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(v, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)));
    // min of sub-block g / 2 for each 16 columns g
    const __m128i mins = _mm_shuffle_epi8(v, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15));
    b.c = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mins)), _mm512_set1_ps(-Half(p + 2)));
    b.d = Half(p);
  }
};

template <>
struct Format<GgmlType::Q6_K> {
  static constexpr int64_t kBytes = 210;
  static constexpr bool kK4Order = false;  // column order for both kernels
  HWY_INLINE static void DecodeGemv(const uint8_t* HWY_RESTRICT p, Block8& b) { Decode(p, b); }
  HWY_INLINE static void Decode(const uint8_t* HWY_RESTRICT p, Block8& b) {
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    // qh bit pairs to bits 4-5: columns 128h + [0, 32) take bits 0-1 (<< 4), [32, 64) bits 2-3
    // (<< 2), [64, 96) bits 4-5, [96, 128) bits 6-7 (>> 2); 16-bit shifts, the spill across
    // bytes masked off.
    const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    for (int h = 0; h < 2; ++h) {
      const __m512i l = _mm512_loadu_si512(p + 64 * h);  // ql: columns [0, 64) low, [64, 128) high nibbles
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * h)));
      b.q[2 * h] = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, shl), m30));
      b.q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                       _mm512_and_si512(_mm512_srlv_epi16(qh, shr), m30));
    }
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192));
    const __m512i sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(sc8));
    for (int k = 0; k < 4; ++k) b.s[k] = _mm512_permutexvar_epi16(ScaleIndex<16>(k), sc);
    b.g = _mm512_cvtepi8_epi32(sc8);
    b.d = Half(p + 208);
    b.c = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc8)), _mm512_set1_ps(-32.0f * b.d));
  }
};

// acc += the block's dot with one token's activation block (codes qa [256], scale da, sums bs [16]).
HWY_INLINE __m512 Dot(const Block8& b, const int8_t* HWY_RESTRICT qa, float da, const float* HWY_RESTRICT bs, __m512 acc) {
  __m512i s = _mm512_setzero_si512();
  for (int k = 0; k < 4; ++k) s = Dpwssd(s, _mm512_maddubs_epi16(b.q[k], _mm512_loadu_si512(qa + 64 * k)), b.s[k]);
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(b.d * da), acc);
  return _mm512_fmadd_ps(b.c, _mm512_loadu_ps(bs), acc);
}

constexpr int64_t kTokenTile = 64;       // tokens per pass over a row group (activations in L2)
constexpr int64_t kSegBlocks = 4;        // blocks per panel segment: 4 rows x 4 blocks of Block8 in L1
constexpr int kRows = 4;                 // rows per decode / panel group
constexpr int kPanelTok = 4;             // tokens per prefill register tile (kRows x kPanelTok int32 chains)
// Decode prefetch distance (capped at a quarter of the row range, TypedRows). Measured on the
// output head's shape (248320 x 2048, 2 threads, 12 passes per setting interleaved round-robin
// against the bandwidth drift): 32 KiB beat the f32 kernels' 8 KiB in each of 6 runs (Q6_K e.g.
// 31.1 / 34.9 / 54.7 vs 30.2 / 32.7 / 50.4 GB/s; Q4_K 33.4 vs 32.9, +1.5%); prefetcht1 at 64 KiB
// plus prefetcht0 at 2 KiB was not consistently better. On routed-expert shapes (512 x 2048 Q4_K
// and 2048 x 512 Q6_K, whole matrices per thread) 8 and 32 KiB were equal within the noise.
constexpr int64_t kPrefetchBytes = 32768;

// Decode: R rows x 1 token, the weights only in registers.
template <GgmlType Q, int R>
HWY_INLINE void GemvRows(const uint8_t* const* rows, const Q8Acts& a, float* y, const uint8_t* pf) {
  using F = Format<Q>;
  __m512 acc[R];
  for (int i = 0; i < R; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < a.blocks(); ++b) {
    if (pf != nullptr)  // every cache line of the rows' block kPrefetchBytes ahead
      for (int i = 0; i < R; ++i)
        for (int64_t o = 0; o < F::kBytes + 63; o += 64) hwy::Prefetch(pf + (i * a.blocks() + b) * F::kBytes + o);
    const int8_t* qa = (F::kK4Order ? a.q_k4 : a.q).data() + b * kQ8Block;
    const float* bs = a.bs.data() + b * 16;
    for (int i = 0; i < R; ++i) {
      Block8 blk;
      F::DecodeGemv(rows[i] + b * F::kBytes, blk);
      acc[i] = Dot(blk, qa, a.d[b], bs, acc[i]);
    }
  }
  for (int i = 0; i < R; ++i) y[i] = _mm512_reduce_add_ps(acc[i]);
}

// Prefill register tile: R rows of a decoded panel segment (nb blocks) x TT tokens; per block
// and token 4 vpdpbusd into one int32 vector per row (lane g: group g's dot), then
// acc += float(lanes) * sd * d_a + c * bs. acc[j * R + i]: token t + j, row i (memory: touched
// once per block, so the registers hold R x TT int32 chains).
template <int R, int TT>
HWY_INLINE void PanelTile(const PanelBlock* HWY_RESTRICT panel, int64_t nb, const Q8Acts& a, int64_t b0, int64_t t,
                          __m512* HWY_RESTRICT acc) {
  const int64_t anb = a.blocks();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i s[R * TT];
    for (int i = 0; i < R * TT; ++i) s[i] = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k) {
      __m512i x[TT];
      for (int j = 0; j < TT; ++j) {
        x[j] = _mm512_loadu_si512(a.q.data() + (t + j) * a.cols + (b0 + b) * kQ8Block + 64 * k);
        KeepInRegister(x[j]);
      }
      for (int i = 0; i < R; ++i) {
        const __m512i wq = _mm512_load_si512(&panel[i * kSegBlocks + b].q[k]);
        for (int j = 0; j < TT; ++j) s[i * TT + j] = Dpbusd(s[i * TT + j], wq, x[j]);
      }
    }
    // (each operand loaded once per block: 512-bit loads, not the multiplies, bound this loop)
    __m512 da[TT], bs[TT];
    for (int j = 0; j < TT; ++j) {
      const int64_t ab = (t + j) * anb + b0 + b;
      da[j] = _mm512_set1_ps(a.d[ab]);
      bs[j] = _mm512_loadu_ps(a.bs.data() + ab * 16);
    }
    for (int i = 0; i < R; ++i) {
      const __m512 sd = panel[i * kSegBlocks + b].sd, c = panel[i * kSegBlocks + b].c;
      for (int j = 0; j < TT; ++j) {
        const __m512 dot = _mm512_mul_ps(_mm512_cvtepi32_ps(s[i * TT + j]), sd);
        acc[j * R + i] = _mm512_fmadd_ps(c, bs[j], _mm512_fmadd_ps(dot, da[j], acc[j * R + i]));
      }
    }
  }
}

// A decoded block into its panel form.
HWY_INLINE void ToPanel(const Block8& b, PanelBlock& p) {
  for (int k = 0; k < 4; ++k) p.q[k] = b.q[k];
  Interleave(p.q);
  p.sd = _mm512_mul_ps(_mm512_cvtepi32_ps(b.g), _mm512_set1_ps(b.d));
  p.c = b.c;
}

// ---- Q4_K prefill in sub-block lanes ----
// Q4_K's scale and min change every 32 columns, so a block's 16 group lanes hold 8 pairs of lanes
// with equal scales. Two blocks b, b + 1 are merged into 8 vectors whose 32-bit lane 2 s + h
// holds all 32 columns of sub-block s of block b + h (4 per vector): 8 vpdpbusd per row, token
// and block pair, then one f32 rescale (cvt, mul, 2 fma) for two blocks instead of one per block.
// PairMerge builds the layout from two interleaved blocks (the same ops for weights and
// activations, so their lanes match): vector k < 4 takes even lanes from block b's vector k, odd
// lanes from block b + 1's; vector 4 + k the other halves, adjacent lanes swapped.
HWY_INLINE void PairMerge(const __m512i* HWY_RESTRICT a, const __m512i* HWY_RESTRICT b, __m512i* HWY_RESTRICT out) {
  constexpr __mmask16 kOdd = 0xAAAA;
  for (int k = 0; k < 4; ++k) {
    out[k] = _mm512_mask_blend_epi32(kOdd, a[k], b[k]);
    out[4 + k] = _mm512_shuffle_epi32(_mm512_mask_blend_epi32(kOdd, b[k], a[k]), _MM_PERM_CDAB);
  }
}

// A Q4_K weight block pair in a prefill panel: codes in PairMerge's layout; per lane 2 s + h the
// f32 scale d * sc and the min coefficient -dmin * m of sub-block s of block b + h.
struct PairBlock {
  __m512i q[8];
  __m512 sd;
  __m512 c;
};

// One token's activation block pair in PairMerge's layout; per lane 2 s + h the block scale
// d_a of block b + h and the activations' sum over sub-block s times d_a (bs[2 s] + bs[2 s + 1]).
struct PairAct {
  __m512i q[8];
  __m512 da;
  __m512 bs;
};

// Block pairs per Q4_K panel segment (4 rows x 4 pairs: 10 KiB of panel). Measured against 2
// (one thread, CPU time, 3 rounds): 1.07x on 2048-column rows at 16 and 512 tokens; 1 pair was
// 0.64x.
constexpr int64_t kSegPairs = 4;

// vpermi2d indices of DecodeQ4Pair: vector k < 4 (h = 0) and 4 + k (h = 1), lanes 2 s + e: the
// dword 8 (s / 2 % 2) + 4 (e XOR h) + k of table s / 4 (0: lanes of c0 / d0, 1: of c1 / d1).
struct PairIdx {
  alignas(64) int32_t v[8][16];
  constexpr PairIdx() : v() {
    for (int m = 0; m < 8; ++m)
      for (int l = 0; l < 16; ++l) {
        const int sb = l / 2, e = l % 2, h = m / 4, k = m % 4;
        v[m][l] = 16 * (sb / 4) + 8 * (sb / 2 % 2) + 4 * (e ^ h) + k;
      }
  }
};
inline constexpr PairIdx kPairIdx{};

// Two Q4_K blocks (b1 null past the last block: zero codes and scales) straight into PairBlock
// form, the layout PairMerge gives two interleaved blocks. Lane 2 s + e of vector m = 4 h + k
// holds columns 32 s + 16 (e XOR h) + 4 k + [0, 4) of block b + e: nibble s % 2 of qs dword
// 8 (s / 2) + 4 (e XOR h) + k. Blends of the two blocks' qs (c: block b's dwords 8 i + [0, 4)
// with block b + 1's 8 i + [4, 8); d: the other ones) make each vector one vpermi2d from two
// tables, then one variable shift and a mask pick the nibble: 3 operations per vector, where
// Decode + Interleave + PairMerge take about 7.
HWY_INLINE void DecodeQ4Pair(const uint8_t* HWY_RESTRICT b0, const uint8_t* HWY_RESTRICT b1, PairBlock& out) {
  constexpr __mmask16 kOdd = 0xAAAA, kHi4 = 0xF0F0;
  const __m512i z00 = _mm512_loadu_si512(b0 + 16), z01 = _mm512_loadu_si512(b0 + 80);
  const __m512i z10 = b1 ? _mm512_loadu_si512(b1 + 16) : _mm512_setzero_si512();
  const __m512i z11 = b1 ? _mm512_loadu_si512(b1 + 80) : _mm512_setzero_si512();
  const __m512i c0 = _mm512_mask_blend_epi32(kHi4, z00, z10), c1 = _mm512_mask_blend_epi32(kHi4, z01, z11);
  const __m512i d0 = _mm512_mask_blend_epi32(kHi4, z10, z00), d1 = _mm512_mask_blend_epi32(kHi4, z11, z01);
  const __m512i shift = _mm512_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4);  // odd sub-blocks: high nibbles
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int k = 0; k < 4; ++k) {
    out.q[k] = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutex2var_epi32(c0, _mm512_load_si512(kPairIdx.v[k]), c1), shift), m4);
    out.q[4 + k] = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutex2var_epi32(d0, _mm512_load_si512(kPairIdx.v[4 + k]), d1), shift), m4);
  }
  const __m128i v0 = UnpackK4Scales(b0 + 4), v1 = b1 ? UnpackK4Scales(b1 + 4) : _mm_setzero_si128();
  const float d1s = b1 ? Half(b1) : 0.0f, m1s = b1 ? Half(b1 + 2) : 0.0f;
  const __m512 d = _mm512_mask_blend_ps(kOdd, _mm512_set1_ps(Half(b0)), _mm512_set1_ps(d1s));
  const __m512 dmin = _mm512_mask_blend_ps(kOdd, _mm512_set1_ps(-Half(b0 + 2)), _mm512_set1_ps(-m1s));
  out.sd = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(v0, v1))), d);   // scales, alternating blocks
  out.c = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(v0, v1))), dmin);  // mins
}

// Tokens [t0, t1) of a into PairAct form: xs[(t - t0) * np + p], np = ceil(blocks / 2).
HWY_INLINE void ToPairActs(const Q8Acts& a, int64_t t0, int64_t t1, PairAct* HWY_RESTRICT xs) {
  constexpr __mmask16 kOdd = 0xAAAA;
  const int64_t nb = a.blocks(), np = (nb + 1) / 2;
  for (int64_t t = t0; t < t1; ++t)
    for (int64_t p = 0; p < np; ++p) {
      __m512i v[2][4];
      __m512 da[2], bs[2];
      for (int h = 0; h < 2; ++h) {
        const int64_t b = 2 * p + h;
        if (b < nb) {
          for (int k = 0; k < 4; ++k) v[h][k] = _mm512_loadu_si512(a.q.data() + t * a.cols + b * kQ8Block + 64 * k);
          da[h] = _mm512_set1_ps(a.d[t * nb + b]);
          const __m512 g = _mm512_loadu_ps(a.bs.data() + (t * nb + b) * 16);
          bs[h] = _mm512_add_ps(g, _mm512_permute_ps(g, _MM_SHUFFLE(2, 3, 0, 1)));  // lanes 2 s, 2 s + 1: sub-block s
        } else {
          for (int k = 0; k < 4; ++k) v[h][k] = _mm512_setzero_si512();
          da[h] = bs[h] = _mm512_setzero_ps();
        }
      }
      PairAct& x = xs[(t - t0) * np + p];
      PairMerge(v[0], v[1], x.q);
      x.da = _mm512_mask_blend_ps(kOdd, da[0], da[1]);
      x.bs = _mm512_mask_blend_ps(kOdd, bs[0], bs[1]);
    }
}

// PanelTile for block pairs: R rows x TT tokens over np pairs of a segment starting at pair p0.
template <int R, int TT>
HWY_INLINE void PairTile(const PairBlock* HWY_RESTRICT panel, int64_t np, const PairAct* HWY_RESTRICT xs, int64_t anp,
                         int64_t p0, __m512* HWY_RESTRICT acc) {
  for (int64_t p = 0; p < np; ++p) {
    __m512i s[R * TT];
    for (int i = 0; i < R * TT; ++i) s[i] = _mm512_setzero_si512();
    for (int k = 0; k < 8; ++k) {
      __m512i x[TT];
      for (int j = 0; j < TT; ++j) {
        x[j] = _mm512_load_si512(&xs[j * anp + p0 + p].q[k]);
        KeepInRegister(x[j]);
      }
      for (int i = 0; i < R; ++i) {
        const __m512i wq = _mm512_load_si512(&panel[i * kSegPairs + p].q[k]);
        for (int j = 0; j < TT; ++j) s[i * TT + j] = Dpbusd(s[i * TT + j], wq, x[j]);
      }
    }
    for (int i = 0; i < R; ++i) {
      const __m512 sd = panel[i * kSegPairs + p].sd, c = panel[i * kSegPairs + p].c;
      for (int j = 0; j < TT; ++j) {
        const PairAct& xa = xs[j * anp + p0 + p];
        const __m512 dot = _mm512_mul_ps(_mm512_cvtepi32_ps(s[i * TT + j]), sd);
        acc[j * R + i] = _mm512_fmadd_ps(c, xa.bs, _mm512_fmadd_ps(dot, xa.da, acc[j * R + i]));
      }
    }
  }
}

// Q4_K prefill: rows [r, r + R) against tokens [t0, t1) (xs: their PairActs), through a
// PairBlock panel per segment.
template <int R>
HWY_INLINE void PairRows(const GgmlView& w, int64_t r, int64_t t0, int64_t t1, const PairAct* HWY_RESTRICT xs, float* y,
                         int64_t ldy, PairBlock* HWY_RESTRICT panel, __m512* HWY_RESTRICT acc) {
  using F = Format<GgmlType::Q4_K>;
  const int64_t rb = w.row_bytes(), nt = t1 - t0, nb = w.cols / kQ8Block, anp = (nb + 1) / 2;
  for (int64_t i = 0; i < nt * R; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t p0 = 0; p0 < anp; p0 += kSegPairs) {
    const int64_t np = std::min(kSegPairs, anp - p0);
    for (int i = 0; i < R; ++i)
      for (int64_t p = 0; p < np; ++p) {
        const int64_t b = 2 * (p0 + p);
        const uint8_t* src = w.data + (r + i) * rb + b * F::kBytes;
        DecodeQ4Pair(src, b + 1 < nb ? src + F::kBytes : nullptr, panel[i * kSegPairs + p]);
      }
    int64_t t = 0;
    for (; t + kPanelTok <= nt; t += kPanelTok) PairTile<R, kPanelTok>(panel, np, xs + t * anp, anp, p0, acc + t * R);
    // the last 1-3 tokens in one narrower tile (each weight vector loaded once for them)
    if (nt - t == 3) PairTile<R, 3>(panel, np, xs + t * anp, anp, p0, acc + t * R);
    if (nt - t == 2) PairTile<R, 2>(panel, np, xs + t * anp, anp, p0, acc + t * R);
    if (nt - t == 1) PairTile<R, 1>(panel, np, xs + t * anp, anp, p0, acc + t * R);
  }
  for (int64_t t = 0; t < nt; ++t)
    for (int i = 0; i < R; ++i) y[(t0 + t) * ldy + r + i] = _mm512_reduce_add_ps(acc[t * R + i]);
}

// Prefill: rows [r, r + R) against tokens [t0, t1), through a PanelBlock panel per segment.
template <GgmlType Q, int R>
HWY_INLINE void PanelRows(const GgmlView& w, int64_t r, int64_t t0, int64_t t1, const Q8Acts& a, float* y, int64_t ldy,
                          PanelBlock* HWY_RESTRICT panel, __m512* HWY_RESTRICT acc) {
  using F = Format<Q>;
  const int64_t rb = w.row_bytes(), nt = t1 - t0;
  for (int64_t i = 0; i < nt * R; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b0 = 0; b0 < a.blocks(); b0 += kSegBlocks) {
    const int64_t nb = std::min(kSegBlocks, a.blocks() - b0);
    for (int i = 0; i < R; ++i)
      for (int64_t b = 0; b < nb; ++b) {
        Block8 blk;
        F::Decode(w.data + (r + i) * rb + (b0 + b) * F::kBytes, blk);
        ToPanel(blk, panel[i * kSegBlocks + b]);
      }
    int64_t t = 0;
    for (; t + kPanelTok <= nt; t += kPanelTok) PanelTile<R, kPanelTok>(panel, nb, a, b0, t0 + t, acc + t * R);
    for (; t < nt; ++t) PanelTile<R, 1>(panel, nb, a, b0, t0 + t, acc + t * R);
  }
  for (int64_t t = 0; t < nt; ++t)
    for (int i = 0; i < R; ++i) y[(t0 + t) * ldy + r + i] = _mm512_reduce_add_ps(acc[t * R + i]);
}

// The decode kernel for the shared row driver (DecodeRowRange): R rows rb bytes apart.
struct DecodeKernels {
  template <GgmlType Q, int R>
  static HWY_INLINE void Gemv(const uint8_t* row, int64_t rb, const Q8Acts& a, float* y, const uint8_t* pf) {
    const uint8_t* rows[R];
    for (int i = 0; i < R; ++i) rows[i] = row + i * rb;
    GemvRows<Q, R>(rows, a, y, pf);
  }
};

#include "ops/ggml_q8_rows-inl.h"  // IWYU pragma: keep (DecodeRowRange)

template <GgmlType Q>
void TypedRows(const GgmlView& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (a.T == 1) return DecodeRowRange<DecodeKernels, Q>(w, a, y, r0, r1);
  __m512 acc[kTokenTile * kRows];
  if constexpr (Q == GgmlType::Q4_K) {
    thread_local hwy::AlignedFreeUniquePtr<uint8_t[]> xs_buf;  // a token tile's PairActs (grown only)
    thread_local size_t xs_bytes = 0;
    const int64_t anp = (a.blocks() + 1) / 2;
    const size_t need = static_cast<size_t>(kTokenTile * anp) * sizeof(PairAct);
    if (xs_bytes < need) {
      xs_buf = hwy::AllocateAligned<uint8_t>(need);
      xs_bytes = need;
    }
    PairAct* xs = reinterpret_cast<PairAct*>(xs_buf.get());
    alignas(64) PairBlock panel[kRows * kSegPairs];
    for (int64_t t0 = 0; t0 < a.T; t0 += kTokenTile) {
      const int64_t t1 = std::min(a.T, t0 + kTokenTile);
      ToPairActs(a, t0, t1, xs);
      int64_t r = r0;
      for (; r + kRows <= r1; r += kRows) PairRows<kRows>(w, r, t0, t1, xs, y, ldy, panel, acc);
      for (; r < r1; ++r) PairRows<1>(w, r, t0, t1, xs, y, ldy, panel, acc);
    }
    return;
  }
  alignas(64) PanelBlock panel[kRows * kSegBlocks];
  for (int64_t t0 = 0; t0 < a.T; t0 += kTokenTile) {
    const int64_t t1 = std::min(a.T, t0 + kTokenTile);
    int64_t r = r0;
    for (; r + kRows <= r1; r += kRows) PanelRows<Q, kRows>(w, r, t0, t1, a, y, ldy, panel, acc);
    for (; r < r1; ++r) PanelRows<Q, 1>(w, r, t0, t1, a, y, ldy, panel, acc);
  }
}

// One token's blocks: amax, codes (vpmovdb of the rounded products), per-16 sums.
// q_k4 (non-null for one token): the codes again in Q4_K nibble order (Q8Acts).
void QuantizeToken(const float* HWY_RESTRICT x, int64_t nb, int8_t* HWY_RESTRICT q, float* HWY_RESTRICT d,
                   float* HWY_RESTRICT bs, bool interleaved, int8_t* HWY_RESTRICT q_k4) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kQ8Block;
    __m512 m = _mm512_setzero_ps();
    __mmask16 bad = 0;  // NaN or infinite lanes (fpclass: QNaN, +inf, -inf, SNaN)
    for (int g = 0; g < 16; ++g) {
      const __m512 v = _mm512_loadu_ps(xb + 16 * g);
      m = _mm512_max_ps(m, _mm512_andnot_ps(sign, v));
      bad = static_cast<__mmask16>(bad | _mm512_fpclass_ps_mask(v, 0x99));
    }
    const float amax = _mm512_reduce_max_ps(m);
    float id = amax > 0 ? 127.0f / amax : 0.0f;
    d[b] = amax / 127.0f;
    if (bad != 0 || !std::isfinite(id)) {  // as quantize_block
      d[b] = bad != 0 ? std::numeric_limits<float>::quiet_NaN() : 0.0f;
      id = 0.0f;
    }
    const __m512 vid = _mm512_set1_ps(id);
    alignas(64) int8_t codes[kQ8Block];
    for (int g = 0; g < 16; ++g) {
      const __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * g), vid));  // nearest-even
      _mm_store_si128(reinterpret_cast<__m128i*>(codes + 16 * g), _mm512_cvtepi32_epi8(qi));
      bs[b * 16 + g] = d[b] * static_cast<float>(_mm512_reduce_add_epi32(qi));
    }
    __m512i v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm512_load_si512(codes + 64 * k);
    if (interleaved) Interleave(v);
    for (int k = 0; k < 4; ++k) _mm512_storeu_si512(q + b * kQ8Block + 64 * k, v[k]);
    if (q_k4 != nullptr)  // column-order vectors 2h, 2h + 1 -> their low halves, then their high halves
      for (int h = 0; h < 2; ++h) {
        _mm512_storeu_si512(q_k4 + b * kQ8Block + 128 * h, _mm512_shuffle_i64x2(v[2 * h], v[2 * h + 1], _MM_SHUFFLE(1, 0, 1, 0)));
        _mm512_storeu_si512(q_k4 + b * kQ8Block + 128 * h + 64,
                            _mm512_shuffle_i64x2(v[2 * h], v[2 * h + 1], _MM_SHUFFLE(3, 2, 3, 2)));
      }
  }
}

}  // namespace q8k
#endif  // HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3

#include "ops/ggml_q8_avx2-inl.h"  // the AVX2 target's kernels (q8avx2)

// aarch64: the NEON kernels (ggml_q8_neon.cpp, compiled once: NEON is the baseline there) serve
// every SIMD target Highway dispatches to (NEON and the SVE ones), not the scalar ones.
#define SPOOL_Q8_NEON (HWY_ARCH_ARM_A64 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128)

void Q8Rows(const GgmlView& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if (w.type == GgmlType::Q4_K) return q8k::TypedRows<GgmlType::Q4_K>(w, a, y, ldy, r0, r1);
  if (w.type == GgmlType::Q6_K) return q8k::TypedRows<GgmlType::Q6_K>(w, a, y, ldy, r0, r1);
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  return q8avx2::Rows(w, a, y, ldy, r0, r1);
#elif SPOOL_Q8_NEON
  return q8::neon_rows(w, a, y, ldy, r0, r1, q8::cpu_has_dotprod() && q8::g_allow_dot_ext.load(std::memory_order_relaxed));
#endif
  q8::rows_scalar(w, a, y, ldy, r0, r1);
}

void Q8Quantize(const float* x, int64_t T, int64_t cols, Q8Acts& a) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  const int64_t nb = cols / kQ8Block;
  for (int64_t t = 0; t < T; ++t)
    q8k::QuantizeToken(x + t * cols, nb, a.q.data() + t * cols, a.d.data() + t * nb, a.bs.data() + t * nb * 16, a.interleaved,
                       T == 1 ? a.q_k4.data() : nullptr);
#else
  q8::quantize_scalar(x, T, cols, a);
#endif
}

bool Q8Fast() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return true;
#elif SPOOL_Q8_NEON
  return true;
#else
  return false;
#endif
}

// --act-bits auto's CPU check: the variants measured faster than the f32 kernels (AVX-512 and
// AVX2, with and without VNNI: docs/benchmarks.md). Not yet NEON: no aarch64 machine measured.
bool Q8Auto() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return true;
#else
  return false;
#endif
}

const char* Q8Variant() {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3_DL
  return "avx512vnni";
#elif HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  return "avx512bw";
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  return q8avx2::UseVnni() ? "avx2-vnni" : "avx2";
#elif SPOOL_Q8_NEON
  return q8::cpu_has_dotprod() && q8::g_allow_dot_ext.load(std::memory_order_relaxed) ? "neon-dotprod" : "neon";
#else
  return "scalar";
#endif
}

}  // namespace HWY_NAMESPACE
}  // namespace spool::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace spool::ops {

HWY_EXPORT(Q8Rows);
HWY_EXPORT(Q8Quantize);
HWY_EXPORT(Q8Variant);
HWY_EXPORT(Q8Fast);
HWY_EXPORT(Q8Auto);

namespace {

void resize(int64_t T, int64_t cols, Q8Acts& a) {
  if (T < 0 || cols <= 0 || cols % kQ8Block != 0)
    fail("q8_quantize: %lld columns (must be a positive multiple of %lld), %lld tokens", static_cast<long long>(cols),
         static_cast<long long>(kQ8Block), static_cast<long long>(T));
  a.T = T;
  a.cols = cols;
  a.interleaved = T >= 2;
  // Grow only: a resize that grows value-initializes (memsets) the new elements, and the callers
  // reuse one Q8Acts for token counts that go up and down (measured: 3% of a prefill).
  const auto grow = [](auto& v, int64_t n) {
    if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  };
  grow(a.q, T * cols);
  grow(a.q_k4, T == 1 ? cols : 0);
  grow(a.d, T * (cols / kQ8Block));
  grow(a.bs, T * (cols / kQ8Block) * 16);
}
// Throws unless a's vectors hold what its T and cols say, in the layout its T implies.
void validate(const Q8Acts& a) {
  const int64_t nb = a.cols / kQ8Block;
  if (a.T < 0 || a.cols <= 0 || a.cols % kQ8Block != 0 || a.interleaved != (a.T >= 2) ||
      a.q.size() < static_cast<size_t>(a.T * a.cols) || a.d.size() < static_cast<size_t>(a.T * nb) ||
      a.bs.size() < static_cast<size_t>(a.T * nb * 16) || (a.T == 1 && a.q_k4.size() < static_cast<size_t>(a.cols)))
    fail("int8 activations: inconsistent Q8Acts (%lld tokens x %lld columns, %zu codes, %zu Q4_K-order codes, %zu scales, "
         "%zu sums, %s layout)",
         static_cast<long long>(a.T), static_cast<long long>(a.cols), a.q.size(), a.q_k4.size(), a.d.size(), a.bs.size(),
         a.interleaved ? "interleaved" : "column-order");
}

}  // namespace

void q8_quantize(const float* x, int64_t T, int64_t cols, Q8Acts& a) {
  resize(T, cols, a);
  HWY_DYNAMIC_DISPATCH(Q8Quantize)(x, T, cols, a);
}

void q8_quantize_reference(const float* x, int64_t T, int64_t cols, Q8Acts& a) {
  resize(T, cols, a);
  q8::quantize_scalar(x, T, cols, a);
}

bool q8_supported(GgmlType t) { return t == GgmlType::Q4_K || t == GgmlType::Q6_K; }

const char* q8_variant() { return HWY_DYNAMIC_DISPATCH(Q8Variant)(); }

bool q8_fast() { return HWY_DYNAMIC_DISPATCH(Q8Fast)(); }

bool q8_auto() { return HWY_DYNAMIC_DISPATCH(Q8Auto)(); }

void q8_allow_dot_extension(bool allow) { q8::g_allow_dot_ext.store(allow, std::memory_order_relaxed); }

void ggml_q8_matmul_rows(const GgmlView& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  validate(w);
  if (!q8_supported(w.type)) fail("int8 activations: no kernel for %s (Q4_K and Q6_K only)", ggml_describe(w).c_str());
  if (a.cols != w.cols)
    fail("int8 activations for %s: %lld columns, the weight has %lld", ggml_describe(w).c_str(),
         static_cast<long long>(a.cols), static_cast<long long>(w.cols));
  validate(a);
  if (r0 < 0 || r1 > w.rows || r0 > r1)
    fail("ggml_q8_matmul_rows (%s): rows [%lld, %lld) outside [0, %lld)", ggml_describe(w).c_str(),
         static_cast<long long>(r0), static_cast<long long>(r1), static_cast<long long>(w.rows));
  if (r0 == r1 || a.T == 0) return;
  HWY_DYNAMIC_DISPATCH(Q8Rows)(w, a, y, ldy, r0, r1);
}

void ggml_q8_matmul(const GgmlView& w, const Q8Acts& a, float* y, ThreadPool* pool) {
  const int64_t work = w.rows * w.cols * a.T;
  if (pool == nullptr || pool->size() == 1 || work < (1 << 15)) return ggml_q8_matmul_rows(w, a, y, w.rows, 0, w.rows);
  validate(w);  // errors on the calling thread, before the workers start
  ggml_q8_matmul_rows(w, a, y, w.rows, 0, 0);
  pool->parallel_for(w.rows, 16, [&](int64_t b, int64_t e, int) { ggml_q8_matmul_rows(w, a, y, w.rows, b, e); });
}

void ggml_q8_matmul_reference(const GgmlView& w, const Q8Acts& a, float* y) {
  ggml_q8_matmul_rows(w, a, y, w.rows, 0, 0);  // its checks and errors
  q8::rows_scalar(w, a, y, w.rows, 0, w.rows);
}

bool int8_activations_from_bits(int bits, bool kquant_weights) {
  if (bits != 0 && bits != 8 && bits != 32) throw UsageError(strfmt("--act-bits must be 8, 32 or auto (got %d)", bits));
  return bits == 8 || (bits == 0 && kquant_weights && q8_auto());
}

}  // namespace spool::ops
#endif  // HWY_ONCE
