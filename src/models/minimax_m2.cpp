// MiniMax-M2 / M2.1 / M2.5 (model_type minimax_m2, HF MiniMaxM2ForCausalLM): Llama blocks whose
// q/k RMSNorms cover the whole projection (q_norm [n_heads*head_dim], k_norm
// [n_kv_heads*head_dim], before the head split, eps rms_norm_eps), NeoX RoPE on the first
// head_dim * partial_rotary_factor dims of each head (HF reads only partial_rotary_factor: a
// config without it rotates every dim, whatever its rotary_dim says), and a MoE in every layer:
// s = sigmoid(router logits), the top-k of s + e_score_correction_bias chosen, weights s of the
// chosen renormalised to sum 1 (no scaling factor, no groups, no shared expert); experts
// block_sparse_moe.experts.{e}.{w1 gate, w3 up, w2 down} of width intermediate_size
// (io::Checkpoint maps block_sparse_moe.gate and .e_score_correction_bias to mlp.gate.*).
// Multi-token-prediction modules are not loaded.
// Source: HF transformers 5.17 models/minimax_m2/{configuration,modeling}_minimax_m2.py.
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/config_read.h"
#include "models/family.h"

namespace spool::models {

namespace {

using J = nlohmann::ordered_json;
using namespace cfg;

// ---- GGUF ----------------------------------------------------------------------------------
// Full-projection q/k norms, sigmoid router with correction bias. The converter renames
// block_sparse_moe.e_score_correction_bias to e_score_correction.bias, so it lands on
// exp_probs_b.bias (the safetensors name is renamed to mlp.gate.* too: tensor renames below).
std::vector<io::GgufRow> gguf_rows() {
  std::vector<io::GgufRow> r = io::qk_norm_block_rows("ffn_norm");
  r.push_back({"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"});
  return r;
}

void gguf_config(const io::GgufMeta& m, nlohmann::json& j) {
  m.require_gating(2, "MiniMax-M2 (sigmoid)");
  m.require_all_moe("MiniMax-M2");
  j["num_local_experts"] = m.need("expert_count");
  j["num_experts_per_tok"] = m.need("expert_used_count");
  j["intermediate_size"] = m.expert_ff();
}

// Mixtral's block_sparse_moe names, and the router bias MiniMax-M2 keeps beside the gate.
std::vector<io::TensorRename> renames() {
  std::vector<io::TensorRename> r = block_sparse_moe_renames();
  r.push_back({"layers.{L}.block_sparse_moe.e_score_correction_bias", "layers.{L}.mlp.gate.e_score_correction_bias"});
  return r;
}

void configure(const io::Config& c, ModelSpec* sp) {
  ModelSpec& s = *sp;
  check_act(c);
  read_attention(c, &s.attn, s.hidden_size);
  read_rope(c, 1.0, &s.attn);
  s.attn.qk_norm = QkNorm::kWholeProjection;  // MiniMaxM2Attention always norms q and k (use_qk_norm is not read)
  s.moe.n_experts = experts_count(c);
  read_top_k(c, &s);
  s.moe.intermediate = positive(c, "intermediate_size");  // the expert width: there is no dense MLP
  s.moe.norm_topk_prob = true;  // MiniMaxM2TopKRouter always renormalises
  s.moe.score = RouterScore::kSigmoid;
  s.moe.selection = RouterSelection::kTopK;  // plain top-k of the biased sigmoid scores
  s.moe.score_bias = true;
  s.mixers.assign(s.n_layers, MixerKind::kAttention);
  s.ffns.assign(s.n_layers, FfnKind::kMoE);
}

std::vector<std::string> plan_notes(const io::Config& c) {
  std::vector<std::string> n;
  io::Config rp = c.get_object("rope_parameters");
  if (c.has("rotary_dim") && !c.has("partial_rotary_factor") && !rp.has("partial_rotary_factor"))
    n.push_back("config.json has rotary_dim but no partial_rotary_factor: as transformers, RoPE rotates every head dim "
                "(add \"partial_rotary_factor\": rotary_dim / head_dim to rotate only rotary_dim)");
  if (c.get_bool("use_mtp", false) || c.get_int("num_mtp_modules", 0) > 0)
    n.push_back("multi-token-prediction modules are not counted: decoding does not use them");
  return n;
}

}  // namespace

const Family& minimax_m2_family() {
  static const Family f{.name = "minimax_m2",
                        .model_types = {"minimax_m2"},
                        .chat_formats = {"minimax_m2"},
                        .configure = configure,
                        .load = load_decoder,
                        .describe = describe_gqa_moe,
                        .plan_notes = plan_notes,
                        .tensors = {.renames = renames()},
                        .gguf = {{.name = "minimax-m2", .model_type = "minimax_m2", .rows = gguf_rows(), .config = gguf_config}}};
  return f;
}

}  // namespace spool::models
