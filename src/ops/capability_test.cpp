// The capability table of each backend (Backend::capabilities, host_fallback_ops) against what
// the backend really does, and strict device mode (Backend::set_strict_device). Per backend group
// as the op table (ops/backend_test.cpp): "cpu" (CpuBackend, ReferenceBackend) and, in a build with
// SPOOL_CUDA, "cuda" (CudaBackend; SKIPPED without a GPU, like the op table's CUDA cases).
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "support/backends.h"
#include "support/random.h"
#include "common/error.h"
#include "ops/cpu_backend.h"
#include "ops/reference_backend.h"
#ifdef SPOOL_HAVE_CUDA
#include "ops/cuda/cuda_backend.h"
#endif

namespace spool::ops {
namespace {

using spool::testing::randn;

class Capabilities : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
#ifdef SPOOL_HAVE_CUDA
    if (GetParam() == "cuda" && cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device on this machine: CudaBackend's capabilities are not checked here (scripts/test-cuda.sh runs it on a GPU)";
#endif
  }
};

INSTANTIATE_TEST_SUITE_P(All, Capabilities, ::testing::ValuesIn(spool::testing::backend_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

// ---- The capability table ----------------------------------------------------------------------
// Backend::capabilities() says, per op of the table, whether the backend runs it natively or
// through the generic host fallback of backend.cpp. The fallbacks count themselves
// (host_fallback_calls), so running each op that has a generic form shows what the backend really
// does; the table must agree. Strict device mode then refuses exactly the fallbacks on a device
// backend (naming the op) and a host weight staged for one call (naming the op and the weight),
// while native ops, uploaded weights and host backends are unaffected.

// One call of each op with a generic host form, on small host inputs (every backend takes host
// pointers; the attention window bites: pos0 + T > window).
struct FallbackProbe {
  std::string op;
  std::function<void(Backend&)> run;
};
std::vector<FallbackProbe> fallback_probes() {
  std::vector<FallbackProbe> p;
  p.push_back({"route_grouped_top_k", [](Backend& be) {
                 const int64_t T = 3;
                 const int E = 16, k = 4;
                 const std::vector<float> logits = randn(T * E, 41), bias = randn(E, 42, 0.3f);
                 RouterParams r;
                 r.sigmoid = true;
                 r.bias = bias.data();
                 r.n_group = 4;
                 r.topk_group = 2;
                 r.renormalize = true;
                 std::vector<int> ids(T * k);
                 std::vector<float> w(T * k);
                 be.route_grouped_top_k(logits.data(), T, E, k, r, ids.data(), w.data(), nullptr);
               }});
  // Gemma-4-style elementwise ops (generic forms: to_host, the host kernel, back).
  p.push_back({"gelu_tanh_glu", [](Backend& be) {
                 std::vector<float> g = randn(64, 51), u = randn(64, 52);
                 be.gelu_tanh_glu(g.data(), u.data(), 64, g.data());
               }});
  p.push_back({"scale", [](Backend& be) {
                 std::vector<float> x = randn(64, 53);
                 be.scale(x.data(), 64, 0.5f);
               }});
  p.push_back({"softcap", [](Backend& be) {
                 std::vector<float> x = randn(64, 54);
                 be.softcap(x.data(), 64, 30.0f);
               }});
  p.push_back({"mul_indexed", [](Backend& be) {
                 std::vector<float> w = randn(8, 55);
                 const std::vector<float> table = randn(4, 56);
                 const std::vector<int> ids = {0, 1, 2, 3, 3, 2, 1, 0};
                 be.mul_indexed(w.data(), ids.data(), table.data(), 8);
               }});
  const auto attn = [](Backend& be, const std::string& op) {
    const int n_heads = 4, n_kv = 2, hd = 32;
    const int64_t pos0 = 8, T = 3, P = pos0 + T, window = 4;
    const std::vector<float> k = randn(P * n_kv * hd, 43), v = randn(P * n_kv * hd, 44), q = randn(T * n_heads * hd, 45);
    const std::vector<float> sinks = randn(n_heads, 46);
    KvCache c;
    c.configure(KvType::kF32, n_kv, hd);
    c.reserve(P, 0);
    ReferenceBackend().kv_append(c, 0, P, k.data(), v.data());
    std::vector<float> out(q.size());
    if (op == "attention_window") be.attention_window(q.data(), T, n_heads, c, pos0, 0.2f, window, out.data());
    if (op == "attention_sinks") be.attention_sinks(q.data(), T, n_heads, c, pos0, 0.2f, window, sinks.data(), out.data());
  };
  p.push_back({"attention_window", [attn](Backend& be) { attn(be, "attention_window"); }});
  p.push_back({"attention_sinks", [attn](Backend& be) { attn(be, "attention_sinks"); }});
  p.push_back({"mla_attention", [](Backend& be) {
                 const int heads = 2, R = 32, D = 40;
                 const int64_t pos0 = 5, T = 2, N = pos0 + T;
                 const std::vector<float> lat = randn(N * D, 47), q = randn(T * heads * D, 48);
                 KvCache c;
                 c.configure(KvType::kF32, 1, D, true);
                 c.reserve(N, 0);
                 ReferenceBackend().kv_append(c, 0, N, lat.data(), lat.data());
                 std::vector<float> out(T * heads * R);
                 be.mla_attention(q.data(), T, heads, c, pos0, 0.1f, R, out.data());
               }});
  return p;
}

TEST_P(Capabilities, TableMatchesWhatTheBackendDoes) {
  std::vector<std::unique_ptr<Backend>> bes;
  if (GetParam() == "cpu") {
    bes.push_back(std::make_unique<CpuBackend>(nullptr));
    bes.push_back(std::make_unique<ReferenceBackend>());
  }
#ifdef SPOOL_HAVE_CUDA
  if (GetParam() == "cuda") bes.push_back(std::make_unique<CudaBackend>(0));
#endif
  ASSERT_FALSE(bes.empty());
  std::set<std::string> probed;
  for (const FallbackProbe& p : fallback_probes()) probed.insert(p.op);
  EXPECT_EQ(probed, std::set<std::string>(generic_host_fallback_ops().begin(), generic_host_fallback_ops().end()));
  for (std::unique_ptr<Backend>& be : bes) {
    SCOPED_TRACE(be->name());
    const std::vector<OpCapability> caps = be->capabilities();
    ASSERT_EQ(caps.size(), backend_op_names().size());
    for (size_t i = 0; i < caps.size(); ++i) {
      EXPECT_STREQ(caps[i].op, backend_op_names()[i]);
      EXPECT_EQ(caps[i].run, be->op_run(caps[i].op));
      // Only the ops with a generic form can fall back; host backends run everything natively.
      if (caps[i].run == OpRun::kHostFallback) {
        EXPECT_TRUE(probed.count(caps[i].op)) << caps[i].op;
        EXPECT_NE(be->device(), Device::kCpu) << caps[i].op;
      }
    }
    EXPECT_THROW(be->op_run("no_such_op"), Error);
    EXPECT_EQ(be->op_run("expert_ffn_routed") == OpRun::kUnavailable, be->max_routed_pairs() == 0);
    // What the backend does: a probe counts a fallback exactly when the table says so.
    for (const FallbackProbe& p : fallback_probes()) {
      SCOPED_TRACE(p.op);
      const uint64_t n0 = be->host_fallback_calls();
      p.run(*be);
      EXPECT_EQ(be->host_fallback_calls() - n0, be->op_run(p.op) == OpRun::kHostFallback ? 1u : 0u) << op_run_name(be->op_run(p.op));
    }
    // Strict device mode: the fallbacks of a device backend throw, naming the op; the rest run.
    be->set_strict_device(true);
    for (const FallbackProbe& p : fallback_probes()) {
      SCOPED_TRACE(p.op);
      if (be->device() != Device::kCpu && be->op_run(p.op) == OpRun::kHostFallback) {
        try {
          p.run(*be);
          ADD_FAILURE() << "strict device mode ran a host fallback";
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find(p.op), std::string::npos) << e.what();
        }
      } else {
        EXPECT_NO_THROW(p.run(*be));
      }
    }
    // A host weight: staged per call on a device backend (refused in strict mode, naming the op
    // and the weight), read in place on a host backend; an uploaded copy runs.
    const std::vector<float> wd = randn(4 * 8, 49), x = randn(2 * 8, 50);
    WeightView w;
    w.rows = 4;
    w.cols = 8;
    w.data = wd.data();
    w.name = "probe.weight";
    std::vector<float> y(2 * 4);
    if (be->device() != Device::kCpu) {
      try {
        be->matmul(w, x.data(), 2, y.data());
        ADD_FAILURE() << "strict device mode staged a host weight";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("probe.weight"), std::string::npos) << e.what();
      }
    }
    EXPECT_NO_THROW(be->matmul(be->upload(w), x.data(), 2, y.data()));
    be->set_strict_device(false);
    EXPECT_NO_THROW(be->matmul(w, x.data(), 2, y.data()));
  }
}

TEST(BackendOps, StrictDeviceFromEnvironment) {
  const char* old = std::getenv("SPOOL_STRICT_DEVICE");
  const std::string saved = old ? old : "";
  setenv("SPOOL_STRICT_DEVICE", "1", 1);
  EXPECT_TRUE(strict_device_from_env());
  EXPECT_TRUE(CpuBackend(nullptr).strict_device());
  setenv("SPOOL_STRICT_DEVICE", "0", 1);
  EXPECT_FALSE(strict_device_from_env());
  EXPECT_FALSE(ReferenceBackend().strict_device());
  if (old) {
    setenv("SPOOL_STRICT_DEVICE", saved.c_str(), 1);
  } else {
    unsetenv("SPOOL_STRICT_DEVICE");
  }
}

}  // namespace
}  // namespace spool::ops
