// Where a run keeps the routed experts: resident in host memory or streamed through a cache from
// disk (with its budget and page-cache policy), and on a GPU run whether they go to VRAM, a fixed
// share of VRAM over page-locked host memory (static), or VRAM slots over a host tier. One pure
// function, decide_placement(), from measured facts and the user's options: engine::load() places
// the model by it, and `spool plan` reports it (plan::project for the host part, the GPU part in
// cli/plan.cpp). No I/O and no device calls: the callers measure, this decides.
#pragma once

#include <cstdint>
#include <optional>

#include "plan/budget.h"
#include "plan/gpu.h"

namespace spool::plan {

/// --vram-experts: how routed experts that do not all fit the VRAM budget are placed.
enum class VramExperts {
  kAuto,    // static when every expert fits in host memory and --stream was not given, else slots
  kStatic,  // a fixed share in VRAM, the rest copied once to page-locked host memory the GPU reads in place
  kSlots,   // LRU VRAM slots in front of a host tier (the pinned streaming cache, or the mapping)
};

/// The GPU facts of a CUDA run, in bytes.
struct GpuFacts {
  uint64_t budget = 0;     // the VRAM budget (--vram-budget-gb, or plan::auto_vram_budget)
  uint64_t dense = 0;      // dense weights and parameters uploaded at load
  uint64_t state = 0;      // KV cache and recurrent state of every sequence at the context
  uint64_t workspace = 0;  // the workspace arena
  uint64_t expert_slot_bytes = 0;  // one routed expert in a VRAM slot; 0 = not known (Placement::vram_slots stays 0)
  int one_token = 1;               // experts one token routes to per MoE layer (fewer slots than this: none)
};

/// What decide_placement() reads: sizes measured from the checkpoint, the machine and the run.
struct PlacementFacts {
  BaseNeeds base;                 // resident needs besides the routed experts (plan::base_needs)
  uint64_t available = 0;         // bytes of host memory the run may use
  uint64_t experts = 0;           // bytes of every routed expert (0: the model has none)
  uint64_t expert_count = 0;      // routed experts (MoE layers x experts per layer)
  uint64_t slot_bytes_page_cache = 0;  // one slot of the streaming cache reading through the page cache
                                       // (plan::expert_slot_bytes(ck, spec, false)); 0 = not known
  uint64_t slot_bytes_direct = 0;      // the same reading with O_DIRECT (aligned slots; expert_slot_bytes(.., true))
  int top_k = 0;                  // experts per token (the cache grows to serve one token)
  uint64_t file_bytes = 0;        // bytes of the model files (the default page-cache policy)
  std::optional<GpuFacts> gpu;    // set on a GPU run
};

/// The user's placement options.
struct PlacementOptions {
  std::optional<bool> stream;             // --stream / --no-stream; nullopt = automatic (stream if it does not fit)
  std::optional<uint64_t> cache_budget;   // --cache-budget-gb in bytes; nullopt = auto (plan::auto_cache_budget)
  std::optional<bool> page_cache;         // --use-page-cache / --no-page-cache; nullopt = plan::default_page_cache
  VramExperts vram_experts = VramExperts::kAuto;  // --vram-experts
};

/// Where the routed experts of a GPU run live (Placement::vram).
enum class VramTier {
  kNone,    // no GPU, no routed experts, or the dense part does not fit (GpuPlacement::fits false)
  kAll,     // every routed expert resident in VRAM
  kStatic,  // a fixed share in VRAM (vram_left bytes), the rest in page-locked host memory read in place
  kSlots,   // VRAM slots (vram_left bytes) in front of the host tier; every miss copied when used
};
/// "none", "all", "static" or "slots".
const char* vram_tier_name(VramTier t);

/// The decision.
struct Placement {
  bool stream = false;             // experts read through the streaming cache (else resident in host memory)
  bool auto_streamed = false;      // streaming because the experts did not fit (options.stream unset)
  bool cache_budget_auto = false;  // cache_budget is --cache-budget-gb auto's
  uint64_t cache_budget = 0;       // bytes of the expert cache (stream; 0 otherwise)
  bool hold_all = false;           // the pinned host tier holds every expert (StreamingOptions::hold_all)
  bool use_page_cache = false;     // streaming reads go through the page cache (else O_DIRECT)
  uint64_t cache_slot_bytes = 0;   // the cache's slot at that policy (stream; 0 when the facts do not know it)
  uint64_t cache_peak = 0;         // bytes the cache holds when full (plan::cache_peak_bytes; the budget when the
                                   // slot is not known; stream)
  uint64_t reserve = 0;            // plan::reserve_bytes(available)
  uint64_t peak = 0;               // resident host bytes: base + experts (resident) or base + cache_peak (stream)
  bool host_fits = false;          // peak + reserve <= available
  // A GPU run (facts.gpu set):
  std::optional<GpuPlacement> gpu; // plan::place_on_gpu's split (fits: dense + state + workspace within the budget)
  VramTier vram = VramTier::kNone;
  bool pinned_tier = false;        // the streaming cache behind the VRAM slots is page-locked (plan::kHostTierRule)
  uint64_t vram_left = 0;          // bytes of the budget for the static share or the slots (kStatic, kSlots)
  uint64_t vram_slots = 0;         // experts vram_left holds (GpuFacts::expert_slot_bytes known, at most every
                                   // expert); kSlots: 0 when fewer than one token's (each expert copied when used)
};

/// Decides the placement. The rule:
/// - GPU run with routed experts whose dense part fits the VRAM budget but whose experts do not
///   fit on top (plan::place_on_gpu with options.stream): static when options.vram_experts is
///   static, or auto with every expert fitting in host memory (the cache budget, or auto's) and
///   --stream not given; otherwise, unless --no-stream, the experts stream through a page-locked
///   host tier (pinned_tier; hold_all when auto's budget holds every expert).
/// - Otherwise, with options.stream unset, stream when base + experts + reserve exceed
///   `available` (plan::must_stream); resident when not.
/// - A GPU run then places the experts by plan::place_on_gpu with the final stream choice: all
///   in VRAM, or a static share / slots in the budget left.
/// Throws spool::UsageError for --vram-experts static with --stream, spool::Error for
/// --vram-experts static when the experts do not fit in host memory. Pure: no I/O.
Placement decide_placement(const PlacementFacts& facts, const PlacementOptions& options);

/// The largest share of a MoE layer's `n_experts` routed experts that one of `ranks` ranks owns
/// under expert parallelism (dist::owned_experts: contiguous blocks of at most ceil(E / R); owners
/// balanced by --expert-owners keep the same cap, dist::ExpertOwners::balanced), as a fraction of
/// the layer's experts; 1 for one rank or no experts.
double rank_expert_share(int n_experts, int ranks);

/// `f` as the rank with the largest share sees it under expert parallelism over `ranks` ranks: it
/// reads, caches and keeps resident only its own routed experts (experts, expert_count and the
/// files' expert bytes scaled by rank_expert_share); the dense part, KV and workspace are replicated
/// (unchanged). `f` itself for one rank.
PlacementFacts rank_facts(PlacementFacts f, int n_experts, int ranks);

}  // namespace spool::plan
