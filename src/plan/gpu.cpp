#include "plan/gpu.h"

#include <algorithm>

namespace spool::plan {

uint64_t auto_vram_budget(uint64_t total, uint64_t free) {
  if (free == 0) return total / 10 * 9;  // not known (cudaMemGetInfo failed)
  const uint64_t reserve = uint64_t{512} << 20;
  return std::min(total / 10 * 9, free > reserve ? free - reserve : 0);
}

GpuPlacement place_on_gpu(uint64_t budget, uint64_t dense, uint64_t state, uint64_t workspace, uint64_t experts,
                          bool stream) {
  GpuPlacement p{.budget = budget, .dense = dense, .state = state, .workspace = workspace, .experts = experts};
  const uint64_t base = dense + state + workspace;
  p.fits = base <= budget;
  p.experts_in_vram = p.fits && experts > 0 && !stream && experts <= budget - base;
  return p;
}

GpuProjection project_gpu(const GpuPlacement& placement, uint64_t expert_bytes_per_token, uint64_t expert_slot_bytes,
                          uint64_t expert_count, int top_k, std::optional<double> h2d_gbps) {
  GpuProjection g;
  g.placement = placement;
  g.h2d_gbps = h2d_gbps;
  if (!placement.experts_in_vram && placement.experts > 0 && placement.fits) {
    const uint64_t left = placement.budget - placement.dense - placement.state - placement.workspace;
    const uint64_t slots = expert_slot_bytes > 0 ? std::min(left / expert_slot_bytes, expert_count) : 0;
    if (slots >= static_cast<uint64_t>(std::max(top_k, 1))) {
      g.vram_slots = slots;
      g.vram_hit_rate = expert_count > 0 ? static_cast<double>(slots) / static_cast<double>(expert_count) : 0;
    }
    g.h2d_bytes_per_token = static_cast<uint64_t>(static_cast<double>(expert_bytes_per_token) * (1.0 - g.vram_hit_rate) + 0.5);
    if (h2d_gbps && *h2d_gbps > 0 && g.h2d_bytes_per_token > 0) g.tok_s_h2d_bound = *h2d_gbps * 1e9 / static_cast<double>(g.h2d_bytes_per_token);
  }
  return g;
}

}  // namespace spool::plan
