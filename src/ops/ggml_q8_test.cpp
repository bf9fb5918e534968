// Int8-activation kernels (ggml_q8.h): the SIMD quantization bit-identical to the scalar
// definition, the Q4_K / Q6_K kernels (AVX-512 with and without VNNI, AVX2 with and without
// AVX-VNNI, NEON with and without the dot-product extension, the scalar sums on other targets)
// against the scalar reference over ragged shapes and token counts around the tiles,
// the int8 result within the activation-rounding bound of the exact f32 product, the matmul()
// entry points taking the path only when switched on, and the errors.
#include "ops/ggml_q8.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "support/ggml_random.h"
#include "support/random.h"
#include "common/error.h"
#include "ops/cpu_backend.h"
#include "ops/matmul.h"

namespace spool::ops {
namespace {

using spool::testing::randn;
using spool::testing::random_ggml_blocks;

constexpr GgmlType kTypes[] = {GgmlType::Q4_K, GgmlType::Q6_K};

// Runs fn once with Highway's own choice (AVX3_DL, i.e. VNNI, on CPUs that have it: this file's
// kernels are built for it, the test's target list is not) and once per target of the list; on
// targets whose kernels use AVX-VNNI or the dot-product extension where the CPU has them (AVX2,
// NEON), once more without (q8_allow_dot_extension(false)).
template <class F>
void for_each_variant(F&& fn) {
  {
    SCOPED_TRACE(std::string("default dispatch: ") + q8_variant());
    fn();
  }
  spool::testing::for_each_target([&](int64_t) {
    const std::string with = q8_variant();
    {
      SCOPED_TRACE(with);
      fn();
    }
    q8_allow_dot_extension(false);
    if (q8_variant() != with) {
      SCOPED_TRACE(q8_variant());
      fn();
    }
    q8_allow_dot_extension(true);
  });
}

// The kernel family of a variant ("avx512vnni" -> "avx512", "avx2-vnni" -> "avx2", "neon-dotprod"
// -> "neon"): the variants of one family give the same bits.
std::string family(const std::string& variant) {
  if (variant.rfind("avx512", 0) == 0) return "avx512";
  return variant.substr(0, variant.find('-'));
}

// x with some structure: a few large outliers, one all-zero block (token 0, block 1 when present).
std::vector<float> activations(int64_t T, int64_t cols, uint64_t seed) {
  std::vector<float> x = randn(static_cast<size_t>(T * cols), seed);
  for (size_t i = 7; i < x.size(); i += 613) x[i] *= 40.0f;
  if (cols >= 2 * kQ8Block) {
    for (int64_t c = kQ8Block; c < 2 * kQ8Block; ++c) x[c] = 0.0f;
  }
  return x;
}

#if defined(__x86_64__)
// AVX-VNNI (VEX): CPUID.(EAX=7, ECX=1):EAX bit 4 (Intel SDM). Read directly: clang 14's
// __builtin_cpu_supports does not know "avxvnni".
bool cpu_has_avxvnni() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) != 0 && ((eax >> 4) & 1) != 0;
}
#endif

TEST(GgmlQ8, VariantUsesAvx512WhereTheCpuHasIt) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    EXPECT_TRUE(q8_fast()) << q8_variant();
    if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi2")) {
      EXPECT_STREQ(q8_variant(), "avx512vnni");
    }
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {  // the AVX2 kernels, with AVX-VNNI where present
    hwy::SetSupportedTargetsForTest(HWY_AVX2);
    EXPECT_TRUE(q8_fast());
    EXPECT_STREQ(q8_variant(), cpu_has_avxvnni() ? "avx2-vnni" : "avx2");
    q8_allow_dot_extension(false);
    EXPECT_STREQ(q8_variant(), "avx2");
    q8_allow_dot_extension(true);
    hwy::SetSupportedTargetsForTest(0);
  }
#endif
#if defined(__aarch64__)
  EXPECT_TRUE(q8_fast()) << q8_variant();
  EXPECT_EQ(std::string(q8_variant()).rfind("neon", 0), 0u) << q8_variant();
  q8_allow_dot_extension(false);
  EXPECT_STREQ(q8_variant(), "neon");
  q8_allow_dot_extension(true);
#endif
#if HWY_ARCH_X86  // (the aarch64 build compiles Highway's NEON target only: no scalar one to choose)
  hwy::SetSupportedTargetsForTest(HWY_SCALAR);
  EXPECT_FALSE(q8_fast());
  EXPECT_STREQ(q8_variant(), "scalar");
  hwy::SetSupportedTargetsForTest(0);
#endif
}

TEST(GgmlQ8, QuantizeEqualsReferenceEveryTarget) {
  for (int64_t cols : {256, 1280}) {
    const int64_t T = 5;
    const std::vector<float> x = activations(T, cols, 11 + cols);
    Q8Acts ref;
    q8_quantize_reference(x.data(), T, cols, ref);
    // the definition itself: |q| <= 127, an all-zero block has d = 0, every value within d / 2
    ASSERT_TRUE(ref.interleaved);  // T >= 2: the prefill layout
    for (int64_t i = 0; i < T * cols; ++i) {
      const int64_t blk = i / kQ8Block;  // (blocks of a token are contiguous: t * nb + b)
      const float d = ref.d[blk];
      const int q = ref.q[blk * kQ8Block + q8_pos(i % kQ8Block)];
      ASSERT_LE(std::abs(q), 127);
      ASSERT_LE(std::fabs(x[i] - d * q), 0.5f * d * (1 + 1e-6f) + 1e-30f) << i;
    }
    if (cols >= 2 * kQ8Block) {
      EXPECT_EQ(ref.d[1], 0.0f);
    }
    Q8Acts ref1;  // one token: column order, the same values
    q8_quantize_reference(x.data() + cols, 1, cols, ref1);
    ASSERT_FALSE(ref1.interleaved);
    for (int64_t c = 0; c < cols; ++c) {
      ASSERT_EQ(ref1.q[c], ref.q[cols + (c / kQ8Block) * kQ8Block + q8_pos(c % kQ8Block)]) << c;
      ASSERT_EQ(ref1.q_k4[(c / kQ8Block) * kQ8Block + q8_pos_k4(c % kQ8Block)], ref1.q[c]) << c;  // Q4_K nibble order
    }
    std::vector<int> seen(kQ8Block, 0);  // q8_pos_k4 is a permutation of a block
    for (int64_t c = 0; c < kQ8Block; ++c) ++seen[static_cast<size_t>(q8_pos_k4(c))];
    EXPECT_EQ(seen, std::vector<int>(kQ8Block, 1));
    for_each_variant([&] {
      Q8Acts a, a1;
      q8_quantize(x.data(), T, cols, a);
      EXPECT_EQ(a.q, ref.q);
      EXPECT_EQ(a.d, ref.d);
      EXPECT_EQ(a.bs, ref.bs);
      q8_quantize(x.data() + cols, 1, cols, a1);
      EXPECT_EQ(a1.q, ref1.q);
      EXPECT_EQ(a1.q_k4, ref1.q_k4);
      EXPECT_EQ(a1.d, std::vector<float>(ref.d.begin() + ref1.d.size(), ref.d.begin() + 2 * ref1.d.size()));
      EXPECT_EQ(a1.bs, std::vector<float>(ref.bs.begin() + ref.bs.size() / T, ref.bs.begin() + 2 * ref.bs.size() / T));
    });
  }
}

// One Q8Acts reused for fewer tokens, fewer columns and the other layout gives what a fresh one
// gives (its vectors stay longer than needed).
TEST(GgmlQ8, ReusedActivationsEqualFreshOnes) {
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K}) {
    const std::vector<uint8_t> m = random_ggml_blocks(t, 9, 512, 61);
    const GgmlView v{t, 9, 512, m.data(), "w"};
    Q8Acts reused;
    const std::vector<float> big = activations(67, 1280, 62);
    q8_quantize(big.data(), 67, 1280, reused);
    for (int64_t T : {1, 3, 1, 2, 1}) {
      const std::vector<float> x = activations(T, 512, 63 + T);
      Q8Acts fresh;
      q8_quantize(x.data(), T, 512, fresh);
      q8_quantize(x.data(), T, 512, reused);
      std::vector<float> y1(static_cast<size_t>(T * 9)), y2(y1.size());
      ggml_q8_matmul(v, fresh, y1.data(), nullptr);
      ggml_q8_matmul(v, reused, y2.data(), nullptr);
      EXPECT_EQ(y1, y2) << ggml_type_name(t) << " T " << T;
    }
  }
}

// NaN / inf activations make their products NaN (as in f32), on every target; a block too small
// for 127 / amax quantizes to zeros.
TEST(GgmlQ8, NonFiniteAndTinyActivations) {
  const std::vector<uint8_t> m = random_ggml_blocks(GgmlType::Q4_K, 4, 512, 71);
  const GgmlView v{GgmlType::Q4_K, 4, 512, m.data(), "w"};
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    std::vector<float> x = randn(2 * 512, 72);
    x[300] = bad;                                               // token 0, block 1
    for (int64_t c = 512; c < 768; ++c) x[c] = 1e-38f;          // token 1, block 0: 127 / amax overflows
    Q8Acts ref;
    q8_quantize_reference(x.data(), 2, 512, ref);
    EXPECT_TRUE(std::isnan(ref.d[1]));
    EXPECT_EQ(ref.d[2], 0.0f);
    for_each_variant([&] {
      Q8Acts a;
      q8_quantize(x.data(), 2, 512, a);
      EXPECT_EQ(a.q, ref.q);
      EXPECT_TRUE(std::isnan(a.d[1]));
      EXPECT_EQ(a.d[2], 0.0f);
      std::vector<float> y(8);
      ggml_q8_matmul(v, a, y.data(), nullptr);
      for (int r = 0; r < 4; ++r) {
        EXPECT_TRUE(std::isnan(y[r])) << "token 0 row " << r;
        EXPECT_TRUE(std::isfinite(y[4 + r])) << "token 1 row " << r;
      }
    });
  }
}

// Random blocks of `type` [rows, cols], activations [T, cols] and their quantization.
struct Case {
  std::vector<uint8_t> m;
  GgmlView v;
  std::vector<float> x;
  Q8Acts a;
  Case(GgmlType type, int64_t rows, int64_t cols, int64_t T, uint64_t seed)
      : m(random_ggml_blocks(type, rows, cols, seed)), v{type, rows, cols, m.data(), "w"}, x(activations(T, cols, seed + 1)) {
    q8_quantize(x.data(), T, cols, a);
  }
};

// |y - ref| <= 1e-5 * sum_c |W[r, c] x[t, c]| (the reference's own scale of the output).
void expect_close(const GgmlView& w, const std::vector<float>& x, int64_t T, const std::vector<float>& y,
                  const std::vector<float>& ref, int64_t ldy, const std::string& what) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  int bad = 0;
  for (int64_t r = 0; r < w.rows; ++r) {
    ggml_dequantize_row(w.type, w.data + r * w.row_bytes(), w.cols, row.data());
    for (int64_t t = 0; t < T; ++t) {
      double mag = 0;
      for (int64_t c = 0; c < w.cols; ++c) mag += std::fabs(double(row[c]) * x[t * w.cols + c]);
      const double e = std::fabs(double(y[t * ldy + r]) - ref[t * w.rows + r]);
      if (!(e <= 1e-5 * mag + 1e-30) && ++bad <= 5)
        ADD_FAILURE() << what << " t=" << t << " r=" << r << ": " << y[t * ldy + r] << " vs " << ref[t * w.rows + r];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(GgmlQ8, KernelsMatchReferenceEveryTarget) {
  const int64_t rows = 37;  // 9 groups of 4 and one row
  for (GgmlType type : kTypes)
    for (int64_t cols : {256, 512, 1280}) {  // 1280: a 4-block panel segment and one more
      const std::vector<uint8_t> m = random_ggml_blocks(type, rows, cols, 3 + cols);
      GgmlView v{type, rows, cols, m.data(), "w"};
      for (int64_t T : {1, 2, 3, 7, 64, 67}) {
        const std::vector<float> x = activations(T, cols, T * 100 + cols);
        Q8Acts a;
        q8_quantize(x.data(), T, cols, a);
        std::vector<float> ref(static_cast<size_t>(T * rows));
        ggml_q8_matmul_reference(v, a, ref.data());
        const std::string what = std::string(ggml_type_traits(type).name) + " cols=" + std::to_string(cols) + " T=" + std::to_string(T);
        // the variants of one kernel family give the same bits (exact integer dots, same f32 order)
        std::map<std::string, std::vector<float>> first;
        for_each_variant([&] {
          std::vector<float> y(static_cast<size_t>(T * rows), -1.0f);
          ggml_q8_matmul_rows(v, a, y.data(), rows, 0, 5);  // rows [0, 5): a group and one row, then the rest
          ggml_q8_matmul_rows(v, a, y.data(), rows, 5, rows);
          expect_close(v, x, T, y, ref, rows, what);
          if (q8_fast()) {
            std::vector<float>& f = first[family(q8_variant())];
            if (f.empty()) f = y;
            EXPECT_EQ(y, f) << what << ": " << q8_variant() << " differs from the first variant of its family";
          }
          // prefill results do not depend on how the tokens are split (T >= 2: the same
          // accumulation order per output in every tile shape), bit for bit
          if (T >= 4) {
            std::vector<float> y2(static_cast<size_t>(T * rows));
            for (const auto& [t0, t1] : {std::pair<int64_t, int64_t>{0, 2}, {2, T}}) {
              Q8Acts a2;
              q8_quantize(x.data() + t0 * cols, t1 - t0, cols, a2);
              ggml_q8_matmul_rows(v, a2, y2.data() + t0 * rows, rows, 0, rows);
            }
            EXPECT_EQ(y, y2) << what;
          }
        });
      }
    }
}

TEST(GgmlQ8, RowsRangeAndStride) {
  const int64_t rows = 40, cols = 1280, T = 3, ldy = 50;
  for (GgmlType type : kTypes) {
    const Case k(type, rows, cols, T, 17);
    const GgmlView& v = k.v;
    const Q8Acts& a = k.a;
    std::vector<float> ref(static_cast<size_t>(T * rows));
    ggml_q8_matmul_reference(v, a, ref.data());
    for_each_variant([&] {
      std::vector<float> y(static_cast<size_t>(T * ldy), -7.0f);
      ggml_q8_matmul_rows(v, a, y.data(), ldy, 13, 30);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < ldy; ++r) {
          const float got = y[t * ldy + r];
          if (r >= 13 && r < 30)
            EXPECT_NEAR(got, ref[t * rows + r], 1e-4 * (std::fabs(ref[t * rows + r]) + 1)) << t << " " << r;
          else
            EXPECT_EQ(got, -7.0f) << "wrote outside rows [13, 30): t " << t << " r " << r;
        }
    });
  }
}

// The int8 product differs from the exact one only by the activations' rounding:
// |y8 - y| <= sum_b d_b / 2 * sum_{c in b} |W[r, c]| (plus float slack).
TEST(GgmlQ8, WithinTheRoundingBoundOfTheExactProduct) {
  const int64_t rows = 24, cols = 1024, T = 4;
  for (GgmlType type : kTypes) {
    const Case k(type, rows, cols, T, 29);
    const GgmlView& v = k.v;
    const std::vector<float>& x = k.x;
    const Q8Acts& a = k.a;
    std::vector<float> exact(static_cast<size_t>(T * rows)), y(static_cast<size_t>(T * rows));
    ggml_matmul_reference(v, x.data(), T, exact.data());
    ggml_q8_matmul(v, a, y.data(), nullptr);
    std::vector<float> row(static_cast<size_t>(cols));
    double worst = 0;  // largest error as a fraction of its bound
    for (int64_t r = 0; r < rows; ++r) {
      ggml_dequantize_row(type, v.data + r * v.row_bytes(), cols, row.data());
      for (int64_t t = 0; t < T; ++t) {
        double bound = 0, mag = 0;
        for (int64_t c = 0; c < cols; ++c) {
          bound += 0.5 * a.d[t * a.blocks() + c / kQ8Block] * std::fabs(row[c]);
          mag += std::fabs(double(row[c]) * x[t * cols + c]);
        }
        const double e = std::fabs(double(y[t * rows + r]) - exact[t * rows + r]);
        EXPECT_LE(e, bound + 1e-5 * mag) << ggml_type_traits(type).name << " t " << t << " r " << r;
        worst = std::max(worst, e / bound);
      }
    }
    EXPECT_GT(worst, 0.0) << "the int8 path should not be exact";
  }
}

// matmul(), matmul_rows(), matmul_rows_pair() and matmul_multi() take the int8 kernels for
// Q4_K / Q6_K only when asked (int8_acts), with the same results as ggml_q8_matmul(); other types
// and int8_acts off keep the f32 kernels. A CpuBackend passes its CpuOptions::int8_activations.
// On every variant.
TEST(GgmlQ8, MatmulEntryPointsFollowTheSwitch) {
  const int64_t rows = 48, cols = 512;
  const std::vector<uint8_t> m4 = random_ggml_blocks(GgmlType::Q4_K, rows, cols, 41);
  const std::vector<uint8_t> m6 = random_ggml_blocks(GgmlType::Q6_K, rows, cols, 43);
  const std::vector<uint8_t> m5 = random_ggml_blocks(GgmlType::Q5_K, rows, cols, 47);
  const WeightView w4 = ggml_weight_view(GgmlType::Q4_K, rows, cols, m4.data());
  const WeightView w6 = ggml_weight_view(GgmlType::Q6_K, rows, cols, m6.data());
  const WeightView w5 = ggml_weight_view(GgmlType::Q5_K, rows, cols, m5.data());
  std::vector<int32_t> perm(static_cast<size_t>(cols));  // a Q6_K view with an input permutation
  for (int64_t c = 0; c < cols; ++c) perm[c] = static_cast<int32_t>((c * 37 + 11) % cols);
  WeightView w6p = w6;
  w6p.col_perm = perm.data();
  ThreadPool pool(2);
  for_each_variant([&] {
  for (int64_t T : {1, 3}) {  // the decode and the prefill kernels and layouts
    SCOPED_TRACE("T " + std::to_string(T));
    const std::vector<float> x = activations(T, cols, 53 + T);
    std::vector<float> xp(x.size());
    for (int64_t i = 0; i < T * cols; ++i) xp[i] = x[(i / cols) * cols + perm[i % cols]];
    auto int8_of = [&](const std::vector<uint8_t>& m, GgmlType t, const std::vector<float>& in) {
      Q8Acts a;
      q8_quantize(in.data(), T, cols, a);
      std::vector<float> y(static_cast<size_t>(T * rows));
      ggml_q8_matmul(GgmlView{t, rows, cols, m.data(), nullptr}, a, y.data(), nullptr);
      return y;
    };
    auto f32_of = [&](const WeightView& w, const std::vector<float>& in) {
      std::vector<float> y(static_cast<size_t>(T * rows));
      ggml_matmul(GgmlView{w.ggml, rows, cols, static_cast<const uint8_t*>(w.data), nullptr}, in.data(), T, y.data(), nullptr);
      return y;
    };
    const std::vector<float> i4 = int8_of(m4, GgmlType::Q4_K, x), i6 = int8_of(m6, GgmlType::Q6_K, x);
    const std::vector<float> i6p = int8_of(m6, GgmlType::Q6_K, xp);
    const std::vector<float> f4 = f32_of(w4, x), f6 = f32_of(w6, x), f5 = f32_of(w5, x), f6p = f32_of(w6, xp);
    ASSERT_NE(i4, f4);
    for (bool on : {false, true}) {
      SCOPED_TRACE(on ? "int8 on" : "int8 off");
      const bool q8 = on && q8_fast();
      std::vector<float> y4(static_cast<size_t>(T * rows)), y6(y4.size()), y5(y4.size()), y6p(y4.size());
      matmul(w4, x.data(), T, y4.data(), &pool, on);
      EXPECT_EQ(y4, q8 ? i4 : f4) << "matmul";
      matmul(w6p, x.data(), T, y6p.data(), &pool, on);
      EXPECT_EQ(y6p, q8 ? i6p : f6p) << "matmul, permuted input";
      CpuBackend be(&pool, CpuOptions{.int8_activations = on});
      std::fill(y4.begin(), y4.end(), 0.0f);
      be.matmul(w4, x.data(), T, y4.data());
      EXPECT_EQ(y4, q8 ? i4 : f4) << "CpuBackend::matmul";
      std::fill(y4.begin(), y4.end(), 0.0f);
      std::fill(y6.begin(), y6.end(), 0.0f);
      const MatmulOut both[] = {{&w4, y4.data()}, {&w6, y6.data()}};
      be.matmul_multi(both, x.data(), T);
      EXPECT_EQ(y4, q8 ? i4 : f4) << "CpuBackend::matmul_multi";
      EXPECT_EQ(y6, q8 ? i6 : f6) << "CpuBackend::matmul_multi";
      std::fill(y4.begin(), y4.end(), 0.0f);
      matmul_rows(w4, x.data(), T, y4.data(), rows, 0, rows, on);
      EXPECT_EQ(y4, q8 ? i4 : f4) << "matmul_rows";
      matmul_rows_pair(w4, y4.data(), w6, y6.data(), x.data(), T, on);
      EXPECT_EQ(y4, q8 ? i4 : f4) << "matmul_rows_pair";
      EXPECT_EQ(y6, q8 ? i6 : f6) << "matmul_rows_pair";
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        std::fill(y4.begin(), y4.end(), 0.0f);
        std::fill(y6p.begin(), y6p.end(), 0.0f);
        matmul_multi({{&w4, y4.data()}, {&w5, y5.data()}, {&w6, y6.data()}, {&w6p, y6p.data()}}, x.data(), T, p, on);
        EXPECT_EQ(y4, q8 ? i4 : f4) << "matmul_multi";
        EXPECT_EQ(y5, f5) << "matmul_multi: Q5_K has no int8 kernel";
        EXPECT_EQ(y6, q8 ? i6 : f6) << "matmul_multi";
        EXPECT_EQ(y6p, q8 ? i6p : f6p) << "matmul_multi, permuted input";
      }
    }
  }
  });  // for_each_variant: the AVX2 / NEON kernels through the same entry points
}

TEST(GgmlQ8, Errors) {
  const std::vector<uint8_t> m = random_ggml_blocks(GgmlType::Q4_K, 4, 512, 1);
  const std::vector<uint8_t> m5 = random_ggml_blocks(GgmlType::Q5_K, 4, 512, 1);
  const std::vector<float> x = randn(512, 2);
  Q8Acts a;
  EXPECT_THROW(q8_quantize(x.data(), 1, 500, a), Error);
  EXPECT_THROW(q8_quantize(x.data(), -1, 512, a), Error);
  q8_quantize(x.data(), 1, 256, a);
  std::vector<float> y(8);
  EXPECT_THROW(ggml_q8_matmul_rows(GgmlView{GgmlType::Q4_K, 4, 512, m.data(), "w"}, a, y.data(), 4, 0, 4), Error);  // cols
  q8_quantize(x.data(), 1, 512, a);
  EXPECT_THROW(ggml_q8_matmul_rows(GgmlView{GgmlType::Q5_K, 4, 512, m5.data(), "w"}, a, y.data(), 4, 0, 4), Error);
  EXPECT_THROW(ggml_q8_matmul_rows(GgmlView{GgmlType::Q4_K, 4, 512, m.data(), "w"}, a, y.data(), 4, 0, 5), Error);
  EXPECT_THROW(ggml_q8_matmul_rows(GgmlView{GgmlType::Q4_K, 4, 512, m.data(), "w"}, a, y.data(), 4, -1, 2), Error);
  Q8Acts bad = a;  // a hand-edited Q8Acts that claims more tokens than it holds
  bad.T = 3;
  EXPECT_THROW(ggml_q8_matmul_rows(GgmlView{GgmlType::Q4_K, 4, 512, m.data(), "w"}, bad, y.data(), 4, 0, 4), Error);
  for (bool kq : {false, true}) {
    EXPECT_THROW(int8_activations_from_bits(16, kq), UsageError);
    EXPECT_THROW(int8_activations_from_bits(-1, kq), UsageError);
    EXPECT_TRUE(int8_activations_from_bits(8, kq));
    EXPECT_FALSE(int8_activations_from_bits(32, kq));
  }
  // auto (0): int8 only for a model with Q4_K / Q6_K weights on a CPU with the SIMD kernels
  EXPECT_FALSE(int8_activations_from_bits(0, false));
  EXPECT_EQ(int8_activations_from_bits(0, true), q8_auto());
#if HWY_ARCH_X86
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {  // measured faster on AVX2 too
    hwy::SetSupportedTargetsForTest(HWY_AVX2);
    EXPECT_TRUE(q8_auto());
    EXPECT_TRUE(int8_activations_from_bits(0, true));
    hwy::SetSupportedTargetsForTest(0);
  }
#endif
#if defined(__aarch64__)  // NEON: not measured yet, so auto keeps f32 there; 8 runs the kernels
  EXPECT_TRUE(q8_fast());
  EXPECT_FALSE(q8_auto());
  EXPECT_FALSE(int8_activations_from_bits(0, true));
#endif
#if HWY_ARCH_X86
  hwy::SetSupportedTargetsForTest(HWY_SCALAR);
  EXPECT_FALSE(q8_auto());
  EXPECT_FALSE(int8_activations_from_bits(0, true));
  EXPECT_TRUE(int8_activations_from_bits(8, true));
  hwy::SetSupportedTargetsForTest(0);
#endif
  try {
    ggml_q8_matmul_rows(GgmlView{GgmlType::Q5_K, 4, 512, m5.data(), "blk.0.ffn_up.weight"}, a, y.data(), 4, 0, 4);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q5_K"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("blk.0.ffn_up.weight"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace spool::ops
