// GLM-4.7-Flash (model_type glm4_moe_lite, HF Glm4MoeLiteForCausalLM): DeepSeek-V3 multi-head
// latent attention (models/mla.h; HF Glm4MoeLiteAttention = DeepseekV3Attention) with GLM-4.5's
// MoE block (sigmoid + e_score_correction_bias noaux_tc router, routed_scaling_factor, ungated
// mlp.shared_experts). What differs from deepseek_v3: the dense / MoE choice per layer comes
// from mlp_layer_types ("dense" | "sparse"; default one dense layer then sparse), the block
// norms use rms_norm_eps (1e-5) while q_a_layernorm / kv_a_layernorm keep the RMSNorm class
// default 1e-6, v_head_dim differs from qk_nope_head_dim, RoPE is plain (interleaved pairs on
// qk_rope_head_dim dims; YaRN only if rope_parameters say so), no partial_rotary_factor. The
// multi-token-prediction layer (layers.{num_hidden_layers}) is not loaded.
// Source: HF transformers 5.17 models/glm4_moe_lite/{configuration,modeling}_glm4_moe_lite.py.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/config_read.h"
#include "models/family.h"

namespace spool::models {

namespace {

using J = nlohmann::ordered_json;
using namespace cfg;

void configure(const io::Config& c, ModelSpec* sp) {
  ModelSpec& s = *sp;
  check_act(c);
  read_mla(c, &s, "glm4_moe_lite");
  auto& a = s.attn;
  auto& m = s.mla;
  m.latent_norm_eps = 1e-6f;  // Glm4MoeLiteRMSNorm(q_lora_rank) / (kv_lora_rank): built without eps
  a.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
  a.kv_latent_dim = m.kv_lora_rank + m.qk_rope_head_dim;
  read_mla_rope(c, &s);
  read_noaux_tc_moe(c, &s, /*norm_default=*/true);
  s.mixers.assign(s.n_layers, MixerKind::kMLA);
  if (c.has("mlp_layer_types")) {
    const std::vector<std::string> types = c.get_string_list("mlp_layer_types");
    if (static_cast<int>(types.size()) != s.n_layers)
      fail("%s: mlp_layer_types has %zu entries, num_hidden_layers is %d", c.source().c_str(), types.size(), s.n_layers);
    for (const std::string& t : types) {
      if (t != "dense" && t != "sparse")
        fail("%s: mlp_layer_types entry '%s' is not 'dense' or 'sparse'", c.source().c_str(), t.c_str());
      s.ffns.push_back(t == "sparse" ? FfnKind::kMoE : FfnKind::kDense);
    }
  } else {  // HF default: ["dense"] + ["sparse"] * (num_hidden_layers - 1)
    for (int i = 0; i < s.n_layers; ++i) s.ffns.push_back(i == 0 ? FfnKind::kDense : FfnKind::kMoE);
  }
}

}  // namespace

const Family& glm4_moe_lite_family() {
  static const Family f{.name = "glm4_moe_lite",
                        .model_types = {"glm4_moe_lite"},
                        .chat_formats = {"glm4_5"},
                        .configure = configure,
                        .load = load_decoder,
                        .keep_float = mla_keep_float,
                        .describe = describe_mla_moe,
                        .plan_notes = mtp_plan_notes};
  return f;
}

}  // namespace spool::models
