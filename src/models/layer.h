// The two halves of a decoder layer behind small interfaces, so DecoderModel (decoder.h) runs
// one loop whatever the family:
//   TokenMixer: mixes positions (AttentionLayer, MlaLayer, GatedDeltaNetLayer)
//   Ffn:        transforms each row (DenseFfn, MoeFfn, ParallelDenseMoeFfn)
// Each has bind (tensors by their HF names under `layers.{i}.`), place (onto the backend: pure
// virtual, so a layer that forgets it does not compile; one whose place() misses a weight fails
// layer_placement_test, which runs every fixture on a backend whose uploads are copies),
// take_scratch (its workspace, from the spec alone: arena sizing calls it on an unbound object)
// and forward. make_token_mixer() and make_ffn() are the only places that map ModelSpec::mixers /
// ffns to a class.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dist/expert_parallel.h"
#include "experts/provider.h"
#include "io/checkpoint.h"
#include "models/spec.h"
#include "models/state.h"
#include "ops/backend.h"
#include "ops/workspace.h"

namespace spool::models {

class MoeBlock;

/// One sequence's rows within a step: rows [row0, row0 + T) of the step's [N, hidden] matrices,
/// at positions [pos0, pos0 + T), and the sequence's state (caches, recurrent states).
struct SeqRows {
  int64_t row0 = 0, T = 0, pos0 = 0;
  State* state = nullptr;
};

/// The sequences' segments for an attention-cache layer (softmax attention, MLA): each one's rows
/// with its State::attn[layer] cache.
std::vector<AttnSeg> attn_segments(std::span<const SeqRows> seqs, int layer);

/// A layer's token mixer: the only part of a layer that reads other positions (through the
/// sequence's state). Implementations: AttentionLayer, MlaLayer, GatedDeltaNetLayer.
class TokenMixer {
 public:
  virtual ~TokenMixer() = default;
  /// Binds layer `layer`'s mixer tensors under `layers.{layer}.` (self_attn. / linear_attn.)
  /// by their HF names. Throws spool::Error naming a missing or misshapen tensor.
  virtual void bind_layer(const io::Checkpoint& ck, const ModelSpec& spec, int layer) = 0;
  /// Moves every weight and parameter vector to where `be` reads them, once after binding (a
  /// no-op on host backends). Without it a device backend would stage weights on every call.
  virtual void place(ops::Backend& be) = 0;
  /// The workspace takes forward() makes over T rows for layer `layer` of `spec` (a measuring
  /// workspace sizes the arena with it). Reads only the spec: valid on an unbound mixer.
  virtual void take_scratch(ops::Workspace& ws, const ModelSpec& spec, int layer, int64_t T) const = 0;
  /// x: [N, hidden] normed input of every sequence of the step (seqs cover the N rows);
  /// out: [N, hidden]. Advances each sequence's state for this layer. Scratch from `ws`.
  virtual void forward_rows(const float* x, std::span<const SeqRows> seqs, int64_t N, float* out, ops::Backend& be,
                            ops::Workspace& ws) const = 0;
};

/// Called once per token and MoE layer with the chosen experts (best first) and their weights.
using RouteObserver = std::function<void(int layer, int64_t token, std::span<const int> experts, std::span<const float> weights)>;
/// Called once per token and MoE layer with the routing margin: the softmax probability of
/// the k-th chosen expert minus that of the best expert left out. A margin near float
/// precision (~1e-7) means another implementation may legitimately route differently.
using MarginObserver = std::function<void(int layer, int64_t token, float margin)>;
/// Replaces the router's choice of one token row at one MoE layer (after the router ran, before
/// the experts are fetched): `experts` (top_k ids, best first) and `weights` (host memory) are
/// overwritten in place; ids must stay distinct and in [0, n_experts). `row` counts the step's
/// rows in the order Model::forward_batch concatenates its sequences. `spool bench
/// --routing-trace` replays a recorded trace with it (experts::TraceMap).
using RouteOverride = std::function<void(int layer, int64_t row, std::span<int> experts, std::span<float> weights)>;

/// Restricts one MoE layer's routing to listed experts per row (MoeBlock::forward; the
/// decoder's --route-by-predictor): row t routes among ids[t*k .. t*k+k) only. layer < 0: none.
struct RouteWithin {
  int layer = -1;
  int k = 0;
  std::vector<int> ids;  // [rows, k]
};

/// Per-step inputs an FFN may need beyond its rows: the layer, the routed-expert count, the
/// expert provider, observers and the hand-over point of a pipelined step (MoeBlock::forward).
struct FfnStep {
  int layer = 0;
  int top_k = 0;                                  // experts per token (<= the native top_k)
  experts::ExpertProvider* provider = nullptr;    // routed experts (MoE FFNs)
  const RouteObserver* on_route = nullptr;        // may point to an empty function
  const MarginObserver* on_margin = nullptr;      // may point to an empty function
  const std::function<void()>* between = nullptr;  // may point to an empty function
  const RouteOverride* route_override = nullptr;  // null or an empty function: the router decides
  int64_t row0 = 0;  // the step row of this call's row 0 (a pipelined group's offset)
  /// Runs inside a MoE layer right after its first batch's reads were started (provider
  /// prepare()): the decoder's next-layer prefetch hint. Null or empty: nothing.
  const std::function<void()>* after_prepare = nullptr;
  /// This layer's routing restriction (--route-by-predictor), and the next MoE layer's, which
  /// the decoder fills one layer ahead and moves here when that layer starts.
  RouteWithin within, within_next;
  /// Expert parallelism (Model::set_expert_parallel): the ranks the routed experts are split
  /// over and their owners; null or one rank: all experts here.
  const dist::ExpertParallel* ep = nullptr;
};

/// A layer's feed-forward block. Implementations: DenseFfn, MoeFfn, ParallelDenseMoeFfn.
class Ffn {
 public:
  virtual ~Ffn() = default;
  /// Binds layer `layer`'s FFN tensors under `layers.{layer}.` by their HF names.
  virtual void bind_layer(const io::Checkpoint& ck, const ModelSpec& spec, int layer) = 0;
  /// Moves the block's own weights to where `be` reads them (routed experts come from the
  /// ExpertProvider); once after binding, a no-op on host backends.
  virtual void place(ops::Backend& be) = 0;
  /// The workspace takes forward() makes over T rows (from the spec alone; valid unbound).
  virtual void take_scratch(ops::Workspace& ws, const ModelSpec& spec, int64_t T) const = 0;
  /// x: [N, hidden] the FFN's normed input; residual: [N, hidden] the layer's residual stream
  /// (read by routers and norms that start from it); out: [N, hidden]. Scratch from `ws`.
  virtual void forward(const float* x, const float* residual, int64_t N, const FfnStep& step, float* out,
                       ops::Backend& be, ops::Workspace& ws) const = 0;
  /// Whether the block routes to experts (the layer is a "MoE layer" for the expert provider).
  virtual bool routed() const = 0;
  /// The MoE block whose router reads the decoder's normed FFN input (MoeFfn), for next-layer
  /// prefetch; null for other blocks.
  virtual const MoeBlock* moe() const { return nullptr; }
  /// The block of the layer's routed experts, whatever else the FFN runs (moe() is null for an FFN
  /// that is more than its MoE block); what a following rank runs (Model::serve_experts).
  virtual const MoeBlock* routed_block() const { return moe(); }
};

/// The token mixer of ModelSpec::mixers[layer], unbound (`gdn_layout`: the Gated DeltaNet
/// projections' layout in the checkpoint).
std::unique_ptr<TokenMixer> make_token_mixer(const ModelSpec& spec, int layer, GdnLayout gdn_layout = GdnLayout::kSplit);
/// The FFN of ModelSpec::ffns[layer] (with ModelSpec::parallel_dense_ffn a MoE layer's is the
/// dense MLP beside the experts), unbound.
std::unique_ptr<Ffn> make_ffn(const ModelSpec& spec, int layer);

}  // namespace spool::models
