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

void configure(const io::Config& c, ModelSpec* sp) {
  ModelSpec& s = *sp;
  check_act(c);
  read_attention(c, &s.attn, s.hidden_size);
  read_rope(c, 1.0, &s.attn);
  s.attn.qk_norm = true;  // MiniMaxM2Attention always norms q and k (use_qk_norm is not read)
  s.attn.qk_norm_full = true;
  s.moe.n_experts = experts_count(c);
  read_top_k(c, &s);
  s.moe.intermediate = positive(c, "intermediate_size");  // the expert width: there is no dense MLP
  s.moe.norm_topk_prob = true;  // MiniMaxM2TopKRouter always renormalises
  s.moe.grouped_router = true;  // one group: plain top-k of the biased sigmoid scores
  s.moe.sigmoid_scores = true;
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

// MiniMax-M2 config.json (MiniMaxAI/MiniMax-M2, 230B-A10B; bf16 layout, the release stores fp8),
// with the partial_rotary_factor transformers reads next to the release's rotary_dim.
Preset minimax_m2() {
  J cfg = {{"architectures", {"MiniMaxM2ForCausalLM"}},
           {"attention_dropout", 0.0},
           {"bos_token_id", 200019},
           {"eos_token_id", 200020},
           {"head_dim", 128},
           {"hidden_act", "silu"},
           {"hidden_size", 3072},
           {"intermediate_size", 1536},
           {"max_position_embeddings", 196608},
           {"model_type", "minimax_m2"},
           {"mtp_transformer_layers", 1},
           {"num_attention_heads", 48},
           {"num_experts_per_tok", 8},
           {"num_hidden_layers", 62},
           {"num_key_value_heads", 8},
           {"num_local_experts", 256},
           {"num_mtp_modules", 3},
           {"qk_norm_type", "per_layer"},
           {"rms_norm_eps", 1e-6},
           {"rope_theta", 5000000},
           {"rotary_dim", 64},
           {"partial_rotary_factor", 0.5},
           {"scoring_func", "sigmoid"},
           {"shared_intermediate_size", 0},
           {"tie_word_embeddings", false},
           {"torch_dtype", "bfloat16"},
           {"use_cache", true},
           {"use_mtp", true},
           {"use_qk_norm", true},
           {"use_routing_bias", true},
           {"vocab_size", 200064}};
  return {"minimax-m2", "MiniMax-M2 230B-A10B: 62 attention layers (whole-projection q/k norm, half-dim RoPE), 256 experts top-8",
          cfg, false, "model."};
}

}  // namespace

const Family& minimax_m2_family() {
  static const Family f{.name = "minimax_m2",
                        .model_types = {"minimax_m2"},
                        .configure = configure,
                        .load = load_decoder,
                        .presets = [] { return std::vector<Preset>{minimax_m2()}; },
                        .describe = describe_gqa_moe,
                        .plan_notes = plan_notes};
  return f;
}

}  // namespace spool::models
