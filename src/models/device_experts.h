// DeviceExperts: routed experts resident in a GPU backend's memory. At construction every expert
// of every MoE layer is taken once from a host provider (the mmap'd checkpoint's ResidentExperts)
// and copied with Backend::upload; acquire() then hands out the device views, so decode reads
// expert weights from VRAM and nothing crosses the host link per token. The engine chooses it
// when dense weights + KV + workspace + experts fit --vram-budget-gb (engine/loader.cpp); when
// they do not, DeviceExpertCache keeps as many as the budget holds in VRAM slots (LRU) in front
// of the host provider.
#pragma once

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "experts/provider.h"
#include "ops/backend.h"

namespace spool::models {

class DeviceExperts final : public experts::ExpertProvider {
 public:
  /// Uploads experts [0, n_experts) of each layer l with moe_layers[l] from `source` (acquired
  /// and released one at a time) to `be` (which must outlive this provider). Throws
  /// spool::Error when the source fails or device memory runs out.
  DeviceExperts(experts::ExpertProvider& source, ops::Backend& be, const std::vector<bool>& moe_layers, int n_experts);
  void acquire(int layer, std::span<const int> ids, std::span<experts::ExpertWeights> out) override;
  void release(int layer) override {}
  std::string describe() const override;
  /// Bytes of the weights uploaded (their host sizes: codes, scales, codebooks, signs).
  uint64_t bytes() const { return bytes_; }

 private:
  std::vector<std::vector<experts::ExpertWeights>> experts_;  // [layer][expert], device views
  uint64_t bytes_ = 0;
  const char* device_ = "";
};

/// The VRAM tier of a GPU run whose routed experts do not all fit: a fixed number of expert slots
/// in the backend's memory (Backend::alloc_weight_slot), filled from a host provider (the
/// resident mapping, or the streaming cache with its own RAM tier and disk behind it) and kept in
/// least-recently-used order by (layer, expert). acquire() hands out slot views: a hit costs
/// nothing on the host link, a miss copies the expert into the least recently used slot not in
/// use (Backend::copy_weight_into). Slots handed out by acquire(layer) stay in use until
/// release(layer) (or until that acquire fails); max_batch() is the number of slots (at most the
/// source's), so the MoE block splits larger sets. prepare() forwards the experts not in a slot
/// to the source; one that is in a slot by the time of its acquire() is unprepared there.
/// The bytes are the same as the host provider's, so the logits are bit-identical to it.
class DeviceExpertCache final : public experts::ExpertProvider {
 public:
  /// Per-tier counts since construction.
  struct Stats {
    uint64_t hits = 0, misses = 0;  // experts acquired from a slot / copied into one
    uint64_t bytes_copied = 0;      // host -> slot bytes (packed sizes)
  };
  /// `budget_bytes` of slots on `be` (which must outlive this provider; one allocation), each
  /// sized for the largest expert 0 of the MoE layers (moe_layers[l]; an expert larger than a
  /// slot is an error at its acquire). Throws spool::Error when the budget holds fewer than
  /// `min_slots` experts (the experts one token routes to) or the memory cannot be had.
  DeviceExpertCache(std::shared_ptr<experts::ExpertProvider> source, ops::Backend& be, const std::vector<bool>& moe_layers,
                    int n_experts, uint64_t budget_bytes, int min_slots);
  void acquire(int layer, std::span<const int> ids, std::span<experts::ExpertWeights> out) override;
  /// Forwards the experts not in a slot to the source (a streaming source starts their reads).
  void prepare(int layer, std::span<const int> ids) override;
  void unprepare(int layer, std::span<const int> ids) override;
  void release(int layer) override;
  std::string describe() const override;
  int max_batch() const override { return std::min(static_cast<int>(slots_.size()), source_->max_batch()); }
  /// Number of slots and the bytes of one.
  size_t slots() const { return slots_.size(); }
  uint64_t slot_bytes() const { return slot_bytes_; }
  const Stats& stats() const { return stats_; }

 private:
  struct Slot {
    int layer = -1, expert = -1;  // what it holds (-1: empty)
    uint64_t used = 0;            // LRU clock of its last acquire
    bool in_use = false;          // handed out by acquire(layer) and not released yet
    char* mem = nullptr;          // slot_bytes_ of backend memory: gate | up | down
    experts::ExpertWeights views; // views into mem
  };
  std::shared_ptr<experts::ExpertProvider> source_;
  ops::Backend& be_;
  int n_experts_ = 0;
  uint64_t slot_bytes_ = 0, clock_ = 0;
  std::vector<Slot> slots_;
  bool valid(int layer, int id) const;
  std::vector<std::vector<int>> where_;  // [layer][expert] -> slot index or -1
  std::vector<std::vector<int>> prepared_;  // [layer] ids whose prepare() went to the source and is owed back
  Stats stats_;
};

/// Bytes a WeightView's data occupies (float rows, or codes + scales + codebook + signs).
uint64_t weight_view_bytes(const ops::WeightView& w);

}  // namespace spool::models
