// ResidentExperts: expert views straight into the checkpoint's memory-mapped shards.
#pragma once

#include <memory>
#include <vector>

#include "experts/provider.h"
#include "experts/weight_views.h"
#include "io/checkpoint.h"

namespace spool::experts {

/// Serves every expert from the mmap'd checkpoint. Validates all expert shapes up front:
/// gate/up [intermediate, hidden], down [hidden, intermediate] for each MoE layer.
class ResidentExperts final : public ExpertProvider {
 public:
  /// `moe_layers[l]` is true for MoE layers. Throws spool::Error naming a missing or
  /// mis-shaped expert tensor.
  ResidentExperts(std::shared_ptr<const io::Checkpoint> ckpt, const std::vector<bool>& moe_layers, int n_experts,
                  int hidden, int intermediate);
  void acquire(int layer, std::span<const int> ids, std::span<ExpertWeights> out) override;
  /// Every expert is in memory (the mapping): acquires them all.
  size_t acquire_available(int layer, std::span<const int> ids, std::span<ExpertWeights> out, std::span<uint8_t> got) override {
    acquire(layer, ids, out);
    std::fill(got.begin(), got.end(), uint8_t{1});
    return ids.size();
  }
  void release(int layer) override {}
  /// Every expert is in memory (the mapping): true.
  bool in_memory() const override { return true; }
  std::string describe() const override;

 private:
  std::shared_ptr<const io::Checkpoint> ckpt_;
  std::vector<std::vector<ExpertWeights>> experts_;  // [layer][expert]
};

}  // namespace spool::experts
