#include "experts/resident.h"

#include "common/error.h"
#include "experts/weight_views.h"

namespace spool::experts {

ResidentExperts::ResidentExperts(std::shared_ptr<const io::Checkpoint> ckpt, const std::vector<bool>& moe_layers,
                                 int n_experts, int hidden, int intermediate)
    : ckpt_(std::move(ckpt)) {
  experts_.resize(moe_layers.size());
  for (size_t l = 0; l < moe_layers.size(); ++l) {
    if (!moe_layers[l]) continue;
    experts_[l].resize(n_experts);
    for (int e = 0; e < n_experts; ++e) experts_[l][e] = expert_views(*ckpt_, static_cast<int>(l), e, hidden, intermediate);
  }
}

void ResidentExperts::acquire(int layer, std::span<const int> ids, std::span<ExpertWeights> out) {
  const auto& layer_experts = experts_.at(static_cast<size_t>(layer));
  for (size_t i = 0; i < ids.size(); ++i) out[i] = layer_experts.at(static_cast<size_t>(ids[i]));
}

std::string ResidentExperts::describe() const { return "resident (memory-mapped checkpoint)"; }

}  // namespace spool::experts
