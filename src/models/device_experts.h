// DeviceExperts: routed experts resident in a GPU backend's memory. At construction every expert
// of every MoE layer is taken once from a host provider (the mmap'd checkpoint's ResidentExperts)
// and copied with Backend::upload; acquire() then hands out the device views, so decode reads
// expert weights from VRAM and nothing crosses the host link per token. The engine chooses it
// when dense weights + KV + workspace + experts fit --vram-budget-gb (engine/loader.cpp); when
// they do not, the host provider stays and the backend copies each routed expert per call.
#pragma once

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

/// Bytes a WeightView's data occupies (float rows, or codes + scales + codebook + signs).
uint64_t weight_view_bytes(const ops::WeightView& w);

}  // namespace spool::models
