#include "io/gguf_config.h"

#include "common/error.h"

namespace spool::io {

GgufMeta::GgufMeta(const GgufFile& g, const GgufArch& arch, int64_t layers, int64_t nextn)
    : g_(g), arch_(arch), p_(arch.name + "."), label_(g.path()), layers_(layers), nextn_(nextn) {
  for (int64_t l = 0; l < layers_; ++l)
    if (!has_tensor(l, "ffn_gate_inp.weight")) dense_.push_back(l);
}

int64_t GgufMeta::need(const std::string& k) const {
  std::optional<int64_t> v = g_.get_int(p_ + k);
  if (!v) fail("%s: missing metadata key '%s%s'", label_.c_str(), p_.c_str(), k.c_str());
  return *v;
}

std::optional<int64_t> GgufMeta::opt(const std::string& k) const { return g_.get_int(p_ + k); }

std::optional<double> GgufMeta::optf(const std::string& k) const { return g_.get_float(p_ + k); }

std::optional<bool> GgufMeta::optb(const std::string& k) const {
  const GgufValue* v = g_.find_key(p_ + k);
  if (v == nullptr) return std::nullopt;
  return v->to_bool(p_ + k);
}

int64_t GgufMeta::first_int(const std::string& k) const {
  const GgufValue* v = g_.find_key(p_ + k);
  if (v == nullptr) fail("%s: missing metadata key '%s%s'", label_.c_str(), p_.c_str(), k.c_str());
  if (v->is_array()) {
    std::vector<int64_t> xs = v->to_ints(p_ + k);
    if (xs.empty()) fail("%s: metadata key '%s%s' is an empty array", label_.c_str(), p_.c_str(), k.c_str());
    for (int64_t x : xs)
      if (x != xs[0]) fail("%s: '%s%s' varies per layer; spool needs one value", label_.c_str(), p_.c_str(), k.c_str());
    return xs[0];
  }
  return v->to_int(p_ + k);
}

bool GgufMeta::has_tensor(int64_t layer, const char* suffix) const {
  return g_.find("blk." + std::to_string(layer) + "." + suffix) != nullptr;
}

int64_t GgufMeta::expert_ff() const {
  if (auto v = opt("expert_feed_forward_length")) return *v;
  for (int64_t l = 0; l < layers_; ++l) {
    for (const char* s : {"ffn_gate_exps.weight", "ffn_up_exps.weight"})
      if (const GgufTensor* t = g_.find("blk." + std::to_string(l) + "." + s)) return t->ne[1];
    if (const GgufTensor* t = g_.find("blk." + std::to_string(l) + ".ffn_gate_up_exps.weight")) return t->ne[1] / 2;
  }
  fail("%s: no '%sexpert_feed_forward_length' key and no ffn_*_exps tensor to read the expert width from", label_.c_str(),
       p_.c_str());
}

void GgufMeta::require_gating(int64_t want, const char* what) const {
  if (auto v = opt("expert_gating_func"); v && *v != want)
    fail("%s: '%sexpert_gating_func' is %lld; spool's %s router needs %lld", label_.c_str(), p_.c_str(), (long long)*v, what,
         (long long)want);
}

void GgufMeta::require_all_moe(const char* family) const {
  if (!dense_.empty())
    fail("%s: layer %lld has no router (blk.%lld.ffn_gate_inp.weight); %s has a MoE in every layer", label_.c_str(),
         (long long)dense_[0], (long long)dense_[0], family);
}

std::optional<std::vector<int64_t>> GgufMeta::layer_flags(const std::string& k) const {
  const GgufValue* v = g_.find_key(p_ + k);
  if (v == nullptr || !v->is_array()) return std::nullopt;
  std::vector<int64_t> r;
  if (v->elem == GgufType::kBool) {
    for (uint8_t b : v->raw) r.push_back(b);
  } else {
    r = v->to_ints(p_ + k);
  }
  if (static_cast<int64_t>(r.size()) < layers_)
    fail("%s: %s has %zu entries for %lld layers", label_.c_str(), k.c_str(), r.size(), (long long)layers_);
  return r;
}

void GgufMeta::deepseek_style_moe(nlohmann::json& j) const {
  j["n_routed_experts"] = need("expert_count");
  j["num_experts_per_tok"] = need("expert_used_count");
  j["moe_intermediate_size"] = expert_ff();
  j["n_shared_experts"] = opt("expert_shared_count").value_or(0);
  const int64_t first_dense = opt("leading_dense_block_count").value_or(0);
  for (int64_t l = 0; l < layers_; ++l)
    if ((l < first_dense) == has_tensor(l, "ffn_gate_inp.weight"))
      fail("%s: layer %lld %s a router but leading_dense_block_count is %lld", label_.c_str(), (long long)l,
           l < first_dense ? "has" : "lacks", (long long)first_dense);
  j["first_k_dense_replace"] = first_dense;
  const double scale = optf("expert_weights_scale").value_or(1.0);
  j["routed_scaling_factor"] = scale == 0.0 ? 1.0 : scale;
  j["norm_topk_prob"] = optb("expert_weights_norm").value_or(false);
}

void GgufMeta::qwen_style_moe(nlohmann::json& j) const {
  j["num_experts"] = need("expert_count");
  j["num_experts_per_tok"] = need("expert_used_count");
  j["moe_intermediate_size"] = need("expert_feed_forward_length");
  j["norm_topk_prob"] = true;
  j["mlp_only_layers"] = dense_;
  j["decoder_sparse_step"] = 1;
}

nlohmann::json gguf_config_json(const GgufFile& g, const GgufArch& a) {
  const std::string label = g.path();
  const std::string p = a.name + ".";
  const auto need = [&](const char* k) {
    std::optional<int64_t> v = g.get_int(p + k);
    if (!v) fail("%s: missing metadata key '%s%s'", label.c_str(), p.c_str(), k);
    return *v;
  };
  nlohmann::json j;
  j["model_type"] = a.model_type;
  j["hidden_act"] = "silu";
  const int64_t H = need("embedding_length");
  j["hidden_size"] = H;
  const int64_t blocks = need("block_count");
  const int64_t nextn = g.get_int(p + "nextn_predict_layers").value_or(0);
  if (nextn < 0 || nextn >= blocks) fail("%s: nextn_predict_layers %lld out of range", label.c_str(), (long long)nextn);
  const int64_t L = blocks - nextn;
  const GgufMeta m(g, a, L, nextn);
  j["num_hidden_layers"] = L;
  if (auto ff = m.opt("feed_forward_length")) j["intermediate_size"] = *ff;
  const int64_t heads = m.first_int("attention.head_count");
  j["num_attention_heads"] = heads;
  if (const GgufValue* kv = g.find_key(p + "attention.head_count_kv"); a.per_layer_kv_heads && kv != nullptr && kv->is_array()) {
    const std::vector<int64_t> xs = kv->to_ints(p + "attention.head_count_kv");
    if (static_cast<int64_t>(xs.size()) < L)
      fail("%s: attention.head_count_kv has %zu entries for %lld layers", label.c_str(), xs.size(), (long long)L);
    j["num_key_value_heads"] = xs[0];  // the config hook writes the per-layer-kind values
  } else {
    j["num_key_value_heads"] = m.first_int("attention.head_count_kv");
  }
  const bool mla = a.mla;  // key/value_length describe the latent (the config hook reads them)
  const int64_t hd = mla ? 0 : m.opt("attention.key_length").value_or(heads > 0 ? H / heads : 0);
  if (auto vl = m.opt("attention.value_length"); !mla && vl && *vl != hd)
    fail("%s: attention.value_length %lld differs from key_length %lld (not a %s layout)", label.c_str(), (long long)*vl,
         (long long)hd, a.name.c_str());
  if (!mla) j["head_dim"] = hd;
  j["rms_norm_eps"] = m.optf("attention.layer_norm_rms_epsilon").value_or(1e-6);
  if (auto ctx = m.opt("context_length")) j["max_position_embeddings"] = *ctx;
  nlohmann::json rope;
  rope["rope_theta"] = m.optf("rope.freq_base").value_or(10000.0);
  rope["rope_type"] = "default";
  if (auto rd = m.opt("rope.dimension_count"); rd && hd > 0) rope["partial_rotary_factor"] = static_cast<double>(*rd) / hd;
  else rope["partial_rotary_factor"] = a.partial_rotary_default;
  if (auto st = g.get_string(p + "rope.scaling.type"); st && *st != "none" && !a.reads_rope_scaling)
    fail("%s: rope scaling '%s' is not supported yet", label.c_str(), st->c_str());
  j["rope_parameters"] = rope;
  j["tie_word_embeddings"] = g.find("output.weight") == nullptr;

  if (a.config == nullptr) fail("%s: GGUF architecture '%s' has no config reader", label.c_str(), a.name.c_str());
  a.config(m, j);

  if (a.hybrid) {
    if (auto sh = m.opt("expert_shared_feed_forward_length")) j["shared_expert_intermediate_size"] = *sh;
    j["linear_conv_kernel_dim"] = m.need("ssm.conv_kernel");
    j["linear_key_head_dim"] = m.need("ssm.state_size");
    const int64_t nk = m.need("ssm.group_count"), nv = m.need("ssm.time_step_rank"), inner = m.need("ssm.inner_size");
    j["linear_num_key_heads"] = nk;
    j["linear_num_value_heads"] = nv;
    if (nv <= 0 || inner % nv != 0)
      fail("%s: ssm.inner_size %lld is not a multiple of ssm.time_step_rank %lld", label.c_str(), (long long)inner, (long long)nv);
    j["linear_value_head_dim"] = inner / nv;
    nlohmann::json types = nlohmann::json::array();
    if (const GgufValue* rl = g.find_key(p + "attention.recurrent_layers")) {
      std::vector<int64_t> r;
      if (rl->is_array() && rl->elem == GgufType::kBool) {
        for (uint8_t b : rl->raw) r.push_back(b);
      } else {
        r = rl->to_ints(p + "attention.recurrent_layers");
      }
      if (static_cast<int64_t>(r.size()) < L)
        fail("%s: attention.recurrent_layers has %zu entries for %lld layers", label.c_str(), r.size(), (long long)L);
      for (int64_t l = 0; l < L; ++l) types.push_back(r[l] ? "linear_attention" : "full_attention");
    } else {
      const int64_t interval = m.opt("full_attention_interval").value_or(4);
      if (interval <= 0) fail("%s: full_attention_interval must be positive", label.c_str());
      for (int64_t l = 0; l < L; ++l) types.push_back((l + 1) % interval == 0 ? "full_attention" : "linear_attention");
    }
    j["layer_types"] = types;
  }
  const GgufTensor* emb = g.find("token_embd.weight");
  if (emb == nullptr) fail("%s: missing tensor 'token_embd.weight'", label.c_str());
  j["vocab_size"] = emb->ne[1];
  if (auto eos = g.get_int("tokenizer.ggml.eos_token_id")) j["eos_token_id"] = *eos;
  if (auto bos = g.get_int("tokenizer.ggml.bos_token_id")) j["bos_token_id"] = *bos;
  return j;
}

}  // namespace spool::io
