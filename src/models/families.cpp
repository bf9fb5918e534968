// The family registry (models/family.h): one line per family.
#include "models/family.h"

#include <algorithm>

#include "common/error.h"
#include "models/decoder.h"

namespace spool::models {

const std::vector<const Family*>& families() {
  static const std::vector<const Family*> v = {
      &qwen3_5_moe_family(),
      &qwen3_next_family(),
      &qwen3_moe_family(),
      &mixtral_family(),
      &olmoe_family(),
      &deepseek_v2_family(),
      &deepseek_v3_family(),
      &glm4_moe_family(),
      &glm4_moe_lite_family(),
      &minimax_m2_family(),
      &gpt_oss_family(),
      &ernie4_5_moe_family(),
      &gemma4_text_moe_family(),
  };
  return v;
}

const Family* family_of_model_type(std::string_view model_type) {
  for (const Family* f : families())
    if (std::find(f->model_types.begin(), f->model_types.end(), model_type) != f->model_types.end()) return f;
  return nullptr;
}

const Family* family_named(std::string_view name) {
  for (const Family* f : families())
    if (f->name == name) return f;
  return nullptr;
}

const io::GgufArch* gguf_arch_named(std::string_view arch, const Family** family) {
  for (const Family* f : families())
    for (const io::GgufArch& a : f->gguf)
      if (a.name == arch) {
        if (family != nullptr) *family = f;
        return &a;
      }
  return nullptr;
}

const io::RulesResolver& checkpoint_rules() {
  static const io::RulesResolver r{
      .by_model_type = [](std::string_view model_type) -> const io::TensorNameRules* {
        const Family* f = family_of_model_type(model_type);
        return f != nullptr ? &f->tensors : nullptr;
      },
      .by_gguf_arch = [](std::string_view arch) { return gguf_arch_named(arch); },
      .gguf_arch_list =
          [] {
            std::vector<std::string> names;
            for (const Family* f : families())
              for (const io::GgufArch& a : f->gguf) names.push_back(a.name);
            std::sort(names.begin(), names.end());
            std::string s;
            for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
            return s;
          },
  };
  return r;
}

io::Checkpoint open_checkpoint(const std::string& path, io::Checkpoint::Options opt) {
  return io::Checkpoint::open(path, checkpoint_rules(), opt);
}

io::Checkpoint open_checkpoint(const std::string& path) { return io::Checkpoint::open(path, checkpoint_rules()); }

std::string describe_gqa_moe(const ModelSpec& s) {
  std::string window;
  if (s.attn.sliding_window > 0)
    window = strfmt(", sliding window of %lld positions%s", (long long)s.attn.sliding_window,
                    s.attn.window_bounds_kv ? " (the cache keeps the window only)" : " (attention masks; the cache keeps every position)");
  const int dense = static_cast<int>(std::count(s.ffns.begin(), s.ffns.end(), FfnKind::kDense));
  return strfmt("GQA: %d KV heads x %d dims per layer%s; %d experts top-%d%s in %d of %d layers", s.attn.n_kv_heads,
                s.attn.head_dim, window.c_str(), s.moe.n_experts, s.moe.top_k, s.moe.shared_intermediate > 0 ? " + shared" : "",
                s.n_layers - dense, s.n_layers);
}

std::string describe_mla_moe(const ModelSpec& s) {
  const int n_moe = static_cast<int>(std::count(s.ffns.begin(), s.ffns.end(), FfnKind::kMoE));
  return strfmt("MLA: %d latent + %d RoPE key elements cached per token in each of %d layers; %d MoE layers "
                "(%d dense) of %d routed experts top-%d + %d shared",
                s.mla.kv_lora_rank, s.mla.qk_rope_head_dim, s.n_layers, n_moe, s.n_layers - n_moe, s.moe.n_experts, s.moe.top_k,
                s.moe.intermediate > 0 ? s.moe.shared_intermediate / s.moe.intermediate : 0);
}

std::unique_ptr<Model> load_decoder(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec,
                                    std::shared_ptr<ops::Backend> backend) {
  auto m = std::make_unique<DecoderModel>(std::move(ckpt), std::move(spec), std::move(backend));
  m->bind(GdnLayout::kSplit);  // no GDN layers
  return m;
}

std::vector<std::string> mtp_plan_notes(const io::Config& c) {
  std::vector<std::string> n;
  if (c.get_int("num_nextn_predict_layers", 0) > 0)
    n.push_back("multi-token-prediction layers (num_nextn_predict_layers) are counted only with --spec mtp (speculative decoding uses them)");
  return n;
}

bool mla_keep_float(std::string_view name) { return name.ends_with("self_attn.kv_b_proj.weight"); }

}  // namespace spool::models
