// ggml block kernels: the scalar dequantization against gguf-py's dequantize (blocks written by
// tests/reference/gguf_fixtures.py: quantized by the package where it can, random valid blocks
// otherwise), and the SIMD GEMV / GEMM on every compiled target against the scalar reference
// (random valid blocks, ragged shapes, token counts around the tile sizes), and the errors.
#include "ops/ggml_blocks.h"
#include "ops/ggml_iquants.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "support/random.h"
#include "common/error.h"
#include "io/gguf.h"

namespace spool::ops {
namespace {

using spool::testing::for_each_target;
using spool::testing::randn;

// The types of tests/data/gguf/blocks.gguf.
constexpr GgmlType kFileTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,  GgmlType::Q8_0,
                                   GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,  GgmlType::Q5_1,
                                   GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,  GgmlType::Q5_K,
                                   GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4};
// Every supported type (the kernel tests).
constexpr GgmlType kTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16,  GgmlType::Q8_0,
                               GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,  GgmlType::Q5_1,
                               GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K,  GgmlType::Q5_K,
                               GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4,
                               GgmlType::IQ1_S, GgmlType::IQ1_M, GgmlType::IQ2_XXS, GgmlType::IQ2_XS,
                               GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::TQ1_0,
                               GgmlType::TQ2_0};
// The i-quant / ternary types (ops/ggml_iquants), checked against tests/data/gguf/iquants.gguf.
constexpr GgmlType kIquantTypes[] = {GgmlType::IQ1_S,   GgmlType::IQ1_M,  GgmlType::IQ2_XXS,
                                     GgmlType::IQ2_XS,  GgmlType::IQ2_S,  GgmlType::IQ3_XXS,
                                     GgmlType::IQ3_S,   GgmlType::TQ1_0,  GgmlType::TQ2_0};


// Random f16 bits of magnitude 2^-10 .. 2^5, either sign.
uint16_t random_half(std::mt19937_64& g) {
  const uint32_t sign = g() & 1, exp = 5 + static_cast<uint32_t>(g() % 16), mant = g() & 0x3ff;
  return static_cast<uint16_t>(sign << 15 | exp << 10 | mant);
}

// rows x cols of type t: random bytes with sane scales (quantized types), random floats (float
// types).
std::vector<uint8_t> random_matrix(GgmlType t, int64_t rows, int64_t cols, uint64_t seed) {
  const GgmlTypeTraits tr = ggml_type_traits(t);
  std::mt19937_64 g(seed);
  std::vector<uint8_t> m(static_cast<size_t>(rows * ggml_row_bytes(t, cols)));
  if (t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16) {
    const std::vector<float> v = randn(static_cast<size_t>(rows * cols), seed);
    for (size_t i = 0; i < v.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &v[i], 4);
      if (t == GgmlType::F32) {
        std::memcpy(&m[4 * i], &u, 4);
      } else if (t == GgmlType::BF16) {
        const uint16_t h = static_cast<uint16_t>(u >> 16);
        std::memcpy(&m[2 * i], &h, 2);
      } else {
        const uint16_t h = random_half(g);
        std::memcpy(&m[2 * i], &h, 2);
      }
    }
    return m;
  }
  for (auto& b : m) b = static_cast<uint8_t>(g());
  const int64_t nb = static_cast<int64_t>(m.size()) / tr.size;
  for (int64_t b = 0; b < nb; ++b) {
    uint8_t* p = m.data() + b * tr.size;
    for (int off : ggml_half_fields(t)) {
      const uint16_t h = random_half(g);
      std::memcpy(p + off, &h, 2);
    }
    if (t == GgmlType::MXFP4) p[0] = static_cast<uint8_t>(115 + g() % 20);  // 2^-13 .. 2^6
    if (t == GgmlType::IQ1_M) iq1m_set_d(p, random_half(g));
  }
  return m;
}

// |y - ref| <= 1e-5 * |W_r| |x_t| + 1e-30 for every output (the Cauchy-Schwarz bound of the
// output's magnitude).
void expect_close(const GgmlView& w, const std::vector<float>& x, int64_t T, const std::vector<float>& y,
                  const std::vector<float>& ref, const std::string& what) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  int bad = 0;
  for (int64_t r = 0; r < w.rows; ++r) {
    ggml_dequantize_row(w.type, w.data + r * w.row_bytes(), w.cols, row.data());
    double wn = 0;
    for (float v : row) wn += double(v) * v;
    for (int64_t t = 0; t < T; ++t) {
      double xn = 0;
      for (int64_t c = 0; c < w.cols; ++c) xn += double(x[t * w.cols + c]) * x[t * w.cols + c];
      const double tol = 1e-5 * std::sqrt(wn * xn) + 1e-30;
      const double e = std::fabs(double(y[t * w.rows + r]) - ref[t * w.rows + r]);
      if (!(e <= tol) && ++bad <= 5)
        ADD_FAILURE() << what << " t=" << t << " r=" << r << ": " << y[t * w.rows + r] << " vs " << ref[t * w.rows + r]
                      << " (tol " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

io::GgufFile blocks_file() { return io::GgufFile::open(std::string(SPOOL_TEST_DATA_DIR) + "/gguf/blocks.gguf"); }

TEST(GgmlBlocks, DequantizeMatchesGgufPackageBitForBit) {
  const io::GgufFile f = blocks_file();
  for (GgmlType t : kFileTypes) {
    const std::string name = ggml_type_name(t);
    const io::GgufTensor* w = f.find("w." + name);
    const io::GgufTensor* r = f.find("ref." + name);
    ASSERT_TRUE(w != nullptr && r != nullptr) << name;
    ASSERT_EQ(w->type, t);
    std::vector<float> got(static_cast<size_t>(w->numel()));
    for (int64_t row = 0; row < w->rows(); ++row)
      ggml_dequantize_row(t, f.data(*w) + row * w->row_bytes(), w->ne[0], got.data() + row * w->ne[0]);
    const float* ref = reinterpret_cast<const float*>(f.data(*r));
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const bool same = std::memcmp(&got[i], &ref[i], 4) == 0 || (std::isnan(got[i]) && std::isnan(ref[i]));
      if (!same && ++bad <= 3) ADD_FAILURE() << name << " element " << i << ": " << got[i] << " vs gguf " << ref[i];
    }
    EXPECT_EQ(bad, 0) << name;
  }
}

// tests/reference/gguf_iquant_fixtures.py: 96 random valid blocks of each i-quant / ternary type
// (random grid / sign indices and sub-block scales, an all-0xFF and an all-zero block, finite
// random f16 d) and gguf-py's dequantize.
TEST(GgmlBlocks, IquantsDequantizeMatchesGgufPackageBitForBit) {
  const io::GgufFile f = io::GgufFile::open(std::string(SPOOL_TEST_DATA_DIR) + "/gguf/iquants.gguf");
  for (GgmlType t : kIquantTypes) {
    const std::string name = ggml_type_name(t);
    const io::GgufTensor* w = f.find("w." + name);
    const io::GgufTensor* r = f.find("ref." + name);
    ASSERT_TRUE(w != nullptr && r != nullptr) << name;
    ASSERT_EQ(w->type, t);
    ASSERT_EQ(r->numel(), w->numel());
    ASSERT_TRUE(ggml_supported(t)) << name;
    std::vector<float> got(static_cast<size_t>(w->numel()));
    for (int64_t row = 0; row < w->rows(); ++row)
      ggml_dequantize_row(t, f.data(*w) + row * w->row_bytes(), w->ne[0], got.data() + row * w->ne[0]);
    const float* ref = reinterpret_cast<const float*>(f.data(*r));
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (std::memcmp(&got[i], &ref[i], 4) != 0 && ++bad <= 3)
        ADD_FAILURE() << name << " element " << i << ": " << got[i] << " vs gguf " << ref[i];
    EXPECT_EQ(bad, 0) << name;
    // The matmul kernels on the package's blocks, every target, against the scalar reference.
    ThreadPool pool(2);
    const GgmlView v{t, w->rows(), w->ne[0], f.data(*w), w->name.c_str()};
    for (int64_t T : {1, 5}) {
      const std::vector<float> x = randn(static_cast<size_t>(T * v.cols), 13 + T);
      std::vector<float> yref(static_cast<size_t>(T * v.rows));
      ggml_matmul_reference(v, x.data(), T, yref.data());
      for_each_target([&](int64_t target) {
        std::vector<float> y(yref.size(), NAN);
        ggml_matmul(v, x.data(), T, y.data(), &pool);
        expect_close(v, x, T, y, yref, std::string(hwy::TargetName(target)) + " " + name);
      });
    }
  }
}

TEST(GgmlBlocks, KernelsOnGgufPackageBlocksEveryTarget) {
  const io::GgufFile f = blocks_file();
  ThreadPool pool(2);
  for (GgmlType t : kFileTypes) {
    const io::GgufTensor* w = f.find(std::string("w.") + ggml_type_name(t));
    ASSERT_NE(w, nullptr);
    const GgmlView v{t, w->rows(), w->ne[0], f.data(*w), w->name.c_str()};
    for (int64_t T : {1, 9}) {
      const std::vector<float> x = randn(static_cast<size_t>(T * v.cols), 3 + T);
      std::vector<float> ref(static_cast<size_t>(T * v.rows));
      ggml_matmul_reference(v, x.data(), T, ref.data());
      for_each_target([&](int64_t target) {
        std::vector<float> y(ref.size(), NAN);
        ggml_matmul(v, x.data(), T, y.data(), &pool);
        expect_close(v, x, T, y, ref, std::string(hwy::TargetName(target)) + " " + ggml_type_name(t));
      });
    }
  }
}

TEST(GgmlBlocks, KernelsMatchReferenceEveryTarget) {
  ThreadPool pool(2);
  int checked = 0;
  for (GgmlType t : kTypes) {
    const int64_t blck = ggml_type_traits(t).blck;
    std::vector<std::pair<int64_t, int64_t>> shapes;  // rows, cols
    if (blck == 1) {
      shapes = {{5, 7}, {3, 16}, {9, 33}, {17, 100}, {6, 256}, {4, 1031}};
    } else if (blck == 32) {
      shapes = {{5, 32}, {3, 96}, {9, 160}, {17, 512}, {6, 2048}};
    } else {
      shapes = {{5, 256}, {3, 512}, {9, 768}, {6, 2048}};
    }
    for (const auto& shape : shapes) {
      const int64_t rows = shape.first, cols = shape.second;  // (not a structured binding: clang 14 cannot capture one)
      const std::vector<uint8_t> m = random_matrix(t, rows, cols, 17 * rows + cols);
      const GgmlView v{t, rows, cols, m.data(), "w"};
      for (int64_t T : {1, 2, 3, 4, 5, 8, 9, 13, 70}) {
        const std::vector<float> x = randn(static_cast<size_t>(T * cols), 7 * T + cols);
        std::vector<float> ref(static_cast<size_t>(T * rows));
        ggml_matmul_reference(v, x.data(), T, ref.data());
        for_each_target([&](int64_t target) {
          ASSERT_STREQ(ggml_kernel_target(), hwy::TargetName(target));
          for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
            std::vector<float> y(ref.size(), NAN);
            ggml_matmul(v, x.data(), T, y.data(), p);
            expect_close(v, x, T, y, ref,
                         std::string(hwy::TargetName(target)) + " " + ggml_type_name(t) + " [" + std::to_string(rows) +
                             "x" + std::to_string(cols) + "] T" + std::to_string(T) + (p ? " pool" : ""));
            ++checked;
          }
        });
      }
    }
  }
  std::printf("checked %d kernel configurations\n", checked);
}

// The prefill tiles (ggml_blocks.cpp TypedRows: quantized rows of more than 512 columns through
// the f32 panel, 4 rows x 2 tokens, leftover rows one by one, 1024-column panel segments (1280
// columns: a full and a partial one); shorter rows and float types 16 rows x 8 (AVX-512) or 4
// tokens, token remainders of 4 / 2 / 1; token tiles of 64 (T = 77)) at ragged row ranges and
// token counts: against the reference, and bit for bit against one token at a time (every tile
// shape accumulates an output in the same order).
TEST(GgmlBlocks, PrefillTilesMatchReferenceEveryTarget) {
  for (GgmlType t : kTypes) {
    const int64_t blck = ggml_type_traits(t).blck, rows = 37;
    for (int64_t cols : {blck == 1 ? 523 : blck == 32 ? 480 : 512, blck == 1 ? 1031 : 1280}) {
      const std::vector<uint8_t> m = random_matrix(t, rows, cols, 91 + cols);
      const GgmlView v{t, rows, cols, m.data(), "w"};
      for (int64_t T : {2, 3, 7, 8, 15, 77}) {
        const std::vector<float> x = randn(static_cast<size_t>(T * cols), 11 * T);
        std::vector<float> ref(static_cast<size_t>(T * rows));
        ggml_matmul_reference(v, x.data(), T, ref.data());
        for_each_target([&](int64_t target) {
          const std::string what = std::string(hwy::TargetName(target)) + " " + ggml_type_name(t) + " [37x" +
                                   std::to_string(cols) + "] T" + std::to_string(T);
          std::vector<float> y(ref.size(), NAN), y1(ref.size(), NAN);
          ggml_matmul_rows(v, x.data(), T, y.data(), rows, 0, 3);  // rows [0, 3), then [3, 37): full tiles + rest
          ggml_matmul_rows(v, x.data(), T, y.data(), rows, 3, rows);
          expect_close(v, x, T, y, ref, what);
          for (int64_t tk = 0; tk < T; ++tk)
            ggml_matmul_rows(v, x.data() + tk * cols, 1, y1.data() + tk * rows, rows, 0, rows);
          int differ = 0;
          for (size_t i = 0; i < y.size(); ++i) differ += std::memcmp(&y[i], &y1[i], 4) != 0;
          EXPECT_EQ(differ, 0) << what << ": outputs differ from one token at a time";
        });
      }
    }
  }
}

// Unit inputs read the weights back: token t = column t's one-hot vector gives y[t, r] =
// W[r, t] exactly (every other product is a zero), which must be ggml_dequantize_row's value bit
// for bit: the kernels form each weight as the scalar dequantizer does (tables built with its
// expression, or a scale times a small integer code; where a kernel fuses d * q + m into one FMA
// the product is exact, an f16 scale times small integers, so the rounding is the same).
TEST(GgmlBlocks, UnitInputsGiveTheDequantizedWeightsEveryTarget) {
  for (GgmlType t : kTypes) {
    const int64_t blck = ggml_type_traits(t).blck;
    const int64_t rows = 21, cols = blck == 1 ? 523 : 768, T = cols;  // > 512 columns: the prefill panel too
    const std::vector<uint8_t> m = random_matrix(t, rows, cols, 23);
    const GgmlView v{t, rows, cols, m.data(), "w"};
    std::vector<float> w(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) ggml_dequantize_row(t, m.data() + r * v.row_bytes(), cols, w.data() + r * cols);
    std::vector<float> x(static_cast<size_t>(T * cols), 0.0f);
    for (int64_t k = 0; k < T; ++k) x[k * cols + k] = 1.0f;
    for_each_target([&](int64_t target) {
      const std::string name = hwy::TargetName(target);
      // The decode kernel (one token per call), then prefill calls of 7 and 13 tokens (tiles of 8,
      // 4, 2 and 1 tokens) and of all of them.
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{13}, T}) {
        std::vector<float> y(static_cast<size_t>(T * rows), NAN);
        for (int64_t k = 0; k < T; k += n)
          ggml_matmul_rows(v, x.data() + k * cols, std::min(n, T - k), y.data() + k * rows, rows, 0, rows);
        int bad = 0;
        for (int64_t k = 0; k < T; ++k)
          for (int64_t r = 0; r < rows; ++r)
            if (!(y[k * rows + r] == w[r * cols + k]) && ++bad <= 3)
              ADD_FAILURE() << name << " " << ggml_type_name(t) << " n=" << n << " r=" << r << " c=" << k << ": "
                            << y[k * rows + r] << " vs dequantized " << w[r * cols + k];
        EXPECT_EQ(bad, 0) << name << " " << ggml_type_name(t) << " n=" << n;
      }
    });
  }
}

// A row range [13, 30) written at output stride 50 (rows 45): exactly those outputs, equal to the
// whole matrix's, and nothing else touched; 512 columns (the short-row prefill tiles) and 1280
// (the panel).
TEST(GgmlBlocks, RowsRangeAndStride) {
  const int64_t rows = 45, T = 10, ldy = 50;
  for (int64_t cols : {512, 1280}) {
    for (GgmlType t : kTypes) {
      const std::vector<uint8_t> m = random_matrix(t, rows, cols, 5);
      const GgmlView v{t, rows, cols, m.data(), nullptr};
      const std::vector<float> x = randn(static_cast<size_t>(T * cols), 4);
      std::vector<float> full(static_cast<size_t>(T * rows)), y(static_cast<size_t>(T * ldy), -7.0f);
      ggml_matmul(v, x.data(), T, full.data(), nullptr);
      ggml_matmul_rows(v, x.data(), T, y.data(), ldy, 13, 30);
      for (int64_t tk = 0; tk < T; ++tk)
        for (int64_t r = 0; r < ldy; ++r) {
          if (r >= 13 && r < 30) {
            EXPECT_EQ(y[tk * ldy + r], full[tk * rows + r]) << ggml_type_name(t) << " " << cols << " " << r;
          } else {
            EXPECT_EQ(y[tk * ldy + r], -7.0f) << ggml_type_name(t) << " " << cols << " " << r;
          }
        }
    }
  }
}

TEST(GgmlBlocks, Errors) {
  std::vector<uint8_t> buf(1 << 16, 0);
  std::vector<float> x(4096, 1.0f), y(4096);
  for (GgmlType t : {GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::Q1_0, GgmlType::Q2_0, GgmlType::NVFP4, GgmlType::I32,
                     static_cast<GgmlType>(77)}) {
    const GgmlView v{t, 2, 256, buf.data(), "blk.3.ffn_down_exps.weight"};
    EXPECT_FALSE(ggml_supported(t));
    try {
      ggml_matmul(v, x.data(), 1, y.data(), nullptr);
      ADD_FAILURE() << "no error for type " << static_cast<unsigned>(t);
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("blk.3.ffn_down_exps.weight"), std::string::npos) << msg;
      EXPECT_NE(msg.find(ggml_type_name(t)), std::string::npos) << msg;
    }
    EXPECT_THROW(ggml_dequantize_row(t, buf.data(), 256, y.data()), Error);
  }
  const GgmlView ok{GgmlType::Q4_K, 4, 512, buf.data(), "w"};
  EXPECT_NO_THROW(ggml_matmul(ok, x.data(), 1, y.data(), nullptr));
  GgmlView bad = ok;
  bad.cols = 300;  // not a multiple of 256
  EXPECT_THROW(ggml_matmul(bad, x.data(), 1, y.data(), nullptr), Error);
  bad = ok;
  bad.data = nullptr;
  EXPECT_THROW(ggml_matmul(bad, x.data(), 1, y.data(), nullptr), Error);
  EXPECT_THROW(ggml_matmul_rows(ok, x.data(), 1, y.data(), 4, 0, 5), Error);
  EXPECT_THROW(ggml_matmul_rows(ok, x.data(), 1, y.data(), 4, -1, 2), Error);
  EXPECT_THROW(ggml_dequantize_row(GgmlType::Q4_0, buf.data(), 48, y.data()), Error);
}

}  // namespace
}  // namespace spool::ops
