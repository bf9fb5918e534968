// DeepSeek-V2 / V2-Lite (model_type deepseek_v2) and DeepSeek-V3 / R1 / Kimi-K2 (deepseek_v3):
// multi-head latent attention (models/mla.h: weight-absorbed form over a latent cache of
// kv_lora_rank + qk_rope_head_dim per position), YaRN RoPE with mscale on adjacent pairs, a dense
// SwiGLU MLP in the first first_k_dense_replace layers and a MoE after: V3 sigmoid scores +
// e_score_correction_bias + group-limited top-k (sum of each group's two best), V2 softmax greedy /
// group-limited (each group's best); weights times routed_scaling_factor; ungated shared experts
// (mlp.shared_experts, width moe_intermediate_size * n_shared_experts). Layers past
// num_hidden_layers (multi-token prediction) are not loaded.
// Sources: HF transformers models/deepseek_v3/modeling_deepseek_v3.py, models/deepseek_v2/,
// modeling_rope_utils.py (_compute_yarn_parameters); DeepSeek inference/model.py (absorb).
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/config_read.h"
#include "models/family.h"

namespace spool::models {

namespace {

using J = nlohmann::ordered_json;
using namespace cfg;

// ---- GGUF ----------------------------------------------------------------------------------
// llama.cpp arch "deepseek2" (DeepSeek-V2 / V2-Lite / V3, MLA). q: attn_q_a + attn_q_a_norm +
// attn_q_b, or attn_q ("lite"); kv_b_proj as attn_kv_b (older files) or split into attn_k_b (per
// head, transposed) + attn_v_b (files with key_length_mla). No q/k permutation (ggml's
// adjacent-pair RoPE is HF DeepSeek's interleaved rope). kv_b_proj is read per head as floats
// (models/mla.h): as_float.
std::vector<io::GgufRow> gguf_rows() {
  using T = io::GgufTransform;
  using S = io::GgufShape;
  return {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q_a.weight", "self_attn.q_a_proj.weight"},
      {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
      {"attn_q_b.weight", "self_attn.q_b_proj.weight"},
      {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"},
      {"attn_kv_b.weight", "self_attn.kv_b_proj.weight", T::kNone, S::kReversed, 0, false, /*as_float=*/true},
      {"attn_k_b.weight", "self_attn.kv_b_proj.weight", T::kKvbFromKb, S::kReversed, 0, false, true},
      {"attn_v_b.weight", "self_attn.kv_b_proj.weight", T::kWithKb, S::kReversed, 0, false, true},
      {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"},
      {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"},
      {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"},
      {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"},
  };
}

void gguf_config(const io::GgufMeta& m, nlohmann::json& j) {
  const io::GgufFile& g = m.file();
  const std::string& label = m.label();
  const std::string& p = m.prefix();
  if (auto st = g.get_string(p + "rope.scaling.type"); st && *st != "none") {
    if (*st != "yarn") fail("%s: rope scaling '%s' is not supported yet", label.c_str(), st->c_str());
    // DeepSeek YaRN (HF rope_parameters): llama.cpp's converter writes yarn_log_multiplier =
    // 0.1 * mscale_all_dim; the released configs have mscale == mscale_all_dim, which no key records.
    nlohmann::json& rope = j["rope_parameters"];
    rope["rope_type"] = "yarn";
    rope["factor"] = m.optf("rope.scaling.factor").value_or(0.0);
    if (auto o = m.opt("rope.scaling.original_context_length")) rope["original_max_position_embeddings"] = *o;
    if (auto lm = m.optf("rope.scaling.yarn_log_multiplier"); lm && *lm != 0.0) rope["mscale"] = rope["mscale_all_dim"] = *lm / 0.1;
    if (auto b = m.optf("rope.scaling.yarn_beta_fast")) rope["beta_fast"] = *b;
    if (auto b = m.optf("rope.scaling.yarn_beta_slow")) rope["beta_slow"] = *b;
  }
  // MLA: key_length_mla / value_length_mla (files with attn_k_b / attn_v_b) or, in older
  // files, key_length / value_length are the per-head q.k and v sizes; the kv heads written
  // as 1 are the latent's, HF counts one K and V per head.
  const int64_t rope_dim = m.need("rope.dimension_count");
  const int64_t kl = m.opt("attention.key_length_mla") ? m.need("attention.key_length_mla") : m.need("attention.key_length");
  const int64_t vl = m.opt("attention.value_length_mla") ? m.need("attention.value_length_mla") : m.need("attention.value_length");
  if (kl <= rope_dim) fail("%s: q.k head size %lld is not above the rope dims %lld", label.c_str(), (long long)kl, (long long)rope_dim);
  j["num_key_value_heads"] = j["num_attention_heads"];
  j["kv_lora_rank"] = m.need("attention.kv_lora_rank");
  if (auto q = m.opt("attention.q_lora_rank"); q && *q > 0) j["q_lora_rank"] = *q;
  j["qk_rope_head_dim"] = rope_dim;
  j["qk_nope_head_dim"] = kl - rope_dim;
  j["v_head_dim"] = vl;
  j["rope_interleave"] = true;  // ggml's adjacent-pair RoPE on the unpermuted weights
  j["rope_parameters"].erase("partial_rotary_factor");
  const int64_t gating = m.opt("expert_gating_func").value_or(1);  // absent (older V2 files): softmax
  if (gating != 1 && gating != 2)
    fail("%s: '%sexpert_gating_func' %lld is neither softmax (1) nor sigmoid (2)", label.c_str(), p.c_str(), (long long)gating);
  const bool v3 = gating == 2;
  j["model_type"] = v3 ? "deepseek_v3" : "deepseek_v2";
  m.deepseek_style_moe(j);
  const int64_t groups = m.opt("expert_group_count").value_or(1);
  j["n_group"] = groups;
  j["topk_group"] = m.opt("expert_group_used_count").value_or(groups);
  j["topk_method"] = v3 ? "noaux_tc" : groups > 1 ? "group_limited_greedy" : "greedy";
  if (v3) j["num_nextn_predict_layers"] = m.nextn();
}

void configure(const io::Config& c, ModelSpec* sp, bool v3) {
  ModelSpec& s = *sp;
  check_act(c);
  read_mla(c, &s, v3 ? "deepseek_v3" : "deepseek_v2");
  auto& a = s.attn;
  auto& m = s.mla;
  a.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
  a.kv_latent_dim = m.kv_lora_rank + m.qk_rope_head_dim;
  read_mla_rope(c, &s);
  if (v3) s.mtp_layout = io::MtpLayout::kNextnLayer;  // layers.{n_layers + k}.* (num_nextn_predict_layers)

  auto& mo = s.moe;
  if (v3) {
    // HF DeepseekV3Config: topk_group defaults to n_group; DeepseekV3TopkRouter zeroes dropped groups.
    read_noaux_tc_moe(c, &s, /*norm_default=*/false, /*topk_group_default_all=*/true, /*mask_neg_inf=*/false);
    const std::string method = c.get_string("topk_method", "noaux_tc");
    if (method != "noaux_tc") fail("%s: topk_method '%s' is not supported for deepseek_v3 (noaux_tc)", c.source().c_str(), method.c_str());
  } else {
    // The softmax router of DeepSeek-V2 (greedy or group-limited greedy top-k).
    mo.n_experts = positive(c, "n_routed_experts");
    read_top_k(c, &s);
    mo.intermediate = positive(c, "moe_intermediate_size");
    mo.norm_topk_prob = c.get_bool("norm_topk_prob", false);
    mo.shared_intermediate = non_negative(c, "n_shared_experts", 0) * mo.intermediate;
    mo.shared_name = "shared_experts";
    mo.score = RouterScore::kSoftmax;
    mo.selection = RouterSelection::kGroupedTopK;  // greedy = one group (below)
    mo.routed_scaling_factor = static_cast<float>(c.get_double("routed_scaling_factor", 1.0));
    mo.n_group = c.has("n_group") ? positive(c, "n_group") : 1;
    mo.topk_group = c.has("topk_group") ? positive(c, "topk_group") : mo.n_group;
    if (mo.n_experts % mo.n_group != 0)
      fail("%s: n_routed_experts (%d) must be a multiple of n_group (%d)", c.source().c_str(), mo.n_experts, mo.n_group);
    if (mo.topk_group > mo.n_group) fail("%s: topk_group (%d) exceeds n_group (%d)", c.source().c_str(), mo.topk_group, mo.n_group);
    const std::string method = c.get_string("topk_method", "greedy");
    if (method == "greedy") {
      mo.n_group = mo.topk_group = 1;
    } else if (method != "group_limited_greedy") {
      fail("%s: topk_method '%s' is not supported for deepseek_v2 (greedy, group_limited_greedy)", c.source().c_str(), method.c_str());
    }
    const std::string scoring = c.get_string("scoring_func", "softmax");
    if (scoring != "softmax") fail("%s: scoring_func '%s' is not supported for deepseek_v2", c.source().c_str(), scoring.c_str());
  }
  const int first_dense = non_negative(c, "first_k_dense_replace", 0);
  const int freq = c.has("moe_layer_freq") ? positive(c, "moe_layer_freq") : 1;
  s.mixers.assign(s.n_layers, MixerKind::kMLA);
  for (int i = 0; i < s.n_layers; ++i) s.ffns.push_back(i >= first_dense && i % freq == 0 ? FfnKind::kMoE : FfnKind::kDense);
}

}  // namespace



const Family& deepseek_v2_family() {
  static const Family f{.name = "deepseek_v2",
                        .model_types = {"deepseek_v2"},
                        .chat_formats = {"deepseek_v3"},
                        .configure = [](const io::Config& c, ModelSpec* s) { configure(c, s, false); },
                        .load = load_decoder,
                        .keep_float = mla_keep_float,
                        .describe = describe_mla_moe,
                        .plan_notes = mtp_plan_notes};
  return f;
}

const Family& deepseek_v3_family() {
  static const Family f{.name = "deepseek_v3",
                        .model_types = {"deepseek_v3", "kimi_k2"},
                        .chat_formats = {"deepseek_v3", "kimi_k2"},
                        .configure = [](const io::Config& c, ModelSpec* s) { configure(c, s, true); },
                        .load = load_decoder,
                        .keep_float = mla_keep_float,
                        .describe = describe_mla_moe,
                        .plan_notes = mtp_plan_notes,
                        // v2 or v3 by its router (the config hook's model_type wins).
                        .gguf = {{.name = "deepseek2",
                                  .model_type = "deepseek_v3",
                                  .mla = true,
                                  .reads_rope_scaling = true,
                                  .mtp = io::MtpLayout::kNextnLayer,
                                  .rows = gguf_rows(),
                                  .config = gguf_config}}};
  return f;
}

}  // namespace spool::models
