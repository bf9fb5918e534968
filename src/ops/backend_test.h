// The backend op test's shared harness (the test is split by op family over backend_test*.cpp,
// one executable): the backends under test per group ("cpu", and "cuda" with SPOOL_CUDA), the
// registry of the ops the table covers (covers(), filled during static initialisation by every
// file), for_each_backend(), the tolerance check, the BackendOpTable fixture (instantiated once, in
// backend_test.cpp) and the weights of every type (TestWeight). See backend_test.cpp for the plan.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "support/ggml_random.h"
#include "support/random.h"
#include "common/error.h"
#include "ops/cpu_backend.h"
#include "ops/ggml_blocks.h"
#include "ops/reference_backend.h"
#include "ops/workspace.h"
#ifdef SPOOL_HAVE_CUDA
#include "ops/cuda/cuda_backend.h"
#endif
#include "quant/quantize.h"

namespace spool::ops::op_table {

using spool::testing::for_each_target;
using spool::testing::randn;
using spool::testing::random_ggml_blocks;

// ---- Backends under test ----------------------------------------------------------------------

struct BackendCase {
  std::string name;
  std::function<std::unique_ptr<Backend>()> make;
};

inline ThreadPool* shared_pool() {
  static ThreadPool pool(3);
  return &pool;
}

// Backend group under test ("cpu" or "cuda"): the parameter of BackendOpTable.
inline std::string& current_group() {
  static std::string g = "cpu";
  return g;
}

#ifdef SPOOL_HAVE_CUDA
/// CudaBackend behind a host-pointer harness (backend_test.cpp).
std::unique_ptr<Backend> make_cuda_harness();
#endif

inline std::vector<BackendCase> backends() {
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
inline std::set<std::string>& covered() {
  static std::set<std::string> s;
  return s;
}
inline bool covers(std::initializer_list<const char*> ops) {
  for (const char* op : ops) covered().insert(op);
  return true;
}

// Runs fn(backend, reference) for every backend and SIMD target (op must be registered).
inline void for_each_backend(const std::string& op, const std::function<void(Backend&, ReferenceBackend&)>& fn) {
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
inline void expect_close(const float* got, const float* want, int64_t n, double tol, const std::string& what) {
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


// ---- Weights of every type -------------------------------------------------------------------

enum class WKind {
  kF32, kBF16, kF16, kQ4, kQ3, kQ2, kTernary, kQ4Rotated, kTernaryRotated,
  kQ5, kQ6, kQ8, kQ6Rotated, kQ8Rotated,
  // ggml block types as stored in GGUF files (kGgml views); kGgmlQ8_0Perm adds a column permutation.
  kGgmlQ8_0, kGgmlQ4_0, kGgmlQ4_1, kGgmlQ5_0, kGgmlQ5_1, kGgmlQ2_K, kGgmlQ3_K, kGgmlQ4_K, kGgmlQ5_K, kGgmlQ6_K,
  kGgmlIQ4_NL, kGgmlIQ4_XS, kGgmlMXFP4, kGgmlQ8_0Perm,
  // i-quants and ternary (ops/ggml_iquants)
  kGgmlIQ1_S, kGgmlIQ1_M, kGgmlIQ2_XXS, kGgmlIQ2_XS, kGgmlIQ2_S, kGgmlIQ3_XXS, kGgmlIQ3_S, kGgmlTQ1_0, kGgmlTQ2_0,
  kMxfp4  // MXFP4 as Hugging Face stores it (gpt-oss blocks + E8M0 scales, WType::kMxfp4)
};

// The ggml type of a kGgml* kind; F32 for the others.
inline GgmlType ggml_of(WKind k) {
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
    case WKind::kGgmlIQ1_S: return GgmlType::IQ1_S;
    case WKind::kGgmlIQ1_M: return GgmlType::IQ1_M;
    case WKind::kGgmlIQ2_XXS: return GgmlType::IQ2_XXS;
    case WKind::kGgmlIQ2_XS: return GgmlType::IQ2_XS;
    case WKind::kGgmlIQ2_S: return GgmlType::IQ2_S;
    case WKind::kGgmlIQ3_XXS: return GgmlType::IQ3_XXS;
    case WKind::kGgmlIQ3_S: return GgmlType::IQ3_S;
    case WKind::kGgmlTQ1_0: return GgmlType::TQ1_0;
    case WKind::kGgmlTQ2_0: return GgmlType::TQ2_0;
    default: return GgmlType::F32;
  }
}
inline bool is_ggml(WKind k) { return ggml_of(k) != GgmlType::F32; }
// Whether the backend group under test has kernels for kind k: CudaBackend has none for ggml
// blocks yet and refuses them with spool::Error (checked in BackendOpTable.Matmul).
inline bool group_runs(WKind k) { return !(is_ggml(k) && current_group() == "cuda"); }
// True when a matrix of `cols` columns can be stored in kind k (ggml blocks never straddle rows).
inline bool fits(WKind k, int64_t cols) {
  if (k == WKind::kMxfp4) return cols % 32 == 0;
  return !is_ggml(k) || cols % ggml_type_traits(ggml_of(k)).blck == 0;
}

inline const char* wkind_name(WKind k) {
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
    case WKind::kQ5: return "q5";
    case WKind::kQ6: return "q6";
    case WKind::kQ8: return "q8";
    case WKind::kQ6Rotated: return "q6+hadamard";
    case WKind::kQ8Rotated: return "q8+hadamard";
    case WKind::kGgmlQ8_0Perm: return "ggml Q8_0+col_perm";
    case WKind::kMxfp4: return "mxfp4 (HF layout)";
    default: return ggml_type_traits(ggml_of(k)).name;
  }
}

inline const std::vector<WKind> kAllKinds = {WKind::kF32, WKind::kBF16, WKind::kF16, WKind::kQ4, WKind::kQ3,
                                      WKind::kQ2, WKind::kTernary, WKind::kQ4Rotated, WKind::kTernaryRotated,
                                      WKind::kQ5, WKind::kQ6, WKind::kQ8, WKind::kQ6Rotated, WKind::kQ8Rotated,
                                      WKind::kGgmlQ8_0, WKind::kGgmlQ4_0, WKind::kGgmlQ4_1, WKind::kGgmlQ5_0,
                                      WKind::kGgmlQ5_1, WKind::kGgmlQ2_K, WKind::kGgmlQ3_K, WKind::kGgmlQ4_K,
                                      WKind::kGgmlQ5_K, WKind::kGgmlQ6_K, WKind::kGgmlIQ4_NL, WKind::kGgmlIQ4_XS,
                                      WKind::kGgmlMXFP4, WKind::kGgmlQ8_0Perm, WKind::kGgmlIQ1_S, WKind::kGgmlIQ1_M,
                                      WKind::kGgmlIQ2_XXS, WKind::kGgmlIQ2_XS, WKind::kGgmlIQ2_S, WKind::kGgmlIQ3_XXS,
                                      WKind::kGgmlIQ3_S, WKind::kGgmlTQ1_0, WKind::kGgmlTQ2_0, WKind::kMxfp4};


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
      case WKind::kQ5: qt(quant::QType::kQ5, false); break;
      case WKind::kQ6: qt(quant::QType::kQ6, false); break;
      case WKind::kQ8: qt(quant::QType::kQ8, false); break;
      case WKind::kQ6Rotated: qt(quant::QType::kQ6, true); break;
      case WKind::kQ8Rotated: qt(quant::QType::kQ8, true); break;
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

}  // namespace spool::ops::op_table
