// The LoRA products (ops/lora.h) on every kind of base weight: ops::matmul (one thread and a
// pool), matmul_multi, matmul_reference and CpuBackend::expert_ffn add sum_i s_i B_i (A_i x) to
// W x for f32, bf16 and spool-quantized (rotated q4) weights, against the same product without
// the terms plus the low-rank terms summed in double here; and with per-row adapter scales
// (ops::LoraRowScales: continuous batching of requests with different adapters).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "ops/cpu_backend.h"
#include "ops/lora.h"
#include "ops/matmul.h"
#include "ops/reference_backend.h"
#include "quant/quantize.h"

namespace spool::ops {
namespace {

std::vector<float> randn(size_t n, float sd, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// Two adapters' terms on a [rows, cols] matrix: ranks 4 and 2, scales 2 and -0.5.
struct Terms {
  std::vector<float> a1, b1, a2, b2, bt1, bt2;  // B [rows, r] and its transpose [r, rows] (LoraTerm::bt)
  LoraDelta d;
  Terms(int64_t rows, int64_t cols, uint32_t seed)
      : a1(randn(4 * cols, 0.2f, seed)), b1(randn(rows * 4, 0.2f, seed + 1)), a2(randn(2 * cols, 0.2f, seed + 2)),
        b2(randn(rows * 2, 0.2f, seed + 3)), bt1(transpose(b1, rows, 4)), bt2(transpose(b2, rows, 2)) {
    d.terms = {{a1.data(), bt1.data(), 4, 2.0f}, {a2.data(), bt2.data(), 2, -0.5f}};
  }
  static std::vector<float> transpose(const std::vector<float>& b, int64_t rows, int64_t r) {
    std::vector<float> t(b.size());
    for (int64_t o = 0; o < rows; ++o)
      for (int64_t k = 0; k < r; ++k) t[k * rows + o] = b[o * r + k];
    return t;
  }
  // y[t, r] += the terms, in double; with `user` [T, 2], term i (adapter i) times user[t, i].
  void add(const float* x, int64_t T, int64_t rows, int64_t cols, float* y, const float* user = nullptr) const {
    for (size_t ti = 0; ti < d.terms.size(); ++ti) {
      const LoraTerm& t = d.terms[ti];
      for (int64_t i = 0; i < T; ++i)
        for (int64_t r = 0; r < rows; ++r) {
          double s = 0;
          for (int64_t k = 0; k < t.rank; ++k) {
            double u = 0;
            for (int64_t c = 0; c < cols; ++c) u += static_cast<double>(t.a[k * cols + c]) * x[i * cols + c];
            s += static_cast<double>((t.rank == 4 ? b1 : b2)[r * t.rank + k]) * u;
          }
          y[i * rows + r] += static_cast<float>(t.scale * (user != nullptr ? user[i * 2 + ti] : 1.0f) * s);
        }
    }
  }
  // The two terms as two adapters: term i is adapter i (its column of LoraRowScales).
  void as_two_adapters() {
    d.terms[0].adapter = 0;
    d.terms[1].adapter = 1;
  }
};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double mr = 0, md = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    mr = std::max(mr, std::fabs(static_cast<double>(want[i])));
    md = std::max(md, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
  EXPECT_LE(md, 2e-5 * mr) << what << ": max |diff| " << md << ", max |want| " << mr;
}

// The weight kinds: f32, bf16 and q4 with a Hadamard rotation, of one f32 matrix.
struct Weights {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  quant::QuantizedMatrix q4;
  std::vector<int8_t> signs;
  std::vector<WeightView> views;
  Weights(int64_t rows, int64_t cols, uint32_t seed) : f32(randn(rows * cols, 0.1f, seed)) {
    for (float v : f32) bf16.push_back(f32_to_bf16(v));
    for (int64_t c = 0; c < cols; ++c) signs.push_back(c % 3 == 0 ? -1 : 1);
    q4 = quant::quantize(f32.data(), rows, cols, QType::kQ4, 32, signs.data());
    WeightView f{WType::kF32, rows, cols, f32.data()};
    WeightView b{WType::kBF16, rows, cols, bf16.data()};
    views = {f, b, quant_weight_view(q4.view())};
  }
};

TEST(LoraOps, MatmulAddsTheTermsOnEveryWeightType) {
  const int64_t rows = 48, cols = 64;
  Weights w(rows, cols, 1);
  Terms terms(rows, cols, 10);
  ThreadPool pool(3);
  for (const WeightView& base : w.views)
    for (int64_t T : {1, 5}) {
      const std::vector<float> x = randn(T * cols, 1.0f, 20 + static_cast<uint32_t>(T));
      std::vector<float> want(T * rows);
      matmul(base, x.data(), T, want.data(), nullptr);  // W x alone
      terms.add(x.data(), T, rows, cols, want.data());
      WeightView with = base;
      with.lora = &terms.d;
      std::vector<float> one(T * rows), many(T * rows), multi(T * rows), plain(T * rows), ref(T * rows);
      matmul(with, x.data(), T, one.data(), nullptr);
      matmul(with, x.data(), T, many.data(), &pool);
      const MatmulOut outs[] = {{&with, multi.data()}, {&base, plain.data()}};
      matmul_multi(outs, x.data(), T, &pool);
      matmul_reference(with, x.data(), T, ref.data());
      expect_close(one, want, "matmul");
      expect_close(many, want, "matmul on a pool");
      expect_close(multi, want, "matmul_multi");
      expect_close(ref, want, "matmul_reference");
      std::vector<float> alone(T * rows);
      matmul(base, x.data(), T, alone.data(), nullptr);
      EXPECT_EQ(plain, alone) << "matmul_multi: a matrix without terms beside one with them";
    }
}

// An expert path whose gate, up and down carry terms: CpuBackend (one thread, and a pool wider
// than the expert count, which otherwise splits experts across threads by rows) against
// ReferenceBackend (matmul_reference per token, terms included).
TEST(LoraOps, ExpertFfnAddsTheTermsOfEachProjection) {
  const int64_t H = 64, I = 32;
  const int E = 3, K = 2;
  const int64_t T = 4;
  std::vector<Weights> gate, up, down;
  std::vector<Terms> tg, tu, td;
  for (int e = 0; e < E; ++e) {
    gate.emplace_back(I, H, 100 + e);
    up.emplace_back(I, H, 200 + e);
    down.emplace_back(H, I, 300 + e);
  }
  for (int e = 0; e < E; ++e) {
    tg.emplace_back(I, H, 400 + e);
    tu.emplace_back(I, H, 500 + e);
    td.emplace_back(H, I, 600 + e);
  }
  const std::vector<int> ids = {0, 1, 2, 0, 1, 2, 2, 1};  // [T, K]
  const ExpertGroups groups = group_by_expert(ids.data(), T, K, E);
  const std::vector<float> x = randn(T * H, 1.0f, 7);
  ThreadPool pool(8);
  for (size_t kind = 0; kind < 3; ++kind) {
    std::vector<ExpertMats> with(E), without(E);
    for (int e = 0; e < E; ++e) {
      without[e] = {gate[e].views[kind], up[e].views[kind], down[e].views[kind]};
      with[e] = without[e];
      with[e].gate.lora = &tg[e].d;
      with[e].up.lora = &tu[e].d;
      with[e].down.lora = &td[e].d;
    }
    std::vector<float> ref(T * K * H), one(T * K * H), many(T * K * H), plain(T * K * H);
    ReferenceBackend().expert_ffn(with, groups, 0, x.data(), H, Activation::kSwiGLU, ref.data());
    CpuBackend(nullptr).expert_ffn(with, groups, 0, x.data(), H, Activation::kSwiGLU, one.data());
    CpuBackend(&pool).expert_ffn(with, groups, 0, x.data(), H, Activation::kSwiGLU, many.data());
    CpuBackend(nullptr).expert_ffn(without, groups, 0, x.data(), H, Activation::kSwiGLU, plain.data());
    expect_close(one, ref, "expert_ffn");
    expect_close(many, ref, "expert_ffn on a pool");
    double moved = 0;
    for (size_t i = 0; i < ref.size(); ++i) moved = std::max(moved, std::fabs(static_cast<double>(ref[i]) - plain[i]));
    EXPECT_GT(moved, 1e-2) << "the terms change the experts' output";
  }
}

// An expert's gate and up terms sharing A (PEFT's gate_up_proj wrapper): lora_add_pair reads A
// once and gives the bits of two lora_add calls, with default scales and with per-row scales
// (a row off, rows at other scales); deltas with different A take the two-call path.
TEST(LoraOps, PairSharingAEqualsTwoProducts) {
  const int64_t rows = 24, cols = 64, T = 3;
  Terms g(rows, cols, 900), u(rows, cols, 950);
  u.d.terms[0].a = g.d.terms[0].a;  // same A, own B (as the wrapper's halves)
  u.d.terms[1].a = g.d.terms[1].a;
  u.d.terms[1].scale = 0.75f;
  g.as_two_adapters();
  u.as_two_adapters();
  const std::vector<float> x = randn(T * cols, 1.0f, 21);
  const std::vector<float> user = {1.0f, 0.0f, 0.0f, 0.0f, 0.5f, -2.0f};  // [T, 2]: row 1 runs no adapter
  const LoraRowScales rs{user.data(), T, 2};
  for (const LoraRowScales* r : {static_cast<const LoraRowScales*>(nullptr), &rs}) {
    std::vector<float> y1 = randn(T * rows, 1.0f, 31), y2 = randn(T * rows, 1.0f, 32);
    std::vector<float> w1 = y1, w2 = y2;
    lora_add_pair(g.d, y1.data(), u.d, y2.data(), x.data(), T, cols, rows, rows, r);
    lora_add(g.d, x.data(), T, cols, w1.data(), rows, rows, r);
    lora_add(u.d, x.data(), T, cols, w2.data(), rows, rows, r);
    EXPECT_EQ(y1, w1) << (r ? "row scales" : "defaults");
    EXPECT_EQ(y2, w2) << (r ? "row scales" : "defaults");
  }
  Terms other(rows, cols, 990);  // its own A: two products
  other.as_two_adapters();
  std::vector<float> y1(T * rows, 0.0f), y2(T * rows, 0.0f), w1 = y1, w2 = y2;
  lora_add_pair(g.d, y1.data(), other.d, y2.data(), x.data(), T, cols, rows, rows, &rs);
  lora_add(g.d, x.data(), T, cols, w1.data(), rows, rows, &rs);
  lora_add(other.d, x.data(), T, cols, w2.data(), rows, rows, &rs);
  EXPECT_EQ(y1, w1);
  EXPECT_EQ(y2, w2);
}

// Continuous batching with per-request adapters (ops::LoraRowScales): one product over rows
// using adapter 0, adapter 1, none, and both at other scales equals each row run alone, the
// row without adapters is exactly W x, and the terms follow each row's scales (double reference).
TEST(LoraOps, EachRowRunsItsOwnAdapters) {
  const int64_t rows = 48, cols = 64, T = 5;
  const int nA = 2;
  // [T, adapters]: adapter 0, adapter 1, none, both (0.5 and 2), adapter 0 at -1.5.
  const std::vector<float> user = {1, 0, 0, 1, 0, 0, 0.5f, 2, -1.5f, 0};
  const LoraRowScales table{user.data(), T, nA};
  Weights w(rows, cols, 3);
  Terms terms(rows, cols, 30);
  terms.as_two_adapters();
  ThreadPool pool(3);
  const std::vector<float> x = randn(T * cols, 1.0f, 31);
  for (const WeightView& base : w.views) {
    WeightView with = base;
    with.lora = &terms.d;
    std::vector<float> plain(T * rows), want(T * rows);
    matmul(base, x.data(), T, plain.data(), nullptr);
    want = plain;
    terms.add(x.data(), T, rows, cols, want.data(), user.data());
    std::vector<float> one(T * rows), many(T * rows), multi(T * rows), ref(T * rows), alone(T * rows);
    {
      const LoraRowsScope scope(&table);
      matmul(with, x.data(), T, one.data(), nullptr);
      matmul(with, x.data(), T, many.data(), &pool);
      const MatmulOut outs[] = {{&with, multi.data()}};
      matmul_multi(outs, x.data(), T, &pool);
      matmul_reference(with, x.data(), T, ref.data());
    }
    for (int64_t t = 0; t < T; ++t) {  // each row alone, with its own row of scales
      const LoraRowScales row{user.data() + t * nA, 1, nA};
      const LoraRowsScope scope(&row);
      matmul(with, x.data() + t * cols, 1, alone.data() + t * rows, nullptr);
    }
    expect_close(one, want, "matmul");
    expect_close(many, want, "matmul on a pool");
    expect_close(multi, want, "matmul_multi");
    expect_close(ref, want, "matmul_reference");
    expect_close(one, alone, "the batch against each row alone");
    for (int64_t t = 0; t < T; ++t) {
      const bool off = user[t * nA] == 0 && user[t * nA + 1] == 0;
      const bool same = std::equal(one.begin() + t * rows, one.begin() + (t + 1) * rows, plain.begin() + t * rows);
      EXPECT_EQ(same, off) << "row " << t << ": W x exactly when (and only when) every adapter is off";
    }
  }
}

// The expert path with per-row adapters: CpuBackend (one thread, and a pool whose workers get
// the gathered rows' scales) against ReferenceBackend under the same scales and against each
// token run alone; the token without adapters gets exactly the experts' output without terms.
TEST(LoraOps, ExpertFfnRowsRunTheirOwnAdapters) {
  const int64_t H = 64, I = 32;
  const int E = 3, K = 2, nA = 2;
  const int64_t T = 4;
  std::vector<Weights> gate, up, down;
  std::vector<Terms> tg, tu, td;
  for (int e = 0; e < E; ++e) {
    gate.emplace_back(I, H, 110 + e);
    up.emplace_back(I, H, 210 + e);
    down.emplace_back(H, I, 310 + e);
    tg.emplace_back(I, H, 410 + e);
    tu.emplace_back(I, H, 510 + e);
    td.emplace_back(H, I, 610 + e);
  }
  for (int e = 0; e < E; ++e) {
    tg[e].as_two_adapters();
    tu[e].as_two_adapters();
    td[e].as_two_adapters();
  }
  const std::vector<float> user = {1, 0, 0, 1, 0, 0, 0.5f, 2};  // token 0: adapter 0, 1: adapter 1, 2: none, 3: both
  const LoraRowScales table{user.data(), T, nA};
  const std::vector<int> ids = {0, 1, 2, 0, 1, 2, 2, 1};  // [T, K]
  const ExpertGroups groups = group_by_expert(ids.data(), T, K, E);
  const std::vector<float> x = randn(T * H, 1.0f, 17);
  ThreadPool pool(8);
  std::vector<ExpertMats> with(E), without(E);
  for (int e = 0; e < E; ++e) {
    without[e] = {gate[e].views[0], up[e].views[0], down[e].views[0]};
    with[e] = without[e];
    with[e].gate.lora = &tg[e].d;
    with[e].up.lora = &tu[e].d;
    with[e].down.lora = &td[e].d;
  }
  std::vector<float> ref(T * K * H), one(T * K * H), many(T * K * H), plain(T * K * H);
  {
    const LoraRowsScope scope(&table);
    ReferenceBackend().expert_ffn(with, groups, 0, x.data(), H, Activation::kSwiGLU, ref.data());
    CpuBackend(nullptr).expert_ffn(with, groups, 0, x.data(), H, Activation::kSwiGLU, one.data());
    CpuBackend(&pool).expert_ffn(with, groups, 0, x.data(), H, Activation::kSwiGLU, many.data());
  }
  CpuBackend(nullptr).expert_ffn(without, groups, 0, x.data(), H, Activation::kSwiGLU, plain.data());
  expect_close(one, ref, "expert_ffn");
  expect_close(many, ref, "expert_ffn on a pool");
  // Each token alone (its K pairs, its own row of scales) gives the rows of its pairs.
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<int> ids_t(ids.begin() + t * K, ids.begin() + (t + 1) * K);
    const ExpertGroups g1 = group_by_expert(ids_t.data(), 1, K, E);
    std::vector<ExpertMats> w1;
    for (int e : g1.active) w1.push_back(with[e]);
    std::vector<float> y1(K * H);
    const LoraRowScales row{user.data() + t * nA, 1, nA};
    const LoraRowsScope scope(&row);
    CpuBackend(&pool).expert_ffn(w1, g1, 0, x.data() + t * H, H, Activation::kSwiGLU, y1.data());
    for (int k = 0; k < K; ++k) {
      const int64_t rb = groups.row_of[t * K + k], r1 = g1.row_of[k];  // the pair's row in each run
      const std::vector<float> got(many.begin() + rb * H, many.begin() + (rb + 1) * H), want(y1.begin() + r1 * H, y1.begin() + (r1 + 1) * H);
      expect_close(got, want, "a token's pair against the token alone");
      const bool same = std::equal(one.begin() + rb * H, one.begin() + (rb + 1) * H, plain.begin() + rb * H);
      EXPECT_EQ(same, t == 2) << "token " << t << ": the experts' output without terms exactly when its adapters are off";
    }
  }
}

}  // namespace
}  // namespace spool::ops
