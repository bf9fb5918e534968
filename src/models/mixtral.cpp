// Mixtral (model_type mixtral, e.g. Mixtral-8x7B): Llama blocks (plain-weight RMSNorm, GQA,
// full RoPE, no q/k norm, no biases) with a sparse MoE in every layer: softmax router, top-k
// always renormalised (HF MixtralSparseMoeBlock / MixtralTopKRouter), SwiGLU experts
// block_sparse_moe.experts.{e}.{w1 gate, w3 up, w2 down} (renamed on open to
// mlp.experts.{e}.{gate,up,down}_proj and block_sparse_moe.gate to mlp.gate: tensor_rules()).
// GGUF: llama.cpp converts MixtralForCausalLM to arch "llama" with ffn_*_exps. `sliding_window`
// (null for 8x7B v0.1) is honoured: attention sees at most that many positions, and the cache
// keeps only the window's rows (models::State, ops/kv_cache.h).
// Source: HF transformers models/mixtral/modeling_mixtral.py.
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
  read_attention(c, &s.attn, s.hidden_size);
  read_rope(c, 1.0, &s.attn);
  s.moe.n_experts = positive(c, "num_local_experts");
  read_top_k(c, &s);
  s.moe.intermediate = positive(c, "intermediate_size");
  s.moe.norm_topk_prob = true;  // HF MixtralTopKRouter always renormalises
  s.mixers.assign(s.n_layers, MixerKind::kAttention);
  s.ffns.assign(s.n_layers, FfnKind::kMoE);
  if (c.has("sliding_window")) {
    const int64_t w = c.get_int("sliding_window");
    if (w <= 0) fail("%s: field 'sliding_window' must be a positive integer or null (got %lld)", c.source().c_str(), (long long)w);
    s.attn.sliding_window = w;
  }
}

// ---- GGUF ----------------------------------------------------------------------------------
// llama.cpp's LlamaModel permutes the rows of q_proj (n_head heads) and k_proj (n_head_kv heads)
// for ggml's adjacent-pair RoPE; HF Mixtral rotates halves, so the loader undoes it. The
// router and experts keep their names (block_sparse_moe.gate -> mlp.gate, as the safetensors
// names are renamed).
std::vector<io::GgufRow> gguf_rows() {
  return {
      {"attn_q.weight", "self_attn.q_proj.weight", io::GgufTransform::kUnpermuteQ},
      {"attn_k.weight", "self_attn.k_proj.weight", io::GgufTransform::kUnpermuteK},
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
  };
}

// "llama" is loaded only with routed experts; a dense Llama file is rejected.
void gguf_config(const io::GgufMeta& m, nlohmann::json& j) {
  if (!m.opt("expert_count") || m.opt("expert_count").value_or(0) == 0 || m.dense_layers().size() == static_cast<size_t>(m.layers()))
    fail("%s: a 'llama' GGUF without routed experts (a dense Llama) is not supported; spool loads llama files with "
         "ffn_*_exps (Mixtral)", m.label().c_str());
  m.require_all_moe("Mixtral");
  j["num_local_experts"] = m.need("expert_count");
  j["num_experts_per_tok"] = m.need("expert_used_count");
  j["intermediate_size"] = m.expert_ff();
}

}  // namespace

std::vector<io::TensorRename> block_sparse_moe_renames() {
  std::vector<io::TensorRename> r;
  for (const auto& [w, proj] : {std::pair{"w1", "gate_proj"}, std::pair{"w3", "up_proj"}, std::pair{"w2", "down_proj"}})
    r.push_back({std::string("layers.{L}.block_sparse_moe.experts.{E}.") + w + ".weight",
                 std::string("layers.{L}.mlp.experts.{E}.") + proj + ".weight"});
  r.push_back({"layers.{L}.block_sparse_moe.gate.weight", "layers.{L}.mlp.gate.weight"});
  return r;
}

const Family& mixtral_family() {
  static const Family f{.name = "mixtral",
                        .model_types = {"mixtral"},
                        .chat_formats = {"mistral"},
                        .configure = configure,
                        .load = load_decoder,
                        .describe = describe_gqa_moe,
                        .tensors = {.renames = block_sparse_moe_renames()},
                        .gguf = {{.name = "llama", .model_type = "mixtral", .rows = gguf_rows(), .config = gguf_config}}};
  return f;
}

}  // namespace spool::models
