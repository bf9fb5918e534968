// Int8-activation kernels for spool's q4 (--act-bits 8): against their scalar reference on every
// compiled target, the same bits for any token count and row split, within the stated error
// bound of the f32 product, and wired into matmul() / matmul_rows_pair().
#define HWY_WANT_AVX3_DL  // the kernels' VNNI target among the targets run (before hwy headers)
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "support/random.h"
#include "common/error.h"
#include "ops/ggml_q8.h"
#include "ops/matmul.h"
#include "ops/quant_matmul.h"
#include "ops/quant_q8.h"
#include "quant/hadamard.h"
#include "quant/quantize.h"

namespace spool::ops {
namespace {

using spool::quant::QuantizedMatrix;
using spool::testing::for_each_target;
using spool::testing::randn;

struct Shape {
  int64_t rows, cols;
  int group;
};

// Rotated activations for w (x itself when w has no signs).
std::vector<float> rotate(const QuantView& w, const std::vector<float>& x, int64_t T) {
  std::vector<float> r(x);
  if (w.signs != nullptr)
    for (int64_t t = 0; t < T; ++t) hadamard_rotate(w.signs, x.data() + t * w.cols, w.cols, r.data() + t * w.cols);
  return r;
}

TEST(QuantQ8, KernelsMatchReferenceEveryTarget) {
  const Shape shapes[] = {{5, 256, 32}, {19, 512, 64}, {7, 768, 128}, {13, 2048, 64}, {6, 256, 256},
                          {3, 1024, 1024}, {1, 512, 32}, {9, 128, 128}, {4, 384, 32}, {2, 640, 64}};
  int checked = 0;
  for (const Shape& sh : shapes) {
    const std::vector<float> W = randn(static_cast<size_t>(sh.rows * sh.cols), 300 + sh.rows * 7 + sh.cols, 0.05f);
    const std::vector<int8_t> signs = spool::quant::rotation_signs(3, "layers.0.mlp.up_proj", sh.cols);
    for (QType type : {QType::kQ4, QType::kQ8})
    for (bool rotated : {true, false}) {
      const QuantizedMatrix q = spool::quant::quantize(W.data(), sh.rows, sh.cols, type, sh.group, rotated ? signs.data() : nullptr);
      const QuantView v = q.view();
      ASSERT_TRUE(quant_q8_supported(v));
      for (int64_t T : {1, 2, 3, 4, 7}) {
        const std::vector<float> x = rotate(v, randn(static_cast<size_t>(T * sh.cols), 11 * T + sh.cols), T);
        QuantQ8Acts a;
        quant_q8_prepare(x.data(), T, sh.cols, a);
        std::vector<float> ref(static_cast<size_t>(T * sh.rows));
        quant_q8_matmul_reference(v, a, ref.data());
        for_each_target([&](int64_t target) {
          // AVX2: with AVX-VNNI where the CPU has it, and without (the sign trick of older AVX2 CPUs).
          for (bool dot_ext : {true, false}) {
            if (!dot_ext && target != HWY_AVX2) continue;
            q8_allow_dot_extension(dot_ext);
            std::vector<float> y(static_cast<size_t>(T * sh.rows), -1.0f);
            quant_q8_matmul_rows(v, a, y.data(), sh.rows, 0, sh.rows);
            q8_allow_dot_extension(true);
            for (int64_t i = 0; i < T * sh.rows; ++i) {
              // f32 accumulation of exact int32 lane dots against double: relative to the sum of |terms|.
              const double tol = 2e-6 * (std::fabs(ref[i]) + 1.0) * std::sqrt(double(sh.cols) / 8);
              ASSERT_NEAR(y[i], ref[i], tol) << qtype_bits(type) << "-bit " << sh.rows << "x" << sh.cols << " g" << sh.group << " T=" << T
                                             << " i=" << i << " " << quant_q8_variant();
            }
            ++checked;
          }
        });
      }
    }
  }
  EXPECT_GT(checked, 0);
}

// The VNNI (c8 + 128 with an offset) and the sign-trick integer dots are exact: the AVX3_DL and
// AVX3 targets give the same bits; every target gives the same bits for any T and row split.
class QuantQ8Types : public ::testing::TestWithParam<QType> {};
INSTANTIATE_TEST_SUITE_P(Q4Q8, QuantQ8Types, ::testing::Values(QType::kQ4, QType::kQ8),
                         [](const auto& i) { return "q" + std::to_string(qtype_bits(i.param)); });

TEST_P(QuantQ8Types, SameBitsForAnyTokenCountRowSplitAndVnni) {
  const int64_t rows = 37, cols = 1536;
  const std::vector<float> W = randn(static_cast<size_t>(rows * cols), 5, 0.05f);
  const std::vector<int8_t> signs = spool::quant::rotation_signs(1, "layers.2.mlp.gate_proj", cols);
  const QuantizedMatrix q = spool::quant::quantize(W.data(), rows, cols, GetParam(), 64, signs.data());
  const QuantView v = q.view();
  const int64_t T = 6;
  const std::vector<float> x = randn(static_cast<size_t>(T * cols), 77);
  QuantQ8Acts all;
  quant_q8_prepare(x.data(), T, cols, all);
  std::vector<float> dl, avx3;
  for_each_target([&](int64_t target) {
    std::vector<float> y(static_cast<size_t>(T * rows)), y1(y.size()), ys(y.size());
    quant_q8_matmul_rows(v, all, y.data(), rows, 0, rows);
    for (int64_t t = 0; t < T; ++t) {  // one token at a time
      QuantQ8Acts one;
      quant_q8_prepare(x.data() + t * cols, 1, cols, one);
      quant_q8_matmul_rows(v, one, y1.data() + t * rows, rows, 0, rows);
    }
    const int64_t cuts[] = {0, 3, 10, 29, rows};
    for (int i = 0; i + 1 < 5; ++i) quant_q8_matmul_rows(v, all, ys.data(), rows, cuts[i], cuts[i + 1]);
    EXPECT_EQ(std::memcmp(y.data(), y1.data(), y.size() * sizeof(float)), 0) << "T=6 vs one token at a time";
    EXPECT_EQ(std::memcmp(y.data(), ys.data(), y.size() * sizeof(float)), 0) << "row split";
    if (target == HWY_AVX3_DL) dl = y;
    if (target == HWY_AVX3) avx3 = y;
    if (target == HWY_AVX2) {  // AVX-VNNI's vpdpbusd (where the CPU has it) and the sign trick: the same bits
      const std::string variant = quant_q8_variant();
      q8_allow_dot_extension(false);
      std::vector<float> yb(y.size());
      EXPECT_STREQ(quant_q8_variant(), "avx2");
      quant_q8_matmul_rows(v, all, yb.data(), rows, 0, rows);
      q8_allow_dot_extension(true);
      EXPECT_EQ(std::memcmp(y.data(), yb.data(), y.size() * sizeof(float)), 0) << variant << " vs avx2";
    }
  });
  const std::vector<int64_t> run = hwy::SupportedAndGeneratedTargets();  // what for_each_target ran
  if (std::count(run.begin(), run.end(), HWY_AVX3_DL) != 0 && std::count(run.begin(), run.end(), HWY_AVX3) != 0) {
    ASSERT_FALSE(dl.empty());
    ASSERT_FALSE(avx3.empty());
    EXPECT_EQ(std::memcmp(dl.data(), avx3.data(), dl.size() * sizeof(float)), 0) << "VNNI vs sign trick";
  }
}

// Against the f32 product of the dequantized matrix: within sum_c |s_g| (|W~| d_b / 2 + dc / 2 |x|)
// (quant_q8.h), computed in double; and much closer than that on average.
TEST_P(QuantQ8Types, WithinTheErrorBoundOfTheF32Product) {
  const int64_t rows = 24, cols = 2048;
  const std::vector<float> W = randn(static_cast<size_t>(rows * cols), 9, 0.05f);
  const std::vector<int8_t> signs = spool::quant::rotation_signs(2, "layers.1.mlp.down_proj", cols);
  const QuantizedMatrix q = spool::quant::quantize(W.data(), rows, cols, GetParam(), 64, signs.data());
  const QuantView v = q.view();
  const std::vector<float> x = rotate(v, randn(static_cast<size_t>(cols), 21), 1);
  QuantQ8Acts a;
  quant_q8_prepare(x.data(), 1, cols, a);
  std::vector<float> y(static_cast<size_t>(rows)), f(static_cast<size_t>(rows));
  quant_q8_matmul_rows(v, a, y.data(), rows, 0, rows);
  quant_matmul_rows(v, x.data(), 1, f.data(), rows, 0, rows);
  float cmax = 0;
  for (int k = 0; k < 16; ++k) cmax = std::max(cmax, std::fabs(v.centroid(k)));
  const double dc = GetParam() == QType::kQ8 ? 0.0 : cmax / 127.0;  // (q8's grid is exact in integers)
  std::vector<float> row(static_cast<size_t>(cols));
  double rel_sum = 0;
  for (int64_t r = 0; r < rows; ++r) {
    spool::quant::dequantize_row(v, r, row.data());
    double bound = 0, mag = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double s = std::fabs(v.scale(r * (cols / 64) + c / 64));
      bound += std::fabs(row[c]) * a.d[c / 8] / 2 + s * dc / 2 * (std::fabs(x[c]) + a.d[c / 8] / 2);
      mag += std::fabs(double(row[c]) * x[c]);
    }
    EXPECT_LE(std::fabs(double(y[r]) - f[r]), bound + 1e-4 * mag) << "row " << r;
    rel_sum += std::fabs(double(y[r]) - f[r]) / mag;
  }
  EXPECT_LT(rel_sum / rows, GetParam() == QType::kQ8 ? 0.004 : 0.01) << "mean error relative to sum |W x|";
}

// Activation codes: round(x * 127 / amax) with halves to even, per lane of 8 columns; the lane sums.
TEST(QuantQ8, PrepareRoundsHalfToEvenPerLane) {
  std::vector<float> x(128, 0.0f);
  const float lane0[8] = {127.0f, 2.5f, 3.5f, -2.5f, -3.5f, 126.5f, 0.49f, -0.5f};
  std::copy_n(lane0, 8, x.begin());
  x[8] = -254.0f;  // lane 1: amax 254, so 1.0 -> 0.5 -> 0 and 3.0 -> 1.5 -> 2
  x[9] = 1.0f;
  x[10] = 3.0f;
  QuantQ8Acts a;
  quant_q8_prepare(x.data(), 1, 128, a);
  const int want0[8] = {127, 2, 4, -2, -4, 126, 0, 0};
  for (int c = 0; c < 8; ++c) EXPECT_EQ(c % 2 == 0 ? a.even[c / 2] : a.odd[c / 2], want0[c]) << "column " << c;
  for (int c = 0; c < 8; ++c) EXPECT_EQ(a.q[c], want0[c]) << "column " << c;
  EXPECT_EQ(a.d[0], 1.0f);
  EXPECT_EQ(a.q[8], -127);
  EXPECT_EQ(a.q[9], 0);
  EXPECT_EQ(a.q[10], 2);
  EXPECT_EQ(a.d[1], 2.0f);
  EXPECT_EQ(a.d[2], 0.0f);  // an all-zero lane
  EXPECT_EQ(a.lane_sum[0], -128 * (127 + 2 + 4 - 2 - 4 + 126));
  EXPECT_EQ(a.quad_sum[0], 127 + 2 + 4 - 2);
  EXPECT_EQ(a.quad_sum[1], -4 + 126);
}

TEST(QuantQ8, NonFiniteActivationsGiveNaN) {
  const int64_t rows = 4, cols = 512;
  const std::vector<float> W = randn(static_cast<size_t>(rows * cols), 4, 0.05f);
  const QuantizedMatrix q = spool::quant::quantize(W.data(), rows, cols, QType::kQ4, 64, nullptr);
  std::vector<float> x = randn(static_cast<size_t>(cols), 8);
  x[300] = std::numeric_limits<float>::quiet_NaN();
  QuantQ8Acts a;
  quant_q8_prepare(x.data(), 1, cols, a);
  std::vector<float> y(rows);
  quant_q8_matmul_rows(q.view(), a, y.data(), rows, 0, rows);
  for (float v : y) EXPECT_TRUE(std::isnan(v));
}

TEST(QuantQ8, RefusesWhatItCannotRun) {
  const std::vector<float> W = randn(8 * 256, 1, 0.05f);
  const QuantizedMatrix q3 = spool::quant::quantize(W.data(), 8, 256, QType::kQ3, 64, nullptr);
  const QuantizedMatrix q4 = spool::quant::quantize(W.data(), 8, 256, QType::kQ4, 64, nullptr);
  const std::vector<float> W2 = randn(8 * 192, 1, 0.05f);
  const QuantizedMatrix q4n = spool::quant::quantize(W2.data(), 8, 192, QType::kQ4, 64, nullptr);
  EXPECT_FALSE(quant_q8_supported(q3.view()));
  EXPECT_FALSE(quant_q8_supported(q4n.view()));  // 192 columns: not a multiple of 128
  EXPECT_TRUE(quant_q8_supported(q4.view()));
  const QuantizedMatrix q8 = spool::quant::quantize(W.data(), 8, 256, QType::kQ8, 64, nullptr);
  EXPECT_TRUE(quant_q8_supported(q8.view()));
  std::vector<float> other(q8_grid(), q8_grid() + 256);
  other[3] += 1e-3f;  // a q8 codebook off the grid (not what spool convert writes): the f32 kernels
  QuantView off = q8.view();
  off.codebook = other.data();
  EXPECT_FALSE(quant_q8_supported(off));
  std::vector<float> x(512, 0.5f), y(16);
  QuantQ8Acts a;
  EXPECT_THROW(quant_q8_prepare(x.data(), 1, 192, a), Error);
  quant_q8_prepare(x.data(), 1, 512, a);
  EXPECT_THROW(quant_q8_matmul_rows(q4.view(), a, y.data(), 8, 0, 8), Error);  // 512-column activations, 256-column matrix
  quant_q8_prepare(x.data(), 1, 256, a);
  EXPECT_THROW(quant_q8_matmul_rows(q3.view(), a, y.data(), 8, 0, 8), Error);
  EXPECT_THROW(quant_q8_matmul_rows(q4.view(), a, y.data(), 8, 2, 9), Error);
  QuantQ8Acts hand;  // fields filled by hand, vectors too short for T x cols
  hand.T = 2;
  hand.cols = 256;
  EXPECT_THROW(quant_q8_matmul_rows(q4.view(), hand, y.data(), 8, 0, 8), Error);
}

// matmul(), matmul_rows() and matmul_rows_pair() take the int8 kernels for a q4 view when asked
// (int8_acts) and the CPU has them, and the f32 ones otherwise.
TEST_P(QuantQ8Types, MatmulTakesTheInt8PathWhenAsked) {
  const int64_t rows = 40, cols = 1024, T = 3;
  const std::vector<float> W = randn(static_cast<size_t>(rows * cols), 12, 0.05f);
  const std::vector<int8_t> signs = spool::quant::rotation_signs(4, "layers.0.mlp.experts.1.up_proj", cols);
  const QuantizedMatrix q = spool::quant::quantize(W.data(), rows, cols, GetParam(), 64, signs.data());
  WeightView w;
  w.type = WType::kQuant;
  w.rows = rows;
  w.cols = cols;
  w.quant = q.view();
  const std::vector<float> x = randn(static_cast<size_t>(T * cols), 13);
  const std::vector<float> xr = rotate(w.quant, x, T);
  QuantQ8Acts a;
  quant_q8_prepare(xr.data(), T, cols, a);
  std::vector<float> want(static_cast<size_t>(T * rows)), f32(want.size());
  quant_q8_matmul_rows(w.quant, a, want.data(), rows, 0, rows);
  quant_matmul_rows(w.quant, xr.data(), T, f32.data(), rows, 0, rows);
  ASSERT_NE(std::memcmp(want.data(), f32.data(), want.size() * sizeof(float)), 0);
  ThreadPool pool(2);
  std::vector<float> y(want.size()), y2(want.size());
  if (!quant_q8_fast()) {  // (NEON, scalar targets) int8_acts leaves spool q4 on the f32 kernels
    matmul(w, x.data(), T, y.data(), &pool, true);
    EXPECT_EQ(std::memcmp(y.data(), f32.data(), y.size() * sizeof(float)), 0) << "matmul, int8 asked, no int8 kernels";
    return;
  }
  matmul(w, x.data(), T, y.data(), &pool, true);
  EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0) << "matmul, int8";
  matmul(w, x.data(), T, y.data(), &pool, false);
  EXPECT_EQ(std::memcmp(y.data(), f32.data(), y.size() * sizeof(float)), 0) << "matmul, f32";
  matmul_rows(w, x.data(), T, y.data(), rows, 0, rows, true);
  EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0) << "matmul_rows, int8";
  matmul_rows_pair(w, y.data(), w, y2.data(), x.data(), T, true);
  EXPECT_EQ(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)), 0) << "matmul_rows_pair a, int8";
  EXPECT_EQ(std::memcmp(y2.data(), want.data(), y.size() * sizeof(float)), 0) << "matmul_rows_pair b, int8";
}


// matmul_multi() over spool q4 / q8 matrices (one rotation per sign vector, compared by value; one
// int8 quantization per rotation) and a bf16 one in one job, and prepare_input() +
// matmul_prepared_rows() over any row split: the bits of matmul() on each matrix alone, f32 and
// int8 activations, one and three tokens, one to three threads.
TEST(QuantQ8, MultiAndPreparedRowsEqualMatmulAlone) {
  const int64_t cols = 512;
  const std::vector<int8_t> s1 = spool::quant::rotation_signs(5, "layers.0.linear_attn.in_proj_qkv", cols);
  const std::vector<int8_t> s1_copy = s1;  // the same values at another address (another tensor's signs)
  const std::vector<int8_t> s2 = spool::quant::rotation_signs(6, "layers.0.linear_attn.in_proj_z", cols);
  struct Spec {
    QType type;
    int64_t rows;
    const std::vector<int8_t>* signs;
  };
  const Spec specs[] = {{QType::kQ4, 40, &s1}, {QType::kQ8, 24, &s1_copy}, {QType::kQ4, 36, &s2}, {QType::kQ4, 8, nullptr}};
  std::vector<QuantizedMatrix> qs;
  std::vector<WeightView> ws;
  for (size_t i = 0; i < std::size(specs); ++i) {
    const std::vector<float> W = randn(static_cast<size_t>(specs[i].rows * cols), 40 + i, 0.05f);
    qs.push_back(spool::quant::quantize(W.data(), specs[i].rows, cols, specs[i].type, 64, specs[i].signs ? specs[i].signs->data() : nullptr));
  }
  for (const QuantizedMatrix& q : qs) ws.push_back(quant_weight_view(q.view()));
  const std::vector<float> bf = randn(static_cast<size_t>(16 * cols), 49, 0.05f);
  std::vector<uint16_t> bf16(bf.size());
  for (size_t i = 0; i < bf.size(); ++i) bf16[i] = f32_to_bf16(bf[i]);
  ws.push_back(WeightView{WType::kBF16, 16, cols, bf16.data()});
  ThreadPool two(2), three(3);
  for (bool int8 : {false, true})
    for (int64_t T : {1, 3})
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &two, &three}) {
        SCOPED_TRACE(std::string(int8 ? "int8" : "f32") + " T=" + std::to_string(T) + " threads=" + std::to_string(pool ? pool->size() : 1));
        const std::vector<float> x = randn(static_cast<size_t>(T * cols), 50 + T);
        std::vector<std::vector<float>> want(ws.size()), got(ws.size());
        std::vector<MatmulOut> outs;
        for (size_t i = 0; i < ws.size(); ++i) {
          want[i].assign(static_cast<size_t>(T * ws[i].rows), 0.0f);
          got[i].assign(want[i].size(), NAN);
          matmul(ws[i], x.data(), T, want[i].data(), nullptr, int8);
          outs.push_back({&ws[i], got[i].data()});
        }
        matmul_multi(outs, x.data(), T, pool, int8);
        for (size_t i = 0; i < ws.size(); ++i)
          EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)), 0) << "matmul_multi, matrix " << i;
        // Prepared once for the first matrix: serves the second (same signs by value, q8), not the third
        // (other signs), the fourth (none) or the bf16 one.
        PreparedInput p;
        prepare_input(ws[0], x.data(), T, int8, p);
        EXPECT_TRUE(prepared_for(p, ws[1], int8));
        EXPECT_FALSE(prepared_for(p, ws[2], int8));
        EXPECT_FALSE(prepared_for(p, ws[3], int8));
        EXPECT_FALSE(prepared_for(p, ws[4], int8));
        if (quant_q8_fast()) EXPECT_FALSE(prepared_for(p, ws[0], !int8)) << "another activation type";
        EXPECT_THROW(matmul_prepared_rows(ws[2], p, got[2].data(), ws[2].rows, 0, ws[2].rows, int8), Error);
        for (size_t i = 0; i < ws.size(); ++i) {
          PreparedInput own;
          prepare_input(ws[i], x.data(), T, int8, own);
          const PreparedInput& use = i == 1 ? p : own;
          std::fill(got[i].begin(), got[i].end(), NAN);
          const int64_t n = ws[i].rows, cuts[] = {0, 5, n / 2, n - 1, n};  // (rows in any split)
          for (int c = 0; c + 1 < 5; ++c) matmul_prepared_rows(ws[i], use, got[i].data(), n, cuts[c], cuts[c + 1], int8);
          EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)), 0) << "prepared rows, matrix " << i;
        }
      }
}

}  // namespace
}  // namespace spool::ops
