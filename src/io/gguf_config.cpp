#include "io/gguf_config.h"

#include "common/error.h"

namespace spool::io {

namespace {

// Typed reads of "{arch}.KEY" with errors naming the file and key.
struct Meta {
  const GgufFile& g;
  std::string p;      // "{arch}."
  std::string label;  // file path

  int64_t need(const std::string& k) const {
    std::optional<int64_t> v = g.get_int(p + k);
    if (!v) fail("%s: missing metadata key '%s%s'", label.c_str(), p.c_str(), k.c_str());
    return *v;
  }
  std::optional<int64_t> opt(const std::string& k) const { return g.get_int(p + k); }
  std::optional<double> optf(const std::string& k) const { return g.get_float(p + k); }
  std::optional<bool> optb(const std::string& k) const {
    const GgufValue* v = g.find_key(p + k);
    if (v == nullptr) return std::nullopt;
    return v->to_bool(p + k);
  }
  // A scalar or a per-layer array whose entries are all equal.
  int64_t first_int(const std::string& k) const {
    const GgufValue* v = g.find_key(p + k);
    if (v == nullptr) fail("%s: missing metadata key '%s%s'", label.c_str(), p.c_str(), k.c_str());
    if (v->is_array()) {
      std::vector<int64_t> xs = v->to_ints(p + k);
      if (xs.empty()) fail("%s: metadata key '%s%s' is an empty array", label.c_str(), p.c_str(), k.c_str());
      for (int64_t x : xs)
        if (x != xs[0]) fail("%s: '%s%s' varies per layer; spool needs one value", label.c_str(), p.c_str(), k.c_str());
      return xs[0];
    }
    return v->to_int(p + k);
  }
  bool has_tensor(int64_t layer, const char* suffix) const {
    return g.find("blk." + std::to_string(layer) + "." + suffix) != nullptr;
  }
  // Width of one routed expert: {arch}.expert_feed_forward_length, else the rows of the first
  // merged expert tensor (llama and olmoe files need not carry the key).
  int64_t expert_ff(int64_t L) const {
    if (auto v = opt("expert_feed_forward_length")) return *v;
    for (int64_t l = 0; l < L; ++l) {
      for (const char* s : {"ffn_gate_exps.weight", "ffn_up_exps.weight"})
        if (const GgufTensor* t = g.find("blk." + std::to_string(l) + "." + s)) return t->ne[1];
      if (const GgufTensor* t = g.find("blk." + std::to_string(l) + ".ffn_gate_up_exps.weight")) return t->ne[1] / 2;
    }
    fail("%s: no '%sexpert_feed_forward_length' key and no ffn_*_exps tensor to read the expert width from", label.c_str(),
         p.c_str());
  }
  // Checks {arch}.expert_gating_func (llama.cpp: 1 softmax, 2 sigmoid) when present.
  void require_gating(int64_t want, const char* what) const {
    if (auto v = opt("expert_gating_func"); v && *v != want)
      fail("%s: '%sexpert_gating_func' is %lld; spool's %s router needs %lld", label.c_str(), p.c_str(), (long long)*v, what,
           (long long)want);
  }
};

}  // namespace

nlohmann::json gguf_config_json(const GgufFile& g, const GgufArch& a) {
  const Meta m{g, std::string(a.name) + ".", g.path()};
  const std::string& label = m.label;
  const std::string& p = m.p;
  nlohmann::json j;
  j["model_type"] = a.model_type;
  j["hidden_act"] = "silu";
  const int64_t H = m.need("embedding_length");
  j["hidden_size"] = H;
  const int64_t blocks = m.need("block_count");
  const int64_t nextn = m.opt("nextn_predict_layers").value_or(0);
  if (nextn < 0 || nextn >= blocks) fail("%s: nextn_predict_layers %lld out of range", label.c_str(), (long long)nextn);
  const int64_t L = blocks - nextn;
  j["num_hidden_layers"] = L;
  if (auto ff = m.opt("feed_forward_length")) j["intermediate_size"] = *ff;
  const int64_t heads = m.first_int("attention.head_count");
  j["num_attention_heads"] = heads;
  j["num_key_value_heads"] = m.first_int("attention.head_count_kv");
  const bool mla = a.family == GgufFamily::kDeepseek2;  // key/value_length describe the latent (below)
  const int64_t hd = mla ? 0 : m.opt("attention.key_length").value_or(heads > 0 ? H / heads : 0);
  if (auto vl = m.opt("attention.value_length"); !mla && vl && *vl != hd)
    fail("%s: attention.value_length %lld differs from key_length %lld (not a %s layout)", label.c_str(), (long long)*vl,
         (long long)hd, a.name);
  if (!mla) j["head_dim"] = hd;
  j["rms_norm_eps"] = m.optf("attention.layer_norm_rms_epsilon").value_or(1e-6);
  if (auto ctx = m.opt("context_length")) j["max_position_embeddings"] = *ctx;
  nlohmann::json rope;
  rope["rope_theta"] = m.optf("rope.freq_base").value_or(10000.0);
  rope["rope_type"] = "default";
  const double partial_default = a.hybrid ? 0.25 : a.family == GgufFamily::kGlm4Moe ? 0.5 : 1.0;
  if (auto rd = m.opt("rope.dimension_count"); rd && hd > 0) rope["partial_rotary_factor"] = static_cast<double>(*rd) / hd;
  else rope["partial_rotary_factor"] = partial_default;
  const bool gpt_oss = a.family == GgufFamily::kGptOss;
  if (auto st = g.get_string(p + "rope.scaling.type"); st && *st != "none" && gpt_oss) {
    // gpt-oss YaRN (TextModel.set_gguf_parameters writes type, factor, original context and the
    // betas): HF's rope_parameters with truncate false, as every release has (no key records it).
    if (*st != "yarn") fail("%s: rope scaling '%s' is not supported for gpt-oss (yarn)", label.c_str(), st->c_str());
    rope["rope_type"] = "yarn";
    if (auto f = m.optf("rope.scaling.factor")) rope["factor"] = *f;
    if (auto o = m.opt("rope.scaling.original_context_length")) rope["original_max_position_embeddings"] = *o;
    if (auto b = m.optf("rope.scaling.yarn_beta_fast")) rope["beta_fast"] = *b;
    if (auto b = m.optf("rope.scaling.yarn_beta_slow")) rope["beta_slow"] = *b;
    rope["truncate"] = false;
  } else if (auto st = g.get_string(p + "rope.scaling.type"); st && *st != "none") {
    if (!mla || *st != "yarn") fail("%s: rope scaling '%s' is not supported yet", label.c_str(), st->c_str());
    // DeepSeek YaRN (HF rope_parameters): llama.cpp's converter writes yarn_log_multiplier =
    // 0.1 * mscale_all_dim; the released configs have mscale == mscale_all_dim, which no key records.
    rope["rope_type"] = "yarn";
    rope["factor"] = m.optf("rope.scaling.factor").value_or(0.0);
    if (auto o = m.opt("rope.scaling.original_context_length")) rope["original_max_position_embeddings"] = *o;
    if (auto lm = m.optf("rope.scaling.yarn_log_multiplier"); lm && *lm != 0.0) rope["mscale"] = rope["mscale_all_dim"] = *lm / 0.1;
    if (auto b = m.optf("rope.scaling.yarn_beta_fast")) rope["beta_fast"] = *b;
    if (auto b = m.optf("rope.scaling.yarn_beta_slow")) rope["beta_slow"] = *b;
  }
  j["rope_parameters"] = rope;
  j["tie_word_embeddings"] = g.find("output.weight") == nullptr;

  // Layers without a router are dense.
  std::vector<int64_t> dense;
  for (int64_t l = 0; l < L; ++l)
    if (!m.has_tensor(l, "ffn_gate_inp.weight")) dense.push_back(l);
  auto all_moe = [&](const char* family) {
    if (!dense.empty())
      fail("%s: layer %lld has no router (blk.%lld.ffn_gate_inp.weight); %s has a MoE in every layer", label.c_str(),
           (long long)dense[0], (long long)dense[0], family);
  };

  // DeepSeek-style MoE (glm4moe, deepseek2): routed and shared experts, the first
  // leading_dense_block_count layers dense (checked against the routers present), the
  // routed-weight scale and renormalisation (llama.cpp's defaults when absent: 1, false).
  auto deepseek_style_moe = [&]() {
    j["n_routed_experts"] = m.need("expert_count");
    j["num_experts_per_tok"] = m.need("expert_used_count");
    j["moe_intermediate_size"] = m.expert_ff(L);
    j["n_shared_experts"] = m.opt("expert_shared_count").value_or(0);
    const int64_t first_dense = m.opt("leading_dense_block_count").value_or(0);
    for (int64_t l = 0; l < L; ++l)
      if ((l < first_dense) == m.has_tensor(l, "ffn_gate_inp.weight"))
        fail("%s: layer %lld %s a router but leading_dense_block_count is %lld", label.c_str(), (long long)l,
             l < first_dense ? "has" : "lacks", (long long)first_dense);
    j["first_k_dense_replace"] = first_dense;
    const double scale = m.optf("expert_weights_scale").value_or(1.0);
    j["routed_scaling_factor"] = scale == 0.0 ? 1.0 : scale;
    j["norm_topk_prob"] = m.optb("expert_weights_norm").value_or(false);
  };

  switch (a.family) {
    case GgufFamily::kQwen3Moe:
    case GgufFamily::kQwen3Next:
    case GgufFamily::kQwen35Moe: {
      j["num_experts"] = m.need("expert_count");
      j["num_experts_per_tok"] = m.need("expert_used_count");
      j["moe_intermediate_size"] = m.need("expert_feed_forward_length");
      j["norm_topk_prob"] = true;  // llama.cpp's qwen3moe / qwen3next / qwen35moe graphs renormalise the top-k weights
      j["mlp_only_layers"] = dense;
      j["decoder_sparse_step"] = 1;
      break;
    }
    case GgufFamily::kOlmoe: {
      all_moe("OLMoE");
      j["num_experts"] = m.need("expert_count");
      j["num_experts_per_tok"] = m.need("expert_used_count");
      j["intermediate_size"] = m.expert_ff(L);
      j["norm_topk_prob"] = false;  // llama.cpp's olmoe graph keeps the softmax weights of the top k (as the release)
      break;
    }
    case GgufFamily::kMixtral: {
      if (!m.opt("expert_count") || m.opt("expert_count").value_or(0) == 0 || dense.size() == static_cast<size_t>(L))
        fail("%s: a 'llama' GGUF without routed experts (a dense Llama) is not supported; spool loads llama files with "
             "ffn_*_exps (Mixtral)", label.c_str());
      all_moe("Mixtral");
      j["num_local_experts"] = m.need("expert_count");
      j["num_experts_per_tok"] = m.need("expert_used_count");
      j["intermediate_size"] = m.expert_ff(L);
      break;
    }
    case GgufFamily::kGlm4Moe: {
      m.require_gating(2, "GLM-4.5 (sigmoid)");
      deepseek_style_moe();
      j["n_group"] = m.opt("expert_group_count").value_or(1);
      j["topk_group"] = m.opt("expert_group_used_count").value_or(1);
      j["attention_bias"] = m.has_tensor(0, "attn_q.bias");
      j["use_qk_norm"] = m.has_tensor(0, "attn_q_norm.weight");
      j["num_nextn_predict_layers"] = nextn;
      break;
    }
    case GgufFamily::kDeepseek2: {
      // MLA: key_length_mla / value_length_mla (files with attn_k_b / attn_v_b) or, in older
      // files, key_length / value_length are the per-head q.k and v sizes; the kv heads written
      // as 1 are the latent's, HF counts one K and V per head.
      const int64_t rope_dim = m.need("rope.dimension_count");
      const int64_t kl = m.opt("attention.key_length_mla") ? m.need("attention.key_length_mla") : m.need("attention.key_length");
      const int64_t vl = m.opt("attention.value_length_mla") ? m.need("attention.value_length_mla") : m.need("attention.value_length");
      if (kl <= rope_dim) fail("%s: q.k head size %lld is not above the rope dims %lld", label.c_str(), (long long)kl, (long long)rope_dim);
      j["num_key_value_heads"] = heads;
      j["kv_lora_rank"] = m.need("attention.kv_lora_rank");
      if (auto q = m.opt("attention.q_lora_rank"); q && *q > 0) j["q_lora_rank"] = *q;
      j["qk_rope_head_dim"] = rope_dim;
      j["qk_nope_head_dim"] = kl - rope_dim;
      j["v_head_dim"] = vl;
      j["rope_interleave"] = true;  // ggml's adjacent-pair RoPE on the unpermuted weights
      j["rope_parameters"].erase("partial_rotary_factor");
      const int64_t gating = m.opt("expert_gating_func").value_or(1);  // absent (older V2 files): softmax
      if (gating != 1 && gating != 2)
        fail("%s: '%sexpert_gating_func' %lld is neither softmax (1) nor sigmoid (2)", label.c_str(), p.c_str(), (long long)gating);
      const bool v3 = gating == 2;
      j["model_type"] = v3 ? "deepseek_v3" : "deepseek_v2";
      deepseek_style_moe();
      const int64_t groups = m.opt("expert_group_count").value_or(1);
      j["n_group"] = groups;
      j["topk_group"] = m.opt("expert_group_used_count").value_or(groups);
      j["topk_method"] = v3 ? "noaux_tc" : groups > 1 ? "group_limited_greedy" : "greedy";
      if (v3) j["num_nextn_predict_layers"] = nextn;
      break;
    }
    case GgufFamily::kGptOss: {
      // llama.cpp's openai-moe graph: top-k of the router logits (+ bias), softmax over the k,
      // clamped SwiGLU with limit 7 (no key); sliding-window layers from
      // attention.sliding_window_pattern (a per-layer bool array, or a period n: layer l slides
      // iff l % n < n - 1; llama.cpp's default for this arch is 2: even layers slide).
      all_moe("gpt-oss");
      j["num_local_experts"] = m.need("expert_count");
      j["num_experts_per_tok"] = m.need("expert_used_count");
      j["intermediate_size"] = m.expert_ff(L);
      j["attention_bias"] = m.has_tensor(0, "attn_q.bias");
      j["sliding_window"] = m.need("attention.sliding_window");
      std::vector<bool> swa(static_cast<size_t>(L));
      const GgufValue* pat = g.find_key(p + "attention.sliding_window_pattern");
      if (pat != nullptr && pat->is_array()) {
        std::vector<int64_t> r;
        if (pat->elem == GgufType::kBool) {
          for (uint8_t b : pat->raw) r.push_back(b);
        } else {
          r = pat->to_ints(p + "attention.sliding_window_pattern");
        }
        if (static_cast<int64_t>(r.size()) < L)
          fail("%s: attention.sliding_window_pattern has %zu entries for %lld layers", label.c_str(), r.size(), (long long)L);
        for (int64_t l = 0; l < L; ++l) swa[l] = r[l] != 0;
      } else {
        const int64_t n = pat != nullptr ? pat->to_int(p + "attention.sliding_window_pattern") : 2;
        if (n < 0) fail("%s: attention.sliding_window_pattern %lld is negative", label.c_str(), (long long)n);
        for (int64_t l = 0; l < L; ++l) swa[l] = n == 0 || l % n < n - 1;
      }
      nlohmann::json types = nlohmann::json::array();
      for (int64_t l = 0; l < L; ++l) types.push_back(swa[l] ? "sliding_attention" : "full_attention");
      j["layer_types"] = types;
      break;
    }
    case GgufFamily::kMinimaxM2: {
      m.require_gating(2, "MiniMax-M2 (sigmoid)");
      all_moe("MiniMax-M2");
      j["num_local_experts"] = m.need("expert_count");
      j["num_experts_per_tok"] = m.need("expert_used_count");
      j["intermediate_size"] = m.expert_ff(L);
      break;
    }
  }

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
