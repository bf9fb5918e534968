// Scale search and fitted codebooks (quant/fit.h): the searched scale is never worse than the RMS
// scale and usually better; its codes are the nearest ones for the rounded scale; fitted codebooks
// are valid, beat the N(0, 1) table on non-Gaussian data, and do not depend on the thread count.
#include "quant/fit.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/error.h"
#include "ops/thread_pool.h"
#include "ops/weights.h"
#include "quant/hadamard.h"
#include "quant/pack.h"
#include "quant/quantize.h"

namespace spool::quant {
namespace {

constexpr QType kTypes[] = {QType::kQ2, QType::kQ3, QType::kQ4, QType::kTernary, QType::kQ5, QType::kQ6, QType::kQ8};

// Random values of one of several shapes: Gaussian, Laplace, uniform, Student-t(3), a Gaussian
// with one large outlier, and near-constant.
std::vector<float> sample(std::mt19937& rng, int shape, int n) {
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::exponential_distribution<float> expo(1.0f);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::student_t_distribution<float> t3(3.0f);
  std::vector<float> v(static_cast<size_t>(n));
  const float scale = std::pow(10.0f, uni(rng) * 3.0f);  // 1e-3 .. 1e3
  for (float& x : v) {
    switch (shape) {
      case 0: x = gauss(rng); break;
      case 1: x = (uni(rng) < 0 ? -1.0f : 1.0f) * expo(rng); break;
      case 2: x = uni(rng); break;
      case 3: x = t3(rng); break;
      case 4: x = gauss(rng); break;
      default: x = 1.0f + 1e-3f * uni(rng); break;
    }
    x *= scale;
  }
  if (shape == 4) v[static_cast<size_t>(rng() % n)] *= 12.0f;
  return v;
}

double exact_sse(const std::vector<float>& v, float s, const std::vector<float>& cb, const std::vector<uint8_t>& codes) {
  double e = 0;
  for (size_t j = 0; j < v.size(); ++j) {
    const double d = static_cast<double>(v[j]) - static_cast<double>(s) * cb[codes[j]];
    e += d * d;
  }
  return e;
}

// Many random groups of every shape, type and group size, under the N(0, 1) table and under a
// skewed (but valid) codebook: the searched scale's error is never above the RMS scale's, the
// reported error is the exact error of the returned scale and codes, and those codes are the
// nearest centroids for the returned (fp16-rounded) scale. The search must also win on most
// groups: a search that always fell back to the RMS scale would pass the rest.
TEST(ScaleSearch, NeverWorseThanRmsAndCodesNearestForRoundedScale) {
  std::mt19937 rng(1234);
  int groups = 0, better = 0;
  for (QType t : kTypes) {
    const std::span<const float> gauss = codebook(t);
    std::vector<float> skewed(gauss.begin(), gauss.end());
    for (size_t k = 0; k < skewed.size(); ++k) skewed[k] = skewed[k] * (skewed[k] > 0 ? 1.3f : 0.8f) + 0.05f * static_cast<float>(k);
    validate_codebook(t, skewed, "skewed");
    for (const std::vector<float>& cb : {std::vector<float>(gauss.begin(), gauss.end()), skewed}) {
      const Coder coder(cb);
      for (int g : {32, 64, 128, 20}) {
        for (int shape = 0; shape < 6; ++shape) {
          for (int rep = 0; rep < 40; ++rep) {
            const std::vector<float> v = sample(rng, shape, g);
            std::vector<uint8_t> rms_codes(static_cast<size_t>(g)), codes(static_cast<size_t>(g));
            const GroupScale r = search_scale(v.data(), g, coder, ScaleSearch::kNone, rms_codes.data());
            const GroupScale m = search_scale(v.data(), g, coder, ScaleSearch::kMse, codes.data());
            const float rs = ops::f16_to_f32(r.scale), ms = ops::f16_to_f32(m.scale);
            ASSERT_TRUE(std::isfinite(ms) && ms > 0) << qtype_name(t) << " g" << g << " shape " << shape;
            ASSERT_LE(m.sse, r.sse) << qtype_name(t) << " g" << g << " shape " << shape << " rep " << rep;
            ASSERT_EQ(r.sse, exact_sse(v, rs, cb, rms_codes));
            ASSERT_EQ(m.sse, exact_sse(v, ms, cb, codes));
            for (int j = 0; j < g; ++j) {
              ASSERT_EQ(rms_codes[j], coder.code(v[j] / rs));
              ASSERT_EQ(codes[j], coder.code(v[j] / ms)) << qtype_name(t) << " g" << g << " j " << j;
            }
            ++groups;
            better += m.sse < r.sse * (1 - 1e-6);
          }
        }
      }
    }
  }
  std::printf("searched scale strictly better than RMS on %d of %d groups\n", better, groups);
  EXPECT_GT(better, groups * 7 / 10);
}

// The RMS rule of search_scale(kNone) is the format's: quantize_rows with Coder(codebook(t))
// and kNone writes the same bytes as the original overload.
TEST(ScaleSearch, NoneIsTheOriginalRule) {
  std::mt19937 rng(7);
  for (QType t : kTypes) {
    const int64_t rows = 6, cols = 256;
    std::vector<float> W = sample(rng, 3, static_cast<int>(rows * cols));
    const int8_t* none = nullptr;
    const int64_t rb = row_bytes(t, cols, 64);
    std::vector<uint8_t> q0(static_cast<size_t>(rows * rb)), q1(q0.size());
    std::vector<uint16_t> s0(static_cast<size_t>(rows * cols / 64)), s1(s0.size());
    quantize_rows(W.data(), cols, t, 64, none, 0, rows, q0.data(), s0.data());
    quantize_rows(W.data(), cols, t, 64, none, 0, rows, q1.data(), s1.data(), Coder(codebook(t)), ScaleSearch::kNone);
    EXPECT_EQ(q0, q1) << qtype_name(t);
    EXPECT_EQ(s0, s1) << qtype_name(t);
    for (int64_t i = 0; i < rows * cols / 64; ++i) {
      double ss = 0;
      for (int j = 0; j < 64; ++j) ss += static_cast<double>(W[i * 64 + j]) * W[i * 64 + j];
      EXPECT_EQ(s0[i], f32_to_f16(static_cast<float>(std::sqrt(ss / 64))));
    }
  }
}

// Squared reconstruction error of W quantized with `opts` (original basis).
double recon_sse(const std::vector<float>& W, int64_t rows, int64_t cols, QType t, int g, const int8_t* signs,
                 const QuantOptions& opts, std::vector<float>* cb_out = nullptr) {
  const QuantizedMatrix q = quantize(W.data(), rows, cols, t, g, signs, nullptr, opts);
  if (cb_out != nullptr) *cb_out = q.codebook;
  std::vector<float> back(W.size());
  dequantize(q.view(), back.data());
  double e = 0;
  for (size_t i = 0; i < W.size(); ++i) e += (static_cast<double>(W[i]) - back[i]) * (static_cast<double>(W[i]) - back[i]);
  return e;
}

// A rows x cols Laplace matrix (random sign times Exp(rate); heavy-tailed, unlike the Gaussian
// tables), drawn from rng.
std::vector<float> laplace_matrix(int64_t rows, int64_t cols, float rate, std::mt19937& rng) {
  std::vector<float> W(static_cast<size_t>(rows * cols));
  std::exponential_distribution<float> expo(rate);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (float& x : W) x = (uni(rng) < 0 ? -1.0f : 1.0f) * expo(rng);
  return W;
}

// On a Laplace matrix (not rotated, so its groups stay heavy-tailed) the fitted codebook is
// ascending and finite, keeps ternary symmetric around 0, and lowers the error against the
// N(0, 1) table with either scale rule; the scale search lowers it against RMS scales.
TEST(FitCodebook, BeatsTheGaussianTableOnLaplaceData) {
  std::mt19937 rng(99);
  const int64_t rows = 64, cols = 512;
  const std::vector<float> W = laplace_matrix(rows, cols, 20.0f, rng);
  for (QType t : kTypes) {
    for (ScaleSearch ss : {ScaleSearch::kNone, ScaleSearch::kMse}) {
      std::vector<float> cb;
      const double gauss = recon_sse(W, rows, cols, t, 64, nullptr, {ss, CodebookSource::kGaussian});
      const double fit = recon_sse(W, rows, cols, t, 64, nullptr, {ss, CodebookSource::kFit}, &cb);
      EXPECT_NO_THROW(validate_codebook(t, cb, "fitted"));
      std::printf("%-8s scales %-4s: MSE gaussian %.4e fitted %.4e (%.1f%%)  codebook", qtype_name(t), scale_search_name(ss), gauss,
                  fit, 100.0 * (fit / gauss - 1));
      for (float c : cb) std::printf(" %.4f", c);
      std::printf("\n");
      if (t == QType::kTernary) {
        EXPECT_EQ(cb[1], 0.0f);
        EXPECT_EQ(cb[0], -cb[2]);
        // Symmetric ternary has one shape: the fit can only trade its scale against the group scales.
        EXPECT_LE(fit, gauss * 1.0001);
      } else if (t == QType::kQ8) {  // the uniform grid is kept: same codebook, same error
        EXPECT_TRUE(std::equal(cb.begin(), cb.end(), codebook(t).begin()));
        EXPECT_EQ(fit, gauss);
      } else {
        EXPECT_LT(fit, gauss * 0.99) << qtype_name(t) << " " << scale_search_name(ss);
      }
    }
    EXPECT_LT(recon_sse(W, rows, cols, t, 64, nullptr, {ScaleSearch::kMse, CodebookSource::kGaussian}),
              recon_sse(W, rows, cols, t, 64, nullptr, QuantOptions::legacy()))
        << qtype_name(t);
  }
}

// The whole quantizer in the default mode (scale search and fitted codebook, rotated) writes the
// same bytes with 1, 2 and 5 threads, and differs from the legacy mode.
// q8 keeps its uniform grid whoever asks (spool convert calls fit_codebook directly, quantize()
// through its options): its kernels decode the grid arithmetically.
TEST(FitCodebook, Q8KeepsItsGrid) {
  std::mt19937 rng(5);
  const int64_t rows = 16, cols = 256;
  const std::vector<float> W = laplace_matrix(rows, cols, 20.0f, rng);
  const std::vector<float> cb = fit_codebook(QType::kQ8, 64, rows, cols, [&](int64_t r, float* out) {
    std::copy_n(W.data() + r * cols, cols, out);
  }, ScaleSearch::kMse);
  const std::span<const float> grid = codebook(QType::kQ8);
  ASSERT_EQ(cb.size(), grid.size());
  EXPECT_TRUE(std::equal(cb.begin(), cb.end(), grid.begin()));
}

TEST(FitCodebook, DeterministicAcrossThreadCounts) {
  std::mt19937 rng(5);
  const int64_t rows = 96, cols = 384;
  std::vector<float> W = sample(rng, 3, static_cast<int>(rows * cols));
  const std::vector<int8_t> signs = rotation_signs(42, "layers.0.mlp.down_proj", cols);
  for (QType t : kTypes) {
    const QuantizedMatrix one = quantize(W.data(), rows, cols, t, 64, signs.data(), nullptr, QuantOptions{});
    for (int threads : {2, 5}) {
      ops::ThreadPool pool(threads);
      const QuantizedMatrix q = quantize(W.data(), rows, cols, t, 64, signs.data(), &pool, QuantOptions{});
      EXPECT_EQ(q.qweight, one.qweight) << qtype_name(t) << " threads " << threads;
      EXPECT_EQ(q.scales, one.scales) << qtype_name(t) << " threads " << threads;
      EXPECT_EQ(q.codebook, one.codebook) << qtype_name(t) << " threads " << threads;
    }
    const QuantizedMatrix old = quantize(W.data(), rows, cols, t, 64, signs.data());
    EXPECT_NE(old.scales, one.scales) << qtype_name(t);
  }
}

// The CPU kernels read each matrix's own codebook: quant_matmul of a matrix with a fitted (not
// N(0, 1)) codebook equals W_hat x, W_hat = dequantize() (the view's codebook times the scales,
// unrotated), for a decode-sized and a prefill-sized batch.
TEST(FitCodebook, KernelsUseTheMatrixCodebook) {
  std::mt19937 rng(11);
  const int64_t rows = 40, cols = 256;
  const std::vector<float> W = laplace_matrix(rows, cols, 10.0f, rng);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const std::vector<int8_t> signs = rotation_signs(3, "layers.1.self_attn.o_proj", cols);
  for (QType t : kTypes) {
    for (const int8_t* sg : {static_cast<const int8_t*>(nullptr), signs.data()}) {
      const QuantizedMatrix q = quantize(W.data(), rows, cols, t, 64, sg, nullptr, QuantOptions{});
      const std::span<const float> gauss = codebook(t);
      // Fitted (ternary: its one free value), except q8, whose uniform grid is kept.
      EXPECT_EQ(std::equal(gauss.begin(), gauss.end(), q.codebook.begin()), t == QType::kQ8) << qtype_name(t);
      std::vector<float> back(W.size());
      dequantize(q.view(), back.data());
      for (int64_t T : {1, 9}) {
        std::vector<float> x(static_cast<size_t>(T * cols)), y(static_cast<size_t>(T * rows));
        for (float& v : x) v = uni(rng);
        spool::ops::quant_matmul(q.view(), x.data(), T, y.data(), nullptr);
        for (int64_t i = 0; i < T; ++i)
          for (int64_t r = 0; r < rows; ++r) {
            double want = 0, mag = 0;
            for (int64_t c = 0; c < cols; ++c) {
              want += static_cast<double>(back[r * cols + c]) * x[i * cols + c];
              mag += std::fabs(static_cast<double>(back[r * cols + c]) * x[i * cols + c]);
            }
            ASSERT_NEAR(y[i * rows + r], want, 1e-5 * mag + 1e-7)
                << qtype_name(t) << (sg ? " rotated" : "") << " T " << T << " row " << r;
          }
      }
    }
  }
}

TEST(FitCodebook, FlagNamesAndErrors) {
  EXPECT_EQ(parse_scale_search("none"), ScaleSearch::kNone);
  EXPECT_EQ(parse_scale_search("mse"), ScaleSearch::kMse);
  EXPECT_EQ(parse_codebook_source("gaussian"), CodebookSource::kGaussian);
  EXPECT_EQ(parse_codebook_source("fit"), CodebookSource::kFit);
  EXPECT_THROW(parse_scale_search("rms"), UsageError);
  EXPECT_THROW(parse_codebook_source("lloyd"), UsageError);
  EXPECT_TRUE(QuantOptions::legacy().is_legacy());
  EXPECT_FALSE(QuantOptions{}.is_legacy());
  // A weight beyond the fp16 range of the scales, and a non-finite one, are errors in every mode.
  std::vector<float> W(2 * 64, 0.5f);
  W[3] = 1e30f;
  EXPECT_THROW(quantize(W.data(), 2, 64, QType::kQ4, 64, nullptr, nullptr, QuantOptions{}), Error);
  W[3] = NAN;
  EXPECT_THROW(quantize(W.data(), 2, 64, QType::kQ4, 64, nullptr, nullptr, QuantOptions{}), Error);
  // All-zero groups keep the floor scale and the zero-nearest codes.
  std::vector<float> Z(2 * 64, 0.0f);
  const QuantizedMatrix z = quantize(Z.data(), 2, 64, QType::kQ3, 64, nullptr, nullptr, QuantOptions{});
  std::vector<float> back(Z.size());
  dequantize(z.view(), back.data());
  for (float v : back) EXPECT_LT(std::fabs(v), 1e-6f);
}

}  // namespace
}  // namespace spool::quant
