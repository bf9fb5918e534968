// Codebooks of the spool quantized format (docs/quant-format.md): fixed Lloyd-Max centroids for
// N(0, 1) (q2..q6, ternary) or a uniform grid (q8), ascending and symmetric; nearest-centroid
// coding; type names and levels.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "ops/quant_matmul.h"

namespace spool::quant {

/// The quantization type (defined next to the kernels so spool_ops needs no spool_quant).
using QType = spool::ops::QType;

/// Codebook entries of a type: 4 (q2), 8 (q3), 16 (q4), 32 (q5), 64 (q6), 256 (q8) or 3 (ternary).
constexpr int levels(QType t) { return spool::ops::qtype_levels(t); }

/// Bits per code: 2, 3, 4, 5, 6, 8; 0 for ternary (packed base-3, 5 codes per byte = 1.6 bits).
constexpr int bits(QType t) { return spool::ops::qtype_bits(t); }

/// The centroids of a type, ascending (exact constants of the format spec, as float).
std::span<const float> codebook(QType t);

/// Index of the nearest centroid of `x` (a weight divided by its group scale). x is first
/// clipped to +-1.5 * max|c| (this never changes the nearest centroid of a finite x; it only
/// defines the behaviour of +-inf). Decision boundaries are the midpoints of adjacent centroids
/// computed in double; x exactly on a boundary takes the lower index. NaN maps to the code of 0
/// (for even level counts 0 is itself a boundary, so the lower middle code).
int nearest_code(QType t, float x);

/// Decision boundaries (midpoints, double) of a type: levels(t) - 1 values, ascending.
std::span<const double> boundaries(QType t);

/// Number of boundaries strictly below x (= the nearest code, ties low) for ascending
/// boundaries `mid`; x already clipped. Branch-free binary search when mid.size() + 1 is a
/// power of two. The inner step of nearest_code(), exposed for the quantizer's hot loop.
inline int code_from_boundaries(std::span<const double> mid, double x) {
  const size_t levels = mid.size() + 1;
  if ((levels & (levels - 1)) == 0) {
    size_t code = 0;
    for (size_t step = levels / 2; step > 0; step /= 2) code += x > mid[code + step - 1] ? step : 0;
    return static_cast<int>(code);
  }
  int code = 0;
  for (double b : mid) code += x > b ? 1 : 0;
  return code;
}

/// The type with `n` codebook entries: 3 -> ternary, 4 -> q2, 8 -> q3, 16 -> q4, 32 -> q5,
/// 64 -> q6, 256 -> q8.
/// Throws spool::Error for any other count (e.g. a corrupt `.codebook` tensor).
QType qtype_from_levels(int64_t n);

/// "q2", "q3", "q4", "q5", "q6", "q8" or "ternary".
const char* qtype_name(QType t);

/// Parses a type name as printed by qtype_name (exact, lower case); throws spool::Error.
QType parse_qtype(std::string_view name);

/// Checks a codebook read from a file against its type: exactly levels(t) finite values in
/// strictly ascending order. Throws spool::Error naming `what` (e.g. the tensor name).
void validate_codebook(QType t, std::span<const float> cb, std::string_view what = "codebook");

}  // namespace spool::quant
