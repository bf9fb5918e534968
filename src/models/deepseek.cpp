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

void configure(const io::Config& c, ModelSpec* sp, bool v3) {
  ModelSpec& s = *sp;
  check_act(c);
  read_mla(c, &s, v3 ? "deepseek_v3" : "deepseek_v2");
  auto& a = s.attn;
  auto& m = s.mla;
  a.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
  a.kv_latent_dim = m.kv_lora_rank + m.qk_rope_head_dim;
  read_mla_rope(c, &s);

  auto& mo = s.moe;
  mo.n_experts = positive(c, "n_routed_experts");
  read_top_k(c, &s);
  mo.intermediate = positive(c, "moe_intermediate_size");
  mo.norm_topk_prob = c.get_bool("norm_topk_prob", false);
  mo.shared_intermediate = non_negative(c, "n_shared_experts", 0) * mo.intermediate;
  mo.shared_name = "shared_experts";
  mo.grouped_router = true;
  mo.routed_scaling_factor = static_cast<float>(c.get_double("routed_scaling_factor", 1.0));
  mo.n_group = c.has("n_group") ? positive(c, "n_group") : 1;
  mo.topk_group = c.has("topk_group") ? positive(c, "topk_group") : mo.n_group;
  if (mo.n_experts % mo.n_group != 0)
    fail("%s: n_routed_experts (%d) must be a multiple of n_group (%d)", c.source().c_str(), mo.n_experts, mo.n_group);
  if (mo.topk_group > mo.n_group) fail("%s: topk_group (%d) exceeds n_group (%d)", c.source().c_str(), mo.topk_group, mo.n_group);
  if (v3) {
    const std::string method = c.get_string("topk_method", "noaux_tc");
    if (method != "noaux_tc") fail("%s: topk_method '%s' is not supported for deepseek_v3 (noaux_tc)", c.source().c_str(), method.c_str());
    mo.sigmoid_scores = true;
    mo.score_bias = true;
    mo.group_top2_sum = true;
  } else {
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

// DeepSeek-V3 config.json (deepseek-ai/DeepSeek-V3, bf16 layout; the release stores fp8).
Preset deepseek_v3_671b() {
  J cfg = {{"architectures", {"DeepseekV3ForCausalLM"}},
           {"model_type", "deepseek_v3"},
           {"vocab_size", 129280},
           {"hidden_size", 7168},
           {"intermediate_size", 18432},
           {"moe_intermediate_size", 2048},
           {"num_hidden_layers", 61},
           {"num_nextn_predict_layers", 1},
           {"num_attention_heads", 128},
           {"num_key_value_heads", 128},
           {"n_shared_experts", 1},
           {"n_routed_experts", 256},
           {"routed_scaling_factor", 2.5},
           {"kv_lora_rank", 512},
           {"q_lora_rank", 1536},
           {"qk_rope_head_dim", 64},
           {"v_head_dim", 128},
           {"qk_nope_head_dim", 128},
           {"topk_method", "noaux_tc"},
           {"n_group", 8},
           {"topk_group", 4},
           {"num_experts_per_tok", 8},
           {"moe_layer_freq", 1},
           {"first_k_dense_replace", 3},
           {"norm_topk_prob", true},
           {"scoring_func", "sigmoid"},
           {"hidden_act", "silu"},
           {"max_position_embeddings", 163840},
           {"rms_norm_eps", 1e-6},
           {"rope_theta", 10000},
           {"rope_scaling", {{"beta_fast", 32}, {"beta_slow", 1}, {"factor", 40}, {"mscale", 1.0}, {"mscale_all_dim", 1.0},
                             {"original_max_position_embeddings", 4096}, {"type", "yarn"}}},
           {"attention_bias", false},
           {"tie_word_embeddings", false},
           {"bos_token_id", 0},
           {"eos_token_id", 1},
           {"torch_dtype", "bfloat16"}};
  return {"deepseek-v3-671b", "DeepSeek-V3 / R1 671B: 61 MLA layers (3 dense), 256 experts top-8 + 1 shared, 8 groups", cfg, false,
          "model."};
}

// Kimi-K2 config.json (moonshotai/Kimi-K2-Instruct): the V3 architecture with 384 experts, one
// group, 64 heads, one dense layer.
Preset kimi_k2() {
  Preset p = deepseek_v3_671b();
  J& c = p.config;
  c["vocab_size"] = 163840;
  c["num_attention_heads"] = 64;
  c["num_key_value_heads"] = 64;
  c["n_routed_experts"] = 384;
  c["n_group"] = 1;
  c["topk_group"] = 1;
  c["first_k_dense_replace"] = 1;
  c["routed_scaling_factor"] = 2.827;
  c["rope_theta"] = 50000.0;
  c["rope_scaling"] = {{"beta_fast", 1.0}, {"beta_slow", 1.0}, {"factor", 32.0}, {"mscale", 1.0}, {"mscale_all_dim", 1.0},
                       {"original_max_position_embeddings", 4096}, {"type", "yarn"}};
  c["max_position_embeddings"] = 131072;
  c["num_nextn_predict_layers"] = 0;
  c["bos_token_id"] = 163584;
  c["eos_token_id"] = 163585;
  p.name = "kimi-k2";
  p.description = "Kimi-K2 1T: 61 MLA layers (1 dense), 384 experts top-8 + 1 shared, no groups";
  return p;
}

// A small deepseek_v3 shape for tests: the widths of tests/data/models/deepseek_v3 (3 MLA
// layers, 1 dense; 16 experts top-4 + 1 shared in 4 groups) with DeepSeek-V3's real vocabulary
// size, so the real tokenizer's ids (tests/data/tokenizers/deepseek_v3) all fit.
Preset tiny_deepseek_v3() {
  Preset p = deepseek_v3_671b();
  J& c = p.config;
  c["hidden_size"] = 64;
  c["intermediate_size"] = 96;
  c["moe_intermediate_size"] = 32;
  c["num_hidden_layers"] = 3;
  c["num_nextn_predict_layers"] = 0;
  c["num_attention_heads"] = 4;
  c["num_key_value_heads"] = 4;
  c["n_routed_experts"] = 16;
  c["n_group"] = 4;
  c["topk_group"] = 2;
  c["num_experts_per_tok"] = 4;
  c["first_k_dense_replace"] = 1;
  c["kv_lora_rank"] = 32;
  c["q_lora_rank"] = 48;
  c["qk_rope_head_dim"] = 8;
  c["qk_nope_head_dim"] = 16;
  c["v_head_dim"] = 16;
  c["max_position_embeddings"] = 4096;
  c["rope_scaling"] = {{"beta_fast", 32}, {"beta_slow", 1}, {"factor", 4}, {"mscale", 1.0}, {"mscale_all_dim", 1.0},
                       {"original_max_position_embeddings", 1024}, {"type", "yarn"}};
  p.name = "tiny-deepseek-v3";
  p.description = "a small deepseek_v3 shape for tests (3 MLA layers, 16 experts top-4 + 1 shared) with V3's 129280-token vocabulary";
  return p;
}

// DeepSeek-V2-Lite config.json (deepseek-ai/DeepSeek-V2-Lite).
Preset deepseek_v2_lite() {
  J cfg = {{"architectures", {"DeepseekV2ForCausalLM"}},
           {"model_type", "deepseek_v2"},
           {"vocab_size", 102400},
           {"hidden_size", 2048},
           {"intermediate_size", 10944},
           {"moe_intermediate_size", 1408},
           {"num_hidden_layers", 27},
           {"num_attention_heads", 16},
           {"num_key_value_heads", 16},
           {"n_shared_experts", 2},
           {"n_routed_experts", 64},
           {"routed_scaling_factor", 1.0},
           {"kv_lora_rank", 512},
           {"q_lora_rank", nullptr},
           {"qk_rope_head_dim", 64},
           {"v_head_dim", 128},
           {"qk_nope_head_dim", 128},
           {"topk_method", "greedy"},
           {"n_group", 1},
           {"topk_group", 1},
           {"num_experts_per_tok", 6},
           {"moe_layer_freq", 1},
           {"first_k_dense_replace", 1},
           {"norm_topk_prob", false},
           {"scoring_func", "softmax"},
           {"hidden_act", "silu"},
           {"max_position_embeddings", 163840},
           {"rms_norm_eps", 1e-6},
           {"rope_theta", 10000},
           {"rope_scaling", {{"beta_fast", 32}, {"beta_slow", 1}, {"factor", 40}, {"mscale", 0.707}, {"mscale_all_dim", 0.707},
                             {"original_max_position_embeddings", 4096}, {"type", "yarn"}}},
           {"attention_bias", false},
           {"tie_word_embeddings", false},
           {"bos_token_id", 100000},
           {"eos_token_id", 100001},
           {"torch_dtype", "bfloat16"}};
  return {"deepseek-v2-lite", "DeepSeek-V2-Lite 16B: 27 MLA layers (1 dense, no q_lora), 64 experts top-6 + 2 shared", cfg, false,
          "model."};
}

}  // namespace



const Family& deepseek_v2_family() {
  static const Family f{.name = "deepseek_v2",
                        .model_types = {"deepseek_v2"},
                        .configure = [](const io::Config& c, ModelSpec* s) { configure(c, s, false); },
                        .load = load_decoder,
                        .presets = [] { return std::vector<Preset>{deepseek_v2_lite()}; },
                        .keep_float = mla_keep_float,
                        .describe = describe_mla_moe,
                        .plan_notes = mtp_plan_notes};
  return f;
}

const Family& deepseek_v3_family() {
  static const Family f{.name = "deepseek_v3",
                        .model_types = {"deepseek_v3", "kimi_k2"},
                        .configure = [](const io::Config& c, ModelSpec* s) { configure(c, s, true); },
                        .load = load_decoder,
                        .presets = [] { return std::vector<Preset>{deepseek_v3_671b(), kimi_k2(), tiny_deepseek_v3()}; },
                        .keep_float = mla_keep_float,
                        .describe = describe_mla_moe,
                        .plan_notes = mtp_plan_notes};
  return f;
}

}  // namespace spool::models
