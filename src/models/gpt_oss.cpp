// gpt-oss (model_type gpt_oss: gpt-oss-20b, gpt-oss-120b), HF transformers 5.17
// models/gpt_oss/modeling_gpt_oss.py. Pre-norm decoder, RMSNorm multiply-then-cast (the same as
// the plain form in f32), every layer attention + MoE:
//  * attention: biases on q/k/v/o, NeoX RoPE over the whole head with YaRN frequencies
//    (truncate: false keeps the ramp bounds fractional) and the attention factor on cos/sin,
//    per-head learned sink logits in the softmax denominator (GptOssAttention eager), a sliding
//    window (`sliding_window`, HF: key j visible to query i iff i - W < j <= i) on the layers
//    `layer_types` marks "sliding_attention" (default: even layers). Those layers' caches
//    keep only the window's rows (models::State, ops/kv_cache.h; HF's sliding cache keeps W - 1 too).
//  * MoE: router `mlp.router` with bias; top-k of the logits, softmax over the k; experts with
//    biases, gate_up interleaved (gate = even rows, up = odd), clamped SwiGLU
//    (up.clamp(-7, 7) + 1) * g * sigmoid(1.702 g), g = gate.clamp(max = 7).
// Experts load from the released MXFP4 layout (`*_blocks` + E8M0 `*_scales`, read and run
// natively: WType::kMxfp4) or from the float layout ([E, in, out], io::Checkpoint transposes).
// Source: docs architectures-2 §4 (spec written from transformers 5.17.0).
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/config_read.h"
#include "models/family.h"

namespace spool::models {

namespace {

using J = nlohmann::ordered_json;
using namespace cfg;

// YaRN RoPE frequencies and attention factor (HF _compute_yarn_parameters,
// modeling_rope_utils.py): gpt-oss releases use factor 32, beta_fast 32, beta_slow 1,
// original_max_position_embeddings 4096, truncate false, θ 150000.
void read_gpt_oss_rope(const io::Config& c, ModelSpec* s) {
  AttentionSpec& a = s->attn;
  std::string type;
  io::Config rp = rope_parameters(c, &type);
  const bool absent = !c.has("rope_parameters") && !c.has("rope_scaling");
  const double theta = rp.get_double("rope_theta", c.get_double("rope_theta", 150000.0));
  if (theta <= 0) fail("%s: rope_theta must be positive", c.source().c_str());
  const int dim = a.head_dim;
  a.rope_theta = theta;
  a.rotary_dim = dim;
  if (!absent && type == "default") return;
  if (!absent && type != "yarn")
    fail("%s: rope_type '%s' is not supported for gpt_oss (yarn or default)", c.source().c_str(), type.c_str());
  // HF defaults when rope_parameters is null (configuration_gpt_oss.py).
  const double factor = rp.get_double("factor", 32.0), orig = rp.get_double("original_max_position_embeddings", 4096.0);
  if (factor <= 0) fail("%s: yarn rope needs a positive 'factor'", c.source().c_str());
  if (orig <= 0) fail("%s: yarn rope needs a positive 'original_max_position_embeddings'", c.source().c_str());
  read_yarn(rp, theta, dim, factor, orig, /*truncate_default=*/absent ? false : true, &a);
}

void configure(const io::Config& c, ModelSpec* sp) {
  ModelSpec& s = *sp;
  AttentionSpec& a = s.attn;
  a.n_heads = positive(c, "num_attention_heads");
  a.n_kv_heads = c.has("num_key_value_heads") ? positive(c, "num_key_value_heads") : a.n_heads;
  if (a.n_heads % a.n_kv_heads != 0)
    fail("%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", c.source().c_str(), a.n_heads, a.n_kv_heads);
  a.head_dim = c.has("head_dim") ? positive(c, "head_dim") : s.hidden_size / a.n_heads;
  if (a.head_dim <= 0 || a.head_dim % 2 != 0) fail("%s: head_dim must be a positive even number", c.source().c_str());
  a.qkv_bias = a.o_bias = c.get_bool("attention_bias", true);
  a.sinks = true;
  read_gpt_oss_rope(c, &s);
  // Sliding window on the layers layer_types names "sliding_attention".
  std::vector<std::string> types = c.get_string_list("layer_types");
  if (types.empty())
    for (int i = 0; i < s.n_layers; ++i) types.push_back((i + 1) % 2 != 0 ? "sliding_attention" : "full_attention");
  if (static_cast<int>(types.size()) != s.n_layers)
    fail("%s: layer_types has %zu entries for %d layers", c.source().c_str(), types.size(), s.n_layers);
  a.window_layers.assign(s.n_layers, false);
  bool any = false;
  for (int i = 0; i < s.n_layers; ++i) {
    if (types[i] == "sliding_attention") {
      a.window_layers[i] = any = true;
    } else if (types[i] != "full_attention") {
      fail("%s: layer_types[%d] is '%s' (sliding_attention or full_attention expected)", c.source().c_str(), i, types[i].c_str());
    }
  }
  if (any) {
    const int64_t w = c.get_int("sliding_window", 128);
    if (w <= 0) fail("%s: field 'sliding_window' must be a positive integer (got %lld)", c.source().c_str(), (long long)w);
    a.sliding_window = w;
  }
  s.moe.n_experts = experts_count(c);
  read_top_k(c, &s);
  s.moe.intermediate = positive(c, "intermediate_size");
  s.moe.norm_topk_prob = true;  // softmax over the k kept logits
  s.moe.gpt_oss = true;
  const double limit = c.get_double("swiglu_limit", 7.0);
  if (limit != 7.0)
    fail("%s: swiglu_limit %g is not supported (HF's float path hard-codes 7.0, as every release uses)", c.source().c_str(), limit);
  s.mixers.assign(s.n_layers, MixerKind::kAttention);
  s.ffns.assign(s.n_layers, FfnKind::kMoE);
}

// The released config.json of gpt-oss (openai/gpt-oss-20b, -120b): `layers` and `experts` differ.
J release_config(int layers, int experts) {
  std::vector<std::string> types;
  for (int i = 0; i < layers; ++i) types.push_back(i % 2 == 0 ? "sliding_attention" : "full_attention");
  return J{{"architectures", {"GptOssForCausalLM"}},
           {"model_type", "gpt_oss"},
           {"vocab_size", 201088},
           {"hidden_size", 2880},
           {"intermediate_size", 2880},
           {"num_hidden_layers", layers},
           {"num_attention_heads", 64},
           {"num_key_value_heads", 8},
           {"head_dim", 64},
           {"num_local_experts", experts},
           {"num_experts_per_tok", 4},
           {"experts_per_token", 4},
           {"layer_types", types},
           {"sliding_window", 128},
           {"attention_bias", true},
           {"attention_dropout", 0.0},
           {"max_position_embeddings", 131072},
           {"initial_context_length", 4096},
           {"rms_norm_eps", 1e-5},
           {"rope_theta", 150000},
           {"rope_scaling",
            {{"beta_fast", 32.0}, {"beta_slow", 1.0}, {"factor", 32.0}, {"original_max_position_embeddings", 4096},
             {"rope_type", "yarn"}, {"truncate", false}}},
           {"swiglu_limit", 7.0},
           {"hidden_act", "silu"},
           {"tie_word_embeddings", false},
           {"router_aux_loss_coef", 0.9},
           {"output_router_logits", false},
           {"use_cache", true},
           {"eos_token_id", 200002},
           {"pad_token_id", 199999},
           {"quantization_config",
            {{"quant_method", "mxfp4"},
             {"modules_to_not_convert",
              {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"}}}},
           {"torch_dtype", "bfloat16"}};
}

std::vector<Preset> presets() {
  return {{"gpt-oss-20b", "gpt-oss-20b: 24 attention layers (GQA 8 KV heads, sinks, alternating 128-token windows), 32 experts top-4",
           release_config(24, 32), true, "model."},
          {"gpt-oss-120b", "gpt-oss-120b: 36 attention layers (GQA 8 KV heads, sinks, alternating 128-token windows), 128 experts top-4",
           release_config(36, 128), true, "model."}};
}

std::string describe(const ModelSpec& s) {
  const int windowed = static_cast<int>(std::count(s.attn.window_layers.begin(), s.attn.window_layers.end(), true));
  return strfmt("GQA with sinks: %d KV heads x %d dims per layer; %d of %d layers with a %lld-token sliding window (their "
                "caches keep the window only); %d experts top-%d in every layer",
                s.attn.n_kv_heads, s.attn.head_dim, windowed, s.n_layers, (long long)s.attn.sliding_window, s.moe.n_experts,
                s.moe.top_k);
}

// The router stays bf16 in spool convert (HF modules_to_not_convert keeps it out of MXFP4 too).
bool keep_float(std::string_view name) { return name.ends_with("mlp.router.weight"); }

}  // namespace

const Family& gpt_oss_family() {
  static const Family f{.name = "gpt_oss",
                        .model_types = {"gpt_oss"},
                        .configure = configure,
                        .load = load_decoder,
                        .presets = presets,
                        .keep_float = keep_float,
                        .describe = describe};
  return f;
}

}  // namespace spool::models
