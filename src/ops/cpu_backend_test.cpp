// CpuBackend::expert_ffn with more pool threads than experts (the decode case on a many-core host)
// splits each expert's rows over several tasks: the same bits as one task per expert and as one
// thread, for f32 and Q4_K experts (f32 and int8 activations), SwiGLU and tanh-GELU, one and several
// rows per expert.
#include "ops/cpu_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "ops/elementwise.h"
#include "ops/ggml_q8.h"
#include "ops/matmul.h"
#include "ops/quant_q8.h"
#include "ops/weights.h"
#include "quant/hadamard.h"
#include "quant/quantize.h"
#include "support/ggml_random.h"
#include "support/random.h"

namespace spool::ops {
namespace {

using spool::testing::randn;
using spool::testing::random_ggml_blocks;

struct Experts {
  std::vector<std::vector<uint8_t>> bytes;  // owns the ggml blocks
  std::vector<std::vector<float>> floats;   // owns the f32 matrices
  std::vector<ExpertMats> mats;
};

// E experts [I, H] / [H, I], ggml type t (F32: plain float matrices).
Experts make_experts(GgmlType t, int E, int64_t H, int64_t I, uint64_t seed) {
  Experts x;
  auto mat = [&](int64_t rows, int64_t cols) {
    if (t == GgmlType::F32) {
      x.floats.push_back(randn(static_cast<size_t>(rows * cols), seed++, 0.1f));
      WeightView v;
      v.type = WType::kF32;
      v.rows = rows;
      v.cols = cols;
      v.data = x.floats.back().data();
      return v;
    }
    x.bytes.push_back(random_ggml_blocks(t, rows, cols, seed++));
    return ggml_weight_view(t, rows, cols, x.bytes.back().data());
  };
  x.floats.reserve(3 * E);
  x.bytes.reserve(3 * E);
  for (int e = 0; e < E; ++e) {
    ExpertMats m;
    m.gate = mat(I, H);
    m.up = mat(I, H);
    m.down = mat(H, I);
    x.mats.push_back(m);
  }
  return x;
}

TEST(CpuBackendExpertFfn, SplitOverThreadsEqualsOneTaskPerExpert) {
  const int64_t H = 256, I = 512;
  ThreadPool many(8), three(3);
  for (GgmlType t : {GgmlType::F32, GgmlType::Q4_K})
    for (bool int8 : {false, true})
    for (Activation act : {Activation::kSwiGLU, Activation::kGeluTanhGLU})
      for (int64_t T : {1, 3}) {
        if (int8 && t == GgmlType::F32) continue;
        if (int8) ASSERT_TRUE(q8_fast()) << "no int8 kernels here: the int8 case would run f32";
        SCOPED_TRACE(std::string(t == GgmlType::F32 ? "F32" : "Q4_K") + (int8 ? " int8" : "") +
                     (act == Activation::kSwiGLU ? " swiglu" : " gelu") + " T=" + std::to_string(T));
        const CpuOptions opt{int8};
        const int E = 6, K = 2;
        Experts ex = make_experts(t, E, H, I, 11);
        const std::vector<float> bias = randn(static_cast<size_t>(E * H), 19, 0.1f);
        for (int e = 0; e < E; e += 2) ex.mats[e].down_bias = bias.data() + e * H;  // some experts have one
        std::vector<int> ids(static_cast<size_t>(T * K));
        for (int64_t i = 0; i < T * K; ++i) ids[i] = static_cast<int>((i * 5 + i / K) % E);
        const ExpertGroups groups = group_by_expert(ids.data(), T, K, E);
        std::vector<ExpertMats> active;
        for (int e : groups.active) active.push_back(ex.mats[e]);
        ASSERT_LT(static_cast<int>(active.size()), many.size());  // the split path
        const std::vector<float> x = randn(static_cast<size_t>(T * H), 3);
        std::vector<float> y1(T * K * H, NAN), y3(y1.size(), NAN), y8(y1.size(), NAN);
        CpuBackend(nullptr, opt).expert_ffn(active, groups, 0, x.data(), H, act, y1.data());
        CpuBackend(&many, opt).expert_ffn(active, groups, 0, x.data(), H, act, y8.data());
        // In two calls (as a streaming cache hands experts out): the second starts at g0 > 0.
        const size_t half = active.size() / 2;
        CpuBackend b3(&three, opt);
        b3.expert_ffn(std::span<const ExpertMats>(active.data(), half), groups, 0, x.data(), H, act, y3.data());
        b3.expert_ffn(std::span<const ExpertMats>(active.data() + half, active.size() - half), groups, half, x.data(), H, act,
                      y3.data());
        EXPECT_EQ(std::memcmp(y1.data(), y8.data(), y1.size() * sizeof(float)), 0) << "8 threads differ from 1";
        EXPECT_EQ(std::memcmp(y1.data(), y3.data(), y1.size() * sizeof(float)), 0) << "3 threads, two calls differ from 1";
        for (float v : y8) ASSERT_TRUE(std::isfinite(v));
      }
}


// Spool q4 / q8 experts as a converted checkpoint has them (gate/up of every routed expert rotated by
// one sign vector, down by another) plus a shared expert with its own signs run as one more group
// holding every token (models/moe.cpp on a CPU with resident experts): 2 and 8 threads give the bits
// of one thread, and the shared group's rows are the bits of the shared expert's own forward
// (matmul_multi of gate and up, swiglu, matmul of down), f32 and int8 activations, 1 and 3 tokens.
TEST(CpuBackendExpertFfn, SpoolQuantExpertsAndSharedGroupMatchOneThreadAndDenseForward) {
  const int64_t H = 256, I = 128;
  const int E = 5, K = 2;
  const std::vector<int8_t> s_gu = spool::quant::rotation_signs(1, "layers.0.mlp.experts.gate_up", H);
  const std::vector<int8_t> s_d = spool::quant::rotation_signs(1, "layers.0.mlp.experts.down", I);
  const std::vector<int8_t> s_sg = spool::quant::rotation_signs(1, "layers.0.mlp.shared_expert.gate_proj", H);
  const std::vector<int8_t> s_su = spool::quant::rotation_signs(1, "layers.0.mlp.shared_expert.up_proj", H);
  const std::vector<int8_t> s_sd = spool::quant::rotation_signs(1, "layers.0.mlp.shared_expert.down_proj", I);
  std::vector<spool::quant::QuantizedMatrix> qs;
  qs.reserve(3 * (E + 1));
  auto mat = [&](int64_t rows, int64_t cols, const std::vector<int8_t>& signs, QType t, uint64_t seed) {
    const std::vector<float> W = randn(static_cast<size_t>(rows * cols), seed, 0.05f);
    qs.push_back(spool::quant::quantize(W.data(), rows, cols, t, 64, signs.data()));
    return quant_weight_view(qs.back().view());
  };
  std::vector<ExpertMats> ex;
  for (int e = 0; e < E; ++e) {
    const QType t = e == 3 ? QType::kQ8 : QType::kQ4;  // (a q8 expert among them)
    ex.push_back({mat(I, H, s_gu, t, 100 + 3 * e), mat(I, H, s_gu, t, 101 + 3 * e), mat(H, I, s_d, t, 102 + 3 * e)});
  }
  const ExpertMats shared{mat(I, H, s_sg, QType::kQ4, 90), mat(I, H, s_su, QType::kQ4, 91), mat(H, I, s_sd, QType::kQ4, 92)};
  ThreadPool two(2), eight(8);
  for (bool int8 : {false, true})
    for (int64_t T : {1, 3}) {
      SCOPED_TRACE(std::string(int8 ? "int8" : "f32") + " T=" + std::to_string(T));
      std::vector<int> ids(static_cast<size_t>(T * K));
      for (int64_t i = 0; i < T * K; ++i) ids[i] = static_cast<int>((i * 3 + i / K) % E);
      ExpertGroups groups = group_by_expert(ids.data(), T, K, E);
      std::vector<ExpertMats> active;
      for (int e : groups.active) active.push_back(ex[e]);
      active.push_back(shared);  // the shared group: rows t * K of every token
      groups.active.push_back(E);
      groups.first.push_back(groups.first.back() + T);
      for (int64_t t = 0; t < T; ++t) groups.rows.push_back(t * K);
      const std::vector<float> x = randn(static_cast<size_t>(T * H), 7 + T);
      const CpuOptions opt{int8};
      std::vector<float> y1((T * K + T) * H, NAN), y2(y1.size(), NAN), y8(y1.size(), NAN);
      CpuBackend(nullptr, opt).expert_ffn(active, groups, 0, x.data(), H, Activation::kSwiGLU, y1.data());
      CpuBackend(&two, opt).expert_ffn(active, groups, 0, x.data(), H, Activation::kSwiGLU, y2.data());
      CpuBackend(&eight, opt).expert_ffn(active, groups, 0, x.data(), H, Activation::kSwiGLU, y8.data());
      EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0) << "2 threads differ from 1";
      EXPECT_EQ(std::memcmp(y1.data(), y8.data(), y1.size() * sizeof(float)), 0) << "8 threads differ from 1";
      std::vector<float> g(static_cast<size_t>(T * I)), u(g.size()), dense(static_cast<size_t>(T * H));
      matmul_multi({{&shared.gate, g.data()}, {&shared.up, u.data()}}, x.data(), T, &two, int8);
      swiglu(g.data(), u.data(), T * I, g.data());
      matmul(shared.down, g.data(), T, dense.data(), &two, int8);
      EXPECT_EQ(std::memcmp(dense.data(), y2.data() + T * K * H, dense.size() * sizeof(float)), 0)
          << "the shared group differs from the shared expert's own forward";
      for (float v : y2) ASSERT_TRUE(std::isfinite(v));
    }
}

}  // namespace
}  // namespace spool::ops
