// Int8 activations for K-quant weights (--act-bits 8; the default for GGUF files with them on the CPUs
// where int8_activations_from_bits() says so). The activations of one product
// are quantized once, per 256 columns, to int8 with one f32 scale (the idea of ggml's Q8_K), and
// Q4_K / Q6_K rows are dotted against them in integer arithmetic: vpmaddubsw (unsigned weight
// codes x signed activation codes), then vpdpwssd (VNNI) or vpmaddwd + vpaddd with the int16
// sub-block scales, one f32 rescale per 256-column block. This is the arithmetic of llama.cpp's
// CPU backend (it quantizes activations to 8 bits for every quantized type). It trades the f32
// kernels' 1e-4 match to the dequantized model for about half the instructions per weight: each
// activation moves by at most half its block's step, |x - d q| <= d / 2, so an output moves by at
// most sum_b d_b / 2 * sum_{c in b} |W[r, c]| (tested as a bound).
//
// Decode (one token) and prefill (T >= 2) use different instruction sequences (vpmaddubsw +
// vpdpwssd over column-order codes; vpdpbusd over interleaved codes with f32 group scales): their
// integer dots are exact, their f32 rescaling rounds differently, so one token alone and the same
// token inside a batch agree to float rounding (~1e-7 relative), not bit for bit; any split of a
// batch into pieces of >= 2 tokens gives the same bits. In a model, a routed expert that receives
// one token of a prefill chunk takes the one-token kernel, so with int8 activations prefill
// results depend on the chunking at float-rounding level. (The f32 kernels are bit-identical for
// every T.)
//
// Kernels per CPU (q8_variant()): x86 CPUs with AVX-512BW (Highway target AVX3) run the AVX-512
// kernels; Highway's AVX3_DL target (Ice Lake and later: VNNI with VBMI2, VAES, BITALG, ...) adds
// VNNI, so a VNNI CPU without those (Cascade Lake) runs the vpmaddwd variant ("avx512bw"). AVX2
// CPUs (Highway target AVX2: Haswell and later, AMD Zen 1-3) run 256-bit kernels
// (ggml_q8_avx2-inl.h), with AVX-VNNI's VEX-encoded vpdpbusd / vpdpwssd where the CPU has it
// (Alder Lake and later, checked with cpuid: "avx2-vnni") or vpmaddubsw / vpmaddwd ("avx2").
// aarch64 CPUs run NEON kernels (ggml_q8_neon.cpp) with the dot-product extension's sdot where the
// CPU has it (Armv8.2+ cores: Apple M, Graviton 2+, Cortex-A76+; HWCAP_ASIMDDP: "neon-dotprod")
// or vmull / vpadal ("neon"). The decode and prefill kernels of the AVX2 and NEON families have
// their own f32 accumulation orders (the integer dots are exact everywhere), so their outputs agree
// with the AVX-512 ones to float rounding; within a family (with or without the dot instructions)
// the bits are the same. On other targets ggml_q8_matmul_rows() computes the same sums in scalar
// code and q8_fast() is false, so matmul() keeps the f32 kernels there.
#pragma once

#include <cstdint>
#include <vector>

#include "common/ggml_types.h"
#include "ops/ggml_blocks.h"
#include "ops/thread_pool.h"

namespace spool::ops {

/// Columns per activation block (one f32 scale each): ggml's QK_K.
inline constexpr int64_t kQ8Block = 256;

/// Activations x [T, cols] (cols a multiple of kQ8Block) quantized per 256-column block b of
/// token t: d[t * nb + b] = amax / 127 (amax = max |x| over the block; 0 for an all-zero block),
/// q[t * cols + c] = round-half-even(x * (127 / amax)) (0 when amax is 0), so |q| <= 127, and
/// bs[(t * nb + b) * 16 + g] = d * (sum of q over the block's columns 16g .. 16g + 15) (f32; the
/// min / offset terms of the weight formats use it).
///
/// Layout of q: for T == 1 (decode) each block's codes are in column order; for T >= 2 (prefill)
/// they are interleaved for 4-byte dots (vpdpbusd): column 16 g + 4 k + e of a block sits at byte
/// 64 k + 4 g + e (k, e < 4; g < 16), so 32-bit lane g of the block's 64-byte vector k holds 4
/// columns of 16-column group g. q8_pos() maps a column to its byte.
/// A reused Q8Acts keeps its longest vectors: q.size() >= T * cols, d.size() >= T * blocks(),
/// bs.size() >= 16 * T * blocks(); only those first elements are meaningful.
///
/// A block with a NaN or infinite value gets d = NaN (codes 0), so the products it enters are NaN
/// as they would be in f32 (the engine's non-finite checks see them); a block whose max is so small
/// that 127 / amax overflows (< ~3.7e-37) is quantized as zeros.
///
/// For T == 1, q_k4 holds the same codes once more in Q4_K's nibble order (q8_pos_k4()): vector
/// k = 2 h + e (h, e < 2) of a block holds columns 128 h + 32 e + [0, 32), then 128 h + 64 + 32 e
/// + [0, 32): the order in which the low (e = 0) and high (e = 1) nibbles of 64 bytes of Q4_K codes
/// fall, so the one-token Q4_K kernel dots them without lane shuffles (a per-product permutation
/// of the activations instead of one per weight block). Unused for T >= 2 (a reused Q8Acts keeps it).
struct Q8Acts {
  int64_t T = 0, cols = 0;
  bool interleaved = false;  // T >= 2
  std::vector<int8_t> q;
  std::vector<int8_t> q_k4;
  std::vector<float> d;
  std::vector<float> bs;
  int64_t blocks() const { return cols / kQ8Block; }
};

/// Byte of column c (within its block) in an interleaved block (see Q8Acts).
inline int64_t q8_pos(int64_t c) { return 64 * ((c % 16) / 4) + 4 * (c / 16) + c % 4; }

/// Byte of column c (within its block) in q_k4's Q4_K nibble order (see Q8Acts).
inline int64_t q8_pos_k4(int64_t c) { return 64 * (2 * (c / 128) + (c % 64) / 32) + 32 * ((c % 128) / 64) + c % 32; }

/// Quantizes x [T, cols] into a (resized). Throws spool::Error unless cols is a positive multiple
/// of kQ8Block and T >= 0. SIMD on AVX3 targets, bit-identical to q8_quantize_reference().
void q8_quantize(const float* x, int64_t T, int64_t cols, Q8Acts& a);

/// Scalar reference of q8_quantize() (the definition above, one element at a time).
void q8_quantize_reference(const float* x, int64_t T, int64_t cols, Q8Acts& a);

/// True for the weight types the int8 kernels cover: Q4_K and Q6_K.
bool q8_supported(GgmlType t);

/// True when the SIMD int8 kernels run on this CPU now (Highway dispatches to AVX2 or better on
/// x86, to a SIMD target on aarch64; follows hwy::SetSupportedTargetsForTest). matmul() only takes
/// the int8 path when this holds.
bool q8_fast();

/// Whether --act-bits auto takes int8 activations on this CPU (int8_activations_from_bits()):
/// q8_fast() with a variant measured faster than the f32 kernels: the AVX-512 and AVX2 ones
/// (docs/benchmarks.md). false for NEON until measured on an aarch64 machine (--act-bits 8 runs
/// its kernels) and for the scalar sums. Follows hwy::SetSupportedTargetsForTest.
bool q8_auto();

/// Name of the int8 kernel variant dispatched to now: "avx512vnni", "avx512bw", "avx2-vnni",
/// "avx2", "neon-dotprod", "neon" or "scalar".
const char* q8_variant();

/// Whether the AVX2 and NEON kernels may use AVX-VNNI / the dot-product extension where the CPU
/// has them (default true). false runs their baseline instruction sequences on such a CPU too
/// (same results): for tests and benchmarks of the CPUs that lack them. Process-wide; does not
/// affect the AVX-512 variants (Highway's targets choose those: hwy::SetSupportedTargetsForTest).
void q8_allow_dot_extension(bool allow);

/// y[t * ldy + r] = sum_b d_w d_a[t, b] sum_c s_w(c) q_w(c) q_a(t, c) + the format's min / offset
/// term against bs, for rows r in [r0, r1) of w and the a.T tokens of a; on the calling thread.
/// Throws spool::Error unless q8_supported(w.type), a.cols == w.cols and 0 <= r0 <= r1 <= rows.
void ggml_q8_matmul_rows(const GgmlView& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1);

/// y = W x for the a.T tokens of a: y [a.T, w.rows]; parallel over rows (chunks of 16) when a
/// pool is given. Same errors as ggml_q8_matmul_rows().
void ggml_q8_matmul(const GgmlView& w, const Q8Acts& a, float* y, ThreadPool* pool);

/// Scalar reference of ggml_q8_matmul_rows() over all rows (y [a.T, w.rows]): the integer dots of
/// each sub-block exactly, the scales applied in double precision.
void ggml_q8_matmul_reference(const GgmlView& w, const Q8Acts& a, float* y);

/// Whether a model's Q4_K / Q6_K products take int8 activations under --act-bits `bits` (the value of
/// CpuOptions::int8_activations the loader gives the model's CpuBackend; matmul()'s `int8_acts`): 8 yes,
/// 32 no, 0 (auto, the default) when the model has such weights (`kquant_weights`) and q8_auto()
/// holds: llama.cpp's CPU arithmetic for the files llama.cpp users have, f32 on other CPUs.
/// Throws spool::UsageError for other values.
bool int8_activations_from_bits(int bits, bool kquant_weights);

}  // namespace spool::ops
