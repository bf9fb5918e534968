// The family registry (models/family.h): one line per family.
#include "models/family.h"

#include <algorithm>

#include "common/error.h"

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

std::string describe_gqa_moe(const ModelSpec& s) {
  std::string window;
  if (s.attn.sliding_window > 0)
    window = strfmt(", sliding window of %lld positions%s", (long long)s.attn.sliding_window,
                    s.attn.window_bounds_kv ? "" : " (attention masks; the cache keeps every position)");
  const int dense = static_cast<int>(std::count(s.ffns.begin(), s.ffns.end(), FfnKind::kDense));
  return strfmt("GQA: %d KV heads x %d dims per layer%s; %d experts top-%d%s in %d of %d layers", s.attn.n_kv_heads,
                s.attn.head_dim, window.c_str(), s.moe.n_experts, s.moe.top_k, s.moe.shared_intermediate > 0 ? " + shared" : "",
                s.n_layers - dense, s.n_layers);
}

}  // namespace spool::models
