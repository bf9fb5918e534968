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

void configure(const io::Config& c, ModelSpec* sp) {
  ModelSpec& s = *sp;
  check_act(c);
  read_attention(c, &s.attn, s.hidden_size);
  s.moe.n_experts = experts_count(c);
  read_top_k(c, &s);
  s.moe.intermediate = positive(c, "moe_intermediate_size");
  s.attn.qk_norm = true;
  read_rope(c, 1.0, &s.attn);
  s.mixers.assign(s.n_layers, MixerKind::kAttention);
  s.moe.norm_topk_prob = c.get_bool("norm_topk_prob", false);
  s.ffns = sparse_layers(c, s.n_layers);
  if (c.get_bool("use_sliding_window", false)) fail("%s: use_sliding_window=true is not supported", c.source().c_str());
}

std::unique_ptr<Model> load(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec, std::shared_ptr<ops::Backend> backend) {
  auto m = std::make_unique<DecoderModel>(std::move(ckpt), std::move(spec), std::move(backend));
  m->bind(GdnLayout::kQwen3_5);  // no GDN layers in this family
  return m;
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

}  // namespace

const Family& qwen3_moe_family() {
  static const Family f{.name = "qwen3_moe",
                        .model_types = {"qwen3_moe"},
                        .configure = configure,
                        .load = load,
                        .presets = [] { return std::vector<Preset>{qwen3_30b()}; },
                        .describe = describe_gqa_moe};
  return f;
}

}  // namespace spool::models
