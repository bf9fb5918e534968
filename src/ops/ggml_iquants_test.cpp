// The i-quant / ternary decoders without test files (so that they run in the kernel-only builds,
// aarch64 under qemu included; ggml_blocks_test checks the scalar decoders against gguf-py's
// dequantize): the SIMD row decoders bit for bit against the scalar ones on every compiled target,
// the matmul against its scalar reference, hand-built blocks against values worked out from the
// format (ggml-common.h layouts), the IQ1_M split scale, and any bit pattern decoding (also run
// under ASan + UBSan: label "sanitize").
#include "ops/ggml_iquants.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "ops/ggml_blocks.h"
#include "ops/thread_pool.h"
#include "ops/weights.h"
#include "support/ggml_random.h"
#include "support/random.h"

namespace spool::ops {
namespace {

using spool::testing::for_each_target;
using spool::testing::random_ggml_blocks;
using spool::testing::randn;

constexpr GgmlType kTypes[] = {GgmlType::IQ1_S, GgmlType::IQ1_M, GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S,
                               GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::TQ1_0, GgmlType::TQ2_0};

TEST(GgmlIquants, SimdRowDecodeEqualsScalarEveryTarget) {
  for (GgmlType t : kTypes) {
    const int64_t nb = 37;
    const std::vector<uint8_t> m = random_ggml_blocks(t, 1, nb * 256, 3 + static_cast<uint64_t>(t));
    std::vector<float> want(static_cast<size_t>(nb * 256));
    for (int64_t b = 0; b < nb; ++b) iquant_dequantize_block(t, m.data() + b * ggml_type_traits(t).size, want.data() + b * 256);
    for_each_target([&](int64_t target) {
      std::vector<float> got(want.size(), NAN);
      iquant_decode_row(t, m.data(), nb, got.data());
      int bad = 0;
      for (size_t i = 0; i < got.size(); ++i)
        if (std::memcmp(&got[i], &want[i], 4) != 0 && ++bad <= 3)
          ADD_FAILURE() << hwy::TargetName(target) << " " << ggml_type_name(t) << " element " << i << ": " << got[i] << " vs "
                        << want[i];
      EXPECT_EQ(bad, 0) << hwy::TargetName(target) << " " << ggml_type_name(t);
    });
  }
}

TEST(GgmlIquants, MatmulMatchesReferenceEveryTarget) {
  ThreadPool pool(2);
  for (GgmlType t : kTypes)
    for (int64_t T : {1, 3, 9}) {
      const int64_t rows = 19, cols = 768;
      const std::vector<uint8_t> m = random_ggml_blocks(t, rows, cols, 11 + T);
      const GgmlView v{t, rows, cols, m.data(), "w"};
      const std::vector<float> x = randn(static_cast<size_t>(T * cols), 5 + T);
      std::vector<float> ref(static_cast<size_t>(T * rows));
      ggml_matmul_reference(v, x.data(), T, ref.data());
      for_each_target([&](int64_t target) {
        std::vector<float> y(ref.size(), NAN);
        ggml_matmul(v, x.data(), T, y.data(), &pool);
        for (int64_t r = 0; r < rows; ++r) {
          std::vector<float> w(static_cast<size_t>(cols));
          ggml_dequantize_row(t, m.data() + r * v.row_bytes(), cols, w.data());
          double wn = 0;
          for (float a : w) wn += double(a) * a;
          for (int64_t k = 0; k < T; ++k) {
            double xn = 0;
            for (int64_t c = 0; c < cols; ++c) xn += double(x[k * cols + c]) * x[k * cols + c];
            EXPECT_NEAR(y[k * rows + r], ref[k * rows + r], 1e-5 * std::sqrt(wn * xn) + 1e-30)
                << hwy::TargetName(target) << " " << ggml_type_name(t) << " T=" << T << " r=" << r << " t=" << k;
          }
        }
      });
    }
}

// Blocks built by hand, decoded values worked out from the layouts (d = 1 or 2).
TEST(GgmlIquants, HandBuiltBlocks) {
  const uint16_t one = 0x3C00, two = 0x4000;
  std::vector<float> y(256);
  {  // TQ2_0: byte 0b11'10'01'00 at qs[0] -> elements 0, 32, 64, 96 = codes 0, 1, 2, 3 -> -1, 0, 1, 2 (x d = 2)
    std::vector<uint8_t> b(66, 0x55);  // code 1 everywhere: 0
    b[0] = 0xE4;
    std::memcpy(b.data() + 64, &two, 2);
    ggml_dequantize_row(GgmlType::TQ2_0, b.data(), 256, y.data());
    EXPECT_EQ(y[0], -2.0f);
    EXPECT_EQ(y[32], 0.0f);
    EXPECT_EQ(y[64], 2.0f);
    EXPECT_EQ(y[96], 4.0f);
    EXPECT_EQ(y[1], 0.0f);
  }
  {  // TQ1_0: qs[0] = 0 -> digits 0 (-1); 243 * (2*81 + 1*27 + 0*9 + 2*3 + 1) / 243 rounded up: base-3 digits 2,1,0,2,1
    std::vector<uint8_t> b(54, 0);
    const int v = 2 * 81 + 1 * 27 + 0 * 9 + 2 * 3 + 1;  // digits, most significant first
    b[1] = static_cast<uint8_t>((v * 256 + 242) / 243);
    std::memcpy(b.data() + 52, &one, 2);
    ggml_dequantize_row(GgmlType::TQ1_0, b.data(), 256, y.data());
    EXPECT_EQ(y[0], -1.0f);
    const float want[5] = {1, 0, -1, 1, 0};  // digit - 1 of 2, 1, 0, 2, 1
    for (int n = 0; n < 5; ++n) EXPECT_EQ(y[n * 32 + 1], want[n]) << n;
  }
  {  // IQ2_XXS: grid index 0 (all 8), scale 3, no signs: d * 3.5 * 0.25 * 8 = 7 (d = 1); ksigns[1] = 0x81: elements 0, 7 negative
    std::vector<uint8_t> b(66, 0);
    std::memcpy(b.data(), &one, 2);
    const uint32_t aux = 3u << 28 | 1u;  // group 0: sign index 1
    std::memcpy(b.data() + 2 + 4, &aux, 4);
    ggml_dequantize_row(GgmlType::IQ2_XXS, b.data(), 256, y.data());
    EXPECT_EQ(y[0], -7.0f);
    EXPECT_EQ(y[1], 7.0f);
    EXPECT_EQ(y[7], -7.0f);
    EXPECT_EQ(y[8], 7.0f);
    EXPECT_EQ(y[32], 0.5f * 0.25f * 8.0f);  // sub-block 1: scale 0
  }
  {  // IQ1_S: grid index 0, scale 0 (dl = d), delta +0.125 -> d * (g + 0.125); IQ1_M the same with its split d
    std::vector<uint8_t> b(50, 0);
    std::memcpy(b.data(), &two, 2);
    ggml_dequantize_row(GgmlType::IQ1_S, b.data(), 256, y.data());
    std::vector<float> g(8);
    for (int j = 0; j < 8; ++j) g[j] = y[j] / 2.0f - 0.125f;  // the grid row 0
    for (int j = 0; j < 8; ++j) EXPECT_TRUE(g[j] == -1.0f || g[j] == 0.0f || g[j] == 1.0f) << g[j];
    std::vector<uint8_t> m(56, 0);
    iq1m_set_d(m.data(), two);
    EXPECT_EQ(iq1m_get_d(m.data()), two);
    std::vector<float> ym(256);
    ggml_dequantize_row(GgmlType::IQ1_M, m.data(), 256, ym.data());
    for (int j = 0; j < 256; ++j) EXPECT_EQ(ym[j], y[j % 8]) << j;  // index 0, scale 0, delta + everywhere
  }
}

TEST(GgmlIquants, Iq1mScaleKeepsSubScales) {
  std::vector<uint8_t> b(56);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(37 * i + 11);
  const std::vector<uint8_t> before = b;
  iq1m_set_d(b.data(), 0xABCD);
  EXPECT_EQ(iq1m_get_d(b.data()), 0xABCD);
  for (int w = 0; w < 4; ++w) {
    uint16_t a, c;
    std::memcpy(&a, before.data() + 48 + 2 * w, 2);
    std::memcpy(&c, b.data() + 48 + 2 * w, 2);
    EXPECT_EQ(a & 0x0FFF, c & 0x0FFF) << w;
  }
  EXPECT_EQ(0, std::memcmp(b.data(), before.data(), 48));
}

// Every bit pattern is a valid block of these types (the grid and sign indices are as wide as
// their tables): blocks of constant bytes and random bytes, each with a finite d, decode (scalar
// and SIMD) to finite values. In the sanitizer step (label "sanitize") an index past its table
// is a global-buffer-overflow.
TEST(GgmlIquants, AnyBitPatternDecodes) {
  std::mt19937_64 g(5);
  for (GgmlType t : kTypes) {
    const size_t bs = ggml_type_traits(t).size;
    for (int fill = 0; fill < 257; ++fill) {  // 0x00 .. 0xFF, then random bytes
      std::vector<uint8_t> b(bs);
      for (auto& v : b) v = static_cast<uint8_t>(fill < 256 ? fill : g());
      const uint16_t one = 0x3C00;  // 1.0
      if (t == GgmlType::IQ1_M) {
        iq1m_set_d(b.data(), one);
      } else {
        for (int off : ggml_half_fields(t)) std::memcpy(b.data() + off, &one, 2);
      }
      std::vector<float> y(256, NAN), z(256, NAN);
      iquant_dequantize_block(t, b.data(), y.data());
      iquant_decode_row(t, b.data(), 1, z.data());
      for (int i = 0; i < 256; ++i) {
        ASSERT_TRUE(std::isfinite(y[i])) << ggml_type_name(t) << " fill " << fill << " element " << i;
        ASSERT_EQ(y[i], z[i]) << ggml_type_name(t) << " fill " << fill << " element " << i;
      }
    }
  }
}

TEST(GgmlIquants, OtherTypesAreAnError) {
  std::vector<uint8_t> b(512, 0);
  std::vector<float> y(256);
  EXPECT_FALSE(iquant_type(GgmlType::Q4_K));
  EXPECT_TRUE(iquant_type(GgmlType::TQ1_0));
  EXPECT_THROW(iquant_dequantize_block(GgmlType::Q4_K, b.data(), y.data()), Error);
  EXPECT_THROW(iquant_dequantize_block(GgmlType::Q8_K, b.data(), y.data()), Error);
}

}  // namespace
}  // namespace spool::ops
