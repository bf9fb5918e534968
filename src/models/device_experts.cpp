#include "models/device_experts.h"

#include "common/error.h"
#include "common/sysinfo.h"
#include "ops/quant_matmul.h"

namespace spool::models {

uint64_t weight_view_bytes(const ops::WeightView& w) {
  if (w.type != ops::WType::kQuant) return static_cast<uint64_t>(w.rows * w.cols) * ops::wtype_size(w.type);
  const ops::QuantView& q = w.quant;
  uint64_t n = static_cast<uint64_t>(q.rows * q.row_bytes()) + static_cast<uint64_t>(q.rows * q.groups_per_row()) * 2 +
               static_cast<uint64_t>(ops::qtype_levels(q.type)) * 4;
  if (q.signs) n += static_cast<uint64_t>(q.cols);
  return n;
}

DeviceExperts::DeviceExperts(experts::ExpertProvider& source, ops::Backend& be, const std::vector<bool>& moe_layers, int n_experts)
    : device_(ops::device_name(be.device())) {
  experts_.resize(moe_layers.size());
  for (size_t l = 0; l < moe_layers.size(); ++l) {
    if (!moe_layers[l]) continue;
    experts_[l].resize(static_cast<size_t>(n_experts));
    for (int e = 0; e < n_experts; ++e) {
      experts::ExpertWeights w;
      source.acquire(static_cast<int>(l), std::span<const int>(&e, 1), std::span<experts::ExpertWeights>(&w, 1));
      try {
        experts::ExpertWeights& d = experts_[l][static_cast<size_t>(e)];
        d.gate = be.upload(w.gate);
        d.up = be.upload(w.up);
        d.down = be.upload(w.down);
        bytes_ += weight_view_bytes(w.gate) + weight_view_bytes(w.up) + weight_view_bytes(w.down);
      } catch (...) {
        source.release(static_cast<int>(l));
        throw;
      }
      source.release(static_cast<int>(l));
    }
  }
}

void DeviceExperts::acquire(int layer, std::span<const int> ids, std::span<experts::ExpertWeights> out) {
  if (layer < 0 || static_cast<size_t>(layer) >= experts_.size() || experts_[layer].empty())
    fail("device experts: layer %d has no routed experts", layer);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || static_cast<size_t>(ids[i]) >= experts_[layer].size()) fail("device experts: expert %d of layer %d does not exist", ids[i], layer);
    out[i] = experts_[layer][static_cast<size_t>(ids[i])];
  }
}

std::string DeviceExperts::describe() const {
  return strfmt("experts resident on %s: %s", device_, format_bytes(bytes_).c_str());
}

}  // namespace spool::models
