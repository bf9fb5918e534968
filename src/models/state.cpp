#include "models/state.h"

#include <algorithm>

namespace spool::models {

State::State(const ModelSpec& spec) : n_kv_heads_(spec.attn.n_kv_heads), head_dim_(spec.attn.head_dim) {
  attn.resize(spec.n_layers);
  gdn.resize(spec.n_layers);
  const GdnSpec& g = spec.gdn;
  for (int i = 0; i < spec.n_layers; ++i) {
    if (spec.mixers[i] == MixerKind::kGatedDeltaNet) {
      gdn[i].conv.assign(static_cast<size_t>(g.conv_dim() * (g.conv_kernel - 1)), 0.0f);
      gdn[i].recurrent.assign(static_cast<size_t>(g.n_v) * g.d_k * g.d_v, 0.0f);
    }
  }
  is_attn_.resize(spec.n_layers);
  for (int i = 0; i < spec.n_layers; ++i) is_attn_[i] = spec.mixers[i] == MixerKind::kAttention;
}

void State::reserve(int64_t n_positions) {
  for (size_t l = 0; l < attn.size(); ++l) {
    AttnCache& c = attn[l];
    if (!is_attn_[l]) continue;
    if (c.capacity >= n_positions) continue;
    int64_t cap = std::max<int64_t>({n_positions, 2 * c.capacity, 256});
    cap = (cap + 255) / 256 * 256;
    const size_t hd = static_cast<size_t>(head_dim_);
    std::vector<float> k(static_cast<size_t>(n_kv_heads_) * cap * hd), v(k.size());
    for (int h = 0; h < n_kv_heads_ && c.capacity > 0; ++h) {
      for (size_t d = 0; d < hd; ++d)  // key rows: one per (head, dimension)
        std::copy_n(c.k.data() + (h * hd + d) * c.capacity, pos, k.data() + (h * hd + d) * cap);
      std::copy_n(c.v.data() + h * c.capacity * hd, pos * hd, v.data() + h * cap * hd);
    }
    c.head_dim = head_dim_;
    c.k.swap(k);
    c.v.swap(v);
    c.capacity = cap;
  }
}

void State::reset() {
  pos = 0;
  poisoned = false;
  for (auto& g : gdn) {
    std::fill(g.conv.begin(), g.conv.end(), 0.0f);
    std::fill(g.recurrent.begin(), g.recurrent.end(), 0.0f);
  }
}

uint64_t State::bytes() const {
  uint64_t n = 0;
  for (const auto& c : attn) n += (c.k.size() + c.v.size()) * sizeof(float);
  for (const auto& g : gdn) n += (g.conv.size() + g.recurrent.size()) * sizeof(float);
  return n;
}

}  // namespace spool::models
