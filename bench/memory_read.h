// The physical limit a GEMV can approach, measured in the same binary as the kernels: read
// bandwidth as the sum of a buffer of st.range(0) MiB on st.range(1) threads (GB/s counter).
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "ops/thread_pool.h"
#include "ops/vec.h"

namespace spool::bench {

/// Google Benchmark body: Args({MiB, threads}).
inline void MemoryRead(benchmark::State& st) {
  const size_t bytes = static_cast<size_t>(st.range(0)) << 20;
  const int threads = static_cast<int>(st.range(1));
  std::vector<uint64_t> buf(bytes / 8, 1);
  spool::ops::ThreadPool pool(threads);
  std::vector<uint64_t> sums(threads);
  for (auto _ : st) {
    pool.parallel_for(static_cast<int64_t>(buf.size()), 4096, [&](int64_t b, int64_t e, int t) {
      sums[t] += spool::ops::read_sum(buf.data() + b, e - b);  // SIMD loads, as the kernels read
    });
    benchmark::DoNotOptimize(sums.data());
  }
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes) * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}

}  // namespace spool::bench
