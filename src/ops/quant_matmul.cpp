// Highway kernels for quant_matmul() and the blockwise Hadamard transform, compiled once per SIMD
// target (foreach_target) and dispatched at runtime.
//
// Lane layout. A packed row is cut into "super-blocks" (SB) of N lanes (N = f32 lanes of the
// target); lane k of an SB owns a few bits holding consecutive codes of one group:
//   q4: 4 bytes = 8 codes, q2: 4 bytes = 16 codes, q3: 3 bytes = 8 codes, ternary: 1 byte = 5,
//   q5: 20 bits = 4 codes (odd lanes start at bit 4 of a byte), q6: 3 bytes = 4 codes,
//   q8: 4 bytes = 4 codes.
// Decoding a lane word slot by slot (shift, or base-3 digit) gives, for slot s, a vector whose
// lane k holds code (k, s); the codebook lookup is an in-register permute (AVX-512 vpermps of a
// 16-entry table, AVX2 two 8-entry permutes + blend for q4). q3 / q5 / q6 lane words are built
// by byte shuffles (AVX-512: one masked load, a dword permute to the 128-bit blocks, vpshufb;
// q5 then shifts its odd lanes by 4). q5 / q6 look their 32 / 64 centroids up with AVX-512
// two-table permutes (vpermt2ps; q6 two of them and a blend on bit 5), AVX2 decode with 64-bit
// gathers of code pairs from a pair table (PairTable), elsewhere with a 32-bit gather from the
// table in L1. q8 needs an affine codebook (the format's uniform grid):
// decode (see Q8DecodeRows) widens the codes in column order and folds c_0 and step into the
// sums; prefill uses centroid = c_0 + code * step (any other 256-entry codebook runs the plain
// path). Instead of shuffling decoded
// values back to column order, the activation is permuted ONCE per call into the same "slot
// order" (zeros in padding slots), so the inner loop is decode -> permute -> FMA. Each lane's
// partial sum is multiplied by its group's scale (per-lane scale vector: lanes of one SB may
// belong to different groups). Layout tables are cached per thread and per (type, cols, group).
// Decode (T == 1, and T <= 4 on AVX3, 2 tokens per pass) streams 4 rows at a time, prefetching
// the rows of a later block; prefill (larger T) dequantizes 4 rows into f32 slot order once per
// token tile and runs a 4-row x 4-token (AVX3; else x 2) FMA block over the tile.
// Group sizes whose groups do not start on a lane boundary (only possible when group == cols)
// and the HWY_SCALAR target use a plain "dequantize row, then dot" path.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/quant_matmul.cpp"
#include <array>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/aligned_allocator.h>
#include <hwy/cache_control.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "common/error.h"
#include "ops/quant_matmul.h"
#include "ops/weights.h"

// ---- Target-independent helpers (compiled once) ----
#ifndef SPOOL_OPS_QUANT_MATMUL_SHARED
#define SPOOL_OPS_QUANT_MATMUL_SHARED
namespace spool::ops::qmm {

/// Code j (0-based) of one packed group (scalar, the format's definition).
inline int code_at(QType t, const uint8_t* grp, int64_t j) {
  if (t == QType::kTernary) {
    int v = grp[j / 5];
    for (int64_t d = j % 5; d > 0; --d) v /= 3;
    return v % 3;
  }
  const int b = qtype_bits(t);
  const int64_t bit = j * b;
  const int sh = static_cast<int>(bit & 7);
  unsigned v = grp[bit >> 3];
  if (sh + b > 8) v |= static_cast<unsigned>(grp[(bit >> 3) + 1]) << 8;
  return static_cast<int>((v >> sh) & ((1u << b) - 1));
}

/// Bits per lane and codes per lane of the SIMD layout (q5: 20 bits, so odd lanes start in the
/// middle of a byte).
constexpr int lane_bits(QType t) {
  return t == QType::kQ3 || t == QType::kQ6 ? 24 : t == QType::kQ5 ? 20 : t == QType::kTernary ? 8 : 32;
}
constexpr int lane_slots(QType t) {
  return t == QType::kQ2 ? 16 : t == QType::kTernary ? 5 : t == QType::kQ5 || t == QType::kQ6 || t == QType::kQ8 ? 4 : 8;
}
static_assert(lane_bits(QType::kQ5) == lane_slots(QType::kQ5) * 5 &&
              lane_bits(QType::kQ6) == lane_slots(QType::kQ6) * 6 &&
              lane_bits(QType::kQ8) == lane_slots(QType::kQ8) * 8, "lane words hold whole codes");

/// True when the 256-entry codebook is exactly affine in the code, c_k == c_0 + k * (c_1 - c_0)
/// both as one fused multiply-add and as a product then a sum (SIMD targets without FMA), so the
/// q8 kernels' affine decode gives the table's values bit for bit.
inline bool affine_codebook(const float* cb_unaligned) {
  float c[256];
  std::memcpy(c, cb_unaligned, sizeof c);
  const float step = c[1] - c[0];
  for (int k = 0; k < 256; ++k) {
    const float kf = static_cast<float>(k);
    const float prod = kf * step;
    if (std::fma(kf, step, c[0]) != c[k] || prod + c[0] != c[k]) return false;
  }
  return true;
}

/// True when every group starts on a lane boundary (lanes never straddle groups).
inline bool lanes_aligned(QType t, int g) {
  if (t == QType::kTernary) return true;
  return (static_cast<int64_t>(g) * qtype_bits(t)) % lane_bits(t) == 0;
}

/// One block of B (a power of two) elements: v <- Sylvester(B) v * norm, scalar.
template <class T>
inline void fwht_block(T* v, int64_t B, T norm) {
  for (int64_t h = 1; h < B; h <<= 1)
    for (int64_t i = 0; i < B; i += 2 * h)
      for (int64_t k = i; k < i + h; ++k) {
        const T a = v[k], c = v[k + h];
        v[k] = a + c;
        v[k + h] = a - c;
      }
  for (int64_t i = 0; i < B; ++i) v[i] *= norm;
}

/// Blockwise normalized FWHT in double (reference).
inline void fwht_double(double* x, int64_t n) {
  const int64_t B = n & -n;
  const double norm = 1.0 / std::sqrt(static_cast<double>(B));
  for (int64_t b0 = 0; b0 < n; b0 += B) fwht_block(x + b0, B, norm);
}

/// Growable 64-byte aligned scratch (one per use site and thread).
template <class T>
struct Scratch {
  hwy::AlignedFreeUniquePtr<T[]> p;
  size_t n = 0;
  T* get(size_t need) {
    if (need > n) {
      p = hwy::AllocateAligned<T>(need);
      n = need;
    }
    return p.get();
  }
};

}  // namespace spool::ops::qmm
#endif  // SPOOL_OPS_QUANT_MATMUL_SHARED

HWY_BEFORE_NAMESPACE();
namespace spool::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using VF = hn::Vec<DF>;
using VU = hn::Vec<DU>;
using IndF = decltype(hn::IndicesFromVec(DF(), hn::Zero(DI())));
using qmm::Scratch;

constexpr int64_t kN = static_cast<int64_t>(hn::MaxLanes(DF()));

// ---------------------------------------------------------------------------------------------
// Hadamard transform

#if HWY_TARGET != HWY_SCALAR
// v with lanes i and i ^ h swapped (h < N).
template <int h>
HWY_INLINE VF SwapLanes(DF df, VF v) {
  if constexpr (h == 1) {
    return hn::Shuffle2301(v);
  } else if constexpr (h == 2) {
    return hn::Shuffle1032(v);
  } else if constexpr (h == 4 && kN == 8) {
    return hn::ConcatLowerUpper(df, v, v);
#if HWY_TARGET == HWY_AVX3
  } else if constexpr (h == 4 && kN == 16) {
    return VF{_mm512_shuffle_f32x4(v.raw, v.raw, _MM_SHUFFLE(2, 3, 0, 1))};
#endif
  } else {
    static_assert(h == 8 && kN == 16, "unsupported lane swap");
    return hn::ConcatLowerUpper(df, v, v);
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

// Butterfly stages h = 1 .. N/2 inside one vector: out[i] = v[i ^ h] + (i & h ? -1 : 1) v[i].
HWY_INLINE VF IntraFwht(DF df, VF v) {
#if HWY_TARGET != HWY_SCALAR
  {
    alignas(64) static constexpr float kSgn[4][16] = {
        {1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1},
        {1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1},
        {1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1},
        {1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1}};
    v = hn::MulAdd(v, hn::Load(df, kSgn[0]), SwapLanes<1>(df, v));
    if constexpr (kN >= 4) v = hn::MulAdd(v, hn::Load(df, kSgn[1]), SwapLanes<2>(df, v));
    if constexpr (kN >= 8) v = hn::MulAdd(v, hn::Load(df, kSgn[2]), SwapLanes<kN >= 8 ? 4 : 1>(df, v));
    if constexpr (kN >= 16) v = hn::MulAdd(v, hn::Load(df, kSgn[3]), SwapLanes<kN >= 16 ? 8 : 1>(df, v));
  }
#endif
  return v;
}

// Unnormalized FWHT of one block of B >= N elements whose within-vector stages are done.
HWY_INLINE void InterFwht(DF df, float* HWY_RESTRICT v, int64_t B) {
  int64_t h = kN;
  for (; 4 * h <= B; h *= 4) {  // two stages (h, 2h) per pass
    for (int64_t i = 0; i < B; i += 4 * h) {
      for (int64_t k = i; k < i + h; k += kN) {
        const VF a = hn::Load(df, v + k), b = hn::Load(df, v + k + h);
        const VF c = hn::Load(df, v + k + 2 * h), d = hn::Load(df, v + k + 3 * h);
        const VF s0 = hn::Add(a, b), d0 = hn::Sub(a, b), s1 = hn::Add(c, d), d1 = hn::Sub(c, d);
        hn::Store(hn::Add(s0, s1), df, v + k);
        hn::Store(hn::Add(d0, d1), df, v + k + h);
        hn::Store(hn::Sub(s0, s1), df, v + k + 2 * h);
        hn::Store(hn::Sub(d0, d1), df, v + k + 3 * h);
      }
    }
  }
  if (h < B) {  // one stage left
    for (int64_t k = 0; k < h; k += kN) {
      const VF a = hn::Load(df, v + k), b = hn::Load(df, v + k + h);
      hn::Store(hn::Add(a, b), df, v + k);
      hn::Store(hn::Sub(a, b), df, v + k + h);
    }
  }
}

void ScalarFwhtBlock(float* v, int64_t B, float norm) { qmm::fwht_block(v, B, norm); }

// out = H_blk (s .* x); signs may be null; out may alias x.
void HadamardRotate(const int8_t* signs, const float* x, int64_t n, float* out) {
  const DF df;
  const int64_t B = n & -n;
  const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(B)));
  // Vector loads/stores in InterFwht need aligned data: work in an aligned block buffer.
  thread_local Scratch<float> tmp;
  if (B < kN || B < 2) {
    for (int64_t i = 0; i < n; ++i) out[i] = signs ? x[i] * static_cast<float>(signs[i]) : x[i];
    for (int64_t b0 = 0; b0 < n; b0 += B) ScalarFwhtBlock(out + b0, B, norm);
    return;
  }
  float* v = tmp.get(static_cast<size_t>(B));
  const VF vnorm = hn::Set(df, norm);
  const hn::Rebind<int8_t, DF> d8;
  const DI di;
  for (int64_t b0 = 0; b0 < n; b0 += B) {
    for (int64_t i = 0; i < B; i += kN) {
      VF xv = hn::Mul(hn::LoadU(df, x + b0 + i), vnorm);
      if (signs != nullptr) {
        const VF s = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, signs + b0 + i)));
        xv = hn::Mul(xv, s);
      }
      hn::Store(IntraFwht(df, xv), df, v + i);
    }
    InterFwht(df, v, B);
    std::copy_n(v, B, out + b0);
  }
}

void HadamardTransform(float* x, int64_t n) { HadamardRotate(nullptr, x, n, x); }

// ---------------------------------------------------------------------------------------------
// Lane decoding
#if HWY_TARGET != HWY_SCALAR

// Layout of one (type, cols, group) for this target; see the file comment.
struct Layout {
  QType type = QType::kQ4;
  int64_t cols = -1;
  int group = 0;
  int64_t nsb = 0;  // super-blocks per row
  int64_t len = 0;  // slots per row = nsb * slots * N
  std::vector<int32_t> g0;   // [nsb] group of lane 0
  std::vector<int32_t> rel;  // [nsb * N] group of each lane minus g0 (< N)
  bool ok = true;            // false if an SB spans more than N groups (never for valid groups)
};

const Layout& GetLayout(QType type, int64_t cols, int group) {
  constexpr int kCache = 16;
  thread_local Layout cache[kCache];
  thread_local int next = 0;
  for (const Layout& l : cache)
    if (l.cols == cols && l.group == group && l.type == type) return l;
  Layout& L = cache[next];
  next = (next + 1) % kCache;
  const int lb = qmm::lane_bits(type), S = qmm::lane_slots(type);
  const int64_t gb = qtype_group_bytes(type, group), ngroups = cols / group, rb = ngroups * gb;
  const int64_t sbb = kN * lb / 8;  // bytes per SB (whole: N is even)
  L.type = type;
  L.cols = cols;
  L.group = group;
  L.ok = true;
  L.nsb = (rb + sbb - 1) / sbb;
  L.len = L.nsb * S * kN;
  L.g0.assign(static_cast<size_t>(L.nsb), 0);
  L.rel.assign(static_cast<size_t>(L.nsb * kN), 0);
  for (int64_t j = 0; j < L.nsb; ++j) {
    int64_t first = -1;
    for (int64_t k = 0; k < kN; ++k) {
      const int64_t o = j * sbb * 8 + k * lb;  // first bit of the lane
      int64_t grp = ngroups - 1;
      if (o < rb * 8) grp = o / (gb * 8);
      if (first < 0) first = grp;
      L.g0[static_cast<size_t>(j)] = static_cast<int32_t>(first);
      // Padding lanes past the row take the row's last group (their x slots are zero).
      L.rel[static_cast<size_t>(j * kN + k)] = static_cast<int32_t>(std::min<int64_t>(grp - first, kN - 1));
      if (grp - first >= kN) L.ok = false;
    }
  }
  return L;
}

// One SB of x in lane-major order (lane k holds S consecutive values) -> slot-major.
template <int S>
HWY_INLINE void TransposeSB(const float* HWY_RESTRICT in, float* HWY_RESTRICT out) {
  if constexpr (S == 5) {
    for (int s = 0; s < S; ++s)
      for (int64_t k = 0; k < kN; ++k) out[s * kN + k] = in[k * S + s];
  } else {
    for (int64_t k = 0; k < kN; ++k)
      for (int s = 0; s < S; ++s) out[s * kN + k] = in[k * S + s];
  }
}

// x [cols] -> slot order [L.len]: slot s of lane k of SB j holds the column decoded there, 0 for
// padding. For b-bit types lane k of SB j holds columns (j N + k) S + s; for ternary, byte o of
// the row holds codes 5 (o % gb) + d of group o / gb, so x is first spread to 5 slots per byte
// with zeros in the padding slots of each group.
template <QType Q>
HWY_INLINE void ToSlots(const Layout& L, const float* HWY_RESTRICT x, float* HWY_RESTRICT xk) {
  constexpr int S = qmm::lane_slots(Q);
  constexpr int64_t sbn = kN * S;  // floats per SB
  const float* src = x;
  int64_t avail = L.cols;
  if constexpr (Q == QType::kTernary) {
    thread_local Scratch<float> xgb;
    const int64_t g = L.group, gs = qtype_group_bytes(Q, g) * 5, ng = L.cols / g;
    float* xg = xgb.get(static_cast<size_t>(L.len));
    for (int64_t gi = 0; gi < ng; ++gi) {
      std::copy_n(x + gi * g, g, xg + gi * gs);
      std::fill(xg + gi * gs + g, xg + (gi + 1) * gs, 0.0f);
    }
    std::fill(xg + ng * gs, xg + L.len, 0.0f);
    src = xg;
    avail = L.len;
  }
  const int64_t full = std::min(L.nsb, avail / sbn);
  for (int64_t j = 0; j < full; ++j) TransposeSB<S>(src + j * sbn, xk + j * sbn);
  if (full < L.nsb) {  // one partial SB at the end of a b-bit row
    alignas(64) float tmp[16 * 16] = {};
    std::copy_n(src + full * sbn, avail - full * sbn, tmp);
    TransposeSB<S>(tmp, xk + full * sbn);
  }
}

// Bytes of one SB.
template <QType Q>
constexpr int64_t SbBytes() {
  return kN * qmm::lane_bits(Q) / 8;
}

// Bytes a fast-path lane load of one SB may touch.
template <QType Q>
constexpr int64_t LoadExtent() {
  if constexpr ((Q == QType::kQ3 || Q == QType::kQ5 || Q == QType::kQ6) && kN == 4) return 16;
  if constexpr (Q == QType::kQ5 && kN == 8) return 26;
  return SbBytes<Q>();
}

// The N lane words of one SB at p.
template <QType Q>
HWY_INLINE VU LoadLanes(DU du, const uint8_t* HWY_RESTRICT p) {
  if constexpr (Q == QType::kQ2 || Q == QType::kQ4 || Q == QType::kQ8) {
    return hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
  } else if constexpr (Q == QType::kTernary) {
    return hn::PromoteTo(du, hn::LoadU(hn::Rebind<uint8_t, DU>(), p));
  } else if constexpr (Q == QType::kQ5) {
    // q5: lane k <- the 3 bytes from byte floor(5k / 2), shifted right by 4 bits when k is odd
    // (the lane starts at bit 20k): its 4 codes at bits 0, 5, 10, 15. Each 128-bit block takes
    // 4 lanes = 10 bytes.
#if HWY_TARGET == HWY_AVX3
    // The SB's 40 bytes (a masked load: nothing past them is touched); dwords 0-3 / 2-5 / 5-8 /
    // 7-9 to the blocks, whose 10 bytes then start at byte 0 / 2 / 0 / 2 of the block.
    alignas(64) static constexpr uint8_t kPat[64] = {
        0, 1, 2, 0x80, 2, 3, 4, 0x80, 5, 6, 7, 0x80, 7, 8, 9, 0x80,    //
        2, 3, 4, 0x80, 4, 5, 6, 0x80, 7, 8, 9, 0x80, 9, 10, 11, 0x80,  //
        0, 1, 2, 0x80, 2, 3, 4, 0x80, 5, 6, 7, 0x80, 7, 8, 9, 0x80,    //
        2, 3, 4, 0x80, 4, 5, 6, 0x80, 7, 8, 9, 0x80, 9, 10, 11, 0x80};
    const __m512i v = _mm512_maskz_loadu_epi32(0x3FF, p);
    const __m512i d = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 1, 2, 3, 2, 3, 4, 5, 5, 6, 7, 8, 7, 8, 9, 9), v);
    const __m512i r = _mm512_shuffle_epi8(d, _mm512_load_si512(kPat));
    return VU{_mm512_srlv_epi32(r, _mm512_set1_epi64(int64_t{4} << 32))};
#elif HWY_TARGET == HWY_AVX2
    alignas(32) static constexpr uint8_t kPat[32] = {
        0, 1, 2, 0x80, 2, 3, 4, 0x80, 5, 6, 7, 0x80, 7, 8, 9, 0x80,  //
        0, 1, 2, 0x80, 2, 3, 4, 0x80, 5, 6, 7, 0x80, 7, 8, 9, 0x80};
    __m256i v = _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    v = _mm256_inserti128_si256(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 10)), 1);
    const __m256i r = _mm256_shuffle_epi8(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(kPat)));
    return VU{_mm256_srlv_epi32(r, _mm256_set1_epi64x(int64_t{4} << 32))};
#else
    static_assert(kN == 4, "q5 lane loader expects 128-bit vectors");
    const hn::Repartition<uint8_t, DU> d8;
    alignas(16) static constexpr uint8_t kPat[16] = {0, 1, 2, 0x80, 2, 3, 4, 0x80, 5, 6, 7, 0x80, 7, 8, 9, 0x80};
    alignas(16) static constexpr uint32_t kShift[4] = {0, 4, 0, 4};
    const VU r = hn::BitCast(du, hn::TableLookupBytesOr0(hn::LoadU(d8, p), hn::Load(d8, kPat)));
    return hn::Shr(r, hn::Load(du, kShift));
#endif
  } else {
    // q3, q6: lane k <- bytes 3k, 3k+1, 3k+2 (zero-extended). Each 128-bit block takes 4 lanes =
    // 12 bytes; AVX2 loads the second block 4 bytes early so nothing past the SB is read.
#if HWY_TARGET == HWY_AVX3
    // The SB's 48 bytes (masked load), dwords 3b .. 3b+2 to block b, the same bytes of each block.
    alignas(64) static constexpr uint8_t kPat[64] = {
        0, 1, 2, 0x80, 3, 4, 5, 0x80, 6, 7, 8, 0x80, 9, 10, 11, 0x80,  //
        0, 1, 2, 0x80, 3, 4, 5, 0x80, 6, 7, 8, 0x80, 9, 10, 11, 0x80,  //
        0, 1, 2, 0x80, 3, 4, 5, 0x80, 6, 7, 8, 0x80, 9, 10, 11, 0x80,  //
        0, 1, 2, 0x80, 3, 4, 5, 0x80, 6, 7, 8, 0x80, 9, 10, 11, 0x80};
    const __m512i v = _mm512_maskz_loadu_epi32(0xFFF, p);
    const __m512i d = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 1, 2, 2, 3, 4, 5, 5, 6, 7, 8, 8, 9, 10, 11, 11), v);
    return VU{_mm512_shuffle_epi8(d, _mm512_load_si512(kPat))};
#elif HWY_TARGET == HWY_AVX2
    alignas(32) static constexpr uint8_t kPat[32] = {
        0, 1, 2, 0x80, 3, 4, 5, 0x80, 6, 7, 8, 0x80, 9, 10, 11, 0x80,  //
        4, 5, 6, 0x80, 7, 8, 9, 0x80, 10, 11, 12, 0x80, 13, 14, 15, 0x80};
    __m256i v = _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    v = _mm256_inserti128_si256(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)), 1);
    return VU{_mm256_shuffle_epi8(v, _mm256_load_si256(reinterpret_cast<const __m256i*>(kPat)))};
#else
    static_assert(kN == 4, "q3 lane loader expects 128-bit vectors");
    const hn::Repartition<uint8_t, DU> d8;
    alignas(16) static constexpr uint8_t kPat[16] = {0, 1, 2, 0x80, 3, 4, 5, 0x80, 6, 7, 8, 0x80, 9, 10, 11, 0x80};
    return hn::BitCast(du, hn::TableLookupBytesOr0(hn::LoadU(d8, p), hn::Load(d8, kPat)));
#endif
  }
}

// Codebook as lookup-table vectors (see Lookup); q8: t[0] = c_0, t[1] = step; q5 / q6 off
// AVX-512: the table in memory (lut) for gathers.
struct Tables {
  VF t[4];
  alignas(64) float lut[64];
  const float* pairs = nullptr;  // AVX2 q5 / q6: PairTable
};

// AVX2 decode of q5 / q6 looks codes up two at a time: one 64-bit gather element per pair of
// codes instead of two 32-bit ones (gathers bound these kernels there).
template <QType Q>
constexpr bool kPairLookup = HWY_TARGET == HWY_AVX2 && (Q == QType::kQ5 || Q == QType::kQ6);

// Pair table of a b-bit codebook of L = 2^b entries: entry i (two floats) = (c[i mod L],
// c[i / L]), i < L^2 (32 KiB for q6). Built once per thread and codebook (kept while the next
// call's codebook has the same bits).
inline const float* PairTable(int bits, const float* cb_unaligned) {
  thread_local Scratch<float> buf;
  thread_local float key[64];
  thread_local int key_bits = 0;
  const int L = 1 << bits;
  float c[64];
  std::memcpy(c, cb_unaligned, sizeof(float) * L);
  if (key_bits == bits && std::memcmp(key, c, sizeof(float) * L) == 0) return buf.p.get();
  float* t = buf.get(static_cast<size_t>(2 * L * L));
  for (int i = 0; i < L * L; ++i) {
    t[2 * i] = c[i & (L - 1)];
    t[2 * i + 1] = c[i >> bits];
  }
  std::memcpy(key, c, sizeof(float) * L);
  key_bits = bits;
  return t;
}

// Tables of the types with at most 16 levels.
template <QType Q>
HWY_INLINE Tables MakeSmallTables(const float* cb_unaligned) {
  const DF df;
  constexpr int L = qtype_levels(Q);
  static_assert(L <= 16, "small tables only");
  float cb[16];
  std::memcpy(cb, cb_unaligned, sizeof(float) * L);
  Tables tb;
  constexpr int nt = (L + kN - 1) / kN;
  alignas(64) float buf[4 * 16] = {};
#if HWY_TARGET == HWY_AVX3
  if constexpr (Q == QType::kTernary) {
    // Base-9 pairs (see Stepper): t0[r] = cb[r % 3], t1[r] = cb[r / 3] for r < 9.
    for (int i = 0; i < 9; ++i) {
      buf[i] = cb[i % 3];
      buf[16 + i] = cb[i / 3];
    }
    tb.t[0] = hn::Load(df, buf);
    tb.t[1] = hn::Load(df, buf + 16);
    tb.t[2] = tb.t[3] = hn::Zero(df);
    return tb;
  }
#endif
  // Entries repeat with period L (a power of two for b-bit types) so that permutes which use
  // only the low index bits see the right code; ternary pads with zeros.
  for (int i = 0; i < nt * kN; ++i) buf[i] = Q == QType::kTernary ? (i < L ? cb[i] : 0.0f) : cb[i % L];
  for (int i = 0; i < nt; ++i) tb.t[i] = hn::Load(df, buf + i * kN);
  for (int i = nt; i < 4; ++i) tb.t[i] = hn::Zero(df);
  return tb;
}

template <QType Q>
HWY_INLINE Tables MakeTables(const float* cb_unaligned) {
  const DF df;
  constexpr int L = qtype_levels(Q);
  if constexpr (Q == QType::kQ8) {
    float c[2];
    std::memcpy(c, cb_unaligned, sizeof c);
    Tables tb;
    tb.t[0] = hn::Set(df, c[0]);
    tb.t[1] = hn::Set(df, c[1] - c[0]);
    tb.t[2] = tb.t[3] = hn::Zero(df);
    return tb;
  } else if constexpr (Q == QType::kQ5 || Q == QType::kQ6) {
    Tables tb;
    std::memcpy(tb.lut, cb_unaligned, sizeof(float) * L);
    for (int i = 0; i < 4; ++i) tb.t[i] = hn::Zero(df);
#if HWY_TARGET == HWY_AVX3
    for (int i = 0; i < L / 16; ++i) tb.t[i] = hn::Load(df, tb.lut + 16 * i);
#endif
    if constexpr (kPairLookup<Q>) tb.pairs = PairTable(qtype_bits(Q), cb_unaligned);
    return tb;
  } else {
    return MakeSmallTables<Q>(cb_unaligned);
  }
}

// Truncating float -> int32 for small non-negative values (no overflow fix-up needed).
HWY_INLINE VU CvtSmall(VF v) {
#if HWY_TARGET == HWY_AVX3
  return VU{_mm512_cvttps_epi32(v.raw)};
#elif HWY_TARGET == HWY_AVX2
  return VU{_mm256_cvttps_epi32(v.raw)};
#else
  return hn::BitCast(DU(), hn::ConvertTo(DI(), v));
#endif
}

// Centroids of the codes in the low bits of `raw` (higher bits may hold other codes), from
// table `Tbl` (only the AVX3 ternary decoder uses a second table).
// Lookup of the types with at most 16 levels.
template <QType Q, int Tbl>
HWY_INLINE VF LookupSmall(const Tables& tb, VU raw) {
#if HWY_TARGET == HWY_AVX3
  return VF{_mm512_permutexvar_ps(raw.raw, tb.t[Tbl].raw)};
#elif HWY_TARGET == HWY_AVX2
  if constexpr (Q == QType::kQ4) {
    const __m256 lo = _mm256_permutevar8x32_ps(tb.t[0].raw, raw.raw);
    const __m256 hi = _mm256_permutevar8x32_ps(tb.t[1].raw, raw.raw);
    return VF{_mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(raw.raw, 28)))};
  } else {
    return VF{_mm256_permutevar8x32_ps(tb.t[0].raw, raw.raw)};
  }
#else
  const DF df;
  const DI di;
  constexpr int L = qtype_levels(Q);
  constexpr int nt = (L + kN - 1) / kN;
  const auto idx = hn::BitCast(di, hn::And(raw, hn::Set(DU(), Q == QType::kTernary ? 3u : uint32_t(L - 1))));
  if constexpr (nt == 1) {
    return hn::TableLookupLanes(tb.t[0], hn::IndicesFromVec(df, idx));
  } else {
    const auto lane = hn::IndicesFromVec(df, hn::And(idx, hn::Set(di, static_cast<int32_t>(kN - 1))));
    VF r = hn::TableLookupLanes(tb.t[0], lane);
    for (int j = 1; j < nt; ++j) {
      const auto m = hn::RebindMask(df, hn::Gt(idx, hn::Set(di, static_cast<int32_t>(j * kN - 1))));
      r = hn::IfThenElse(m, hn::TableLookupLanes(tb.t[j], lane), r);
    }
    return r;
  }
#endif
}

template <QType Q, int Tbl = 0>
HWY_INLINE VF Lookup(const Tables& tb, VU raw) {
  if constexpr (Q == QType::kQ8) {  // affine: c_0 + code * step
    const VF k = hn::ConvertTo(DF(), hn::BitCast(DI(), hn::And(raw, hn::Set(DU(), 0xFFu))));
    return hn::MulAdd(k, tb.t[1], tb.t[0]);
  } else if constexpr (Q == QType::kQ5 || Q == QType::kQ6) {
#if HWY_TARGET == HWY_AVX3
    // vpermt2ps indexes 32 entries by the low 5 bits; q6 picks its upper half by bit 5.
    const __m512 lo = _mm512_permutex2var_ps(tb.t[0].raw, raw.raw, tb.t[1].raw);
    if constexpr (Q == QType::kQ5) {
      return VF{lo};
    } else {
      const __m512 hi = _mm512_permutex2var_ps(tb.t[2].raw, raw.raw, tb.t[3].raw);
      return VF{_mm512_mask_blend_ps(_mm512_test_epi32_mask(raw.raw, _mm512_set1_epi32(32)), lo, hi)};
    }
#else
    constexpr uint32_t kMask = qtype_levels(Q) - 1;
    return hn::GatherIndex(DF(), tb.lut, hn::BitCast(DI(), hn::And(raw, hn::Set(DU(), kMask))));
#endif
  } else {
    return LookupSmall<Q, Tbl>(tb, raw);
  }
}

// Centroids of slots 2m and 2m + 1 of the lane words w (kPairLookup types): the pair indices
// (2 b bits from bit 2 b m) in lane order 0 1 4 5 2 3 6 7, so that the two 4-element gathers
// de-interleave into lane order with one vshufps each.
template <QType Q, int m>
HWY_INLINE void PairLookup(const Tables& tb, VU w, VF& c0, VF& c1) {
#if HWY_TARGET == HWY_AVX2
  constexpr int b = qtype_bits(Q);
  __m256i idx = _mm256_and_si256(_mm256_srli_epi32(w.raw, 2 * b * m), _mm256_set1_epi32((1 << (2 * b)) - 1));
  idx = _mm256_permutevar8x32_epi32(idx, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
  const double* pt = reinterpret_cast<const double*>(tb.pairs);
  const __m256 a = _mm256_castpd_ps(_mm256_i32gather_pd(pt, _mm256_castsi256_si128(idx), 8));
  const __m256 z = _mm256_castpd_ps(_mm256_i32gather_pd(pt, _mm256_extracti128_si256(idx, 1), 8));
  c0 = VF{_mm256_shuffle_ps(a, z, 0x88)};
  c1 = VF{_mm256_shuffle_ps(a, z, 0xDD)};
#else
  (void)tb;
  (void)w;
  c0 = c1 = hn::Zero(DF());
  static_assert(!kPairLookup<Q>, "pair lookups are AVX2 only");
#endif
}

// Per-row decoder state: yields the raw code vector of slot 0, 1, ... of an SB; kTable[s] is
// the lookup table of slot s.
template <QType Q>
struct Stepper {
  static constexpr int kTable[16] = {};
  VU w;
  HWY_INLINE void init(VU lanes) { w = lanes; }
  // Loads the lane words of the SB at p.
  HWY_INLINE void load(const uint8_t* HWY_RESTRICT p) { init(LoadLanes<Q>(DU(), p)); }
  template <int s>
  HWY_INLINE VU next() {
    const VU r = w;
    if constexpr (s + 1 < qmm::lane_slots(Q)) w = hn::ShiftRight<qtype_bits(Q)>(w);
    return r;
  }
};
template <>
struct Stepper<QType::kTernary> {
#if HWY_TARGET == HWY_AVX3
  // Digits in base-9 pairs: r01 = v mod 9 = c0 + 3 c1 indexes t0 (-> c0) and t1 (-> c1);
  // r23 = (v / 9) mod 9 likewise for c2, c3; c4 = v / 81. floor(v * fl(1/9)) == floor(v / 9)
  // and floor(v * fl(1/81)) == floor(v / 81) for integers v < 256 (fl(1/9) > 1/9 etc.).
  static constexpr int kTable[16] = {0, 1, 0, 1, 0};
  VU r01, r23, c4;
  HWY_INLINE void load(const uint8_t* HWY_RESTRICT p) { init(LoadLanes<QType::kTernary>(DU(), p)); }
  HWY_INLINE void init(VU lanes) {
    const DF df;
    const VF v = VF{_mm512_cvtepi32_ps(lanes.raw)};
    const VF q2 = hn::Floor(hn::Mul(v, hn::Set(df, 1.0f / 9.0f)));
    const VF q4 = hn::Floor(hn::Mul(v, hn::Set(df, 1.0f / 81.0f)));
    r01 = CvtSmall(hn::NegMulAdd(q2, hn::Set(df, 9.0f), v));
    r23 = CvtSmall(hn::NegMulAdd(q4, hn::Set(df, 9.0f), q2));
    c4 = CvtSmall(q4);
  }
  template <int s>
  HWY_INLINE VU next() {
    if constexpr (s < 2) return r01;
    else if constexpr (s < 4) return r23;
    else return c4;
  }
#else
  static constexpr int kTable[16] = {};
  VF q;  // remaining base-3 digits as a float (exact integers < 256)
  HWY_INLINE void load(const uint8_t* HWY_RESTRICT p) { init(LoadLanes<QType::kTernary>(DU(), p)); }
  HWY_INLINE void init(VU lanes) { q = hn::ConvertTo(DF(), hn::BitCast(DI(), lanes)); }
  template <int s>
  HWY_INLINE VU next() {
    const DF df;
    if constexpr (s == 4) {
      return CvtSmall(q);
    } else {
      // floor(q * fl(1/3)) == floor(q / 3) for integers q < 2^10 since fl(1/3) > 1/3.
      const VF nq = hn::Floor(hn::Mul(q, hn::Set(df, 1.0f / 3.0f)));
      const VF c = hn::NegMulAdd(nq, hn::Set(df, 3.0f), q);
      q = nq;
      return CvtSmall(c);
    }
  }
#endif
};

template <class F, int... I>
HWY_INLINE void ForSlotsImpl(F& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int S, class F>
HWY_INLINE void ForSlots(F&& f) {
  ForSlotsImpl(f, std::make_integer_sequence<int, S>{});
}

// Scale vector of SB j: lane k gets the scale of its group. sc: f32 scales of the row (padded).
HWY_INLINE VF LaneScales(DF df, const float* sc, const Layout& L, int64_t j, const IndF& ind) {
  return hn::TableLookupLanes(hn::LoadU(df, sc + L.g0[static_cast<size_t>(j)]), ind);
}

// out[t * ldo + r] = dot(row r, token t) for R rows and TT tokens in slot order (token t's
// slots at xk + t * L.len): each decoded centroid vector serves TT tokens.
template <QType Q, int R, int TT>
HWY_INLINE void GemvBlock(const Layout& L, const Tables& tb, const uint8_t* const* qrow, const float* const* sc,
                          const float* HWY_RESTRICT xk, float* out, int64_t ldo, const uint8_t* pf) {
  const DF df;
  const DI di;
  constexpr int S = qmm::lane_slots(Q);
  constexpr int64_t sbb = SbBytes<Q>();
  VF acc[TT][R];
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = hn::Zero(df);
  for (int64_t j = 0; j < L.nsb; ++j) {
    // The R rows are contiguous in memory but read interleaved, which the hardware prefetchers
    // follow poorly: prefetch the rows of a later block at the same pace.
    if (pf != nullptr)
      for (int64_t k = 0; k < R * sbb; k += 64) hwy::Prefetch(pf + j * R * sbb + k);
    Stepper<Q> st[R];
    for (int r = 0; r < R; ++r) st[r].load(qrow[r] + j * sbb);
    VF p[TT][R];
    const float* xj = xk + j * S * kN;
    if constexpr (kPairLookup<Q>) {
      ForSlots<S / 2>([&](auto m) {
        constexpr int mm = decltype(m)::value;
        VF xa[TT], xb[TT];
        for (int t = 0; t < TT; ++t) {
          xa[t] = hn::Load(df, xj + t * L.len + 2 * mm * kN);
          xb[t] = hn::Load(df, xj + t * L.len + (2 * mm + 1) * kN);
        }
        for (int r = 0; r < R; ++r) {
          VF c0, c1;
          PairLookup<Q, mm>(tb, st[r].w, c0, c1);
          for (int t = 0; t < TT; ++t) {
            if constexpr (mm == 0) {
              p[t][r] = hn::Mul(c0, xa[t]);
            } else {
              p[t][r] = hn::MulAdd(c0, xa[t], p[t][r]);
            }
            p[t][r] = hn::MulAdd(c1, xb[t], p[t][r]);
          }
        }
      });
    } else ForSlots<S>([&](auto s) {
      VF xv[TT];
      for (int t = 0; t < TT; ++t) xv[t] = hn::Load(df, xj + t * L.len + s * kN);
      for (int r = 0; r < R; ++r) {
        const VF c = Lookup<Q, Stepper<Q>::kTable[decltype(s)::value]>(tb, st[r].template next<decltype(s)::value>());
        for (int t = 0; t < TT; ++t) {
          if constexpr (s == 0) {
            p[t][r] = hn::Mul(c, xv[t]);
          } else {
            p[t][r] = hn::MulAdd(c, xv[t], p[t][r]);
          }
        }
      }
    });
    const auto ind = hn::IndicesFromVec(df, hn::LoadU(di, L.rel.data() + j * kN));
    for (int r = 0; r < R; ++r) {
      const VF scv = LaneScales(df, sc[r], L, j, ind);
      for (int t = 0; t < TT; ++t) acc[t][r] = hn::MulAdd(p[t][r], scv, acc[t][r]);
    }
  }
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) out[t * ldo + r] = hn::GetLane(hn::SumOfLanes(df, acc[t][r]));
}

// Row r of w in slot order, scaled: wk[L.len].
template <QType Q>
HWY_INLINE void DequantSlots(const Layout& L, const Tables& tb, const uint8_t* qrow, const float* sc, float* wk) {
  const DF df;
  const DI di;
  constexpr int S = qmm::lane_slots(Q);
  constexpr int64_t sbb = SbBytes<Q>();
  for (int64_t j = 0; j < L.nsb; ++j) {
    Stepper<Q> st;
    st.load(qrow + j * sbb);
    const auto ind = hn::IndicesFromVec(df, hn::LoadU(di, L.rel.data() + j * kN));
    const VF scv = LaneScales(df, sc, L, j, ind);
    float* out = wk + j * S * kN;
    ForSlots<S>([&](auto s) { constexpr int k = decltype(s)::value;
      hn::Store(hn::Mul(Lookup<Q, Stepper<Q>::kTable[k]>(tb, st.template next<k>()), scv), df, out + s * kN); });
  }
}

// out[t * ldo + r] = dot(w_r, x_t) for R f32 rows (stride ldw) and TT tokens (stride ldx);
// n is a multiple of N and the data aligned.
template <int R, int TT>
HWY_INLINE void GemmBlock(const float* HWY_RESTRICT w, int64_t ldw, const float* HWY_RESTRICT x, int64_t ldx,
                          int64_t n, float* out, int64_t ldo) {
  const DF df;
  VF acc[TT][R];
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = hn::Zero(df);
  for (int64_t c = 0; c < n; c += kN) {
    VF wv[R];
    for (int r = 0; r < R; ++r) wv[r] = hn::Load(df, w + r * ldw + c);
    for (int t = 0; t < TT; ++t) {
      const VF xv = hn::Load(df, x + t * ldx + c);
      for (int r = 0; r < R; ++r) acc[t][r] = hn::MulAdd(wv[r], xv, acc[t][r]);
    }
  }
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) out[t * ldo + r] = hn::GetLane(hn::SumOfLanes(df, acc[t][r]));
}

template <int R>
void GemmRowBlock(const float* w, int64_t n, const float* x, int64_t nt, float* y, int64_t ldy) {
  int64_t t = 0;
  if constexpr (kN == 16)  // 32 registers: a 4x4 block (16 accumulators)
    for (; t + 4 <= nt; t += 4) GemmBlock<R, 4>(w, n, x + t * n, n, n, y + t * ldy, ldy);
  for (; t + 2 <= nt; t += 2) GemmBlock<R, 2>(w, n, x + t * n, n, n, y + t * ldy, ldy);
  for (; t < nt; ++t) GemmBlock<R, 1>(w, n, x + t * n, n, n, y + t * ldy, ldy);
}

// f16 scales of one row -> f32, padded with N zeros.
HWY_INLINE void ScalesToF32(const uint16_t* HWY_RESTRICT s, int64_t n, float* HWY_RESTRICT out) {
  const DF df;
  const hn::Rebind<hwy::float16_t, DF> dh;
  int64_t i = 0;
  for (; i + kN <= n; i += kN)
    hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(s + i))), df, out + i);
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, s + i, sizeof h);
    out[i] = f16_to_f32(h);
  }
  for (int64_t k = 0; k < kN; ++k) out[n + k] = 0.0f;
}

constexpr int64_t kTokenTile = 64;
// Token counts up to which the decode kernel (decode once per 2 tokens) beats dequantizing
// into a scratch block (measured on Zen 4; AVX2 has too few registers for 2-token blocks).
constexpr int64_t kSmallT = HWY_TARGET == HWY_AVX3 ? 4 : 1;
constexpr int64_t kPrefetchBytes = 8192;  // decode prefetch distance (into L1)
constexpr int kMaxRows = 8;

// Rows per decode block. 8-row blocks (each x vector serving 8 rows) measured no faster than 4
// on Zen 4, so 4 everywhere; the block code takes any R <= kMaxRows.
template <QType Q>
constexpr int DecodeRows() {
  return 4;
}

template <QType Q>
bool LaneRows(const QuantView& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const Layout& L = GetLayout(Q, w.cols, w.group);
  if (!L.ok) return false;
  const Tables tb = MakeTables<Q>(w.codebook);
  constexpr int64_t sbb = SbBytes<Q>();
  const int64_t rb = w.row_bytes(), ng = w.groups_per_row();
  const uint8_t* qend = w.qweight + w.rows * rb;
  const int64_t scs = ng + kN;                // stride of one row's f32 scales
  const int64_t padded = L.nsb * sbb + 64;    // a row copied away from the end of the buffer
  thread_local Scratch<float> scb, xkb, wkb;
  thread_local Scratch<uint8_t> rowb;
  float* scales = scb.get(static_cast<size_t>(kMaxRows * scs));
  uint8_t* rowcopy = rowb.get(static_cast<size_t>(kMaxRows * padded));

  // Pointer to row r's packed bytes, readable up to the last SB's load extent.
  auto row_ptr = [&](int64_t r, int i) -> const uint8_t* {
    const uint8_t* p = w.qweight + r * rb;
    if (p + (L.nsb - 1) * sbb + LoadExtent<Q>() <= qend) return p;
    uint8_t* c = rowcopy + i * padded;
    std::memset(c, 0, static_cast<size_t>(padded));
    std::memcpy(c, p, static_cast<size_t>(rb));
    return c;
  };
  auto prep = [&](int64_t r, int i, const uint8_t** qrow, const float** sc) {
    qrow[i] = row_ptr(r, i);
    float* s = scales + i * scs;
    ScalesToF32(w.scales + r * ng, ng, s);
    sc[i] = s;
  };

  if (T <= kSmallT) {
    // Decode: stream the rows once; each decoded block serves up to 2 tokens at a time.
    float* xk = xkb.get(static_cast<size_t>(T * L.len));
    for (int64_t t = 0; t < T; ++t) ToSlots<Q>(L, x + t * w.cols, xk + t * L.len);
    const uint8_t* qrow[kMaxRows];
    const float* sc[kMaxRows];
    int64_t r = r0;
    // Prefetch whole blocks ahead, ~kPrefetchBytes (at least one block).
    const int64_t pf_blocks = std::max<int64_t>(1, kPrefetchBytes / (DecodeRows<Q>() * rb));
    auto block = [&](auto rows) {
      constexpr int R = decltype(rows)::value;
      for (int i = 0; i < R; ++i) prep(r + i, i, qrow, sc);
      const int64_t rp = r + R * pf_blocks;
      const uint8_t* pf = rp + R <= w.rows ? w.qweight + rp * rb : nullptr;
      float out[2 * R];
      int64_t t = 0;
      for (; t + 2 <= T; t += 2) {
        GemvBlock<Q, R, 2>(L, tb, qrow, sc, xk + t * L.len, out, R, pf);
        for (int i = 0; i < R; ++i) {
          y[t * ldy + r + i] = out[i];
          y[(t + 1) * ldy + r + i] = out[R + i];
        }
      }
      if (t < T) {
        GemvBlock<Q, R, 1>(L, tb, qrow, sc, xk + t * L.len, out, R, pf);
        for (int i = 0; i < R; ++i) y[t * ldy + r + i] = out[i];
      }
      r += R;
    };
    constexpr int RB = DecodeRows<Q>();
    while (r + RB <= r1) block(std::integral_constant<int, RB>{});
    while (r + 4 <= r1) block(std::integral_constant<int, 4>{});
    while (r < r1) block(std::integral_constant<int, 1>{});
    return true;
  }

  const int64_t tile = std::min(T, kTokenTile);
  float* xk = xkb.get(static_cast<size_t>(tile * L.len));
  float* wk = wkb.get(static_cast<size_t>(4 * L.len));
  for (int64_t t0 = 0; t0 < T; t0 += tile) {
    const int64_t nt = std::min(tile, T - t0);
    for (int64_t t = 0; t < nt; ++t) ToSlots<Q>(L, x + (t0 + t) * w.cols, xk + t * L.len);
    for (int64_t r = r0; r < r1; r += 4) {
      const int nr = static_cast<int>(std::min<int64_t>(4, r1 - r));
      const uint8_t* qrow[4];
      const float* sc[4];
      for (int i = 0; i < nr; ++i) {
        prep(r + i, i, qrow, sc);
        DequantSlots<Q>(L, tb, qrow[i], sc[i], wk + i * L.len);
      }
      float* yr = y + t0 * ldy + r;
      switch (nr) {
        case 4: GemmRowBlock<4>(wk, L.len, xk, nt, yr, ldy); break;
        case 3: GemmRowBlock<3>(wk, L.len, xk, nt, yr, ldy); break;
        case 2: GemmRowBlock<2>(wk, L.len, xk, nt, yr, ldy); break;
        default: GemmRowBlock<1>(wk, L.len, xk, nt, yr, ldy); break;
      }
    }
  }
  return true;
}

// q8 decode in column order. With the affine grid c_k = c_0 + k step, row r's product is
//   sum_g s_g (c_0 sum_{j in g} x_j + step sum_{j in g} k_j x_j),
// so the codes are only widened (u8 -> i32 -> f32: N codes per load, in column order, no slot
// order, no lookup) and multiplied into x; per-group partial sums take the group's scale, and
// the c_0 term is one short dot of the row's scales with the per-group sums of x (computed once
// per call, times c_0 / step, so that step multiplies the total once). G: the group size, 32, 64
// or 128 (whole vectors).
template <int R, int TT, int G>
HWY_INLINE void Q8GemvBlock(const QuantView& w, const uint8_t* const* qrow, const float* const* sc,
                            const float* HWY_RESTRICT x, const float* HWY_RESTRICT xsum, float step, float* out, int64_t ldo, const uint8_t* pf) {
  const DF df;
  const DI di;
  const hn::Rebind<uint8_t, DI> d8;
  static_assert(G % kN == 0, "groups of whole vectors");
  const int64_t ng = w.groups_per_row(), cols = w.cols;
  VF acc[TT][R];
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = hn::Zero(df);
  for (int64_t gi = 0; gi < ng; ++gi) {
    const int64_t c0i = gi * G;
    if (pf != nullptr)
      for (int64_t k = 0; k < R * G; k += 64) hwy::Prefetch(pf + gi * R * G + k);
    VF p[TT][R];
    ForSlots<G / kN>([&](auto v) {
      constexpr int64_t c = decltype(v)::value * kN;
      VF xv[TT];
      for (int t = 0; t < TT; ++t) xv[t] = hn::LoadU(df, x + t * cols + c0i + c);
      for (int r = 0; r < R; ++r) {
        const VF k = hn::ConvertTo(df, hn::BitCast(di, hn::PromoteTo(di, hn::LoadU(d8, qrow[r] + c0i + c))));
        for (int t = 0; t < TT; ++t) {
          if constexpr (c == 0) {
            p[t][r] = hn::Mul(k, xv[t]);
          } else {
            p[t][r] = hn::MulAdd(k, xv[t], p[t][r]);
          }
        }
      }
    });
    for (int r = 0; r < R; ++r) {
      const VF s = hn::Set(df, sc[r][gi]);
      for (int t = 0; t < TT; ++t) acc[t][r] = hn::MulAdd(p[t][r], s, acc[t][r]);
    }
  }
  // + sum_g s_g (c_0 / step) sum_{j in g} x_j (xsum holds the scaled sums; both padded with N zeros).
  for (int t = 0; t < TT; ++t)
    for (int r = 0; r < R; ++r) {
      VF a = acc[t][r];
      for (int64_t gi = 0; gi < ng; gi += kN)
        a = hn::MulAdd(hn::LoadU(df, sc[r] + gi), hn::LoadU(df, xsum + t * (ng + kN) + gi), a);
      out[t * ldo + r] = step * hn::GetLane(hn::SumOfLanes(df, a));
    }
}

// Decode (T <= kSmallT) of a q8 matrix with an affine codebook and groups of G = 32, 64 or 128;
// false (nothing done) when the grid's step is 0 or c_0 / step is not finite.
template <int G>
bool Q8DecodeRows(const QuantView& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const DF df;
  float cb[2];
  std::memcpy(cb, w.codebook, sizeof cb);
  const float c0 = cb[0], step = cb[1] - cb[0];
  if (step == 0.0f || !std::isfinite(c0 / step)) return false;
  const int64_t rb = w.row_bytes(), ng = w.groups_per_row();
  const int64_t scs = ng + kN;
  thread_local Scratch<float> scb, xsb;
  float* scales = scb.get(static_cast<size_t>(kMaxRows * scs));
  const float ratio = c0 / step;
  float* xsum = xsb.get(static_cast<size_t>(T * scs));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t gi = 0; gi < ng; ++gi) {
      VF a = hn::Zero(df);
      for (int64_t c = 0; c < G; c += kN) a = hn::Add(a, hn::LoadU(df, x + t * w.cols + gi * G + c));
      xsum[t * scs + gi] = ratio * hn::GetLane(hn::SumOfLanes(df, a));
    }
    std::fill(xsum + t * scs + ng, xsum + (t + 1) * scs, 0.0f);
  }
  const uint8_t* qrow[kMaxRows];
  const float* sc[kMaxRows];
  const int64_t pf_blocks = std::max<int64_t>(1, kPrefetchBytes / (4 * rb));
  int64_t r = r0;
  auto block = [&](auto rows) {
    constexpr int R = decltype(rows)::value;
    for (int i = 0; i < R; ++i) {
      qrow[i] = w.qweight + (r + i) * rb;
      float* s = scales + i * scs;
      ScalesToF32(w.scales + (r + i) * ng, ng, s);
      sc[i] = s;
    }
    const int64_t rp = r + R * pf_blocks;
    const uint8_t* pf = rp + R <= w.rows ? w.qweight + rp * rb : nullptr;
    float out[2 * R];
    int64_t t = 0;
    for (; t + 2 <= T; t += 2) {
      Q8GemvBlock<R, 2, G>(w, qrow, sc, x + t * w.cols, xsum + t * scs, step, out, R, pf);
      for (int i = 0; i < R; ++i) {
        y[t * ldy + r + i] = out[i];
        y[(t + 1) * ldy + r + i] = out[R + i];
      }
    }
    if (t < T) {
      Q8GemvBlock<R, 1, G>(w, qrow, sc, x + t * w.cols, xsum + t * scs, step, out, R, pf);
      for (int i = 0; i < R; ++i) y[t * ldy + r + i] = out[i];
    }
    r += R;
  };
  while (r + 4 <= r1) block(std::integral_constant<int, 4>{});
  while (r < r1) block(std::integral_constant<int, 1>{});
  return true;
}

#endif  // HWY_TARGET != HWY_SCALAR

float DotF32(const float* HWY_RESTRICT a, const float* HWY_RESTRICT b, int64_t n) {
  const DF df;
  VF acc = hn::Zero(df);
  int64_t i = 0;
  for (; i + kN <= n; i += kN) acc = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc);
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Plain path: dequantize each row to f32 in column order, then dot with every token.
void NaturalRows(const QuantView& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(w.cols));
  const int64_t ng = w.groups_per_row(), gb = qtype_group_bytes(w.type, w.group);
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t gi = 0; gi < ng; ++gi) {
      const uint8_t* grp = w.qweight + r * ng * gb + gi * gb;
      const float s = w.scale(r * ng + gi);
      for (int64_t j = 0; j < w.group; ++j) row[gi * w.group + j] = w.centroid(qmm::code_at(w.type, grp, j)) * s;
    }
    for (int64_t t = 0; t < T; ++t) y[t * ldy + r] = DotF32(row.data(), x + t * w.cols, w.cols);
  }
}

void QuantRows(const QuantView& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1) {
#if HWY_TARGET != HWY_SCALAR
  {
    if (qmm::lanes_aligned(w.type, w.group)) {
      switch (w.type) {
        case QType::kQ2: if (LaneRows<QType::kQ2>(w, x, T, y, ldy, r0, r1)) return; break;
        case QType::kQ3: if (LaneRows<QType::kQ3>(w, x, T, y, ldy, r0, r1)) return; break;
        case QType::kQ4: if (LaneRows<QType::kQ4>(w, x, T, y, ldy, r0, r1)) return; break;
        case QType::kTernary: if (LaneRows<QType::kTernary>(w, x, T, y, ldy, r0, r1)) return; break;
        case QType::kQ5: if (LaneRows<QType::kQ5>(w, x, T, y, ldy, r0, r1)) return; break;
        case QType::kQ6: if (LaneRows<QType::kQ6>(w, x, T, y, ldy, r0, r1)) return; break;
        case QType::kQ8:
          if (!qmm::affine_codebook(w.codebook)) break;
          if (T <= kSmallT) {
            if (w.group == 32 && Q8DecodeRows<32>(w, x, T, y, ldy, r0, r1)) return;
            if (w.group == 64 && Q8DecodeRows<64>(w, x, T, y, ldy, r0, r1)) return;
            if (w.group == 128 && Q8DecodeRows<128>(w, x, T, y, ldy, r0, r1)) return;
          }
          if (LaneRows<QType::kQ8>(w, x, T, y, ldy, r0, r1)) return;
          break;
      }
    }
  }
#endif
  NaturalRows(w, x, T, y, ldy, r0, r1);
}

const char* KernelTarget() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace spool::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace spool::ops {

HWY_EXPORT(QuantRows);
HWY_EXPORT(HadamardRotate);
HWY_EXPORT(HadamardTransform);
HWY_EXPORT(KernelTarget);

const char* quant_kernel_target() { return HWY_DYNAMIC_DISPATCH(KernelTarget)(); }

const float* q8_grid() {
  static const std::array<float, 256> grid = [] {
    std::array<float, 256> c{};
    for (int k = 0; k < 256; ++k) c[static_cast<size_t>(k)] = static_cast<float>(2 * k - 255) / 64.0f;
    return c;
  }();
  return grid.data();
}

float QuantView::scale(int64_t i) const {
  uint16_t h;
  std::memcpy(&h, scales + i, sizeof h);
  return f16_to_f32(h);
}

void validate(const QuantView& w) {
  if (w.rows < 0 || w.cols <= 0)
    fail("quantized matrix: bad shape [%lld x %lld]", static_cast<long long>(w.rows), static_cast<long long>(w.cols));
  const int g = w.group;
  if (g <= 0 || g > w.cols || w.cols % g != 0 || !(g == 32 || g == 64 || g == 128 || g == w.cols))
    fail("quantized matrix [%lld x %lld]: group size %d must be 32, 64 or 128 (or the column count) and divide the "
         "column count",
         static_cast<long long>(w.rows), static_cast<long long>(w.cols), g);
  if (qtype_levels(w.type) < 3)  // 1 for a value outside the enum
    fail("quantized matrix: unknown type %d", static_cast<int>(w.type));
  if (w.rows > 0 && (w.qweight == nullptr || w.scales == nullptr || w.codebook == nullptr))
    fail("quantized matrix [%lld x %lld]: missing qweight, scales or codebook", static_cast<long long>(w.rows),
         static_cast<long long>(w.cols));
}

void quant_matmul_rows(const QuantView& w, const float* x_rot, int64_t T, float* y, int64_t ldy, int64_t r0,
                       int64_t r1) {
  validate(w);
  if (r0 < 0 || r1 > w.rows) fail("quant_matmul_rows: rows [%lld, %lld) outside [0, %lld)", static_cast<long long>(r0),
                                  static_cast<long long>(r1), static_cast<long long>(w.rows));
  if (r0 >= r1 || T <= 0) return;
  HWY_DYNAMIC_DISPATCH(QuantRows)(w, x_rot, T, y, ldy, r0, r1);
}

void hadamard_transform(float* x, int64_t n) {
  if (n <= 0) return;
  HWY_DYNAMIC_DISPATCH(HadamardTransform)(x, n);
}

void hadamard_rotate(const int8_t* signs, const float* x, int64_t n, float* out) {
  if (n <= 0) return;
  HWY_DYNAMIC_DISPATCH(HadamardRotate)(signs, x, n, out);
}

void quant_matmul(const QuantView& w, const float* x, int64_t T, float* y, ThreadPool* pool) {
  validate(w);
  if (T <= 0 || w.rows == 0) return;
  const float* xr = x;
  thread_local qmm::Scratch<float> rot;
  if (w.signs != nullptr) {
    float* buf = rot.get(static_cast<size_t>(T * w.cols));
    for (int64_t t = 0; t < T; ++t) hadamard_rotate(w.signs, x + t * w.cols, w.cols, buf + t * w.cols);
    xr = buf;
  }
  const int64_t work = w.rows * w.cols * T;
  if (pool == nullptr || pool->size() == 1 || work < (1 << 15)) {
    HWY_DYNAMIC_DISPATCH(QuantRows)(w, xr, T, y, w.rows, 0, w.rows);
    return;
  }
  pool->parallel_for(w.rows, 16, [&](int64_t b, int64_t e, int) {
    HWY_DYNAMIC_DISPATCH(QuantRows)(w, xr, T, y, w.rows, b, e);
  });
}

void quant_matmul_reference(const QuantView& w, const float* x, int64_t T, float* y) {
  validate(w);
  const int64_t n = w.cols, ng = w.groups_per_row(), gb = qtype_group_bytes(w.type, w.group);
  std::vector<double> xr(static_cast<size_t>(T * n)), row(static_cast<size_t>(n));
  for (int64_t t = 0; t < T; ++t) {
    double* v = xr.data() + t * n;
    for (int64_t c = 0; c < n; ++c) v[c] = static_cast<double>(x[t * n + c]) * (w.signs ? w.signs[c] : 1);
    if (w.signs != nullptr) qmm::fwht_double(v, n);
  }
  for (int64_t r = 0; r < w.rows; ++r) {
    for (int64_t gi = 0; gi < ng; ++gi) {
      const uint8_t* grp = w.qweight + (r * ng + gi) * gb;
      const double s = w.scale(r * ng + gi);
      for (int64_t j = 0; j < w.group; ++j)
        row[gi * w.group + j] = static_cast<double>(w.centroid(qmm::code_at(w.type, grp, j))) * s;
    }
    for (int64_t t = 0; t < T; ++t) {
      double acc = 0;
      for (int64_t c = 0; c < n; ++c) acc += row[c] * xr[t * n + c];
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

}  // namespace spool::ops
#endif  // HWY_ONCE
