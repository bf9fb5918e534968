// Matrix products against quantized weights (docs/quant-format.md): packed codes, fp16 group
// scales and a codebook, optionally in a Hadamard-rotated basis. SIMD via Highway with runtime
// dispatch. The quantizer itself (codebooks, packing, quantize) lives in src/quant; this header
// holds what the kernels need so that spool_ops does not depend on spool_quant.
#pragma once

#include <cstdint>
#include <cstring>

#include "ops/thread_pool.h"

namespace spool::ops {

/// Quantization type of one matrix: b-bit codes (b = 2, 3, 4, 5, 6, 8) or ternary (3 levels,
/// base-3). The values are not stored in files (a tensor's type follows from its codebook
/// length); new types are appended.
enum class QType : uint8_t { kQ2, kQ3, kQ4, kTernary, kQ5, kQ6, kQ8 };

/// Every type, in the order of the enum.
inline constexpr QType kAllQTypes[] = {QType::kQ2, QType::kQ3, QType::kQ4, QType::kTernary,
                                       QType::kQ5, QType::kQ6, QType::kQ8};

/// Bits per code of the b-bit types (2, 3, 4, 5, 6, 8); 0 for ternary (5 codes per byte) and for
/// a value outside the enum.
constexpr int qtype_bits(QType t) {
  switch (t) {
    case QType::kQ2: return 2;
    case QType::kQ3: return 3;
    case QType::kQ4: return 4;
    case QType::kQ5: return 5;
    case QType::kQ6: return 6;
    case QType::kQ8: return 8;
    default: return 0;
  }
}

/// Number of codebook entries: 2^bits (4, 8, 16, 32, 64, 256), or 3 for ternary.
constexpr int qtype_levels(QType t) { return t == QType::kTernary ? 3 : 1 << qtype_bits(t); }

/// Bytes of one packed group of `g` codes: ceil(g * b / 8), or ceil(g / 5) for ternary.
constexpr int64_t qtype_group_bytes(QType t, int64_t g) {
  return t == QType::kTernary ? (g + 4) / 5 : (g * qtype_bits(t) + 7) / 8;
}

/// One quantized matrix W [rows, cols] as the kernels see it (all pointers borrowed):
/// - qweight: rows * (cols / group) * qtype_group_bytes(type, group) bytes, row-major;
/// - scales: rows * (cols / group) fp16 bit patterns;
/// - codebook: qtype_levels(type) floats, ascending (any values: the kernels read them; q8's
///   fast path needs an affine codebook, c_k = c_0 + k (c_1 - c_0), like the format's grid);
/// - signs: cols entries of +-1 when the matrix is stored rotated (W' = W diag(s) H_blk),
///   nullptr when it is not.
struct QuantView {
  QType type = QType::kQ4;
  int64_t rows = 0;
  int64_t cols = 0;
  int group = 0;
  const uint8_t* qweight = nullptr;
  const uint16_t* scales = nullptr;
  const float* codebook = nullptr;
  const int8_t* signs = nullptr;

  /// Groups per row (cols / group).
  int64_t groups_per_row() const { return group > 0 ? cols / group : 0; }
  /// Packed bytes of one row.
  int64_t row_bytes() const { return groups_per_row() * qtype_group_bytes(type, group); }
  /// Group scale i (row-major [rows, cols / group]) as float. scales and codebook point into a
  /// file where tensors are packed back to back, so they may be unaligned: read them only
  /// through these accessors (or memcpy / unaligned SIMD loads).
  float scale(int64_t i) const;
  /// Codebook entry k as float (unaligned-safe).
  float centroid(int k) const {
    float c;
    std::memcpy(&c, codebook + k, sizeof c);
    return c;
  }
  /// Bytes the kernels stream: packed codes + fp16 scales.
  uint64_t nbytes() const { return static_cast<uint64_t>(rows) * (row_bytes() + 2 * groups_per_row()); }
};

/// The q8 codebook: the uniform symmetric grid c_k = (2k - 255) / 64, k = 0..255 (step 1/32,
/// |c| <= 3.984, exact in float; docs/quant-format.md). A q8 matrix stored without a `.codebook`
/// tensor uses it (spool convert writes none for q8: its grid is never fitted).
const float* q8_grid();

/// Throws spool::Error unless `w` is well-formed: rows >= 0, cols > 0, group in {32, 64, 128}
/// or group == cols, group divides cols, non-null qweight/scales/codebook.
void validate(const QuantView& w);

/// y[t * ldy + r] = sum_c What'[r, c] * x_rot[t * cols + c] for t < T and rows r in [r0, r1), on
/// the calling thread. What' is the dequantized matrix in its stored (rotated) basis and x_rot
/// must ALREADY be rotated (rotate_input with w.signs) when w.signs is set: one rotation serves
/// every matrix sharing the sign vector. x_rot: [T, cols] f32. Throws spool::Error on a bad view.
/// Each call reorders x_rot into the kernel's lane order first (~0.2 us per 2048 columns and
/// token, ~0.6 us for ternary), so give each call a good share of the rows (quant_matmul gives
/// each thread one contiguous chunk). Thread-safe: scratch buffers and layout tables are
/// thread-local.
void quant_matmul_rows(const QuantView& w, const float* x_rot, int64_t T, float* y, int64_t ldy, int64_t r0,
                       int64_t r1);

/// y = What x for T tokens: x [T, cols] f32 in the ORIGINAL basis, y [T, rows]. Rotates x once
/// (when w.signs is set) and runs quant_matmul_rows over rows in parallel (chunks of 16 rows).
void quant_matmul(const QuantView& w, const float* x, int64_t T, float* y, ThreadPool* pool);

/// Scalar reference of quant_matmul(): rotation, dequantization and dot in double precision.
void quant_matmul_reference(const QuantView& w, const float* x, int64_t T, float* y);

/// Blockwise normalized fast Walsh-Hadamard transform of x[0, n) in place: block size
/// B = n & -n (largest power of two dividing n), x[kB, (k+1)B) <- Sylvester(B)/sqrt(B) x[...].
/// The transform is symmetric, orthonormal and its own inverse. n >= 1.
void hadamard_transform(float* x, int64_t n);

/// out = H_blk (s .* x) for n elements (out may equal x); signs == nullptr means all +1.
void hadamard_rotate(const int8_t* signs, const float* x, int64_t n, float* out);

/// Name of the SIMD target the quantized kernels dispatch to now (e.g. "AVX3"); follows
/// hwy::SetSupportedTargetsForTest, so tests can check which variant ran.
const char* quant_kernel_target();

}  // namespace spool::ops
