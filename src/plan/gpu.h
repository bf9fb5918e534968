// What a CUDA run (--device cuda) keeps in VRAM, and the decode bound that follows from it.
// One rule for the loader (engine/loader.cpp, which places the model) and `spool plan` (which
// projects it from the headers): the dense weights, the KV cache and recurrent state of every
// sequence at the context and the workspace arena always go to the GPU; the routed experts go
// too when all of them fit the VRAM budget on top (and streaming was not asked for); otherwise
// they stay in host memory (the resident mapping or the streaming cache) and every expert a
// token routes to is copied to the GPU when used.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace spool::plan {

/// The host tier behind the VRAM expert slots of a CUDA run whose experts do not all fit (the
/// loader's rule, printed in its startup log): the streaming cache, page-locked, unless
/// --no-stream keeps the pageable mapping; sized by --cache-budget-gb, or auto: every expert
/// when they all fit the memory left, else what is left, with disk behind it.
inline constexpr const char* kHostTierRule =
    "the RAM tier behind the VRAM slots is the streaming cache, page-locked (pinned) so that slot misses copy at the "
    "link's pinned speed; --cache-budget-gb sizes it, auto holds every expert when they all fit in the memory left "
    "(each read from disk once, then kept), else what is left with disk behind it (--no-stream keeps the pageable mapping)";

/// VRAM placement of a CUDA run, in bytes.
struct GpuPlacement {
  uint64_t budget = 0;     // --vram-budget-gb (auto: 90% of the card's memory)
  uint64_t dense = 0;      // dense weights and parameters uploaded at load
  uint64_t state = 0;      // KV + recurrent state of every sequence at the context
  uint64_t workspace = 0;  // the workspace arena (activations of the largest step)
  uint64_t experts = 0;    // every routed expert
  bool fits = false;             // dense + state + workspace <= budget (else the run is refused)
  bool experts_in_vram = false;  // the routed experts are resident in VRAM too
  /// Bytes placed in VRAM: dense + state + workspace, plus the experts when experts_in_vram.
  uint64_t used() const { return dense + state + workspace + (experts_in_vram ? experts : 0); }
};

/// The VRAM budget `--vram-budget-gb auto` stands for on a GPU of `total` bytes with `free` bytes
/// free now (cudaMemGetInfo; other processes' allocations are not ours to take): free less 512 MiB
/// for the CUDA context's own allocations (cuBLAS workspace, streams), at most 90% of the card; 90%
/// of the card when `free` is 0 (unknown: the runtime did not say).
uint64_t auto_vram_budget(uint64_t total, uint64_t free);

/// The placement rule above. `stream`: the user asked to stream experts (--stream or a cache
/// budget), which keeps them in host memory.
GpuPlacement place_on_gpu(uint64_t budget, uint64_t dense, uint64_t state, uint64_t workspace, uint64_t experts,
                          bool stream);

}  // namespace spool::plan
