// Data-free quantization of one weight matrix (docs/quant-format.md): optional randomized
// Hadamard rotation, per-group fp16 scales (RMS, or searched: quant/fit.h), nearest centroid of
// the matrix's codebook (the N(0, 1) Lloyd-Max table, or fitted: quant/fit.h), packing.
#pragma once

#include <cstdint>
#include <vector>

#include "ops/quant_matmul.h"
#include "ops/thread_pool.h"
#include "quant/codebook.h"
#include "quant/fit.h"

namespace spool::quant {

/// A quantized matrix owning its tensors (the checkpoint tensors of the format).
struct QuantizedMatrix {
  QType type = QType::kQ4;
  int64_t rows = 0;
  int64_t cols = 0;
  int group = 0;
  std::vector<uint8_t> qweight;   ///< [rows, row_bytes(type, cols, group)]
  std::vector<uint16_t> scales;   ///< [rows, cols / group] fp16 bits
  std::vector<float> codebook;    ///< [levels(type)]
  std::vector<int8_t> signs;      ///< [cols] +-1, empty when not rotated

  /// Kernel view of this matrix (pointers into this object).
  spool::ops::QuantView view() const;
};

/// Throws spool::Error unless `g` is a valid group size for `cols` columns: g in {32, 64, 128}
/// or g == cols, g <= cols, and g divides cols.
void check_group(int64_t cols, int g);

/// float -> IEEE half bits, round to nearest even; overflow gives +-inf, NaN stays NaN.
uint16_t f32_to_f16(float f);

/// Quantizes W [rows, cols] (f32, row-major, [out, in]) to type `t` with group size `g`.
/// signs: cols values +-1 for the rotated format (W' = W diag(s) H_blk), or nullptr for none.
/// opts (quant/fit.h): the default here, QuantOptions::legacy(), is the format's original rule:
/// group scale = max(sqrt(mean(w'^2)), 1e-7) rounded to fp16, codebook = codebook(t), codes =
/// nearest_code(w' / scale); otherwise scales by search_scale() and/or the codebook by
/// fit_codebook() on W itself. Rows are quantized in parallel on `pool` when given (the result
/// does not depend on it). Throws spool::Error for a bad group size, a non-finite weight or a
/// scale that overflows fp16.
QuantizedMatrix quantize(const float* W, int64_t rows, int64_t cols, QType t, int g, const int8_t* signs,
                         spool::ops::ThreadPool* pool = nullptr, const QuantOptions& opts = QuantOptions::legacy());

/// Quantizes rows [r0, r1) of W (pointer to row 0, `cols` floats per row) into the full-size
/// outputs qweight [*, row_bytes] and scales [*, cols / g] (only those rows are written), so
/// callers can split a matrix over threads or stream it. Same rules and errors as quantize().
void quantize_rows(const float* W, int64_t cols, QType t, int g, const int8_t* signs, int64_t r0, int64_t r1,
                   uint8_t* qweight, uint16_t* scales);

/// quantize_rows with the codebook of `coder` (levels(t) ascending entries: the one written as
/// the matrix's `.codebook`) and the scale rule `mode` (search_scale()). With Coder(codebook(t))
/// and ScaleSearch::kNone this is exactly the overload above.
void quantize_rows(const float* W, int64_t cols, QType t, int g, const int8_t* signs, int64_t r0, int64_t r1,
                   uint8_t* qweight, uint16_t* scales, const Coder& coder, ScaleSearch mode);

/// Row r of the dequantized matrix in its STORED (rotated) basis: out[c] = codebook[code] *
/// scale, cols floats. Throws spool::Error on a bad view or an invalid ternary byte.
void dequantize_row(const spool::ops::QuantView& w, int64_t r, float* out);

/// The full reconstruction in the ORIGINAL basis, out [rows, cols]: each W' row mapped back by
/// unrotate(signs) (identity without signs). For tests and quality measurements.
void dequantize(const spool::ops::QuantView& w, float* out);

}  // namespace spool::quant
