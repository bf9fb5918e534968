// Micro-benchmarks (Google Benchmark): weight-streaming GEMV/GEMM throughput of the matmul
// kernels in GB/s of weights, next to a plain memory-read baseline on the same buffer sizes
// (the machine's physical limit for decode).
//   build/bench/kernels_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "memory_read.h"
#include "ops/kv_cache.h"
#include "ops/matmul.h"
#include "ops/thread_pool.h"

namespace {

using spool::ops::WType;

std::vector<uint16_t> random_bf16(size_t n) {
  std::mt19937 g(1);
  std::normal_distribution<float> d(0, 0.02f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = spool::ops::f32_to_bf16(d(g));
  return v;
}

void BM_MemoryRead(benchmark::State& st) { spool::bench::MemoryRead(st); }
BENCHMARK(BM_MemoryRead)->Args({1024, 1})->Args({1024, 2})->Args({4, 1})->UseRealTime();

// Decode GEMV: y = W x for a bf16 W [rows, cols].
void BM_GemvBF16(benchmark::State& st) {
  const int64_t rows = st.range(0), cols = st.range(1);
  const int threads = static_cast<int>(st.range(2));
  std::vector<uint16_t> w = random_bf16(static_cast<size_t>(rows * cols));
  std::vector<float> x(cols, 0.5f), y(rows);
  spool::ops::WeightView v{WType::kBF16, rows, cols, w.data()};
  spool::ops::ThreadPool pool(threads);
  for (auto _ : st) {
    spool::ops::matmul(v, x.data(), 1, y.data(), &pool);
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(v.nbytes()) * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GemvBF16)
    ->Args({8192, 2048, 1})
    ->Args({8192, 2048, 2})
    ->Args({248320, 2048, 2})  // Qwen3.6 lm_head (1 GB): DRAM-bound
    ->Args({8256, 256, 1})     // demo lm_head
    ->Args({8256, 256, 2})
    ->Args({512, 256, 2})
    ->UseRealTime();

// Prefill GEMM: Y = X W^T for T tokens.
void BM_GemmBF16(benchmark::State& st) {
  const int64_t rows = st.range(0), cols = st.range(1), T = st.range(2);
  std::vector<uint16_t> w = random_bf16(static_cast<size_t>(rows * cols));
  std::vector<float> x(T * cols, 0.5f), y(T * rows);
  spool::ops::WeightView v{WType::kBF16, rows, cols, w.data()};
  spool::ops::ThreadPool pool(2);
  for (auto _ : st) {
    spool::ops::matmul(v, x.data(), T, y.data(), &pool);
    benchmark::DoNotOptimize(y.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * cols * T * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GemmBF16)->Args({2048, 2048, 64})->Args({2048, 2048, 512})->Args({512, 256, 512})->UseRealTime();

}  // namespace

BENCHMARK_MAIN();

// Decode attention over a long context (2 KV heads, a GQA group of 2 query heads each).
void BM_AttentionDecode(benchmark::State& st) {
  const int64_t n = st.range(0);
  const int hd = 64, nh = 4, nkv = 2;
  spool::ops::KvCache kv;
  kv.configure(static_cast<spool::ops::KvType>(st.range(2)), nkv, hd);
  kv.reserve(n, 0);
  std::vector<float> row(static_cast<size_t>(nkv) * hd, 0.01f);
  for (int64_t p = 0; p < n; ++p) kv.write(p, row.data(), row.data());
  std::vector<float> q(static_cast<size_t>(nh) * hd, 0.1f);
  std::vector<float> out(static_cast<size_t>(nh) * hd);
  spool::ops::ThreadPool pool(static_cast<int>(st.range(1)));
  for (auto _ : st) {
    spool::ops::attention(q.data(), 1, nh, kv, n - 1, 0.125f, out.data(), &pool);
    benchmark::DoNotOptimize(out.data());
  }
  st.counters["KV GB/s"] = benchmark::Counter(static_cast<double>(kv.bytes_per_position()) * n * st.iterations() / 1e9,
                                              benchmark::Counter::kIsRate);
}
// Args: context, threads, KvType (0 f32, 1 f16, 2 int8).
BENCHMARK(BM_AttentionDecode)->Args({2332, 1, 0})->Args({2332, 2, 0})->Args({32768, 2, 0})->Args({32768, 2, 1})->Args({32768, 2, 2})->UseRealTime();
