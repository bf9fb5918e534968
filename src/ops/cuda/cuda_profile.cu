// CudaBackend's op scope (CudaOpScope: begin / end of every public op) and SPOOL_CUDA_PROFILE: host
// time and stream time per op (events recorded at each op's start and end), printed when the
// backend is destroyed.
#include "ops/cuda/cuda_internal.h"

namespace spool::ops {

void CudaBackend::Impl::harvest_op_events(bool block) {
  while (!op_events.empty()) {
    auto [name, a, b] = op_events.front();
    if (block) {
      CU(cudaEventSynchronize(b));
    } else {
      const cudaError_t r = cudaEventQuery(b);
      if (r == cudaErrorNotReady) break;
      CU(r);
    }
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, a, b));
    op_times[name].gpu_seconds += static_cast<double>(ms) * 1e-3;
    spare_op_events.push_back(a);
    spare_op_events.push_back(b);
    op_events.pop_front();
  }
}

cudaEvent_t CudaBackend::Impl::op_event() {
  if (!spare_op_events.empty()) {
    cudaEvent_t e = spare_op_events.back();
    spare_op_events.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  CU(cudaEventCreate(&e));
  return e;
}

void CudaBackend::Impl::begin(const char* name) {
  current_op = name;
  arena->reset();
  if (profile) {
    if (op != nullptr && op_ev0 != nullptr) spare_op_events.push_back(op_ev0);  // (an op that threw before end())
    op = name;
    op_t0 = std::chrono::steady_clock::now();
    if (name != nullptr) {
      op_ev0 = op_event();
      CU(cudaEventRecord(op_ev0, stream));
    }
  }
}

void CudaBackend::Impl::end() {
  current_op = nullptr;
  if (sync_each) CU(cudaStreamSynchronize(stream));
  if (profile && op != nullptr) {
    OpTime& t = op_times[op];
    ++t.calls;
    t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - op_t0).count();
    cudaEvent_t e1 = op_event();
    CU(cudaEventRecord(e1, stream));
    op_events.emplace_back(op, op_ev0, e1);
    if (op_events.size() > 4096) harvest_op_events(false);
    op = nullptr;
  }
}

void CudaBackend::Impl::report() const {
  const_cast<Impl*>(this)->harvest_op_events(true);
  const double life = std::chrono::duration<double>(std::chrono::steady_clock::now() - created).count();
  double total = 0, gpu = 0;
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& [name, t] : op_times) {
    total += t.seconds;
    gpu += t.gpu_seconds;
    rows.emplace_back(t.gpu_seconds, name);
  }
  std::sort(rows.rbegin(), rows.rend());
  std::fprintf(stderr, "cuda profile: %.3f s host / %.3f s stream time in backend ops of a %.3f s backend lifetime; %llu pointer queries\n",
               total, gpu, life, (unsigned long long)g_pointer_queries.load());
  for (const auto& [g, name] : rows) {
    const OpTime& t = op_times.at(name);
    const double n = static_cast<double>(std::max<uint64_t>(t.calls, 1));
    std::fprintf(stderr, "  %-24s %9llu calls  host %8.3f s %8.2f us/call  stream %8.3f s %8.2f us/call\n", name.c_str(),
                 (unsigned long long)t.calls, t.seconds, 1e6 * t.seconds / n, g, 1e6 * g / n);
  }
}

}  // namespace spool::ops
