// Packed sub-block scales of the ggml K-quant formats, shared by the f32 kernels
// (ggml_blocks.cpp) and the int8-activation kernels (ggml_q8.cpp). Source: ggml-quants.c
// (get_scale_min_k4, dequantize_row_q4_K).
#pragma once

#include <cstdint>
#include <cstring>

namespace spool::ops::ggml {

/// Q4_K / Q5_K 6-bit (scale, min) pair j (0..7) of the 12 packed bytes q (ggml get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, int* sc, int* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

/// All 8 (scale, min) pairs of the 12 packed bytes q at once (word arithmetic, no per-pair
/// branches): out16[0..7] = scales 0..7, out16[8..15] = mins 0..7, as scale_min_k4.
inline void unpack_k4_scales(const uint8_t* q, uint8_t* out16) {
  constexpr uint32_t kM1 = 0x3f3f3f3f, kM2 = 0x0f0f0f0f, kM3 = 0x03030303;
  uint32_t u[4];
  std::memcpy(u, q, 12);
  u[3] = ((u[2] >> 4) & kM2) | (((u[1] >> 6) & kM3) << 4);
  const uint32_t m1 = u[1] & kM1;
  u[1] = (u[2] & kM2) | (((u[0] >> 6) & kM3) << 4);
  u[2] = m1;
  u[0] &= kM1;
  std::memcpy(out16, u, 16);
}

}  // namespace spool::ops::ggml
