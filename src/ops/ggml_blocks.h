// Matrix products against weights in ggml block formats, as stored in GGUF files
// (the GGUF notes (ggml docs/gguf.md) section 4): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
// Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4, and (decoded by ops/ggml_iquants) IQ1_S, IQ1_M, IQ2_XXS,
// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, TQ1_0, TQ2_0. Activations and accumulation are f32; the kernels
// (Highway, runtime dispatch) decode each block into registers and FMA, so the weights are never
// expanded to float in memory, except for the i-quant / ternary types: each row of those is
// decoded by SIMD decoders into an f32 row buffer (one row, L1/L2) and dotted with each token. A
// scalar dequantize-row per type is the reference.
#pragma once

#include <cstdint>
#include <string>

#include "common/ggml_types.h"
#include "ops/thread_pool.h"

namespace spool::ops {

/// True when the kernels here support type `t` (the 25 types listed above).
bool ggml_supported(GgmlType t);

/// One matrix W [rows, cols] in a ggml type, row-major (cols = ne[0] of the GGUF tensor, the
/// fastest-varying dimension; rows = ne[1] (* ne[2] * ne[3])). `data` points to rows * row_bytes()
/// bytes (borrowed; no alignment required). `name` (optional) names the tensor in errors.
struct GgmlView {
  GgmlType type = GgmlType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;
  const char* name = nullptr;

  /// Bytes of one row.
  int64_t row_bytes() const { return static_cast<int64_t>(ggml_row_bytes(type, static_cast<uint64_t>(cols))); }
  /// Bytes of the whole matrix (what a GEMV streams).
  uint64_t nbytes() const { return static_cast<uint64_t>(rows) * static_cast<uint64_t>(row_bytes()); }
};

/// Throws spool::Error unless `w` is usable: a supported type (the message names the type and
/// the tensor), rows >= 0, cols > 0 and a multiple of the type's block size, data non-null.
void validate(const GgmlView& w);

/// Scalar reference: dequantizes `n` elements (a multiple of the block size) of type `t` at
/// `src` into dst[0, n), with the formulas of ggml's dequantize_row_* (bit-identical to them and
/// to gguf-py's dequantize). Throws spool::Error for unsupported types.
void ggml_dequantize_row(GgmlType t, const uint8_t* src, int64_t n, float* dst);

/// y[t * ldy + r] = sum_c W[r, c] * x[t * cols + c] for t < T and rows r in [r0, r1), on the
/// calling thread (the shape of matmul_rows / quant_matmul_rows). x: [T, cols] f32. Decode
/// (T small) streams 4 rows at a time; prefill decodes each block once per tile of tokens.
/// Thread-safe. Throws spool::Error on a bad view or row range.
void ggml_matmul_rows(const GgmlView& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1);

/// y = W x for T tokens: x [T, cols], y [T, rows]; parallel over rows (chunks of 16) when a
/// pool is given.
void ggml_matmul(const GgmlView& w, const float* x, int64_t T, float* y, ThreadPool* pool);

/// Scalar reference of ggml_matmul(): ggml_dequantize_row, then dots in double precision.
void ggml_matmul_reference(const GgmlView& w, const float* x, int64_t T, float* y);

/// Name of the SIMD target the ggml kernels dispatch to now (e.g. "AVX3"); follows
/// hwy::SetSupportedTargetsForTest.
const char* ggml_kernel_target();

// ---- MXFP4 as Hugging Face stores it (gpt-oss `*_blocks` + `*_scales`) ----------------------

/// A matrix W [rows, cols] in HF's MXFP4 layout (transformers integrations/mxfp4.py): `blocks`
/// [rows, cols/32, 16] bytes, byte j of a block holding element 2j (low nibble) and 2j + 1 (high
/// nibble) as FP4 E2M1 codes; `scales` [rows, cols/32] E8M0 bytes, multiplier 2^(s - 127) (no NaN
/// case). Same element values as GGUF's MXFP4, different byte layout (GGUF: scale inside the
/// block, low nibbles = elements 0..15). Borrowed pointers, no alignment required.
struct Mxfp4View {
  int64_t rows = 0, cols = 0;
  const uint8_t* blocks = nullptr;
  const uint8_t* scales = nullptr;
  const char* name = nullptr;
  uint64_t nbytes() const { return static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols / 2 + cols / 32); }
};

/// Throws spool::Error unless cols is a positive multiple of 32, rows >= 0 and data is set.
void validate(const Mxfp4View& w);
/// Dequantizes n elements (a multiple of 32) of one row: blocks [n/32, 16], scales [n/32].
void mxfp4_dequantize_row(const uint8_t* blocks, const uint8_t* scales, int64_t n, float* dst);
/// ggml_matmul_rows for an Mxfp4View: Highway kernels decoding in registers (decode: 4 rows x 1
/// token; prefill: 1 row x 4 or 8 tokens per decoded block).
void mxfp4_matmul_rows(const Mxfp4View& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1);
/// y = W x for T tokens, parallel over rows when a pool is given.
void mxfp4_matmul(const Mxfp4View& w, const float* x, int64_t T, float* y, ThreadPool* pool);
/// Scalar reference: decodes from the format's definition, dots in double.
void mxfp4_matmul_reference(const Mxfp4View& w, const float* x, int64_t T, float* y);

/// "Q4_K" etc., with the tensor name when known: "Q4_K tensor 'blk.0.ffn_down.weight'".
std::string ggml_describe(const GgmlView& w);

}  // namespace spool::ops
