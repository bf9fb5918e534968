// Gemma 4 text with the MoE block (model_type gemma4_text with enable_moe_block, or the
// multimodal gemma4 with text_config and tensors under model.language_model.: Gemma-4-26B-A4B),
// HF transformers 5.17 models/gemma4/modeling_gemma4.py. Source: docs architectures-2 §7.
//  * h = embed(ids) * sqrt(H) (in the checkpoint's dtype); the tied head reads the unscaled table.
//  * Gemma-4 RMSNorm x̂ * w (plain w, not Gemma 1-3's 1 + w), sandwich norms.
//  * attention: sliding_attention layers (head_dim, num_key_value_heads, window sliding_window,
//    default RoPE θ 1e4 over the whole head); full_attention layers with their own geometry
//    (per_layer_config / global_head_dim 512, num_global_key_value_heads), proportional RoPE
//    (θ 1e6, partial 0.25: pairs (j, j + 256) for j < 64), and with attention_k_eq_v no v_proj
//    (V = the K projection). Per-head q/k norms with weight, weightless v norm, scale 1.
//  * FFN on every layer: a dense tanh-GELU MLP in parallel with the MoE block (router on the
//    raw residual: RMSNorm_noweight * router.scale * H^-1/2, softmax, top-k, renormalise,
//    * per_expert_scale; tanh-GELU experts fused [E, 2I, H] / [E, H, I] under layers.{i}.experts).
//  * h *= layer_scalar after each layer; logits soft-capped by final_logit_softcapping.
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "models/config_read.h"
#include "models/family.h"
#include "ops/rope.h"
#include "ops/weights.h"

namespace spool::models {

namespace {

using J = nlohmann::ordered_json;
using namespace cfg;

// One layer type's rope_parameters entry ({"rope_type", "rope_theta", ...}), or an empty
// object when absent.
io::Config rope_of(const io::Config& c, const char* type) {
  if (!c.has("rope_parameters")) return io::Config(nlohmann::json::object(), c.source());
  const io::Config rp = c.get_object("rope_parameters");
  if (!rp.has(type)) return io::Config(nlohmann::json::object(), c.source());
  return rp.get_object(type);
}

void configure(const io::Config& c, ModelSpec* sp) {
  ModelSpec& s = *sp;
  const std::string src = c.source();
  if (!c.get_bool("enable_moe_block", false))
    fail("%s: enable_moe_block is false: dense Gemma 4 models are not supported (only the MoE ones)", src.c_str());
  if (c.get_int("hidden_size_per_layer_input", 0) > 0)
    fail("%s: hidden_size_per_layer_input > 0 (per-layer embeddings) is not supported", src.c_str());
  if (c.get_int("num_kv_shared_layers", 0) > 0) fail("%s: num_kv_shared_layers > 0 (KV sharing) is not supported", src.c_str());
  if (c.get_bool("use_double_wide_mlp", false)) fail("%s: use_double_wide_mlp is not supported", src.c_str());
  if (c.has("use_bidirectional_attention"))
    fail("%s: use_bidirectional_attention is not supported (causal text decoding only)", src.c_str());
  const std::string act = c.get_string("hidden_activation", "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh") fail("%s: hidden_activation '%s' is not supported (gelu_pytorch_tanh)", src.c_str(), act.c_str());
  s.activation = ActivationKind::kGeluTanh;
  if (!c.has("tie_word_embeddings")) s.tie_word_embeddings = true;  // HF Gemma4TextConfig default

  AttentionSpec& a = s.attn;
  a.n_heads = positive(c, "num_attention_heads");
  a.n_kv_heads = c.has("num_key_value_heads") ? positive(c, "num_key_value_heads") : a.n_heads;
  a.head_dim = c.has("head_dim") ? positive(c, "head_dim") : 256;
  if (a.n_heads % a.n_kv_heads != 0)
    fail("%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", src.c_str(), a.n_heads, a.n_kv_heads);
  if (a.head_dim % 2 != 0) fail("%s: head_dim must be even (got %d)", src.c_str(), a.head_dim);
  if (c.get_bool("attention_bias", false)) fail("%s: attention_bias=true is not supported for gemma4", src.c_str());
  a.qk_norm = QkNorm::kPerHead;
  a.value_norm = true;
  a.softmax_scale = 1.0f;  // q/k norms replace 1/sqrt(d)

  // Layer kinds: every 6th full by default; the last one is forced full, given list or not
  // (configuration_gemma4.py __post_init__, with a warning).
  std::vector<std::string> types = c.get_string_list("layer_types");
  if (types.empty())
    for (int i = 0; i < s.n_layers; ++i) types.push_back((i + 1) % 6 == 0 ? "full_attention" : "sliding_attention");
  if (static_cast<int>(types.size()) != s.n_layers)
    fail("%s: layer_types has %zu entries for %d layers", src.c_str(), types.size(), s.n_layers);
  if (types.back() != "full_attention") {
    log_warn("%s: the last layer's type is '%s'; Gemma 4 runs it as full_attention (as transformers does)", src.c_str(),
             types.back().c_str());
    types.back() = "full_attention";
  }
  a.window_layers.assign(s.n_layers, false);
  for (int i = 0; i < s.n_layers; ++i) {
    if (types[i] == "sliding_attention") {
      a.window_layers[i] = true;
    } else if (types[i] != "full_attention") {
      fail("%s: layer_types[%d] is '%s' (sliding_attention or full_attention expected)", src.c_str(), i, types[i].c_str());
    }
  }
  const int64_t w = c.get_int("sliding_window", 512);
  if (w <= 0) fail("%s: field 'sliding_window' must be a positive integer (got %lld)", src.c_str(), (long long)w);
  a.sliding_window = w;

  // RoPE per layer type.
  const io::Config rs = rope_of(c, "sliding_attention"), rf = rope_of(c, "full_attention");
  const std::string ts = rs.get_string("rope_type", "default"), tf = rf.get_string("rope_type", "proportional");
  if (ts != "default") fail("%s: rope_parameters.sliding_attention.rope_type '%s' is not supported (default)", src.c_str(), ts.c_str());
  if (tf != "proportional" && tf != "default")
    fail("%s: rope_parameters.full_attention.rope_type '%s' is not supported (proportional or default)", src.c_str(), tf.c_str());
  const double theta_s = rs.get_double("rope_theta", 10000.0), theta_f = rf.get_double("rope_theta", 1000000.0);
  if (theta_s <= 0 || theta_f <= 0) fail("%s: rope_theta must be positive", src.c_str());
  const double partial = rf.get_double("partial_rotary_factor", tf == "proportional" ? 0.25 : 1.0);
  const double factor = rf.get_double("factor", 1.0);
  if (partial <= 0 || partial > 1) fail("%s: full_attention partial_rotary_factor must be in (0, 1]", src.c_str());
  if (factor <= 0) fail("%s: full_attention rope factor must be positive", src.c_str());
  a.rope_theta = theta_s;
  a.rotary_dim = a.head_dim;

  // Full layers' geometry: per_layer_config (configs saved by transformers 5.17), else
  // global_head_dim / num_global_key_value_heads (the latter only with attention_k_eq_v).
  const bool k_eq_v = c.get_bool("attention_k_eq_v", false);
  const int global_hd = c.has("global_head_dim") ? positive(c, "global_head_dim") : 512;
  const int global_kv = k_eq_v && c.has("num_global_key_value_heads")
                            ? positive(c, "num_global_key_value_heads")
                            : a.n_kv_heads;
  const bool plc = c.has("per_layer_config");
  s.attn_layers.assign(s.n_layers, a);
  for (int i = 0; i < s.n_layers; ++i) {
    if (a.window_layers[i]) continue;  // sliding: the base geometry
    AttentionSpec& f = s.attn_layers[i];
    f.head_dim = global_hd;
    f.n_kv_heads = global_kv;
    if (plc) {
      f.head_dim = a.head_dim;
      f.n_kv_heads = a.n_kv_heads;
      const io::Config p = c.get_object("per_layer_config");
      if (p.has(std::to_string(i))) {
        const io::Config li = p.get_object(std::to_string(i));
        if (li.has("head_dim")) f.head_dim = positive(li, "head_dim");
        if (li.has("num_key_value_heads")) f.n_kv_heads = positive(li, "num_key_value_heads");
      }
    }
    if (f.head_dim % 2 != 0) fail("%s: layer %d: head_dim must be even (got %d)", src.c_str(), i, f.head_dim);
    if (a.n_heads % f.n_kv_heads != 0)
      fail("%s: layer %d: num_attention_heads (%d) must be a multiple of its KV heads (%d)", src.c_str(), i, a.n_heads, f.n_kv_heads);
    f.k_eq_v = k_eq_v;
    f.rotary_dim = f.head_dim;
    f.rope_theta = theta_f;
    f.inv_freq = tf == "proportional" ? ops::proportional_inv_freq(theta_f, f.head_dim, partial, factor) : std::vector<float>{};
  }

  // FFN: dense MLP + MoE on every layer.
  s.moe.n_experts = positive(c, "num_experts");
  s.moe.top_k = positive(c, "top_k_experts");
  if (s.moe.top_k > s.moe.n_experts)
    fail("%s: top_k_experts (%d) exceeds num_experts (%d)", src.c_str(), s.moe.top_k, s.moe.n_experts);
  s.moe.intermediate = positive(c, "moe_intermediate_size");
  s.moe.norm_topk_prob = true;
  s.moe.block_prefix = "";
  s.moe.router_weight = "router.proj.weight";
  s.moe.router_input_scale = true;
  s.moe.per_expert_scale = true;
  s.dense_intermediate = positive(c, "intermediate_size");
  s.sandwich_norms = true;
  s.parallel_dense_ffn = true;
  s.residual_scale = true;
  // sqrt(H) in the activation dtype (HF Gemma4TextScaledWordEmbedding: bf16 53.066 -> 53.0).
  const std::string dt = c.get_string("dtype", c.get_string("torch_dtype", "float32"));
  const float root = std::sqrt(static_cast<float>(s.hidden_size));
  s.embedding_scale = dt == "bfloat16" ? ops::bf16_to_f32(ops::f32_to_bf16(root)) : root;
  if (c.has("final_logit_softcapping")) {
    const double cap = c.get_double("final_logit_softcapping", 0.0);
    if (cap < 0) fail("%s: final_logit_softcapping must be positive or null", src.c_str());
    s.final_logit_softcap = static_cast<float>(cap);
  }
  s.mixers.assign(s.n_layers, MixerKind::kAttention);
  s.ffns.assign(s.n_layers, FfnKind::kMoE);
}

std::string describe(const ModelSpec& s) {
  const int windowed = static_cast<int>(std::count(s.attn.window_layers.begin(), s.attn.window_layers.end(), true));
  int full_kv = s.attn.n_kv_heads, full_hd = s.attn.head_dim;
  bool k_eq_v = false;
  for (int i = 0; i < s.n_layers; ++i)
    if (!s.attn.windowed(i)) {
      full_kv = s.attn_of(i).n_kv_heads;
      full_hd = s.attn_of(i).head_dim;
      k_eq_v = s.attn_of(i).k_eq_v;
    }
  return strfmt("GQA in two layer kinds: %d sliding-window layers (%lld tokens, their caches keep the window only) with %d KV "
                "heads x %d dims, %d full layers with %d KV heads x %d dims%s; K and V cached in each; a dense MLP plus %d "
                "experts top-%d in every layer",
                windowed, (long long)s.attn.sliding_window, s.attn.n_kv_heads, s.attn.head_dim, s.n_layers - windowed, full_kv,
                full_hd, k_eq_v ? " (V = normed K projection, no v_proj)" : "", s.moe.n_experts, s.moe.top_k);
}

// The router's weight stays bf16 in spool convert (the other families' routers do too).
bool keep_float(std::string_view name) { return name.ends_with("router.proj.weight"); }

}  // namespace

const Family& gemma4_text_moe_family() {
  static const Family f{.name = "gemma4_text_moe",
                        .model_types = {"gemma4_text", "gemma4"},
                        .chat_formats = {"gemma4"},
                        .configure = configure,
                        .load = load_decoder,
                        .keep_float = keep_float,
                        .describe = describe};
  return f;
}

}  // namespace spool::models
