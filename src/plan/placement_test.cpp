// plan::decide_placement, table-driven: host memory (resident / streamed, cache budget and its
// peak, page-cache policy) and the GPU tiers (all in VRAM, static share, slots over the pinned
// streaming cache or the mapping), with the option errors.
#include "plan/placement.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "common/error.h"

namespace spool::plan {
namespace {

constexpr uint64_t M = uint64_t{1} << 20, G = uint64_t{1} << 30;

// A model of `experts` bytes in 100 MiB experts, 1 GiB of other resident needs, top-8, on a
// machine with `available` bytes; files of the experts' size plus 1 GiB.
PlacementFacts host(uint64_t experts, uint64_t available) {
  PlacementFacts f;
  f.base.dense = G;
  f.available = available;
  f.experts = experts;
  f.expert_count = experts / (100 * M);
  f.slot_bytes_page_cache = 100 * M;
  f.slot_bytes_direct = 104 * M;
  f.top_k = 8;
  f.file_bytes = experts + G;
  return f;
}

// The same on a GPU of `budget` bytes holding 2 GiB of dense weights, 1 GiB of KV/state and 1 GiB of workspace.
PlacementFacts gpu(uint64_t experts, uint64_t available, uint64_t budget = 24 * G) {
  PlacementFacts f = host(experts, available);
  f.gpu = GpuFacts{.budget = budget, .dense = 2 * G, .state = G, .workspace = G, .expert_slot_bytes = 100 * M, .one_token = 8};
  return f;
}

struct Want {
  bool stream = false;
  bool auto_streamed = false;
  uint64_t cache_budget = 0;
  bool cache_budget_auto = false;
  bool hold_all = false;
  bool use_page_cache = false;
  uint64_t cache_peak = 0;
  uint64_t peak = 0;
  bool host_fits = true;
  VramTier vram = VramTier::kNone;
  bool gpu_fits = true;  // (GPU cases)
  bool pinned_tier = false;
  uint64_t vram_left = 0;
  uint64_t vram_slots = 0;
};

struct Case {
  std::string name;
  PlacementFacts facts;
  PlacementOptions options;
  Want want;
};

std::vector<Case> cases() {
  std::vector<Case> c;
  // ---- host memory ----
  c.push_back({"no experts: resident whatever is asked", host(0, 8 * G), {.stream = true}, {.use_page_cache = true, .peak = G}});
  c.push_back({"fits: resident", host(4 * G, 8 * G), {}, {.use_page_cache = false, .peak = 5 * G}});
  {
    // 1 GiB + 10 GiB + 512 MiB reserve > 8 GiB: streamed through O_DIRECT (11 GiB of files >= 0.6 x 8 GiB), the
    // auto budget is 8 GiB - 1 GiB - 512 MiB = 6.5 GiB, i.e. 64 slots of 104 MiB.
    const uint64_t budget = 8 * G - G - 512 * M;
    c.push_back({"does not fit: streamed, auto budget", host(10 * G, 8 * G), {},
                 {.stream = true, .auto_streamed = true, .cache_budget = budget, .cache_budget_auto = true,
                  .cache_peak = budget / (104 * M) * 104 * M, .peak = G + budget / (104 * M) * 104 * M}});
  }
  c.push_back({"--no-stream keeps it resident and says it does not fit", host(10 * G, 8 * G), {.stream = false},
               {.peak = 11 * G, .host_fits = false}});
  c.push_back({"--stream with a budget, page cache forced on", host(4 * G, 64 * G),
               {.stream = true, .cache_budget = 2 * G, .page_cache = true},
               {.stream = true, .cache_budget = 2 * G, .use_page_cache = true, .cache_peak = 20 * 100 * M, .peak = G + 2000 * M}});
  c.push_back({"a budget below one token's experts grows to top-k slots", host(4 * G, 64 * G), {.stream = true, .cache_budget = 150 * M},
               {.stream = true, .cache_budget = 150 * M, .use_page_cache = true, .cache_peak = 8 * 100 * M, .peak = G + 800 * M}});
  c.push_back({"files under 0.6 x available read through the page cache", host(4 * G, 64 * G), {.stream = true},
               {.stream = true, .cache_budget = 4 * G, .cache_budget_auto = true, .use_page_cache = true,
                .cache_peak = 40 * 100 * M, .peak = G + 4000 * M}});
  // ---- GPU: 24 GiB budget, 4 GiB of dense + state + workspace, 20 GiB left ----
  c.push_back({"GPU: every expert fits in VRAM", gpu(16 * G, 64 * G), {},
               {.use_page_cache = true, .peak = 17 * G, .vram = VramTier::kAll}});
  c.push_back({"GPU: dense part over the budget", gpu(16 * G, 64 * G, 3 * G), {},
               {.use_page_cache = true, .peak = 17 * G, .gpu_fits = false}});
  c.push_back({"GPU: experts over VRAM, all in RAM: static share", gpu(40 * G, 64 * G), {},
               {.peak = 41 * G, .vram = VramTier::kStatic, .vram_left = 20 * G, .vram_slots = 204}});
  c.push_back({"GPU: --no-stream under auto is static too", gpu(40 * G, 64 * G), {.stream = false},
               {.peak = 41 * G, .vram = VramTier::kStatic, .vram_left = 20 * G, .vram_slots = 204}});
  {
    // Not all in 32 GiB: the pinned streaming cache (auto budget 32 GiB - 1 GiB - 5% reserve) behind VRAM slots.
    const uint64_t budget = 32 * G - G - 32 * G / 20;
    c.push_back({"GPU: experts over VRAM and RAM: slots over the pinned cache", gpu(40 * G, 32 * G), {},
                 {.stream = true, .cache_budget = budget, .cache_budget_auto = true, .cache_peak = budget / (104 * M) * 104 * M,
                  .peak = G + budget / (104 * M) * 104 * M, .vram = VramTier::kSlots, .pinned_tier = true,
                  .vram_left = 20 * G, .vram_slots = 204}});
  }
  c.push_back({"GPU: --vram-experts slots: the pinned cache holds every expert", gpu(40 * G, 64 * G), {.vram_experts = VramExperts::kSlots},
               {.stream = true, .cache_budget = 40 * G, .cache_budget_auto = true, .hold_all = true, .cache_peak = 40 * G / (104 * M) * 104 * M,
                .peak = G + 40 * G / (104 * M) * 104 * M, .vram = VramTier::kSlots, .pinned_tier = true, .vram_left = 20 * G,
                .vram_slots = 204}});
  c.push_back({"GPU: --vram-experts slots --no-stream: slots over the mapping", gpu(40 * G, 64 * G),
               {.stream = false, .vram_experts = VramExperts::kSlots},
               {.peak = 41 * G, .vram = VramTier::kSlots, .vram_left = 20 * G, .vram_slots = 204}});
  c.push_back({"GPU: --stream keeps experts that would fit VRAM in host memory", gpu(16 * G, 64 * G), {.stream = true},
               {.stream = true, .cache_budget = 16 * G, .cache_budget_auto = true, .hold_all = true, .use_page_cache = true,
                .cache_peak = 163 * 100 * M, .peak = G + 163 * 100 * M, .vram = VramTier::kSlots, .pinned_tier = true,
                .vram_left = 20 * G, .vram_slots = 163}});
  c.push_back({"GPU: fewer slots than one token's experts: none", gpu(40 * G, 32 * G, 4 * G + 500 * M), {.cache_budget = 8 * G},
               {.stream = true, .cache_budget = 8 * G, .cache_peak = 8 * G / (104 * M) * 104 * M, .peak = G + 8 * G / (104 * M) * 104 * M,
                .vram = VramTier::kSlots, .pinned_tier = true, .vram_left = 500 * M, .vram_slots = 0}});
  c.push_back({"GPU: experts fit VRAM but not host memory: auto-streamed, then slots", gpu(16 * G, 16 * G), {},
               {.stream = true, .auto_streamed = true, .cache_budget = 16 * G - G - 16 * G / 20, .cache_budget_auto = true,
                .cache_peak = (16 * G - G - 16 * G / 20) / (104 * M) * 104 * M, .peak = G + (16 * G - G - 16 * G / 20) / (104 * M) * 104 * M,
                .vram = VramTier::kSlots, .vram_left = 20 * G, .vram_slots = 163}});
  return c;
}

TEST(DecidePlacement, Table) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Placement p = decide_placement(c.facts, c.options);
    const Want& w = c.want;
    EXPECT_EQ(p.stream, w.stream);
    EXPECT_EQ(p.auto_streamed, w.auto_streamed);
    EXPECT_EQ(p.cache_budget, w.cache_budget);
    EXPECT_EQ(p.cache_budget_auto, w.cache_budget_auto);
    EXPECT_EQ(p.hold_all, w.hold_all);
    EXPECT_EQ(p.use_page_cache, w.use_page_cache);
    EXPECT_EQ(p.cache_peak, w.cache_peak);
    EXPECT_EQ(p.peak, w.peak);
    EXPECT_EQ(p.reserve, reserve_bytes(c.facts.available));
    EXPECT_EQ(p.host_fits, w.host_fits);
    EXPECT_EQ(p.host_fits, p.peak + p.reserve <= c.facts.available);
    EXPECT_STREQ(vram_tier_name(p.vram), vram_tier_name(w.vram));
    EXPECT_EQ(p.gpu.has_value(), c.facts.gpu.has_value());
    if (p.gpu) {
      EXPECT_EQ(p.gpu->fits, w.gpu_fits);
      EXPECT_EQ(p.gpu->experts_in_vram, w.vram == VramTier::kAll);
    }
    EXPECT_EQ(p.pinned_tier, w.pinned_tier);
    EXPECT_EQ(p.vram_left, w.vram_left);
    EXPECT_EQ(p.vram_slots, w.vram_slots);
  }
}

// Without a known slot size the cache's peak is its budget.
TEST(DecidePlacement, UnknownSlotSizePeakIsTheBudget) {
  PlacementFacts f = host(4 * G, 64 * G);
  f.slot_bytes_page_cache = f.slot_bytes_direct = 0;
  const Placement p = decide_placement(f, {.stream = true, .cache_budget = 3 * G});
  EXPECT_EQ(p.cache_slot_bytes, 0u);
  EXPECT_EQ(p.cache_peak, 3 * G);
}

TEST(DecidePlacement, ContradictoryOptionsAreErrors) {
  // static keeps the experts in page-locked host memory: it does not stream
  EXPECT_THROW(decide_placement(gpu(40 * G, 64 * G), {.stream = true, .vram_experts = VramExperts::kStatic}), UsageError);
  // static when every expert does not fit in host memory: page-locking them would exhaust it
  try {
    decide_placement(gpu(40 * G, 32 * G), {.vram_experts = VramExperts::kStatic});
    ADD_FAILURE() << "no error";
  } catch (const UsageError&) {
    ADD_FAILURE() << "a usage error; the options are valid, the machine is too small";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--vram-experts static"), std::string::npos) << e.what();
  }
  // the same options where everything fits in VRAM: nothing to place statically, no error
  EXPECT_EQ(decide_placement(gpu(16 * G, 64 * G), {.vram_experts = VramExperts::kStatic}).vram, VramTier::kAll);
}

}  // namespace
}  // namespace spool::plan
