// Mixtral (model_type mixtral, e.g. Mixtral-8x7B): Llama blocks (plain-weight RMSNorm, GQA,
// full RoPE, no q/k norm, no biases) with a sparse MoE in every layer: softmax router, top-k
// always renormalised (HF MixtralSparseMoeBlock / MixtralTopKRouter), SwiGLU experts
// block_sparse_moe.experts.{e}.{w1 gate, w3 up, w2 down} (io::Checkpoint maps them to
// mlp.experts.{e}.{gate,up,down}_proj and block_sparse_moe.gate to mlp.gate). `sliding_window`
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

// Mixtral-8x7B-v0.1 config.json (mistralai/Mixtral-8x7B-v0.1).
Preset mixtral_8x7b() {
  J cfg = {{"architectures", {"MixtralForCausalLM"}},
           {"model_type", "mixtral"},
           {"vocab_size", 32000},
           {"hidden_size", 4096},
           {"intermediate_size", 14336},
           {"num_hidden_layers", 32},
           {"num_attention_heads", 32},
           {"num_key_value_heads", 8},
           {"num_local_experts", 8},
           {"num_experts_per_tok", 2},
           {"max_position_embeddings", 32768},
           {"rms_norm_eps", 1e-5},
           {"rope_theta", 1000000.0},
           {"sliding_window", nullptr},
           {"hidden_act", "silu"},
           {"tie_word_embeddings", false},
           {"bos_token_id", 1},
           {"eos_token_id", 2},
           {"router_aux_loss_coef", 0.02},
           {"torch_dtype", "bfloat16"}};
  return {"mixtral-8x7b", "Mixtral-8x7B: 32 attention layers (GQA 8 KV heads), 8 experts top-2 in every layer", cfg, false, "model."};
}

}  // namespace

const Family& mixtral_family() {
  static const Family f{.name = "mixtral",
                        .model_types = {"mixtral"},
                        .configure = configure,
                        .load = load_decoder,
                        .presets = [] { return std::vector<Preset>{mixtral_8x7b()}; },
                        .describe = describe_gqa_moe};
  return f;
}

}  // namespace spool::models
