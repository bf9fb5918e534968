// Expert parallelism's two seams beyond the communicator (docs/distributed.md):
//  - ExpertOwners: which rank holds each routed expert of each MoE layer (contiguous blocks, or a
//    map balanced by a routing profile), the same on every rank;
//  - ExpertStep: the descriptor a leading rank broadcasts before each MoE layer's exchange when
//    the other ranks serve its experts without running the model themselves (`spool serve` over
//    ranks: the workers hold no sequence state; rank 0 sends each MoE layer's input rows and
//    routing, every rank runs its own experts' rows, and the rows are gathered).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dist/comm.h"

namespace spool::dist {

/// The owner rank of every routed expert of every layer. Layers without a map of their own (and
/// every layer of the contiguous map) use expert_owner()'s contiguous blocks. Every rank must build
/// the same map (from the same file): the MoE exchange relies on it.
class ExpertOwners {
 public:
  /// Contiguous blocks (expert_owner) over `ranks` ranks of `n_experts` experts per layer.
  ExpertOwners(int n_experts, int ranks);
  /// Balanced by expected load: for each layer l with a non-empty load[l] (n_experts
  /// non-negative finite numbers: how often each expert is routed to, e.g. a profile's counts),
  /// experts in descending load (ties: lower id first) each go to the rank with the least load so
  /// far among those holding fewer than ceil(n_experts / ranks) experts (ties: lower rank), so no
  /// rank holds more experts than the contiguous blocks give it (the memory plan is unchanged).
  /// Layers with an empty entry (or beyond load.size()) stay contiguous. Throws spool::Error for a
  /// layer whose entry has another length or a negative / non-finite load, or fewer experts than
  /// ranks.
  static ExpertOwners balanced(const std::vector<std::vector<double>>& load, int n_experts, int ranks);

  /// The rank holding expert e of layer `layer`.
  int owner(int layer, int e) const {
    if (layer >= 0 && static_cast<size_t>(layer) < by_layer_.size() && !by_layer_[static_cast<size_t>(layer)].empty())
      return by_layer_[static_cast<size_t>(layer)][static_cast<size_t>(e)];
    return expert_owner(e, n_experts_, ranks_);
  }
  /// True when every layer uses the contiguous blocks (each rank's experts one ascending range).
  bool contiguous() const { return by_layer_.empty(); }
  /// Whether `rank` holds expert e of layer `layer`.
  bool owns(int layer, int e, int rank) const { return owner(layer, e) == rank; }
  /// The number of ranks the map spreads the experts over.
  int ranks() const { return ranks_; }
  /// Routed experts per MoE layer.
  int n_experts() const { return n_experts_; }
  /// The experts `rank` holds in layer `layer`, ascending.
  std::vector<int> owned(int layer, int rank) const;
  /// The largest expected load one rank carries in layer `layer` as a fraction of the layer's
  /// total under `load` (1 / ranks is perfect balance); 0 for an empty or all-zero load.
  double max_load_share(int layer, std::span<const double> load) const;
  /// One line for the log: "contiguous" or "balanced over N layers".
  std::string describe() const;

 private:
  int n_experts_ = 0, ranks_ = 1;
  std::vector<std::vector<int>> by_layer_;  // [layer][expert] -> rank; empty: contiguous
};

/// How a model runs expert parallel (Model::set_expert_parallel).
struct ExpertParallel {
  Comm* comm = nullptr;  ///< the ranks; null or one rank: no expert parallelism
  /// The owners; null = contiguous blocks (expert_owner).
  std::shared_ptr<const ExpertOwners> owners;
  /// Rank 0 leads and the others follow (serve_experts): before each MoE layer's exchange rank 0
  /// broadcasts an ExpertStep with the layer's input rows and routing. False: every rank runs the
  /// same forward calls itself (lockstep: generate, bench, perplexity).
  bool lead = false;
  /// Tests: run the exchange path (this rank's experts, the gather, the combine of the gathered
  /// rows) with a one-rank communicator too, as several ranks would (e.g. NcclComm on one GPU).
  bool one_rank_exchange = false;
  /// Several ranks (or one_rank_exchange)?
  bool active() const { return comm != nullptr && (comm->size() > 1 || one_rank_exchange); }
  /// Owner of expert e of `layer` among comm's ranks.
  int owner(int layer, int e, int n_experts) const {
    return owners != nullptr ? owners->owner(layer, e) : expert_owner(e, n_experts, comm->size());
  }
};

/// What a leading rank announces (ExpertStep::op).
enum class StepOp : int64_t {
  kExperts = 1,  ///< one MoE layer: rows x [rows, hidden], ids [rows, top_k], LoRA scales [rows, lora_n] follow
  kExit = 2,     ///< the followers leave their loop with `code` as exit status
};

/// The step descriptor of a leading rank: fixed-size, sent with Comm::broadcast (kWords int64s),
/// then the payload it announces (kExperts: x as floats, ids as int32, LoRA scales as floats, each
/// its own broadcast).
struct ExpertStep {
  StepOp op = StepOp::kExperts;
  int64_t layer = 0;     ///< model layer index (MTP layers follow the main stack's)
  int64_t rows = 0;      ///< T: token rows of the layer's input
  int64_t top_k = 0;     ///< experts per row
  int64_t hidden = 0;    ///< floats per row
  int64_t lora_n = 0;    ///< LoRA adapters with per-row scales (0: none in scope)
  int64_t code = 0;      ///< kExit: exit status
  static constexpr size_t kWords = 8;
  /// The wire form: a magic word and the fields above.
  std::array<int64_t, kWords> encode() const;
  /// Reads encode()'s form. Throws spool::Error for another magic (the ranks out of step), an
  /// unknown op or a field out of range (negative, rows * hidden beyond 2^31 floats, top_k
  /// above 1024).
  static ExpertStep decode(const std::array<int64_t, kWords>& w);
};

}  // namespace spool::dist
