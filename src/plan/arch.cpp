#include "plan/arch.h"

#include <algorithm>

#include "common/error.h"

namespace spool::plan {

namespace {

int positive(const io::Config& c, const char* key) {
  const int64_t v = c.get_int(key);
  if (v <= 0 || v > (1 << 24)) fail("%s: field '%s' must be a positive integer (got %lld)", c.source().c_str(), key, (long long)v);
  return static_cast<int>(v);
}

int non_negative(const io::Config& c, const char* key, int def) {
  const int64_t v = c.get_int(key, def);
  if (v < 0 || v > (1 << 24)) fail("%s: field '%s' must be a non-negative integer (got %lld)", c.source().c_str(), key, (long long)v);
  return static_cast<int>(v);
}

// Fields every decoder-only config has.
void read_common(const io::Config& c, bool tie_default, models::ModelSpec* s) {
  s->vocab_size = positive(c, "vocab_size");
  s->hidden_size = positive(c, "hidden_size");
  s->n_layers = positive(c, "num_hidden_layers");
  s->rms_norm_eps = static_cast<float>(c.get_double("rms_norm_eps", 1e-6));
  s->tie_word_embeddings = c.get_bool("tie_word_embeddings", tie_default);
  s->max_position_embeddings = c.get_int("max_position_embeddings", 0);
  s->mixers.assign(s->n_layers, models::MixerKind::kAttention);
}

// Standard multi-head / grouped-query attention: K and V of num_key_value_heads x head_dim.
void read_gqa(const io::Config& c, models::ModelSpec* s) {
  auto& a = s->attn;
  a.n_heads = positive(c, "num_attention_heads");
  a.n_kv_heads = c.has("num_key_value_heads") ? positive(c, "num_key_value_heads") : a.n_heads;
  a.head_dim = c.has("head_dim") ? positive(c, "head_dim") : s->hidden_size / a.n_heads;
  if (a.head_dim <= 0) fail("%s: cannot derive head_dim", c.source().c_str());
  a.rotary_dim = a.head_dim;
}

void read_experts(const io::Config& c, const char* count_key, const char* width_key, models::ModelSpec* s) {
  s->moe.n_experts = positive(c, count_key);
  s->moe.top_k = positive(c, "num_experts_per_tok");
  s->moe.intermediate = positive(c, width_key);
  if (s->moe.top_k > s->moe.n_experts)
    fail("%s: num_experts_per_tok (%d) exceeds %s (%d)", c.source().c_str(), s->moe.top_k, count_key, s->moe.n_experts);
}

// DeepSeek-V2 / V3 (HF modeling_deepseek_v3.py): multi-head latent attention. The cache holds,
// per layer and position, the compressed KV latent (kv_lora_rank) and the decoupled RoPE key
// (qk_rope_head_dim) shared by all heads, as llama.cpp and vLLM cache it; K and V per head are
// re-expanded from the latent through kv_b_proj. Layer i is MoE when
// i >= first_k_dense_replace and i % moe_layer_freq == 0.
PlanModel deepseek(const io::Config& c, bool tie_default) {
  PlanModel m;
  models::ModelSpec& s = m.spec;
  read_common(c, tie_default, &s);
  auto& a = s.attn;
  a.n_heads = positive(c, "num_attention_heads");
  a.n_kv_heads = a.n_heads;  // after kv_b_proj every head has its own K and V
  const int nope = positive(c, "qk_nope_head_dim"), rope = positive(c, "qk_rope_head_dim");
  const int rank = positive(c, "kv_lora_rank");
  a.head_dim = nope + rope;
  a.rotary_dim = rope;
  a.kv_latent_dim = rank + rope;
  read_experts(c, "n_routed_experts", "moe_intermediate_size", &s);
  s.moe.norm_topk_prob = c.get_bool("norm_topk_prob", false);
  const int n_shared = non_negative(c, "n_shared_experts", 0);
  s.moe.shared_intermediate = n_shared * s.moe.intermediate;
  const int first_dense = non_negative(c, "first_k_dense_replace", 0);
  const int freq = c.has("moe_layer_freq") ? positive(c, "moe_layer_freq") : 1;
  for (int i = 0; i < s.n_layers; ++i)
    s.ffns.push_back(i >= first_dense && i % freq == 0 ? models::FfnKind::kMoE : models::FfnKind::kDense);
  if (std::count(s.ffns.begin(), s.ffns.end(), models::FfnKind::kDense) > 0) s.dense_intermediate = positive(c, "intermediate_size");
  const int n_moe = static_cast<int>(std::count(s.ffns.begin(), s.ffns.end(), models::FfnKind::kMoE));
  m.architecture = strfmt("MLA: %d latent + %d RoPE key elements cached per token in each of %d layers; %d MoE layers "
                          "(first %d dense, every %d) of %d routed experts top-%d + %d shared",
                          rank, rope, s.n_layers, n_moe, first_dense, freq, s.moe.n_experts, s.moe.top_k, n_shared);
  if (c.get_int("num_nextn_predict_layers", 0) > 0)
    m.notes.push_back("multi-token-prediction layers (num_nextn_predict_layers) are not counted: decoding does not use them");
  return m;
}

// Mixtral (HF modeling_mixtral.py): GQA, every layer MoE with num_local_experts experts of
// intermediate_size; sliding_window (when set) bounds the positions attention sees.
PlanModel mixtral(const io::Config& c, bool tie_default) {
  PlanModel m;
  models::ModelSpec& s = m.spec;
  read_common(c, tie_default, &s);
  read_gqa(c, &s);
  read_experts(c, "num_local_experts", "intermediate_size", &s);
  s.moe.norm_topk_prob = true;
  s.ffns.assign(s.n_layers, models::FfnKind::kMoE);
  if (c.has("sliding_window")) {
    const int64_t w = c.get_int("sliding_window");
    if (w <= 0) fail("%s: field 'sliding_window' must be a positive integer or null (got %lld)", c.source().c_str(), (long long)w);
    s.attn.sliding_window = w;
  }
  m.architecture = strfmt("GQA: %d KV heads x %d dims per layer%s; %d experts top-%d in every layer", s.attn.n_kv_heads,
                          s.attn.head_dim,
                          s.attn.sliding_window ? strfmt(", sliding window of %lld positions", (long long)s.attn.sliding_window).c_str() : "",
                          s.moe.n_experts, s.moe.top_k);
  return m;
}

// OLMoE (HF modeling_olmoe.py): MHA/GQA with q/k norms, every layer MoE with num_experts
// experts of intermediate_size.
PlanModel olmoe(const io::Config& c, bool tie_default) {
  PlanModel m;
  models::ModelSpec& s = m.spec;
  read_common(c, tie_default, &s);
  read_gqa(c, &s);
  s.attn.qk_norm = true;
  read_experts(c, "num_experts", "intermediate_size", &s);
  s.moe.norm_topk_prob = c.get_bool("norm_topk_prob", false);
  s.ffns.assign(s.n_layers, models::FfnKind::kMoE);
  m.architecture = strfmt("GQA: %d KV heads x %d dims per layer; %d experts top-%d in every layer", s.attn.n_kv_heads,
                          s.attn.head_dim, s.moe.n_experts, s.moe.top_k);
  return m;
}

}  // namespace

const std::vector<std::string>& plan_only_model_types() {
  static const std::vector<std::string> v = {"deepseek_v2", "deepseek_v3", "mixtral", "olmoe"};
  return v;
}

PlanModel plan_model(const io::Checkpoint& ck) {
  const io::Config& c = ck.config();
  const std::string mt = c.get_string("model_type", "");
  const auto& supported = models::supported_model_types();
  if (std::find(supported.begin(), supported.end(), mt) != supported.end()) {
    PlanModel m;
    m.spec = models::build_spec(ck);
    return m;
  }
  const bool tie = ck.raw_config().get_bool("tie_word_embeddings", false);
  PlanModel m;
  if (mt == "deepseek_v2" || mt == "deepseek_v3") m = deepseek(c, tie);
  else if (mt == "mixtral") m = mixtral(c, tie);
  else if (mt == "olmoe") m = olmoe(c, tie);
  else {
    std::string list;
    for (const auto& t : supported) list += (list.empty() ? "" : ", ") + t;
    std::string plan_list;
    for (const auto& t : plan_only_model_types()) plan_list += (plan_list.empty() ? "" : ", ") + t;
    fail("%s/config.json: unknown or unsupported model_type '%s' (spool runs: %s; spool plan also projects: %s)",
         ck.dir().c_str(), mt.empty() ? "(missing)" : mt.c_str(), list.c_str(), plan_list.c_str());
  }
  m.spec.model_type = mt;
  m.spec.family = mt;
  m.runnable = false;
  m.notes.push_back("prefill workspace is estimated with spool's own kernels' buffers for this geometry");
  return m;
}

}  // namespace spool::plan
