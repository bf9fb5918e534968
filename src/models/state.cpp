#include "models/state.h"

#include <algorithm>

namespace spool::models {

State::State(const ModelSpec& spec, ops::KvType kv) {
  attn.resize(spec.n_layers);
  gdn.resize(spec.n_layers);
  is_attn_.resize(spec.n_layers);
  const GdnSpec& g = spec.gdn;
  for (int i = 0; i < spec.n_layers; ++i) {
    is_attn_[i] = spec.mixers[i] == MixerKind::kAttention;
    if (is_attn_[i]) {
      attn[i].configure(kv, spec.attn.n_kv_heads, spec.attn.head_dim);
    } else {
      gdn[i].conv.assign(static_cast<size_t>(g.conv_dim() * (g.conv_kernel - 1)), 0.0f);
      gdn[i].recurrent.assign(static_cast<size_t>(g.n_v) * g.d_k * g.d_v, 0.0f);
    }
  }
}

void State::reserve(int64_t n_positions) {
  for (size_t l = 0; l < attn.size(); ++l)
    if (is_attn_[l]) attn[l].reserve(n_positions, pos);
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
  for (const auto& c : attn) n += c.bytes();
  for (const auto& g : gdn) n += (g.conv.size() + g.recurrent.size()) * sizeof(float);
  return n;
}

}  // namespace spool::models
