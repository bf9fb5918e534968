// LoraSet: the adapters one model runs with (each with the user's scale, --lora FILE[:SCALE]),
// and the ops::LoraDelta terms the model's weights point to (WeightView::lora). Built while the
// model binds its tensors (models/bind.h LoraBindScope): each matrix asks for its terms by
// normalised name and shape, each MoE layer for its routed experts' terms; afterwards
// check_all_bound() says which adapter targets no bound weight matched.
//
// Routed experts' LoRA slices stay resident here, whatever serves the experts themselves
// (resident mapping or a streaming cache, at any budget): an expert projection's A and B are
// r * (in + out) f32 values against its in * out weight (rank 8 on a 2048 x 768 projection:
// 90 KB, about 3% of its bf16 bytes, 11% of a 4-bit one's), so streaming them would save little
// memory and add a read (and a slot) per miss; the MoE block attaches them to whatever views the
// provider hands out (models/moe.cpp), so resident and streamed experts get the same terms.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lora/adapter.h"
#include "ops/lora.h"

namespace spool::lora {

/// The per-expert terms of one MoE layer: gate, up, down [n_experts] (empty deltas where no
/// adapter targets the projection).
struct ExpertDeltas {
  std::vector<ops::LoraDelta> gate, up, down;
  /// Expert e's delta for gate / up / down, or nullptr when it has no terms.
  const ops::LoraDelta* gate_of(int e) const { return gate[e].terms.empty() ? nullptr : &gate[e]; }
  const ops::LoraDelta* up_of(int e) const { return up[e].terms.empty() ? nullptr : &up[e]; }
  const ops::LoraDelta* down_of(int e) const { return down[e].terms.empty() ? nullptr : &down[e]; }
};

class LoraSet {
 public:
  /// Adds an adapter with the user's default scale (multiplies PEFT's scaling; 0 loads it
  /// without effect). Its index (0, 1, ... in the order added) is its id: LoraTerm::adapter and
  /// the column of ops::LoraRowScales. An adapter whose name an earlier one has gets "-2", "-3",
  /// ... appended (names select adapters per request: docs/lora.md). Call before binding.
  void add(Adapter adapter, float scale);
  /// The adapters, in the order added, and their default scales.
  const std::vector<Adapter>& adapters() const { return adapters_; }
  std::vector<float> scales() const { return std::vector<float>(scales_.begin(), scales_.end()); }
  size_t size() const { return adapters_.size(); }
  bool empty() const { return adapters_.empty(); }
  /// Bytes of the adapters' f32 matrices plus the transposed B copies made for binding (what a run holds).
  uint64_t bytes() const;
  /// Identity of what the adapters change at user scales `scales` (one per adapter; hex text):
  /// for every adapter whose scale is not 0, in order, its targets, ranks, PEFT scalings, A and
  /// B values (hashed once when added) and the scale (a 64-bit FNV-1a over them); "" when every
  /// scale is 0 (then the products are exactly the base model's: ops::lora_add skips them).
  /// The server keys prompt-prefix reuse by it (in memory and on disk), so a prefix computed
  /// with other adapters or scales is never reused. Throws spool::Error for a wrong count.
  std::string fingerprint(const std::vector<float>& scales) const;
  /// fingerprint() at the default scales.
  std::string fingerprint() const { return fingerprint(scales()); }

  /// The terms of matrix `name` (normalised, "layers.0.self_attn.q_proj.weight") of shape
  /// [rows, cols] over every adapter, or nullptr when none targets it. Valid for the set's
  /// lifetime. Throws spool::Error naming adapter and tensor when an adapter's A / B do not fit
  /// [rows, cols].
  const ops::LoraDelta* dense(const std::string& name, int64_t rows, int64_t cols);
  /// The per-expert terms of the routed experts of module `name` (normalised, e.g.
  /// "layers.1.mlp.experts"): n_experts experts, gate/up [inter, hidden], down [hidden, inter],
  /// built from the PEFT ParamWrappers on experts.gate_up_proj and experts.down_proj
  /// (lora/adapter.h has the layout). nullptr when no adapter targets them. Throws spool::Error
  /// when a wrapper fits neither parameter's shape, two fit the same one, or a rank disagrees
  /// with the config.
  const ExpertDeltas* experts(const std::string& name, int n_experts, int64_t hidden, int64_t inter);
  /// Throws spool::Error listing (up to a few) adapter targets that no bound weight asked for
  /// (a module this model does not have or runs without: e.g. a fused projection spool regroups).
  void check_all_bound() const;
  /// Calls fn on every delta bound so far (dense matrices, then each expert's gate, up, down that
  /// have terms), each with its weight's shape (LoraDelta::rows, cols): e.g. to copy them to a GPU
  /// at load time (ops::Backend::upload_lora).
  void for_each_delta(const std::function<void(const ops::LoraDelta&)>& fn) const;

 private:
  std::vector<Adapter> adapters_;
  std::deque<float> scales_;            // stable addresses: LoraTerm::user points here
  std::vector<uint64_t> content_hash_;  // per adapter: FNV-1a of its targets, ranks, scalings, A and B
  std::deque<ops::LoraDelta> dense_;                  // stable addresses
  std::deque<ExpertDeltas> experts_;
  std::deque<std::vector<float>> relaid_;             // B^T copies (dense [r, out]; experts [E, r, out])
  std::vector<std::vector<char>> dense_used_, experts_used_;  // [adapter][entry]
};

}  // namespace spool::lora
