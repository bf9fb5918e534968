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

// ---- GGUF ----------------------------------------------------------------------------------
// qwen3next and qwen35moe: norms stored as 1 + w, the Gated DeltaNet tensors; qwen35moe stores
// the V heads tiled (io::GgufArch::v_tiled).
std::vector<io::GgufRow> gguf_rows(bool tiled) {
  using T = io::GgufTransform;
  using S = io::GgufShape;
  constexpr auto N1 = T::kNormMinus1;
  std::vector<io::GgufRow> r = io::qk_norm_block_rows("post_attention_norm", N1);
  r.insert(r.end(), {
      {"ffn_gate_shexp.weight", "mlp.shared_expert.gate_proj.weight"},
      {"ffn_up_shexp.weight", "mlp.shared_expert.up_proj.weight"},
      {"ffn_down_shexp.weight", "mlp.shared_expert.down_proj.weight"},
      {"ffn_gate_inp_shexp.weight", "mlp.shared_expert_gate.weight", T::kNone, S::kRowVector},
      {"ssm_norm.weight", "linear_attn.norm.weight"},  // RMSNormGated: no +1 offset
  });
  if (!tiled) {
    r.push_back({"attn_qkv.weight", "linear_attn.in_proj_qkv.weight"});
    r.push_back({"attn_gate.weight", "linear_attn.in_proj_z.weight"});
    r.push_back({"ssm_in.weight", "linear_attn.in_proj_qkvz.weight"});  // legacy layout, HF rows unchanged
    r.push_back({"ssm_ba.weight", "linear_attn.in_proj_b.weight", T::kBaSplitB});  // a: the loader splits it off
    r.push_back({"ssm_conv1d.weight", "linear_attn.conv1d.weight", T::kNone, S::kConv1d});
    r.push_back({"ssm_dt.bias", "linear_attn.dt_bias"});
    r.push_back({"ssm_a", "linear_attn.A_log", T::kALog});
    r.push_back({"ssm_out.weight", "linear_attn.out_proj.weight"});
  } else {
    const auto VR = T::kVRows;
    r.push_back({"attn_qkv.weight", "linear_attn.in_proj_qkv.weight", VR, S::kReversed, -1, true});
    r.push_back({"attn_gate.weight", "linear_attn.in_proj_z.weight", VR, S::kReversed, -1});
    r.push_back({"ssm_beta.weight", "linear_attn.in_proj_b.weight", VR, S::kReversed, 1});
    r.push_back({"ssm_alpha.weight", "linear_attn.in_proj_a.weight", VR, S::kReversed, 1});
    r.push_back({"ssm_conv1d.weight", "linear_attn.conv1d.weight", VR, S::kConv1d, -1, true});
    r.push_back({"ssm_dt.bias", "linear_attn.dt_bias", VR, S::kReversed, 1});
    r.push_back({"ssm_a", "linear_attn.A_log", T::kALog, S::kReversed, 1});
    r.push_back({"ssm_out.weight", "linear_attn.out_proj.weight", T::kVCols, S::kReversed, -1});
  }
  return r;
}

// The MoE fields (the hybrid ssm.* keys and layer_types are generic: io::GgufArch::hybrid).
// llama.cpp's qwen3next / qwen35moe graphs renormalise the top-k weights; layers without a
// router are mlp_only. The converter's MTP blocks (nextn_predict_layers, from the HF
// mtp_num_hidden_layers) are declared as mtp_num_hidden_layers.
void gguf_config(const io::GgufMeta& m, nlohmann::json& j) {
  m.qwen_style_moe(j);
  if (m.nextn() > 0) j["mtp_num_hidden_layers"] = m.nextn();
}

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
  s.attn.qk_norm = QkNorm::kPerHead;
  read_rope(c, 0.25, &s.attn);
  s.mixers = hybrid_layer_types(c, s.n_layers);
  read_gdn(c, &s.gdn);
  s.gdn.layout = next ? GdnLayout::kGroupedQkvz : GdnLayout::kSplit;  // HF Qwen3NextGatedDeltaNet: in_proj_qkvz / in_proj_ba
  s.mtp_layout = io::MtpLayout::kMtpPrefix;                           // mtp.* (mtp_num_hidden_layers)
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
  for (int i = 0; i < spec.n_layers && spec.gdn.layout == GdnLayout::kGroupedQkvz; ++i)
    if (spec.mixers[i] == MixerKind::kGatedDeltaNet) {
      if (ckpt->find("layers." + std::to_string(i) + ".linear_attn.in_proj_qkv.weight") != nullptr) spec.gdn.layout = GdnLayout::kSplit;
      break;
    }
  const GdnLayout layout = spec.gdn.layout;
  auto m = std::make_unique<DecoderModel>(std::move(ckpt), std::move(spec), std::move(backend));
  m->bind(layout);
  return m;
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
                        .chat_formats = {"qwen3_xml"},
                        .configure = [](const io::Config& c, ModelSpec* s) { configure_hybrid(c, s, false); },
                        .load = load,
                        .describe = describe,
                        .gguf = {{.name = "qwen35moe",
                                  .model_type = "qwen3_5_moe_text",
                                  .hybrid = true,
                                  .v_tiled = true,
                                  .partial_rotary_default = 0.25,
                                  .mtp = io::MtpLayout::kMtpPrefix,
                                  .rows = gguf_rows(true),
                                  .config = gguf_config}}};
  return f;
}

const Family& qwen3_next_family() {
  static const Family f{.name = "qwen3_next",
                        .model_types = {"qwen3_next"},
                        .chat_formats = {"qwen3_json"},
                        .configure = [](const io::Config& c, ModelSpec* s) { configure_hybrid(c, s, true); },
                        .load = load,
                        .describe = describe,
                        .gguf = {{.name = "qwen3next",
                                  .model_type = "qwen3_next",
                                  .hybrid = true,
                                  .partial_rotary_default = 0.25,
                                  .mtp = io::MtpLayout::kMtpPrefix,
                                  .rows = gguf_rows(false),
                                  .config = gguf_config}}};
  return f;
}

}  // namespace spool::models
