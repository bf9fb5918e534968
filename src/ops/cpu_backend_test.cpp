// CpuBackend::expert_ffn with more pool threads than experts (the decode case on a many-core host)
// splits each expert's rows over several tasks: the same bits as one task per expert and as one
// thread, for f32 and Q4_K experts (f32 and int8 activations), SwiGLU and tanh-GELU, one and several
// rows per expert.
#include "ops/cpu_backend.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "ops/ggml_q8.h"
#include "ops/weights.h"
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

}  // namespace
}  // namespace spool::ops
