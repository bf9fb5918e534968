#include "models/ops_used.h"

#include <algorithm>

namespace spool::models {

std::vector<std::string> optional_ops_used(const ModelSpec& spec) {
  const auto has_mixer = [&](MixerKind k) { return std::find(spec.mixers.begin(), spec.mixers.end(), k) != spec.mixers.end(); };
  const bool moe = std::find(spec.ffns.begin(), spec.ffns.end(), FfnKind::kMoE) != spec.ffns.end();
  bool windowed = false;
  for (int i = 0; i < spec.n_layers && i < static_cast<int>(spec.mixers.size()); ++i)
    if (spec.mixers[i] == MixerKind::kAttention && spec.attn.windowed(i)) windowed = true;
  const bool attention = has_mixer(MixerKind::kAttention);
  // In the order of ops::generic_host_fallback_ops(). The Gemma-4-style mechanisms are generic
  // elementwise ops: the dense MLP's tanh-GELU (the routed experts' runs inside expert_ffn), the
  // per-layer residual scale, the logit softcap, the per-expert weight scale.
  std::vector<std::string> ops;
  if (moe && spec.moe.general_router()) ops.emplace_back("route_grouped_top_k");
  if (spec.activation == ActivationKind::kGeluTanh) ops.emplace_back("gelu_tanh_glu");
  if (spec.residual_scale) ops.emplace_back("scale");
  if (spec.final_logit_softcap > 0.0f) ops.emplace_back("softcap");
  if (moe && spec.moe.per_expert_scale) ops.emplace_back("mul_indexed");
  if (attention && windowed && !spec.attn.sinks) ops.emplace_back("attention_window");
  if (attention && spec.attn.sinks) ops.emplace_back("attention_sinks");
  if (has_mixer(MixerKind::kMLA)) ops.emplace_back("mla_attention");
  return ops;
}

}  // namespace spool::models
