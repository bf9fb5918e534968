// Decode GEMVs on CUDA against the GPU's memory bandwidth, measured in the same binary (Google
// Benchmark; built with SPOOL_CUDA, run on a machine with a GPU):
//   - BM_CopyBound: a device-to-device copy (cudaMemcpy of 1 GiB), GB/s counting the bytes read and
//     written: the practical HBM limit the GEMVs are set against;
//   - BM_Gemv: one packed-code weight (spool q2 .. q8, group 64) times one token, Backend::matmul
//     with the weight and activations in device memory (one k_gemv_quant launch), at the
//     Qwen3.6-35B-A3B shapes: lm_head (248320 x 2048), a dense projection (4096 x 2048) and one
//     expert's gate/up (1024 x 2048) and down (2048 x 512);
//   - BM_Routed: a whole routed-expert call of that model's MoE layer (Backend::expert_ffn_routed:
//     256 experts of H 2048, I 512, top-8, the routing ids in device memory; the job kernel, the
//     grouped gate/up and down GEMVs and the combine), GB/s over the 8 experts' bytes;
//   - BM_GemvMxfp4: MXFP4 weights (gpt-oss's expert layout) at gpt-oss-120b's expert shapes
//     (gate_up 5760 x 2880, down 2880 x 2880).
// Each iteration queues `kCalls` back-to-back calls and waits for the stream once (to_host of one
// float), so a small kernel's time includes the gap between launches, as in a decode step.
//   build/bench/cuda_gemv_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/cuda_backend.h"
#include "quant/codebook.h"
#include "quant/pack.h"
#include "quant/quantize.h"

namespace {

using spool::ops::CudaBackend;
using spool::ops::CudaBuffer;
using spool::ops::QType;
using spool::ops::WeightView;

constexpr int kCalls = 50;

CudaBackend& backend() {
  static CudaBackend be(0);
  return be;
}

float* dev_floats(CudaBuffer& b, size_t n, float v) {
  b = CudaBuffer(n * sizeof(float));
  const std::vector<float> h(n, v);
  b.upload(h.data(), n * sizeof(float));
  return static_cast<float*>(b.get());
}

void sync() {
  static CudaBuffer one;
  static float* d = dev_floats(one, 1, 0.0f);
  float h = 0;
  backend().to_host(d, 1, &h);
}

// A packed-code matrix with random codes, group scales 0.01 and the type's codebook, rotated
// (random signs) as spool's converter writes them: the kernels' cost does not depend on the values.
spool::quant::QuantizedMatrix random_quant(QType t, int64_t rows, int64_t cols, int g, uint64_t seed) {
  std::mt19937_64 r(seed);
  spool::quant::QuantizedMatrix m;
  m.type = t, m.rows = rows, m.cols = cols, m.group = g;
  m.qweight.resize(static_cast<size_t>(rows * spool::quant::row_bytes(t, cols, g)));
  for (auto& b : m.qweight) b = static_cast<uint8_t>(r());
  m.scales.assign(static_cast<size_t>(rows * (cols / g)), spool::quant::f32_to_f16(0.01f));
  const auto cb = spool::quant::codebook(t);
  m.codebook.assign(cb.begin(), cb.end());
  m.signs.resize(static_cast<size_t>(cols));
  for (auto& s : m.signs) s = (r() & 1) ? 1 : -1;
  return m;
}

// Times kCalls back-to-back decode products of the device weight `w` (one token of ones/2) per
// iteration; GB/s from `bytes` per call.
void time_gemv(benchmark::State& st, const WeightView& w, double bytes) {
  CudaBuffer xb, yb;
  const float* x = dev_floats(xb, static_cast<size_t>(w.cols), 0.5f);
  float* y = dev_floats(yb, static_cast<size_t>(w.rows), 0.0f);
  for (auto _ : st) {
    for (int i = 0; i < kCalls; ++i) backend().matmul(w, x, 1, y);
    sync();
  }
  st.counters["GB/s"] = benchmark::Counter(bytes * kCalls * st.iterations() / 1e9, benchmark::Counter::kIsRate);
  st.counters["us/call"] = benchmark::Counter(static_cast<double>(kCalls) * st.iterations(), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

void BM_CopyBound(benchmark::State& st) {
  const size_t bytes = size_t{1} << 30;
  CudaBuffer a(bytes), b(bytes);
  for (auto _ : st) {
    for (int i = 0; i < 4; ++i)
      if (cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice) != cudaSuccess) st.SkipWithError("cudaMemcpy failed");
  }
  st.counters["GB/s"] = benchmark::Counter(2.0 * 4 * static_cast<double>(bytes) * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CopyBound)->UseRealTime()->Unit(benchmark::kMicrosecond);

// Args: type, rows, cols.
void BM_Gemv(benchmark::State& st) {
  const QType t = static_cast<QType>(st.range(0));
  const int64_t rows = st.range(1), cols = st.range(2);
  const auto m = random_quant(t, rows, cols, 64, 1);
  const WeightView w = backend().upload(spool::ops::quant_weight_view(m.view()));
  const double bytes = static_cast<double>(m.view().nbytes());
  time_gemv(st, w, bytes);
  st.SetLabel(std::string(spool::quant::qtype_name(t)) + " " + std::to_string(rows) + "x" + std::to_string(cols) + " " +
              std::to_string(static_cast<int>(bytes / 1e6 * 10) / 10.0).substr(0, 6) + " MB");
}
void GemvArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"type", "rows", "cols"});
  for (auto [r, c] : {std::pair<int64_t, int64_t>{248320, 2048}, {4096, 2048}, {1024, 2048}, {2048, 512}})
    b->Args({static_cast<int64_t>(QType::kQ4), r, c});
  for (QType t : {QType::kQ2, QType::kQ3, QType::kQ5, QType::kQ6, QType::kQ8}) b->Args({static_cast<int64_t>(t), 248320, 2048});
}
BENCHMARK(BM_Gemv)->Apply(GemvArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);

// Args: type, experts' top-k. One MoE layer of the 35B shape (256 experts, H 2048, I 512).
void BM_Routed(benchmark::State& st) {
  const QType t = static_cast<QType>(st.range(0));
  const int K = static_cast<int>(st.range(1));
  constexpr int E = 256;
  constexpr int64_t H = 2048, I = 512;
  std::vector<spool::quant::QuantizedMatrix> store;
  std::vector<spool::ops::ExpertMats> experts;
  double bytes_each = 0;
  for (int e = 0; e < E; ++e) {
    store.push_back(random_quant(t, I, H, 64, 3 * e + 1));
    store.push_back(random_quant(t, I, H, 64, 3 * e + 2));
    store.back().signs = store[store.size() - 2].signs;  // gate and up share their rotation
    store.push_back(random_quant(t, H, I, 64, 3 * e + 3));
  }
  for (int e = 0; e < E; ++e) {
    spool::ops::ExpertMats m;
    m.gate = backend().upload(spool::ops::quant_weight_view(store[3 * e].view()));
    m.up = backend().upload(spool::ops::quant_weight_view(store[3 * e + 1].view()));
    m.down = backend().upload(spool::ops::quant_weight_view(store[3 * e + 2].view()));
    experts.push_back(m);
    bytes_each = static_cast<double>(store[0].view().nbytes() + store[1].view().nbytes() + store[2].view().nbytes());
  }
  const void* table = backend().make_expert_table(experts);
  if (table == nullptr) {
    st.SkipWithError("no routed expert path for these experts");
    return;
  }
  // 64 different routings (K distinct experts each), cycled through.
  constexpr int kRoutes = 64;
  std::mt19937_64 r(7);
  std::vector<int> ids;
  for (int i = 0; i < kRoutes; ++i) {
    std::vector<int> p(E);
    for (int e = 0; e < E; ++e) p[e] = e;
    std::shuffle(p.begin(), p.end(), r);
    ids.insert(ids.end(), p.begin(), p.begin() + K);
  }
  CudaBuffer idb(ids.size() * sizeof(int)), wb, xb, ob;
  idb.upload(ids.data(), ids.size() * sizeof(int));
  const float* wts = dev_floats(wb, static_cast<size_t>(K), 1.0f / K);
  const float* x = dev_floats(xb, static_cast<size_t>(H), 0.5f);
  float* out = dev_floats(ob, static_cast<size_t>(H), 0.0f);
  int i = 0;
  for (auto _ : st) {
    for (int c = 0; c < kCalls; ++c, i = (i + 1) % kRoutes)
      backend().expert_ffn_routed(table, x, 1, H, static_cast<const int*>(idb.get()) + i * K, wts, K, out);
    sync();
  }
  st.SetLabel(std::string(spool::quant::qtype_name(t)) + " top-" + std::to_string(K) + " of 256, " +
              std::to_string(static_cast<int>(K * bytes_each / 1e5) / 10.0).substr(0, 5) + " MB per call");
  st.counters["GB/s"] = benchmark::Counter(K * bytes_each * kCalls * st.iterations() / 1e9, benchmark::Counter::kIsRate);
  st.counters["us/call"] = benchmark::Counter(static_cast<double>(kCalls) * st.iterations(), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_Routed)
    ->ArgNames({"type", "K"})
    ->Args({static_cast<int64_t>(QType::kQ4), 8})
    ->Args({static_cast<int64_t>(QType::kQ8), 8})
    ->Args({static_cast<int64_t>(QType::kQ2), 8})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// Args: rows, cols. Random MXFP4 codes, E8M0 scales 2^-6.
void BM_GemvMxfp4(benchmark::State& st) {
  const int64_t rows = st.range(0), cols = st.range(1);
  std::mt19937_64 r(5);
  std::vector<uint8_t> blocks(static_cast<size_t>(rows * cols / 2)), scales(static_cast<size_t>(rows * cols / 32), 121);
  for (auto& b : blocks) b = static_cast<uint8_t>(r());
  const WeightView w = backend().upload(spool::ops::mxfp4_weight_view(rows, cols, blocks.data(), scales.data()));
  time_gemv(st, w, static_cast<double>(blocks.size() + scales.size()));
  st.SetLabel("mxfp4 " + std::to_string(rows) + "x" + std::to_string(cols));
}
BENCHMARK(BM_GemvMxfp4)->ArgNames({"rows", "cols"})->Args({5760, 2880})->Args({2880, 2880})->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  if (spool::ops::cuda_device_count() == 0) {
    std::fprintf(stderr, "cuda_gemv_bench: no CUDA device\n");
    return 1;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
