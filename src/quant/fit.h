// Error-minimizing choices of the quantized format's free parameters (docs/quant-format.md,
// docs/quantization.md "Scale search and fitted codebooks"): the fp16 scale of each group and the
// codebook of each matrix. The format and the kernels are unchanged: a file written this way is
// read exactly like one with RMS scales and the fixed N(0, 1) codebooks.
//
// Objective: the squared error of the reconstruction, sum over a matrix of (w' - s_g c_k)^2, w'
// the rotated weight, s_g its group's fp16 scale and c_k the centroid of its code.
//  - Scales (given a codebook): for fixed codes the optimal scale has the closed form
//    s = sum(w c) / sum(c^2) (least squares), and for a fixed scale the nearest centroid is the
//    optimal code; search_scale() alternates the two from several starting scales and keeps the
//    best, after rounding the scale to fp16 and re-choosing the codes for the ROUNDED scale.
//  - Codebook (given scales): the centroid condition of Lloyd's algorithm (S. P. Lloyd, "Least
//    squares quantization in PCM", IEEE Trans. Inf. Theory 28(2), 1982; J. Max, "Quantizing for
//    minimum distortion", IRE Trans. Inf. Theory 6(1), 1960), weighted by the group scales:
//    c_k = sum(s_g w') / sum(s_g^2) over the weights coded k, which minimizes the squared error of
//    the matrix for fixed codes and scales. fit_codebook() iterates codebook and scales jointly,
//    starting from the N(0, 1) table.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "quant/codebook.h"

namespace spool::quant {

/// How group scales are chosen: kNone = the format's RMS rule (sqrt(mean(w'^2)) rounded to fp16);
/// kMse = search_scale() (never a higher group error than the RMS rule).
enum class ScaleSearch : uint8_t { kNone, kMse };

/// Where a matrix's codebook comes from: the fixed N(0, 1) table of its type (codebook(t)), or
/// fit_codebook() on the matrix itself.
enum class CodebookSource : uint8_t { kGaussian, kFit };

/// How the quantizer chooses scales and codebooks. The default is the error-minimizing mode of
/// `spool convert`; legacy() reproduces the files of the original rules bit for bit.
struct QuantOptions {
  ScaleSearch scale_search = ScaleSearch::kMse;
  CodebookSource codebook = CodebookSource::kFit;
  /// RMS scales and the fixed N(0, 1) codebooks (the format's original rules).
  static constexpr QuantOptions legacy() { return {ScaleSearch::kNone, CodebookSource::kGaussian}; }
  bool is_legacy() const { return scale_search == ScaleSearch::kNone && codebook == CodebookSource::kGaussian; }
  /// Whether a matrix of type t gets a `.codebook` tensor: always, except q8 with fitted
  /// codebooks (q8 keeps its fixed grid, which readers know: ops::q8_grid(); 1 KiB saved per
  /// matrix, a whole bit per weight on an 8192-weight expert). kGaussian writes every codebook,
  /// as the files of earlier versions.
  bool stores_codebook(QType t) const { return t != QType::kQ8 || codebook == CodebookSource::kGaussian; }
};

/// "none" | "mse".
const char* scale_search_name(ScaleSearch s);
/// "gaussian" | "fit".
const char* codebook_source_name(CodebookSource c);
/// Parses "none" or "mse"; throws spool::UsageError naming the flag otherwise.
ScaleSearch parse_scale_search(std::string_view s);
/// Parses "gaussian" or "fit"; throws spool::UsageError naming the flag otherwise.
CodebookSource parse_codebook_source(std::string_view s);

/// Decision boundaries of an ascending codebook: the midpoints of adjacent entries computed in
/// double (cb.size() - 1 values), as boundaries(t) for the fixed tables.
std::vector<double> codebook_boundaries(std::span<const float> cb);

/// A codebook with its boundaries and clipping limit (1.5 max|c|), ready for coding groups.
struct Coder {
  std::vector<float> cb;    ///< ascending centroids
  std::vector<double> mid;  ///< codebook_boundaries(cb)
  float lim = 0;            ///< codes are chosen for w / s clipped to +-lim
  std::vector<float> midf;  ///< mid as float (the search's fast pass)
  std::vector<float> step;  ///< cb[k + 1] - cb[k] (the search's fast pass: c = cb[0] + sum of steps below x)
  bool uniform = false;     ///< more than 16 entries, all steps equal (q8's grid): the fast pass rounds instead
  /// Builds the coder of `cb` (must be ascending and finite: validate_codebook's rules).
  explicit Coder(std::span<const float> c);
  /// Nearest code of x = w / s (clipped to +-lim; ties low), as nearest_code().
  int code(float x) const;
};

/// The scale chosen for one group and its squared error.
struct GroupScale {
  uint16_t scale = 0;  ///< fp16 bits of the scale
  double sse = 0;      ///< sum over the group of (w - scale * cb[code])^2, in double
};

/// Chooses the fp16 scale of one group v[0, g) (finite values) under `coder` and writes its
/// g codes (nearest centroid of v / scale).
/// kNone: scale = max(sqrt(mean(v^2)), 1e-7) rounded to fp16 (the format's RMS rule).
/// kMse: starts from the RMS scale times each of a fixed grid of factors and from max|v| / max|c|;
/// for each start, assigns codes and takes the least-squares scale sum(v c) / sum(c^2); the start
/// with the lowest least-squares error is refined by up to 3 more assign / re-fit steps; the result
/// is rounded to fp16, the codes re-chosen for the rounded scale, and it is kept only if its exact
/// error is lower than the RMS scale's (ties keep the RMS scale). Deterministic (no state, fixed
/// order). Throws spool::Error when the RMS scale overflows fp16.
GroupScale search_scale(const float* v, int g, const Coder& coder, ScaleSearch mode, uint8_t* codes);

/// Fits the codebook of one matrix of type `t` and group size g (g divides cols) to its own
/// rotated rows. row(r, out) must write row r of the rotated matrix (cols floats). Uses a
/// deterministic subsample of at most ~2^16 weights (evenly spaced whole rows, at least one).
/// Rounds: scales by search_scale(mode) under the current codebook, then the scale-weighted
/// centroid update above (codes whose cell is empty keep their centroid); for an odd level count
/// the codebook is kept symmetric with a zero middle entry (the format pads ternary groups with
/// the middle code). Starts from codebook(t); returns the codebook of the lowest subsample error
/// seen, which is never higher than the N(0, 1) table's; stops early once a round lowers the
/// subsample error by less than 0.1%. Ascending and finite (validate_codebook holds).
/// Single-threaded and deterministic. `rounds` >= 0: at most that many centroid updates. q8
/// returns its uniform grid unchanged (the kernels decode it arithmetically).
std::vector<float> fit_codebook(QType t, int g, int64_t rows, int64_t cols, const std::function<void(int64_t, float*)>& row,
                                ScaleSearch mode, int rounds = 4);

}  // namespace spool::quant
