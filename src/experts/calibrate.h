// Routing traces and what they are used for: a hot set of experts to pin (--pin-file) and a
// co-activation order of experts per layer for relayout (spool repack).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace spool::experts {

/// Counts of routed experts per (layer, expert) and of expert pairs chosen for the same
/// token, per layer.
class RoutingTrace {
 public:
  RoutingTrace(int n_layers, int n_experts);
  /// Records one token's experts at one layer.
  void record(int layer, std::span<const int> experts);
  uint64_t count(int layer, int expert) const { return counts_[idx(layer, expert)]; }
  uint64_t coactivation(int layer, int a, int b) const;
  int n_layers() const { return n_layers_; }
  int n_experts() const { return n_experts_; }
  /// Routed (layer, token) events recorded (each with top-k experts).
  uint64_t events() const { return events_; }
  uint64_t total_requests() const;

 private:
  size_t idx(int l, int e) const { return static_cast<size_t>(l) * n_experts_ + e; }
  int n_layers_, n_experts_;
  std::vector<uint64_t> counts_;  // [layer][expert]
  std::vector<uint32_t> coact_;   // [layer][a][b], a < b
  uint64_t events_ = 0;
};

/// The most frequently routed experts, hottest first, until `budget_bytes` of experts of
/// `expert_bytes` each are chosen (experts never routed are not pinned).
std::vector<std::pair<int, int>> hot_set(const RoutingTrace& t, uint64_t budget_bytes, uint64_t expert_bytes);

/// Per layer, an order of all experts placing co-activated experts next to each other:
/// greedy chain from the most used expert, each next expert the unplaced one most
/// co-activated with the last two placed (ties: more used, then lower id).
/// order[l][new_position] = old expert id. Layers without routing keep the identity.
std::vector<std::vector<int>> coactivation_order(const RoutingTrace& t);

/// Writes {"pin": [[layer, expert], ...], ...} / {"perm": [[...], ...], ...} files.
void write_pin_file(const std::string& path, const std::vector<std::pair<int, int>>& pins, uint64_t expert_bytes,
                    double coverage, uint64_t tokens);
void write_perm_file(const std::string& path, const std::vector<std::vector<int>>& order);
/// Reads a perm file; validates every layer's list is a permutation of [0, n_experts).
std::vector<std::vector<int>> read_perm_file(const std::string& path, int n_layers, int n_experts);

}  // namespace spool::experts
