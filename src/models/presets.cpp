#include "models/presets.h"

#include "common/error.h"

namespace spool::models {

namespace {

using J = nlohmann::ordered_json;

J hybrid_layer_types(int n, int interval) {
  J lt = J::array();
  for (int i = 0; i < n; ++i) lt.push_back((i + 1) % interval == 0 ? "full_attention" : "linear_attention");
  return lt;
}

Preset qwen36_35b() {
  J text = {{"model_type", "qwen3_5_moe_text"},
            {"vocab_size", 248320},
            {"hidden_size", 2048},
            {"num_hidden_layers", 40},
            {"layer_types", hybrid_layer_types(40, 4)},
            {"full_attention_interval", 4},
            {"num_attention_heads", 16},
            {"num_key_value_heads", 2},
            {"head_dim", 256},
            {"attention_bias", false},
            {"attn_output_gate", true},
            {"linear_num_key_heads", 16},
            {"linear_num_value_heads", 32},
            {"linear_key_head_dim", 128},
            {"linear_value_head_dim", 128},
            {"linear_conv_kernel_dim", 4},
            {"num_experts", 256},
            {"num_experts_per_tok", 8},
            {"moe_intermediate_size", 512},
            {"shared_expert_intermediate_size", 512},
            {"rms_norm_eps", 1e-6},
            {"hidden_act", "silu"},
            {"max_position_embeddings", 262144},
            {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.25},
                                 {"mrope_section", {11, 11, 10}}, {"mrope_interleaved", true}}},
            {"tie_word_embeddings", false},
            {"eos_token_id", 248044},
            {"dtype", "bfloat16"}};
  J cfg = {{"architectures", {"Qwen3_5MoeForConditionalGeneration"}},
           {"model_type", "qwen3_5_moe"},
           {"text_config", text},
           {"tie_word_embeddings", false},
           {"image_token_id", 248056},
           {"video_token_id", 248057},
           {"vision_start_token_id", 248053},
           {"vision_end_token_id", 248054}};
  return {"qwen3.6-35b-a3b", "Qwen3.6-35B-A3B / Qwen3.5-35B-A3B: 40 layers (30 Gated DeltaNet + 10 gated attention), 256 experts top-8 + shared",
          cfg, true, "model.language_model."};
}

Preset qwen3_30b() {
  J cfg = {{"architectures", {"Qwen3MoeForCausalLM"}},
           {"model_type", "qwen3_moe"},
           {"vocab_size", 151936},
           {"hidden_size", 2048},
           {"num_hidden_layers", 48},
           {"num_attention_heads", 32},
           {"num_key_value_heads", 4},
           {"head_dim", 128},
           {"intermediate_size", 6144},
           {"moe_intermediate_size", 768},
           {"num_experts", 128},
           {"num_experts_per_tok", 8},
           {"norm_topk_prob", true},
           {"decoder_sparse_step", 1},
           {"mlp_only_layers", J::array()},
           {"rms_norm_eps", 1e-6},
           {"rope_theta", 1000000.0},
           {"max_position_embeddings", 40960},
           {"hidden_act", "silu"},
           {"attention_bias", false},
           {"tie_word_embeddings", false},
           {"eos_token_id", 151645},
           {"torch_dtype", "bfloat16"}};
  return {"qwen3-30b-a3b", "Qwen3-30B-A3B: 48 attention layers, 128 experts top-8", cfg, false, "model."};
}

Preset qwen3_next_80b() {
  J cfg = {{"architectures", {"Qwen3NextForCausalLM"}},
           {"model_type", "qwen3_next"},
           {"vocab_size", 151936},
           {"hidden_size", 2048},
           {"num_hidden_layers", 48},
           {"layer_types", hybrid_layer_types(48, 4)},
           {"full_attention_interval", 4},
           {"num_attention_heads", 16},
           {"num_key_value_heads", 2},
           {"head_dim", 256},
           {"partial_rotary_factor", 0.25},
           {"rope_theta", 5000000.0},
           {"linear_num_key_heads", 16},
           {"linear_num_value_heads", 32},
           {"linear_key_head_dim", 128},
           {"linear_value_head_dim", 128},
           {"linear_conv_kernel_dim", 4},
           {"num_experts", 512},
           {"num_experts_per_tok", 10},
           {"moe_intermediate_size", 512},
           {"shared_expert_intermediate_size", 512},
           {"norm_topk_prob", true},
           {"decoder_sparse_step", 1},
           {"mlp_only_layers", J::array()},
           {"intermediate_size", 5120},
           {"rms_norm_eps", 1e-6},
           {"hidden_act", "silu"},
           {"max_position_embeddings", 262144},
           {"attention_bias", false},
           {"tie_word_embeddings", false},
           {"eos_token_id", 151645},
           {"torch_dtype", "bfloat16"}};
  return {"qwen3-next-80b-a3b", "Qwen3-Next-80B-A3B: 48 layers (36 Gated DeltaNet + 12 gated attention), 512 experts top-10 + shared",
          cfg, false, "model."};
}

Preset tiny() {
  Preset p = qwen36_35b();
  J& t = p.config["text_config"];
  t["vocab_size"] = 8256;
  t["hidden_size"] = 128;
  t["num_hidden_layers"] = 4;
  t["layer_types"] = hybrid_layer_types(4, 4);
  t["num_attention_heads"] = 4;
  t["head_dim"] = 32;
  t["linear_num_key_heads"] = 2;
  t["linear_num_value_heads"] = 4;
  t["linear_key_head_dim"] = 32;
  t["linear_value_head_dim"] = 32;
  t["num_experts"] = 32;
  t["moe_intermediate_size"] = 64;
  t["shared_expert_intermediate_size"] = 64;
  t["max_position_embeddings"] = 4096;
  t["eos_token_id"] = 0;
  p.name = "tiny-qwen3.5";
  p.description = "a small qwen3_5_moe shape for tests (4 layers, 32 experts top-8)";
  return p;
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> v = {qwen36_35b(), qwen3_30b(), qwen3_next_80b(), tiny()};
  return v;
}

const Preset& preset(const std::string& name) {
  std::string names;
  for (const auto& p : presets()) {
    if (p.name == name || (name == "qwen3.5-35b-a3b" && p.name == "qwen3.6-35b-a3b")) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  throw UsageError(strfmt("unknown preset '%s' (known: %s)", name.c_str(), names.c_str()));
}

}  // namespace spool::models
