// Routing trace files (docs/routing-trace.md): the experts a model's routers chose, per
// (MoE layer, token), with their gate weights, recorded by `spool calibrate --trace-out` and
// `spool serve --trace-out`; replayed onto any checkpoint by `spool bench --routing-trace`
// (TraceMap: a fixed map from the trace's shape onto the target's) and simulated against an
// expert cache by `spool plan --trace` (experts/cache_sim.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace spool::experts {

/// The shape of the model a trace was recorded from (the trace file's header line).
struct TraceShape {
  std::string model_type;       // config.json model_type
  int n_layers = 0;             // decoder layers (MoE or not)
  std::vector<int> moe_layers;  // indices of the MoE layers, ascending
  int n_experts = 0;            // routed experts per MoE layer
  int top_k = 0;                // experts routed per token (as recorded: every record has top_k experts)
  std::string source;           // "calibrate" or "serve"
  int guesses = 0;              // prefetch guesses per record ("g"; 0: none recorded)
  std::string guess_source;     // what made them: "router" (the next router one layer early) or "predictor"
};

/// One router decision: token `token` (0-based, in the order the model processed them) at
/// decoder layer `layer` chose `experts` (best first, distinct) with gate `weights`.
struct TraceRecord {
  int layer = 0;
  int64_t token = 0;
  std::vector<int> experts;
  std::vector<float> weights;
  std::vector<int> guesses;  // shape.guesses ids, best first (empty: none for this record)
};

/// The current trace format version (the header's "version"); readers refuse others.
inline constexpr int kTraceVersion = 1;

/// Writes a trace file: the header line at construction, then one JSON line per record.
/// Throws spool::Error when the file cannot be created or written.
class TraceWriter {
 public:
  TraceWriter(const std::string& path, const TraceShape& shape);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;
  /// Appends one record; experts.size() must equal weights.size() (spool::Error otherwise).
  /// `guesses` (empty, or the header's `guesses` ids, best first): the prefetch guesses made
  /// for this (layer, token) one layer earlier.
  void write(int layer, int64_t token, std::span<const int> experts, std::span<const float> weights,
             std::span<const int> guesses = {});
  /// Flushes buffered records to the file (spool::Error on a write error).
  void flush();
  /// Flushes and closes (spool::Error on a write error); the destructor closes silently.
  void close();
  uint64_t records() const { return records_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  uint64_t records_ = 0;
  int guesses_ = 0;  // the header's guesses
};

/// A whole trace in memory, every token complete: table[token][ordinal] for MoE layer
/// shape.moe_layers[ordinal].
struct Trace {
  TraceShape shape;
  int64_t n_tokens = 0;
  /// Experts [n_tokens][n_moe][top_k] and their weights, flattened.
  std::vector<int> experts;
  std::vector<float> weights;
  /// Prefetch guesses [n_tokens][n_moe][shape.guesses], -1 where a record has none (empty when
  /// shape.guesses == 0).
  std::vector<int> guesses;
  int n_moe() const { return static_cast<int>(shape.moe_layers.size()); }
  const int* guesses_of(int64_t token, int ordinal) const {
    return guesses.data() + (static_cast<size_t>(token) * n_moe() + ordinal) * shape.guesses;
  }
  const int* experts_of(int64_t token, int ordinal) const {
    return experts.data() + (static_cast<size_t>(token) * n_moe() + ordinal) * shape.top_k;
  }
  const float* weights_of(int64_t token, int ordinal) const {
    return weights.data() + (static_cast<size_t>(token) * n_moe() + ordinal) * shape.top_k;
  }
};

/// Reads a trace file. Throws spool::Error naming the file and line for: an unreadable file,
/// a missing or foreign header, another version, a layer not in moe_layers, an expert outside
/// [0, n_experts) or listed twice, a record whose experts/weights are not top_k long, a
/// non-finite weight, a (layer, token) recorded twice, and tokens that are not 0..N-1 with
/// every MoE layer each (a truncated trace: its last incomplete token is the error).
Trace read_trace(const std::string& path);

/// Share of routings (token x expert choices) taken by the hottest ceil(fraction x n_experts)
/// experts of each MoE layer: [ordinal]. The skew summary `spool calibrate` prints.
std::vector<double> top_share(const Trace& t, double fraction);

/// The fixed map of a trace onto a target model of another shape (docs/routing-trace.md):
/// - layers: the target's j-th MoE layer replays the trace's MoE layer j mod L_trace;
/// - tokens: target token i replays trace token i mod N (the caller picks i);
/// - experts, E_t >= E_s: trace expert e becomes e + E_s * r, r = h(j, token, e) mod
///   floor(E_t / E_s) (h: splitmix64 of the three), so each trace expert splits into that many
///   target experts with equal shares of its traffic: the popularity distribution keeps its
///   shape (the hottest 10% of the target's experts take the share the hottest 10% of the
///   trace's took). E_t < E_s: e becomes e mod E_t;
/// - top-k: the target's first k_t experts come from the trace's ranks 0, 1, ... (best first)
///   and, past k_s, from ranks 0, 1, ... again with the hash salted by the pass; an id already
///   taken for this token moves to the next free id (mod E_t). Each rank's weight is split
///   equally over the target experts it produced, so the weights keep their sum.
class TraceMap {
 public:
  /// target_moe_layers: the target's MoE layer indices (ascending); target_experts: its
  /// experts per layer. Throws spool::Error when the target has no MoE layer or experts.
  TraceMap(const Trace& trace, std::vector<int> target_moe_layers, int target_experts);
  /// The target's routing of decoder layer `layer` for trace token `token` (any int64 >= 0;
  /// taken mod n_tokens): ids.size() (== weights.size(), <= target_experts) experts, distinct.
  /// Throws spool::Error for a layer that is not a target MoE layer.
  void route(int layer, int64_t token, std::span<int> ids, std::span<float> weights) const;
  /// The trace's prefetch guesses for decoder layer `layer` and trace token `token`, mapped as
  /// route() maps its rank-0 pass (a guess that names an expert the trace routed maps to the
  /// target expert route() gives it, collisions aside): ids[0..n) best first, n <= ids.size()
  /// and <= the trace's guesses; 0 when the record has none. Errors as route().
  int guess(int layer, int64_t token, std::span<int> ids) const;
  const Trace& trace() const { return trace_; }
  const std::vector<int>& target_moe_layers() const { return moe_layers_; }
  int target_experts() const { return n_experts_; }

 private:
  const Trace& trace_;
  std::vector<int> moe_layers_;
  std::vector<int> ordinal_;  // [decoder layer] -> target MoE ordinal, -1 for dense layers
  int n_experts_;
};

}  // namespace spool::experts
