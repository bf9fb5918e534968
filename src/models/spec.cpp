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

void read_attention(const io::Config& c, AttentionSpec* a, int hidden) {
  a->n_heads = positive(c, "num_attention_heads");
  a->n_kv_heads = c.has("num_key_value_heads") ? positive(c, "num_key_value_heads") : a->n_heads;
  if (a->n_heads % a->n_kv_heads != 0)
    fail("%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", c.source().c_str(), a->n_heads, a->n_kv_heads);
  // head_dim absent or null means hidden_size / num_attention_heads.
  a->head_dim = c.has("head_dim") ? positive(c, "head_dim") : hidden / a->n_heads;
  if (a->head_dim <= 0) fail("%s: cannot derive head_dim", c.source().c_str());
  if (c.get_bool("attention_bias", false)) fail("%s: attention_bias=true is not supported", c.source().c_str());
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
      if (f->load != nullptr) out.insert(out.end(), f->model_types.begin(), f->model_types.end());
    return out;
  }();
  return v;
}

ModelSpec build_spec(const io::Checkpoint& ckpt) {
  return build_spec(ckpt.config(), ckpt.generation(), ckpt.raw_config().get_bool("tie_word_embeddings", false),
                    ckpt.dir() + "/config.json");
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
  if (std::count(s.ffns.begin(), s.ffns.end(), FfnKind::kDense) > 0 && s.dense_intermediate <= 0)
    s.dense_intermediate = cfg::positive(c, "intermediate_size");

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
      const auto& a = s.attn;
      const double q = static_cast<double>(a.n_heads) * a.head_dim, kv = static_cast<double>(a.n_kv_heads) * a.head_dim;
      mixer = H * q * (a.output_gate ? 2 : 1) + 2 * H * kv + q * H + (a.qk_norm_full ? q + kv : a.qk_norm ? 2.0 * a.head_dim : 0.0);
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
    } else {
      ffn_total = ffn_active = 3 * H * s.dense_intermediate;
    }
    total += mixer + ffn_total + 2 * H;
    active += mixer + ffn_active + 2 * H;
  }
  if (!(total < 9e18)) fail("%s: the configured dimensions give an impossible parameter count (%g)", label.c_str(), total);
  s.params_total = static_cast<int64_t>(total);
  s.params_active = static_cast<int64_t>(active);
  return s;
}

}  // namespace spool::models
