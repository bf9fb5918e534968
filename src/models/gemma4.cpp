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
// GGUF: llama.cpp's arch "gemma4" (convert_hf_to_gguf.py Gemma4Model; src/models/gemma4.cpp there).
#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/log.h"
#include "models/bind.h"
#include "models/config_read.h"
#include "models/decoder.h"
#include "models/family.h"
#include "ops/rope.h"
#include "ops/weights.h"

namespace spool::models {

namespace {

using J = nlohmann::ordered_json;
using namespace cfg;

// ---- GGUF ----------------------------------------------------------------------------------
// llama.cpp's Gemma4Model (conversion/gemma.py) keeps the plain norm weights (norm_shift 0, unlike
// Gemma 3's 1 + w), stores the fused experts as ffn_gate_up_exps [E, 2I, H] (gate rows, then up)
// and ffn_down_exps, the router as ffn_gate_inp (+ .scale: router.scale), per_expert_scale as
// ffn_down_exps.scale and layer_scalar as layer_output_scale.weight; full layers with
// attention_k_eq_v have no attn_v. Its extra rope_freqs.weight [global_head_dim / 2] (1 for the
// rotated pairs, 1e30 for the rest) encodes the proportional RoPE's partial factor: read at load.
std::vector<io::GgufRow> gguf_rows() {
  const auto F = io::GgufTransform::kNone;
  const auto R = io::GgufShape::kReversed;
  return {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"post_attention_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
      {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
      {"pre_ffw_norm_2.weight", "pre_feedforward_layernorm_2.weight"},
      {"post_ffw_norm_1.weight", "post_feedforward_layernorm_1.weight"},
      {"post_ffw_norm_2.weight", "post_feedforward_layernorm_2.weight"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      {"layer_output_scale.weight", "layer_scalar"},
      {"ffn_gate_inp.weight", "router.proj.weight", F, R, 0, false, /*as_float=*/true},
      {"ffn_gate_inp.scale", "router.scale"},
      {"ffn_down_exps.scale", "router.per_expert_scale"},
  };
}

// The Gemma4TextConfig fields from llama.cpp's gemma4 keys: head_dim = key_length_swa,
// global_head_dim = key_length, the KV heads of each layer kind from the per-layer
// attention.head_count_kv, layer_types from attention.sliding_window_pattern (true = sliding), the
// two rope thetas (rope.freq_base is the full layers', rope.freq_base_swa the sliding ones'),
// attention_k_eq_v from the full layers' missing attn_v.
void gguf_config(const io::GgufMeta& m, nlohmann::json& j) {
  const std::string& f = m.label();
  const char* p = m.prefix().c_str();
  const int64_t L = m.layers();
  j["model_type"] = "gemma4_text";
  j.erase("hidden_act");
  j["hidden_activation"] = "gelu_pytorch_tanh";
  if (!m.dense_layers().empty() && static_cast<int64_t>(m.dense_layers().size()) != L)
    fail("%s: layer %lld has no router (blk.%lld.ffn_gate_inp.weight) but others do; Gemma 4 has a MoE in every layer or none",
         f.c_str(), (long long)m.dense_layers()[0], (long long)m.dense_layers()[0]);
  const bool moe = m.dense_layers().empty();
  j["enable_moe_block"] = moe;  // false: configure names the dense model as unsupported
  if (moe) {
    m.require_gating(1, "softmax");
    j["num_experts"] = m.need("expert_count");
    j["top_k_experts"] = m.need("expert_used_count");
    j["moe_intermediate_size"] = m.expert_ff();
  }
  j["hidden_size_per_layer_input"] = m.opt("embedding_length_per_layer_input").value_or(0);
  j["num_kv_shared_layers"] = m.opt("attention.shared_kv_layers").value_or(0);
  const std::optional<std::vector<int64_t>> swa = m.layer_flags("attention.sliding_window_pattern");
  if (!swa) fail("%s: missing per-layer metadata key '%sattention.sliding_window_pattern'", f.c_str(), p);
  nlohmann::json types = nlohmann::json::array();
  for (int64_t l = 0; l < L; ++l) types.push_back((*swa)[l] ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
  j["sliding_window"] = m.need("attention.sliding_window");
  const int64_t hd_full = m.need("attention.key_length"), hd_swa = m.need("attention.key_length_swa");
  if (auto v = m.opt("attention.value_length_swa"); v && *v != hd_swa)
    fail("%s: attention.value_length_swa %lld differs from key_length_swa %lld", f.c_str(), (long long)*v, (long long)hd_swa);
  j["head_dim"] = hd_swa;
  j["global_head_dim"] = hd_full;
  // KV heads per layer kind (a scalar: the same for both).
  std::vector<int64_t> kv;
  if (const io::GgufValue* v = m.file().find_key(m.prefix() + "attention.head_count_kv"); v != nullptr && v->is_array())
    kv = v->to_ints(m.prefix() + "attention.head_count_kv");  // length checked by gguf_config_json
  else
    kv.assign(static_cast<size_t>(L), m.need("attention.head_count_kv"));
  int64_t kv_swa = -1, kv_full = -1;
  bool full_has_v = false, full_lacks_v = false;
  for (int64_t l = 0; l < L; ++l) {
    int64_t& want = (*swa)[l] ? kv_swa : kv_full;
    if (want >= 0 && want != kv[l])
      fail("%s: attention.head_count_kv varies among the %s layers (%lld, %lld); spool needs one value per layer kind", f.c_str(),
           (*swa)[l] ? "sliding" : "full", (long long)want, (long long)kv[l]);
    want = kv[l];
    const bool has_v = m.has_tensor(l, "attn_v.weight");
    if ((*swa)[l] && !has_v)
      fail("%s: sliding layer %lld has no blk.%lld.attn_v.weight (only full layers share K as V)", f.c_str(), (long long)l, (long long)l);
    if (!(*swa)[l]) (has_v ? full_has_v : full_lacks_v) = true;
  }
  if (full_has_v && full_lacks_v) fail("%s: some full-attention layers have attn_v.weight and some do not", f.c_str());
  if (kv_swa < 0) kv_swa = kv_full;
  j["num_key_value_heads"] = kv_swa;
  j["attention_k_eq_v"] = full_lacks_v;
  if (kv_full >= 0 && kv_full != kv_swa) {
    if (!full_lacks_v)
      fail("%s: the full layers have %lld KV heads and the sliding ones %lld, with a v projection; Gemma 4 has "
           "num_global_key_value_heads only with attention_k_eq_v", f.c_str(), (long long)kv_full, (long long)kv_swa);
    j["num_global_key_value_heads"] = kv_full;
  }
  // RoPE: sliding layers rotate the whole head (default), full layers are proportional, their
  // partial factor in rope_freqs.weight (read at load: bind_rope_freqs).
  const std::optional<double> theta_swa = m.optf("rope.freq_base_swa");
  if (auto rd = m.opt("rope.dimension_count_swa"); rd && *rd != hd_swa)
    fail("%s: rope.dimension_count_swa %lld is not key_length_swa %lld: partial RoPE on the sliding layers is not supported",
         f.c_str(), (long long)*rd, (long long)hd_swa);
  if (auto rd = m.opt("rope.dimension_count"); rd && *rd != hd_full)
    fail("%s: rope.dimension_count %lld is not key_length %lld (llama.cpp's gemma4 rotates the whole head and zeroes "
         "pairs through rope_freqs)", f.c_str(), (long long)*rd, (long long)hd_full);
  j["rope_parameters"] = {
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", theta_swa.value_or(10000.0)}}},
      {"full_attention", {{"rope_type", "proportional"}, {"rope_theta", m.optf("rope.freq_base").value_or(1000000.0)}}}};
  if (auto cap = m.optf("final_logit_softcapping")) j["final_logit_softcapping"] = *cap;
}

// A GGUF's rope_freqs.weight (llama.cpp's freq_factors of the full layers: position angle
// theta^(-2i/hd) / ff_i): 1 for the first n pairs, 1e30 (no rotation) for the rest, as the
// converter writes the proportional RoPE; sets the full layers' inverse frequencies to n pairs
// (partial_rotary_factor 2n / hd). Other factors (a frequency-scaled RoPE) are an error.
void bind_rope_freqs(const io::Checkpoint& ck, ModelSpec* s) {
  if (ck.find("rope_freqs.weight") == nullptr) return;  // safetensors: rope_parameters says it
  for (int i = 0; i < s->n_layers; ++i) {
    if (s->attn.windowed(i)) continue;
    AttentionSpec& f = s->attn_layers[i];
    const std::vector<float> ff = bind_f32(ck, "rope_freqs.weight", {f.head_dim / 2});
    int n = 0;
    while (n < static_cast<int>(ff.size()) && ff[n] == 1.0f) ++n;
    for (size_t k = n; k < ff.size(); ++k)
      if (!(ff[k] >= 1e30f))
        fail("%s: rope_freqs.weight[%zu] is %g: spool reads only the converter's proportional-RoPE pattern (1 for the rotated "
             "pairs, then 1e30)", ck.dir().c_str(), k, ff[k]);
    f.inv_freq = ops::proportional_inv_freq(f.rope_theta, f.head_dim, 2.0 * n / f.head_dim);
  }
}

std::unique_ptr<Model> load(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec, std::shared_ptr<ops::Backend> backend) {
  bind_rope_freqs(*ckpt, &spec);
  return load_decoder(std::move(ckpt), std::move(spec), std::move(backend));
}

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
                        .load = load,
                        .keep_float = keep_float,
                        .describe = describe,
                        .gguf = {{.name = "gemma4",
                                  .model_type = "gemma4_text",
                                  .per_layer_kv_heads = true,
                                  .globals = {{"rope_freqs.weight", "rope_freqs.weight"}},
                                  .rows = gguf_rows(),
                                  .config = gguf_config}}};
  return f;
}

}  // namespace spool::models
