// Int8 activations for spool's own q4 and q8 matrices (--act-bits 8), the arithmetic llama.cpp's
// CPU backend uses for every quantized type, applied to spool's codebook format (quant_matmul.h).
// q8 (8-bit codes on the format's grid c_k = (2k - 255) / 64) needs no codebook rounding: with
// s = k - 128 a 4-column dot is (2 dot(s, q) + sum q) / 64 in exact integers; 64-byte steps of
// codes go straight into vpdpbusd (VNNI, minus 128 sum q) or the sign trick on s (|s| <= 128).
//
// A q4 matrix stores per group of `group` columns an f16 scale s_g and 4-bit codes into a
// 16-entry f32 codebook c (docs/quant-format.md). Here:
// - the activations x (already rotated when the matrix is) are quantized per "lane" of 8 columns i
//   (columns 8i .. 8i+7: the lanes of the f32 kernels' layout, each inside one group):
//   x ~ d_i q, d_i = max |x| / 127 over the lane, q = round-half-even(x / d_i), |q| <= 127. Lanes
//   of 8 keep an outlier's damage to its own 8 columns (llama.cpp's Q8_K scales 256 columns at once;
//   on the demo's first positions, where activations are largest, 256-column blocks moved the
//   next-token distribution 10x more);
// - the codebook is quantized once per call to int8 with one step for the matrix:
//   c_k ~ dc c8_k, dc = max_k |c_k| / 127, c8_k = round(c_k / dc), so |c8_k| <= 127;
// - y_r = dc sum_i s_g(i) d_i sum_{c in lane i} c8[code(r, c)] q(c): the inner sums are exact int32
//   dots of 8 columns, rescaled in f32.
// Errors against the f32 product of the dequantized matrix: |x - d q| <= d / 2 per activation and
// |c - dc c8| <= dc / 2 per centroid, so an output moves by at most
//   sum_c |W~[r, c]| d_i(c) / 2 + |s_g(c)| dc / 2 (|x_c| + d_i(c) / 2),  W~ = s_g c[code]  (tested as a bound).
//
// Kernels (per Highway target, raw intrinsics as in ggml_q8.cpp): the row's 4-bit codes are read
// as they are stored, 64 bytes (AVX-512) or 32 bytes (AVX2) at a time; the low and high nibbles go
// through vpshufb with the int8 codebook as the table, then 4-byte dots against the activations'
// even and odd columns (QuantQ8Acts keeps them split: byte 4k + b of a vector of codes holds
// columns 8k + 2b (low nibble) and 8k + 2b + 1 (high nibble) of its span, and byte 4k + b of the
// even / odd activation vector holds the same two columns). AVX-512 with VNNI (Highway's AVX3_DL and later):
// vpdpbusd of (c8 + 128) as unsigned bytes, minus 128 times the activations' lane sums (AVX2 with
// AVX-VNNI: the same with the VEX vpdpbusd); AVX-512BW and AVX2: vpmaddubsw of |c8| against the
// activations with c8's sign, vpmaddwd by ones. Both
// integer dots are exact, so the variants give the same int32 lanes (and AVX-512 VNNI and BW the
// same output bits; AVX2 accumulates the f32 rescaling in its own order); 4 rows x up to 4 tokens
// per pass on AVX-512, 4 rows x up to 2 tokens on AVX2. aarch64 (NEON, baseline Armv8-A):
// vqtbl1q_s8 as the lookup, vmull_s8 and pairwise adds for the 4-byte dots; --act-bits auto leaves it
// off until measured on such a machine (quant_q8_auto()). Other targets compute the same sums in
// scalar code and quant_q8_fast() is false there, so matmul() keeps the f32 kernels.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/quant_matmul.h"

namespace spool::ops {

/// Rotated activations x [T, cols] quantized for quant_q8_matmul_rows() (cols a multiple of 128):
/// - even[t * cols / 2 + i] = q(t, 2 i), odd[...] = q(t, 2 i + 1): the int8 codes (per lane of 8
///   columns, round-half-even(x * 127 / amax)), split by column parity;
/// - lane_sum[t * cols / 8 + i] = -128 * (sum of q(t, c) over lane i's columns [8 i, 8 i + 8)) (the
///   VNNI kernel's offset term);
/// - d[t * cols / 8 + i] = lane i's scale amax / 127 (0 for an all-zero lane or one whose amax is so
///   small that 127 / amax overflows, codes 0; NaN for a lane with a NaN or infinite value, codes 0:
///   its products are then NaN as they would be in f32).
/// A reused object keeps its longest vectors; only the first T * ... elements are meaningful.
/// - q[t * cols + c] = q(t, c) in column order, quad_sum[t * cols / 4 + j] = sum of q over columns
///   4 j .. 4 j + 3 (the q8 kernels').
struct QuantQ8Acts {
  int64_t T = 0, cols = 0;
  std::vector<int8_t> even, odd;
  std::vector<int32_t> lane_sum;
  std::vector<float> d;
  std::vector<int8_t> q;
  std::vector<int32_t> quad_sum;
};

/// Quantizes x_rot [T, cols] (rotated already when the matrices are) into a. Throws spool::Error
/// unless cols is a positive multiple of 128 and T >= 0.
void quant_q8_prepare(const float* x_rot, int64_t T, int64_t cols, QuantQ8Acts& a);

/// True for the matrices the int8 kernels take: q4, and q8 on the format's grid c_k = (2k - 255) / 64
/// (ops::q8_grid(), exact in integers: no codebook rounding), with cols a multiple of 128 (any valid
/// group: 32, 64, 128 or the column count).
bool quant_q8_supported(const QuantView& w);

/// True when SIMD int8 kernels for spool's q4 / q8 run on this CPU now (AVX2 or better on x86, NEON
/// on aarch64; follows hwy::SetSupportedTargetsForTest). matmul() takes the int8 path only when this holds.
bool quant_q8_fast();

/// Whether --act-bits auto takes them on this CPU: x86 AVX2 / AVX-512, where they were measured
/// faster than the f32 kernels; not NEON (not measured on an aarch64 machine yet).
bool quant_q8_auto();

/// The kernels dispatched to now: "avx512vnni", "avx512bw", "avx2-vnni", "avx2", "neon" or "scalar"
/// (follows hwy::SetSupportedTargetsForTest and q8_allow_dot_extension()).
const char* quant_q8_variant();

/// y[t * ldy + r] for the a.T tokens of a and rows r in [r0, r1) of w, on the calling thread (the
/// sums in the file comment). Throws spool::Error unless quant_q8_supported(w), a.cols == w.cols and
/// 0 <= r0 <= r1 <= w.rows. The same bits for every T and every split of the rows.
void quant_q8_matmul_rows(const QuantView& w, const QuantQ8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);

/// Scalar reference of quant_q8_matmul_rows() over all rows (y [a.T, w.rows]): the integer lane
/// dots exactly, the scales applied in double precision.
void quant_q8_matmul_reference(const QuantView& w, const QuantQ8Acts& a, float* y);

}  // namespace spool::ops
