// Micro-benchmarks of the quantized kernels (Google Benchmark), all against baselines measured
// in the same binary (the VM's memory bandwidth is noisy: compare within one run):
//   - memory read bandwidth (sum of a 1 GiB buffer), 1 and 2 threads;
//   - decode GEMV in GB/s of weight bytes (qweight + fp16 scales) for q2/q3/q4/ternary/q5/q6/q8 and the
//     bf16 GEMV, "hot" (one matrix, L3-resident when small) and "stream" (cycling through copies
//     totalling >= 256 MiB, so every byte comes from DRAM as for streamed experts), at T = 1 and
//     4 tokens; BM_QuantGemvCpu / BM_MemoryReadCpu: the same on one thread timed by its CPU time,
//     the numbers to compare formats with on a loaded machine;
//   - prefill GEMM GFLOP/s at T = 512; input rotation time;
//   - the ggml block formats of GGUF files (ops/ggml_blocks.h): decode GEMV GB/s per type
//     (stream and hot) and prefill GEMM GFLOP/s, on random valid blocks;
//   - MXFP4 as Hugging Face stores it (gpt-oss experts: FP4 blocks + separate E8M0 scales,
//     ops::Mxfp4View): decode GEMV GB/s at the gpt-oss expert shapes (gate_up 5760x2880, down
//     2880x2880) and prefill GEMM GFLOP/s.
//   build/bench/quant_bench --benchmark_counters_tabular=true
// --hwy_target=AVX2 measures the kernels another CPU would run (see main()).
#include <benchmark/benchmark.h>
#include <hwy/aligned_allocator.h>
#include <hwy/targets.h>
#include <strings.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <random>
#include <vector>

#include "memory_read.h"
#include "ops/ggml_blocks.h"
#include "ops/ggml_iquants.h"
#include "ops/ggml_q8.h"
#include "ops/matmul.h"
#include "ops/quant_matmul.h"
#include "ops/quant_q8.h"
#include "ops/thread_pool.h"
#include "quant/hadamard.h"
#include "quant/quantize.h"

namespace {

using spool::ops::QType;
using spool::quant::QuantizedMatrix;

constexpr QType kTypes[] = {QType::kQ2, QType::kQ3, QType::kQ4, QType::kTernary, QType::kQ5, QType::kQ6, QType::kQ8};
constexpr size_t kStreamBytes = size_t{256} << 20;

std::vector<float> randn(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// One quantized matrix per (type, shape, group), copied `copies` times into separate buffers.
struct QuantSet {
  std::vector<QuantizedMatrix> mats;
  std::vector<spool::ops::QuantView> views;
  uint64_t bytes_each = 0;
};

QuantSet make_set(QType t, int64_t rows, int64_t cols, int g, bool stream) {
  static spool::ops::ThreadPool qpool(2);
  const std::vector<float> W = randn(static_cast<size_t>(rows * cols), 1);
  const std::vector<int8_t> s = spool::quant::rotation_signs(1, "bench", cols);
  QuantSet set;
  set.mats.push_back(spool::quant::quantize(W.data(), rows, cols, t, g, s.data(), &qpool));
  set.bytes_each = set.mats[0].view().nbytes();
  const size_t copies = stream ? (kStreamBytes + set.bytes_each - 1) / set.bytes_each : 1;
  for (size_t i = 1; i < copies; ++i) set.mats.push_back(set.mats[0]);
  for (const auto& m : set.mats) set.views.push_back(m.view());
  return set;
}

void BM_MemoryRead(benchmark::State& st) { spool::bench::MemoryRead(st); }
BENCHMARK(BM_MemoryRead)->ArgNames({"MiB", "threads"})->Args({1024, 1})->Args({1024, 2})->UseRealTime();
// The same on one thread timed by its CPU time (runs on the calling thread): on a loaded machine
// the time the thread was not scheduled drops out (BM_QuantGemvCpu's bound).
void BM_MemoryReadCpu(benchmark::State& st) { spool::bench::MemoryRead(st); }
BENCHMARK(BM_MemoryReadCpu)->ArgNames({"MiB", "threads"})->Args({1024, 1});

// Decode GEMV, y = W x (T tokens, 1 or a few as in batched / speculative decoding; x already
// rotated: quant_matmul_rows per thread chunk the way quant_matmul does, so the rotation is
// measured separately). GB/s counts the weight bytes once per call. Args: type, rows, cols,
// threads, stream, group, T.
// int8: --act-bits 8's kernels (ops/quant_q8.h; q4 and q8): each call quantizes the activations
// once, then the rows in parallel.
void QuantGemv(benchmark::State& st, bool int8) {
  const QType t = static_cast<QType>(st.range(0));
  const int64_t rows = st.range(1), cols = st.range(2);
  const int threads = static_cast<int>(st.range(3));
  const bool stream = st.range(4) != 0;
  const int g = static_cast<int>(st.range(5));
  const int64_t T = st.range(6);
  const QuantSet set = make_set(t, rows, cols, g, stream);
  std::vector<float> x(static_cast<size_t>(T * cols)), y(static_cast<size_t>(T * rows));
  for (size_t c = 0; c < x.size(); ++c) x[c] = 0.5f + 0.25f * static_cast<float>(c % 7);
  spool::ops::ThreadPool pool(threads);
  spool::ops::QuantQ8Acts a;
  size_t i = 0;
  for (auto _ : st) {
    const spool::ops::QuantView& v = set.views[i];
    i = (i + 1) % set.views.size();
    if (int8) {
      spool::ops::quant_q8_prepare(x.data(), T, cols, a);
      pool.parallel_for(rows, 16, [&](int64_t b, int64_t e, int) { spool::ops::quant_q8_matmul_rows(v, a, y.data(), rows, b, e); });
    } else {
      pool.parallel_for(rows, 16, [&](int64_t b, int64_t e, int) {
        spool::ops::quant_matmul_rows(v, x.data(), T, y.data(), rows, b, e);
      });
    }
    benchmark::DoNotOptimize(y.data());
  }
  st.SetLabel(std::string(spool::quant::qtype_name(t)) + (stream ? " stream" : " hot") + (T > 1 ? " T=" + std::to_string(T) : "") +
              (int8 ? std::string(" int8 ") + spool::ops::quant_q8_variant() : std::string(" ") + spool::ops::quant_kernel_target()));
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(set.bytes_each) * st.iterations() / 1e9,
                                           benchmark::Counter::kIsRate);
  st.counters["Gw/s"] = benchmark::Counter(static_cast<double>(rows * cols) * st.iterations() / 1e9,
                                           benchmark::Counter::kIsRate);
}
void BM_QuantGemv(benchmark::State& st) { QuantGemv(st, false); }

void QuantGemvArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "thr", "stream", "g", "T"});
  for (int stream : {1, 0})
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{8192, 2048}, {2048, 8192}})
      for (QType t : kTypes)
        for (int thr : {1, 2}) b->Args({static_cast<int64_t>(t), rows, cols, thr, stream, 64, 1});
  for (int g : {32, 128})  // group size effect, q4 and ternary
    for (QType t : {QType::kQ4, QType::kTernary}) b->Args({static_cast<int64_t>(t), 8192, 2048, 2, 1, g, 1});
  for (int stream : {1, 0})  // 4 tokens per call (a decode block serves 2 tokens at a time)
    for (QType t : kTypes)
      for (int thr : {1, 2}) b->Args({static_cast<int64_t>(t), 8192, 2048, thr, stream, 64, 4});
}
BENCHMARK(BM_QuantGemv)->Apply(QuantGemvArgs)->UseRealTime();

// BM_QuantGemv with int8 activations (--act-bits 8, ops/quant_q8.h): q4 and q8. Args as BM_QuantGemv.
void BM_QuantQ8Gemv(benchmark::State& st) { QuantGemv(st, true); }
void QuantQ8GemvArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "thr", "stream", "g", "T"});
  for (int stream : {1, 0})
    for (int64_t T : {1, 4})
      for (QType t : {QType::kQ4, QType::kQ8})
        for (int thr : {1, 2}) b->Args({static_cast<int64_t>(t), 8192, 2048, thr, stream, 64, T});
}
BENCHMARK(BM_QuantQ8Gemv)->Apply(QuantQ8GemvArgs)->UseRealTime();

// The two q4 decode kernels with Highway held to its AVX2 target (an AVX2-only CPU's kernels,
// measured on this one: f32 and int8 activations side by side). Args as BM_QuantGemv.
void BM_QuantGemvAvx2(benchmark::State& st) {
  if ((hwy::SupportedTargets() & HWY_AVX2) == 0) return st.SkipWithError("this CPU has no AVX2");
  hwy::SetSupportedTargetsForTest(HWY_AVX2);
  BM_QuantGemv(st);
  hwy::SetSupportedTargetsForTest(0);
}
void BM_QuantQ8GemvAvx2(benchmark::State& st) {
  if ((hwy::SupportedTargets() & HWY_AVX2) == 0) return st.SkipWithError("this CPU has no AVX2");
  hwy::SetSupportedTargetsForTest(HWY_AVX2);
  BM_QuantQ8Gemv(st);
  hwy::SetSupportedTargetsForTest(0);
}
// The same without AVX-VNNI (q8_allow_dot_extension(false)): an AVX2 CPU before Alder Lake / Zen 1-3.
void BM_QuantQ8GemvAvx2NoVnni(benchmark::State& st) {
  spool::ops::q8_allow_dot_extension(false);
  BM_QuantQ8GemvAvx2(st);
  spool::ops::q8_allow_dot_extension(true);
}
void QuantAvx2Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "thr", "stream", "g", "T"});
  for (int stream : {1, 0})
    for (int thr : {1, 2}) b->Args({static_cast<int64_t>(QType::kQ4), 8192, 2048, thr, stream, 64, 1});
  for (int64_t T : {4, 64}) b->Args({static_cast<int64_t>(QType::kQ4), 2048, 2048, 1, 0, 64, T});  // prefill-like
}
BENCHMARK(BM_QuantGemvAvx2)->Apply(QuantAvx2Args)->UseRealTime();
BENCHMARK(BM_QuantQ8GemvAvx2)->Apply(QuantAvx2Args)->UseRealTime();
BENCHMARK(BM_QuantQ8GemvAvx2NoVnni)->Apply(QuantAvx2Args)->UseRealTime();

// Decode GEMV on the calling thread (one thread) timed by its CPU time: robust on a loaded
// machine (the GB/s of the cycles it got). Args as BM_QuantGemv (thr = 1).
void BM_QuantGemvCpu(benchmark::State& st) { BM_QuantGemv(st); }
void QuantGemvCpuArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "thr", "stream", "g", "T"});
  for (int64_t T : {1, 4})
    for (int stream : {1, 0})
      for (QType t : kTypes) b->Args({static_cast<int64_t>(t), 8192, 2048, 1, stream, 64, T});
}
BENCHMARK(BM_QuantGemvCpu)->Apply(QuantGemvCpuArgs);

// bf16 GEMV through the existing dense kernel. Args: rows, cols, threads, stream.
void BM_GemvBF16(benchmark::State& st) {
  const int64_t rows = st.range(0), cols = st.range(1);
  const int threads = static_cast<int>(st.range(2));
  const bool stream = st.range(3) != 0;
  const uint64_t bytes = static_cast<uint64_t>(rows * cols) * 2;
  const size_t copies = stream ? (kStreamBytes + bytes - 1) / bytes : 1;
  std::vector<std::vector<uint16_t>> ws(copies);
  const std::vector<float> W = randn(static_cast<size_t>(rows * cols), 2);
  for (auto& w : ws) {
    w.resize(W.size());
    for (size_t k = 0; k < W.size(); ++k) w[k] = spool::ops::f32_to_bf16(W[k]);
  }
  std::vector<float> x(static_cast<size_t>(cols), 0.5f), y(static_cast<size_t>(rows));
  spool::ops::ThreadPool pool(threads);
  size_t i = 0;
  for (auto _ : st) {
    spool::ops::WeightView v{spool::ops::WType::kBF16, rows, cols, ws[i].data()};
    i = (i + 1) % ws.size();
    spool::ops::matmul(v, x.data(), 1, y.data(), &pool);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetLabel(stream ? "bf16 stream" : "bf16 hot");
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes) * st.iterations() / 1e9, benchmark::Counter::kIsRate);
  st.counters["Gw/s"] = benchmark::Counter(static_cast<double>(rows * cols) * st.iterations() / 1e9,
                                           benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GemvBF16)
    ->ArgNames({"rows", "cols", "thr", "stream"})
    ->Args({8192, 2048, 1, 1})
    ->Args({8192, 2048, 2, 1})
    ->Args({2048, 8192, 1, 1})
    ->Args({2048, 8192, 2, 1})
    ->Args({8192, 2048, 2, 0})
    ->UseRealTime();

// Prefill GEMM, Y = X W^T for T tokens (2 threads; includes the input rotation).
void BM_QuantGemm(benchmark::State& st) {
  const QType t = static_cast<QType>(st.range(0));
  const int64_t rows = st.range(1), cols = st.range(2), T = st.range(3);
  const QuantSet set = make_set(t, rows, cols, 64, false);
  std::vector<float> x(static_cast<size_t>(T * cols), 0.5f), y(static_cast<size_t>(T * rows));
  spool::ops::ThreadPool pool(2);
  for (auto _ : st) {
    spool::ops::quant_matmul(set.views[0], x.data(), T, y.data(), &pool);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetLabel(spool::quant::qtype_name(t));
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * cols * T * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}
void QuantGemmArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "T"});
  for (QType t : kTypes) b->Args({static_cast<int64_t>(t), 2048, 2048, 512});
  b->Args({static_cast<int64_t>(QType::kQ4), 8192, 2048, 512});
  b->Args({static_cast<int64_t>(QType::kQ4), 2048, 2048, 3});
}
BENCHMARK(BM_QuantGemm)->Apply(QuantGemmArgs)->UseRealTime();

void BM_GemmBF16(benchmark::State& st) {
  const int64_t rows = st.range(0), cols = st.range(1), T = st.range(2);
  const std::vector<float> W = randn(static_cast<size_t>(rows * cols), 2);
  std::vector<uint16_t> w(W.size());
  for (size_t k = 0; k < W.size(); ++k) w[k] = spool::ops::f32_to_bf16(W[k]);
  std::vector<float> x(static_cast<size_t>(T * cols), 0.5f), y(static_cast<size_t>(T * rows));
  spool::ops::WeightView v{spool::ops::WType::kBF16, rows, cols, w.data()};
  spool::ops::ThreadPool pool(2);
  for (auto _ : st) {
    spool::ops::matmul(v, x.data(), T, y.data(), &pool);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetLabel("bf16");
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * cols * T * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GemmBF16)->ArgNames({"rows", "cols", "T"})->Args({2048, 2048, 512})->UseRealTime();

// Input rotation (once per token and sign vector).
void BM_RotateInput(benchmark::State& st) {
  const int64_t n = st.range(0);
  const std::vector<int8_t> s = spool::quant::rotation_signs(1, "bench", n);
  std::vector<float> x = randn(static_cast<size_t>(n), 3), y(static_cast<size_t>(n));
  for (auto _ : st) {
    spool::quant::rotate_input(s.data(), x.data(), n, y.data());
    benchmark::DoNotOptimize(y.data());
  }
}
BENCHMARK(BM_RotateInput)->Arg(2048)->Arg(2880)->Arg(8192);

// Quantization speed (converter), rows of 2048 on 2 threads.
void BM_Quantize(benchmark::State& st) {
  const QType t = static_cast<QType>(st.range(0));
  const int64_t rows = 1024, cols = 2048;
  const std::vector<float> W = randn(static_cast<size_t>(rows * cols), 4);
  const std::vector<int8_t> s = spool::quant::rotation_signs(1, "bench", cols);
  spool::ops::ThreadPool pool(2);
  for (auto _ : st) benchmark::DoNotOptimize(spool::quant::quantize(W.data(), rows, cols, t, 64, s.data(), &pool));
  st.SetLabel(spool::quant::qtype_name(t));
  st.counters["Mw/s"] = benchmark::Counter(static_cast<double>(rows * cols) * st.iterations() / 1e6, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Quantize)->Arg(static_cast<int64_t>(QType::kQ4))->Arg(static_cast<int64_t>(QType::kTernary))->UseRealTime();

// The same with spool convert's default: searched scales and a fitted codebook (quant/fit.h).
void BM_QuantizeFit(benchmark::State& st) {
  const QType t = static_cast<QType>(st.range(0));
  const int64_t rows = 1024, cols = 2048;
  const std::vector<float> W = randn(static_cast<size_t>(rows * cols), 4);
  const std::vector<int8_t> s = spool::quant::rotation_signs(1, "bench", cols);
  spool::ops::ThreadPool pool(2);
  for (auto _ : st)
    benchmark::DoNotOptimize(spool::quant::quantize(W.data(), rows, cols, t, 64, s.data(), &pool, spool::quant::QuantOptions{}));
  st.SetLabel(spool::quant::qtype_name(t));
  st.counters["Mw/s"] = benchmark::Counter(static_cast<double>(rows * cols) * st.iterations() / 1e6, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_QuantizeFit)->Arg(static_cast<int64_t>(QType::kQ4))->Arg(static_cast<int64_t>(QType::kTernary))->UseRealTime();

// ---- ggml block formats (GGUF weights) ----

constexpr spool::GgmlType kGgmlTypes[] = {
    spool::GgmlType::F32,  spool::GgmlType::F16,  spool::GgmlType::BF16, spool::GgmlType::Q8_0,
    spool::GgmlType::Q4_0, spool::GgmlType::Q4_1, spool::GgmlType::Q5_0, spool::GgmlType::Q5_1,
    spool::GgmlType::Q2_K, spool::GgmlType::Q3_K, spool::GgmlType::Q4_K, spool::GgmlType::Q5_K,
    spool::GgmlType::Q6_K, spool::GgmlType::IQ4_NL, spool::GgmlType::IQ4_XS, spool::GgmlType::MXFP4,
    spool::GgmlType::IQ1_S, spool::GgmlType::IQ1_M, spool::GgmlType::IQ2_XXS, spool::GgmlType::IQ2_XS,
    spool::GgmlType::IQ2_S, spool::GgmlType::IQ3_XXS, spool::GgmlType::IQ3_S, spool::GgmlType::TQ1_0,
    spool::GgmlType::TQ2_0};

// rows x cols of random valid blocks: random bytes, f16 scales of magnitude ~2^-8 (float types:
// small random values).
std::vector<uint8_t> ggml_random(spool::GgmlType t, int64_t rows, int64_t cols) {
  using spool::GgmlType;
  std::mt19937_64 g(42);
  const spool::GgmlTypeTraits tr = spool::ggml_type_traits(t);
  std::vector<uint8_t> m(static_cast<size_t>(rows * spool::ggml_row_bytes(t, cols)));
  for (auto& b : m) b = static_cast<uint8_t>(g());
  std::vector<int> halves;
  switch (t) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: {  // keep exponents small
      const size_t es = tr.size;
      for (size_t i = 0; i + es <= m.size(); i += es) m[i + es - 1] = static_cast<uint8_t>(0x3c + (g() & 1) * 0x80);
      return m;
    }
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: case GgmlType::IQ4_NL: case GgmlType::IQ4_XS:
      halves = {0}; break;
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: halves = {0, 2}; break;
    case GgmlType::Q2_K: halves = {80, 82}; break;
    case GgmlType::Q3_K: halves = {108}; break;
    case GgmlType::Q6_K: halves = {208}; break;
    default: halves = spool::ggml_half_fields(t); break;  // the i-quants and ternary types (IQ1_M below)
  }
  for (size_t b = 0; b + tr.size <= m.size(); b += tr.size) {
    for (int off : halves) {
      const uint16_t h = static_cast<uint16_t>(0x1c00 | (g() & 0x3ff));
      std::memcpy(&m[b + off], &h, 2);
    }
    if (t == GgmlType::MXFP4) m[b] = 120;
    if (t == GgmlType::IQ1_M) spool::ops::iq1m_set_d(&m[b], static_cast<uint16_t>(0x1c00 | (g() & 0x3ff)));
  }
  return m;
}

// Decode GEMV y = W x per ggml type, f32 activations or (int8) the int8-activation kernels of
// ops/ggml_q8.h with the activation quantization included (once per call, as matmul() does).
// Args: type, rows, cols, threads, stream.
void GgmlGemv(benchmark::State& st, bool int8) {
  const auto t = static_cast<spool::GgmlType>(st.range(0));
  const int64_t rows = st.range(1), cols = st.range(2);
  const int threads = static_cast<int>(st.range(3));
  const bool stream = st.range(4) != 0;
  const std::vector<uint8_t> m0 = ggml_random(t, rows, cols);
  const size_t copies = stream ? (kStreamBytes + m0.size() - 1) / m0.size() : 1;
  std::vector<std::vector<uint8_t>> ms(copies, m0);
  std::vector<float> x(static_cast<size_t>(cols)), y(static_cast<size_t>(rows));
  for (size_t c = 0; c < x.size(); ++c) x[c] = 0.5f + 0.25f * static_cast<float>(c % 7);
  spool::ops::ThreadPool pool(threads);
  spool::ops::Q8Acts a;
  size_t i = 0;
  for (auto _ : st) {
    const spool::ops::GgmlView v{t, rows, cols, ms[i].data(), nullptr};
    i = (i + 1) % ms.size();
    if (int8) {
      spool::ops::q8_quantize(x.data(), 1, cols, a);
      spool::ops::ggml_q8_matmul(v, a, y.data(), threads > 1 ? &pool : nullptr);
    } else {
      pool.parallel_for(rows, 16, [&](int64_t b, int64_t e, int) {
        spool::ops::ggml_matmul_rows(v, x.data(), 1, y.data(), rows, b, e);
      });
    }
    benchmark::DoNotOptimize(y.data());
  }
  st.SetLabel(std::string(spool::ggml_type_name(t)) + (stream ? " stream " : " hot ") +
              (int8 ? spool::ops::q8_variant() : spool::ops::ggml_kernel_target()));
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(m0.size()) * st.iterations() / 1e9,
                                           benchmark::Counter::kIsRate);
  st.counters["Gw/s"] = benchmark::Counter(static_cast<double>(rows * cols) * st.iterations() / 1e9,
                                           benchmark::Counter::kIsRate);
}
void BM_GgmlGemv(benchmark::State& st) { GgmlGemv(st, false); }
void GgmlGemvArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "thr", "stream"});
  for (spool::GgmlType t : kGgmlTypes)
    for (int thr : {1, 2}) b->Args({static_cast<int64_t>(t), 8192, 2048, thr, 1});
  for (spool::GgmlType t : kGgmlTypes) b->Args({static_cast<int64_t>(t), 2048, 2048, 1, 0});
  // llama.cpp test-backend-ops' MUL_MAT perf shape (m 4096, k 14336), the same matrix every
  // iteration as there (bench/kernels_vs_llama.sh).
  for (spool::GgmlType t : kGgmlTypes) b->Args({static_cast<int64_t>(t), 4096, 14336, 1, 0});
}
BENCHMARK(BM_GgmlGemv)->Apply(GgmlGemvArgs)->UseRealTime();

// Prefill GEMM Y = X W^T at T tokens, f32 or int8 activations as GgmlGemv. Args: type, rows,
// cols, T, threads (1: on the calling thread, no pool: its CPU time is the kernel's own, robust on
// a loaded machine).
void GgmlGemm(benchmark::State& st, bool int8) {
  const auto t = static_cast<spool::GgmlType>(st.range(0));
  const int64_t rows = st.range(1), cols = st.range(2), T = st.range(3);
  const int threads = static_cast<int>(st.range(4));
  const std::vector<uint8_t> m = ggml_random(t, rows, cols);
  // x 64-byte aligned, as the model's activations (ops::Workspace) are.
  const auto x = hwy::AllocateAligned<float>(static_cast<size_t>(T * cols));
  for (int64_t c = 0; c < T * cols; ++c) x[c] = 0.5f + 0.25f * static_cast<float>(c % 7);
  std::vector<float> y(static_cast<size_t>(T * rows));
  spool::ops::ThreadPool pool(threads);
  spool::ops::Q8Acts a;
  const spool::ops::GgmlView v{t, rows, cols, m.data(), nullptr};
  for (auto _ : st) {
    if (int8) {
      spool::ops::q8_quantize(x.get(), T, cols, a);
      spool::ops::ggml_q8_matmul(v, a, y.data(), threads > 1 ? &pool : nullptr);
    } else {
      spool::ops::ggml_matmul(v, x.get(), T, y.data(), threads > 1 ? &pool : nullptr);
    }
    benchmark::DoNotOptimize(y.data());
  }
  st.SetLabel(std::string(spool::ggml_type_name(t)) + " " + (int8 ? spool::ops::q8_variant() : spool::ops::ggml_kernel_target()));
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * cols * T * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}
void BM_GgmlGemm(benchmark::State& st) { GgmlGemm(st, false); }
void GgmlGemmArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "T", "thr"});
  for (spool::GgmlType t : kGgmlTypes)
    for (int thr : {1, 2}) b->Args({static_cast<int64_t>(t), 2048, 2048, 512, thr});
  // A routed expert of the Qwen3.6-35B-A3B shape at pp512 (top-8 of 256: ~16 tokens each; one
  // thread per expert): gate / up [512, 2048] and down [2048, 512], in the types of a Q4_K_M file.
  for (spool::GgmlType t : {spool::GgmlType::Q4_K, spool::GgmlType::Q6_K}) {
    b->Args({static_cast<int64_t>(t), 512, 2048, 16, 1});
    b->Args({static_cast<int64_t>(t), 2048, 512, 16, 1});
  }
  // llama.cpp test-backend-ops' MUL_MAT perf shape at n = 512 (bench/kernels_vs_llama.sh).
  for (spool::GgmlType t : kGgmlTypes) b->Args({static_cast<int64_t>(t), 4096, 14336, 512, 1});
}
BENCHMARK(BM_GgmlGemm)->Apply(GgmlGemmArgs)->UseRealTime();

// The same GEMV / GEMM with int8 activations (--act-bits 8), for the types that have them.
void BM_GgmlQ8Gemv(benchmark::State& st) { GgmlGemv(st, true); }
void GgmlQ8GemvArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "thr", "stream"});
  for (spool::GgmlType t : {spool::GgmlType::Q4_K, spool::GgmlType::Q6_K}) {
    for (int thr : {1, 2}) b->Args({static_cast<int64_t>(t), 8192, 2048, thr, 1});
    b->Args({static_cast<int64_t>(t), 2048, 2048, 1, 0});
    b->Args({static_cast<int64_t>(t), 4096, 14336, 1, 0});
  }
}
BENCHMARK(BM_GgmlQ8Gemv)->Apply(GgmlQ8GemvArgs)->UseRealTime();

void BM_GgmlQ8Gemm(benchmark::State& st) { GgmlGemm(st, true); }
void GgmlQ8GemmArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols", "T", "thr"});
  for (spool::GgmlType t : {spool::GgmlType::Q4_K, spool::GgmlType::Q6_K}) {
    for (int thr : {1, 2}) b->Args({static_cast<int64_t>(t), 2048, 2048, 512, thr});
    b->Args({static_cast<int64_t>(t), 512, 2048, 16, 1});
    b->Args({static_cast<int64_t>(t), 2048, 512, 16, 1});
    // an expert's token count is rarely a multiple of the register tile's 4 tokens
    b->Args({static_cast<int64_t>(t), 512, 2048, 14, 1});
    b->Args({static_cast<int64_t>(t), 512, 2048, 13, 1});
    b->Args({static_cast<int64_t>(t), 4096, 14336, 512, 1});
  }
}
BENCHMARK(BM_GgmlQ8Gemm)->Apply(GgmlQ8GemmArgs)->UseRealTime();

// HF MXFP4 matrix [rows, cols]: random codes, E8M0 scales 2^-7 .. 2^-6; blocks then scales.
std::vector<uint8_t> mxfp4_random(int64_t rows, int64_t cols) {
  std::mt19937_64 g(5);
  std::vector<uint8_t> m(static_cast<size_t>(rows * (cols / 2) + rows * (cols / 32)));
  for (int64_t i = 0; i < rows * (cols / 2); ++i) m[i] = static_cast<uint8_t>(g());
  for (size_t i = static_cast<size_t>(rows * (cols / 2)); i < m.size(); ++i) m[i] = static_cast<uint8_t>(120 + g() % 2);
  return m;
}

spool::ops::Mxfp4View mxfp4_view(const std::vector<uint8_t>& m, int64_t rows, int64_t cols) {
  spool::ops::Mxfp4View v;
  v.rows = rows;
  v.cols = cols;
  v.blocks = m.data();
  v.scales = m.data() + rows * (cols / 2);
  return v;
}

// Decode GEMV y = W x of an HF MXFP4 matrix; GB/s of blocks + scales. Args: rows, cols, threads, stream.
void BM_Mxfp4Gemv(benchmark::State& st) {
  const int64_t rows = st.range(0), cols = st.range(1);
  const int threads = static_cast<int>(st.range(2));
  const bool stream = st.range(3) != 0;
  const std::vector<uint8_t> m0 = mxfp4_random(rows, cols);
  const size_t copies = stream ? (kStreamBytes + m0.size() - 1) / m0.size() : 1;
  std::vector<std::vector<uint8_t>> ms(copies, m0);
  std::vector<float> x(static_cast<size_t>(cols), 0.5f), y(static_cast<size_t>(rows));
  spool::ops::ThreadPool pool(threads);
  size_t i = 0;
  for (auto _ : st) {
    const spool::ops::Mxfp4View v = mxfp4_view(ms[i], rows, cols);
    i = (i + 1) % ms.size();
    pool.parallel_for(rows, 16, [&](int64_t b, int64_t e, int) { spool::ops::mxfp4_matmul_rows(v, x.data(), 1, y.data(), rows, b, e); });
    benchmark::DoNotOptimize(y.data());
  }
  st.SetLabel(std::string("mxfp4 (HF)") + (stream ? " stream " : " hot ") + spool::ops::ggml_kernel_target());
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(m0.size()) * st.iterations() / 1e9, benchmark::Counter::kIsRate);
  st.counters["Gw/s"] = benchmark::Counter(static_cast<double>(rows * cols) * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Mxfp4Gemv)
    ->ArgNames({"rows", "cols", "thr", "stream"})
    ->Args({5760, 2880, 1, 1})  // gpt-oss gate_up of one expert
    ->Args({5760, 2880, 2, 1})
    ->Args({2880, 2880, 1, 1})  // gpt-oss down
    ->Args({2880, 2880, 2, 1})
    ->Args({8192, 2048, 1, 1})  // the shape of docs/benchmarks.md's table
    ->Args({8192, 2048, 2, 1})
    ->Args({2880, 2880, 1, 0})
    ->UseRealTime();

// Prefill GEMM Y = X W^T of an HF MXFP4 matrix at T tokens, 2 threads. Args: rows, cols, T.
void BM_Mxfp4Gemm(benchmark::State& st) {
  const int64_t rows = st.range(0), cols = st.range(1), T = st.range(2);
  const std::vector<uint8_t> m = mxfp4_random(rows, cols);
  std::vector<float> x(static_cast<size_t>(T * cols), 0.5f), y(static_cast<size_t>(T * rows));
  spool::ops::ThreadPool pool(2);
  const spool::ops::Mxfp4View v = mxfp4_view(m, rows, cols);
  for (auto _ : st) {
    spool::ops::mxfp4_matmul(v, x.data(), T, y.data(), &pool);
    benchmark::DoNotOptimize(y.data());
  }
  st.SetLabel("mxfp4 (HF)");
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * cols * T * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Mxfp4Gemm)->ArgNames({"rows", "cols", "T"})->Args({2880, 2880, 64})->Args({2048, 2048, 512})->UseRealTime();

}  // namespace

// Google Benchmark's main, with two flags of its own first:
//   --hwy_target=NAME   restrict Highway's dispatch to one target of this build that the CPU
//                       supports (hwy::TargetName: AVX2, AVX3, AVX3_DL, NEON, ...), e.g. an AVX2
//                       machine's kernels (f32 and int8) on an AVX-512 one;
//   --q8_no_dot_extension  the AVX2 / NEON int8 kernels without AVX-VNNI / sdot (ops::q8_allow_dot_extension).
int main(int argc, char** argv) {
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--hwy_target=", 0) == 0) {
      const std::string want = a.substr(13);
      int64_t found = 0;
      for (int64_t t : hwy::SupportedAndGeneratedTargets())
        if (strcasecmp(hwy::TargetName(t), want.c_str()) == 0) found = t;
      if (found == 0) {
        std::string have;
        for (int64_t t : hwy::SupportedAndGeneratedTargets()) have += std::string(" ") + hwy::TargetName(t);
        std::fprintf(stderr, "quant_bench: --hwy_target=%s is not a target of this build that this CPU supports (have:%s)\n",
                     want.c_str(), have.c_str());
        return 2;
      }
      hwy::SetSupportedTargetsForTest(found);
    } else if (a == "--q8_no_dot_extension") {
      spool::ops::q8_allow_dot_extension(false);
    } else {
      rest.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  if (benchmark::ReportUnrecognizedArguments(n, rest.data())) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
