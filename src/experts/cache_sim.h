// A simulation of the streaming expert cache (ExpertCache as StreamingExperts drives it, without
// prefetch-ahead and pin files), for `spool plan --trace`: replays routing through the same LRU
// with the same operations in the same order, so it predicts the hit rate a run measures.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "experts/cache.h"
#include "experts/routing_trace.h"

namespace spool::experts {

/// One simulated acquire(): its hits and misses (TraceSimResult::acquires).
struct SimAcquire {
  int hits = 0, misses = 0;
};

/// StreamingExperts' bookkeeping over keys (layer, expert), without the bytes: a cache of
/// capacity entries (ExpertCache::capacity()) that evicts, by the same policy as ExpertCache
/// (the least recently used entry nobody pins, or kLfu's lowest decayed request count with the
/// same FrequencyScores), and grows past capacity when every entry is pinned; prepare() / acquire() / release()
/// pin, touch, insert and count exactly as StreamingExperts' do (an expert read by prepare()
/// counts as a miss at its acquire(), a hit for any later acquire()). Reads finish before the
/// next operation (the engine waits for them in acquire(); a loading entry is always pinned).
class CacheSim {
 public:
  /// capacity: entries the budget holds (>= 1); top_k: the model's native experts per token
  /// (max_batch() = max(top_k, capacity)). Throws spool::Error for capacity < 1 or top_k < 1.
  CacheSim(int64_t capacity, int top_k, CachePolicyOptions policy = {});
  /// ExpertCache::seed: a routing profile's counts for kLfu, before the first request.
  void seed(int layer, int expert, double count) { freq_.seed(key(layer, expert), count); }
  /// StreamingExperts::prepare: the first max_batch() of `ids`.
  void prepare(int layer, std::span<const int> ids);
  /// StreamingExperts::acquire.
  void acquire(int layer, std::span<const int> ids);
  /// StreamingExperts::release.
  void release(int layer);
  /// One MoE layer of one step as MoeBlock::forward runs it over this provider: the distinct
  /// experts of its rows in ascending order, in batches of max_batch(), the first prepared;
  /// each batch acquired then released. `experts`: the rows' choices (any order, repeats).
  void layer_step(int layer, std::span<const int> experts);
  /// Counters since construction (or reset_counters()): a request is one expert of an acquire.
  uint64_t requests() const { return requests_; }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return requests_ - hits_; }
  uint64_t evictions() const { return evictions_; }
  void reset_counters() { requests_ = hits_ = evictions_ = 0; }
  /// With record(true), every acquire() appends its hits and misses to `acquires`.
  void record(bool on) { record_ = on; }
  std::vector<SimAcquire> acquires;
  size_t size() const { return map_.size(); }
  /// Whether (layer, expert) is cached now.
  bool contains(int layer, int expert) const { return map_.count(key(layer, expert)) != 0; }
  int max_batch() const;

 private:
  struct Entry {
    uint64_t key;
    int pins = 0;
    bool prepared = false;  // read by prepare() for an acquire that has not come yet
  };
  using It = std::list<Entry>::iterator;
  static uint64_t key(int layer, int expert) { return (static_cast<uint64_t>(layer) << 32) | static_cast<uint32_t>(expert); }
  It insert(uint64_t k);
  void touch(It it) { lru_.splice(lru_.begin(), lru_, it); }
  int64_t capacity_;
  int top_k_;
  CachePolicyOptions policy_;
  FrequencyScores freq_;
  std::list<Entry> lru_;  // front = most recently used
  std::unordered_map<uint64_t, It> map_;
  std::unordered_map<int, std::vector<It>> in_use_, prepared_;  // [layer]
  uint64_t requests_ = 0, hits_ = 0, evictions_ = 0;
  bool record_ = false;
};

/// What a `spool bench -p 0 --routing-trace` tg test of this shape should measure.
struct TraceSimResult {
  uint64_t requests = 0, hits = 0, misses = 0;  // over the timed repetitions
  int64_t tokens = 0;                           // tokens of the timed repetitions (all sequences)
  /// Per acquire of the timed repetitions (a MoE layer of one step, or of one group of sequences
  /// of a pipelined step; a batch when the layer's experts exceed max_batch()): its hits and misses,
  /// in order. What a model of the stall needs: each acquire waits for its own misses' reads.
  std::vector<SimAcquire> acquires;
  double hit_rate() const { return requests ? static_cast<double>(hits) / requests : 0.0; }
  double misses_per_token() const { return tokens ? static_cast<double>(misses) / tokens : 0.0; }
};

/// Simulates bench's tg test replaying `map` through a streaming cache of `capacity` entries on
/// the CPU: a warm-up repetition, then `reps` timed ones of `n_gen` steps; `n_seqs` sequences
/// decoded together, one row each per step, sequence q's row at step i of repetition r (-1 =
/// warm-up) routed as trace token tg_trace_token(N, q, n_seqs, r, n_gen, i), native top-k
/// `top_k` experts per row. One sequence: each MoE layer is a layer_step(). Several: the order
/// of DecoderModel::run_pipelined (the first n_seqs / 2 sequences are group 0, the rest group
/// 1; group 0 prepares layer l, group 1 prepares layer l, group 0 acquires l and prepares the
/// next, group 1 acquires l and prepares the next, ...). Counts the timed repetitions only.
/// `policy` and `seed` (kLfu: per (layer, expert) prior counts, as ExpertCache::seed; empty: none)
/// as the run's cache has them.
TraceSimResult simulate_tg(const TraceMap& map, int top_k, int64_t capacity, int n_gen, int reps, int n_seqs,
                           CachePolicyOptions policy = {}, std::span<const ExpertCount> seed = {});

/// What the decode time of a simulated tg test depends on besides the cache (spool plan --trace).
struct DecodeTimeInputs {
  int n_seqs = 1;              // sequences per step
  int n_moe_layers = 1;        // MoE layers a step runs (acquires per step and group)
  double compute_s = 0;        // one step's compute apart from the routed experts: the other active bytes over the compute rate
  double read_bytes = 0;       // what one miss reads (the expert, or its aligned slot with O_DIRECT)
  double expert_bytes = 0;     // one routed expert's weight bytes (what computing it reads from memory)
  double shared_bytes = 0;     // the shared expert's weight bytes (0: none), computed while a layer's misses load
  double mem_gbps = 0;         // the compute rate over weight bytes, GB/s (the experts and the overlaps)
  double disk_gbps = 0;        // the disk's read bandwidth, GB/s
  bool hits_first = true;      // the cached experts compute while the misses load (StreamingOptions::hits_first)
};

/// model_decode_time's answer.
struct DecodeTime {
  double stall_s_per_token = 0;  // modelled wait for reads, per token (all sequences' tokens)
  double tok_s = 0;              // tokens per second over all sequences
};
/// The modelled decode time of `sim` (its acquires, from simulate_tg): a step computes for
/// compute_s plus its acquired experts (hits + misses, each expert_bytes at mem_gbps: several
/// sequences compute every distinct expert they route to) and, at each acquire, waits for what its misses' reads take beyond the work that
/// runs while they load: stall = max(0, misses x read_bytes / disk - overlap), overlap = the
/// shared expert (+ the acquire's hits with hits_first) at memory bandwidth (+, pipelined
/// sequences, the other group's share of the step's compute: step compute / (2 x n_moe_layers)).
/// A step is never shorter than its bytes read over the disk bandwidth.
DecodeTime model_decode_time(const TraceSimResult& sim, const DecodeTimeInputs& in);

/// The trace token that sequence `q` of `n_seqs` routes as at step `i` of repetition `rep`
/// (-1 = warm-up) of a tg test of n_gen steps: (q * floor(N / n_seqs) + (rep + 1) * n_gen + i)
/// mod N (simulate_tg's rule, shared with spool bench).
int64_t tg_trace_token(int64_t n_tokens, int q, int n_seqs, int rep, int n_gen, int i);

}  // namespace spool::experts
