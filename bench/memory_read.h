// The physical limit a GEMV can approach, measured in the same binary as the kernels: read
// bandwidth as the sum of a buffer of st.range(0) MiB on st.range(1) threads (GB/s counter).
#pragma once

#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "ops/thread_pool.h"

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
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t i = b; i + 4 <= e; i += 4) {
        s0 += buf[i];
        s1 += buf[i + 1];
        s2 += buf[i + 2];
        s3 += buf[i + 3];
      }
      sums[t] += s0 + s1 + s2 + s3;
    });
    benchmark::DoNotOptimize(sums.data());
  }
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes) * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}

}  // namespace spool::bench
