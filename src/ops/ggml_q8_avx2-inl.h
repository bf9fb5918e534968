// AVX2 int8-activation kernels for Q4_K / Q6_K (see ggml_q8.h). Included by ggml_q8.cpp inside
// the Highway namespace of the AVX2 target only (no include guard: per-target code).
//
// Decode (T = 1): rows straight from the weights, 4 at a time, 32 columns per vector. A 32-byte
// chunk of Q4_K codes holds one sub-block in its low nibbles and the next in its high ones (column
// order, so the column-order activations serve: no Q8Acts::q_k4 here); a Q6_K chunk of 32 columns
// spans two 16-column sub-blocks, one per 128-bit lane. vpmaddubsw (unsigned codes x signed
// activations, pairs to int16; at most 2 * 63 * 127, no saturation) then vpmaddwd with the int16
// sub-block scale broadcast per lane (vpshufb) and vpaddd, or AVX-VNNI's vpdpwssd (VEX form) that
// does both, into one int32 vector per row and block; then acc += float(lanes) * (d * d_a) and the
// format's offset term against the activations' group sums (Q4_K: -dmin * min * sum per
// sub-block; Q6_K: -32 * d * scale * sum per group, the codes' bias).
// Prefill (T >= 2): rows decoded into PanelBlocks (ggml_q8_panel.h; codes interleaved as the
// activations, so 32-bit lane g of a vector is 4 columns of group g) once per tile of 64 tokens;
// a 2-row x 4-token register tile runs per half block (8 groups, one int32 lane each) 4 vpdpbusd
// per row and token, or without VNNI 2 x (2 vpmaddubsw, vpaddw, vpmaddwd by ones, vpaddd) (two
// pair sums of at most 2 * 63 * 127 fit int16), then acc += float(lanes) * sd * d_a + c * bs.
// The integer dots are exact, so the VNNI and non-VNNI variants give the same bits.

#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
namespace q8avx2 {

// int32 lanes += the int16 pair products of a and b (vpmaddwd + vpaddd, or AVX-VNNI vpdpwssd).
template <bool kVnni>
HWY_INLINE __m256i Dpwssd(__m256i acc, __m256i a, __m256i b) {
  if constexpr (kVnni) {
    // VEX-encoded AVX-VNNI: the AVX2 target's flags do not enable the intrinsic; the caller checked the CPU.
    asm("%{vex%} vpdpwssd %[b], %[a], %[acc]" : [acc] "+x"(acc) : [a] "x"(a), [b] "x"(b));
    return acc;
  } else {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
  }
}

// int32 lanes += the sums of 4 products of unsigned bytes u and signed bytes s (AVX-VNNI vpdpbusd).
HWY_INLINE __m256i Dpbusd(__m256i acc, __m256i u, __m256i s) {
  asm("%{vex%} vpdpbusd %[s], %[u], %[acc]" : [acc] "+x"(acc) : [u] "x"(u), [s] "x"(s));
  return acc;
}

HWY_INLINE __m256i Load(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

HWY_INLINE float Half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

HWY_INLINE float ReduceAdd(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// vpshufb index that broadcasts int16 lane j (0..7) of each 128-bit lane.
HWY_INLINE __m256i Bcast16(int j) { return _mm256_set1_epi16(static_cast<int16_t>(((2 * j + 1) << 8) | (2 * j))); }

// The 12 packed Q4_K scale bytes -> bytes 0..7 scales, 8..15 mins (as ggml::unpack_k4_scales).
HWY_INLINE __m128i UnpackK4Scales(const uint8_t* HWY_RESTRICT q) {
  uint8_t out[16];
  ggml::unpack_k4_scales(q, out);
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(out));
}

// Q4_K block at p against one token's column-order activation block qa (scale da): int32 dots
// into acc (scaled by d * da), the min term against sub (the token block's activation sums per
// 32-column sub-block, in the order 0, 1, 4, 5, 2, 3, 6, 7 of _mm256_hadd_ps).
template <bool kVnni>
HWY_INLINE __m256 DotQ4K(const uint8_t* HWY_RESTRICT p, const int8_t* HWY_RESTRICT qa, float da, __m256 sub, __m256 acc) {
  const __m128i sm = UnpackK4Scales(p + 4);
  const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));  // scales 0..7 (int16), both lanes
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  __m256i s = _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j) {
    const __m256i z = Load(p + 16 + 32 * j);
    const __m256i plo = _mm256_maddubs_epi16(_mm256_and_si256(z, m4), Load(qa + 64 * j));
    const __m256i phi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(z, 4), m4), Load(qa + 64 * j + 32));
    s = Dpwssd<kVnni>(s, plo, _mm256_shuffle_epi8(sc, Bcast16(2 * j)));
    s = Dpwssd<kVnni>(s, phi, _mm256_shuffle_epi8(sc, Bcast16(2 * j + 1)));
  }
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(Half(p) * da), acc);
  const __m128i mn = _mm_shuffle_epi8(sm, _mm_setr_epi8(8, 9, 12, 13, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1));
  const __m256 mf = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn)), _mm256_set1_ps(-Half(p + 2)));
  return _mm256_fmadd_ps(mf, sub, acc);
}

// Q6_K block at p against one token's column-order activation block qa (scale da, group sums bs [16]).
template <bool kVnni>
HWY_INLINE __m256 DotQ6K(const uint8_t* HWY_RESTRICT p, const int8_t* HWY_RESTRICT qa, float da, const float* HWY_RESTRICT bs,
                         __m256 acc) {
  const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192));
  const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
  const __m256i scl = _mm256_permute2x128_si256(sc16, sc16, 0x00), sch = _mm256_permute2x128_si256(sc16, sc16, 0x11);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  __m256i s = _mm256_setzero_si256();
  for (int h = 0; h < 2; ++h) {
    const __m256i l0 = Load(p + 64 * h), l1 = Load(p + 64 * h + 32), qh = Load(p + 128 + 32 * h);
    __m256i q[4];
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
    const __m256i src = h == 0 ? scl : sch;
    for (int m = 0; m < 4; ++m) {
      // columns 128 h + 32 m + [0, 32): sub-blocks 8 h + 2 m (low lane) and 8 h + 2 m + 1 (high lane)
      const __m256i idx = _mm256_setr_epi8(4 * m, 4 * m + 1, 4 * m, 4 * m + 1, 4 * m, 4 * m + 1, 4 * m, 4 * m + 1, 4 * m,
                                           4 * m + 1, 4 * m, 4 * m + 1, 4 * m, 4 * m + 1, 4 * m, 4 * m + 1, 4 * m + 2,
                                           4 * m + 3, 4 * m + 2, 4 * m + 3, 4 * m + 2, 4 * m + 3, 4 * m + 2, 4 * m + 3,
                                           4 * m + 2, 4 * m + 3, 4 * m + 2, 4 * m + 3, 4 * m + 2, 4 * m + 3, 4 * m + 2, 4 * m + 3);
      s = Dpwssd<kVnni>(s, _mm256_maddubs_epi16(q[m], Load(qa + 128 * h + 32 * m)), _mm256_shuffle_epi8(src, idx));
    }
  }
  const float d = Half(p + 208);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d * da), acc);
  const __m256 slo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8));
  const __m256 shi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc8, 8)));
  const __m256 off = _mm256_fmadd_ps(slo, _mm256_loadu_ps(bs), _mm256_mul_ps(shi, _mm256_loadu_ps(bs + 8)));
  return _mm256_fmadd_ps(off, _mm256_set1_ps(-32.0f * d), acc);
}

constexpr int kRows = 4;                 // rows per decode group
constexpr int64_t kPrefetchBytes = 32768;  // decode prefetch distance (as the AVX-512 kernel)

// Decode: R rows x 1 token.
template <GgmlType Q, bool kVnni, int R>
HWY_INLINE void GemvRows(const uint8_t* rows, int64_t rb, const Q8Acts& a, float* y, const uint8_t* pf) {
  constexpr int64_t kBytes = Q == GgmlType::Q4_K ? 144 : 210;
  __m256 acc[R];
  for (int i = 0; i < R; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < a.blocks(); ++b) {
    if (pf != nullptr)
      for (int i = 0; i < R; ++i)
        for (int64_t o = 0; o < kBytes + 63; o += 64) hwy::Prefetch(pf + i * rb + b * kBytes + o);
    const int8_t* qa = a.q.data() + b * kQ8Block;
    const float* bs = a.bs.data() + b * 16;
    const float da = a.d[b];
    if constexpr (Q == GgmlType::Q4_K) {
      const __m256 sub = _mm256_hadd_ps(_mm256_loadu_ps(bs), _mm256_loadu_ps(bs + 8));
      for (int i = 0; i < R; ++i) acc[i] = DotQ4K<kVnni>(rows + i * rb + b * kBytes, qa, da, sub, acc[i]);
    } else {
      for (int i = 0; i < R; ++i) acc[i] = DotQ6K<kVnni>(rows + i * rb + b * kBytes, qa, da, bs, acc[i]);
    }
  }
  for (int i = 0; i < R; ++i) y[i] = ReduceAdd(acc[i]);
}

constexpr int64_t kTokenTile = 64;  // tokens per pass over a row group
constexpr int64_t kSegBlocks = 4;   // blocks per panel segment
constexpr int kPanelRows = 2, kPanelTok = 4;

// Prefill register tile: R panel rows (nb blocks each) x TT tokens from token t; acc [TT][R][16].
template <bool kVnni, int R, int TT>
HWY_INLINE void PanelTile(const q8::PanelBlock* HWY_RESTRICT panel, int64_t nb, const Q8Acts& a, int64_t b0, int64_t t,
                          float* HWY_RESTRICT acc) {
  const int64_t anb = a.blocks();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b)
    for (int h = 0; h < 2; ++h) {  // groups 8 h .. 8 h + 7
      __m256i s[R * TT];
      for (int i = 0; i < R * TT; ++i) s[i] = _mm256_setzero_si256();
      const int8_t* x0 = a.q.data() + t * a.cols + (b0 + b) * kQ8Block + 32 * h;
      for (int k = 0; k < 4; k += 2) {
        __m256i x[TT][2];
        for (int j = 0; j < TT; ++j) {
          x[j][0] = Load(x0 + j * a.cols + 64 * k);
          x[j][1] = Load(x0 + j * a.cols + 64 * k + 64);
        }
        for (int i = 0; i < R; ++i) {
          const uint8_t* wq = panel[i * kSegBlocks + b].q + 32 * h + 64 * k;
          const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wq));
          const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wq + 64));
          for (int j = 0; j < TT; ++j) {
            if constexpr (kVnni) {
              s[i * TT + j] = Dpbusd(Dpbusd(s[i * TT + j], w0, x[j][0]), w1, x[j][1]);
            } else {
              const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(w0, x[j][0]), _mm256_maddubs_epi16(w1, x[j][1]));
              s[i * TT + j] = _mm256_add_epi32(s[i * TT + j], _mm256_madd_epi16(p, ones));
            }
          }
        }
      }
      for (int j = 0; j < TT; ++j) {
        const int64_t ab = (t + j) * anb + b0 + b;
        const __m256 da = _mm256_set1_ps(a.d[ab]), bs = _mm256_loadu_ps(a.bs.data() + ab * 16 + 8 * h);
        for (int i = 0; i < R; ++i) {
          const q8::PanelBlock& pb = panel[i * kSegBlocks + b];
          float* o = acc + (j * R + i) * 16 + 8 * h;
          const __m256 dot = _mm256_mul_ps(_mm256_cvtepi32_ps(s[i * TT + j]), _mm256_load_ps(pb.sd + 8 * h));
          _mm256_store_ps(o, _mm256_fmadd_ps(_mm256_load_ps(pb.c + 8 * h), bs, _mm256_fmadd_ps(dot, da, _mm256_load_ps(o))));
        }
      }
    }
}

// The kernels of one variant (with or without AVX-VNNI) for the shared row drivers.
template <bool kVnni>
struct Kernels {
  template <GgmlType Q, int R>
  static HWY_INLINE void Gemv(const uint8_t* rows, int64_t rb, const Q8Acts& a, float* y, const uint8_t* pf) {
    GemvRows<Q, kVnni, R>(rows, rb, a, y, pf);
  }
  template <int R, int TT>
  static HWY_INLINE void Tile(const q8::PanelBlock* HWY_RESTRICT panel, int64_t nb, const Q8Acts& a, int64_t b0, int64_t t,
                              float* HWY_RESTRICT acc) {
    PanelTile<kVnni, R, TT>(panel, nb, a, b0, t, acc);
  }
  static HWY_INLINE float Sum16(const float* o) { return ReduceAdd(_mm256_add_ps(_mm256_load_ps(o), _mm256_load_ps(o + 8))); }
};

#include "ops/ggml_q8_rows-inl.h"  // IWYU pragma: keep (DecodeRowRange, PrefillRowRange)

template <GgmlType Q, bool kVnni>
void TypedRows(const GgmlView& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  if (a.T == 1) return DecodeRowRange<Kernels<kVnni>, Q>(w, a, y, r0, r1);
  PrefillRowRange<Kernels<kVnni>, kPanelRows>(w, a, y, ldy, r0, r1);
}

// Whether the CPU has AVX-VNNI (CPUID.(EAX=7, ECX=1):EAX bit 4; the VEX-encoded vpdpbusd / vpdpwssd).
inline bool CpuHasAvxVnni() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) == 0) return false;
  return ((eax >> 4) & 1) != 0;
}

inline bool UseVnni() {
  static const bool has = CpuHasAvxVnni();
  return has && q8::g_allow_dot_ext.load(std::memory_order_relaxed);
}

void Rows(const GgmlView& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1) {
  const bool vnni = UseVnni();
  if (w.type == GgmlType::Q4_K) {
    if (vnni) return TypedRows<GgmlType::Q4_K, true>(w, a, y, ldy, r0, r1);
    return TypedRows<GgmlType::Q4_K, false>(w, a, y, ldy, r0, r1);
  }
  if (vnni) return TypedRows<GgmlType::Q6_K, true>(w, a, y, ldy, r0, r1);
  TypedRows<GgmlType::Q6_K, false>(w, a, y, ldy, r0, r1);
}

}  // namespace q8avx2
#endif  // HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
