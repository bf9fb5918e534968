#include "experts/resident.h"

#include "common/error.h"

namespace spool::experts {

ops::WeightView view_of(const io::TensorRef& t) {
  ops::WeightView v;
  switch (t.dtype) {
    case io::DType::F32: v.type = ops::WType::kF32; break;
    case io::DType::BF16: v.type = ops::WType::kBF16; break;
    case io::DType::F16: v.type = ops::WType::kF16; break;
    default: fail("tensor '%s': dtype %s cannot be used as a weight", t.name.c_str(), io::dtype_name(t.dtype));
  }
  if (t.shape.empty()) fail("tensor '%s' is a scalar, expected a matrix", t.name.c_str());
  v.rows = t.shape[0];
  v.cols = t.shape[0] == 0 ? 0 : t.numel() / t.shape[0];
  v.data = t.data;
  if (v.data == nullptr) fail("tensor '%s': checkpoint was opened without data", t.name.c_str());
  return v;
}

ResidentExperts::ResidentExperts(std::shared_ptr<const io::Checkpoint> ckpt, const std::vector<bool>& moe_layers,
                                 int n_experts, int hidden, int intermediate)
    : ckpt_(std::move(ckpt)) {
  experts_.resize(moe_layers.size());
  for (size_t l = 0; l < moe_layers.size(); ++l) {
    if (!moe_layers[l]) continue;
    experts_[l].resize(n_experts);
    for (int e = 0; e < n_experts; ++e) {
      auto get = [&](io::ExpertProj p, int64_t rows, int64_t cols) {
        const io::TensorRef& t = ckpt_->expert(static_cast<int>(l), e, p);
        if (t.shape.size() != 2 || t.shape[0] != rows || t.shape[1] != cols)
          fail("%s: expert tensor '%s' has shape %s, expected [%lld, %lld]", ckpt_->dir().c_str(), t.name.c_str(),
               t.shape_str().c_str(), (long long)rows, (long long)cols);
        return view_of(t);
      };
      experts_[l][e] = {get(io::ExpertProj::kGate, intermediate, hidden), get(io::ExpertProj::kUp, intermediate, hidden),
                        get(io::ExpertProj::kDown, hidden, intermediate)};
    }
  }
}

void ResidentExperts::acquire(int layer, std::span<const int> ids, std::span<ExpertWeights> out) {
  const auto& layer_experts = experts_.at(static_cast<size_t>(layer));
  for (size_t i = 0; i < ids.size(); ++i) out[i] = layer_experts.at(static_cast<size_t>(ids[i]));
}

std::string ResidentExperts::describe() const { return "resident (memory-mapped checkpoint)"; }

}  // namespace spool::experts
