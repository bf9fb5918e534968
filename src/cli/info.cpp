// spool info: what a checkpoint is, from its config and safetensors headers.
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "common/error.h"
#include "common/sysinfo.h"
#include "models/spec.h"
#include "models/family.h"

namespace spool::cli {

namespace {

struct InfoOptions {
  ModelOptions model;
  bool json = false;
};

void run(const InfoOptions& o) {
  const std::string dir = o.model.dir();
  io::Checkpoint ck = models::open_checkpoint(dir, {.map = false});
  models::ModelSpec s = models::build_spec(ck);
  uint64_t expert = ck.expert_bytes(), total = ck.total_bytes();
  std::map<std::string, uint64_t> by_dtype;
  for (const auto& t : ck.tensors()) by_dtype[io::dtype_name(t.dtype)] += t.nbytes;
  std::string layers;
  for (int i = 0; i < s.n_layers; ++i) {
    layers += s.mixers[i] == models::MixerKind::kAttention ? "A" : s.mixers[i] == models::MixerKind::kMLA ? "M" : "L";
    if (s.ffns[i] == models::FfnKind::kDense) layers += "d";
  }
  if (o.json) {
    nlohmann::ordered_json j;
    j["model_type"] = s.model_type;
    j["family"] = s.family;
    j["layers"] = s.n_layers;
    j["layer_types"] = layers;
    j["hidden_size"] = s.hidden_size;
    j["vocab_size"] = s.vocab_size;
    j["experts"] = s.moe.n_experts;
    j["experts_per_token"] = s.moe.top_k;
    j["params_total"] = s.params_total;
    j["params_active"] = s.params_active;
    j["bytes_total"] = total;
    j["bytes_routed_experts"] = expert;
    j["bytes_dense"] = total - expert;
    j["dtypes"] = by_dtype;
    j["expert_layout"] = ck.expert_layout() == io::ExpertLayout::kFused ? "fused" : "per-expert";
    j["shards"] = ck.shards().size();
    j["mtp_layers"] = s.mtp_declared;
    j["bytes_mtp"] = ck.mtp_bytes();
    if (ck.raw_config().json().contains("quantization")) j["quantization"] = ck.raw_config().json()["quantization"];
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("model       %s\n", dir.c_str());
  std::printf("type        %s (family %s)\n", s.model_type.c_str(), s.family.c_str());
  std::printf("layers      %d: %s  (L = Gated DeltaNet, A = attention, d = dense FFN)\n", s.n_layers, layers.c_str());
  std::printf("hidden      %d, vocab %lld, context %lld\n", s.hidden_size, (long long)s.vocab_size, (long long)s.max_position_embeddings);
  std::printf("attention   %d heads, %d KV heads, head_dim %d, rotary dim %d, theta %g%s\n", s.attn.n_heads, s.attn.n_kv_heads,
              s.attn.head_dim, s.attn.rotary_dim, s.attn.rope_theta, s.attn.output_gate ? ", output gate" : "");
  if (s.n_layers_of(models::MixerKind::kGatedDeltaNet) > 0)
    std::printf("deltanet    %d key heads x %d, %d value heads x %d, conv %d\n", s.gdn.n_k, s.gdn.d_k, s.gdn.n_v, s.gdn.d_v,
                s.gdn.conv_kernel);
  std::printf("experts     %d routed, top-%d, width %d%s%s\n", s.moe.n_experts, s.moe.top_k, s.moe.intermediate,
              s.moe.shared_intermediate ? strfmt(", shared expert width %d", s.moe.shared_intermediate).c_str() : "",
              s.moe.norm_topk_prob ? ", renormalised" : "");
  std::printf("parameters  %.2fM total, %.2fM active per token\n", s.params_total / 1e6, s.params_active / 1e6);
  std::printf("bytes       %s total: routed experts %s (%.1f%%), dense %s; %s layout, %zu shard(s)\n", format_bytes(total).c_str(),
              format_bytes(expert).c_str(), total ? 100.0 * expert / total : 0.0, format_bytes(total - expert).c_str(),
              ck.expert_layout() == io::ExpertLayout::kFused ? "fused-expert" : "per-expert", ck.shards().size());
  if (s.mtp_declared > 0 || ck.mtp_bytes() > 0)
    std::printf("mtp head    %d layer(s), %s (not counted above; loaded with --spec mtp)\n", s.mtp_declared,
                format_bytes(ck.mtp_bytes()).c_str());
  std::string dts;
  for (const auto& [k, v] : by_dtype) dts += (dts.empty() ? "" : ", ") + k + " " + format_bytes(v);
  std::printf("dtypes      %s\n", dts.c_str());
  if (ck.raw_config().json().contains("quantization")) {
    const nlohmann::json& q = ck.raw_config().json()["quantization"];
    std::string classes;
    if (q.contains("classes") && q["classes"].is_object())
      for (auto it = q["classes"].begin(); it != q["classes"].end(); ++it) {
        const nlohmann::json& c = it.value();
        classes += strfmt("%s%s %s", classes.empty() ? "" : ", ", it.key().c_str(),
                          c.contains("bits") ? (c["bits"].is_string() ? c["bits"].get<std::string>() : c["bits"].dump()).c_str() : "?");
        if (c.contains("group_size")) classes += strfmt(" g%s", c["group_size"].dump().c_str());
      }
    std::printf("quantized   spool recipe %s, rotation %s: %s\n", q.value("recipe", "?").c_str(), q.value("rotation", "?").c_str(),
                classes.c_str());
  }
}

}  // namespace

void register_info(CLI::App& app) {
  auto o = std::make_shared<InfoOptions>();
  CLI::App* c = app.add_subcommand("info", "Describe a checkpoint: architecture, parameters, bytes by class");
  o->model.add_to(c, /*runs_model=*/false);
  c->add_flag("--json", o->json, "Print JSON");
  c->callback([o] { run(*o); });
}

}  // namespace spool::cli
