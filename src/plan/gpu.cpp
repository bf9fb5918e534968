#include "plan/gpu.h"

namespace spool::plan {

GpuPlacement place_on_gpu(uint64_t budget, uint64_t dense, uint64_t state, uint64_t workspace, uint64_t experts,
                          bool stream) {
  GpuPlacement p{.budget = budget, .dense = dense, .state = state, .workspace = workspace, .experts = experts};
  const uint64_t base = dense + state + workspace;
  p.fits = base <= budget;
  p.experts_in_vram = p.fits && experts > 0 && !stream && experts <= budget - base;
  return p;
}

GpuProjection project_gpu(const GpuPlacement& placement, uint64_t expert_bytes_per_token, std::optional<double> h2d_gbps) {
  GpuProjection g;
  g.placement = placement;
  g.h2d_gbps = h2d_gbps;
  if (!placement.experts_in_vram && placement.experts > 0) {
    g.h2d_bytes_per_token = expert_bytes_per_token;
    if (h2d_gbps && *h2d_gbps > 0 && expert_bytes_per_token > 0) g.tok_s_h2d_bound = *h2d_gbps * 1e9 / static_cast<double>(expert_bytes_per_token);
  }
  return g;
}

}  // namespace spool::plan
