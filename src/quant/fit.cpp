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
constexpr float kStartFactors[] = {0.80f, 0.90f, 1.00f, 1.10f, 1.25f};
// The cheaper start set of fit_codebook's rounds (the final quantization uses the full grid).
constexpr float kFitStartFactors[] = {0.85f, 1.00f, 1.15f};
constexpr int kRefineSteps = 3;
constexpr double kMinScale = 1e-7;        // the format's floor of a group scale
constexpr int64_t kFitValues = 1 << 16;   // subsample of fit_codebook (weights)
constexpr double kMinGain = 1e-3;         // fit_codebook stops once a round gains less (relative)

// Least-squares sums a = sum(v c), b = sum(c^2) for the nearest codes of v * inv, in float with
// float boundaries, as c = cb[0] + the steps cb[m + 1] - cb[m] of the boundaries below x (loops
// the compiler vectorizes; x, c: g floats of scratch): the search's start and refinement passes
// only, which rank scales. Final codes and errors come from Coder::code and sse_of.
inline void assign_fast(const float* __restrict v, int g, float inv, const Coder& k, float* __restrict x, float* __restrict c,
                        double* a, double* b) {
  const int n = static_cast<int>(k.midf.size());
  const float c0 = k.cb.front();
  for (int l = 0; l < g; ++l) {
    x[l] = v[l] * inv;
    c[l] = c0;
  }
  if (k.uniform) {  // a grid: the nearest entry by rounding (ties may differ from the boundary rule; ranking only)
    const float st = k.step.front(), inv = 1.0f / st, top = static_cast<float>(n);
    for (int l = 0; l < g; ++l) c[l] = c0 + st * std::clamp(std::floor((x[l] - c0) * inv + 0.5f), 0.0f, top);
  } else {
    for (int m = 0; m < n; ++m) {
      const float mm = k.midf[static_cast<size_t>(m)], st = k.step[static_cast<size_t>(m)];
      for (int l = 0; l < g; ++l) c[l] += x[l] > mm ? st : 0.0f;
    }
  }
  float pa[8] = {}, pb[8] = {};
  int l = 0;
  for (; l + 8 <= g; l += 8)
    for (int q = 0; q < 8; ++q) {
      pa[q] += v[l + q] * c[l + q];
      pb[q] += c[l + q] * c[l + q];
    }
  double sa = 0, sb = 0;
  for (; l < g; ++l) {
    sa += static_cast<double>(v[l]) * c[l];
    sb += static_cast<double>(c[l]) * c[l];
  }
  for (int q = 0; q < 8; ++q) {
    sa += pa[q];
    sb += pb[q];
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
  for (size_t i = 0; i + 1 < cb.size(); ++i) {
    midf.push_back(static_cast<float>(mid[i]));
    step.push_back(cb[i + 1] - cb[i]);
  }
  uniform = step.size() >= 16 && std::all_of(step.begin(), step.end(), [&](float d) { return d == step.front(); });
}

int Coder::code(float x) const { return code_from_boundaries(mid, std::clamp(x, -lim, lim)); }

namespace {

// search_scale() with the start factors `starts` (multiples of the RMS scale).
GroupScale search_impl(const float* v, int g, const Coder& coder, ScaleSearch mode, std::span<const float> starts, uint8_t* codes) {
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
  for (int j = 0; j < g; ++j) codes[j] = static_cast<uint8_t>(coder.code(v[j] / s0));
  double a = 0, b = 0;
  best.sse = sse_of(v, g, s0, coder, codes);

  // Starts: the grid around the RMS scale, and the scale that puts max|v| on the outermost centroid.
  float vmax = 0;
  for (int j = 0; j < g; ++j) vmax = std::max(vmax, std::fabs(v[j]));
  const float cmax = std::max(std::fabs(coder.cb.front()), std::fabs(coder.cb.back()));
  double ls_best = std::numeric_limits<double>::infinity(), s_best = 0;
  thread_local std::vector<float> scratch;
  if (scratch.size() < 2 * static_cast<size_t>(g)) scratch.resize(2 * static_cast<size_t>(g));
  float* xs = scratch.data();
  float* cs = scratch.data() + g;
  auto try_start = [&](double s) {
    const uint16_t h = candidate_bits(s);
    if (h == 0) return;
    assign_fast(v, g, 1.0f / spool::ops::f16_to_f32(h), coder, xs, cs, &a, &b);
    if (!(a > 0) || !(b > 0)) return;
    const double err = ss - a * a / b;  // error at the least-squares scale a / b of these codes
    if (err < ls_best) {
      ls_best = err;
      s_best = a / b;
    }
  };
  for (float f : starts) try_start(static_cast<double>(s0) * f);
  if (cmax > 0) try_start(static_cast<double>(vmax) / cmax);
  if (!(s_best > 0)) return best;
  for (int it = 0; it < kRefineSteps; ++it) {
    const uint16_t h = candidate_bits(s_best);
    if (h == 0) break;
    assign_fast(v, g, 1.0f / spool::ops::f16_to_f32(h), coder, xs, cs, &a, &b);
    if (!(a > 0) || !(b > 0)) break;
    const double next = a / b;
    if (candidate_bits(next) == h) break;  // converged to fp16 precision
    s_best = next;
  }
  const uint16_t h = candidate_bits(s_best);
  if (h == 0 || h == h0) return best;
  const float s = spool::ops::f16_to_f32(h);
  thread_local std::vector<uint8_t> alt;
  if (alt.size() < static_cast<size_t>(g)) alt.resize(static_cast<size_t>(g));
  uint8_t* c = alt.data();
  for (int j = 0; j < g; ++j) c[j] = static_cast<uint8_t>(coder.code(v[j] / s));
  const double err = sse_of(v, g, s, coder, c);
  if (err < best.sse) {
    best = {h, err};
    std::copy_n(c, g, codes);
  }
  return best;
}

}  // namespace

GroupScale search_scale(const float* v, int g, const Coder& coder, ScaleSearch mode, uint8_t* codes) {
  return search_impl(v, g, coder, mode, kStartFactors, codes);
}

std::vector<float> fit_codebook(QType t, int g, int64_t rows, int64_t cols, const std::function<void(int64_t, float*)>& row,
                                ScaleSearch mode, int rounds) {
  check_group(cols, g);
  const std::span<const float> gauss = codebook(t);
  // q8's uniform grid is never fitted: its kernels decode the grid arithmetically, and a fitted
  // 256-entry codebook would run on the slow table path (~6x slower decode).
  if (rows <= 0 || t == QType::kQ8) return {gauss.begin(), gauss.end()};
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
      const GroupScale gs = search_impl(v, g, coder, mode, kFitStartFactors, codes.data());
      err += gs.sse;
      const double s = spool::ops::f16_to_f32(gs.scale);
      for (int j = 0; j < g; ++j) {
        num[codes[static_cast<size_t>(j)]] += s * v[j];
        den[codes[static_cast<size_t>(j)]] += s * s;
      }
    }
    // The first round (the N(0, 1) table) always counts; a round that gains less than
    // kMinGain of the error ends the fit (rotated weights are close to Gaussian, where the
    // table is already the optimum and further rounds only cost time).
    const bool gained = err < best_err * (1 - kMinGain);
    if (err < best_err) {
      best_err = err;
      best_cb = cur;
    }
    if (round == rounds || (round > 0 && !gained)) break;
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
