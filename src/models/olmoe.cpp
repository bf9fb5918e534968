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

void configure(const io::Config& c, ModelSpec* sp) {
  ModelSpec& s = *sp;
  check_act(c);
  read_attention(c, &s.attn, s.hidden_size);
  read_rope(c, 1.0, &s.attn);
  s.attn.qk_norm = true;
  s.attn.qk_norm_full = true;
  if (c.has("clip_qkv")) fail("%s: clip_qkv is not supported (null in the released OLMoE configs)", c.source().c_str());
  s.moe.n_experts = positive(c, "num_experts");
  read_top_k(c, &s);
  s.moe.intermediate = positive(c, "intermediate_size");
  s.moe.norm_topk_prob = c.get_bool("norm_topk_prob", false);
  s.mixers.assign(s.n_layers, MixerKind::kAttention);
  s.ffns.assign(s.n_layers, FfnKind::kMoE);
}

// OLMoE-1B-7B-0924 config.json (allenai/OLMoE-1B-7B-0924).
Preset olmoe_1b_7b() {
  J cfg = {{"architectures", {"OlmoeForCausalLM"}},
           {"model_type", "olmoe"},
           {"vocab_size", 50304},
           {"hidden_size", 2048},
           {"intermediate_size", 1024},
           {"num_hidden_layers", 16},
           {"num_attention_heads", 16},
           {"num_key_value_heads", 16},
           {"num_experts", 64},
           {"num_experts_per_tok", 8},
           {"norm_topk_prob", false},
           {"max_position_embeddings", 4096},
           {"rms_norm_eps", 1e-5},
           {"rope_theta", 10000.0},
           {"clip_qkv", nullptr},
           {"hidden_act", "silu"},
           {"attention_bias", false},
           {"tie_word_embeddings", false},
           {"eos_token_id", 50279},
           {"pad_token_id", 1},
           {"torch_dtype", "bfloat16"}};
  return {"olmoe-1b-7b", "OLMoE-1B-7B: 16 attention layers (full q/k norms), 64 experts top-8", cfg, false, "model."};
}

}  // namespace

const Family& olmoe_family() {
  static const Family f{.name = "olmoe",
                        .model_types = {"olmoe"},
                        .configure = configure,
                        .load = load_decoder,
                        .presets = [] { return std::vector<Preset>{olmoe_1b_7b()}; },
                        .describe = describe_gqa_moe};
  return f;
}

}  // namespace spool::models
