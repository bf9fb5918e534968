// Kernels against scalar references: matmul (f32/bf16/f16, ragged shapes), Gated DeltaNet
// chunked vs recurrent, conv1d, attention, RoPE, bf16/f16 conversions.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/random.h"
#include "ops/kv_cache.h"
#include "ops/elementwise.h"
#include "ops/gated_delta.h"
#include "ops/matmul.h"
#include "ops/rope.h"
#include "ops/vec.h"
#include "ops/workspace.h"
#include "common/error.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace spool::ops {
namespace {

using spool::testing::randn;

uint16_t f32_to_f16(float f) {  // test-only, round to nearest (normal range)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  int32_t e = static_cast<int32_t>((u >> 23) & 0xff) - 127 + 15;
  uint32_t m = u & 0x7fffffu;
  if (e <= 0) return static_cast<uint16_t>(sign);
  uint32_t h = sign | (static_cast<uint32_t>(e) << 10) | (m >> 13);
  if (m & 0x1000u) ++h;
  return static_cast<uint16_t>(h);
}

TEST(Conversions, Bf16AndF16) {
  for (float f : {0.0f, 1.0f, -2.5f, 3.14159f, 1e-3f, 65504.0f}) {
    EXPECT_NEAR(bf16_to_f32(f32_to_bf16(f)), f, std::fabs(f) * 4e-3f);
    EXPECT_NEAR(f16_to_f32(f32_to_f16(f)), f, std::fabs(f) * 1e-3f);
  }
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7e00)));
}

class MatmulTest : public ::testing::TestWithParam<std::tuple<WType, int, int, int>> {};

TEST_P(MatmulTest, MatchesReference) {
  auto [type, rows, cols, T] = GetParam();
  std::vector<float> wf = randn(static_cast<size_t>(rows) * cols, 1 + rows * 7 + cols, 0.3f);
  std::vector<uint8_t> storage(static_cast<size_t>(rows) * cols * wtype_size(type));
  for (size_t i = 0; i < wf.size(); ++i) {
    if (type == WType::kF32) std::memcpy(storage.data() + 4 * i, &wf[i], 4);
    uint16_t h = type == WType::kBF16 ? f32_to_bf16(wf[i]) : f32_to_f16(wf[i]);
    if (type != WType::kF32) std::memcpy(storage.data() + 2 * i, &h, 2);
  }
  WeightView w{type, rows, cols, storage.data()};
  std::vector<float> x = randn(static_cast<size_t>(T) * cols, 99 + T);
  std::vector<float> want(static_cast<size_t>(T) * rows), got(want.size(), -1.0f), got2(want.size(), -1.0f);
  matmul_reference(w, x.data(), T, want.data());
  ThreadPool pool(3);
  matmul(w, x.data(), T, got.data(), &pool);
  matmul(w, x.data(), T, got2.data(), nullptr);
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-4f * (1.0f + std::fabs(want[i]))) << i;
    ASSERT_EQ(got[i], got2[i]) << "threading changed the result at " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, MatmulTest,
                         ::testing::Combine(::testing::Values(WType::kF32, WType::kBF16, WType::kF16),
                                            ::testing::Values(3, 17, 130), ::testing::Values(15, 33, 256),
                                            ::testing::Values(1, 3, 70)));

TEST(Matmul, MultiEqualsSeparate) {
  std::vector<float> a = randn(37 * 64, 1), b = randn(5 * 64, 2), c = randn(130 * 64, 3), x = randn(3 * 64, 4);
  WeightView wa{WType::kF32, 37, 64, a.data()}, wb{WType::kF32, 5, 64, b.data()}, wc{WType::kF32, 130, 64, c.data()};
  for (int64_t T : {1, 3}) {
    std::vector<float> ya(T * 37), yb(T * 5), yc(T * 130), ra(ya.size()), rb(yb.size()), rc(yc.size());
    ThreadPool pool(3);
    matmul_multi({{&wa, ya.data()}, {&wb, yb.data()}, {&wc, yc.data()}}, x.data(), T, &pool);
    matmul(wa, x.data(), T, ra.data(), nullptr);
    matmul(wb, x.data(), T, rb.data(), nullptr);
    matmul(wc, x.data(), T, rc.data(), nullptr);
    EXPECT_EQ(ya, ra);
    EXPECT_EQ(yb, rb);
    EXPECT_EQ(yc, rc);
  }
}

// Recurrent reference straight from the definition, in double.
void delta_reference(const GatedDeltaArgs& a, std::vector<double>& S, std::vector<double>& out) {
  const int r = a.n_v / a.n_k;
  for (int64_t t = 0; t < a.T; ++t)
    for (int h = 0; h < a.n_v; ++h) {
      const int kh = h / r;
      const float* q = a.q + (t * a.n_k + kh) * a.d_k;
      const float* k = a.k + (t * a.n_k + kh) * a.d_k;
      const float* v = a.v + (t * a.n_v + h) * a.d_v;
      double* s = S.data() + static_cast<size_t>(h) * a.d_k * a.d_v;
      const double decay = std::exp(static_cast<double>(a.g[t * a.n_v + h])), beta = a.beta[t * a.n_v + h];
      for (int i = 0; i < a.d_k * a.d_v; ++i) s[i] *= decay;
      for (int j = 0; j < a.d_v; ++j) {
        double kv = 0;
        for (int i = 0; i < a.d_k; ++i) kv += s[i * a.d_v + j] * k[i];
        const double u = beta * (v[j] - kv);
        for (int i = 0; i < a.d_k; ++i) s[i * a.d_v + j] += k[i] * u;
      }
      for (int j = 0; j < a.d_v; ++j) {
        double o = 0;
        for (int i = 0; i < a.d_k; ++i) o += s[i * a.d_v + j] * q[i];
        out[(t * a.n_v + h) * a.d_v + j] = o;
      }
    }
}

// Runs the recurrent kernel (pool), the chunked one with chunk 64 (pool) and chunked with
// `serial_chunk` (no pool) from `init`, each against the double reference (out, state);
// after(mode) runs after each (extra checks).
void expect_modes_match(GatedDeltaArgs a, const std::vector<float>& init, const std::vector<double>& Sref,
                        const std::vector<double>& oref, ThreadPool* pool, int64_t serial_chunk,
                        const std::function<void(int)>& after = nullptr) {
  for (int mode = 0; mode < 3; ++mode) {
    std::vector<float> S = init, out(oref.size());
    a.state = S.data();
    a.out = out.data();
    if (mode == 0) gated_delta_recurrent(a, pool);
    if (mode == 1) gated_delta_chunked(a, 64, pool);
    if (mode == 2) gated_delta_chunked(a, serial_chunk, nullptr);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], oref[i], 2e-5 * (1 + std::fabs(oref[i]))) << "mode " << mode << " i " << i;
    for (size_t i = 0; i < S.size(); ++i) ASSERT_NEAR(S[i], Sref[i], 2e-5 * (1 + std::fabs(Sref[i]))) << "state, mode " << mode;
    if (after) after(mode);
  }
}

TEST(GatedDelta, ChunkedAndRecurrentMatchDefinition) {
  const int64_t T = 150;  // crosses two chunk boundaries with chunk 64
  const int nk = 2, nv = 4, dk = 16, dv = 8;
  std::vector<float> q = randn(T * nk * dk, 1), k = randn(T * nk * dk, 2), v = randn(T * nv * dv, 3);
  for (int64_t t = 0; t < T * nk; ++t) {
    l2_norm(q.data() + t * dk, dk, 1e-6f);
    l2_norm(k.data() + t * dk, dk, 1e-6f);
    for (int d = 0; d < dk; ++d) q[t * dk + d] /= 4.0f;
  }
  std::vector<float> beta(T * nv), g(T * nv);
  std::vector<float> rb = randn(T * nv, 4), rg = randn(T * nv, 5);
  for (size_t i = 0; i < beta.size(); ++i) {
    beta[i] = sigmoid(rb[i]);
    g[i] = -std::exp(0.5f * rg[i]) * 0.3f;
  }
  std::vector<float> init = randn(static_cast<size_t>(nv) * dk * dv, 6, 0.1f);
  GatedDeltaArgs a{T, nk, nv, dk, dv, q.data(), k.data(), v.data(), beta.data(), g.data(), nullptr, nullptr};
  std::vector<double> Sref(init.begin(), init.end()), oref(T * nv * dv);
  delta_reference(a, Sref, oref);
  ThreadPool pool(2);
  expect_modes_match(a, init, Sref, oref, &pool, 7);
}

// Strong decay (g = -3 per token: the chunk's e^{gamma_i - gamma_j} reach the subnormal range and
// below) still matches the definition on both paths, and the chunked path leaves the float control
// state of the calling thread and of the pool's workers as it found it (it flushes subnormals only
// while it runs).
TEST(GatedDelta, StrongDecayMatchesDefinitionAndKeepsFloatControl) {
  const int64_t T = 130;
  const int nk = 1, nv = 2, dk = 16, dv = 8;
  std::vector<float> q = randn(T * nk * dk, 11), k = randn(T * nk * dk, 12), v = randn(T * nv * dv, 13);
  for (int64_t t = 0; t < T * nk; ++t) {
    l2_norm(q.data() + t * dk, dk, 1e-6f);
    l2_norm(k.data() + t * dk, dk, 1e-6f);
  }
  std::vector<float> beta(T * nv, 0.5f), g(T * nv, -3.0f);
  std::vector<float> init = randn(static_cast<size_t>(nv) * dk * dv, 14, 0.1f);
  GatedDeltaArgs a{T, nk, nv, dk, dv, q.data(), k.data(), v.data(), beta.data(), g.data(), nullptr, nullptr};
  std::vector<double> Sref(init.begin(), init.end()), oref(T * nv * dv);
  delta_reference(a, Sref, oref);
  ThreadPool pool(2);
#if defined(__SSE__)
  // MXCSR per pool thread (many small tasks, so each thread likely takes some; ~0u for one that took
  // none: MXCSR's upper 16 bits are reserved zeros, so no thread reads that)
  auto csr_of_workers = [&] {
    std::vector<unsigned> c(static_cast<size_t>(pool.size()), ~0u);
    pool.run(256, [&](int64_t, int thread) { c[static_cast<size_t>(thread)] = _mm_getcsr(); });
    return c;
  };
  auto same_where_seen = [](const std::vector<unsigned>& x, const std::vector<unsigned>& y) {
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i] != ~0u && y[i] != ~0u && x[i] != y[i]) return false;
    return true;
  };
  const unsigned csr = _mm_getcsr();
  const std::vector<unsigned> workers = csr_of_workers();
#endif
  expect_modes_match(a, init, Sref, oref, &pool, 64, [&](int mode) {
#if defined(__SSE__)
    EXPECT_EQ(_mm_getcsr(), csr) << "mode " << mode << ": the calling thread's MXCSR changed";
    EXPECT_TRUE(same_where_seen(csr_of_workers(), workers)) << "mode " << mode << ": a worker's MXCSR changed";
#else
    (void)mode;
#endif
  });
}

// accumulate_rows (the P.V product of attention, Gated DeltaNet's chunk products): full groups
// of 4 rows take 2 vectors of columns at a time; ragged rows, columns and strides against a
// double-precision reference, on every SIMD target.
TEST(Vec, AccumulateRowsMatchesReferenceEveryTarget) {
  for (const auto& mnv : std::vector<std::array<int64_t, 3>>{{4, 5, 32}, {9, 17, 40}, {7, 3, 128}, {12, 64, 77}, {1, 2, 5}}) {
    const int64_t m = mnv[0], n = mnv[1], vd = mnv[2];  // (not a structured binding: clang 14 cannot capture one)
    const int64_t ldp = n + 3, ldv = vd + 5, ldo = vd + 2;
    const std::vector<float> p = spool::testing::randn(static_cast<size_t>(m * ldp), 1 + m);
    const std::vector<float> v = spool::testing::randn(static_cast<size_t>(n * ldv), 2 + n);
    const std::vector<float> o0 = spool::testing::randn(static_cast<size_t>(m * ldo), 3 + vd);
    spool::testing::for_each_target([&](int64_t) {
      std::vector<float> o = o0;
      accumulate_rows(p.data(), ldp, m, v.data(), ldv, n, vd, o.data(), ldo);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t d = 0; d < ldo; ++d) {
          double ref = o0[r * ldo + d];
          if (d < vd)
            for (int64_t j = 0; j < n; ++j) ref += static_cast<double>(p[r * ldp + j]) * v[j * ldv + d];
          ASSERT_NEAR(o[r * ldo + d], ref, 1e-4 * (1.0 + std::sqrt(static_cast<double>(n))))
              << "m " << m << " n " << n << " vd " << vd << " r " << r << " d " << d;
        }
    });
  }
}

// delta_rule_step (decode's recurrence per head) against the four-pass form it fuses (scale, then
// one axpy per row for S^T k, the update and S^T q), bit for bit on every SIMD target, with dv a
// multiple of the vector length and not.
TEST(Vec, DeltaRuleStepEqualsFourPassesEveryTarget) {
  for (const auto& kv : std::vector<std::array<int64_t, 2>>{{16, 128}, {8, 37}, {3, 5}}) {
    const int64_t dk = kv[0], dv = kv[1];  // (not a structured binding: clang 14 cannot capture one)
    const std::vector<float> S0 = spool::testing::randn(static_cast<size_t>(dk * dv), 1 + dv, 0.1f);
    const std::vector<float> k = spool::testing::randn(dk, 2), q = spool::testing::randn(dk, 3), v = spool::testing::randn(dv, 4);
    const float decay = 0.93f, beta = 0.61f;
    spool::testing::for_each_target([&](int64_t) {
      std::vector<float> S1 = S0, S2 = S0, u1(dv), u2(dv, NAN), o1(dv, 0.0f), o2(dv, NAN);
      scale(decay, S1.data(), dk * dv);
      std::fill(u1.begin(), u1.end(), 0.0f);
      for (int64_t i = 0; i < dk; ++i) axpy(k[i], S1.data() + i * dv, dv, u1.data());
      for (int64_t j = 0; j < dv; ++j) u1[j] = (v[j] - u1[j]) * beta;
      for (int64_t i = 0; i < dk; ++i) axpy(k[i], u1.data(), dv, S1.data() + i * dv);
      for (int64_t i = 0; i < dk; ++i) axpy(q[i], S1.data() + i * dv, dv, o1.data());
      delta_rule_step(S2.data(), dk, dv, decay, k.data(), q.data(), v.data(), beta, u2.data(), o2.data());
      EXPECT_EQ(S1, S2) << "dk " << dk << " dv " << dv;
      EXPECT_EQ(o1, o2) << "dk " << dk << " dv " << dv;
    });
  }
}

TEST(Conv1d, CarriedStateEqualsOneShot) {
  const int64_t T = 11, C = 5;
  const int K = 4;
  std::vector<float> x = randn(T * C, 7), w = randn(C * K, 8);
  std::vector<float> st1(C * (K - 1), 0.0f), out1(T * C);
  causal_conv1d_silu(x.data(), T, C, w.data(), K, st1.data(), out1.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0;
      for (int j = 0; j < K; ++j) {
        const int64_t src = t - (K - 1) + j;
        if (src >= 0) acc += w[c * K + j] * x[src * C + c];
      }
      EXPECT_NEAR(out1[t * C + c], acc / (1 + std::exp(-acc)), 1e-5);
    }
  std::vector<float> st2(C * (K - 1), 0.0f), out2(T * C);
  // token by token (decode's one-token path): the same products in the same order, bit for bit
  for (int64_t t = 0; t < T; ++t) causal_conv1d_silu(x.data() + t * C, 1, C, w.data(), K, st2.data(), out2.data() + t * C);
  EXPECT_EQ(out1, out2);
  EXPECT_EQ(st1, st2);
}

// The one-token path (decode) against the general one, bit for bit, for every kernel size from 1
// (no carried state) to 4, from a carried state that is not zero.
TEST(Conv1d, OneTokenPathEqualsBatchEveryKernelSize) {
  const int64_t T = 9, C = 37;
  for (int K = 1; K <= 4; ++K) {
    const std::vector<float> x = randn(T * C, 30 + K), w = randn(C * K, 40 + K), st0 = randn(C * (K - 1), 50 + K);
    std::vector<float> st1 = st0, st2 = st0, out1(T * C), out2(T * C, NAN);
    causal_conv1d_silu(x.data(), T, C, w.data(), K, st1.data(), out1.data());
    for (int64_t t = 0; t < T; ++t) causal_conv1d_silu(x.data() + t * C, 1, C, w.data(), K, st2.data(), out2.data() + t * C);
    EXPECT_EQ(out1, out2) << "K " << K;
    EXPECT_EQ(st1, st2) << "K " << K;
  }
}

// Parallel over channel blocks (a pool; ragged last block) equals one thread bit for bit, with a
// carried state that is not zero and chunks shorter than the kernel.
TEST(Conv1d, PoolEqualsOneThreadBitForBit) {
  const int64_t T = 40, C = 16400;  // C * 1 token >= the parallel threshold (1 << 14); 256 blocks of 64 + 16
  const int K = 4;
  const std::vector<float> x = randn(T * C, 17), w = randn(C * K, 18), st0 = randn(C * (K - 1), 19);
  ThreadPool pool(2);
  std::vector<float> st1 = st0, st2 = st0, out1(T * C), out2(T * C, NAN);
  causal_conv1d_silu(x.data(), T, C, w.data(), K, st1.data(), out1.data());
  int64_t t = 0;
  for (int64_t n : {2, 1, 37}) {  // chunks of 2 and 1 tokens (< K - 1: the state feeds several rows), then 37
    causal_conv1d_silu(x.data() + t * C, n, C, w.data(), K, st2.data(), out2.data() + t * C, &pool);
    t += n;
  }
  EXPECT_EQ(out1, out2);
  EXPECT_EQ(st1, st2);
  // the first output against the formula with the carried state
  double acc = 0;
  for (int j = 0; j < K; ++j) acc += w[j] * (j < K - 1 ? st0[j] : x[0]);
  EXPECT_NEAR(out1[0], acc / (1 + std::exp(-acc)), 1e-5);
}

// Attention over each KV storage type against a naive double-precision softmax over the same
// (dequantized) cache contents; the quantized caches also stay close to the f32 result.
TEST(Attention, MatchesNaiveSoftmaxForEveryKvType) {
  const int nh = 4, nkv = 2, hd = 64;
  const int64_t pos0 = 37, T = 3;
  std::vector<float> kc = randn(nkv * (pos0 + T) * hd, 9), vc = randn(nkv * (pos0 + T) * hd, 10), q = randn(T * nh * hd, 11);
  std::vector<float> exact;
  for (KvType type : {KvType::kF32, KvType::kF16, KvType::kI8}) {
    KvCache kv;
    kv.configure(type, nkv, hd);
    kv.reserve(pos0 + T, 0);
    for (int64_t p = 0; p < pos0 + T; ++p) {
      std::vector<float> k(nkv * hd), v(nkv * hd);
      for (int h = 0; h < nkv; ++h)
        for (int d = 0; d < hd; ++d) {
          k[h * hd + d] = kc[(h * (pos0 + T) + p) * hd + d];
          v[h * hd + d] = vc[(h * (pos0 + T) + p) * hd + d];
        }
      kv.write(p, k.data(), v.data());
    }
    std::vector<float> out(T * nh * hd);
    ThreadPool pool(2);
    attention(q.data(), T, nh, kv, pos0, 0.125f, out.data(), &pool);
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < nh; ++h) {
        const int kvh = h / (nh / nkv);
        const int64_t n = pos0 + t + 1;
        std::vector<double> s(n);
        double m = -1e30, sum = 0;
        for (int64_t p = 0; p < n; ++p) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += q[(t * nh + h) * hd + i] * kv.key(kvh, p, i);
          s[p] = d * 0.125;
          m = std::max(m, s[p]);
        }
        for (auto& x : s) sum += (x = std::exp(x - m));
        for (int i = 0; i < hd; ++i) {
          double o = 0;
          for (int64_t p = 0; p < n; ++p) o += s[p] / sum * kv.value(kvh, p, i);
          ASSERT_NEAR(out[(t * nh + h) * hd + i], o, 1e-5) << "kv type " << static_cast<int>(type);
        }
      }
    if (type == KvType::kF32) exact = out;
    const double tol = type == KvType::kF16 ? 2e-3 : 3e-2;
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], exact[i], tol) << "kv type " << static_cast<int>(type);
  }
}

TEST(KvCache, GrowsAndCopiesPrefixes) {
  for (KvType type : {KvType::kF32, KvType::kF16, KvType::kI8}) {
    KvCache a, b;
    a.configure(type, 2, 64);
    b.configure(type, 2, 64);
    std::vector<float> k = randn(128, 1), v = randn(128, 2);
    for (int64_t p = 0; p < 300; ++p) {  // crosses the first growth (256)
      a.reserve(p + 1, p);
      a.write(p, k.data(), v.data());
    }
    b.copy_prefix(a, 300);
    for (int64_t p : {0, 255, 256, 299})
      for (int d : {0, 33, 63}) {
        EXPECT_EQ(a.key(1, p, d), b.key(1, p, d));
        EXPECT_EQ(a.value(0, p, d), b.value(0, p, d));
        EXPECT_NEAR(a.key(1, p, d), k[64 + d], type == KvType::kF32 ? 0 : type == KvType::kF16 ? 2e-3 : 3e-2);
      }
  }
}

// A windowed cache (sliding-window layers) fed the same chunks as an unbounded one: it holds
// at most window_rows(W, largest chunk) rows whatever the length, keeps exactly the rows the
// queries can see, and windowed attention over it is bit-identical to attention over the
// unbounded cache; positions it dropped throw; save / load / copy carry only the window's rows.
TEST(KvCache, WindowedCacheHoldsTheWindowAndAttendsLikeAnUnboundedOne) {
  const int nh = 4, nkv = 2, hd = 64;
  const int64_t total = 300;
  const std::vector<float> kc = randn(total * nkv * hd, 21), vc = randn(total * nkv * hd, 22), qc = randn(total * nh * hd, 23);
  ThreadPool pool(2);
  for (KvType type : {KvType::kF32, KvType::kF16, KvType::kI8})
    for (int64_t W : {1, 5, 37, 128}) {
      SCOPED_TRACE("kv type " + std::to_string(static_cast<int>(type)) + " window " + std::to_string(W));
      KvCache full, win;
      full.configure(type, nkv, hd);
      win.configure(type, nkv, hd, false, W);
      int64_t pos = 0, largest = 0;
      for (int64_t i = 0; pos < total; ++i) {
        const int64_t T = std::min<int64_t>(total - pos, pos < 100 ? 16 : i % 5 == 0 ? 3 : 1);  // prefill chunks, then decode
        largest = std::max(largest, T);
        full.reserve(pos + T, pos);
        win.reserve(pos + T, pos);
        for (int64_t t = 0; t < T; ++t) {
          full.write(pos + t, kc.data() + (pos + t) * nkv * hd, vc.data() + (pos + t) * nkv * hd);
          win.write(pos + t, kc.data() + (pos + t) * nkv * hd, vc.data() + (pos + t) * nkv * hd);
        }
        std::vector<float> a(T * nh * hd), b(T * nh * hd);
        attention(qc.data() + pos * nh * hd, T, nh, full, pos, 0.125f, a.data(), &pool, W);
        attention(qc.data() + pos * nh * hd, T, nh, win, pos, 0.125f, b.data(), &pool, W);
        ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "pos " << pos << " T " << T;
        pos += T;
        ASSERT_LE(win.capacity(), KvCache::window_rows(W, largest)) << pos;
        ASSERT_TRUE(win.holds(pos));
        ASSERT_LE(win.base(), win.first_kept(pos));
      }
      EXPECT_EQ(win.first_kept(total), std::max<int64_t>(0, total - W + 1));
      EXPECT_GT(win.base(), 0);  // it did drop rows
      EXPECT_LT(win.bytes(), full.bytes() / 2);
      for (int64_t p = win.first_kept(total); p < total; ++p)
        for (int d : {0, 31, 63}) {
          ASSERT_EQ(win.key(1, p, d), full.key(1, p, d));
          ASSERT_EQ(win.value(0, p, d), full.value(0, p, d));
        }
      EXPECT_THROW((void)win.key(0, win.base() - 1, 0), spool::Error);
      // Unwindowed attention (or a wider window) needs rows the cache no longer holds.
      std::vector<float> out(nh * hd);
      EXPECT_THROW(attention(qc.data(), 1, nh, win, total - 1, 0.125f, out.data(), nullptr), spool::Error);
      EXPECT_THROW(attention(qc.data(), 1, nh, win, total - 1, 0.125f, out.data(), nullptr, total), spool::Error);
      // Writing a dropped position throws too.
      EXPECT_THROW(win.write(win.base() - 1, kc.data(), vc.data()), spool::Error);
      // save / load / copy: the W - 1 rows a query at `total` can see.
      std::string img;
      win.save_prefix(total, img);
      EXPECT_EQ(img.size(), static_cast<size_t>(std::min(W - 1, total)) * win.bytes_per_position());
      EXPECT_EQ(img.size(), win.saved_bytes(total));
      KvCache loaded, copied;
      loaded.configure(type, nkv, hd, false, W);
      copied.configure(type, nkv, hd, false, W);
      loaded.load_prefix(img, total);
      copied.copy_prefix(win, total);
      EXPECT_EQ(loaded.base(), win.first_kept(total));
      EXPECT_LE(copied.capacity(), W);
      for (KvCache* c : {&loaded, &copied, &full}) {  // one more token on each: the same output
        c->reserve(total + 1, total);
        c->write(total, kc.data(), vc.data());
      }
      std::vector<float> want(nh * hd), got(nh * hd);
      attention(qc.data(), 1, nh, full, total, 0.125f, want.data(), nullptr, W);
      for (KvCache* c : {&loaded, &copied}) {
        attention(qc.data(), 1, nh, *c, total, 0.125f, got.data(), nullptr, W);
        EXPECT_EQ(std::memcmp(want.data(), got.data(), got.size() * sizeof(float)), 0);
      }
      KvCache other;
      other.configure(type, nkv, hd, false, W + 1);
      EXPECT_THROW(other.copy_prefix(win, total), spool::Error);  // another window
      EXPECT_THROW(other.load_prefix(img, total), spool::Error);
      // An unbounded cache's layout is unchanged: base 0, every row.
      EXPECT_EQ(full.base(), 0);
      EXPECT_EQ(full.saved_bytes(total), static_cast<uint64_t>(total) * full.bytes_per_position());
    }
}

// The planner's capacity function is KvCache::reserve run over the same chunks.
TEST(KvCache, CapacityForFollowsReserve) {
  struct Case {
    int64_t prompt, total, step, window;
  } cases[] = {{10, 58, 512, 0}, {778, 1034, 512, 0}, {10, 58, 512, 8}, {778, 1034, 512, 128}, {100, 5000, 7, 4096}, {1, 900, 512, 128}};
  for (const Case& c : cases) {
    KvCache kv;
    kv.configure(KvType::kF16, 1, 32, false, c.window);
    for (int64_t p = 0; p < c.prompt; p += c.step) kv.reserve(std::min(c.prompt, p + c.step), p);
    for (int64_t p = c.prompt; p < c.total; ++p) kv.reserve(p + 1, p);
    EXPECT_EQ(kv_capacity_for(c.prompt, c.total, c.step, c.window), kv.capacity()) << c.prompt << " " << c.total << " " << c.window;
    if (c.window > 0) {
      EXPECT_LE(kv.capacity(), KvCache::window_rows(c.window, std::min(c.step, c.prompt)));
    }
  }
}

// Rows a device wrote (KvCache::defer_rows, a GPU backend's kv_append) reach host storage through
// their fetch before any host reader sees the cache: reads, snapshots, copies, moves, growth and
// writes each settle them first (once); configure and clear drop them; a failing fetch leaves
// them deferred.
TEST(KvCache, DeferredRowsAreFetchedBeforeEveryHostRead) {
  const std::vector<float> k = randn(128, 1), v = randn(128, 2);
  KvCache want;  // what the "device" holds: positions 0..3 written
  want.configure(KvType::kI8, 2, 64);
  want.reserve(4, 0);
  for (int64_t p = 0; p < 4; ++p) want.write(p, k.data(), v.data());
  int fetches = 0;
  // The device "wrote" rows 2 and 3 of `c`: the fetch copies them from `want` (same layout).
  auto fetch = [&](KvCache& c, int64_t lo, int64_t hi) {
    ++fetches;
    ASSERT_EQ(lo, 2);
    ASSERT_EQ(hi, 4);
    std::string img;
    want.save_prefix(4, img);
    KvCache tmp = c;  // (c itself must not be settled from inside its fetch)
    tmp.load_prefix(img, 4);
    const size_t kb = static_cast<size_t>(2 * 64) * static_cast<size_t>(c.capacity());
    std::memcpy(c.k_storage(), tmp.k_data(), kb);
    std::memcpy(c.v_storage(), tmp.v_data(), kb);
    std::memcpy(c.k_scale_storage(), tmp.k_scales(), static_cast<size_t>(2 * 2 * c.capacity()) * sizeof(float));
    std::memcpy(c.v_scale_storage(), tmp.v_scales(), static_cast<size_t>(2 * 2 * c.capacity()) * sizeof(float));
  };
  auto deferred = [&]() {
    KvCache c;
    c.configure(KvType::kI8, 2, 64);
    c.reserve(4, 0);
    c.write(0, k.data(), v.data());
    c.write(1, k.data(), v.data());
    const uint64_t g = c.generation();
    c.defer_rows(2, 3, fetch);
    c.defer_rows(3, 4, fetch);  // widens to [2, 4)
    EXPECT_NE(c.generation(), g) << "deferred rows count as written";
    EXPECT_TRUE(c.has_deferred());
    return c;
  };
  const auto same_as_want = [&](const KvCache& c, const char* what) {
    std::string a, b;
    c.save_prefix(4, a);
    want.save_prefix(4, b);
    EXPECT_EQ(a, b) << what;
  };
  const std::vector<std::pair<const char*, std::function<void(KvCache&)>>> readers = {
      {"key", [](KvCache& c) { (void)c.key(1, 3, 5); }},
      {"value", [](KvCache& c) { (void)c.value(1, 2, 5); }},
      {"k_data", [](KvCache& c) { (void)c.k_data(); }},
      {"save_prefix", [](KvCache& c) { std::string s; c.save_prefix(4, s); }},
      {"copy_prefix (source)", [](KvCache& c) { KvCache d; d.configure(KvType::kI8, 2, 64); d.copy_prefix(c, 4); }},
      {"copy", [](KvCache& c) { KvCache d = c; }},
      {"move", [](KvCache& c) { KvCache d = std::move(c); c = std::move(d); }},
      {"reserve (growth)", [](KvCache& c) { c.reserve(1000, 4); }},
  };
  for (const auto& [what, read] : readers) {
    SCOPED_TRACE(what);
    fetches = 0;
    KvCache c = deferred();
    read(c);
    EXPECT_EQ(fetches, 1);
    EXPECT_FALSE(c.has_deferred());
    same_as_want(c, what);
    EXPECT_EQ(fetches, 1) << "settled rows are not fetched again";
  }
  {  // write settles first: the earlier deferred rows are kept
    fetches = 0;
    KvCache c = deferred();
    c.reserve(5, 4);
    c.write(4, k.data(), v.data());
    EXPECT_EQ(fetches, 1);
    EXPECT_EQ(c.key(0, 3, 7), want.key(0, 3, 7));
  }
  for (const bool clear : {false, true}) {  // contents dropped: nothing to fetch
    fetches = 0;
    KvCache c = deferred();
    if (clear) {
      c.clear();
    } else {
      c.configure(KvType::kI8, 2, 64);
    }
    EXPECT_FALSE(c.has_deferred());
    EXPECT_EQ(fetches, 0);
  }
  {  // a moved-from cache is empty (no rows, a new generation) and usable again
    KvCache c = deferred();
    const uint64_t g = c.generation();
    KvCache d = std::move(c);
    EXPECT_EQ(c.capacity(), 0);
    EXPECT_FALSE(c.has_deferred());
    EXPECT_NE(c.generation(), g);
    c.reserve(1, 0);
    c.write(0, k.data(), v.data());
    EXPECT_EQ(c.key(1, 0, 5), want.key(1, 0, 5));
  }
  {  // a failing fetch propagates and leaves the rows deferred
    KvCache c;
    c.configure(KvType::kF32, 1, 8);
    c.reserve(2, 0);
    c.defer_rows(0, 1, [](KvCache&, int64_t, int64_t) { throw Error("device gone"); });
    EXPECT_THROW((void)c.key(0, 0, 0), Error);
    EXPECT_TRUE(c.has_deferred());
    EXPECT_THROW(c.defer_rows(1, c.capacity() + 1, [](KvCache&, int64_t, int64_t) {}), Error) << "rows beyond the capacity";
  }
}

// A GPU backend keeps a device mirror of each cache and re-uploads it when generation() moves:
// every change moves it, reads do not, and a copy carries its source's generation.
TEST(KvCache, GenerationMovesOnEveryChange) {
  KvCache a, b;
  a.configure(KvType::kI8, 2, 64);
  b.configure(KvType::kI8, 2, 64);
  EXPECT_NE(a.generation(), b.generation());
  uint64_t g = a.generation();
  auto moved = [&](const char* what) {
    EXPECT_NE(a.generation(), g) << what;
    g = a.generation();
  };
  a.reserve(10, 0);
  moved("reserve (growth)");
  a.reserve(5, 5);
  EXPECT_EQ(a.generation(), g) << "reserve within capacity";
  const std::vector<float> k = randn(128, 1), v = randn(128, 2);
  a.write(3, k.data(), v.data());
  moved("write");
  std::string img;
  a.save_prefix(4, img);
  (void)a.key(0, 3, 5);
  EXPECT_EQ(a.generation(), g) << "reads";
  const KvCache c = a;
  EXPECT_EQ(c.generation(), a.generation());
  a.load_prefix(img, 4);
  moved("load_prefix");
  b.reserve(4, 0);
  a.copy_prefix(b, 4);
  moved("copy_prefix");
  a.configure(KvType::kF16, 2, 64);
  moved("configure");
  a.configure(KvType::kF16, 2, 64, false, 4);  // windowed: moving the rows to the front is a change
  a.reserve(4, 0);
  moved("reserve (windowed growth)");
  for (int64_t p = 0; p < 4; ++p) a.write(p, k.data(), v.data());
  g = a.generation();
  a.reserve(a.capacity() + 1, a.capacity());
  EXPECT_GT(a.base(), 0);
  moved("reserve (windowed move)");
}

// A device workspace (here with a stand-in allocator) hands out floats from the device arena
// and ints from a host shadow at the same offsets; without an allocator it refuses.
TEST(Workspace, DeviceArenaKeepsIntsOnTheHost) {
  set_device_allocator(Device::kCuda, DeviceAllocator{});
  EXPECT_THROW(Workspace(1 << 16, Device::kCuda), spool::Error);
  static std::vector<char>* arena = nullptr;
  static int frees = 0;
  set_device_allocator(Device::kCuda, DeviceAllocator{[](size_t n) -> void* {
                                                        arena = new std::vector<char>(n + 64);
                                                        return arena->data();
                                                      },
                                                      [](void*) {
                                                        delete arena;
                                                        arena = nullptr;
                                                        ++frees;
                                                      }});
  {
    Workspace ws(1 << 16, Device::kCuda);
    const char* lo = arena->data();
    const char* hi = lo + arena->size();
    float* f = ws.floats(100);
    EXPECT_TRUE(reinterpret_cast<char*>(f) >= lo && reinterpret_cast<char*>(f) < hi);
    const size_t m = ws.mark();
    int* ids = ws.ints(8);
    EXPECT_FALSE(reinterpret_cast<char*>(ids) >= lo && reinterpret_cast<char*>(ids) < hi);
    for (int i = 0; i < 8; ++i) ids[i] = i;  // host-writable
    ws.release(m);
    EXPECT_EQ(ws.ints(8), ids);  // same offset after release
    Workspace moved = std::move(ws);
    EXPECT_EQ(moved.device(), Device::kCuda);
    EXPECT_EQ(frees, 0);
  }
  EXPECT_EQ(frees, 1);
  set_device_allocator(Device::kCuda, DeviceAllocator{});
}

TEST(Rope, RotatesPairsHalfApart) {
  Rope r(4, 10000.0);
  std::vector<float> x = {1, 2, 3, 4, 5, 6};  // head_dim 6, rotary dims 0..3, dims 4..5 pass through
  r.apply(x.data(), 1, 6, 3);
  const double f0 = 3.0, f1 = 3.0 / 100.0;  // inv_freq = [1, 1/100]
  EXPECT_NEAR(x[0], 1 * std::cos(f0) - 3 * std::sin(f0), 1e-5);
  EXPECT_NEAR(x[2], 3 * std::cos(f0) + 1 * std::sin(f0), 1e-5);
  EXPECT_NEAR(x[1], 2 * std::cos(f1) - 4 * std::sin(f1), 1e-5);
  EXPECT_NEAR(x[3], 4 * std::cos(f1) + 2 * std::sin(f1), 1e-5);
  EXPECT_EQ(x[4], 5);
  EXPECT_EQ(x[5], 6);
}

// Pairs mode (HF apply_rotary_pos_emb_interleave): adjacent pairs (0,1), (2,3) of the rotary dims
// rotate together and leave de-interleaved: out = [x0' x2' | x1' x3'], the rest pass through.
TEST(Rope, PairsModeRotatesAdjacentPairsAndDeinterleaves) {
  const Rope r = Rope(4, 10000.0).with_pairs(true);
  EXPECT_TRUE(r.pairs());
  EXPECT_FALSE(Rope(4, 10000.0).pairs());
  std::vector<float> x = {1, 2, 3, 4, 5, 6};
  r.apply(x.data(), 1, 6, 3);
  const double f0 = 3.0, f1 = 3.0 / 100.0;  // inv_freq = [1, 1/100]
  EXPECT_NEAR(x[0], 1 * std::cos(f0) - 2 * std::sin(f0), 1e-5);  // pair (1, 2) at f0
  EXPECT_NEAR(x[2], 2 * std::cos(f0) + 1 * std::sin(f0), 1e-5);
  EXPECT_NEAR(x[1], 3 * std::cos(f1) - 4 * std::sin(f1), 1e-5);  // pair (3, 4) at f1
  EXPECT_NEAR(x[3], 4 * std::cos(f1) + 3 * std::sin(f1), 1e-5);
  EXPECT_EQ(x[4], 5);
  EXPECT_EQ(x[5], 6);
}

// Proportional RoPE (HF _compute_proportional_rope_parameters): head_dim 8, partial 0.5 ->
// 2 of the 4 frequencies non-zero, theta^(-2i/8) (exponent over the whole head), the rest 0:
// pairs (j, j + 4) rotate for j < 2 and dims 2, 3, 6, 7 pass unchanged. Not partial rotary,
// which would pair (j, j + 2) at theta^(-2i/4).
TEST(Rope, ProportionalPairsHalfTheWholeHeadApartWithZeroTail) {
  const std::vector<float> f = proportional_inv_freq(10000.0, 8, 0.5);
  ASSERT_EQ(f.size(), 4u);
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  EXPECT_FLOAT_EQ(f[1], 1.0f / std::pow(10000.0f, 0.25f));
  EXPECT_EQ(f[2], 0.0f);
  EXPECT_EQ(f[3], 0.0f);
  EXPECT_FLOAT_EQ(proportional_inv_freq(10000.0, 8, 0.5, 2.0)[1], f[1] / 2.0f);  // / factor
  Rope r(f);
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  r.apply(x.data(), 1, 8, 5);
  const double a0 = 5.0, a1 = 5.0 * f[1];
  EXPECT_NEAR(x[0], 1 * std::cos(a0) - 5 * std::sin(a0), 1e-5);
  EXPECT_NEAR(x[4], 5 * std::cos(a0) + 1 * std::sin(a0), 1e-5);
  EXPECT_NEAR(x[1], 2 * std::cos(a1) - 6 * std::sin(a1), 1e-5);
  EXPECT_NEAR(x[5], 6 * std::cos(a1) + 2 * std::sin(a1), 1e-5);
  for (int d : {2, 3, 6, 7}) EXPECT_EQ(x[d], d + 1) << d;
}

TEST(ThreadPool, RunsEveryTaskOnceAndPropagatesErrors) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(1000);
  pool.run(1000, [&](int64_t i, int) { hits[i]++; });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  EXPECT_THROW(pool.run(10, [](int64_t i, int) { if (i == 7) throw std::runtime_error("x"); }), std::runtime_error);
  int64_t covered = 0;
  pool.parallel_for(1001, 16, [&](int64_t b, int64_t e, int) { __atomic_add_fetch(&covered, e - b, __ATOMIC_RELAXED); });
  EXPECT_EQ(covered, 1001);
}

// Many short jobs on pools with more threads than cores: workers wake late, miss jobs, and
// must never run a task of a job that has ended; every task runs once and has finished
// when run() returns (the caller waits for claimed tasks, not for every worker).
TEST(ThreadPool, ShortJobsWithLateWorkersRunEachTaskOnceBeforeRunReturns) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int threads : {2, 3, 4 * cores}) {
    ThreadPool pool(threads);
    std::atomic<int> job{-1};
    for (int j = 0; j < 3000; ++j) {
      const int64_t n = 2 + j % 31;
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      job.store(j);
      pool.run(n, [&, j](int64_t i, int thread) {
        EXPECT_EQ(job.load(), j) << "a task of job " << j << " ran after its run() returned";
        EXPECT_GE(thread, 0);
        EXPECT_LT(thread, pool.size());
        if (i % 7 == 3) std::this_thread::sleep_for(std::chrono::microseconds(20));  // some tasks finish late
        hits[static_cast<size_t>(i)]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "threads " << threads << " job " << j << " task " << i;
    }
  }
}

// parallel_for's chunks: aligned, disjoint, covering [0, n) once; a large range is cut into more
// chunks than threads (claimed dynamically), a small one into at most one per thread.
TEST(ThreadPool, ParallelForChunksCoverTheRangeOnce) {
  for (int threads : {1, 2, 3})
  for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{100}, int64_t{1001}, int64_t{248320}}) {
    ThreadPool pool(threads);
    std::mutex mu;
    std::vector<std::pair<int64_t, int64_t>> chunks;
    pool.parallel_for(n, 16, [&](int64_t b, int64_t e, int thread) {
      std::lock_guard<std::mutex> lock(mu);
      chunks.emplace_back(b, e);
      EXPECT_GE(thread, 0);
      EXPECT_LT(thread, pool.size());
    });
    if (threads == 1) {
      EXPECT_EQ(chunks.size(), 1u) << "n " << n;
    }
    std::sort(chunks.begin(), chunks.end());
    int64_t at = 0;
    for (const auto& [b, e] : chunks) {
      EXPECT_EQ(b, at) << "n " << n;
      EXPECT_LT(b, e) << "n " << n;
      EXPECT_EQ(b % 16, 0) << "n " << n;
      at = e;
    }
    EXPECT_EQ(at, n);
    const int64_t units = (n + 15) / 16;
    if (threads > 1 && units >= 2 * ThreadPool::kMinUnitsPerChunk * pool.size()) {
      EXPECT_GT(static_cast<int64_t>(chunks.size()), pool.size()) << "n " << n;
    }
    EXPECT_LE(static_cast<int64_t>(chunks.size()), pool.size() * ThreadPool::kChunksPerThread) << "n " << n;
    if (units < ThreadPool::kMinUnitsPerChunk * pool.size()) {
      EXPECT_LE(static_cast<int64_t>(chunks.size()), pool.size()) << "n " << n;
    }
  }
}

}  // namespace
}  // namespace spool::ops
