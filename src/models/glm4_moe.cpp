// GLM-4.5 / GLM-4.6 / GLM-4.7 / GLM-4.5-Air (model_type glm4_moe, HF Glm4MoeForCausalLM): Llama
// blocks with q/k/v biases (attention_bias; o_proj has none), optional per-head q/k RMSNorm
// (use_qk_norm), NeoX RoPE on the first head_dim * partial_rotary_factor dims of each head
// (default factor 0.5 when the config has none), a dense SwiGLU MLP (intermediate_size) in the
// first first_k_dense_replace layers and a MoE after: DeepSeek-V3's noaux_tc router (sigmoid
// scores, e_score_correction_bias for the choice only, groups scored by their two best, top-k
// renormalised with + 1e-20 when norm_topk_prob, times routed_scaling_factor) and an ungated
// shared expert mlp.shared_experts of moe_intermediate_size * n_shared_experts. The
// multi-token-prediction layer (layers.{num_hidden_layers}) is not loaded.
// Source: HF transformers 5.17 models/glm4_moe/{configuration,modeling}_glm4_moe.py.
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
  read_attention(c, &s.attn, s.hidden_size, /*bias_ok=*/true);
  read_rope(c, 0.5, &s.attn);  // HF Glm4MoeConfig.__post_init__: partial_rotary_factor defaults to 0.5
  s.attn.qk_norm = c.get_bool("use_qk_norm", false);  // per head, over head_dim
  read_noaux_tc_moe(c, &s, /*norm_default=*/true);
  const int first_dense = non_negative(c, "first_k_dense_replace", 1);
  s.mixers.assign(s.n_layers, MixerKind::kAttention);
  for (int i = 0; i < s.n_layers; ++i) s.ffns.push_back(i >= first_dense ? FfnKind::kMoE : FfnKind::kDense);
}

// GLM-4.5-Air config.json (zai-org/GLM-4.5-Air, 106B-A12B).
Preset glm4_5_air() {
  J cfg = {{"architectures", {"Glm4MoeForCausalLM"}},
           {"attention_bias", true},
           {"attention_dropout", 0.0},
           {"pad_token_id", 151329},
           {"eos_token_id", {151329, 151336, 151338}},
           {"head_dim", 128},
           {"hidden_act", "silu"},
           {"hidden_size", 4096},
           {"partial_rotary_factor", 0.5},
           {"initializer_range", 0.02},
           {"intermediate_size", 10944},
           {"max_position_embeddings", 131072},
           {"model_type", "glm4_moe"},
           {"moe_intermediate_size", 1408},
           {"norm_topk_prob", true},
           {"num_attention_heads", 96},
           {"n_group", 1},
           {"topk_group", 1},
           {"n_routed_experts", 128},
           {"n_shared_experts", 1},
           {"routed_scaling_factor", 1.0},
           {"num_experts_per_tok", 8},
           {"first_k_dense_replace", 1},
           {"num_hidden_layers", 46},
           {"num_key_value_heads", 8},
           {"rms_norm_eps", 1e-5},
           {"rope_scaling", nullptr},
           {"rope_theta", 1000000},
           {"num_nextn_predict_layers", 1},
           {"tie_word_embeddings", false},
           {"torch_dtype", "bfloat16"},
           {"use_cache", true},
           {"use_qk_norm", false},
           {"vocab_size", 151552}};
  return {"glm-4.5-air", "GLM-4.5-Air 106B-A12B: 46 attention layers (q/k/v bias, half-dim RoPE; 1 dense), 128 experts top-8 + 1 shared",
          cfg, false, "model."};
}

// GLM-4.6 config.json (zai-org/GLM-4.6, 355B-A32B; GLM-4.5 and GLM-4.7 have the same shapes).
Preset glm4_6() {
  Preset p = glm4_5_air();
  J& c = p.config;
  c["hidden_size"] = 5120;
  c["intermediate_size"] = 12288;
  c["moe_intermediate_size"] = 1536;
  c["n_routed_experts"] = 160;
  c["first_k_dense_replace"] = 3;
  c["num_hidden_layers"] = 92;
  c["routed_scaling_factor"] = 2.5;
  c["max_position_embeddings"] = 202752;
  c["use_qk_norm"] = true;
  p.name = "glm-4.6";
  p.description = "GLM-4.6 355B-A32B: 92 attention layers (q/k/v bias, q/k norm, half-dim RoPE; 3 dense), 160 experts top-8 + 1 shared";
  return p;
}

}  // namespace

const Family& glm4_moe_family() {
  static const Family f{.name = "glm4_moe",
                        .model_types = {"glm4_moe"},
                        .configure = configure,
                        .load = load_decoder,
                        .presets = [] { return std::vector<Preset>{glm4_5_air(), glm4_6()}; },
                        .describe = describe_gqa_moe,
                        .plan_notes = mtp_plan_notes};
  return f;
}

}  // namespace spool::models
