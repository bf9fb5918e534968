// StreamingExperts: routed experts read from disk on demand into an LRU cache; the dense
// part of the model stays resident. Output is bit-identical to ResidentExperts: the bytes
// in a cache slot are the checkpoint's bytes, and the kernels are the same.
//
// Per acquire(layer, ids): hits are pinned; misses get cache slots (evicting LRU entries)
// and are read together, contiguous ranges coalesced into one vectored read, by the
// ExpertReader's worker pool. Prefetch-ahead (optional) guesses the next layers' experts
// from the previous token's routing at those layers and reads them in the background; it
// switches itself off when, after 2000 prefetches, it has rescued fewer than 3% of the
// misses (rescued / (rescued + misses)).
#pragma once

#include <array>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "experts/cache.h"
#include "experts/provider.h"
#include "io/checkpoint.h"
#include "io/expert_reader.h"
#include "io/expert_store.h"

namespace spool::experts {

/// Settings of the streaming provider (CLI: --cache-budget-gb, --prefetch-workers,
/// --io-engine, --use-page-cache/--no-page-cache, --prefetch-ahead, --pin-file, --expert-profile).
struct StreamingOptions {
  uint64_t cache_budget_bytes = 1ull << 30;
  int workers = 8;
  io::IoEngine engine = io::IoEngine::kPread;
  bool direct = false;   // O_DIRECT reads (no page cache)
  int prefetch_ahead = 0;
  int top_k = 8;         // native experts per token (prefetch applies to decode-sized sets)
  std::vector<std::pair<int, int>> pins;  // (layer, expert) kept resident, hottest first
  /// (layer, expert) read into the cache at construction, hottest first (--expert-profile's
  /// experts::hottest()), after the pins and up to the cache's capacity: ordinary LRU entries
  /// (never pinned, evicted like any other), the hottest the most recently used. Pairs the model
  /// does not have are an error.
  std::vector<std::pair<int, int>> warm;
  /// The RAM tier of a GPU run with VRAM expert slots: the cache's buffers (the budget's, at most
  /// every expert's) are allocated at construction as one block and page-locked with
  /// pin_with->pin_host, so the slots' host-to-device copies read pinned memory. Null: buffers
  /// allocated as needed, pageable. The backend must outlive the provider.
  ops::Backend* pin_with = nullptr;
  /// The cache holds every expert (its budget is their count times the slot size, whatever
  /// cache_budget_bytes says): the loader's rule when the whole expert set fits in memory.
  bool hold_all = false;
  /// Buffers of the staging area hint() reads into (--prefetch-next; 0 = hints ignored). Not
  /// part of the cache budget: staged experts enter the cache only when a layer asks for them.
  int stage_slots = 0;
  /// Guess reads in flight at most (the rest wait in hint order). A guess read starts only while
  /// no demand read (a layer's misses) is in flight, so guesses use the disk's idle time and never
  /// slow a miss; a guess a layer asks for before its turn is read at once, as a demand miss.
  int stage_in_flight = 2;
  /// compute_while_reading(): the MoE block computes a layer's cached experts while its misses
  /// are read (--no-hits-first turns it off).
  bool hits_first = true;
  /// Which cached expert an insert evicts (--cache-policy, --cache-half-life in requests).
  CachePolicyOptions policy;
  /// kLfu: prior request counts (--expert-profile's decayed counts), before the first request.
  std::vector<ExpertCount> seed;
};

/// Counters since construction. A "request" is one expert asked for by a layer.
struct StreamingStats {
  uint64_t requests = 0, hits = 0, misses = 0;
  uint64_t bytes_read = 0, reads = 0;
  uint64_t prefetch_issued = 0, prefetch_rescued = 0;
  bool prefetch_disabled = false;
  uint64_t evictions = 0, cache_peak_bytes = 0;
  double stall_s = 0;             // seconds acquire() waited for disk reads (its own and prepared/prefetched ones)
  /// hint(): experts read into the staging area, and those a layer then asked for (misses of the
  /// cache served from the staging area, counted in `misses` too).
  uint64_t staged = 0, staged_used = 0;
  uint64_t pinned_bytes = 0;      // page-locked cache bytes (StreamingOptions::pin_with; a gauge)
  uint64_t preloaded = 0;         // experts read at construction by StreamingOptions::warm (their bytes are in bytes_read)
  double hit_rate() const { return requests ? static_cast<double>(hits) / requests : 0.0; }
  /// Share of would-be misses that prefetch-ahead turned into hits: rescued / (rescued + misses).
  double rescue_rate() const {
    return prefetch_rescued + misses ? static_cast<double>(prefetch_rescued) / (prefetch_rescued + misses) : 0.0;
  }
  /// Experts read from disk: demand misses plus prefetches.
  uint64_t experts_read() const { return misses + prefetch_issued; }
  StreamingStats operator-(const StreamingStats& o) const;
};

class StreamingExperts final : public ExpertProvider {
 public:
  /// moe_layers[l] true for MoE layers; expert shapes gate/up [inter, hidden], down
  /// [hidden, inter] are checked. Throws spool::Error for missing/mis-shaped experts,
  /// unopenable shards or unusable io_uring.
  StreamingExperts(std::shared_ptr<const io::Checkpoint> ckpt, const std::vector<bool>& moe_layers, int n_experts,
                   int hidden, int intermediate, StreamingOptions opt);
  ~StreamingExperts() override;

  void acquire(int layer, std::span<const int> ids, std::span<ExpertWeights> out) override;
  /// Pins the experts of `ids` (at most max_batch() of them) until their acquire() and starts
  /// background reads of those not in the cache; the acquire() that follows waits for them
  /// and counts them as misses.
  void prepare(int layer, std::span<const int> ids) override;
  void unprepare(int layer, std::span<const int> ids) override;
  /// Reads the experts of `ids` that are neither cached nor staged into free staging buffers
  /// (StreamingOptions::stage_slots; the oldest staged expert nobody waits for is dropped when
  /// none is free). A layer that then misses one of them takes its bytes from the staging area.
  void hint(int layer, std::span<const int> ids) override;
  /// The experts of `ids` whose bytes are in the cache now (read and checked), acquired as by
  /// acquire() and counted the same way (a hit, or a miss when prepare() read it).
  size_t acquire_available(int layer, std::span<const int> ids, std::span<ExpertWeights> out, std::span<uint8_t> got) override;
  void release(int layer) override;
  bool compute_while_reading() const override { return opt_.hits_first; }
  void begin_acquire(int layer, std::span<const int> ids, std::span<ExpertWeights> out, std::span<uint8_t> got) override;
  void finish_acquire(int layer, std::span<const int> ids, std::span<ExpertWeights> out, std::span<const uint8_t> got) override;
  std::string describe() const override;
  int max_batch() const override;

  /// Counters since construction (a consistent snapshot).
  StreamingStats stats() const;
  const io::ExpertStore& store() const { return store_; }
  /// Undoes the page-locking of StreamingOptions::pin_with (copies from the cache become pageable,
  /// which a GPU backend stages before returning). For a run whose GPU copies cannot wait for
  /// their source (no VRAM slots); call before the first acquire.
  void unpin();
  /// The cache's budget in bytes (StreamingOptions::cache_budget_bytes, or every expert's with hold_all).
  uint64_t cache_budget() const { return cache_.budget(); }
  /// Expert tensors served by streaming (3 per expert).
  int64_t streamed_tensors() const { return store_.tensor_count(); }

 private:
  void lookup_and_pin(int layer, std::span<const int> ids, std::vector<ExpertCache::Entry*>& entries,
                      std::vector<ExpertCache::Entry*>& misses, std::vector<ExpertCache::Entry*>& waits);
  std::vector<io::ReadRequest> plan_reads(const std::vector<ExpertCache::Entry*>& entries) const;
  void prefetch_after(int layer);
  // Under mu_: submits background reads into `todo` (new kLoading entries); failed or corrupt
  // reads leave kFailed entries, dropped unless an acquire is waiting on them.
  void submit_background(std::vector<ExpertCache::Entry*> todo);
  // Views of an expert whose bytes are in `slot`.
  ExpertWeights slot_views(int layer, int expert, const uint8_t* slot) const;
  // "" if the expert's bytes in `slot` are usable (quantized codebooks finite and ascending),
  // else an error message naming the tensor.
  std::string check_slot(int layer, int expert, const uint8_t* slot) const;
  void load_pins();
  // StreamingOptions::warm: reads the hottest experts into free cache entries (unpinned).
  void load_warm();
  // The staging area (hint()). A slot holds one expert's bytes; entries of the cache that asked
  // for it while it loads (adopters) get them copied in when the read completes.
  struct Stage {
    int layer = -1, expert = -1;
    uint8_t* data = nullptr;
    ExpertCache::State state = ExpertCache::State::kReady;
    uint64_t seq = 0;  // hint order (the oldest is recycled first)
    bool queued = false;  // reserved by hint(), read not submitted yet (waits in spec_queue_)
    std::vector<ExpertCache::Entry*> adopters;
  };
  std::deque<int> spec_queue_;  // queued staging slots, best guess first
  int spec_in_flight_ = 0;      // guess reads submitted and not finished
  bool closing_ = false;        // the destructor has begun: no more guess reads
  int demand_in_flight_ = 0;    // reads not finished of acquire's misses, prepare's and prefetch-ahead's, and
                                // guesses promoted to demand reads: while any runs, guesses wait
  // Under mu_: submits queued guesses while fewer than StreamingOptions::stage_in_flight are in
  // flight and no demand read is.
  void pump_stage();
  // Under mu_: frees the queued (unread) guesses of `layer` nobody adopted (acquire(layer) runs).
  void drop_queued_guesses(int layer);
  // Under mu_: submits the read of staging slot `slot`; `guess`: counted against stage_in_flight.
  void submit_stage(int slot, bool guess);
  std::vector<Stage> stage_;
  uint64_t stage_seq_ = 0;
  // Under mu_: the staging slot holding (layer, expert), or -1.
  int find_stage(int layer, int expert) const;
  // Under mu_: a new cache entry `e` (kLoading) for a staged expert gets the staged bytes (now,
  // or when the staged read completes). Returns true when `e` is ready now.
  bool adopt_stage(int slot, ExpertCache::Entry* e);

  std::shared_ptr<const io::Checkpoint> ckpt_;
  StreamingOptions opt_;
  io::ExpertStore store_;
  std::unique_ptr<io::ExpertReader> reader_;
  std::vector<std::vector<std::array<ops::WeightView, 3>>> proto_;  // [layer][expert] gate/up/down storage (data set per slot)
  mutable std::mutex mu_;
  std::condition_variable ready_cv_;
  ExpertCache cache_;
  std::vector<std::vector<ExpertCache::Entry*>> in_use_;  // [layer] entries pinned by acquire
  // [layer] entries pinned by prepare(), one per call and expert, until the acquire() (or
  // unprepare()) of that expert takes the pin over (two pipelined groups may prepare a layer).
  std::vector<std::vector<ExpertCache::Entry*>> prepared_;
  // Under mu_: drops one prepare() pin of `e` if it has one; true if it did.
  bool drop_prepared_pin(ExpertCache::Entry* e);
  std::vector<std::vector<int>> last_ids_;                // [layer] experts of the last acquire
  std::vector<std::vector<ExpertCache::Entry*>> begun_;   // [layer] begin_acquire()'s entries, in ids order, until finish_acquire()
  StreamingStats stats_;
  int pinned_count_ = 0;
  void* locked_ = nullptr;        // the cache block page-locked with opt_.pin_with (unlocked at destruction)
  uint64_t locked_bytes_ = 0;
};

/// The rate, in GB/s of weight bytes (1e9 bytes/s), at which this machine's CPU kernels run one
/// token through routed experts of `ck`: ops::CpuBackend::expert_ffn on `threads` threads over
/// experts of MoE layer `layer` (read into a streaming cache of their own through the page cache, as the run binds them), 8 per call (a decode step's top-k), cycling through up to 64 of
/// them (more than a last-level cache holds on most machines), for about `seconds` after one
/// warm-up pass; the best of the passes over the set counts. `spool plan` uses it as the compute
/// rate of a token's weights where the cores, not memory, bound decode. Throws spool::Error when
/// the experts cannot be bound (the streaming provider's errors).
double measure_expert_gbps(std::shared_ptr<const io::Checkpoint> ck, const std::vector<bool>& moe_layers, int layer, int n_experts, int hidden, int inter, int threads, double seconds = 0.3);

}  // namespace spool::experts
