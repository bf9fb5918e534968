// Quantized matmul kernels against their scalar reference (every type, ragged shapes, group
// sizes, token counts, with and without a thread pool, every compiled SIMD target), against
// the float product W x within the quantization error, and their error handling.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "support/random.h"
#include "common/error.h"
#include "ops/matmul.h"
#include "ops/quant_matmul.h"
#include "quant/hadamard.h"
#include "quant/quantize.h"

namespace spool::ops {
namespace {

using spool::quant::QuantizedMatrix;

constexpr QType kTypes[] = {QType::kQ2, QType::kQ3, QType::kQ4, QType::kTernary, QType::kQ5, QType::kQ6, QType::kQ8};

using spool::testing::randn;

using spool::testing::for_each_target;

// Checks y against the reference: |y - ref| <= 1e-5 * |What'_r| |x_t| (Cauchy-Schwarz bound of
// the output's magnitude; the rotation preserves |x|).
void expect_close(const QuantView& w, const std::vector<float>& x, int64_t T, const std::vector<float>& y,
                  const std::vector<float>& ref, const std::string& what) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  std::vector<double> rnorm(static_cast<size_t>(w.rows));
  for (int64_t r = 0; r < w.rows; ++r) {
    spool::quant::dequantize_row(w, r, row.data());
    double s = 0;
    for (float v : row) s += double(v) * v;
    rnorm[r] = std::sqrt(s);
  }
  int bad = 0;
  for (int64_t t = 0; t < T; ++t) {
    double xs = 0;
    for (int64_t c = 0; c < w.cols; ++c) xs += double(x[t * w.cols + c]) * x[t * w.cols + c];
    for (int64_t r = 0; r < w.rows; ++r) {
      const double tol = 1e-5 * rnorm[r] * std::sqrt(xs) + 1e-30;
      const double e = std::fabs(double(y[t * w.rows + r]) - ref[t * w.rows + r]);
      if (!(e <= tol) && ++bad <= 5)
        ADD_FAILURE() << what << " t=" << t << " r=" << r << ": " << y[t * w.rows + r] << " vs " << ref[t * w.rows + r]
                      << " (tol " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

struct Shape {
  int64_t rows, cols;
  int group;
};

TEST(QuantMatmul, KernelsMatchReferenceEveryTarget) {
  const Shape shapes[] = {{5, 32, 32},    {19, 64, 32},    {7, 96, 32},    {33, 352, 32},  {17, 128, 128},
                          {13, 1536, 64}, {6, 2048, 128},  {21, 2880, 64}, {3, 2048, 32},  {4, 40, 40},
                          {9, 24, 24},    {3, 20, 20},     {2, 7, 7},      {35, 192, 64},  {1, 256, 128}};
  ThreadPool pool(2);
  int checked = 0;
  for (const Shape& sh : shapes) {
    const std::vector<float> W = randn(static_cast<size_t>(sh.rows * sh.cols), 100 + sh.rows * 31 + sh.cols, 0.05f);
    const std::vector<int8_t> signs = spool::quant::rotation_signs(9, "layers.0.mlp.down_proj", sh.cols);
    for (QType type : kTypes) {
      for (bool rotated : {true, false}) {
        const QuantizedMatrix q =
            spool::quant::quantize(W.data(), sh.rows, sh.cols, type, sh.group, rotated ? signs.data() : nullptr);
        const QuantView v = q.view();
        for (int64_t T : {1, 2, 3, 5, 70}) {
          const std::vector<float> x = randn(static_cast<size_t>(T * sh.cols), 7 * T + sh.cols);
          std::vector<float> ref(static_cast<size_t>(T * sh.rows));
          quant_matmul_reference(v, x.data(), T, ref.data());
          for_each_target([&](int64_t target) {
            ASSERT_STREQ(quant_kernel_target(), hwy::TargetName(target));
            for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
              std::vector<float> y(ref.size(), NAN);
              quant_matmul(v, x.data(), T, y.data(), p);
              const std::string what = std::string(hwy::TargetName(target)) + " " + quant::qtype_name(type) + " [" +
                                       std::to_string(sh.rows) + "x" + std::to_string(sh.cols) + "] g" +
                                       std::to_string(sh.group) + " T" + std::to_string(T) +
                                       (rotated ? " rot" : "") + (p ? " pool" : "");
              expect_close(v, x, T, y, ref, what);
              ++checked;
            }
          });
        }
      }
    }
  }
  std::printf("checked %d kernel configurations\n", checked);
}

TEST(QuantMatmul, LargeShapesBothPaths) {
  // Shapes of the benchmark, decode and a prefill tile boundary (T = 65), best target only.
  ThreadPool pool(2);
  for (const Shape sh : {Shape{256, 8192, 64}, Shape{1031, 2048, 128}}) {
    const std::vector<float> W = randn(static_cast<size_t>(sh.rows * sh.cols), 5, 0.05f);
    const std::vector<int8_t> signs = spool::quant::rotation_signs(3, "w", sh.cols);
    for (QType type : kTypes) {
      const QuantizedMatrix q = spool::quant::quantize(W.data(), sh.rows, sh.cols, type, sh.group, signs.data(), &pool);
      for (int64_t T : {1, 65}) {
        const std::vector<float> x = randn(static_cast<size_t>(T * sh.cols), 17 + T);
        std::vector<float> ref(static_cast<size_t>(T * sh.rows)), y(ref.size());
        quant_matmul_reference(q.view(), x.data(), T, ref.data());
        quant_matmul(q.view(), x.data(), T, y.data(), &pool);
        expect_close(q.view(), x, T, y, ref, std::string(quant::qtype_name(type)) + " T" + std::to_string(T));
      }
    }
  }
}

TEST(QuantMatmul, RotationRoundTripWithinQuantizationError) {
  // quant_matmul on the ORIGINAL x approximates W x with relative squared error ~ the codebook's
  // MSE (rotated weights are close to Gaussian whatever W looks like).
  const int64_t rows = 256, cols = 1536, T = 4;
  std::vector<float> W = randn(static_cast<size_t>(rows * cols), 12, 0.03f);
  for (int64_t r = 0; r < rows; ++r) W[r * cols + (r * 7) % cols] += 0.5f;  // outliers the rotation spreads
  const std::vector<float> x = randn(static_cast<size_t>(T * cols), 13);
  std::vector<float> exact(static_cast<size_t>(T * rows));
  matmul_reference(WeightView{WType::kF32, rows, cols, W.data()}, x.data(), T, exact.data());
  const std::vector<int8_t> signs = spool::quant::rotation_signs(1, "layers.2.mlp.gate_up", cols);
  const struct {
    QType t;
    double mse;
  } cases[] = {{QType::kQ2, 0.1175},   {QType::kQ3, 0.0345},     {QType::kQ4, 0.0095},   {QType::kTernary, 0.19},
               {QType::kQ5, 0.002505}, {QType::kQ6, 0.00064424}, {QType::kQ8, 8.80e-5}};  // scripts/lloyd_max.py
  ThreadPool pool(2);
  for (const auto& c : cases) {
    for (bool rotated : {true, false}) {
      const QuantizedMatrix q =
          spool::quant::quantize(W.data(), rows, cols, c.t, 64, rotated ? signs.data() : nullptr, &pool);
      std::vector<float> y(exact.size());
      quant_matmul(q.view(), x.data(), T, y.data(), &pool);
      double se = 0, ss = 0;
      for (size_t i = 0; i < y.size(); ++i) {
        se += (double(y[i]) - exact[i]) * (double(y[i]) - exact[i]);
        ss += double(exact[i]) * exact[i];
      }
      std::printf("%-8s %-9s relative output error %.4g (codebook MSE %.4g)\n", quant::qtype_name(c.t),
                  rotated ? "rotated" : "unrotated", se / ss, c.mse);
      if (rotated) {
        EXPECT_LT(se / ss, 1.3 * c.mse) << quant::qtype_name(c.t);
        EXPECT_GT(se / ss, 0.6 * c.mse) << quant::qtype_name(c.t);
      }
    }
  }
}

TEST(QuantMatmul, Q8NonAffineCodebookTakesThePlainPath) {
  // q8's lane kernels decode c_0 + code * step; a file may carry any ascending 256-entry
  // codebook, and then the result must still be its own (the plain path), on every target.
  const int64_t rows = 21, cols = 256, T = 3;
  const std::vector<float> W = randn(static_cast<size_t>(rows * cols), 33, 0.1f);
  QuantizedMatrix q = spool::quant::quantize(W.data(), rows, cols, QType::kQ8, 64, nullptr);
  for (int k = 0; k < 256; ++k) q.codebook[k] += 0.004f * std::sin(0.1f * k);  // still ascending (step 1/32)
  const std::vector<float> x = randn(static_cast<size_t>(T * cols), 34);
  std::vector<float> ref(static_cast<size_t>(T * rows));
  quant_matmul_reference(q.view(), x.data(), T, ref.data());
  for_each_target([&](int64_t target) {
    for (int64_t t : {int64_t{1}, T}) {
      std::vector<float> y(static_cast<size_t>(t * rows), NAN);
      quant_matmul(q.view(), x.data(), t, y.data(), nullptr);
      expect_close(q.view(), x, t, y, std::vector<float>(ref.begin(), ref.begin() + t * rows),
                   std::string(hwy::TargetName(target)) + " T" + std::to_string(t));
    }
  });
}

TEST(QuantMatmul, Q8AnyAffineCodebookOnEveryTarget) {
  // q8 decode folds c_0 and step into per-group sums (sum_g s_g (c_0 sum x + step sum k x)):
  // any affine codebook, not only the format's grid (c_0 = -255/64, step = 1/32), must give its
  // own product, for every group size and the decode token counts, on every target.
  const struct {
    float c0, step;
  } grids[] = {{-2.0f, 0.0625f}, {0.5f, 0.125f}, {-40.0f, 0.25f}};
  for (int g : {32, 64, 128}) {
    const int64_t rows = 23, cols = 384;
    const std::vector<float> W = randn(static_cast<size_t>(rows * cols), 40 + g, 0.1f);
    for (const auto& grid : grids) {
      QuantizedMatrix q = spool::quant::quantize(W.data(), rows, cols, QType::kQ8, g, nullptr);
      for (int k = 0; k < 256; ++k) q.codebook[k] = grid.c0 + static_cast<float>(k) * grid.step;  // exact
      const std::vector<float> x = randn(static_cast<size_t>(5 * cols), 41);
      std::vector<float> ref(static_cast<size_t>(5 * rows));
      quant_matmul_reference(q.view(), x.data(), 5, ref.data());
      for_each_target([&](int64_t target) {
        for (int64_t T : {1, 2, 3, 4, 5}) {
          std::vector<float> y(static_cast<size_t>(T * rows), NAN);
          quant_matmul(q.view(), x.data(), T, y.data(), nullptr);
          expect_close(q.view(), x, T, y, std::vector<float>(ref.begin(), ref.begin() + T * rows),
                       std::string(hwy::TargetName(target)) + " g" + std::to_string(g) + " c0 " +
                           std::to_string(grid.c0) + " T" + std::to_string(T));
        }
      });
    }
  }
}

TEST(QuantMatmul, RowsRangeAndStride) {
  const int64_t rows = 45, cols = 256, T = 3, ldy = 50;
  const std::vector<float> W = randn(static_cast<size_t>(rows * cols), 21, 0.1f);
  const std::vector<int8_t> signs = spool::quant::rotation_signs(2, "x", cols);
  for (QType type : kTypes) {
    const QuantizedMatrix q = spool::quant::quantize(W.data(), rows, cols, type, 64, signs.data());
    std::vector<float> x = randn(static_cast<size_t>(T * cols), 4), xr(x.size());
    for (int64_t t = 0; t < T; ++t) spool::quant::rotate_input(signs.data(), x.data() + t * cols, cols, xr.data() + t * cols);
    std::vector<float> full(static_cast<size_t>(T * rows)), y(static_cast<size_t>(T * ldy), -7.0f);
    quant_matmul(q.view(), x.data(), T, full.data(), nullptr);
    quant_matmul_rows(q.view(), xr.data(), T, y.data(), ldy, 13, 30);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t r = 0; r < ldy; ++r) {
        if (r >= 13 && r < 30) {
          EXPECT_EQ(y[t * ldy + r], full[t * rows + r]) << r;
        } else {
          EXPECT_EQ(y[t * ldy + r], -7.0f) << r;
        }
      }
  }
}

TEST(QuantMatmul, Errors) {
  const std::vector<float> W = randn(8 * 128, 1);
  const QuantizedMatrix q = spool::quant::quantize(W.data(), 8, 128, QType::kQ4, 64, nullptr);
  std::vector<float> x(128, 1.0f), y(8);
  QuantView v = q.view();
  EXPECT_NO_THROW(quant_matmul(v, x.data(), 1, y.data(), nullptr));
  QuantView bad = v;
  bad.group = 48;  // not 32/64/128 and not cols
  EXPECT_THROW(quant_matmul(bad, x.data(), 1, y.data(), nullptr), spool::Error);
  bad.group = 256;  // more than cols
  EXPECT_THROW(quant_matmul(bad, x.data(), 1, y.data(), nullptr), spool::Error);
  bad = v;
  bad.cols = 96;  // 64 does not divide 96
  EXPECT_THROW(quant_matmul(bad, x.data(), 1, y.data(), nullptr), spool::Error);
  bad = v;
  bad.scales = nullptr;
  EXPECT_THROW(quant_matmul(bad, x.data(), 1, y.data(), nullptr), spool::Error);
  bad = v;
  bad.cols = 0;
  EXPECT_THROW(quant_matmul_reference(bad, x.data(), 1, y.data()), spool::Error);
  EXPECT_THROW(quant_matmul_rows(v, x.data(), 1, y.data(), 8, 0, 9), spool::Error);
  EXPECT_THROW(quant_matmul_rows(v, x.data(), 1, y.data(), 8, -1, 3), spool::Error);
  // The codebook length comes from the file: only 3/4/8/16/32/64/256 entries name a type.
  EXPECT_THROW(spool::quant::qtype_from_levels(5), spool::Error);
  EXPECT_THROW(spool::quant::qtype_from_levels(128), spool::Error);
  EXPECT_EQ(spool::quant::qtype_from_levels(256), QType::kQ8);
  const std::vector<float> cb7(7, 0.0f);
  EXPECT_THROW(spool::quant::validate_codebook(QType::kQ3, cb7, "layers.0.mlp.down_proj.codebook"), spool::Error);
}

}  // namespace
}  // namespace spool::ops
