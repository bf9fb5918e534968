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

}  // namespace

std::span<const float> codebook(QType t) {
  switch (t) {
    case QType::kQ2: return kQ2;
    case QType::kQ3: return kQ3;
    case QType::kQ4: return kQ4;
    case QType::kTernary: return kTernary;
  }
  fail("unknown quantization type %d", static_cast<int>(t));
}

std::span<const double> boundaries(QType t) {
  switch (t) {
    case QType::kQ2: return kMidQ2;
    case QType::kQ3: return kMidQ3;
    case QType::kQ4: return kMidQ4;
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
    default: fail("codebook has %lld entries: expected 3 (ternary), 4 (q2), 8 (q3) or 16 (q4)", static_cast<long long>(n));
  }
}

const char* qtype_name(QType t) {
  switch (t) {
    case QType::kQ2: return "q2";
    case QType::kQ3: return "q3";
    case QType::kQ4: return "q4";
    case QType::kTernary: return "ternary";
  }
  return "unknown";
}

QType parse_qtype(std::string_view name) {
  for (QType t : {QType::kQ2, QType::kQ3, QType::kQ4, QType::kTernary})
    if (name == qtype_name(t)) return t;
  fail("unknown quantization type '%s' (expected q2, q3, q4 or ternary)", std::string(name).c_str());
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
