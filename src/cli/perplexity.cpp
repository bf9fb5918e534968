// spool perplexity: dev-set perplexity with the golden's window definition, or with
// llama-perplexity's (--llama-compat: contexts of --ctx-size tokens, second half scored).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "cli/progress.h"
#include "common/error.h"
#include "common/sysinfo.h"
#include "engine/perplexity.h"

namespace spool::cli {

namespace {

struct PerplexityOptions {
  ModelOptions model;
  std::string file;
  int64_t window = 512;
  int64_t chunks = 0;
  int64_t prefill_step = 512;
  std::string kl_reference;
  bool json = false;
  bool llama_compat = false;
  int64_t ctx_size = 512;
};

// The --kl-reference model, loaded with the model's options (no pinning, no expert-count cap:
// the reference is the exact model) for sequences of ctx tokens run in steps of `step`; nullopt
// without --kl-reference.
std::optional<Loaded> load_reference(const PerplexityOptions& o, int64_t ctx, int64_t step) {
  if (o.kl_reference.empty()) return std::nullopt;
  ModelOptions ro = o.model;
  ro.model = o.kl_reference;
  ro.pin_file.clear();
  ro.max_active_experts = 0;
  ro.predictor.clear();  // exact routing
  ro.route_by_predictor = false;
  engine::LoadOptions rlo = ro.load_options();
  rlo.ctx_size = ctx;
  rlo.prefill_step = step;
  return engine::load(rlo);
}

// The "reference" object of --json output.
nlohmann::ordered_json reference_json(const PerplexityOptions& o, const engine::PerplexityResult& r) {
  return {{"model", o.kl_reference}, {"ppl", r.ref_ppl()}, {"mean_kl", r.mean_kl()}, {"top1_agreement", r.top1_agreement()}};
}

// --llama-compat: llama-perplexity's definition and output ("[k]ppl," running values, then
// "Final estimate: PPL = x +/- y"; with --kl-reference also its "Mean KLD" and "Same top p").
void run_llama_compat(const PerplexityOptions& o) {
  if (o.ctx_size < 2) throw UsageError(strfmt("--ctx-size must be at least 2 (got %lld)", (long long)o.ctx_size));
  const std::string text = read_file(o.file);
  engine::LoadOptions lo = o.model.load_options();
  lo.ctx_size = o.ctx_size;
  lo.prefill_step = std::min(o.prefill_step, o.ctx_size);
  Loaded l = engine::load(lo);
  if (!l.tok) throw Error(strfmt("%s has no tokenizer; perplexity needs one", o.model.dir().c_str()));
  // As llama.cpp's common_tokenize(add_special = true): a BOS first when the vocabulary adds one.
  const nlohmann::json& cfg = l.tok->config();
  const bool add_bos = cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean() && cfg["add_bos_token"].get<bool>();
  std::optional<int32_t> bos;
  if (add_bos) {
    if (!l.tok->bos_id()) throw Error(strfmt("%s: the vocabulary adds a BOS token but names none", o.model.dir().c_str()));
    bos = *l.tok->bos_id();
  }
  std::vector<int32_t> ids;
  if (bos) ids.push_back(*bos);
  const std::vector<int32_t> body = l.tok->encode(text, false);
  ids.insert(ids.end(), body.begin(), body.end());
  const int64_t n_chunk = o.chunks > 0 ? std::min<int64_t>(o.chunks, static_cast<int64_t>(ids.size()) / o.ctx_size)
                                       : static_cast<int64_t>(ids.size()) / o.ctx_size;
  std::fprintf(stderr, "spool: perplexity (llama.cpp definition): %zu tokens, %lld chunks of n_ctx=%lld, scoring the last %lld of each, BOS %s\n",
               ids.size(), (long long)n_chunk, (long long)o.ctx_size, (long long)(o.ctx_size - 1 - o.ctx_size / 2),
               bos ? strfmt("%d", *bos).c_str() : "not added");
  std::optional<Loaded> ref = load_reference(o, o.ctx_size, lo.prefill_step);
  const double t0 = now_seconds();
  engine::PerplexityResult r = engine::perplexity_llama(
      *l.model, ids, o.ctx_size, o.chunks, lo.prefill_step, bos,
      [&](int64_t done, int64_t, const engine::PerplexityResult& acc) {
        if (o.json) return;
        std::printf("[%lld]%.4f,", (long long)done, acc.ppl());
        std::fflush(stdout);
      },
      ref ? ref->model.get() : nullptr);
  const double secs = now_seconds() - t0;
  if (o.json) {
    nlohmann::ordered_json j;
    j["definition"] = "llama-perplexity";
    j["ctx_size"] = o.ctx_size;
    j["chunks"] = r.window_nll.size();
    j["tokens"] = r.tokens;
    j["mean_nll"] = r.mean_nll();
    j["ppl"] = r.ppl();
    j["ppl_stderr"] = r.ppl_stderr();
    std::vector<double> running;
    double sum = 0;
    int64_t n = 0;
    for (size_t c = 0; c < r.window_nll.size(); ++c) {
      sum += r.window_nll[c];
      n += r.window_tokens[c];
      running.push_back(std::exp(sum / static_cast<double>(n)));
    }
    j["running_ppl"] = running;
    if (r.compared) j["reference"] = reference_json(o, r);
    j["timings"] = {{"load_s", l.load_s}, {"eval_s", secs}, {"tok_s", secs > 0 ? r.tokens / secs : 0.0}};
    j["peak_rss_bytes"] = peak_rss_bytes();
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", r.ppl(), r.ppl_stderr());
    if (r.compared)
      std::printf("Mean KLD: %.6f\nSame top p: %.3f %%\nReference PPL = %.4f\n", r.mean_kl(), 100.0 * r.top1_agreement(),
                  r.ref_ppl());
  }
  std::fprintf(stderr, "spool: %s; peak RSS %s\n", stats_line(l, stats_snapshot(l), r.tokens).c_str(), format_bytes(peak_rss_bytes()).c_str());
}

void run(const PerplexityOptions& o) {
  if (o.llama_compat) return run_llama_compat(o);
  if (o.window <= 0) throw UsageError(strfmt("--window must be positive (got %lld)", (long long)o.window));
  if (o.chunks < 0) throw UsageError("--chunks must be >= 0");
  if (o.prefill_step <= 0) throw UsageError("--prefill-step-size must be positive");
  const std::string text = read_file(o.file);
  // Each window is a fresh sequence of at most --window tokens, run in --prefill-step-size chunks.
  engine::LoadOptions lo = o.model.load_options();
  lo.ctx_size = o.window;
  lo.prefill_step = o.prefill_step;
  Loaded l = engine::load(lo);
  if (!l.tok) throw Error(strfmt("%s has no tokenizer.json; perplexity needs one", o.model.dir().c_str()));
  std::vector<int32_t> ids = l.tok->encode(text, false);
  std::optional<Loaded> ref = load_reference(o, o.window, o.prefill_step);
  const double t0 = now_seconds();
  engine::PerplexityResult r;
  {
    ProgressBar bar("perplexity");
    r = engine::perplexity(*l.model, ids, o.window, o.chunks, o.prefill_step,
                           [&](int64_t done, int64_t total, const engine::PerplexityResult& acc) {
                             bar.update(done, total,
                                        strfmt("%lld/%lld windows, ppl %.4f%s, %.0f tok/s", (long long)done, (long long)total,
                                               acc.ppl(), acc.compared ? strfmt(", KL %.4f", acc.mean_kl()).c_str() : "",
                                               acc.tokens / bar.elapsed()));
                           },
                           ref ? ref->model.get() : nullptr);
  }
  if (o.json) {
    nlohmann::ordered_json j;
    j["tokens"] = r.tokens;
    j["mean_nll"] = r.mean_nll();
    j["ppl"] = r.ppl();
    j["windows"] = r.window_nll.size();
    if (r.compared)
      j["reference"] = reference_json(o, r);
    const double secs = now_seconds() - t0;
    j["timings"] = {{"load_s", l.load_s}, {"eval_s", secs}, {"tok_s", secs > 0 ? r.tokens / secs : 0.0}};
    j["stats"] = stats_json(l, stats_snapshot(l), r.tokens);
    j["peak_rss_bytes"] = peak_rss_bytes();
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("tokens %lld\nmean_nll %.6f\nppl %.4f\n", (long long)r.tokens, r.mean_nll(), r.ppl());
    if (r.compared)
      std::printf("reference_ppl %.4f\nmean_kl %.6f\ntop1_agreement %.4f\n", r.ref_ppl(), r.mean_kl(), r.top1_agreement());
  }
  std::fprintf(stderr, "spool: %s; peak RSS %s\n", stats_line(l, stats_snapshot(l), r.tokens).c_str(), format_bytes(peak_rss_bytes()).c_str());
}

}  // namespace

void register_perplexity(CLI::App& app) {
  auto o = std::make_shared<PerplexityOptions>();
  CLI::App* c = app.add_subcommand("perplexity", "Perplexity of a text file (windows of --window tokens, fresh state each)");
  o->model.add_to(c);
  o->model.add_lora_to(c);
  c->add_option("-f,--file", o->file, "Text file to score")->required();
  c->add_option("--window", o->window, "Predicted tokens per window (default 512)");
  c->add_option("--chunks", o->chunks, "Score only the first N windows (default 0 = all)");
  c->add_option("--prefill-step-size", o->prefill_step, "Tokens per forward pass (default 512)");
  c->add_option("--kl-reference", o->kl_reference,
                 "Also run this model (e.g. the unquantized checkpoint) on the same tokens: mean KL(reference || model) "
                 "per token and top-1 agreement (with --llama-compat over its scored positions)");
  c->add_flag("--llama-compat", o->llama_compat,
              "llama-perplexity's definition: chunks of --ctx-size tokens, fresh state each, first token replaced by BOS "
              "when the vocabulary adds one, only the second half of each chunk scored; prints its running [k]ppl values");
  c->add_option("-c,--ctx-size", o->ctx_size, "With --llama-compat: tokens per chunk (default 512)");
  c->add_flag("--json", o->json, "Print {\"tokens\", \"mean_nll\", \"ppl\"} as JSON");
  c->callback([o] { run(*o); });
}

}  // namespace spool::cli
