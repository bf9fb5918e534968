// DeviceExperts: routed experts resident in a GPU backend's memory. At construction every expert
// of every MoE layer is taken once from a host provider (the mmap'd checkpoint's ResidentExperts)
// and copied with Backend::upload; acquire() then hands out the device views, so decode reads
// expert weights from VRAM and nothing crosses the host link per token. The engine chooses it
// when dense weights + KV + workspace + experts fit --vram-budget-gb (engine/loader.cpp). When
// they do not, either the same class places a fixed share of the experts in VRAM (each layer's
// equal share, or a hot list's experts first) and the rest in page-locked host memory the GPU
// reads in place (--vram-experts static), or DeviceExpertCache keeps as many as the budget holds
// in VRAM slots (LRU) in front of the host provider (--vram-experts slots).
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "experts/provider.h"
#include "ops/backend.h"

namespace spool::experts {

class DeviceExperts final : public experts::ExpertProvider {
 public:
  /// Uploads experts [0, n_experts) of each layer l with moe_layers[l] from `source` (acquired
  /// and released one at a time) to `be` (which must outlive this provider). Throws
  /// spool::Error when the source fails or device memory runs out.
  DeviceExperts(experts::ExpertProvider& source, ops::Backend& be, const std::vector<bool>& moe_layers, int n_experts);
  /// Static placement across VRAM and pinned host memory: at most `vram_bytes` of experts (their
  /// packed sizes, ops::packed_weight_bytes) are uploaded — without a hot list, experts [0, n_l) of
  /// each MoE layer l, n_l being what an equal share of the budget holds of that layer's; with one
  /// ((layer, expert) pairs, hottest first: spool calibrate's pin file), each of its experts that
  /// still fits, in order (a pair named twice counts once), then the rest of the budget by id, a
  /// layer at a time in turn. The others are copied once into page-locked host memory
  /// that the backend's kernels read in place over the host link (Backend::alloc_host_mapped):
  /// each use streams those bytes to the GPU without a copy, a slot or a host decision, so the
  /// routed path (device_table) runs for every layer. Throws spool::Error when the backend has no
  /// mapped host memory or it cannot be had, device memory runs out, or a hot-list pair names no
  /// routed expert of this model.
  DeviceExperts(experts::ExpertProvider& source, ops::Backend& be, const std::vector<bool>& moe_layers, int n_experts,
                uint64_t vram_bytes, std::span<const std::pair<int, int>> hot = {});
  void acquire(int layer, std::span<const int> ids, std::span<experts::ExpertWeights> out) override;
  void release(int layer) override {}
  std::string describe() const override;
  /// The backend's table of layer's experts (made at construction when the backend has a routed
  /// expert path for them, Backend::make_expert_table), else nullptr.
  const void* device_table(int layer) const override {
    return layer >= 0 && static_cast<size_t>(layer) < tables_.size() ? tables_[static_cast<size_t>(layer)] : nullptr;
  }
  /// Bytes of the weights uploaded (their host sizes: codes, scales, codebooks, signs).
  uint64_t bytes() const { return bytes_; }
  /// Bytes of the experts in mapped host memory (static placement; 0 otherwise).
  uint64_t host_bytes() const { return host_bytes_; }
  /// Experts uploaded to the device and experts in mapped host memory (all MoE layers).
  int64_t experts_on_device() const { return n_device_; }
  int64_t experts_in_host() const { return n_host_; }
  /// Experts placed in VRAM because the hot list named them (static placement).
  int64_t experts_from_hot_list() const { return n_hot_; }
  /// Whether expert `expert` of `layer` is in device memory (false: mapped host memory, or no
  /// such expert).
  bool on_device(int layer, int expert) const;

 private:
  // Uploads `w` (expert e of layer l) into experts_[l][e]; adds to bytes_.
  void upload_expert(ops::Backend& be, size_t l, int e, const experts::ExpertWeights& w);
  // Makes the backend's expert table of every MoE layer.
  void make_tables(ops::Backend& be, const std::vector<bool>& moe_layers);
  uint64_t host_bytes_ = 0;
  int64_t n_device_ = 0, n_host_ = 0, n_hot_ = 0;
  std::vector<std::vector<bool>> in_vram_;  // static placement: [layer][expert] in VRAM (empty: all are)
  std::vector<std::vector<experts::ExpertWeights>> experts_;  // [layer][expert], device views
  std::vector<const void*> tables_;                           // [layer] Backend::make_expert_table (or nullptr)
  uint64_t bytes_ = 0;
  const char* device_ = "";
};

/// The VRAM tier of a GPU run whose routed experts do not all fit: a fixed number of expert slots
/// in the backend's memory (Backend::alloc_weight_slot), filled from a host provider (the RAM
/// tier: the streaming cache, page-locked on CUDA, with disk behind it; or the resident mapping)
/// and kept in least-recently-used order by (layer, expert). acquire() hands out slot views: a
/// hit costs nothing on the host link, a miss copies the expert into the least recently used
/// slot not in use (Backend::copy_weight_into: on CUDA a copy stream, so copies overlap compute).
/// Slots handed out by acquire(layer) stay in use until release(layer) (or until that acquire
/// fails); max_batch() is the number of slots (at most the source's), so the MoE block splits
/// larger sets.
///
/// prepare(layer, ids) (the MoE block calls it before the shared expert) reserves the slots of
/// the ids already in one, starts the copies of those the source has in memory now
/// (ExpertProvider::acquire_available) into free slots, and forwards the rest to the source (a
/// streaming source starts their disk reads). A slot reserved or being filled by prepare() is
/// never evicted before the acquire() (or unprepare()) of its expert; acquire() orders the
/// backend's later work after the copies of every slot it hands out (wait_weight_copies), so no
/// kernel reads a slot before its copy completed. The source's views stay acquired (its memory
/// unchanged) until the backend reports the copies from them done (weight_copies_done), then
/// the source's layer is released. The bytes are the same as the host provider's, so the logits
/// are bit-identical to it.
class DeviceExpertCache final : public experts::ExpertProvider {
 public:
  /// Per-tier counts since construction. hits + misses = experts acquired (distinct per call).
  struct Stats {
    uint64_t hits = 0, misses = 0;  // experts acquired from a slot / copied into one for the acquire
    uint64_t early = 0;             // misses whose copy prepare() started (overlapping other work)
    uint64_t bytes_copied = 0;      // host -> slot bytes (packed sizes; also copies a prepare() made for
                                    // an acquire that did not come)
    double stall_s = 0;             // seconds compute waited for slot copies (Backend::weight_copy_stall_seconds)
    double hit_rate() const { return hits + misses ? static_cast<double>(hits) / static_cast<double>(hits + misses) : 0.0; }
    Stats operator-(const Stats& o) const;
  };
  /// `budget_bytes` of slots on `be` (which must outlive this provider; one allocation), each
  /// sized for the largest expert 0 of the MoE layers (moe_layers[l]; an expert larger than a
  /// slot is an error at its acquire). Throws spool::Error when the budget holds fewer than
  /// `min_slots` experts (the experts one token routes to) or the memory cannot be had.
  DeviceExpertCache(std::shared_ptr<experts::ExpertProvider> source, ops::Backend& be, const std::vector<bool>& moe_layers,
                    int n_experts, uint64_t budget_bytes, int min_slots);
  /// Waits for copies still reading the source's memory, then releases it.
  ~DeviceExpertCache() override;
  void acquire(int layer, std::span<const int> ids, std::span<experts::ExpertWeights> out) override;
  /// See the class comment: reserves hits, starts copies of experts in the source's memory,
  /// forwards the others to the source. Never throws for a failed copy (acquire() reports it).
  void prepare(int layer, std::span<const int> ids) override;
  void unprepare(int layer, std::span<const int> ids) override;
  void release(int layer) override;
  std::string describe() const override;
  int max_batch() const override { return std::min(static_cast<int>(slots_.size()), source_->max_batch()); }
  /// The bytes of one slot over `source`: the largest packed size of expert 0 of the MoE layers.
  static uint64_t slot_bytes_for(experts::ExpertProvider& source, const std::vector<bool>& moe_layers);
  /// Number of slots and the bytes of one.
  size_t slots() const { return slots_.size(); }
  uint64_t slot_bytes() const { return slot_bytes_; }
  /// The counts (a consistent snapshot; thread-safe: /metrics reads it while a forward runs).
  /// stall_s is as of the last release() or update_stall().
  Stats stats() const;
  /// Brings stall_s up to the backend's copy stall now. Call on the thread that runs the
  /// forward passes (the backend is not thread-safe); release() does it.
  void update_stall();
  /// The host provider behind the slots.
  const experts::ExpertProvider& source() const { return *source_; }

 private:
  struct Slot {
    int layer = -1, expert = -1;  // what it holds (-1: empty)
    uint64_t used = 0;            // LRU clock of its last acquire
    bool in_use = false;          // handed out by acquire(layer) and not released yet
    bool reserved = false;        // named by prepare(): kept until its acquire() or unprepare()
    bool early = false;           // filled by prepare() for an acquire that has not come yet
    uint64_t ticket = 0;          // Backend::weight_copy_fence() of its last fill
    char* mem = nullptr;          // slot_bytes_ of backend memory: gate | up | down
    experts::ExpertWeights views; // views into mem
  };
  std::shared_ptr<experts::ExpertProvider> source_;
  ops::Backend& be_;
  int n_experts_ = 0;
  uint64_t slot_bytes_ = 0, clock_ = 0;
  std::vector<Slot> slots_;
  bool valid(int layer, int id) const;
  // The least recently used slot neither in use nor reserved, emptied (its expert unmapped); throws when none.
  size_t take_slot();
  // Copies host expert `h` (expert `id` of `layer`) into slot `s` and maps it there; throws when it does not fit.
  void fill(size_t s, int layer, int id, const experts::ExpertWeights& h);
  // After fills of `layer`: a fence for them (returned); the source's layer is released at once
  // when the copies are done, else held until poll_holds() sees them done.
  uint64_t finish_fills(int layer);
  // Releases the source's layers whose copies are done (all of them, waiting, with `block`).
  void poll_holds(bool block);
  std::vector<std::vector<int>> where_;  // [layer][expert] -> slot index or -1
  std::vector<std::vector<int>> prepared_;  // [layer] ids whose prepare() went to the source and is owed back
  std::vector<uint8_t> held_;               // [layer] the source's views of it are held for copies in flight
  std::vector<uint64_t> hold_ticket_;       // [layer] the fence those copies end at
  uint64_t waited_ = 0;                     // the latest fence the backend's work was ordered after
  double stall0_ = 0;                       // the backend's copy stall at construction
  mutable std::mutex stats_mu_;             // guards stats_ (written by the forward's thread, read by any)
  Stats stats_;
};

/// Bytes a WeightView's data occupies (float rows, or codes + scales + codebook + signs).
uint64_t weight_view_bytes(const ops::WeightView& w);

}  // namespace spool::experts
