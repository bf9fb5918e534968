// OLMoE (model_type olmoe, e.g. OLMoE-1B-7B-0924): Llama blocks whose q/k RMSNorms cover the
// whole projection (q_norm [n_heads*head_dim], k_norm [n_kv_heads*head_dim], before the head
// split), full RoPE, a sparse MoE in every layer (softmax router, top-k renormalised only with
// norm_topk_prob, no shared expert). clip_qkv (null in the release) is not supported.
// Source: HF transformers models/olmoe/modeling_olmoe.py.
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/config_read.h"
#include "models/family.h"

namespace spool::models {

namespace {

using J = nlohmann::ordered_json;
using namespace cfg;

// ---- GGUF ----------------------------------------------------------------------------------
// Per-layer rows besides the common ones: q/k norms over the whole projection (same names), no
// value transforms.
std::vector<io::GgufRow> gguf_rows() { return io::qk_norm_block_rows("ffn_norm"); }

// llama.cpp's olmoe graph keeps the softmax weights of the top k (as the release).
void gguf_config(const io::GgufMeta& m, nlohmann::json& j) {
  m.require_all_moe("OLMoE");
  j["num_experts"] = m.need("expert_count");
  j["num_experts_per_tok"] = m.need("expert_used_count");
  j["intermediate_size"] = m.expert_ff();
  j["norm_topk_prob"] = false;
}

void configure(const io::Config& c, ModelSpec* sp) {
  ModelSpec& s = *sp;
  check_act(c);
  read_attention(c, &s.attn, s.hidden_size);
  read_rope(c, 1.0, &s.attn);
  s.attn.qk_norm = QkNorm::kWholeProjection;
  if (c.has("clip_qkv")) fail("%s: clip_qkv is not supported (null in the released OLMoE configs)", c.source().c_str());
  s.moe.n_experts = positive(c, "num_experts");
  read_top_k(c, &s);
  s.moe.intermediate = positive(c, "intermediate_size");
  s.moe.norm_topk_prob = c.get_bool("norm_topk_prob", false);
  s.mixers.assign(s.n_layers, MixerKind::kAttention);
  s.ffns.assign(s.n_layers, FfnKind::kMoE);
}

}  // namespace

const Family& olmoe_family() {
  static const Family f{.name = "olmoe",
                        .model_types = {"olmoe"},
                        .configure = configure,
                        .load = load_decoder,
                        .describe = describe_gqa_moe,
                        .gguf = {{.name = "olmoe", .model_type = "olmoe", .rows = gguf_rows(), .config = gguf_config}}};
  return f;
}

}  // namespace spool::models
