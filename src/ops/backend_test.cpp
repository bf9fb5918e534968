// Backend op test (the pattern of llama.cpp's test-backend-ops): every op of ops::Backend, on
// every backend compiled in, against ReferenceBackend (plain double-precision loops), over a
// table of shapes and weight / KV types, on every SIMD target of this CPU. A new backend
// adds itself to backends() and is checked by the same table.
//
// The table runs once per backend group (the test parameter): "cpu" (CpuBackend, 1 and 3
// threads, every SIMD target) and, in a build with SPOOL_CUDA, "cuda": CudaBackend through a
// harness that copies the host inputs to the device and the results back (so the ops see device
// pointers, uploaded weights and the host parameters of the contract), and CudaBackend called
// directly with host pointers (its staging path, and weights copied per call). Tolerances are the
// table's, unchanged for CUDA: matmul / matmul_multi 1e-4 and expert_ffn 2e-4 for every weight
// type (f32, bf16, f16, q2/q3/q4/ternary, rotated or not), attention 1e-5 for f32/f16/int8 KV,
// norms and routing 1e-5, rope and elementwise 1e-6, copies exact (relative to 1 + |want|).
// Without a GPU the "cuda" cases are SKIPPED with a message (the one allowed skip).
//
// Also here: the ops every model family calls are all in the table (a counting backend runs
// each tiny fixture family and the demo model), and the reference backend itself reproduces
// the transformers goldens (so it is a trustworthy oracle).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../../tests/support/golden.h"
#include "../../tests/support/ggml_random.h"
#include "../../tests/support/random.h"
#include "common/error.h"
#include "models/model.h"
#include "models/ops_used.h"
#include "ops/cpu_backend.h"
#include "ops/ggml_blocks.h"
#include "ops/reference_backend.h"
#include "ops/workspace.h"
#ifdef SPOOL_HAVE_CUDA
#include "ops/cuda/cuda_backend.h"
#include "experts/streaming.h"
#include "experts/device_experts.h"
#endif
#include "quant/convert.h"
#include "quant/quantize.h"
#include "quant/recipe.h"
#include "models/family.h"

namespace spool::ops {
namespace {

using spool::testing::for_each_target;
using spool::testing::randn;
using spool::testing::random_ggml_blocks;

// ---- Backends under test ----------------------------------------------------------------------

struct BackendCase {
  std::string name;
  std::function<std::unique_ptr<Backend>()> make;
};

ThreadPool* shared_pool() {
  static ThreadPool pool(3);
  return &pool;
}

// Backend group under test ("cpu" or "cuda"): the parameter of BackendOpTable.
std::string& current_group() {
  static std::string g = "cpu";
  return g;
}

#ifdef SPOOL_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_harness();
#endif

std::vector<BackendCase> backends() {
#ifdef SPOOL_HAVE_CUDA
  if (current_group() == "cuda")
    return {
        {"cuda", [] { return make_cuda_harness(); }},
        {"cuda-host-pointers", [] { return std::make_unique<CudaBackend>(0); }},
    };
#endif
  return {
      {"cpu-1thread", [] { return std::make_unique<CpuBackend>(nullptr); }},
      {"cpu-3threads", [] { return std::make_unique<CpuBackend>(shared_pool()); }},
  };
}

// Ops the table below exercises. Each TEST registers its ops next to it (static data, so the
// coverage check sees them even when ctest runs every test in its own process), and
// for_each_backend refuses an op that is not registered.
std::set<std::string>& covered() {
  static std::set<std::string> s;
  return s;
}
bool covers(std::initializer_list<const char*> ops) {
  for (const char* op : ops) covered().insert(op);
  return true;
}

// Runs fn(backend, reference) for every backend and SIMD target (op must be registered).
void for_each_backend(const std::string& op, const std::function<void(Backend&, ReferenceBackend&)>& fn) {
  ASSERT_TRUE(covered().count(op)) << op << " is tested but not registered with covers()";
  if (current_group() != "cpu") {  // GPU backends: the SIMD target of the host does not matter
    for (const BackendCase& bc : backends()) {
      SCOPED_TRACE(bc.name);
      std::unique_ptr<Backend> be = bc.make();
      ReferenceBackend ref;
      fn(*be, ref);
    }
    return;
  }
  // Every SIMD target this CPU has (AVX3 here: AVX3, AVX2, SSE4, SSSE3, ...), not just the best.
  ASSERT_GE(hwy::SupportedAndGeneratedTargets().size(), 2u) << "expected several SIMD targets to test";
  for (const BackendCase& bc : backends()) {
    SCOPED_TRACE(bc.name);
    for_each_target([&](int64_t) {
      std::unique_ptr<Backend> be = bc.make();
      ReferenceBackend ref;
      fn(*be, ref);
    });
  }
}

// |got - want| <= tol * (1 + |want|) elementwise; reports the first failure.
void expect_close(const float* got, const float* want, int64_t n, double tol, const std::string& what) {
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    ASSERT_TRUE(std::isfinite(got[i]) && d <= tol * (1.0 + std::fabs(want[i])))
        << what << ": element " << i << " got " << got[i] << " want " << want[i];
  }
}

// The op table, once per backend group.
class BackendOpTable : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    current_group() = GetParam();
#ifdef SPOOL_HAVE_CUDA
    if (GetParam() == "cuda" && cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device on this machine: CudaBackend is not checked here (scripts/test-cuda.sh runs it on a GPU)";
#endif
  }
  void TearDown() override { current_group() = "cpu"; }
};

INSTANTIATE_TEST_SUITE_P(All, BackendOpTable,
                         ::testing::Values(std::string("cpu")
#ifdef SPOOL_HAVE_CUDA
                                               ,
                                           std::string("cuda")
#endif
                                               ),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// ---- Weights of every type -------------------------------------------------------------------

enum class WKind {
  kF32, kBF16, kF16, kQ4, kQ3, kQ2, kTernary, kQ4Rotated, kTernaryRotated,
  // ggml block types as stored in GGUF files (kGgml views); kGgmlQ8_0Perm adds a column permutation.
  kGgmlQ8_0, kGgmlQ4_0, kGgmlQ4_1, kGgmlQ5_0, kGgmlQ5_1, kGgmlQ2_K, kGgmlQ3_K, kGgmlQ4_K, kGgmlQ5_K, kGgmlQ6_K,
  kGgmlIQ4_NL, kGgmlIQ4_XS, kGgmlMXFP4, kGgmlQ8_0Perm,
  kMxfp4  // MXFP4 as Hugging Face stores it (gpt-oss blocks + E8M0 scales, WType::kMxfp4)
};

// The ggml type of a kGgml* kind; F32 for the others.
GgmlType ggml_of(WKind k) {
  switch (k) {
    case WKind::kGgmlQ8_0: case WKind::kGgmlQ8_0Perm: return GgmlType::Q8_0;
    case WKind::kGgmlQ4_0: return GgmlType::Q4_0;
    case WKind::kGgmlQ4_1: return GgmlType::Q4_1;
    case WKind::kGgmlQ5_0: return GgmlType::Q5_0;
    case WKind::kGgmlQ5_1: return GgmlType::Q5_1;
    case WKind::kGgmlQ2_K: return GgmlType::Q2_K;
    case WKind::kGgmlQ3_K: return GgmlType::Q3_K;
    case WKind::kGgmlQ4_K: return GgmlType::Q4_K;
    case WKind::kGgmlQ5_K: return GgmlType::Q5_K;
    case WKind::kGgmlQ6_K: return GgmlType::Q6_K;
    case WKind::kGgmlIQ4_NL: return GgmlType::IQ4_NL;
    case WKind::kGgmlIQ4_XS: return GgmlType::IQ4_XS;
    case WKind::kGgmlMXFP4: return GgmlType::MXFP4;
    default: return GgmlType::F32;
  }
}
bool is_ggml(WKind k) { return ggml_of(k) != GgmlType::F32; }
// Whether the backend group under test has kernels for kind k: CudaBackend has none for ggml
// blocks yet and refuses them with spool::Error (checked in BackendOpTable.Matmul).
bool group_runs(WKind k) { return !(is_ggml(k) && current_group() == "cuda"); }
// True when a matrix of `cols` columns can be stored in kind k (ggml blocks never straddle rows).
bool fits(WKind k, int64_t cols) {
  if (k == WKind::kMxfp4) return cols % 32 == 0;
  return !is_ggml(k) || cols % ggml_type_traits(ggml_of(k)).blck == 0;
}

const char* wkind_name(WKind k) {
  switch (k) {
    case WKind::kF32: return "f32";
    case WKind::kBF16: return "bf16";
    case WKind::kF16: return "f16";
    case WKind::kQ4: return "q4";
    case WKind::kQ3: return "q3";
    case WKind::kQ2: return "q2";
    case WKind::kTernary: return "ternary";
    case WKind::kQ4Rotated: return "q4+hadamard";
    case WKind::kTernaryRotated: return "ternary+hadamard";
    case WKind::kGgmlQ8_0Perm: return "ggml Q8_0+col_perm";
    case WKind::kMxfp4: return "mxfp4 (HF layout)";
    default: return ggml_type_traits(ggml_of(k)).name;
  }
}

const std::vector<WKind> kAllKinds = {WKind::kF32, WKind::kBF16, WKind::kF16, WKind::kQ4, WKind::kQ3,
                                      WKind::kQ2, WKind::kTernary, WKind::kQ4Rotated, WKind::kTernaryRotated,
                                      WKind::kGgmlQ8_0, WKind::kGgmlQ4_0, WKind::kGgmlQ4_1, WKind::kGgmlQ5_0,
                                      WKind::kGgmlQ5_1, WKind::kGgmlQ2_K, WKind::kGgmlQ3_K, WKind::kGgmlQ4_K,
                                      WKind::kGgmlQ5_K, WKind::kGgmlQ6_K, WKind::kGgmlIQ4_NL, WKind::kGgmlIQ4_XS,
                                      WKind::kGgmlMXFP4, WKind::kGgmlQ8_0Perm, WKind::kMxfp4};


// A matrix of one kind owning its storage; view() is what the kernels see.
struct TestWeight {
  WKind kind;
  int64_t rows, cols;
  std::vector<uint8_t> raw;
  quant::QuantizedMatrix q;
  std::vector<int8_t> signs;
  std::vector<int32_t> perm;  // kGgmlQ8_0Perm: a random column permutation

  TestWeight(WKind k, int64_t r, int64_t c, uint64_t seed, const std::vector<int8_t>* shared_signs = nullptr)
      : kind(k), rows(r), cols(c) {
    if (k == WKind::kMxfp4) {  // random codes, then [rows, cols/32] E8M0 scales 2^-6 .. 2^-4 (rms ~0.1)
      std::mt19937_64 g(seed);
      raw.resize(static_cast<size_t>(r * (c / 2) + r * (c / 32)));
      for (int64_t i = 0; i < r * (c / 2); ++i) raw[i] = static_cast<uint8_t>(g());
      for (int64_t i = r * (c / 2); i < static_cast<int64_t>(raw.size()); ++i) raw[i] = static_cast<uint8_t>(121 + g() % 3);
      return;
    }
    if (is_ggml(k)) {
      raw = random_ggml_blocks(ggml_of(k), r, c, seed);
      if (k == WKind::kGgmlQ8_0Perm) {
        perm.resize(c);
        for (int64_t i = 0; i < c; ++i) perm[i] = static_cast<int32_t>(i);
        std::shuffle(perm.begin(), perm.end(), std::mt19937(static_cast<uint32_t>(seed)));
      }
      return;
    }
    const std::vector<float> w = randn(static_cast<size_t>(r * c), seed, 0.2f);
    auto qt = [&](quant::QType t, bool rot) {
      if (rot) {
        if (shared_signs) {
          signs = *shared_signs;
        } else {
          std::mt19937 g(static_cast<uint32_t>(seed));
          signs.resize(c);
          for (auto& s : signs) s = (g() & 1) ? 1 : -1;
        }
      }
      q = quant::quantize(w.data(), r, c, t, c % 64 == 0 ? 64 : 32, rot ? signs.data() : nullptr);
    };
    switch (k) {
      case WKind::kF32:
        raw.resize(w.size() * 4);
        std::memcpy(raw.data(), w.data(), raw.size());
        break;
      case WKind::kBF16:
      case WKind::kF16:
        raw.resize(w.size() * 2);
        for (size_t i = 0; i < w.size(); ++i) {
          const uint16_t h = k == WKind::kBF16 ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
          std::memcpy(raw.data() + 2 * i, &h, 2);
        }
        break;
      case WKind::kQ4: qt(quant::QType::kQ4, false); break;
      case WKind::kQ3: qt(quant::QType::kQ3, false); break;
      case WKind::kQ2: qt(quant::QType::kQ2, false); break;
      case WKind::kTernary: qt(quant::QType::kTernary, false); break;
      case WKind::kQ4Rotated: qt(quant::QType::kQ4, true); break;
      case WKind::kTernaryRotated: qt(quant::QType::kTernary, true); break;
      default: break;  // ggml kinds returned above
    }
  }
  TestWeight(const TestWeight&) = delete;

  WeightView view() const {
    if (kind == WKind::kMxfp4) return mxfp4_weight_view(rows, cols, raw.data(), raw.data() + rows * (cols / 2));
    if (is_ggml(kind)) {
      WeightView v = ggml_weight_view(ggml_of(kind), rows, cols, raw.data());
      v.col_perm = perm.empty() ? nullptr : perm.data();
      return v;
    }
    if (!raw.empty()) {
      const WType t = kind == WKind::kF32 ? WType::kF32 : kind == WKind::kBF16 ? WType::kBF16 : WType::kF16;
      return WeightView{t, rows, cols, raw.data()};
    }
    return quant_weight_view(q.view());
  }
};

// ---- Matrix products -------------------------------------------------------------------------

struct MatmulShape {
  int64_t rows, cols, T;
};
// (The wide ones take the CUDA q4 GEMV's register Hadamard path: one block of 1024 .. 8192 columns.)
const MatmulShape kMatmulShapes[] = {{3, 64, 1}, {17, 128, 3}, {130, 256, 70}, {64, 512, 1}, {5, 192, 9},
                                     {24, 2048, 2}, {9, 4096, 1}, {4, 8192, 3}, {6, 1024, 1}};

[[maybe_unused]] const bool kMatmulOps = covers({"matmul"});
TEST_P(BackendOpTable, Matmul) {
  for (WKind k : kAllKinds)
    for (const MatmulShape& s : kMatmulShapes) {
      if (!fits(k, s.cols)) continue;  // a K-quant (256-wide blocks) needs cols % 256 == 0
      SCOPED_TRACE(std::string(wkind_name(k)) + " " + std::to_string(s.rows) + "x" + std::to_string(s.cols) + " T=" + std::to_string(s.T));
      const TestWeight w(k, s.rows, s.cols, 7 + s.rows);
      const std::vector<float> x = randn(s.T * s.cols, 11 + s.T);
      if (!group_runs(k)) {  // refused, clearly, rather than computed wrongly
        for_each_backend("matmul", [&](Backend& be, ReferenceBackend&) {
          std::vector<float> got(s.T * s.rows);
          EXPECT_THROW(be.matmul(w.view(), x.data(), s.T, got.data()), Error);
        });
        continue;
      }
      for_each_backend("matmul", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<float> got(s.T * s.rows, NAN), want(got.size());
        be.matmul(w.view(), x.data(), s.T, got.data());
        ref.matmul(w.view(), x.data(), s.T, want.data());
        expect_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-4, "matmul");
      });
    }
}

[[maybe_unused]] const bool kMatmulMultiOps = covers({"matmul_multi"});
TEST_P(BackendOpTable, MatmulMulti) {
  for (WKind k : {WKind::kF32, WKind::kBF16, WKind::kF16, WKind::kQ4Rotated, WKind::kTernary, WKind::kGgmlQ8_0, WKind::kGgmlIQ4_NL,
                  WKind::kGgmlQ8_0Perm, WKind::kMxfp4})
    for (int64_t T : {1, 5, 33}) {
      if (!group_runs(k)) continue;
      SCOPED_TRACE(std::string(wkind_name(k)) + " T=" + std::to_string(T));
      const TestWeight a(k, 37, 128, 1), b(k, 5, 128, 2), c(k, 130, 128, 3);
      const std::vector<float> x = randn(T * 128, 4);
      for_each_backend("matmul_multi", [&](Backend& be, ReferenceBackend& ref) {
        const WeightView va = a.view(), vb = b.view(), vc = c.view();
        std::vector<float> g[3] = {std::vector<float>(T * 37), std::vector<float>(T * 5), std::vector<float>(T * 130)};
        std::vector<float> r[3] = {g[0], g[1], g[2]};
        const MatmulOut go[] = {{&va, g[0].data()}, {&vb, g[1].data()}, {&vc, g[2].data()}};
        const MatmulOut ro[] = {{&va, r[0].data()}, {&vb, r[1].data()}, {&vc, r[2].data()}};
        be.matmul_multi(go, x.data(), T);
        ref.matmul_multi(ro, x.data(), T);
        for (int i = 0; i < 3; ++i) expect_close(g[i].data(), r[i].data(), static_cast<int64_t>(g[i].size()), 1e-4, "matmul_multi");
      });
    }
}

// ---- MoE expert path -------------------------------------------------------------------------

struct MoeShape {
  int64_t T, H, I;
  int E, K;
};
const MoeShape kMoeShapes[] = {{1, 64, 32, 8, 2}, {7, 128, 64, 16, 4}, {40, 64, 96, 64, 8}, {3, 1024, 512, 4, 2}, {12, 64, 32, 16, 2}};
// Input scale of a shape: wide experts get smaller inputs, so that their outputs stay O(1) as a
// model's do (unit inputs over 1024 columns of 0.2-rms weights reach |y| ~ 500, where f32 rounding
// alone exceeds the tolerance's absolute floor near zero).
float moe_x_scale(const MoeShape& s) { return s.H > 256 ? 0.1f : 1.0f; }

// s.E experts of kind k (weights in `store`; each expert's gate and up share one sign vector, as
// spool's converter writes them), s.K distinct random experts per token (seeded by `route_seed`),
// grouped, and the active experts in group order.
struct MoeCase {
  std::vector<std::unique_ptr<TestWeight>> store;
  std::vector<ExpertMats> experts;
  std::vector<int> ids;
  ExpertGroups groups;
  std::vector<ExpertMats> active;
};
MoeCase make_moe_case(WKind k, const MoeShape& s, unsigned route_seed) {
  MoeCase c;
  c.experts.resize(s.E);
  for (int e = 0; e < s.E; ++e) {
    std::vector<int8_t> gs(s.H), ds(s.I);
    std::mt19937 g(e);
    for (auto& v : gs) v = (g() & 1) ? 1 : -1;
    for (auto& v : ds) v = (g() & 1) ? 1 : -1;
    c.store.push_back(std::make_unique<TestWeight>(k, s.I, s.H, 100 + e, &gs));
    c.store.push_back(std::make_unique<TestWeight>(k, s.I, s.H, 200 + e, &gs));
    c.store.push_back(std::make_unique<TestWeight>(k, s.H, s.I, 300 + e, &ds));
    c.experts[e] = {c.store[3 * e]->view(), c.store[3 * e + 1]->view(), c.store[3 * e + 2]->view()};
  }
  std::mt19937 g(route_seed);
  c.ids.resize(s.T * s.K);
  for (int64_t t = 0; t < s.T; ++t) {
    std::vector<int> perm(s.E);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), g);
    for (int j = 0; j < s.K; ++j) c.ids[t * s.K + j] = perm[j];
  }
  c.groups = group_by_expert(c.ids.data(), s.T, s.K, s.E);
  for (int e : c.groups.active) c.active.push_back(c.experts[e]);
  return c;
}

[[maybe_unused]] const bool kExpertFfnAndCombineOps = covers({"expert_ffn", "moe_combine"});
TEST_P(BackendOpTable, ExpertFfnAndCombine) {
  for (WKind k : {WKind::kF32, WKind::kBF16, WKind::kF16, WKind::kQ4Rotated, WKind::kQ3, WKind::kTernaryRotated,
                  WKind::kGgmlQ8_0, WKind::kGgmlQ4_1, WKind::kGgmlMXFP4})
    for (const MoeShape& s : kMoeShapes) {
      if (!group_runs(k)) continue;
      SCOPED_TRACE(std::string(wkind_name(k)) + " T=" + std::to_string(s.T) + " E=" + std::to_string(s.E));
      // Random distinct experts per token, random weights.
      const MoeCase c = make_moe_case(k, s, 5);
      const ExpertGroups& groups = c.groups;
      const std::vector<ExpertMats>& active = c.active;
      const std::vector<float> wts = randn(s.T * s.K, 6, 0.5f);
      const std::vector<float> x = randn(s.T * s.H, 7, moe_x_scale(s));
      for_each_backend("expert_ffn", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<float> y(s.T * s.K * s.H, NAN), yr(y.size(), NAN);
        // Acquired in two batches (as a small streaming cache hands them out).
        const size_t half = active.size() / 2;
        be.expert_ffn(std::span<const ExpertMats>(active.data(), half), groups, 0, x.data(), s.H, Activation::kSwiGLU, y.data());
        be.expert_ffn(std::span<const ExpertMats>(active.data() + half, active.size() - half), groups, half, x.data(), s.H,
                      Activation::kSwiGLU, y.data());
        ref.expert_ffn(active, groups, 0, x.data(), s.H, Activation::kSwiGLU, yr.data());
        expect_close(y.data(), yr.data(), static_cast<int64_t>(y.size()), 2e-4, "expert_ffn");
      });
      for_each_backend("moe_combine", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<float> yr(s.T * s.K * s.H, NAN);
        ref.expert_ffn(active, groups, 0, x.data(), s.H, Activation::kSwiGLU, yr.data());
        std::vector<float> out(s.T * s.H, NAN), outr(out.size(), NAN);
        be.moe_combine(yr.data(), groups, wts.data(), s.H, out.data());
        ref.moe_combine(yr.data(), groups, wts.data(), s.H, outr.data());
        expect_close(out.data(), outr.data(), static_cast<int64_t>(out.size()), 1e-5, "moe_combine");
      });
    }
}

// Experts whose weights live on the backend (uploaded, as VRAM-resident experts and expert slots
// are) give the same bits as the same experts read from host views: on CUDA, q4 SwiGLU experts run
// in grouped launches (jobs of at most 8 rows, host views copied up for the call) whichever memory
// holds them, with the same row arithmetic.
TEST_P(BackendOpTable, ExpertFfnUploadedEqualsHostViews) {
  for (WKind k : {WKind::kQ4, WKind::kQ4Rotated})
    for (const MoeShape& s : kMoeShapes) {
      SCOPED_TRACE(std::string(wkind_name(k)) + " T=" + std::to_string(s.T) + " E=" + std::to_string(s.E));
      const MoeCase c = make_moe_case(k, s, 9);
      const ExpertGroups& groups = c.groups;
      const std::vector<ExpertMats>& active = c.active;
      const std::vector<float> x = randn(s.T * s.H, 8, moe_x_scale(s));
      for_each_backend("expert_ffn", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<ExpertMats> up(active);
        for (ExpertMats& m : up) m = {be.upload(m.gate), be.upload(m.up), be.upload(m.down)};
        std::vector<float> yh(s.T * s.K * s.H, NAN), yu(yh.size(), NAN), yr(yh.size(), NAN);
        be.expert_ffn(active, groups, 0, x.data(), s.H, Activation::kSwiGLU, yh.data());
        be.expert_ffn(up, groups, 0, x.data(), s.H, Activation::kSwiGLU, yu.data());
        ref.expert_ffn(active, groups, 0, x.data(), s.H, Activation::kSwiGLU, yr.data());
        expect_close(yu.data(), yr.data(), static_cast<int64_t>(yu.size()), 2e-4, "expert_ffn (uploaded)");
        EXPECT_EQ(std::memcmp(yh.data(), yu.data(), yh.size() * sizeof(float)), 0) << "uploaded experts differ from host views";
      });
    }
}

// The routed expert path (Backend::expert_ffn_routed over a make_expert_table table, routing ids
// and weights in device memory) gives the bits of expert_ffn + moe_combine over the same uploaded
// experts. Backends without the path give no table; experts outside it (not q4) give none either.
[[maybe_unused]] const bool kExpertFfnRoutedOps = covers({"expert_ffn_routed", "make_expert_table", "routed_takes_shared"});
TEST_P(BackendOpTable, ExpertFfnRoutedEqualsGroupedExpertsAndCombine) {
  for (WKind k : {WKind::kQ4, WKind::kQ4Rotated})
    for (const MoeShape& s : kMoeShapes) {
      SCOPED_TRACE(std::string(wkind_name(k)) + " T=" + std::to_string(s.T) + " E=" + std::to_string(s.E));
      const MoeCase c = make_moe_case(k, s, 11);
      const std::vector<float> x = randn(s.T * s.H, 12, moe_x_scale(s)), wts = randn(s.T * s.K, 13, 0.5f);
      for_each_backend("expert_ffn_routed", [&](Backend& be, ReferenceBackend&) {
        std::vector<ExpertMats> all(c.experts);
        for (ExpertMats& m : all) m = {be.upload(m.gate), be.upload(m.up), be.upload(m.down)};
        const void* table = be.make_expert_table(all);
        if (be.max_routed_pairs() == 0) {
          EXPECT_EQ(table, nullptr);
          return;
        }
        ASSERT_NE(table, nullptr);
        // A table of experts the path does not take (f32): none.
        const MoeCase f = make_moe_case(WKind::kF32, MoeShape{1, s.H, s.I, 2, 1}, 1);
        std::vector<ExpertMats> fu(f.experts);
        for (ExpertMats& m : fu) m = {be.upload(m.gate), be.upload(m.up), be.upload(m.down)};
        EXPECT_EQ(be.make_expert_table(fu), nullptr);
        // The host-grouped path over the same experts.
        std::vector<ExpertMats> active;
        for (int e : c.groups.active) active.push_back(all[e]);
        std::vector<float> y(s.T * s.K * s.H, NAN), want(s.T * s.H, NAN), got(want.size(), NAN);
        be.expert_ffn(active, c.groups, 0, x.data(), s.H, Activation::kSwiGLU, y.data());
        be.moe_combine(y.data(), c.groups, wts.data(), s.H, want.data());
        // ids / weights in device memory.
        std::vector<float> idbits(c.ids.size());
        std::memcpy(idbits.data(), c.ids.data(), c.ids.size() * sizeof(int));
        DeviceFloats dids(be.device(), idbits.size()), dw(be.device(), wts.size());
        dids.upload(idbits.data());
        dw.upload(wts.data());
        const int* ids = reinterpret_cast<const int*>(dids.data());
        if (s.T * s.K > be.max_routed_pairs()) {
          EXPECT_THROW(be.expert_ffn_routed(table, x.data(), s.T, s.H, ids, dw.data(), s.K, got.data()), Error);
          return;
        }
        be.expert_ffn_routed(table, x.data(), s.T, s.H, ids, dw.data(), s.K, got.data());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "routed path differs from expert_ffn + moe_combine";
        // A shared expert of the routed experts' shape in the same launches: the bits of its own
        // forward (matmul_multi gate and up, swiglu, matmul down), the routed output unchanged.
        // (gate and up with different rotation signs: a job taking the wrong one shows)
        const TestWeight sg(k, s.I, s.H, 501), su(k, s.I, s.H, 502), sd(k, s.H, s.I, 503);
        const ExpertMats sh = {be.upload(sg.view()), be.upload(su.view()), be.upload(sd.view())};
        const bool takes = be.routed_takes_shared(table, sh, s.T);
        EXPECT_EQ(takes, s.T <= 8) << "a q4 shared expert of the table's shape, up to 8 tokens";
        if (takes) {
          std::vector<float> g(s.T * s.I), u(g.size()), own(s.T * s.H, NAN), fused(own.size(), NAN), got2(want.size(), NAN);
          const MatmulOut gu[] = {{&sh.gate, g.data()}, {&sh.up, u.data()}};
          be.matmul_multi(gu, x.data(), s.T);
          be.swiglu(g.data(), u.data(), s.T * s.I, g.data());
          be.matmul(sh.down, g.data(), s.T, own.data());
          be.expert_ffn_routed(table, x.data(), s.T, s.H, ids, dw.data(), s.K, got2.data(), &sh, fused.data());
          EXPECT_EQ(std::memcmp(got2.data(), want.data(), got2.size() * sizeof(float)), 0) << "routed output changed by the shared expert";
          EXPECT_EQ(std::memcmp(fused.data(), own.data(), own.size() * sizeof(float)), 0) << "shared expert in the routed launches differs";
          const ExpertMats wide = {be.upload(c.experts[0].down), be.upload(c.experts[0].down), be.upload(c.experts[0].gate)};
          EXPECT_FALSE(be.routed_takes_shared(table, wide, s.T)) << "a shared expert of another shape";
          EXPECT_THROW(be.expert_ffn_routed(table, x.data(), s.T, s.H, ids, dw.data(), s.K, got2.data(), &wide, fused.data()), Error);
        }
        EXPECT_THROW(be.expert_ffn_routed(table, x.data(), s.T, s.H, c.ids.data(), dw.data(), s.K, got.data()), Error) << "host ids";
      });
    }
}

// gpt-oss experts (Activation::kClampedSwiGLU): one fused gate_up [2I, H] with interleaved
// gate/up rows, biases on gate_up and down, float and MXFP4 weights. The reference's
// pre-activations are checked to reach the clamp (|u| > 7) so that the clamps are exercised.
TEST_P(BackendOpTable, ExpertFfnClampedSwiGLU) {
  for (WKind k : {WKind::kF32, WKind::kBF16, WKind::kMxfp4, WKind::kGgmlQ8_0})
    for (const MoeShape& s : kMoeShapes) {
      if (!group_runs(k)) continue;
      SCOPED_TRACE(std::string(wkind_name(k)) + " T=" + std::to_string(s.T) + " E=" + std::to_string(s.E));
      std::vector<std::unique_ptr<TestWeight>> store;
      std::vector<ExpertMats> experts(s.E);
      const std::vector<float> gub = randn(s.E * 2 * s.I, 8, 3.0f), db = randn(s.E * s.H, 9, 0.5f);
      for (int e = 0; e < s.E; ++e) {
        store.push_back(std::make_unique<TestWeight>(k, 2 * s.I, s.H, 400 + e));
        store.push_back(std::make_unique<TestWeight>(k, s.H, s.I, 500 + e));
        experts[e].gate = store[2 * e]->view();
        experts[e].down = store[2 * e + 1]->view();
        experts[e].gate_bias = gub.data() + e * 2 * s.I;
        experts[e].down_bias = db.data() + e * s.H;
      }
      std::mt19937 g(5);
      std::vector<int> ids(s.T * s.K);
      for (int64_t t = 0; t < s.T; ++t) {
        std::vector<int> perm(s.E);
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), g);
        for (int j = 0; j < s.K; ++j) ids[t * s.K + j] = perm[j];
      }
      const std::vector<float> x = randn(s.T * s.H, 7, 3.0f);
      const ExpertGroups groups = group_by_expert(ids.data(), s.T, s.K, s.E);
      std::vector<ExpertMats> active;
      for (int e : groups.active) active.push_back(experts[e]);
      {  // the clamps are reached
        std::vector<float> u(2 * s.I);
        ReferenceBackend ref;
        ref.matmul(active[0].gate, x.data() + (groups.rows[0] / s.K) * s.H, 1, u.data());
        float mx = 0, mn = 0;
        for (int64_t i = 0; i < 2 * s.I; ++i) {
          const float v = u[i] + active[0].gate_bias[i];
          mx = std::max(mx, v);
          mn = std::min(mn, v);
        }
        EXPECT_GT(mx, 7.0f);
        EXPECT_LT(mn, -7.0f);
      }
      for_each_backend("expert_ffn", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<float> y(s.T * s.K * s.H, NAN), yr(y.size(), NAN);
        const size_t half = active.size() / 2;
        // The biases where this backend reads them (device memory on a GPU), as the model binds them.
        const float* gub_be = be.upload_floats(gub);
        const float* db_be = be.upload_floats(db);
        std::vector<ExpertMats> on_be = active;
        for (size_t j = 0; j < on_be.size(); ++j) {
          on_be[j].gate_bias = gub_be + (active[j].gate_bias - gub.data());
          on_be[j].down_bias = db_be + (active[j].down_bias - db.data());
        }
        be.expert_ffn(std::span<const ExpertMats>(on_be.data(), half), groups, 0, x.data(), s.H, Activation::kClampedSwiGLU, y.data());
        be.expert_ffn(std::span<const ExpertMats>(on_be.data() + half, on_be.size() - half), groups, half, x.data(), s.H,
                      Activation::kClampedSwiGLU, y.data());
        ref.expert_ffn(active, groups, 0, x.data(), s.H, Activation::kClampedSwiGLU, yr.data());
        expect_close(y.data(), yr.data(), static_cast<int64_t>(y.size()), 2e-4, "expert_ffn (clamped SwiGLU)");
      });
    }
}

// The scalar reference of the clamped SwiGLU against a hand computation of one expert row:
// interleaved gate (even) / up (odd), min(gate, 7), clamp(up, -7, 7), (up + 1) * g * sigmoid(1.702 g).
TEST(BackendOps, ClampedSwiGLUReferenceByHand) {
  // gate_up rows (I = 2): u = W x + b with W = identity rows on a 4-wide x, biases zero.
  const float w[4 * 4] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
  const float down[2 * 2] = {1, 0, 0, 1};
  const float x[4] = {9.0f, -9.0f, -1.5f, 0.25f};  // gate0 9 -> 7, up0 -9 -> -7; gate1 -1.5, up1 0.25
  ExpertMats m;
  m.gate = WeightView{WType::kF32, 4, 4, w};
  m.down = WeightView{WType::kF32, 2, 2, down};
  const int ids[1] = {0};
  const ExpertGroups g = group_by_expert(ids, 1, 1, 1);
  float y[2];
  ReferenceBackend ref;
  std::vector<float> xh(x, x + 4);
  ref.expert_ffn(std::span<const ExpertMats>(&m, 1), g, 0, xh.data(), 2, Activation::kClampedSwiGLU, y);
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  EXPECT_NEAR(y[0], (-7.0 + 1.0) * 7.0 * sig(1.702 * 7.0), 1e-5);
  EXPECT_NEAR(y[1], (0.25 + 1.0) * -1.5 * sig(1.702 * -1.5), 1e-6);
}

// tanh-GELU experts (Activation::kGeluTanhGLU, HF Gemma4TextExperts): separate gate / up like
// SwiGLU, gelu_tanh(gate) * up; every backend (CUDA: k_gelu_tanh_glu after its generic
// gate / up products) against the reference's double arithmetic.
TEST_P(BackendOpTable, ExpertFfnGeluTanh) {
  for (const MoeShape& s : kMoeShapes) {
    SCOPED_TRACE("T=" + std::to_string(s.T) + " E=" + std::to_string(s.E));
    const MoeCase c = make_moe_case(WKind::kF32, s, 5);
    const std::vector<float> x = randn(s.T * s.H, 7, moe_x_scale(s));
    for_each_backend("expert_ffn", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> y(s.T * s.K * s.H, NAN), yr(y.size(), NAN), ys(y.size(), NAN);
      be.expert_ffn(c.active, c.groups, 0, x.data(), s.H, Activation::kGeluTanhGLU, y.data());
      ref.expert_ffn(c.active, c.groups, 0, x.data(), s.H, Activation::kGeluTanhGLU, yr.data());
      expect_close(y.data(), yr.data(), static_cast<int64_t>(y.size()), 2e-4, "expert_ffn (tanh GELU)");
      ref.expert_ffn(c.active, c.groups, 0, x.data(), s.H, Activation::kSwiGLU, ys.data());
      double diff = 0;  // the activation matters: SwiGLU gives other rows
      for (size_t i = 0; i < y.size(); ++i) diff = std::max(diff, std::fabs(static_cast<double>(y[i]) - ys[i]));
      EXPECT_GT(diff, 1e-3);
    });
  }
}

// The Gemma 4 elementwise ops against their definitions in double: gelu_tanh_glu
// (0.5 g (1 + tanh(sqrt(2/pi)(g + 0.044715 g^3))) u), scale, softcap (c tanh(x / c)) and
// mul_indexed (w[i] * table[ids[i]]).
[[maybe_unused]] const bool kGemmaElementwiseOps = covers({"gelu_tanh_glu", "scale", "softcap", "mul_indexed"});
TEST_P(BackendOpTable, GemmaElementwise) {
  const int64_t n = 257;
  const std::vector<float> x = randn(n, 11, 6.0f), y = randn(n, 12, 2.0f);
  for_each_backend("gelu_tanh_glu", [&](Backend& be, ReferenceBackend&) {
    std::vector<float> a = x;
    be.gelu_tanh_glu(a.data(), y.data(), n, a.data());  // in place, as the MLP calls it
    for (int64_t i = 0; i < n; ++i) {
      const double g = x[i];
      const double want = 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) * y[i];
      ASSERT_NEAR(a[i], want, 1e-5 * (1.0 + std::fabs(want))) << i;
    }
  });
  for_each_backend("scale", [&](Backend& be, ReferenceBackend&) {
    std::vector<float> a = x;
    be.scale(a.data(), n, 0.375f);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a[i], x[i] * 0.375f) << i;
  });
  for_each_backend("softcap", [&](Backend& be, ReferenceBackend&) {
    std::vector<float> a = x;
    be.softcap(a.data(), n, 3.0f);
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(a[i], 3.0 * std::tanh(x[i] / 3.0), 1e-6) << i;
  });
  for_each_backend("mul_indexed", [&](Backend& be, ReferenceBackend&) {
    const std::vector<float> table = {0.5f, 2.0f, -1.0f, 3.0f};
    std::vector<int> ids(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int>((i * 7) % 4);
    std::vector<float> a = x;
    be.mul_indexed(a.data(), ids.data(), table.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a[i], x[i] * table[ids[i]]) << i;
  });
}

TEST(BackendOps, GroupByExpert) {
  const int ids[] = {3, 1, 1, 0, 3, 2};  // T = 3, K = 2
  const ExpertGroups g = group_by_expert(ids, 3, 2, 4);
  EXPECT_EQ(g.active, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(g.first, (std::vector<int64_t>{0, 1, 3, 4, 6}));
  EXPECT_EQ(g.rows, (std::vector<int64_t>{3, 1, 2, 5, 0, 4}));
  for (int64_t r = 0; r < 6; ++r) EXPECT_EQ(g.rows[g.row_of[r]], r);
  const int bad[] = {0, 4};
  EXPECT_THROW(group_by_expert(bad, 1, 2, 4), spool::Error);
}

[[maybe_unused]] const bool kRouteSoftmaxTopKOps = covers({"route_softmax_top_k"});
TEST_P(BackendOpTable, RouteSoftmaxTopK) {
  for (int E : {8, 64, 256})
    for (int k : {1, 2, 8})
      for (bool renorm : {false, true}) {
        SCOPED_TRACE("E=" + std::to_string(E) + " k=" + std::to_string(k) + " renorm=" + std::to_string(renorm));
        const int64_t T = 9;
        const std::vector<float> logits = randn(T * E, E + k, 2.0f);
        for_each_backend("route_softmax_top_k", [&](Backend& be, ReferenceBackend& ref) {
          std::vector<float> l1 = logits, l2 = logits, w1(T * k), w2(T * k), m1(T), m2(T);
          std::vector<int> i1(T * k), i2(T * k);
          be.route_softmax_top_k(l1.data(), T, E, k, renorm, i1.data(), w1.data(), m1.data());
          ref.route_softmax_top_k(l2.data(), T, E, k, renorm, i2.data(), w2.data(), m2.data());
          EXPECT_EQ(i1, i2);
          expect_close(w1.data(), w2.data(), T * k, 1e-5, "routing weights");
          expect_close(m1.data(), m2.data(), T, 1e-5, "routing margins");
        });
      }
}

// ---- Attention -------------------------------------------------------------------------------

struct AttnShape {
  int n_heads, n_kv, hd;
  int64_t pos0, T;
};
const AttnShape kAttnShapes[] = {{4, 2, 32, 0, 1}, {4, 2, 32, 0, 40}, {8, 1, 64, 13, 7}, {2, 2, 128, 300, 1}, {6, 3, 64, 5, 33}};

[[maybe_unused]] const bool kKvAppendAndAttentionOps = covers({"kv_append", "attention"});
TEST_P(BackendOpTable, KvAppendAndAttention) {
  for (KvType kt : {KvType::kF32, KvType::kF16, KvType::kI8})
    for (const AttnShape& s : kAttnShapes) {
      SCOPED_TRACE("kv=" + std::to_string(static_cast<int>(kt)) + " heads=" + std::to_string(s.n_heads) + "/" +
                   std::to_string(s.n_kv) + " hd=" + std::to_string(s.hd) + " pos0=" + std::to_string(s.pos0) + " T=" + std::to_string(s.T));
      const int64_t P = s.pos0 + s.T, kvw = static_cast<int64_t>(s.n_kv) * s.hd;
      const std::vector<float> k = randn(P * kvw, 1), v = randn(P * kvw, 2), q = randn(s.T * s.n_heads * s.hd, 3);
      const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
      for_each_backend("kv_append", [&](Backend& be, ReferenceBackend& ref) {
        KvCache c1, c2;
        c1.configure(kt, s.n_kv, s.hd);
        c2.configure(kt, s.n_kv, s.hd);
        c1.reserve(P, 0);
        c2.reserve(P, 0);
        // Earlier positions in one call, the new chunk in another (prefill then next chunk).
        be.kv_append(c1, 0, s.pos0, k.data(), v.data());
        be.kv_append(c1, s.pos0, s.T, k.data() + s.pos0 * kvw, v.data() + s.pos0 * kvw);
        ref.kv_append(c2, 0, P, k.data(), v.data());
        // A GPU backend leaves the rows in its mirror (deferred: no host round trip).
        if (be.device() != Device::kCpu) {
          EXPECT_TRUE(c1.has_deferred()) << "kv_append brought the rows to the host";
        }
        // Attention over the appended cache (a device backend reads what its kv_append wrote).
        std::vector<float> got(q.size(), NAN), want(q.size(), NAN);
        be.attention(q.data(), s.T, s.n_heads, c1, s.pos0, scale, got.data());
        ref.attention(q.data(), s.T, s.n_heads, c2, s.pos0, scale, want.data());
        expect_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "attention after kv_append");
        if (be.device() != Device::kCpu) {
          EXPECT_TRUE(c1.has_deferred()) << "attention brought the deferred rows to the host";
        }
        // The host then reads the bytes KvCache::write stores (the device's f16 / int8 rounding).
        std::string img1, img2;
        c1.save_prefix(P, img1);
        c2.save_prefix(P, img2);
        EXPECT_TRUE(img1 == img2) << "stored KV bytes differ from KvCache::write's";
        const double store_tol = kt == KvType::kF32 ? 0 : kt == KvType::kF16 ? 1e-3 : 2e-2;
        for (int h = 0; h < s.n_kv; ++h)
          for (int64_t p = 0; p < P; ++p)
            for (int d = 0; d < s.hd; d += 7) {
              ASSERT_EQ(c1.key(h, p, d), c2.key(h, p, d));
              ASSERT_NEAR(c1.key(h, p, d), k[p * kvw + h * s.hd + d], store_tol * (1 + std::fabs(k[p * kvw + h * s.hd + d])) * 4);
              ASSERT_EQ(c1.value(h, p, d), c2.value(h, p, d));
            }
      });
      for_each_backend("attention", [&](Backend& be, ReferenceBackend& ref) {
        KvCache c1, c2;
        c1.configure(kt, s.n_kv, s.hd);
        c2.configure(kt, s.n_kv, s.hd);
        c1.reserve(P, 0);
        c2.reserve(P, 0);
        ref.kv_append(c1, 0, P, k.data(), v.data());
        ref.kv_append(c2, 0, P, k.data(), v.data());
        std::vector<float> got(q.size(), NAN), want(q.size(), NAN);
        be.attention(q.data(), s.T, s.n_heads, c1, s.pos0, scale, got.data());
        ref.attention(q.data(), s.T, s.n_heads, c2, s.pos0, scale, want.data());
        expect_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "attention");
      });
    }
}

// DeepSeek routers: V3 (sigmoid + bias, groups by top-2 sum), Kimi-K2 (sigmoid + bias, one
// group), V2 (softmax, greedy or groups by max), with and without renormalisation and scaling.
// Each backend's own op and the generic Backend implementation (the one a GPU backend inherits).
[[maybe_unused]] const bool kRouteGroupedOps = covers({"route_grouped_top_k"});
TEST_P(BackendOpTable, RouteGroupedTopK) {
  struct C {
    int E, k, groups, topk_groups;
    bool sigmoid, top2, renorm;
    float scaling;
    bool neg_inf = false;  // GLM: dropped groups at -inf; the bias is shifted so that most s' < 0
  };
  for (const C& c : {C{16, 4, 4, 2, true, true, true, 2.5f}, C{256, 8, 8, 4, true, true, true, 2.5f}, C{24, 6, 1, 1, true, true, true, 2.827f},
                     C{16, 4, 1, 1, false, false, false, 1.0f}, C{160, 6, 8, 3, false, false, false, 16.0f},
                     C{64, 6, 1, 1, false, false, true, 1.0f}, C{16, 4, 2, 1, true, true, true, 2.5f, true}}) {
    SCOPED_TRACE("E=" + std::to_string(c.E) + " k=" + std::to_string(c.k) + " groups=" + std::to_string(c.groups) + "/" +
                 std::to_string(c.topk_groups) + " sigmoid=" + std::to_string(c.sigmoid));
    const int64_t T = 11;
    const std::vector<float> logits = randn(T * c.E, c.E + c.k, 2.0f);
    std::vector<float> bias = randn(c.E, 7, 0.3f);
    if (c.neg_inf)
      for (float& b : bias) b -= 0.8f;
    RouterParams r;
    r.mask_neg_inf = c.neg_inf;
    r.sigmoid = c.sigmoid;
    r.bias = c.sigmoid ? bias.data() : nullptr;
    r.n_group = c.groups;
    r.topk_group = c.topk_groups;
    r.group_top2_sum = c.top2;
    r.renormalize = c.renorm;
    r.scaling = c.scaling;
    for_each_backend("route_grouped_top_k", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> w1(T * c.k), w2(T * c.k), w3(T * c.k), m1(T), m2(T), m3(T);
      std::vector<int> i1(T * c.k), i2(T * c.k), i3(T * c.k);
      be.route_grouped_top_k(logits.data(), T, c.E, c.k, r, i1.data(), w1.data(), m1.data());
      be.Backend::route_grouped_top_k(logits.data(), T, c.E, c.k, r, i3.data(), w3.data(), m3.data());
      ref.route_grouped_top_k(logits.data(), T, c.E, c.k, r, i2.data(), w2.data(), m2.data());
      EXPECT_EQ(i1, i2);
      EXPECT_EQ(i3, i2);
      expect_close(w1.data(), w2.data(), T * c.k, 1e-5, "grouped routing weights");
      expect_close(w3.data(), w2.data(), T * c.k, 1e-5, "grouped routing weights (generic)");
      expect_close(m1.data(), m2.data(), T, 1e-5, "grouped routing margins");
      if (c.groups > 1)  // group-limited: every chosen expert lies in one of topk_groups groups
        for (int64_t t = 0; t < T; ++t) {
          std::set<int> gs;
          for (int j = 0; j < c.k; ++j) gs.insert(i1[t * c.k + j] / (c.E / c.groups));
          EXPECT_LE(static_cast<int>(gs.size()), c.topk_groups);
        }
    });
  }
}

// A cache bounded by `window` (KvCache::configure) filled with positions [0, pos0 + T) of k, v
// by `be`: [0, pos0) appended in chunks of 3, then [pos0, pos0 + T) in one, each after the
// reserve() a forward makes (so its rows have moved once the positions pass the window).
KvCache windowed_cache(Backend& be, KvType kt, const AttnShape& s, int64_t window, const std::vector<float>& k,
                       const std::vector<float>& v) {
  const int64_t kvw = static_cast<int64_t>(s.n_kv) * s.hd;
  KvCache c;
  c.configure(kt, s.n_kv, s.hd, false, window);
  for (int64_t p = 0; p < s.pos0; p += 3) {
    const int64_t n = std::min<int64_t>(3, s.pos0 - p);
    c.reserve(p + n, p);
    be.kv_append(c, p, n, k.data() + p * kvw, v.data() + p * kvw);
  }
  c.reserve(s.pos0 + s.T, s.pos0);
  be.kv_append(c, s.pos0, s.T, k.data() + s.pos0 * kvw, v.data() + s.pos0 * kvw);
  return c;
}

// Sliding-window attention (Mixtral): windows shorter than, equal to and longer than the
// positions, on every KV type; the generic implementation too; and over a cache bounded by the
// window (only its last rows held, moved to the front) the same results.
[[maybe_unused]] const bool kAttentionWindowOps = covers({"attention_window"});
TEST_P(BackendOpTable, AttentionWindow) {
  for (KvType kt : {KvType::kF32, KvType::kF16, KvType::kI8})
    for (const AttnShape& s : kAttnShapes)
      for (int64_t window : {1, 4, 37, 1000}) {
        SCOPED_TRACE("kv=" + std::to_string(static_cast<int>(kt)) + " heads=" + std::to_string(s.n_heads) + " pos0=" +
                     std::to_string(s.pos0) + " T=" + std::to_string(s.T) + " window=" + std::to_string(window));
        const int64_t P = s.pos0 + s.T, kvw = static_cast<int64_t>(s.n_kv) * s.hd;
        const std::vector<float> k = randn(P * kvw, 1), v = randn(P * kvw, 2), q = randn(s.T * s.n_heads * s.hd, 3);
        const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
        for_each_backend("attention_window", [&](Backend& be, ReferenceBackend& ref) {
          KvCache c;
          c.configure(kt, s.n_kv, s.hd);
          c.reserve(P, 0);
          ref.kv_append(c, 0, P, k.data(), v.data());
          std::vector<float> got(q.size(), NAN), gen(q.size(), NAN), want(q.size(), NAN);
          be.attention_window(q.data(), s.T, s.n_heads, c, s.pos0, scale, window, got.data());
          be.Backend::attention_window(q.data(), s.T, s.n_heads, c, s.pos0, scale, window, gen.data());
          ref.attention_window(q.data(), s.T, s.n_heads, c, s.pos0, scale, window, want.data());
          expect_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "attention_window");
          expect_close(gen.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "attention_window (generic)");
          if (window >= P) {  // no masking: the plain op
            std::vector<float> full(q.size(), NAN);
            ref.attention(q.data(), s.T, s.n_heads, c, s.pos0, scale, full.data());
            expect_close(got.data(), full.data(), static_cast<int64_t>(got.size()), 1e-5, "window past the positions");
          }
          const KvCache w = windowed_cache(be, kt, s, window, k, v);
          EXPECT_LE(w.capacity(), KvCache::window_rows(window, std::max<int64_t>(3, s.T)));
          std::vector<float> bounded(q.size(), NAN), bounded_ref(q.size(), NAN);
          be.attention_window(q.data(), s.T, s.n_heads, w, s.pos0, scale, window, bounded.data());
          ref.attention_window(q.data(), s.T, s.n_heads, w, s.pos0, scale, window, bounded_ref.data());
          expect_close(bounded.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "attention_window (bounded cache)");
          expect_close(bounded_ref.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "reference (bounded cache)");
        });
      }
}

// gpt-oss attention sinks, with and without a window, every KV type: each backend's op and the
// generic one against the scalar reference; a sink of -1e30 must reduce to plain (windowed)
// attention, and a finite sink must change the result (rows then sum to less than 1).
[[maybe_unused]] const bool kAttentionSinksOps = covers({"attention_sinks"});
TEST_P(BackendOpTable, AttentionSinks) {
  for (KvType kt : {KvType::kF32, KvType::kF16, KvType::kI8})
    for (const AttnShape& s : kAttnShapes)
      for (int64_t window : {0, 4, 1000}) {
        SCOPED_TRACE("kv=" + std::to_string(static_cast<int>(kt)) + " heads=" + std::to_string(s.n_heads) + " pos0=" +
                     std::to_string(s.pos0) + " T=" + std::to_string(s.T) + " window=" + std::to_string(window));
        const int64_t P = s.pos0 + s.T, kvw = static_cast<int64_t>(s.n_kv) * s.hd;
        const std::vector<float> k = randn(P * kvw, 1), v = randn(P * kvw, 2), q = randn(s.T * s.n_heads * s.hd, 3);
        const std::vector<float> sinks = randn(s.n_heads, 4, 2.0f), none(s.n_heads, -1e30f);
        const float scale = 1.0f / std::sqrt(static_cast<float>(s.hd));
        for_each_backend("attention_sinks", [&](Backend& be, ReferenceBackend& ref) {
          KvCache c;
          c.configure(kt, s.n_kv, s.hd);
          c.reserve(P, 0);
          ref.kv_append(c, 0, P, k.data(), v.data());
          std::vector<float> got(q.size(), NAN), gen(q.size(), NAN), want(q.size(), NAN);
          be.attention_sinks(q.data(), s.T, s.n_heads, c, s.pos0, scale, window, sinks.data(), got.data());
          be.Backend::attention_sinks(q.data(), s.T, s.n_heads, c, s.pos0, scale, window, sinks.data(), gen.data());
          ref.attention_sinks(q.data(), s.T, s.n_heads, c, s.pos0, scale, window, sinks.data(), want.data());
          expect_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "attention_sinks");
          expect_close(gen.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "attention_sinks (generic)");
          std::vector<float> off(q.size(), NAN), plain(q.size(), NAN);
          be.attention_sinks(q.data(), s.T, s.n_heads, c, s.pos0, scale, window, none.data(), off.data());
          ref.attention_window(q.data(), s.T, s.n_heads, c, s.pos0, scale, window, plain.data());
          expect_close(off.data(), plain.data(), static_cast<int64_t>(off.size()), 1e-5, "sinks at -inf = no sinks");
          double diff = 0;
          for (size_t i = 0; i < got.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(got[i] - plain[i])));
          EXPECT_GT(diff, 1e-3) << "the sinks must change the result";
          if (window > 0) {  // gpt-oss's sliding layers: a cache bounded by the window
            const KvCache w = windowed_cache(be, kt, s, window, k, v);
            std::vector<float> bounded(q.size(), NAN);
            be.attention_sinks(q.data(), s.T, s.n_heads, w, s.pos0, scale, window, sinks.data(), bounded.data());
            expect_close(bounded.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "attention_sinks (bounded cache)");
          }
        });
      }
}

// Absorbed MLA attention over a keys-only latent cache (DeepSeek): latent widths of the
// fixtures (32 + 8) and of V3 (512 + 64), every KV type, prefill and decode shapes.
[[maybe_unused]] const bool kMlaAttentionOps = covers({"mla_attention"});
TEST_P(BackendOpTable, MlaAttention) {
  struct M {
    int heads, R, P;
    int64_t pos0, T;
  };
  for (KvType kt : {KvType::kF32, KvType::kF16, KvType::kI8})
    for (const M& s : {M{4, 32, 8, 0, 24}, M{4, 32, 8, 24, 1}, M{16, 512, 64, 40, 1}, M{3, 64, 16, 5, 9}}) {
      SCOPED_TRACE("kv=" + std::to_string(static_cast<int>(kt)) + " heads=" + std::to_string(s.heads) + " R=" + std::to_string(s.R) +
                   " pos0=" + std::to_string(s.pos0) + " T=" + std::to_string(s.T));
      const int D = s.R + s.P;
      const int64_t N = s.pos0 + s.T;
      const std::vector<float> lat = randn(N * D, 4), q = randn(s.T * s.heads * D, 5);
      const float scale = 0.13f;
      for_each_backend("mla_attention", [&](Backend& be, ReferenceBackend& ref) {
        KvCache c;
        c.configure(kt, 1, D, true);
        c.reserve(N, 0);
        be.kv_append(c, 0, N, lat.data(), lat.data());
        EXPECT_EQ(c.bytes_per_position(), static_cast<uint64_t>(D) * (kt == KvType::kF32 ? 4 : kt == KvType::kF16 ? 2 : 1) +
                                              (kt == KvType::kI8 ? c.groups() * 4u : 0u));
        std::vector<float> got(s.T * s.heads * s.R, NAN), gen(got.size(), NAN), want(got.size(), NAN);
        be.mla_attention(q.data(), s.T, s.heads, c, s.pos0, scale, s.R, got.data());
        be.Backend::mla_attention(q.data(), s.T, s.heads, c, s.pos0, scale, s.R, gen.data());
        ref.mla_attention(q.data(), s.T, s.heads, c, s.pos0, scale, s.R, want.data());
        expect_close(got.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "mla_attention");
        expect_close(gen.data(), want.data(), static_cast<int64_t>(got.size()), 1e-5, "mla_attention (generic)");
      });
    }
}

[[maybe_unused]] const bool kRopeOps = covers({"rope"});
TEST_P(BackendOpTable, Rope) {
  struct R {
    int rotary, hd, heads;
    int64_t T, pos0, stride_pad;
  };
  for (const R& r : {R{64, 64, 4, 3, 0, 0}, R{16, 64, 2, 5, 1000, 0}, R{128, 128, 3, 1, 262000, 0}, R{32, 64, 2, 4, 7, 64}}) {
    SCOPED_TRACE("rotary=" + std::to_string(r.rotary) + " pos0=" + std::to_string(r.pos0));
    const Rope rope(r.rotary, 1e7);
    const int64_t stride = static_cast<int64_t>(r.heads) * r.hd + r.stride_pad;
    const std::vector<float> x = randn(r.T * stride, 9);
    for_each_backend("rope", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> a = x, b = x;
      be.rope(rope, a.data(), r.T, stride, r.heads, r.hd, r.pos0);
      ref.rope(rope, b.data(), r.T, stride, r.heads, r.hd, r.pos0);
      expect_close(a.data(), b.data(), static_cast<int64_t>(a.size()), 1e-6, "rope");
    });
  }
}

// ---- Gated DeltaNet --------------------------------------------------------------------------

[[maybe_unused]] const bool kCausalConv1dSiluOps = covers({"causal_conv1d_silu"});
TEST_P(BackendOpTable, CausalConv1dSilu) {
  for (int K : {2, 4})
    for (int64_t T : {1, 5, 70}) {
      SCOPED_TRACE("K=" + std::to_string(K) + " T=" + std::to_string(T));
      const int64_t C = 48;
      const std::vector<float> x = randn(T * C, 1), w = randn(C * K, 2, 0.5f), st = randn(C * (K - 1), 3);
      for_each_backend("causal_conv1d_silu", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<float> s1 = st, s2 = st, o1(T * C, NAN), o2(T * C, NAN);
        be.causal_conv1d_silu(x.data(), T, C, w.data(), K, s1.data(), o1.data());
        ref.causal_conv1d_silu(x.data(), T, C, w.data(), K, s2.data(), o2.data());
        expect_close(o1.data(), o2.data(), T * C, 1e-5, "conv out");
        expect_close(s1.data(), s2.data(), static_cast<int64_t>(s1.size()), 0, "conv state");
      });
    }
}

[[maybe_unused]] const bool kGatedDeltaOps = covers({"gated_delta"});
TEST_P(BackendOpTable, GatedDelta) {
  struct G {
    int n_k, n_v, d_k, d_v;
    int64_t T;
    int chunk;
  };
  for (const G& c : {G{2, 4, 16, 32, 1, 64}, G{2, 4, 16, 32, 3, 64}, G{1, 2, 32, 16, 130, 64}, G{2, 2, 16, 16, 70, 16}}) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " chunk=" + std::to_string(c.chunk));
    std::vector<float> q = randn(c.T * c.n_k * c.d_k, 1), k = randn(c.T * c.n_k * c.d_k, 2);
    for (int64_t r = 0; r < c.T * c.n_k; ++r) {  // l2-normalised like the model's q and k
      for (auto* v : {&q, &k}) {
        double ss = 0;
        for (int d = 0; d < c.d_k; ++d) ss += (*v)[r * c.d_k + d] * (*v)[r * c.d_k + d];
        for (int d = 0; d < c.d_k; ++d) (*v)[r * c.d_k + d] /= static_cast<float>(std::sqrt(ss));
      }
    }
    const std::vector<float> v = randn(c.T * c.n_v * c.d_v, 3), b = randn(c.T * c.n_v, 4), gl = randn(c.T * c.n_v, 5);
    std::vector<float> beta(b.size()), g(gl.size());
    for (size_t i = 0; i < b.size(); ++i) {
      beta[i] = 1.0f / (1.0f + std::exp(-b[i]));
      g[i] = -std::fabs(gl[i]) * 0.3f;
    }
    const std::vector<float> s0 = randn(static_cast<size_t>(c.n_v) * c.d_k * c.d_v, 6, 0.1f);
    for_each_backend("gated_delta", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> s1 = s0, s2 = s0, o1(v.size(), NAN), o2(v.size(), NAN);
      GatedDeltaArgs a;
      a.T = c.T;
      a.n_k = c.n_k;
      a.n_v = c.n_v;
      a.d_k = c.d_k;
      a.d_v = c.d_v;
      a.q = q.data();
      a.k = k.data();
      a.v = v.data();
      a.beta = beta.data();
      a.g = g.data();
      a.state = s1.data();
      a.out = o1.data();
      be.gated_delta(a, c.chunk);
      a.state = s2.data();
      a.out = o2.data();
      ref.gated_delta(a, c.chunk);
      expect_close(o1.data(), o2.data(), static_cast<int64_t>(o1.size()), 1e-4, "gated delta out");
      expect_close(s1.data(), s2.data(), static_cast<int64_t>(s1.size()), 1e-4, "gated delta state");
    });
  }
}

[[maybe_unused]] const bool kGdnGatesOps = covers({"gdn_gates"});
TEST_P(BackendOpTable, GdnGates) {
  const int64_t T = 11;
  const int nv = 6;
  const std::vector<float> b = randn(T * nv, 1, 3.0f), a = randn(T * nv, 2, 8.0f), ae = randn(nv, 3), dt = randn(nv, 4);
  std::vector<float> a_exp(nv);
  for (int h = 0; h < nv; ++h) a_exp[h] = std::exp(ae[h]);
  for_each_backend("gdn_gates", [&](Backend& be, ReferenceBackend& ref) {
    std::vector<float> b1(T * nv), g1(T * nv), b2(T * nv), g2(T * nv);
    be.gdn_gates(b.data(), a.data(), a_exp.data(), dt.data(), T, nv, b1.data(), g1.data());
    ref.gdn_gates(b.data(), a.data(), a_exp.data(), dt.data(), T, nv, b2.data(), g2.data());
    expect_close(b1.data(), b2.data(), T * nv, 1e-6, "beta");
    expect_close(g1.data(), g2.data(), T * nv, 1e-6, "g");
  });
}

// ---- Norms and elementwise -------------------------------------------------------------------

[[maybe_unused]] const bool kNormsOps = covers({"rms_norm", "l2_norm", "rms_norm_gated"});
TEST_P(BackendOpTable, Norms) {
  for (int64_t n : {16, 128, 2048})
    for (int64_t rows : {1, 7}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " rows=" + std::to_string(rows));
      const std::vector<float> x = randn(rows * n, 1, 3.0f), w = randn(n, 2), z = randn(rows * n, 3);
      for_each_backend("rms_norm", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<float> a(rows * n), b(rows * n);
        be.rms_norm(x.data(), w.data(), rows, n, 1e-6f, a.data());
        ref.rms_norm(x.data(), w.data(), rows, n, 1e-6f, b.data());
        expect_close(a.data(), b.data(), rows * n, 1e-5, "rms_norm");
      });
      for (float post : {1.0f, 0.125f})
        for_each_backend("l2_norm", [&](Backend& be, ReferenceBackend& ref) {
          std::vector<float> a = x, b = x;
          be.l2_norm(a.data(), rows, n, 1e-6f, post);
          ref.l2_norm(b.data(), rows, n, 1e-6f, post);
          expect_close(a.data(), b.data(), rows * n, 1e-5, "l2_norm");
        });
      for_each_backend("rms_norm_gated", [&](Backend& be, ReferenceBackend& ref) {
        std::vector<float> a = x, b = x;
        be.rms_norm_gated(a.data(), z.data(), w.data(), rows, n, 1e-6f);
        ref.rms_norm_gated(b.data(), z.data(), w.data(), rows, n, 1e-6f);
        expect_close(a.data(), b.data(), rows * n, 1e-5, "rms_norm_gated");
      });
    }
}

[[maybe_unused]] const bool kElementwiseOps = covers({"add", "add_bias", "swiglu", "mul_sigmoid", "add_gated_rows", "copy_2d"});
TEST_P(BackendOpTable, Elementwise) {
  for (int64_t n : {1, 15, 1000}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const std::vector<float> x = randn(n, 1, 4.0f), y = randn(n, 2, 4.0f);
    for_each_backend("add", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> a = y, b = y;
      be.add(a.data(), x.data(), n);
      ref.add(b.data(), x.data(), n);
      expect_close(a.data(), b.data(), n, 1e-7, "add");
    });
    for_each_backend("swiglu", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> a = x, b(n);
      be.swiglu(a.data(), y.data(), n, a.data());  // in place, as the models call it
      ref.swiglu(x.data(), y.data(), n, b.data());
      expect_close(a.data(), b.data(), n, 1e-6, "swiglu");
    });
    for_each_backend("mul_sigmoid", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> a = x, b = x;
      be.mul_sigmoid(a.data(), y.data(), n);
      ref.mul_sigmoid(b.data(), y.data(), n);
      expect_close(a.data(), b.data(), n, 1e-6, "mul_sigmoid");
    });
  }
  for (bool gated : {false, true}) {
    const int64_t T = 5, n = 96;
    const std::vector<float> out0 = randn(T * n, 1), s = randn(T * n, 2), x = randn(T * n, 3), w = randn(n, 4, 0.1f);
    for_each_backend("add_gated_rows", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> a = out0, b = out0;
      be.add_gated_rows(a.data(), s.data(), x.data(), gated ? w.data() : nullptr, T, n);
      ref.add_gated_rows(b.data(), s.data(), x.data(), gated ? w.data() : nullptr, T, n);
      expect_close(a.data(), b.data(), T * n, 1e-6, "add_gated_rows");
    });
  }
  for (int64_t rows : {1, 7}) {  // attention q/k/v biases: rows of tokens, one bias vector
    const int64_t n = 48;
    const std::vector<float> y0 = randn(rows * n, 6, 2.0f), b = randn(n, 7);
    for_each_backend("add_bias", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> a = y0, c = y0;
      be.add_bias(a.data(), b.data(), rows, n);
      ref.add_bias(c.data(), b.data(), rows, n);
      expect_close(a.data(), c.data(), rows * n, 1e-7, "add_bias");
    });
  }
  const std::vector<float> src = randn(6 * 40, 5);
  for_each_backend("copy_2d", [&](Backend& be, ReferenceBackend& ref) {
    std::vector<float> a(6 * 16, 0.0f), b(6 * 16, 0.0f);
    be.copy_2d(a.data(), 16, src.data() + 8, 40, 6, 16);
    ref.copy_2d(b.data(), 16, src.data() + 8, 40, 6, 16);
    expect_close(a.data(), b.data(), 6 * 16, 0, "copy_2d");
  });
}

[[maybe_unused]] const bool kRowToF32AndToHostOps = covers({"row_to_f32", "to_host"});
TEST_P(BackendOpTable, RowToF32AndToHost) {
  for (WKind k : {WKind::kF32, WKind::kBF16, WKind::kF16}) {
    SCOPED_TRACE(wkind_name(k));
    const TestWeight w(k, 1, 77, 3);
    for_each_backend("row_to_f32", [&](Backend& be, ReferenceBackend& ref) {
      std::vector<float> a(77, NAN), b(77, NAN);
      be.row_to_f32(w.view().type, w.raw.data(), 77, a.data());
      ref.row_to_f32(w.view().type, w.raw.data(), 77, b.data());
      expect_close(a.data(), b.data(), 77, 0, "row_to_f32");
    });
  }
  const std::vector<float> x = randn(33, 1);
  for_each_backend("to_host", [&](Backend& be, ReferenceBackend& ref) {
    std::vector<float> a(33, NAN), b(33, NAN);
    be.to_host(x.data(), 33, a.data());
    ref.to_host(x.data(), 33, b.data());
    expect_close(a.data(), b.data(), 33, 0, "to_host");
  });
}

// ---- What the models call --------------------------------------------------------------------

// Forwards every op to CpuBackend and records its name.
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(ThreadPool* pool) : cpu_(pool) {}
  std::set<std::string> called;
  Device device() const override { return cpu_.device(); }
  const char* name() const override { return "counting"; }
  int threads() const override { return cpu_.threads(); }
#define SPOOL_FWD(op, params, args) \
  void op params override {         \
    called.insert(#op);             \
    cpu_.op args;                   \
  }
  SPOOL_FWD(matmul, (const WeightView& w, const float* x, int64_t T, float* y), (w, x, T, y))
  SPOOL_FWD(matmul_multi, (std::span<const MatmulOut> o, const float* x, int64_t T), (o, x, T))
  SPOOL_FWD(expert_ffn, (std::span<const ExpertMats> e, const ExpertGroups& g, size_t g0, const float* x, int64_t H, Activation a, float* y),
            (e, g, g0, x, H, a, y))
  SPOOL_FWD(moe_combine, (const float* y, const ExpertGroups& g, const float* w, int64_t H, float* out), (y, g, w, H, out))
  SPOOL_FWD(route_softmax_top_k, (float* l, int64_t T, int E, int k, bool r, int* ids, float* w, float* m), (l, T, E, k, r, ids, w, m))
  SPOOL_FWD(kv_append, (KvCache& c, int64_t p, int64_t T, const float* k, const float* v), (c, p, T, k, v))
  SPOOL_FWD(attention, (const float* q, int64_t T, int nh, const KvCache& kv, int64_t p, float s, float* o), (q, T, nh, kv, p, s, o))
  SPOOL_FWD(rope, (const Rope& r, float* x, int64_t T, int64_t st, int nh, int hd, int64_t p), (r, x, T, st, nh, hd, p))
  SPOOL_FWD(route_grouped_top_k, (const float* l, int64_t T, int E, int k, const RouterParams& r, int* ids, float* w, float* m),
            (l, T, E, k, r, ids, w, m))
  SPOOL_FWD(attention_window, (const float* q, int64_t T, int nh, const KvCache& kv, int64_t p, float s, int64_t win, float* o),
            (q, T, nh, kv, p, s, win, o))
  SPOOL_FWD(mla_attention, (const float* q, int64_t T, int nh, const KvCache& kv, int64_t p, float s, int dv, float* o),
            (q, T, nh, kv, p, s, dv, o))
  SPOOL_FWD(attention_sinks,
            (const float* q, int64_t T, int nh, const KvCache& kv, int64_t p, float s, int64_t win, const float* sk, float* o),
            (q, T, nh, kv, p, s, win, sk, o))
  SPOOL_FWD(causal_conv1d_silu, (const float* x, int64_t T, int64_t C, const float* w, int K, float* s, float* o), (x, T, C, w, K, s, o))
  SPOOL_FWD(gated_delta, (const GatedDeltaArgs& a, int c), (a, c))
  SPOOL_FWD(gdn_gates, (const float* b, const float* a, const float* ae, const float* dt, int64_t T, int nv, float* be, float* g),
            (b, a, ae, dt, T, nv, be, g))
  SPOOL_FWD(rms_norm, (const float* x, const float* w, int64_t r, int64_t n, float e, float* y), (x, w, r, n, e, y))
  SPOOL_FWD(l2_norm, (float* x, int64_t r, int64_t n, float e, float p), (x, r, n, e, p))
  SPOOL_FWD(rms_norm_gated, (float* x, const float* z, const float* w, int64_t r, int64_t n, float e), (x, z, w, r, n, e))
  SPOOL_FWD(add, (float* y, const float* x, int64_t n), (y, x, n))
  SPOOL_FWD(add_bias, (float* y, const float* b, int64_t r, int64_t n), (y, b, r, n))
  SPOOL_FWD(swiglu, (const float* g, const float* u, int64_t n, float* o), (g, u, n, o))
  SPOOL_FWD(mul_sigmoid, (float* x, const float* g, int64_t n), (x, g, n))
  SPOOL_FWD(gelu_tanh_glu, (const float* g, const float* u, int64_t n, float* o), (g, u, n, o))
  SPOOL_FWD(scale, (float* x, int64_t n, float a), (x, n, a))
  SPOOL_FWD(softcap, (float* x, int64_t n, float c), (x, n, c))
  SPOOL_FWD(mul_indexed, (float* w, const int* ids, const float* t, int64_t n), (w, ids, t, n))
  SPOOL_FWD(add_gated_rows, (float* o, const float* s, const float* x, const float* w, int64_t T, int64_t n), (o, s, x, w, T, n))
  SPOOL_FWD(copy_2d, (float* d, int64_t ld, const float* s, int64_t ls, int64_t r, int64_t c), (d, ld, s, ls, r, c))
  SPOOL_FWD(row_to_f32, (WType t, const void* s, int64_t n, float* d), (t, s, n, d))
  SPOOL_FWD(to_host, (const float* s, int64_t n, float* d), (s, n, d))
#undef SPOOL_FWD

 private:
  CpuBackend cpu_;
};

const char* const kFamilies[] = {"qwen3_moe", "qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe_vl_fused", "mixtral", "olmoe",
                                 "deepseek_v3", "deepseek_v3_kimi", "deepseek_v2_lite", "glm4_moe", "glm4_moe_lite", "minimax_m2",
                                 "glm4_moe_qknorm", "glm4_moe_lite_v24", "minimax_m2_top6", "gpt_oss", "gpt_oss_mxfp4",
                                 "ernie4_5_moe", "gemma4_text_moe"};

// The capability table (Backend::capabilities, checked per backend in capability_test.cpp) names
// exactly the ops of this table.
TEST(BackendOps, CapabilityTableNamesTheOpTable) {
  std::set<std::string> names(backend_op_names().begin(), backend_op_names().end());
  EXPECT_EQ(names.size(), backend_op_names().size());
  for (const std::string& op : names) EXPECT_TRUE(covered().count(op)) << op << ": in the capability table but not in the op table";
  for (const std::string& op : covered()) {
    if (op == "make_expert_table" || op == "routed_takes_shared") continue;  // (bookkeeping of expert_ffn_routed)
    EXPECT_TRUE(names.count(op)) << op << ": in the op table but not in the capability table";
  }
}

// covered() is filled during static initialisation, so the order of tests does not matter.
TEST(BackendOps, TableCoversEveryOpTheModelsCall) {
  std::set<std::string> called;
  auto run = [&](const std::string& dir) {
    auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
    auto be = std::make_shared<CountingBackend>(nullptr);
    auto model = models::load_model(ckpt, be);
    models::State st = model->new_state();
    std::vector<float> logits(model->spec().vocab_size);
    const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
    model->forward(prompt, st, models::LogitsMode::kLast, logits.data());  // prefill (chunked forms)
    const int32_t next = 6;
    model->forward(std::span<const int32_t>(&next, 1), st, models::LogitsMode::kLast, logits.data());  // decode
    called.insert(be->called.begin(), be->called.end());
  };
  for (const char* f : kFamilies) run(spool::testing::data_dir() + "/models/" + f);
  run(SPOOL_DEFAULT_MODEL_DIR);
  for (const std::string& op : called) EXPECT_TRUE(covered().count(op)) << "op '" << op << "' is called by a model but not in the op table";
  EXPECT_GE(called.size(), 15u);  // the counting backend saw the models' ops
}

// models::optional_ops_used(spec) names exactly the optional ops (those with a generic host form)
// each fixture family and the demo model call (a prefill and a decode step on the counting
// backend), and a sliding window shows up once set (no fixture has one without sinks).
TEST(BackendOps, OptionalOpsUsedMatchTheModelsCalls) {
  const std::set<std::string> optional(generic_host_fallback_ops().begin(), generic_host_fallback_ops().end());
  auto check = [&](const std::string& dir) {
    SCOPED_TRACE(dir);
    auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
    auto be = std::make_shared<CountingBackend>(nullptr);
    auto model = models::load_model(ckpt, be);
    models::State st = model->new_state();
    std::vector<float> logits(model->spec().vocab_size);
    const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // past the gpt-oss fixtures' window of 8
    model->forward(prompt, st, models::LogitsMode::kLast, logits.data());
    const int32_t next = 6;
    model->forward(std::span<const int32_t>(&next, 1), st, models::LogitsMode::kLast, logits.data());
    std::vector<std::string> called;
    for (const char* op : generic_host_fallback_ops())
      if (be->called.count(op)) called.push_back(op);
    const std::vector<std::string> said = models::optional_ops_used(model->spec());
    EXPECT_EQ(said, called);
    std::string line;
    for (const std::string& op : said) line += " " + op;
    std::printf("[ optional ops ] %-22s%s\n", model->spec().family.c_str(), line.empty() ? " (none)" : line.c_str());
  };
  for (const char* f : kFamilies) check(spool::testing::data_dir() + "/models/" + f);
  check(SPOOL_DEFAULT_MODEL_DIR);
  auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(spool::testing::data_dir() + "/models/mixtral"));
  models::ModelSpec spec = models::build_spec(*ckpt);
  EXPECT_TRUE(models::optional_ops_used(spec).empty());
  spec.attn.sliding_window = 4;
  EXPECT_EQ(models::optional_ops_used(spec), std::vector<std::string>{"attention_window"});
  spec.attn.window_layers.assign(spec.n_layers, false);
  EXPECT_TRUE(models::optional_ops_used(spec).empty());
}

// The oracle itself: whole fixture models on ReferenceBackend match transformers' f32 logits.
TEST(BackendOps, ReferenceBackendReproducesGoldens) {
  for (const char* f : kFamilies) {
    SCOPED_TRACE(f);
    const std::string dir = spool::testing::data_dir() + "/models/" + f;
    auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
    auto model = models::load_model(ckpt, std::make_shared<ReferenceBackend>());
    spool::testing::Golden g(dir + "/golden.safetensors");
    const std::vector<int32_t> ids = g.i32("input_ids");
    const std::vector<float> want = g.f32("logits");
    models::State st = model->new_state();
    std::vector<float> got(want.size());
    model->forward(ids, st, models::LogitsMode::kAll, got.data());
    spool::testing::expect_rows_close(got.data(), want.data(), static_cast<int64_t>(ids.size()), model->spec().vocab_size, 1e-4, f);
  }
}


#ifdef SPOOL_HAVE_CUDA
// ---- CUDA: host-side harness and model forward ------------------------------------------------

// CudaBackend seen from the host: every op copies its host inputs to device buffers, runs on
// CudaBackend with device pointers (weights through upload()), and copies the results back. The
// contract's host arrays (norm weights, conv kernels, gate parameters, routing ids, expert groups,
// KV caches' host copy) are passed as they are.
class CudaHarness final : public Backend {
 public:
  CudaHarness() : be_(std::make_unique<CudaBackend>(0)) {}
  Device device() const override { return Device::kCpu; }
  const char* name() const override { return "cuda-harness"; }
  int threads() const override { return 1; }

  void matmul(const WeightView& w, const float* x, int64_t T, float* y) override {
    const WeightView dw = be_->upload(w);
    EXPECT_EQ(dw.device, Device::kCuda);
    CudaBuffer xd = up(x, T * w.cols), yd = zeros(T * w.rows);
    be_->matmul(dw, f(xd), T, f(yd));
    down(yd, y, T * w.rows);
  }
  void matmul_multi(std::span<const MatmulOut> outs, const float* x, int64_t T) override {
    CudaBuffer xd = up(x, T * outs[0].w->cols);
    std::vector<WeightView> ws;
    std::vector<CudaBuffer> ys;
    for (const MatmulOut& o : outs) {
      ws.push_back(be_->upload(*o.w));
      ys.push_back(zeros(T * o.w->rows));
    }
    std::vector<MatmulOut> d;
    for (size_t i = 0; i < outs.size(); ++i) d.push_back({&ws[i], f(ys[i])});
    be_->matmul_multi(d, f(xd), T);
    for (size_t i = 0; i < outs.size(); ++i) down(ys[i], outs[i].y, T * outs[i].w->rows);
  }
  void expert_ffn(std::span<const ExpertMats> experts, const ExpertGroups& groups, size_t g0, const float* x, int64_t H,
                  Activation act, float* y) override {
    std::vector<ExpertMats> d;
    std::vector<CudaBuffer> biases;  // gpt-oss expert biases, on the device like the model places them
    for (const ExpertMats& e : experts) {
      ExpertMats m{be_->upload(e.gate), be_->upload(e.up), be_->upload(e.down)};
      if (e.gate_bias) {
        biases.push_back(up(e.gate_bias, e.gate.rows));
        m.gate_bias = f(biases.back());
      }
      if (e.down_bias) {
        biases.push_back(up(e.down_bias, H));
        m.down_bias = f(biases.back());
      }
      d.push_back(m);
    }
    const int64_t ny = groups.T * groups.K * H;
    CudaBuffer xd = up(x, groups.T * H), yd = up(y, ny);  // y: rows of other batches kept
    be_->expert_ffn(d, groups, g0, f(xd), H, act, f(yd));
    down(yd, y, ny);
  }
  void moe_combine(const float* y, const ExpertGroups& groups, const float* weights, int64_t H, float* out) override {
    CudaBuffer yd = up(y, groups.T * groups.K * H), wd = up(weights, groups.T * groups.K), od = zeros(groups.T * H);
    be_->moe_combine(f(yd), groups, f(wd), H, f(od));
    down(od, out, groups.T * H);
  }
  void route_softmax_top_k(float* logits, int64_t T, int E, int k, bool renormalize, int* ids, float* weights,
                           float* margins) override {
    CudaBuffer ld = up(logits, T * E), wd = zeros(T * k), md = zeros(T);
    be_->route_softmax_top_k(f(ld), T, E, k, renormalize, ids, f(wd), margins ? f(md) : nullptr);
    down(wd, weights, T * k);
    if (margins) down(md, margins, T);
  }
  void kv_append(KvCache& cache, int64_t pos0, int64_t T, const float* k, const float* v) override {
    const int64_t w = static_cast<int64_t>(cache.n_kv_heads()) * cache.head_dim();
    CudaBuffer kd = up(k, T * w), vd = up(v, T * w);
    be_->kv_append(cache, pos0, T, f(kd), f(vd));
  }
  void attention(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, float* out) override {
    const int64_t n = T * n_heads * kv.head_dim();
    CudaBuffer qd = up(q, n), od = zeros(n);
    be_->attention(f(qd), T, n_heads, kv, pos0, scale, f(od));
    down(od, out, n);
  }
  void rope(const Rope& rope, float* x, int64_t T, int64_t row_stride, int n_heads, int head_dim, int64_t pos0) override {
    const int64_t n = (T - 1) * row_stride + static_cast<int64_t>(n_heads) * head_dim;
    CudaBuffer xd = up(x, n);
    be_->rope(rope, f(xd), T, row_stride, n_heads, head_dim, pos0);
    down(xd, x, n);
  }
  void causal_conv1d_silu(const float* x, int64_t T, int64_t C, const float* w, int K, float* state, float* out) override {
    CudaBuffer xd = up(x, T * C), sd = up(state, C * (K - 1)), od = zeros(T * C);
    be_->causal_conv1d_silu(f(xd), T, C, w, K, f(sd), f(od));
    down(sd, state, C * (K - 1));
    down(od, out, T * C);
  }
  void gated_delta(const GatedDeltaArgs& a, int chunk) override {
    const int64_t nq = a.T * a.n_k * a.d_k, nv = a.T * a.n_v * a.d_v, ns = static_cast<int64_t>(a.n_v) * a.d_k * a.d_v;
    CudaBuffer q = up(a.q, nq), k = up(a.k, nq), v = up(a.v, nv), b = up(a.beta, a.T * a.n_v), g = up(a.g, a.T * a.n_v);
    CudaBuffer s = up(a.state, ns), o = zeros(nv);
    GatedDeltaArgs d = a;
    d.q = f(q);
    d.k = f(k);
    d.v = f(v);
    d.beta = f(b);
    d.g = f(g);
    d.state = f(s);
    d.out = f(o);
    be_->gated_delta(d, chunk);
    down(s, a.state, ns);
    down(o, a.out, nv);
  }
  void gdn_gates(const float* b, const float* a, const float* a_exp, const float* dt_bias, int64_t T, int n_v, float* beta,
                 float* g) override {
    CudaBuffer bd = up(b, T * n_v), ad = up(a, T * n_v), betad = zeros(T * n_v), gd = zeros(T * n_v);
    be_->gdn_gates(f(bd), f(ad), a_exp, dt_bias, T, n_v, f(betad), f(gd));
    down(betad, beta, T * n_v);
    down(gd, g, T * n_v);
  }
  void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) override {
    CudaBuffer xd = up(x, rows * n), yd = zeros(rows * n);
    float* yp = x == y ? f(xd) : f(yd);
    be_->rms_norm(f(xd), w, rows, n, eps, yp);
    down(x == y ? xd : yd, y, rows * n);
  }
  void l2_norm(float* x, int64_t rows, int64_t n, float eps, float post_scale) override {
    CudaBuffer xd = up(x, rows * n);
    be_->l2_norm(f(xd), rows, n, eps, post_scale);
    down(xd, x, rows * n);
  }
  void rms_norm_gated(float* x, const float* z, const float* w, int64_t rows, int64_t n, float eps) override {
    CudaBuffer xd = up(x, rows * n), zd = up(z, rows * n);
    be_->rms_norm_gated(f(xd), f(zd), w, rows, n, eps);
    down(xd, x, rows * n);
  }
  void attention_sinks(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, int64_t window,
                       const float* sinks, float* out) override {
    const int64_t n = T * n_heads * kv.head_dim();
    CudaBuffer qd = up(q, n), od = zeros(n);
    be_->attention_sinks(f(qd), T, n_heads, kv, pos0, scale, window, sinks, f(od));  // sinks: a host array
    down(od, out, n);
  }
  void add(float* y, const float* x, int64_t n) override {
    CudaBuffer yd = up(y, n), xd = up(x, n);
    be_->add(f(yd), f(xd), n);
    down(yd, y, n);
  }
  void add_bias(float* y, const float* b, int64_t rows, int64_t n) override {
    CudaBuffer yd = up(y, rows * n);
    be_->add_bias(f(yd), b, rows, n);  // b: a host parameter vector, as the contract allows
    down(yd, y, rows * n);
  }
  void swiglu(const float* gate, const float* up_, int64_t n, float* out) override {
    CudaBuffer gd = up(gate, n), ud = up(up_, n), od = zeros(n);
    float* op = out == gate ? f(gd) : f(od);
    be_->swiglu(f(gd), f(ud), n, op);
    down(out == gate ? gd : od, out, n);
  }
  void mul_sigmoid(float* x, const float* gate, int64_t n) override {
    CudaBuffer xd = up(x, n), gd = up(gate, n);
    be_->mul_sigmoid(f(xd), f(gd), n);
    down(xd, x, n);
  }
  void add_gated_rows(float* out, const float* s, const float* x, const float* w, int64_t T, int64_t n) override {
    CudaBuffer od = up(out, T * n), sd = up(s, T * n), xd = up(x, T * n);
    be_->add_gated_rows(f(od), f(sd), f(xd), w, T, n);
    down(od, out, T * n);
  }
  void copy_2d(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t cols) override {
    const int64_t nd = (rows - 1) * ld_dst + cols, ns = (rows - 1) * ld_src + cols;
    CudaBuffer dd = up(dst, nd), sd = up(src, ns);
    be_->copy_2d(f(dd), ld_dst, f(sd), ld_src, rows, cols);
    down(dd, dst, nd);
  }
  void row_to_f32(WType t, const void* src, int64_t n, float* dst) override {
    CudaBuffer dd = zeros(n);
    be_->row_to_f32(t, src, n, f(dd));  // src: a host row (the embedding table stays on the host)
    down(dd, dst, n);
  }
  void to_host(const float* src, int64_t n, float* dst) override {
    CudaBuffer sd = up(src, n);
    be_->to_host(f(sd), n, dst);
  }

 private:
  static CudaBuffer up(const float* p, int64_t n) {
    CudaBuffer b(static_cast<size_t>(std::max<int64_t>(n, 1)) * 4);
    b.upload(p, static_cast<size_t>(n) * 4);
    return b;
  }
  static CudaBuffer zeros(int64_t n) {
    std::vector<float> nan(static_cast<size_t>(std::max<int64_t>(n, 1)), NAN);  // unwritten outputs show as NaN
    return up(nan.data(), static_cast<int64_t>(nan.size()));
  }
  static float* f(const CudaBuffer& b) { return static_cast<float*>(b.get()); }
  void down(const CudaBuffer& b, float* dst, int64_t n) {
    be_->synchronize();
    b.download(dst, static_cast<size_t>(n) * 4);
  }
  std::unique_ptr<CudaBackend> be_;
};

std::unique_ptr<Backend> make_cuda_harness() { return std::make_unique<CudaHarness>(); }

#endif  // SPOOL_HAVE_CUDA

}  // namespace
}  // namespace spool::ops
