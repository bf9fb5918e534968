// Internal to the int8-activation kernels (ggml_q8.cpp, ggml_q8_avx2-inl.h, ggml_q8_neon.cpp):
// the portable form of a decoded weight block for the prefill panels of the AVX2 and NEON
// kernels, and the NEON kernels' entry point. Not a public API.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

#include "common/ggml_types.h"
#include "ops/ggml_blocks.h"
#include "ops/ggml_q8.h"
#include "ops/ggml_scales.h"
#include "ops/weights.h"

namespace spool::ops::q8 {

/// q8_allow_dot_extension()'s switch (read by the AVX2 and NEON dispatch).
inline std::atomic<bool> g_allow_dot_ext{true};

/// f16 at p (unaligned) as f32.
inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

/// One weight block of a prefill panel: the codes as unsigned bytes (Q4_K 0..15, Q6_K 0..63,
/// the Q6_K bias of 32 not subtracted) in the interleaved order of Q8Acts (column 16 g + 4 k + e
/// at byte 64 k + 4 g + e), and per 16-column group g the f32 scale sd[g] = d * (the group's
/// sub-block scale) (exact: 11 x 8 bits) and the offset coefficient c[g] that multiplies the
/// activations' group sum bs (Q4_K: -dmin * min of the sub-block; Q6_K: -32 * d * scale).
struct PanelBlock {
  alignas(64) uint8_t q[kQ8Block];
  alignas(32) float sd[16];
  alignas(32) float c[16];
};

/// Decodes the Q4_K (144 bytes) or Q6_K (210 bytes) block at p into a PanelBlock (the format
/// definitions of dot_row in ggml_q8.cpp; plain code that the compiler vectorizes per target:
/// its cost is shared by the up to 64 tokens of a panel tile).
inline void decode_panel_block(GgmlType t, const uint8_t* p, PanelBlock& out) {
  alignas(64) uint8_t codes[kQ8Block];  // column order
  if (t == GgmlType::Q4_K) {
    const float d = half_at(p), dmin = half_at(p + 2);
    uint8_t sm[16];
    ggml::unpack_k4_scales(p + 4, sm);
    const uint8_t* qs = p + 16;
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < 32; ++l) {
        codes[64 * j + l] = qs[32 * j + l] & 0xF;
        codes[64 * j + 32 + l] = qs[32 * j + l] >> 4;
      }
    for (int g = 0; g < 16; ++g) {
      out.sd[g] = d * static_cast<float>(sm[g / 2]);
      out.c[g] = -dmin * static_cast<float>(sm[8 + g / 2]);
    }
  } else {  // Q6_K
    const uint8_t *ql = p, *qh = p + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192);
    const float d = half_at(p + 208);
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 32; ++l) {
        const uint8_t hb = qh[32 * h + l];
        codes[128 * h + l] = static_cast<uint8_t>((ql[64 * h + l] & 0xF) | ((hb & 3) << 4));
        codes[128 * h + 32 + l] = static_cast<uint8_t>((ql[64 * h + 32 + l] & 0xF) | (((hb >> 2) & 3) << 4));
        codes[128 * h + 64 + l] = static_cast<uint8_t>((ql[64 * h + l] >> 4) | (((hb >> 4) & 3) << 4));
        codes[128 * h + 96 + l] = static_cast<uint8_t>((ql[64 * h + 32 + l] >> 4) | (((hb >> 6) & 3) << 4));
      }
    for (int g = 0; g < 16; ++g) {
      out.sd[g] = d * static_cast<float>(sc[g]);
      out.c[g] = -32.0f * d * static_cast<float>(sc[g]);
    }
  }
  // interleave: 4-byte word 4 g + k (columns 16 g + 4 k ..) -> word 16 k + g
  uint32_t w[64], o[64];
  std::memcpy(w, codes, sizeof w);
  for (int g = 0; g < 16; ++g)
    for (int k = 0; k < 4; ++k) o[16 * k + g] = w[4 * g + k];
  std::memcpy(out.q, o, sizeof o);
}

/// The NEON kernels (aarch64; ggml_q8_neon.cpp): ggml_q8_matmul_rows() for Q4_K / Q6_K with
/// the dot-product extension's sdot when `dotprod` (the caller checks the CPU), else with
/// vmull / vpadal. Arguments checked by the caller.
void neon_rows(const GgmlView& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1, bool dotprod);

/// Whether this aarch64 CPU has the dot-product extension (HWCAP_ASIMDDP); false elsewhere.
bool cpu_has_dotprod();

}  // namespace spool::ops::q8
