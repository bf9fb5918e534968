#include "models/spec.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/log.h"
#include "models/config_read.h"
#include "models/family.h"

namespace spool::models {

namespace cfg {

// Reads the rope settings HF accepts: rope_parameters {rope_theta, partial_rotary_factor,
// rope_type} (v5) or top-level rope_theta / partial_rotary_factor / rope_scaling (v4).
io::Config rope_parameters(const io::Config& c, std::string* type) {
  io::Config rp = c.get_object("rope_parameters");
  *type = rp.get_string("rope_type", "default");
  io::Config rs = c.get_object("rope_scaling");
  if (rs.has("rope_type") || rs.has("type")) {
    *type = rs.get_string("rope_type", rs.get_string("type", "default"));
    if (!rp.has("rope_type")) return rs;
  }
  return rp;
}

void read_rope(const io::Config& c, double default_partial, AttentionSpec* a) {
  io::Config rp = c.get_object("rope_parameters");
  double theta = rp.get_double("rope_theta", c.get_double("rope_theta", 10000.0));
  double partial = rp.get_double("partial_rotary_factor", c.get_double("partial_rotary_factor", default_partial));
  std::string type;
  rope_parameters(c, &type);
  if (type != "default")
    fail("%s: rope_type '%s' is not supported for this model yet (only 'default')", c.source().c_str(), type.c_str());
  if (theta <= 0) fail("%s: rope_theta must be positive", c.source().c_str());
  if (partial <= 0 || partial > 1) fail("%s: partial_rotary_factor must be in (0, 1]", c.source().c_str());
  a->rope_theta = theta;
  a->rotary_dim = static_cast<int>(a->head_dim * partial);
  a->rotary_dim -= a->rotary_dim % 2;
}

int positive(const io::Config& c, const char* key) {
  int64_t v = c.get_int(key);
  if (v <= 0 || v > (1 << 24)) fail("%s: field '%s' must be a positive integer (got %lld)", c.source().c_str(), key, (long long)v);
  return static_cast<int>(v);
}

int experts_count(const io::Config& c) {
  if (c.has("num_experts")) return positive(c, "num_experts");
  if (c.has("num_local_experts")) return positive(c, "num_local_experts");
  fail("%s: missing field 'num_experts' (or 'num_local_experts')", c.source().c_str());
}

void read_attention(const io::Config& c, AttentionSpec* a, int hidden, bool bias_ok) {
  a->n_heads = positive(c, "num_attention_heads");
  a->n_kv_heads = c.has("num_key_value_heads") ? positive(c, "num_key_value_heads") : a->n_heads;
  if (a->n_heads % a->n_kv_heads != 0)
    fail("%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", c.source().c_str(), a->n_heads, a->n_kv_heads);
  // head_dim absent or null means hidden_size / num_attention_heads.
  a->head_dim = c.has("head_dim") ? positive(c, "head_dim") : hidden / a->n_heads;
  if (a->head_dim <= 0) fail("%s: cannot derive head_dim", c.source().c_str());
  const bool bias = c.get_bool("attention_bias", false);
  if (bias && !bias_ok) fail("%s: attention_bias=true is not supported for this model type", c.source().c_str());
  a->qkv_bias = bias;
}

namespace {

double yarn_get_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

}  // namespace

// HF _compute_yarn_parameters; DeepSeek / GLM-4.7-Flash attention softmax_scale.
double read_yarn(const io::Config& rp, double theta, int dim, double factor, double orig, bool truncate_default,
                 AttentionSpec* a) {
  const double beta_fast = rp.get_double("beta_fast", 32.0), beta_slow = rp.get_double("beta_slow", 1.0);
  const double mscale = rp.get_double("mscale", 0.0), mscale_all_dim = rp.get_double("mscale_all_dim", 0.0);
  const bool truncate = rp.get_bool("truncate", truncate_default);
  double attention_factor = rp.get_double("attention_factor", 0.0);
  if (attention_factor <= 0)
    attention_factor = (mscale != 0 && mscale_all_dim != 0) ? yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
                                                            : yarn_get_mscale(factor, 1.0);
  auto corr = [&](double rot) { return dim * std::log(orig / (rot * 2 * M_PI)) / (2 * std::log(theta)); };
  double low = corr(beta_fast), high = corr(beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  a->inv_freq.resize(dim / 2);
  for (int i = 0; i < dim / 2; ++i) {  // HF: f32 tensors throughout
    const float pos_freq = static_cast<float>(std::pow(theta, static_cast<double>(static_cast<float>(2 * i) / dim)));
    const float extra = 1.0f / pos_freq, inter = 1.0f / (static_cast<float>(factor) * pos_freq);
    const float ramp = static_cast<float>(std::clamp((i - low) / (high - low), 0.0, 1.0));
    const float extrapolation = 1.0f - ramp;
    a->inv_freq[i] = inter * (1.0f - extrapolation) + extra * extrapolation;
  }
  a->rope_attention_scaling = static_cast<float>(attention_factor);
  return mscale_all_dim;
}

void read_mla(const io::Config& c, ModelSpec* s, const char* model) {
  if (c.get_bool("attention_bias", false)) fail("%s: attention_bias=true is not supported for %s", c.source().c_str(), model);
  AttentionSpec& a = s->attn;
  MlaSpec& m = s->mla;
  a.n_heads = positive(c, "num_attention_heads");
  a.n_kv_heads = a.n_heads;  // after kv_b_proj every head has its own K and V
  m.q_lora_rank = c.has("q_lora_rank") ? positive(c, "q_lora_rank") : 0;
  m.kv_lora_rank = positive(c, "kv_lora_rank");
  m.qk_nope_head_dim = positive(c, "qk_nope_head_dim");
  m.qk_rope_head_dim = positive(c, "qk_rope_head_dim");
  m.v_head_dim = positive(c, "v_head_dim");
  if (m.qk_rope_head_dim % 2 != 0) fail("%s: qk_rope_head_dim must be even", c.source().c_str());
  m.rope_layout = c.get_bool("rope_interleave", true) ? RopeLayout::kInterleavedPairs : RopeLayout::kHalves;
}

void read_mla_rope(const io::Config& c, ModelSpec* s) {
  AttentionSpec& a = s->attn;
  std::string type;
  io::Config rp = rope_parameters(c, &type);
  const double theta = rp.get_double("rope_theta", c.get_double("rope_theta", 10000.0));
  if (theta <= 0) fail("%s: rope_theta must be positive", c.source().c_str());
  const int dim = s->mla.qk_rope_head_dim;
  a.rope_theta = theta;
  a.rotary_dim = dim;
  a.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s->mla.qk_nope_head_dim + dim)));
  if (type == "default") return;
  if (type != "yarn") fail("%s: rope_type '%s' is not supported for multi-head latent attention (default or yarn)", c.source().c_str(), type.c_str());
  const double orig = rp.get_double("original_max_position_embeddings", 0.0);
  double factor = rp.get_double("factor", 0.0);
  if (factor <= 0 && orig > 0 && s->max_position_embeddings > 0) factor = s->max_position_embeddings / orig;
  if (factor <= 0) fail("%s: yarn rope needs a positive 'factor'", c.source().c_str());
  if (orig <= 0) fail("%s: yarn rope needs 'original_max_position_embeddings'", c.source().c_str());
  const double mscale_all_dim = read_yarn(rp, theta, dim, factor, orig, /*truncate_default=*/true, &a);
  if (mscale_all_dim != 0) {
    const double m = yarn_get_mscale(factor, mscale_all_dim);
    a.softmax_scale = static_cast<float>(a.softmax_scale * m * m);
  }
}


void read_noaux_tc_moe(const io::Config& c, ModelSpec* sp, bool norm_default, bool topk_group_default_all, bool mask_neg_inf) {
  MoeSpec& mo = sp->moe;
  mo.n_experts = positive(c, "n_routed_experts");
  read_top_k(c, sp);
  mo.intermediate = positive(c, "moe_intermediate_size");
  mo.norm_topk_prob = c.get_bool("norm_topk_prob", norm_default);
  mo.shared_intermediate = non_negative(c, "n_shared_experts", 0) * mo.intermediate;
  mo.shared_name = "shared_experts";
  mo.score = RouterScore::kSigmoid;
  mo.selection = RouterSelection::kGroupedTopK;
  mo.score_bias = true;
  mo.group_top2_sum = true;
  mo.group_mask_neg_inf = mask_neg_inf;  // HF 5.17 Glm4MoeTopkRouter: masked_fill(-inf)
  mo.routed_scaling_factor = static_cast<float>(c.get_double("routed_scaling_factor", 1.0));
  mo.n_group = c.has("n_group") ? positive(c, "n_group") : 1;
  mo.topk_group = c.has("topk_group") ? positive(c, "topk_group") : topk_group_default_all ? mo.n_group : 1;  // HF Glm4MoeConfig: 1
  if (mo.n_experts % mo.n_group != 0)
    fail("%s: n_routed_experts (%d) must be a multiple of n_group (%d)", c.source().c_str(), mo.n_experts, mo.n_group);
  if (mo.topk_group > mo.n_group) fail("%s: topk_group (%d) exceeds n_group (%d)", c.source().c_str(), mo.topk_group, mo.n_group);
}

int non_negative(const io::Config& c, const char* key, int def) {
  const int64_t v = c.get_int(key, def);
  if (v < 0 || v > (1 << 24)) fail("%s: field '%s' must be a non-negative integer (got %lld)", c.source().c_str(), key, (long long)v);
  return static_cast<int>(v);
}

void read_top_k(const io::Config& c, ModelSpec* s) {
  s->moe.top_k = positive(c, "num_experts_per_tok");
  if (s->moe.top_k > s->moe.n_experts)
    fail("%s: num_experts_per_tok (%d) exceeds the number of experts (%d)", c.source().c_str(), s->moe.top_k, s->moe.n_experts);
}

// FFN kinds for Qwen2-MoE-style configs: layer i is MoE iff i not in mlp_only_layers,
// num_experts > 0 and (i + 1) % decoder_sparse_step == 0.
std::vector<FfnKind> sparse_layers(const io::Config& c, int n_layers) {
  std::vector<int64_t> only = c.get_int_list("mlp_only_layers");
  int64_t step = c.get_int("decoder_sparse_step", 1);
  std::vector<FfnKind> f;
  for (int i = 0; i < n_layers; ++i) {
    bool dense = std::find(only.begin(), only.end(), i) != only.end() || step <= 0 || (i + 1) % step != 0;
    f.push_back(dense ? FfnKind::kDense : FfnKind::kMoE);
  }
  return f;
}

void check_act(const io::Config& c) {
  std::string act = c.get_string("hidden_act", "silu");
  if (act != "silu" && act != "swish") fail("%s: hidden_act '%s' is not supported (silu only)", c.source().c_str(), act.c_str());
}

}  // namespace cfg

int ModelSpec::n_layers_of(MixerKind k) const {
  return static_cast<int>(std::count(mixers.begin(), mixers.end(), k));
}

const std::vector<std::string>& supported_model_types() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> out;
    for (const Family* f : families())
      out.insert(out.end(), f->model_types.begin(), f->model_types.end());
    return out;
  }();
  return v;
}

ModelSpec build_spec(const io::Checkpoint& ckpt) {
  ModelSpec s = build_spec(ckpt.config(), ckpt.generation(), ckpt.raw_config().get_bool("tie_word_embeddings", false),
                           ckpt.dir() + "/config.json");
  s.mtp_layers = ckpt.mtp_layers();
  return s;
}

ModelSpec mtp_spec(const ModelSpec& spec) {
  ModelSpec s = spec;
  if (spec.mtp_layers == 0) return s;
  int last = -1;
  for (int i = 0; i < spec.n_layers; ++i)
    if (spec.mixers[i] == MixerKind::kAttention || spec.mixers[i] == MixerKind::kMLA) last = i;
  if (last < 0) fail("%s: multi-token-prediction layers need an attention layer kind in the stack", spec.model_type.c_str());
  for (int k = 0; k < spec.mtp_layers; ++k) {
    s.mixers.push_back(spec.mixers[last]);
    s.ffns.push_back(FfnKind::kMoE);
    if (!s.attn_layers.empty()) s.attn_layers.push_back(spec.attn_of(last));
    if (!s.attn.window_layers.empty()) s.attn.window_layers.push_back(false);
  }
  s.n_layers = spec.n_layers + spec.mtp_layers;
  s.mtp_layers = 0;
  return s;
}

ModelSpec build_spec(const io::Config& c, const io::GenerationDefaults& generation, bool tie_default, const std::string& label) {
  ModelSpec s;
  s.model_type = c.get_string("model_type", "");
  const Family* fam = family_of_model_type(s.model_type);
  if (fam == nullptr) {
    std::string list;
    for (const auto& t : supported_model_types()) list += (list.empty() ? "" : ", ") + t;
    fail("%s: unknown or unsupported model_type '%s' (supported: %s)", label.c_str(),
         s.model_type.empty() ? "(missing)" : s.model_type.c_str(), list.c_str());
  }
  s.family = fam->name;
  s.vocab_size = cfg::positive(c, "vocab_size");
  s.hidden_size = cfg::positive(c, "hidden_size");
  s.n_layers = cfg::positive(c, "num_hidden_layers");
  s.rms_norm_eps = static_cast<float>(c.get_double("rms_norm_eps", 1e-6));
  s.tie_word_embeddings = c.get_bool("tie_word_embeddings", tie_default);
  s.max_position_embeddings = c.get_int("max_position_embeddings", 0);
  fam->configure(c, &s);
  if (static_cast<int>(s.mixers.size()) != s.n_layers || static_cast<int>(s.ffns.size()) != s.n_layers)
    fail("%s: family '%s' did not set a mixer and an FFN for every layer", label.c_str(), fam->name.c_str());
  const bool any_dense = std::count(s.ffns.begin(), s.ffns.end(), FfnKind::kDense) > 0;
  if (any_dense && s.dense_intermediate <= 0) s.dense_intermediate = cfg::positive(c, "intermediate_size");
  if (s.activation == ActivationKind::kClampedSwiGLU && (any_dense || s.parallel_dense_ffn || s.moe.shared_intermediate > 0))
    fail("%s: family '%s': the clamped SwiGLU runs in routed experts only (no dense MLP or shared expert)", label.c_str(),
         fam->name.c_str());

  // Stop ids: generation_config.json, then config.json; ids outside the vocabulary are ignored.
  std::vector<int64_t> eos = generation.eos_token_ids;
  for (int64_t e : c.get_int_list("eos_token_id")) eos.push_back(e);
  for (int64_t e : eos) {
    if (e < 0 || e >= s.vocab_size) {
      log_warn("eos_token_id %lld is outside the vocabulary (%lld tokens); ignored", (long long)e, (long long)s.vocab_size);
      continue;
    }
    if (std::find(s.eos_token_ids.begin(), s.eos_token_ids.end(), e) == s.eos_token_ids.end()) s.eos_token_ids.push_back(e);
  }

  // Parameter counts, in double: a config's dimensions are individually bounded but their
  // products are not.
  const double H = s.hidden_size;
  double total = static_cast<double>(s.vocab_size) * H * (s.tie_word_embeddings ? 1 : 2) + H, active = total;
  for (int i = 0; i < s.n_layers; ++i) {
    double mixer;
    if (s.mixers[i] == MixerKind::kMLA) {
      const auto& m = s.mla;
      const double nh = s.attn.n_heads, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
      const double q = m.q_lora_rank > 0 ? H * m.q_lora_rank + m.q_lora_rank + static_cast<double>(m.q_lora_rank) * nh * qk : H * nh * qk;
      mixer = q + H * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank +
              static_cast<double>(m.kv_lora_rank) * nh * (m.qk_nope_head_dim + m.v_head_dim) + nh * m.v_head_dim * H;
    } else if (s.mixers[i] == MixerKind::kAttention) {
      const auto& a = s.attn_of(i);
      const double q = static_cast<double>(a.n_heads) * a.head_dim, kv = static_cast<double>(a.n_kv_heads) * a.head_dim;
      mixer = H * q * (a.output_gate ? 2 : 1) + (a.k_eq_v ? 1 : 2) * H * kv + q * H +
              (a.qk_norm == QkNorm::kWholeProjection ? q + kv : a.qk_norm == QkNorm::kPerHead ? 2.0 * a.head_dim : 0.0);
      if (a.qkv_bias) mixer += q + 2 * kv;
    } else {
      const auto& g = s.gdn;
      const double cd = static_cast<double>(g.conv_dim()), vd = static_cast<double>(g.value_dim());
      mixer = H * cd + H * vd + 2 * H * g.n_v + cd * g.conv_kernel + 2.0 * g.n_v + g.d_v + vd * H;
    }
    double ffn_total, ffn_active;
    if (s.ffns[i] == FfnKind::kMoE) {
      const auto& m = s.moe;
      const double expert = 3 * H * m.intermediate, shared = 3 * H * m.shared_intermediate + (m.shared_expert_gate ? H : 0) +
                                                         (m.score_bias ? m.n_experts : 0);
      ffn_total = H * m.n_experts + expert * m.n_experts + shared;
      ffn_active = H * m.n_experts + expert * m.top_k + shared;
      if (s.parallel_dense_ffn) {  // the dense MLP beside the experts, three more norms
        ffn_total += 3 * H * s.dense_intermediate + 3 * H;
        ffn_active += 3 * H * s.dense_intermediate + 3 * H;
      }
    } else {
      ffn_total = ffn_active = 3 * H * s.dense_intermediate;
    }
    total += mixer + ffn_total + 2 * H;
    active += mixer + ffn_active + 2 * H;
  }
  if (!(total < 9e18)) fail("%s: the configured dimensions give an impossible parameter count (%g)", label.c_str(), total);
  s.mtp_declared = static_cast<int>(std::max<int64_t>(0, std::max(c.get_int("mtp_num_hidden_layers", 0), c.get_int("num_nextn_predict_layers", 0))));
  s.params_total = static_cast<int64_t>(total);
  s.params_active = static_cast<int64_t>(active);
  return s;
}

}  // namespace spool::models
