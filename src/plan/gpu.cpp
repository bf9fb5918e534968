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

}  // namespace spool::plan
