#include "quant/codebook.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>

#include "common/error.h"

namespace spool::quant {
namespace {

constexpr std::array<float, 3> kTernary = {-1.22401f, 0.0f, 1.22401f};
constexpr std::array<float, 4> kQ2 = {-1.51042f, -0.45278f, 0.45278f, 1.51042f};
constexpr std::array<float, 8> kQ3 = {-2.15195f, -1.34391f, -0.75601f, -0.24509f,
                                      0.24509f,  0.75601f,  1.34391f,  2.15195f};
constexpr std::array<float, 16> kQ4 = {-2.73330f, -2.06982f, -1.61886f, -1.25700f, -0.94301f, -0.65727f,
                                       -0.38837f, -0.12851f, 0.12851f,  0.38837f,  0.65727f,  0.94301f,
                                       1.25700f,  1.61886f,  2.06982f,  2.73330f};

// q5 and q6: Lloyd-Max centroids for N(0, 1) computed by scripts/lloyd_max.py (Lloyd iteration in
// double from the (i + 0.5) / L quantiles until no centroid moves by 1e-13; 9 significant digits).
constexpr std::array<float, 32> kQ5 = {
    -3.26073249f, -2.69111958f, -2.3177394f, -2.0287284f, -1.78723322f, -1.57622808f,
    -1.38634034f, -1.21180438f, -1.04878332f, -0.894565117f, -0.747135704f, -0.604933624f,
    -0.466699523f, -0.331378306f, -0.19805183f, -0.0658896598f, 0.0658896598f, 0.19805183f,
    0.331378306f, 0.466699523f, 0.604933624f, 0.747135704f, 0.894565117f, 1.04878332f,
    1.21180438f, 1.38634034f, 1.57622808f, 1.78723322f, 2.0287284f, 2.3177394f,
    2.69111958f, 3.26073249f};
constexpr std::array<float, 64> kQ6 = {
    -3.74410127f, -3.24043705f, -2.91740679f, -2.67227384f, -2.4713048f, -2.29898121f,
    -2.14681022f, -2.00961104f, -1.88397724f, -1.76754188f, -1.6585889f, -1.55583122f,
    -1.45827637f, -1.36514102f, -1.27579449f, -1.18972014f, -1.10648824f, -1.02573635f,
    -0.947154945f, -0.870476587f, -0.795467656f, -0.721921941f, -0.649655581f, -0.57850303f,
    -0.508313781f, -0.438949672f, -0.370282645f, -0.302192846f, -0.234566985f, -0.167296903f,
    -0.100278289f, -0.0334095064f, 0.0334095064f, 0.100278289f, 0.167296903f, 0.234566985f,
    0.302192846f, 0.370282645f, 0.438949672f, 0.508313781f, 0.57850303f, 0.649655581f,
    0.721921941f, 0.795467656f, 0.870476587f, 0.947154945f, 1.02573635f, 1.10648824f,
    1.18972014f, 1.27579449f, 1.36514102f, 1.45827637f, 1.55583122f, 1.6585889f,
    1.76754188f, 1.88397724f, 2.00961104f, 2.14681022f, 2.29898121f, 2.4713048f,
    2.67227384f, 2.91740679f, 3.24043705f, 3.74410127f};

// q8: the uniform symmetric grid c_k = (2k - 255) / 64 (step 1/32, |c| <= 3.984; exact in float),
// so the kernels decode it as c_0 + k * step (see docs/quant-format.md for the choice).
constexpr std::array<float, 256> uniform_grid() {
  std::array<float, 256> c{};
  for (int k = 0; k < 256; ++k) c[static_cast<size_t>(k)] = static_cast<float>(2 * k - 255) / 64.0f;
  return c;
}
constexpr std::array<float, 256> kQ8 = uniform_grid();

template <size_t L>
constexpr std::array<double, L - 1> midpoints(const std::array<float, L>& c) {
  std::array<double, L - 1> m{};
  for (size_t i = 0; i + 1 < L; ++i) m[i] = (static_cast<double>(c[i]) + static_cast<double>(c[i + 1])) / 2;
  return m;
}

constexpr auto kMidTernary = midpoints(kTernary);
constexpr auto kMidQ2 = midpoints(kQ2);
constexpr auto kMidQ3 = midpoints(kQ3);
constexpr auto kMidQ4 = midpoints(kQ4);
constexpr auto kMidQ5 = midpoints(kQ5);
constexpr auto kMidQ6 = midpoints(kQ6);
constexpr auto kMidQ8 = midpoints(kQ8);

}  // namespace

std::span<const float> codebook(QType t) {
  switch (t) {
    case QType::kQ2: return kQ2;
    case QType::kQ3: return kQ3;
    case QType::kQ4: return kQ4;
    case QType::kQ5: return kQ5;
    case QType::kQ6: return kQ6;
    case QType::kQ8: return kQ8;
    case QType::kTernary: return kTernary;
  }
  fail("unknown quantization type %d", static_cast<int>(t));
}

std::span<const double> boundaries(QType t) {
  switch (t) {
    case QType::kQ2: return kMidQ2;
    case QType::kQ3: return kMidQ3;
    case QType::kQ4: return kMidQ4;
    case QType::kQ5: return kMidQ5;
    case QType::kQ6: return kMidQ6;
    case QType::kQ8: return kMidQ8;
    case QType::kTernary: return kMidTernary;
  }
  fail("unknown quantization type %d", static_cast<int>(t));
}

int nearest_code(QType t, float x) {
  const std::span<const float> c = codebook(t);
  const std::span<const double> m = boundaries(t);
  if (std::isnan(x)) x = 0.0f;
  const float lim = 1.5f * std::max(std::fabs(c.front()), std::fabs(c.back()));
  x = std::clamp(x, -lim, lim);
  return code_from_boundaries(m, x);  // boundaries ascending: count of those below x
}

QType qtype_from_levels(int64_t n) {
  switch (n) {
    case 3: return QType::kTernary;
    case 4: return QType::kQ2;
    case 8: return QType::kQ3;
    case 16: return QType::kQ4;
    case 32: return QType::kQ5;
    case 64: return QType::kQ6;
    case 256: return QType::kQ8;
    default:
      fail("codebook has %lld entries: expected 3 (ternary), 4 (q2), 8 (q3), 16 (q4), 32 (q5), 64 (q6) or 256 (q8)",
           static_cast<long long>(n));
  }
}

const char* qtype_name(QType t) {
  switch (t) {
    case QType::kQ2: return "q2";
    case QType::kQ3: return "q3";
    case QType::kQ4: return "q4";
    case QType::kQ5: return "q5";
    case QType::kQ6: return "q6";
    case QType::kQ8: return "q8";
    case QType::kTernary: return "ternary";
  }
  return "unknown";
}

QType parse_qtype(std::string_view name) {
  for (QType t : spool::ops::kAllQTypes)
    if (name == qtype_name(t)) return t;
  fail("unknown quantization type '%s' (expected q2, q3, q4, q5, q6, q8 or ternary)", std::string(name).c_str());
}

void validate_codebook(QType t, std::span<const float> cb, std::string_view what) {
  const std::string w(what);
  if (static_cast<int64_t>(cb.size()) != levels(t))
    fail("%s: %zu entries, type %s needs %d", w.c_str(), cb.size(), qtype_name(t), levels(t));
  for (size_t i = 0; i < cb.size(); ++i) {
    if (!std::isfinite(cb[i])) fail("%s: entry %zu is not finite", w.c_str(), i);
    if (i > 0 && !(cb[i] > cb[i - 1])) fail("%s: entries are not strictly ascending at %zu", w.c_str(), i);
  }
}

}  // namespace spool::quant
