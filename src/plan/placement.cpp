#include "plan/placement.h"

#include <algorithm>

#include "common/error.h"
#include "common/sysinfo.h"

namespace spool::plan {

const char* vram_tier_name(VramTier t) {
  switch (t) {
    case VramTier::kNone: return "none";
    case VramTier::kAll: return "all";
    case VramTier::kStatic: return "static";
    case VramTier::kSlots: return "slots";
  }
  return "none";
}

Placement decide_placement(const PlacementFacts& f, const PlacementOptions& o) {
  Placement p;
  p.reserve = reserve_bytes(f.available);
  const bool has_experts = f.experts > 0;
  const bool asked_stream = o.stream.value_or(false);
  const uint64_t budget_if_streaming = o.cache_budget.value_or(auto_cache_budget(f.available, f.base, f.experts));
  bool stream = has_experts && asked_stream;
  bool static_share = false;

  // A GPU run whose dense part fits but whose experts do not fit in VRAM on top: a static share
  // over page-locked host memory, or the pinned streaming cache behind VRAM slots.
  if (f.gpu && has_experts) {
    const GpuPlacement pre = place_on_gpu(f.gpu->budget, f.gpu->dense, f.gpu->state, f.gpu->workspace, f.experts, asked_stream);
    if (pre.fits && !pre.experts_in_vram) {
      const bool all_in_ram = budget_if_streaming >= f.experts;
      static_share = o.vram_experts == VramExperts::kStatic || (o.vram_experts == VramExperts::kAuto && !asked_stream && all_in_ram);
      if (static_share && asked_stream)
        throw UsageError("--vram-experts static keeps the experts out of VRAM in page-locked host memory; it does not stream "
                         "(drop --stream, or use --vram-experts slots)");
      if (static_share && !all_in_ram)
        fail("--vram-experts static: the routed experts (%s) do not fit in the host memory available (%s, after the resident "
             "weights, KV and reserve; or --cache-budget-gb): page-locking them would exhaust it; use --vram-experts slots",
             format_bytes(f.experts).c_str(), format_bytes(f.available).c_str());
      if (!static_share && o.stream.value_or(true)) {
        p.pinned_tier = true;
        stream = true;
      }
    }
  }
  // Automatic: stream when everything resident does not fit.
  if (!o.stream.has_value() && !stream && !static_share && has_experts && must_stream(f.available, f.base, f.experts)) {
    stream = true;
    p.auto_streamed = true;
  }

  p.stream = stream;
  p.use_page_cache = o.page_cache.value_or(default_page_cache(f.file_bytes, f.available));
  if (stream) {
    p.cache_budget = budget_if_streaming;
    p.cache_budget_auto = !o.cache_budget.has_value();
    p.hold_all = p.pinned_tier && p.cache_budget_auto && p.cache_budget == f.experts;
    p.cache_slot_bytes = p.use_page_cache ? f.slot_bytes_page_cache : f.slot_bytes_direct;
    p.cache_peak = p.cache_slot_bytes > 0 ? cache_peak_bytes(p.cache_budget, p.cache_slot_bytes, f.top_k, f.expert_count)
                                          : p.cache_budget;
    p.peak = f.base.sum() + p.cache_peak;
  } else {
    p.peak = f.base.sum() + f.experts;
  }
  p.host_fits = p.peak + p.reserve <= f.available;

  if (f.gpu) {
    const GpuFacts& g = *f.gpu;
    p.gpu = place_on_gpu(g.budget, g.dense, g.state, g.workspace, f.experts, stream);
    if (p.gpu->experts_in_vram) {
      p.vram = VramTier::kAll;
    } else if (p.gpu->fits && has_experts) {
      p.vram = static_share ? VramTier::kStatic : VramTier::kSlots;
      p.vram_left = g.budget - g.dense - g.state - g.workspace;
      const uint64_t slots = g.expert_slot_bytes > 0 ? std::min(p.vram_left / g.expert_slot_bytes, f.expert_count) : 0;
      p.vram_slots = static_share || slots >= static_cast<uint64_t>(std::max(g.one_token, 1)) ? slots : 0;
    }
  }
  return p;
}

double rank_expert_share(int n_experts, int ranks) {
  if (ranks <= 1 || n_experts <= 0) return 1.0;
  const int most = (n_experts + ranks - 1) / ranks;
  return static_cast<double>(most) / static_cast<double>(n_experts);
}

PlacementFacts rank_facts(PlacementFacts f, int n_experts, int ranks) {
  if (ranks <= 1 || n_experts <= 0) return f;
  const double share = rank_expert_share(n_experts, ranks);
  const uint64_t mine = static_cast<uint64_t>(static_cast<double>(f.experts) * share);
  f.file_bytes = f.file_bytes >= f.experts ? f.file_bytes - f.experts + mine : f.file_bytes;
  f.experts = mine;
  f.expert_count = static_cast<uint64_t>(static_cast<double>(f.expert_count) * share + 0.5);
  return f;
}

}  // namespace spool::plan
