// Qwen3-MoE (model_type qwen3_moe, e.g. Qwen3-30B-A3B): all-attention decoder with
// plain-weight RMSNorms (also per-head q/k norms), full RoPE, softmax top-k router with
// norm_topk_prob, no shared expert; `mlp_only_layers` / `decoder_sparse_step` select dense
// SwiGLU layers. Source: HF transformers models/qwen3_moe/modeling_qwen3_moe.py.
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
// Per-layer rows besides the common ones: q/k norms over the whole projection (same names), no
// value transforms.
std::vector<io::GgufRow> gguf_rows() { return io::qk_norm_block_rows("ffn_norm"); }

// llama.cpp's qwen3moe graph renormalises the top-k weights; layers without a router are mlp_only.
void gguf_config(const io::GgufMeta& m, nlohmann::json& j) { m.qwen_style_moe(j); }

void configure(const io::Config& c, ModelSpec* sp) {
  ModelSpec& s = *sp;
  check_act(c);
  read_attention(c, &s.attn, s.hidden_size);
  s.moe.n_experts = experts_count(c);
  read_top_k(c, &s);
  s.moe.intermediate = positive(c, "moe_intermediate_size");
  s.attn.qk_norm = QkNorm::kPerHead;
  read_rope(c, 1.0, &s.attn);
  s.mixers.assign(s.n_layers, MixerKind::kAttention);
  s.moe.norm_topk_prob = c.get_bool("norm_topk_prob", false);
  s.ffns = sparse_layers(c, s.n_layers);
  if (c.get_bool("use_sliding_window", false)) fail("%s: use_sliding_window=true is not supported", c.source().c_str());
}

std::unique_ptr<Model> load(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec, std::shared_ptr<ops::Backend> backend) {
  auto m = std::make_unique<DecoderModel>(std::move(ckpt), std::move(spec), std::move(backend));
  m->bind(GdnLayout::kSplit);  // no GDN layers in this family
  return m;
}

}  // namespace

const Family& qwen3_moe_family() {
  static const Family f{.name = "qwen3_moe",
                        .model_types = {"qwen3_moe"},
                        .chat_formats = {"qwen3_json", "qwen3_xml"},
                        .configure = configure,
                        .load = load,
                        .describe = describe_gqa_moe,
                        .gguf = {{.name = "qwen3moe", .model_type = "qwen3_moe", .rows = gguf_rows(), .config = gguf_config}}};
  return f;
}

}  // namespace spool::models
