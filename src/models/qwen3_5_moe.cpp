// Qwen3.5 / Qwen3.6 MoE (model_type qwen3_5_moe, qwen3_5_moe_text) and Qwen3-Next
// (qwen3_next): hybrid Gated DeltaNet + gated attention decoders with (1+w) RMSNorms, a
// softmax top-k router and a sigmoid-gated shared expert. Qwen3-Next differs only in its
// grouped GDN input projections (regrouped at load) and its norm_topk_prob / dense layers.
// Source: HF transformers models/qwen3_5_moe/modeling_qwen3_5_moe.py, models/qwen3_next/.
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/config_read.h"
#include "models/decoder.h"
#include "models/family.h"

namespace spool::models {

namespace {

using J = nlohmann::ordered_json;
using namespace cfg;

std::vector<MixerKind> hybrid_layer_types(const io::Config& c, int n_layers) {
  std::vector<MixerKind> m;
  if (c.has("layer_types")) {
    auto lt = c.get_string_list("layer_types");
    if (static_cast<int>(lt.size()) < n_layers)
      fail("%s: layer_types has %zu entries for %d layers", c.source().c_str(), lt.size(), n_layers);
    for (int i = 0; i < n_layers; ++i) {
      if (lt[i] == "linear_attention") m.push_back(MixerKind::kGatedDeltaNet);
      else if (lt[i] == "full_attention") m.push_back(MixerKind::kAttention);
      else fail("%s: layer_types[%d] = '%s' (expected linear_attention or full_attention)", c.source().c_str(), i, lt[i].c_str());
    }
  } else {
    int interval = static_cast<int>(c.get_int("full_attention_interval", 4));
    if (interval <= 0) fail("%s: full_attention_interval must be positive", c.source().c_str());
    for (int i = 0; i < n_layers; ++i) m.push_back((i + 1) % interval == 0 ? MixerKind::kAttention : MixerKind::kGatedDeltaNet);
  }
  return m;
}

void read_gdn(const io::Config& c, GdnSpec* g) {
  g->n_k = positive(c, "linear_num_key_heads");
  g->n_v = positive(c, "linear_num_value_heads");
  g->d_k = positive(c, "linear_key_head_dim");
  g->d_v = positive(c, "linear_value_head_dim");
  g->conv_kernel = static_cast<int>(c.get_int("linear_conv_kernel_dim", 4));
  if (g->conv_kernel < 1 || g->conv_kernel > 64) fail("%s: linear_conv_kernel_dim out of range", c.source().c_str());
  if (g->n_v % g->n_k != 0)
    fail("%s: linear_num_value_heads (%d) must be a multiple of linear_num_key_heads (%d)", c.source().c_str(), g->n_v, g->n_k);
}

void configure_hybrid(const io::Config& c, ModelSpec* sp, bool next) {
  ModelSpec& s = *sp;
  check_act(c);
  read_attention(c, &s.attn, s.hidden_size);
  s.moe.n_experts = experts_count(c);
  read_top_k(c, &s);
  s.moe.intermediate = positive(c, "moe_intermediate_size");
  s.norm_one_plus = true;
  s.attn.output_gate = true;
  s.attn.qk_norm = true;
  read_rope(c, 0.25, &s.attn);
  s.mixers = hybrid_layer_types(c, s.n_layers);
  read_gdn(c, &s.gdn);
  s.moe.shared_intermediate = c.has("shared_expert_intermediate_size") ? positive(c, "shared_expert_intermediate_size") : 0;
  s.moe.shared_expert_gate = s.moe.shared_intermediate > 0;
  if (!next) {
    s.moe.norm_topk_prob = true;  // hard-coded in HF Qwen3_5MoeTopKRouter
    s.ffns.assign(s.n_layers, FfnKind::kMoE);
  } else {
    s.moe.norm_topk_prob = c.get_bool("norm_topk_prob", true);
    s.ffns = sparse_layers(c, s.n_layers);
  }
}

std::unique_ptr<Model> load(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec, std::shared_ptr<ops::Backend> backend) {
  // Qwen3-Next stores in_proj_qkvz / in_proj_ba grouped per key head; a qwen3next GGUF written
  // by current llama.cpp carries them split into in_proj_qkv / in_proj_z (and the loader splits
  // ssm_ba into in_proj_b / in_proj_a), which is the Qwen3.5 layout.
  GdnLayout layout = spec.family == "qwen3_next" ? GdnLayout::kQwen3Next : GdnLayout::kQwen3_5;
  for (int i = 0; i < spec.n_layers && layout == GdnLayout::kQwen3Next; ++i)
    if (spec.mixers[i] == MixerKind::kGatedDeltaNet) {
      if (ckpt->find("layers." + std::to_string(i) + ".linear_attn.in_proj_qkv.weight") != nullptr) layout = GdnLayout::kQwen3_5;
      break;
    }
  auto m = std::make_unique<DecoderModel>(std::move(ckpt), std::move(spec), std::move(backend));
  m->bind(layout);
  return m;
}

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

std::string describe(const ModelSpec& s) {
  return strfmt("%d Gated DeltaNet layers (constant state) + %d attention layers of %d KV heads x %d dims; %d experts top-%d%s",
                s.n_layers_of(MixerKind::kGatedDeltaNet), s.n_layers_of(MixerKind::kAttention), s.attn.n_kv_heads,
                s.attn.head_dim, s.moe.n_experts, s.moe.top_k, s.moe.shared_intermediate > 0 ? " + shared" : "");
}

}  // namespace

const Family& qwen3_5_moe_family() {
  static const Family f{.name = "qwen3_5_moe",
                        .model_types = {"qwen3_5_moe", "qwen3_5_moe_text"},
                        .configure = [](const io::Config& c, ModelSpec* s) { configure_hybrid(c, s, false); },
                        .load = load,
                        .presets = [] { return std::vector<Preset>{qwen36_35b(), tiny()}; },
                        .describe = describe};
  return f;
}

const Family& qwen3_next_family() {
  static const Family f{.name = "qwen3_next",
                        .model_types = {"qwen3_next"},
                        .configure = [](const io::Config& c, ModelSpec* s) { configure_hybrid(c, s, true); },
                        .load = load,
                        .presets = [] { return std::vector<Preset>{qwen3_next_80b()}; },
                        .describe = describe};
  return f;
}

}  // namespace spool::models
