// The memory rule shared by the loader and the planner: how much must stay free, whether
// the experts can stay resident, and the expert-cache budget `auto` picks. One place, so
// `spool plan`'s command line and what `spool generate` decides on its own agree.
#pragma once

#include <cstdint>

namespace spool::plan {

/// Memory kept free for the OS, the page cache and allocator slack: max(512 MiB, 5% of
/// `available`), in bytes.
uint64_t reserve_bytes(uint64_t available);

/// Resident bytes a run needs besides the routed experts, in bytes.
struct BaseNeeds {
  uint64_t dense = 0;      // dense weights kept resident (mapped) + their f32 copies
  uint64_t state = 0;      // KV caches and recurrent state (with the growth transient)
  uint64_t workspace = 0;  // forward-pass scratch, logits, sampler
  uint64_t tokenizer = 0;  // the tokenizer's heap (plan::tokenizer_bytes)
  uint64_t tables = 0;     // the checkpoint's tensor tables (io::Checkpoint::table_bytes)
  uint64_t runtime = 0;    // executable, libraries, stacks
  uint64_t sum() const { return dense + state + workspace + tokenizer + tables + runtime; }
};

/// True when the run with every expert resident (`base` + `experts` bytes) does not fit in
/// `available` with the reserve kept free: the loader then streams experts.
bool must_stream(uint64_t available, const BaseNeeds& base, uint64_t experts);

/// The `--cache-budget-gb auto` budget in bytes: available - reserve - base needs, at least 0,
/// at most `experts` (the whole expert set).
uint64_t auto_cache_budget(uint64_t available, const BaseNeeds& base, uint64_t experts);

/// Bytes the expert cache holds when full: its capacity (budget / slot, at least 1) in slots,
/// or `top_k` slots when the budget holds fewer (the cache grows to serve a token), capped at
/// `n_slots_total` (every expert of the model).
uint64_t cache_peak_bytes(uint64_t budget, uint64_t slot_bytes, int top_k, uint64_t n_slots_total);

/// Whether streaming reads go through the page cache by default: model files < 0.6 x available.
bool default_page_cache(uint64_t file_bytes, uint64_t available);

}  // namespace spool::plan
