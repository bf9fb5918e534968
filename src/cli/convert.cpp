// spool convert: quantize a Hugging Face checkpoint into spool's format (docs/quant-format.md).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "cli/common.h"
#include "cli/progress.h"
#include "common/error.h"
#include "common/sysinfo.h"
#include "models/family.h"
#include "models/spec.h"
#include "quant/convert.h"

namespace spool::cli {

namespace {

struct ConvertCmd {
  ModelOptions model;
  std::string out, recipe = "tq3a-tqTe-down4", rotation = "hadamard", scale_search = "mse", codebook = "fit";
  quant::RecipeOverrides ov;
  uint64_t seed = 42;
  double shard_gb = 4.0;
  double target_bpw = 0;
  std::string sensitivity, calibration;
  int64_t calibration_tokens = 16384;
  bool force = false, json = false;
};

/// "dense=1,gate_up=2.5,..." over the defaults; throws spool::UsageError naming a bad entry.
quant::AllocWeights parse_sensitivity(const std::string& v) {
  quant::AllocWeights w = quant::AllocWeights::defaults();
  size_t at = 0;
  while (at <= v.size()) {
    const size_t end = std::min(v.find(',', at), v.size());
    const std::string item = v.substr(at, end - at);
    const size_t eq = item.find('=');
    double* dst = nullptr;
    const std::string key = item.substr(0, eq);
    if (key == "dense") dst = &w.dense;
    else if (key == "gate_up") dst = &w.gate_up;
    else if (key == "down") dst = &w.down;
    else if (key == "lm_head") dst = &w.lm_head;
    else if (key == "embed") dst = &w.embed;
    else if (key == "total") dst = &w.total_loss;
    char* e = nullptr;
    const double x = eq == std::string::npos ? -1 : std::strtod(item.c_str() + eq + 1, &e);
    if (dst == nullptr || eq == std::string::npos || e == item.c_str() + eq + 1 || *e != 0 || !(x >= 0) || !std::isfinite(x))
      throw UsageError(strfmt("--sensitivity: bad entry '%s' (want CLASS=VALUE, CLASS one of dense, gate_up, down, lm_head, "
                              "embed, total, VALUE >= 0)", item.c_str()));
    *dst = x;
    at = end + 1;
  }
  return w;
}

/// Prior share mixed into every expert's measured share (--calibration): an expert the text never
/// routed to still counts as a tenth of an average one, so a text that misses a topic does not
/// send its experts to the smallest format.
constexpr double kCalibrationPrior = 0.1;

/// --calibration: routes the first `max_tokens` tokens of `file` through the source model in
/// windows of 512 and returns, per MoE layer, each expert's share of the layer's mean squared
/// gate weight (the layer's output error from expert e scales with g_e^2), mixed with the uniform
/// share (kCalibrationPrior). Throws spool::Error when the model has no tokenizer or the text
/// gives fewer than 2 tokens.
std::map<int, std::vector<double>> expert_shares_from_text(const ConvertCmd& o, int n_experts, int64_t* tokens_used) {
  engine::LoadOptions lo = o.model.load_options();
  lo.ctx_size = 512;
  lo.prefill_step = 512;
  Loaded l = engine::load(lo);
  if (!l.tok) throw Error(strfmt("%s has no tokenizer.json; --calibration needs one", o.model.dir().c_str()));
  std::vector<int32_t> ids = l.tok->encode(read_file(o.calibration), false);
  if (static_cast<int64_t>(ids.size()) > o.calibration_tokens) ids.resize(static_cast<size_t>(o.calibration_tokens));
  if (ids.size() < 2) throw Error(strfmt("--calibration %s: fewer than 2 tokens", o.calibration.c_str()));
  std::map<int, std::vector<double>> g2;
  l.model->hooks.on_route = [&](int layer, int64_t, std::span<const int> e, std::span<const float> w) {
    std::vector<double>& v = g2[layer];
    if (v.empty()) v.assign(static_cast<size_t>(n_experts), 0.0);
    for (size_t i = 0; i < e.size(); ++i)
      if (e[i] >= 0 && e[i] < n_experts) v[static_cast<size_t>(e[i])] += static_cast<double>(w[i]) * w[i];
  };
  models::State st = l.model->new_state();
  for (size_t s = 0; s < ids.size(); s += 512) {
    st.reset();
    const size_t n = std::min<size_t>(512, ids.size() - s);
    l.model->forward(std::span<const int32_t>(ids.data() + s, n), st, models::LogitsMode::kNone, nullptr);
  }
  l.model->hooks.on_route = nullptr;
  for (auto& [layer, v] : g2) {
    double sum = 0;
    for (double x : v) sum += x;
    for (double& x : v) x = (1.0 - kCalibrationPrior) * (sum > 0 ? x / sum : 1.0 / n_experts) + kCalibrationPrior / n_experts;
  }
  *tokens_used = static_cast<int64_t>(ids.size());
  return g2;
}

void run(ConvertCmd& o) {
  quant::ConvertOptions c;
  c.in_dir = o.model.dir();
  c.out_dir = o.out;
  if (o.target_bpw != 0) {
    c.recipe = quant::Recipe{};
    c.recipe.name = strfmt("target-bpw %g", o.target_bpw);
    c.target_bpw = o.target_bpw;
    if (!(o.target_bpw > 0 && o.target_bpw <= 16.5))
      throw UsageError(strfmt("--target-bpw must be in (0, 16.5] bits per weight (got %g)", o.target_bpw));
    if (!o.sensitivity.empty()) c.alloc_weights = parse_sensitivity(o.sensitivity);
  } else {
    if (!o.sensitivity.empty()) throw UsageError("--sensitivity needs --target-bpw");
    c.recipe = quant::recipe(o.recipe);
    quant::apply_overrides(&c.recipe, o.ov);
  }
  // Only what spool can run is worth converting: unknown architectures fail here, in seconds.
  const models::ModelSpec spec = models::build_spec(models::open_checkpoint(c.in_dir, {.map = false}));
  const models::Family* family = models::family_named(spec.family);
  if (family == nullptr) throw Error(strfmt("%s: unknown model family '%s'", c.in_dir.c_str(), spec.family.c_str()));
  c.keep_float = family->keep_float;
  if (spec.moe.n_experts > 0) c.expert_usage = static_cast<double>(spec.moe.top_k) / spec.moe.n_experts;
  c.rules = &models::checkpoint_rules();
  if (o.rotation != "hadamard" && o.rotation != "none")
    throw UsageError(strfmt("--rotation must be hadamard or none (got '%s')", o.rotation.c_str()));
  c.rotate = o.rotation == "hadamard";
  c.rotation_seed = o.seed;
  c.quant.scale_search = quant::parse_scale_search(o.scale_search);
  c.quant.codebook = quant::parse_codebook_source(o.codebook);
  c.threads = o.model.thread_count();
  std::map<int, std::vector<double>> shares;
  if (!o.calibration.empty()) {
    if (c.target_bpw <= 0) throw UsageError("--calibration needs --target-bpw");
    if (o.calibration_tokens < 2) throw UsageError("--calibration-tokens must be at least 2");
    if (spec.moe.n_experts > 0) {
      int64_t used = 0;
      const double t0 = now_seconds();
      shares = expert_shares_from_text(o, spec.moe.n_experts, &used);
      std::fprintf(stderr, "convert: routed %lld tokens of %s through %zu MoE layers in %.1f s\n", (long long)used,
                   o.calibration.c_str(), shares.size(), now_seconds() - t0);
      c.expert_shares = &shares;
      c.calibration_note = strfmt("%s, %lld tokens (expert shares)", std::filesystem::path(o.calibration).filename().c_str(), (long long)used);
    }
  }
  if (!(o.shard_gb > 0)) throw UsageError("--shard-size-gb must be positive");
  c.shard_bytes = static_cast<uint64_t>(o.shard_gb * (1ull << 30));
  c.force = o.force;
  if (c.target_bpw > 0)
    std::fprintf(stderr, "convert: %s -> %s, %.3f bits per weight allocated per matrix (sensitivities dense %g, gate_up %g, down %g, "
                 "lm_head %g, embed %g; experts read %.3g)\n", c.in_dir.c_str(), c.out_dir.c_str(), c.target_bpw, c.alloc_weights.dense,
                 c.alloc_weights.gate_up, c.alloc_weights.down, c.alloc_weights.lm_head, c.alloc_weights.embed, c.expert_usage);
  else std::fprintf(stderr, "convert: %s -> %s, recipe %s: dense %s, lm_head %s, expert gate/up %s, expert down %s, embed_tokens %s, rotation %s, scales %s, codebooks %s\n",
               c.in_dir.c_str(), c.out_dir.c_str(), c.recipe.name.c_str(), c.recipe.dense.describe().c_str(),
               c.recipe.lm_head.describe().c_str(), c.recipe.expert_gate_up.describe().c_str(),
               c.recipe.expert_down.describe().c_str(), c.recipe.embed.describe().c_str(), o.rotation.c_str(),
               c.quant.scale_search == quant::ScaleSearch::kMse ? "searched (min squared error)" : "RMS",
               c.quant.codebook == quant::CodebookSource::kFit ? "fitted per matrix" : "N(0, 1) tables");
  const double t0 = now_seconds();
  quant::ConvertResult r;
  {
    ProgressBar bar("convert");
    r = quant::convert(c, [&](uint64_t done, uint64_t total) {
      bar.update(done, total, strfmt("%s / %s, %.0f MB/s", format_bytes(done).c_str(), format_bytes(total).c_str(),
                                     done / std::max(bar.elapsed(), 1e-9) / 1e6));
    });
  }
  const double secs = now_seconds() - t0;
  if (o.json) {
    nlohmann::ordered_json j = {{"out", c.out_dir}, {"recipe", c.recipe.name}, {"params", r.params},
                                {"data_bytes", r.data_bytes}, {"file_bytes", r.file_bytes}, {"source_bytes", r.source_bytes},
                                {"padding_bytes", 0}, {"bits_per_weight", r.bpw()}, {"shards", r.shards},
                                {"tensors", r.tensors}, {"seconds", secs}, {"peak_rss_bytes", peak_rss_bytes()}};
    for (const auto& [k, cs] : r.classes)
      j["classes"][k] = {{"tensors", cs.tensors}, {"params", cs.params}, {"bytes", cs.bytes}, {"bits_per_weight", cs.bpw()},
                         {"group_sizes", cs.groups}};
    if (!r.allocation.slots.empty()) {
      j["allocation"] = {{"target_bpw", c.target_bpw}, {"estimated_loss", r.allocation.estimated_loss}};
      for (const quant::AllocSlot& s : r.allocation.slots) {
        nlohmann::ordered_json cands = nlohmann::ordered_json::object();
        for (size_t i = 0; i < s.candidates.size(); ++i)
          cands[s.candidates[i].describe()] = {{"rel_err", s.rel_err[i]}, {"bytes", s.bytes[i]}};
        j["allocation"]["slots"][s.key] = {{"format", s.candidates[s.chosen].describe()}, {"rel_err", s.rel_err[s.chosen]},
                                           {"bytes", s.bytes[s.chosen]}, {"weight", s.weight}, {"candidates", cands}};
      }
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("wrote %s: %s -> %s (%.2fx smaller), %.3f bits per weight, %d shard(s), %lld tensors, no padding, %.1f s\n",
              c.out_dir.c_str(), format_bytes(r.source_bytes).c_str(), format_bytes(r.file_bytes).c_str(),
              static_cast<double>(r.source_bytes) / static_cast<double>(std::max<uint64_t>(r.file_bytes, 1)), r.bpw(), r.shards,
              (long long)r.tensors, secs);
  for (const auto& [k, cs] : r.classes) {
    std::string groups;
    for (int g : cs.groups) groups += strfmt("%sg%d", groups.empty() ? "" : ",", g);
    std::printf("  %-15s %6lld tensors %12lld weights %10s %6.3f bits/weight %s\n", k.c_str(), (long long)cs.tensors,
                (long long)cs.params, format_bytes(cs.bytes).c_str(), cs.bpw(), groups.c_str());
  }
  if (!r.allocation.slots.empty()) {
    // Formats chosen per class: "q4 g64 x12, q6 g64 x2".
    std::map<std::string, std::map<std::string, int>> by_class;
    for (const quant::AllocSlot& s : r.allocation.slots) {
      by_class[quant::class_name(s.cls)][s.candidates[s.chosen].describe()] += 1;
    }
    std::printf("  allocation (estimated loss %.4g):\n", r.allocation.estimated_loss);
    for (const auto& [cls, m] : by_class) {
      std::string l;
      for (const auto& [f, n] : m) l += strfmt("%s%s x%d", l.empty() ? "" : ", ", f.c_str(), n);
      std::printf("    %-15s %s\n", cls.c_str(), l.c_str());
    }
  }
}

}  // namespace

void register_convert(CLI::App& app) {
  auto o = std::make_shared<ConvertCmd>();
  CLI::App* c = app.add_subcommand("convert", "Quantize a checkpoint data-free (Hadamard rotation, searched scales, Lloyd-Max codebooks)");
  o->model.add_to(c, /*runs_model=*/false);
  c->add_option("-t,--threads", o->model.threads, "Threads (default: all cores)");
  c->add_option("-o,--out", o->out, "Output directory (new or empty)")->required();
  std::string names;
  for (const auto& n : quant::recipe_names()) names += (names.empty() ? "" : ", ") + n;
  c->add_option("--recipe", o->recipe, "Recipe: " + names + " (default tq3a-tqTe-down4)");
  c->add_option("--bits", o->ov.bits, "Bits for every quantized class (2, 3, 4, 5, 6 or 8)");
  c->add_option("--group-size", o->ov.group_size, "Group size for every quantized class (32, 64 or 128; narrower matrices use their width)");
  c->add_option("--attn-bits", o->ov.attn_bits, "Bits for dense projections (attention, DeltaNet, shared experts): 2|3|4|5|6|8|ternary");
  c->add_option("--expert-bits", o->ov.expert_bits, "Bits for routed experts (gate/up, and down unless --expert-down-bits): 2|3|4|5|6|8|ternary");
  c->add_option("--expert-down-bits", o->ov.expert_down_bits, "Bits for routed experts' down_proj: 2|3|4|5|6|8|ternary");
  c->add_option("--lm-head-bits", o->ov.lm_head_bits, "Bits for lm_head: 2|3|4|5|6|8|ternary");
  c->add_option("--embed-bits", o->ov.embed_bits,
                "Bits for the token embedding table (embed_tokens; with tied embeddings also the output projection): "
                "2|3|4|5|6|8|ternary|bf16 (default bf16; group size as dense)");
  c->add_option("--calibration", o->calibration,
                "With --target-bpw: a text whose routing (the first --calibration-tokens tokens through the source model) "
                "splits each MoE layer's bits over its experts by how much the text uses them");
  c->add_option("--calibration-tokens", o->calibration_tokens, "Tokens of --calibration to route (default 16384)");
  CLI::Option* tb = c->add_option("--target-bpw", o->target_bpw,
                                   "Bits per weight to fit (everything written counted): every matrix gets the format (bf16 .. "
                                   "ternary, group 32-128) of least estimated loss within the size (docs/quantization.md); "
                                   "replaces --recipe and the per-class bits");
  c->add_option("--sensitivity", o->sensitivity,
                "With --target-bpw: per-weight sensitivity of each class and the total, CLASS=VALUE,... (dense, "
                "gate_up, down, lm_head, embed, total; default: the fitted constants, docs/quantization.md)");
  for (const char* n : {"--recipe", "--bits", "--group-size", "--attn-bits", "--expert-bits", "--expert-down-bits", "--lm-head-bits",
                        "--embed-bits"})
    tb->excludes(c->get_option(n));
  c->add_option("--rotation", o->rotation, "Input rotation: hadamard (default) or none");
  c->add_option("--rotation-seed", o->seed, "Seed of the rotation sign vectors (default 42)");
  c->add_option("--scale-search", o->scale_search,
                "Group scales: mse (default; the fp16 scale of least squared error, never worse than RMS) or none "
                "(the RMS of the group)");
  c->add_option("--codebook", o->codebook,
                "Codebooks: fit (default; Lloyd-Max fitted to each matrix's rotated, scale-normalized weights) or gaussian "
                "(the fixed N(0, 1) tables). --scale-search none --codebook gaussian writes the files of earlier versions "
                "bit for bit");
  c->add_option("--shard-size-gb", o->shard_gb, "Shard size in GB (default 4; shards hold whole layers)");
  c->add_flag("--force", o->force, "Write into a non-empty directory (replaces its shards)");
  c->add_flag("--json", o->json, "Print the summary as JSON");
  c->callback([o] { run(*o); });
}

}  // namespace spool::cli
