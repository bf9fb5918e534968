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

// ---- GGUF ----------------------------------------------------------------------------------
// post_attention_layernorm is ATTN_POST_NORM for this arch; q/k/v biases; optional per-head q/k
// norms; DeepSeek-style shared experts and router correction bias. No q/k permutation (NeoX RoPE).
std::vector<io::GgufRow> gguf_rows() {
  std::vector<io::GgufRow> r = io::qk_norm_block_rows("post_attention_norm");
  r.insert(r.end(), {
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"},
      {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"},
      {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"},
      {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"},
  });
  return r;
}

void gguf_config(const io::GgufMeta& m, nlohmann::json& j) {
  m.require_gating(2, "GLM-4.5 (sigmoid)");
  m.deepseek_style_moe(j);
  j["n_group"] = m.opt("expert_group_count").value_or(1);
  j["topk_group"] = m.opt("expert_group_used_count").value_or(1);
  j["attention_bias"] = m.has_tensor(0, "attn_q.bias");
  j["use_qk_norm"] = m.has_tensor(0, "attn_q_norm.weight");
  j["num_nextn_predict_layers"] = m.nextn();
}

void configure(const io::Config& c, ModelSpec* sp) {
  ModelSpec& s = *sp;
  check_act(c);
  read_attention(c, &s.attn, s.hidden_size, /*bias_ok=*/true);
  read_rope(c, 0.5, &s.attn);  // HF Glm4MoeConfig.__post_init__: partial_rotary_factor defaults to 0.5
  s.attn.qk_norm = c.get_bool("use_qk_norm", false) ? QkNorm::kPerHead : QkNorm::kNone;
  read_noaux_tc_moe(c, &s, /*norm_default=*/true);
  const int first_dense = non_negative(c, "first_k_dense_replace", 1);
  s.mixers.assign(s.n_layers, MixerKind::kAttention);
  for (int i = 0; i < s.n_layers; ++i) s.ffns.push_back(i >= first_dense ? FfnKind::kMoE : FfnKind::kDense);
  s.mtp_layout = io::MtpLayout::kNextnLayer;  // layers.{n_layers + k}.* (num_nextn_predict_layers)
}

}  // namespace

const Family& glm4_moe_family() {
  static const Family f{.name = "glm4_moe",
                        .model_types = {"glm4_moe"},
                        .chat_formats = {"glm4_5"},
                        .configure = configure,
                        .load = load_decoder,
                        .describe = describe_gqa_moe,
                        .plan_notes = mtp_plan_notes,
                        .gguf = {{.name = "glm4moe",
                                  .model_type = "glm4_moe",
                                  .partial_rotary_default = 0.5,
                                  .mtp = io::MtpLayout::kNextnLayer,
                                  .rows = gguf_rows(),
                                  .config = gguf_config}}};
  return f;
}

}  // namespace spool::models
