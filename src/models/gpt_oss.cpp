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
// natively: WType::kMxfp4) or from the float layout ([E, in, out], transposed on open): both
// by read_experts below (io::TensorReader). GGUF: llama.cpp arch "gpt-oss" (LLM_ARCH_OPENAI_MOE,
// converter class GptOssModel), gguf_arch() below.
// Source: HF transformers 5.17.0 models/gpt_oss (modeling_gpt_oss.py, configuration_gpt_oss.py).
#include <algorithm>
#include <cmath>
#include <cstring>
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
  // Router (HF GptOssTopKRouter): z = W x + b; top-k of z, softmax over the k = softmax, top-k,
  // renormalise. Experts (GptOssExperts): fused gate_up with interleaved rows, biases, clamped SwiGLU.
  s.moe.router_weight = "router.weight";
  s.moe.router_bias = true;
  s.moe.score = RouterScore::kSoftmax;
  s.moe.selection = RouterSelection::kTopK;
  s.moe.norm_topk_prob = true;
  s.moe.gate_up = GateUpLayout::kFusedInterleaved;
  s.moe.expert_bias = true;
  s.activation = ActivationKind::kClampedSwiGLU;
  const double limit = c.get_double("swiglu_limit", 7.0);
  if (limit != 7.0)
    fail("%s: swiglu_limit %g is not supported (HF's float path hard-codes 7.0, as every release uses)", c.source().c_str(), limit);
  s.mixers.assign(s.n_layers, MixerKind::kAttention);
  s.ffns.assign(s.n_layers, FfnKind::kMoE);
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

// ---- Checkpoint layout ---------------------------------------------------------------------
// Expert tensors (HF GptOssExperts, modeling_gpt_oss.py; MXFP4 as integrations/mxfp4.py loads it): `layers.{L}.mlp.experts.` followed by
// gate_up_proj / down_proj (float, [E, in, out]) or their _blocks / _scales (MXFP4,
// [E, out, in/32, 16] and [E, out, in/32]). Sets *gate_up, *part (kWeight, kMxBlocks,
// kMxScales) and *layer; false for any other name.
bool parse_expert(std::string_view n, int* layer, bool* gate_up, io::ExpertPart* part) {
  if (!n.starts_with("layers.")) return false;
  n.remove_prefix(7);
  const size_t dot = n.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot > 7) return false;
  int l = 0;
  for (size_t i = 0; i < dot; ++i) {
    if (n[i] < '0' || n[i] > '9') return false;
    l = l * 10 + (n[i] - '0');
  }
  n.remove_prefix(dot + 1);
  if (!n.starts_with("mlp.experts.")) return false;
  n.remove_prefix(12);
  *layer = l;
  for (const char* base : {"gate_up_proj", "down_proj"}) {
    const std::string_view b(base);
    if (!n.starts_with(b)) continue;
    const std::string_view rest = n.substr(b.size());
    *gate_up = b[0] == 'g';
    if (rest.empty()) *part = io::ExpertPart::kWeight;
    else if (rest == "_blocks") *part = io::ExpertPart::kMxBlocks;
    else if (rest == "_scales") *part = io::ExpertPart::kMxScales;
    else return false;
    return true;
  }
  return false;
}

size_t count_experts(std::string_view name, const std::vector<int64_t>& shape) {
  int layer = 0;
  bool gate_up = false;
  io::ExpertPart part = io::ExpertPart::kWeight;
  if (shape.empty() || !parse_expert(name, &layer, &gate_up, &part)) return 0;
  return static_cast<size_t>(std::max<int64_t>(shape[0], 0));  // one per expert
}

// Per expert e of a fused [E, ...] tensor:
//  * MXFP4 `*_blocks` [E, R, G, 16] / `*_scales` [E, R, G] (R = output rows, G = in/32): expert
//    e's bytes are one contiguous range of each; exposed as parts kMxBlocks [R, G, 16] and
//    kMxScales [R, G] of projection gate (gate_up, rows interleaved) or down. No copy.
//  * float `gate_up_proj` [E, H, 2I] / `down_proj` [E, I, H] ([in, out], x @ W): transposed to
//    [out, in] per expert (TensorSink::add_transposed); gate_up keeps its interleaved row order.
bool read_experts(const io::TensorRef& t, const std::string& file, const std::string& original, io::TensorSink& sink) {
  int layer = 0;
  bool gate_up = false;
  io::ExpertPart part = io::ExpertPart::kWeight;
  if (!parse_expert(t.name, &layer, &gate_up, &part)) return false;
  const size_t want = part == io::ExpertPart::kMxBlocks ? 4 : 3;
  if (t.shape.size() != want)
    fail("%s: gpt-oss expert tensor '%s' must be %zu-D, got %s", file.c_str(), original.c_str(), want, t.shape_str().c_str());
  if (part == io::ExpertPart::kMxBlocks && t.shape[3] != 16)
    fail("%s: MXFP4 blocks '%s' must have 16 bytes per block (last dimension), got %s", file.c_str(), original.c_str(),
         t.shape_str().c_str());
  const int64_t E = t.shape[0];
  if (E <= 0 || t.nbytes % static_cast<uint64_t>(E) != 0)
    fail("%s: gpt-oss expert tensor '%s' has shape %s", file.c_str(), original.c_str(), t.shape_str().c_str());
  const uint64_t per = t.nbytes / static_cast<uint64_t>(E);
  const io::ExpertProj proj = gate_up ? io::ExpertProj::kGate : io::ExpertProj::kDown;
  for (int64_t e = 0; e < E; ++e) {
    io::TensorRef x = t;
    x.shape.assign(t.shape.begin() + 1, t.shape.end());
    if (part == io::ExpertPart::kWeight) std::swap(x.shape[0], x.shape[1]);  // [in, out] -> [out, in]
    x.nbytes = per;
    x.offset = t.offset + e * per;
    x.data = t.data ? t.data + e * per : nullptr;
    x.expert_layer = layer;
    x.expert_id = static_cast<int>(e);
    x.expert_proj = proj;
    x.expert_part = part;
    x.name = io::expert_tensor_name(layer, static_cast<int>(e), proj, part);
    if (part == io::ExpertPart::kWeight)
      sink.add_transposed(std::move(x), t.data ? t.data + e * per : nullptr, t.shape[1], t.shape[2]);
    else
      sink.add(std::move(x));
  }
  sink.set_fused_experts();
  return true;
}

// ---- GGUF ----------------------------------------------------------------------------------
// post_attention_layernorm is ATTN_POST_NORM for this arch; biases on q/k/v/o; sinks written as
// attn_sinks.weight; the router (mlp.router) as ffn_gate_inp with its bias; the experts' biases
// beside their merged weights (ffn_{gate,up,down}_exps.bias, {I or H, E}). gate and up were
// split out of HF's interleaved gate_up (even rows gate, odd rows up): kInterleaveUp rebuilds it.
std::vector<io::GgufRow> gguf_rows() {
  using T = io::GgufTransform;
  using S = io::GgufShape;
  return {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"post_attention_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.bias", "self_attn.o_proj.bias"},
      {"attn_sinks.weight", "self_attn.sinks"},
      {"ffn_gate_inp.weight", "mlp.router.weight", T::kNone, S::kReversed, 0, false, /*as_float=*/true},
      {"ffn_gate_inp.bias", "mlp.router.bias"},
      {"ffn_gate_exps.bias", "mlp.experts.gate_up_proj_bias", T::kInterleaveUp, S::kReversed, 0, false, true},
      {"ffn_up_exps.bias", "mlp.experts.gate_up_proj_bias", T::kWithGate, S::kReversed, 0, false, true},
      {"ffn_down_exps.bias", "mlp.experts.down_proj_bias", T::kNone, S::kReversed, 0, false, true},
  };
}

// llama.cpp's openai-moe graph: top-k of the router logits (+ bias), softmax over the k,
// clamped SwiGLU with limit 7 (no key); sliding-window layers from
// attention.sliding_window_pattern (a per-layer bool array, or a period n: layer l slides iff
// l % n < n - 1; llama.cpp's default for this arch is 2: even layers slide). YaRN (written by
// TextModel.set_gguf_parameters: type, factor, original context and the betas): HF's
// rope_parameters with truncate false, as every release has (no key records it).
void gguf_config(const io::GgufMeta& m, nlohmann::json& j) {
  const io::GgufFile& g = m.file();
  const std::string& label = m.label();
  const std::string& p = m.prefix();
  const int64_t L = m.layers();
  if (auto st = g.get_string(p + "rope.scaling.type"); st && *st != "none") {
    if (*st != "yarn") fail("%s: rope scaling '%s' is not supported for gpt-oss (yarn)", label.c_str(), st->c_str());
    nlohmann::json& rope = j["rope_parameters"];
    rope["rope_type"] = "yarn";
    if (auto f = m.optf("rope.scaling.factor")) rope["factor"] = *f;
    if (auto o = m.opt("rope.scaling.original_context_length")) rope["original_max_position_embeddings"] = *o;
    if (auto b = m.optf("rope.scaling.yarn_beta_fast")) rope["beta_fast"] = *b;
    if (auto b = m.optf("rope.scaling.yarn_beta_slow")) rope["beta_slow"] = *b;
    rope["truncate"] = false;
  }
  m.require_all_moe("gpt-oss");
  j["num_local_experts"] = m.need("expert_count");
  j["num_experts_per_tok"] = m.need("expert_used_count");
  j["intermediate_size"] = m.expert_ff();
  j["attention_bias"] = m.has_tensor(0, "attn_q.bias");
  j["sliding_window"] = m.need("attention.sliding_window");
  std::vector<bool> swa(static_cast<size_t>(L));
  const io::GgufValue* pat = g.find_key(p + "attention.sliding_window_pattern");
  if (pat != nullptr && pat->is_array()) {
    const std::vector<int64_t> r = *m.layer_flags("attention.sliding_window_pattern");
    for (int64_t l = 0; l < L; ++l) swa[l] = r[l] != 0;
  } else {
    const int64_t n = pat != nullptr ? pat->to_int(p + "attention.sliding_window_pattern") : 2;
    if (n < 0) fail("%s: attention.sliding_window_pattern %lld is negative", label.c_str(), (long long)n);
    for (int64_t l = 0; l < L; ++l) swa[l] = n == 0 || l % n < n - 1;
  }
  nlohmann::json types = nlohmann::json::array();
  for (int64_t l = 0; l < L; ++l) types.push_back(swa[l] ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
}

}  // namespace

const Family& gpt_oss_family() {
  static const Family f{.name = "gpt_oss",
                        .model_types = {"gpt_oss"},
                        .chat_formats = {"gpt_oss"},
                        .configure = configure,
                        .load = load_decoder,
                        .keep_float = keep_float,
                        .describe = describe,
                        .tensors = {.reader = {.count = count_experts, .read = read_experts}, .native_quant_method = "mxfp4"},
                        .gguf = {{.name = "gpt-oss",
                                  .model_type = "gpt_oss",
                                  .split_gate_up = true,
                                  .reads_rope_scaling = true,
                                  .rows = gguf_rows(),
                                  .config = gguf_config}}};
  return f;
}

}  // namespace spool::models
