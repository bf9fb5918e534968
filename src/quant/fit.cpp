#include "quant/fit.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/error.h"
#include "ops/weights.h"
#include "quant/quantize.h"

namespace spool::quant {
namespace {

// Starting scales of the search, as multiples of the RMS scale (the N(0, 1) codebooks put the
// RMS scale at the optimum for Gaussian groups; real groups of 32..128 rotated weights are
// lighter- or heavier-tailed, so the optimum moves either way). Each start is followed by a
// least-squares re-fit, so the grid only needs to land in the right basin.
constexpr float kStartFactors[] = {0.70f, 0.80f, 0.90f, 1.00f, 1.10f, 1.20f, 1.35f};
constexpr int kRefineSteps = 3;
constexpr double kMinScale = 1e-7;        // the format's floor of a group scale
constexpr int64_t kFitValues = 1 << 18;   // subsample of fit_codebook (weights)

// Codes of v / s (nearest centroid) and the least-squares sums a = sum(v c), b = sum(c^2).
inline void assign(const float* v, int g, float s, const Coder& k, uint8_t* codes, double* a, double* b) {
  double sa = 0, sb = 0;
  for (int j = 0; j < g; ++j) {
    const int c = k.code(v[j] / s);
    if (codes != nullptr) codes[j] = static_cast<uint8_t>(c);
    const double cv = k.cb[static_cast<size_t>(c)];
    sa += static_cast<double>(v[j]) * cv;
    sb += cv * cv;
  }
  *a = sa;
  *b = sb;
}

// Exact squared error of v against s * cb[codes].
inline double sse_of(const float* v, int g, float s, const Coder& k, const uint8_t* codes) {
  double e = 0;
  for (int j = 0; j < g; ++j) {
    const double d = static_cast<double>(v[j]) - static_cast<double>(s) * k.cb[codes[j]];
    e += d * d;
  }
  return e;
}

// The fp16 bits of a candidate scale, or 0 when it is not usable (not finite, not positive, or
// beyond the fp16 range).
inline uint16_t candidate_bits(double s) {
  if (!(s > 0) || !std::isfinite(s)) return 0;
  const uint16_t h = f32_to_f16(static_cast<float>(std::max(s, kMinScale)));
  return (h & 0x7c00u) == 0x7c00u ? 0 : h;
}

}  // namespace

const char* scale_search_name(ScaleSearch s) { return s == ScaleSearch::kNone ? "none" : "mse"; }
const char* codebook_source_name(CodebookSource c) { return c == CodebookSource::kGaussian ? "gaussian" : "fit"; }

ScaleSearch parse_scale_search(std::string_view s) {
  if (s == "none") return ScaleSearch::kNone;
  if (s == "mse") return ScaleSearch::kMse;
  throw UsageError(strfmt("--scale-search must be none or mse (got '%s')", std::string(s).c_str()));
}

CodebookSource parse_codebook_source(std::string_view s) {
  if (s == "gaussian") return CodebookSource::kGaussian;
  if (s == "fit") return CodebookSource::kFit;
  throw UsageError(strfmt("--codebook must be gaussian or fit (got '%s')", std::string(s).c_str()));
}

std::vector<double> codebook_boundaries(std::span<const float> cb) {
  std::vector<double> m;
  for (size_t i = 0; i + 1 < cb.size(); ++i) m.push_back((static_cast<double>(cb[i]) + static_cast<double>(cb[i + 1])) / 2);
  return m;
}

Coder::Coder(std::span<const float> c) : cb(c.begin(), c.end()), mid(codebook_boundaries(c)) {
  if (cb.empty()) fail("quantize: empty codebook");
  lim = 1.5f * std::max(std::fabs(cb.front()), std::fabs(cb.back()));
}

int Coder::code(float x) const { return code_from_boundaries(mid, std::clamp(x, -lim, lim)); }

GroupScale search_scale(const float* v, int g, const Coder& coder, ScaleSearch mode, uint8_t* codes) {
  double ss = 0;
  for (int j = 0; j < g; ++j) ss += static_cast<double>(v[j]) * v[j];
  const double rms = std::max(std::sqrt(ss / g), kMinScale);
  const uint16_t h0 = f32_to_f16(static_cast<float>(rms));
  if ((h0 & 0x7c00u) == 0x7c00u) fail("group RMS %g is beyond the fp16 range of the scales", rms);
  const float s0 = spool::ops::f16_to_f32(h0);
  GroupScale best{h0, 0};
  if (mode == ScaleSearch::kNone) {
    for (int j = 0; j < g; ++j) codes[j] = static_cast<uint8_t>(coder.code(v[j] / s0));
    best.sse = sse_of(v, g, s0, coder, codes);
    return best;
  }
  double a = 0, b = 0;
  assign(v, g, s0, coder, codes, &a, &b);
  best.sse = sse_of(v, g, s0, coder, codes);

  // Starts: the grid around the RMS scale, and the scale that puts max|v| on the outermost centroid.
  float vmax = 0;
  for (int j = 0; j < g; ++j) vmax = std::max(vmax, std::fabs(v[j]));
  const float cmax = std::max(std::fabs(coder.cb.front()), std::fabs(coder.cb.back()));
  double ls_best = std::numeric_limits<double>::infinity(), s_best = 0;
  auto try_start = [&](double s) {
    const uint16_t h = candidate_bits(s);
    if (h == 0) return;
    assign(v, g, spool::ops::f16_to_f32(h), coder, nullptr, &a, &b);
    if (!(a > 0) || !(b > 0)) return;
    const double err = ss - a * a / b;  // error at the least-squares scale a / b of these codes
    if (err < ls_best) {
      ls_best = err;
      s_best = a / b;
    }
  };
  for (float f : kStartFactors) try_start(static_cast<double>(s0) * f);
  if (cmax > 0) try_start(static_cast<double>(vmax) / cmax);
  if (!(s_best > 0)) return best;
  for (int it = 0; it < kRefineSteps; ++it) {
    const uint16_t h = candidate_bits(s_best);
    if (h == 0) break;
    assign(v, g, spool::ops::f16_to_f32(h), coder, nullptr, &a, &b);
    if (!(a > 0) || !(b > 0)) break;
    const double next = a / b;
    if (candidate_bits(next) == h) break;  // converged to fp16 precision
    s_best = next;
  }
  const uint16_t h = candidate_bits(s_best);
  if (h == 0 || h == h0) return best;
  const float s = spool::ops::f16_to_f32(h);
  uint8_t alt[256];
  std::vector<uint8_t> big;
  uint8_t* c = alt;
  if (g > 256) {
    big.resize(static_cast<size_t>(g));
    c = big.data();
  }
  for (int j = 0; j < g; ++j) c[j] = static_cast<uint8_t>(coder.code(v[j] / s));
  const double err = sse_of(v, g, s, coder, c);
  if (err < best.sse) {
    best = {h, err};
    std::copy_n(c, g, codes);
  }
  return best;
}

std::vector<float> fit_codebook(QType t, int g, int64_t rows, int64_t cols, const std::function<void(int64_t, float*)>& row,
                                ScaleSearch mode, int rounds) {
  check_group(cols, g);
  const std::span<const float> gauss = codebook(t);
  if (rows <= 0) return {gauss.begin(), gauss.end()};
  const int L = levels(t);
  // Evenly spaced whole rows: row floor(i * rows / n) for i < n.
  const int64_t n = std::clamp<int64_t>(kFitValues / cols, 1, rows);
  std::vector<float> data(static_cast<size_t>(n * cols));
  for (int64_t i = 0; i < n; ++i) row(i * rows / n, data.data() + i * cols);
  for (float x : data)
    if (!std::isfinite(x)) fail("quantize: a weight is not finite");
  const int64_t groups = n * cols / g;

  std::vector<float> cur(gauss.begin(), gauss.end()), best_cb = cur;
  double best_err = std::numeric_limits<double>::infinity();
  std::vector<uint8_t> codes(static_cast<size_t>(g));
  std::vector<double> num(static_cast<size_t>(L)), den(static_cast<size_t>(L));
  for (int round = 0; round <= rounds; ++round) {
    const Coder coder(cur);
    std::fill(num.begin(), num.end(), 0.0);
    std::fill(den.begin(), den.end(), 0.0);
    double err = 0;
    for (int64_t gi = 0; gi < groups; ++gi) {
      const float* v = data.data() + gi * g;
      const GroupScale gs = search_scale(v, g, coder, mode, codes.data());
      err += gs.sse;
      const double s = spool::ops::f16_to_f32(gs.scale);
      for (int j = 0; j < g; ++j) {
        num[codes[static_cast<size_t>(j)]] += s * v[j];
        den[codes[static_cast<size_t>(j)]] += s * s;
      }
    }
    if (err < best_err) {  // the first round (the N(0, 1) table) always counts
      best_err = err;
      best_cb = cur;
    }
    if (round == rounds) break;
    // Centroid update (least squares for these codes and scales).
    std::vector<double> next(cur.begin(), cur.end());
    if (L % 2 == 1) {  // symmetric pairs around a zero middle entry
      const int m = L / 2;
      next[static_cast<size_t>(m)] = 0;
      for (int i = 0; i < m; ++i) {
        const size_t lo = static_cast<size_t>(i), hi = static_cast<size_t>(L - 1 - i);
        const double d = den[lo] + den[hi];
        if (d > 0) {
          const double c = (num[hi] - num[lo]) / d;
          next[lo] = -c;
          next[hi] = c;
        }
      }
    } else {
      for (int k = 0; k < L; ++k)
        if (den[static_cast<size_t>(k)] > 0) next[static_cast<size_t>(k)] = num[static_cast<size_t>(k)] / den[static_cast<size_t>(k)];
    }
    std::vector<float> cand(next.begin(), next.end());
    bool ok = true;
    for (int k = 0; k < L; ++k)
      ok = ok && std::isfinite(cand[static_cast<size_t>(k)]) && (k == 0 || cand[static_cast<size_t>(k)] > cand[static_cast<size_t>(k - 1)]);
    if (!ok || cand == cur) break;  // degenerate (a collapsed cell) or converged: keep the best so far
    cur = std::move(cand);
  }
  return best_cb;
}

}  // namespace spool::quant
