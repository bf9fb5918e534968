// Dev-corpus perplexity of the demo model against transformers' per-window NLL sums, and the
// quantization recipes against their reference (parameters, few-window quality in CI, whole
// corpus perplexity in the slow test).
#include "engine/perplexity.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/golden.h"
#include "support/load.h"
#include "common/error.h"
#include "engine/session.h"
#include "quant/codebook.h"
#include "quant/convert.h"
#include "quant/recipe.h"
#include "tokenizer/tokenizer.h"
#include "models/family.h"

namespace spool::engine {
namespace {

struct Fixture {
  std::shared_ptr<io::Checkpoint> ckpt;
  std::unique_ptr<ops::ThreadPool> pool;
  std::unique_ptr<models::Model> model;
  std::vector<int32_t> ids;
  nlohmann::json golden;
};

Fixture load() {
  Fixture f;
  f.ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(SPOOL_DEFAULT_MODEL_DIR));
  f.pool = std::make_unique<ops::ThreadPool>(2);
  f.model = models::load_model(f.ckpt, f.pool.get());
  auto tok = tokenizer::Tokenizer::load(SPOOL_DEFAULT_MODEL_DIR);
  std::ifstream in(spool::testing::data_dir() + "/corpus/dev.txt", std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  f.ids = tok.encode(ss.str(), false);
  std::ifstream gj(spool::testing::data_dir() + "/models/spool-demo-moe/perplexity_windows_dev.json");
  f.golden = nlohmann::json::parse(gj);
  return f;
}

// Minimum top-k boundary margin (router probability) of each token's routing in one forward.
// Below kNearTie, f32 rounding differences between two correct implementations can pick a
// different expert than transformers did (measured: margins of 7e-9..6e-8 at the windows that
// differ by more than 1e-5).
constexpr float kNearTie = 1e-6f;

// Scores window w of the golden's definition (ids[512w : 512w + 513]) alone; *min_margin gets
// the smallest routing margin seen in it.
PerplexityResult score_window(models::Model& m, const std::vector<int32_t>& ids, int64_t w, float* min_margin,
                              models::Model* reference = nullptr) {
  const size_t begin = static_cast<size_t>(512 * w), n = std::min<size_t>(513, ids.size() - begin);
  float mm = 1.0f;
  m.hooks.on_margin = [&](int, int64_t, float v) { mm = std::min(mm, v); };
  PerplexityResult r = perplexity(m, std::span<const int32_t>(ids).subspan(begin, n), 512, 1, 512, nullptr, reference);
  m.hooks.on_margin = nullptr;
  if (min_margin) *min_margin = mm;
  return r;
}

// `count` window indices spread evenly over [0, total): first and last included.
std::vector<int64_t> spread(int64_t total, int64_t count) {
  std::vector<int64_t> w;
  for (int64_t k = 0; k < count; ++k) w.push_back(k * (total - 1) / (count - 1));
  return w;
}

// 32 windows spread over the whole dev corpus (not only its start), each against
// transformers' summed NLL: within 1e-4, or, where some token's routing is a near-tie, within
// kNearTieNll. Near-tie windows are checked, not skipped. Measured over all 215 windows
// (WholeDevCorpusWithinPointOnePercent): 192 have a near-tie somewhere, 3 differ by more than
// 1e-5 and one by more than 1e-4 (window 105, margin 0, +1.7e-4); the loose bound is 6x that.
constexpr double kNearTieNll = 1e-3;
TEST(Perplexity, SpreadWindowsMatchTransformers) {
  Fixture f = load();
  ASSERT_EQ(static_cast<int64_t>(f.ids.size()), f.golden["tokens_in_text"].get<int64_t>());
  const int64_t total = static_cast<int64_t>(f.golden["windows"].size());
  ASSERT_GT(total, 200);
  int near_ties = 0;
  for (int64_t w : spread(total, 32)) {
    float margin = 1.0f;
    PerplexityResult r = score_window(*f.model, f.ids, w, &margin);
    ASSERT_EQ(r.window_nll.size(), 1u);
    const double want = f.golden["windows"][w]["sum_nll"].get<double>();
    EXPECT_EQ(r.window_tokens[0], f.golden["windows"][w]["predicted"].get<int64_t>()) << "window " << w;
    const bool tie = margin < kNearTie;
    near_ties += tie;
    EXPECT_NEAR(r.window_nll[0], want, (tie ? kNearTieNll : 1e-4) * want)
        << "window " << w << " (min routing margin " << margin << (tie ? ", a near-tie)" : ")");
  }
  std::printf("32 windows spread over %lld: %d with a routing near-tie\n", (long long)total, near_ties);
}

// The whole text within 0.1% of transformers. Each window also within 1e-4, except windows
// where some token's routing is a near-tie (margin < kNearTie): there f32 rounding differences
// between two correct implementations can pick a different expert (measured against
// transformers: margins of 0..6e-8 at the windows that differ by more than 1e-5), so such
// windows are held to kNearTieNll, and the number beyond 1e-4 to what was measured (one:
// window 105, +1.7e-4; 192 of the 215 windows have some near-tie).
constexpr int kMeasuredBeyond1e4 = 1;
TEST(Perplexity, WholeDevCorpusWithinPointOnePercent) {
  Fixture f = load();
  std::vector<float> min_margin;
  int64_t window = 0;
  f.model->hooks.on_margin = [&](int, int64_t, float m) {
    if (static_cast<int64_t>(min_margin.size()) <= window) min_margin.resize(window + 1, 1.0f);
    min_margin[window] = std::min(min_margin[window], m);
  };
  PerplexityResult r = perplexity(*f.model, f.ids, 512, 0, 512, [&](int64_t done, int64_t, const PerplexityResult&) { window = done; });
  f.model->hooks.on_margin = nullptr;
  const double want = f.golden["ppl"].get<double>();
  EXPECT_EQ(r.tokens, f.golden["predicted"].get<int64_t>());
  EXPECT_NEAR(r.ppl(), want, 1e-3 * want);
  int near_ties = 0, beyond = 0;
  double worst_tie = 0;
  for (size_t w = 0; w < r.window_nll.size(); ++w) {
    const double g = f.golden["windows"][w]["sum_nll"].get<double>();
    const double rel = std::fabs(r.window_nll[w] / g - 1.0);
    beyond += rel > 1e-4;
    if (min_margin.at(w) < kNearTie) {
      ++near_ties;
      worst_tie = std::max(worst_tie, rel);
      if (rel > 1e-5)
        std::printf("window %zu: routing near-tie (margin %.2e), NLL %.4f vs %.4f (%+.2e)\n", w, min_margin[w], r.window_nll[w], g,
                    r.window_nll[w] / g - 1.0);
      EXPECT_NEAR(r.window_nll[w], g, kNearTieNll * g) << "window " << w << " (near-tie, margin " << min_margin[w] << ")";
      continue;
    }
    EXPECT_NEAR(r.window_nll[w], g, 1e-4 * g) << "window " << w << " (min routing margin " << min_margin[w] << ")";
  }
  std::printf("%d windows with a routing near-tie, worst relative NLL difference among them %.2e; %d beyond 1e-4\n", near_ties,
              worst_tie, beyond);
  EXPECT_LE(beyond, kMeasuredBeyond1e4);
}

// K-reduction changes the model; transformers with num_experts_per_tok = K is the reference.
TEST(Perplexity, KReductionDevWithinPointOnePercent) {
  Fixture f = load();
  std::ifstream kj(spool::testing::data_dir() + "/models/spool-demo-moe/k_reduction.json");
  nlohmann::json kr = nlohmann::json::parse(kj);
  for (auto& [k, v] : kr["k"].items()) {
    f.model->set_max_active_experts(std::stoi(k));
    PerplexityResult r = perplexity(*f.model, f.ids, 512, 0, 512, nullptr);
    const double want = v["dev"]["ppl"].get<double>();
    EXPECT_EQ(r.tokens, v["dev"]["tokens"].get<int64_t>());
    EXPECT_NEAR(r.ppl(), want, 1e-3 * want) << "K=" << k;
  }
}

TEST(KlDivergence, KnownValues) {
  const float p[2] = {0.0f, 0.0f}, q[2] = {std::log(3.0f), 0.0f};
  // P = (1/2, 1/2), Q = (3/4, 1/4): KL = 1/2 ln(2/3) + 1/2 ln 2.
  EXPECT_NEAR(kl_divergence(p, q, 2), 0.5 * std::log(2.0 / 3.0) + 0.5 * std::log(2.0), 1e-7);
  EXPECT_NEAR(kl_divergence(q, q, 2), 0.0, 1e-12);
  const float big[3] = {1000.0f, 0.0f, -1000.0f}, shifted[3] = {1010.0f, 10.0f, -990.0f};  // shift-invariant
  EXPECT_NEAR(kl_divergence(big, shifted, 3), 0.0, 1e-12);
}

TEST(Perplexity, AgainstItselfKlIsZero) {
  Fixture f = load();
  PerplexityResult r = perplexity(*f.model, f.ids, 128, 2, 64, nullptr, f.model.get());
  ASSERT_TRUE(r.compared);
  EXPECT_EQ(r.tokens, 256);
  EXPECT_NEAR(r.mean_kl(), 0.0, 1e-12);
  EXPECT_EQ(r.top1_agreement(), 1.0);
  EXPECT_NEAR(r.ref_ppl(), r.ppl(), 1e-9 * r.ppl());
}

// llama-perplexity's definition, computed by hand on three chunks of 64 tokens: each chunk run
// alone from fresh state in one forward call, its first token replaced by the BOS, the NLL of
// the tokens after positions 32..62 summed; the running ppl after each chunk and the "+/-" of
// the final estimate from the per-token NLLs. perplexity_llama runs steps of 24 tokens (the
// second straddles the first scored position).
TEST(PerplexityLlama, MatchesHandComputedChunks) {
  Fixture f = load();
  const int64_t n_ctx = 64, first = 32, V = f.model->spec().vocab_size;
  for (const std::optional<int32_t> bos : {std::optional<int32_t>(1), std::optional<int32_t>()}) {
    std::vector<double> want_chunk, tok_nll;
    for (int64_t c = 0; c < 3; ++c) {
      std::vector<int32_t> chunk(f.ids.begin() + c * n_ctx, f.ids.begin() + (c + 1) * n_ctx);
      if (bos) chunk[0] = *bos;
      models::State st = f.model->new_state();
      std::vector<float> logits(static_cast<size_t>(n_ctx * V));
      f.model->forward(chunk, st, models::LogitsMode::kAll, logits.data());
      double sum = 0;
      for (int64_t p = first; p <= n_ctx - 2; ++p) {
        tok_nll.push_back(token_nll(logits.data() + p * V, V, chunk[p + 1]));
        sum += tok_nll.back();
      }
      want_chunk.push_back(sum);
    }
    std::vector<double> running;
    PerplexityResult r = perplexity_llama(*f.model, f.ids, n_ctx, 3, 24, bos,
                                          [&](int64_t, int64_t total, const PerplexityResult& acc) {
                                            EXPECT_EQ(total, 3);
                                            running.push_back(acc.ppl());
                                          });
    ASSERT_EQ(r.window_nll.size(), 3u);
    EXPECT_EQ(r.tokens, 3 * 31);
    double sum = 0, sum2 = 0;
    for (double x : tok_nll) sum += x, sum2 += x * x;
    for (int c = 0; c < 3; ++c) {
      EXPECT_EQ(r.window_tokens[c], 31);
      EXPECT_NEAR(r.window_nll[c], want_chunk[c], 1e-5 * want_chunk[c]) << "chunk " << c;
      double s = 0;
      for (int k = 0; k <= c; ++k) s += want_chunk[k];
      EXPECT_NEAR(running[c], std::exp(s / (31.0 * (c + 1))), 1e-5 * running[c]) << "chunk " << c;
    }
    const double n = static_cast<double>(tok_nll.size()), mean = sum / n;
    EXPECT_NEAR(r.ppl(), std::exp(mean), 1e-5 * r.ppl());
    const double se = std::sqrt((sum2 / n - mean * mean) / (n - 1)) * std::exp(mean);
    EXPECT_NEAR(r.ppl_stderr(), se, 1e-4 * se);
  }
  // All chunks by default (the tail dropped); llama-perplexity's 2 * n_ctx minimum.
  const std::vector<int32_t> head(f.ids.begin(), f.ids.begin() + 200);
  EXPECT_EQ(perplexity_llama(*f.model, head, 64, 0, 64, std::nullopt, nullptr).window_nll.size(), 3u);
  EXPECT_THROW(perplexity_llama(*f.model, std::span<const int32_t>(head).first(127), 64, 0, 64, std::nullopt, nullptr), Error);
  EXPECT_THROW(perplexity_llama(*f.model, head, 64, 0, 64, static_cast<int32_t>(V), nullptr), Error);
}

// Converts the demo model with `name` into a scratch directory and loads it.
struct Converted {
  std::string dir;
  std::shared_ptr<io::Checkpoint> ckpt;
  std::unique_ptr<models::Model> model;
  ~Converted() {
    model.reset();
    ckpt.reset();
    std::filesystem::remove_all(dir);
  }
};
// The quality table and the reference were measured with the original rules (RMS scales, N(0, 1)
// codebooks), so the tests pinned to them convert in that mode (QuantOptions::legacy()).
// `embed_bits`: --embed-bits (the embedding table quantized too) when set.
std::unique_ptr<Converted> convert_demo(const std::string& name, ops::ThreadPool* pool,
                                        const quant::QuantOptions& q = quant::QuantOptions::legacy(),
                                        std::optional<std::string> embed_bits = {}) {
  auto c = std::make_unique<Converted>();
  c->dir = ::testing::TempDir() + "/ppl_recipe_" + name + (q.is_legacy() ? "" : "_fit") + (embed_bits ? "_embed" + *embed_bits : "");
  quant::Recipe r = quant::recipe(name);
  if (embed_bits) quant::apply_overrides(&r, quant::RecipeOverrides{.embed_bits = embed_bits});
  spool::testing::convert_demo(c->dir, r, q);
  c->ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(c->dir));
  c->model = models::load_model(c->ckpt, pool);
  return c;
}

// Recipes without a float64 simulation in quant_reference.json yet (the 4-8 bit recipes of issue
// 31: tests/reference/make_fixtures_chat_demo_hidden_quant.py has no q5 / q6 / q8 codebooks).
// Their quality is checked against bench/results/quality.md only.
const std::set<std::string> kNoReference = {"q8", "q6", "q5", "q4-hi8", "q4-hi6", "q4-hi8-down6", "q5-hi8"};

// Recipes without a row in bench/results/quality.md yet (the same issue-31 recipes: their
// whole-corpus run is bench/quality.sh's next regeneration; their 40-window KL and size are in
// docs/quantization.md). The few-window check skips them until then.
const std::set<std::string> kNoQualityRow = kNoReference;

nlohmann::json quant_reference() {
  std::ifstream qj(spool::testing::data_dir() + "/models/spool-demo-moe/quant_reference.json");
  return nlohmann::json::parse(qj);
}

// "q4", "q3", "q2", "ternary", ... of a code type; of a reference entry (2, 3, 4 or "ternary").
std::string type_name(ops::QType t) { return quant::qtype_name(t); }
std::string type_name(const nlohmann::json& bits) { return bits.is_string() ? bits.get<std::string>() : "q" + std::to_string(bits.get<int>()); }

// Every recipe's code type and group size per tensor class, as applied to the demo model's
// matrices, equal the reference's `recipe` block, which the reference perplexities were
// simulated with. Groups are compared as applied (effective_group narrows a group to the
// matrix width): the block records 64 or 32 for the expert down_proj, whose width is 32.
TEST(QuantRecipes, ParametersMatchTheReference) {
  const nlohmann::json ref = quant_reference();
  io::Checkpoint ck = models::open_checkpoint(SPOOL_DEFAULT_MODEL_DIR, {.map = false});
  size_t recipes_in_ref = 0;
  for (auto& [k, v] : ref.items()) recipes_in_ref += v.is_object() && v.contains("recipe");
  for (const std::string& name : kNoReference) {
    EXPECT_FALSE(ref.contains(name)) << name << " has a reference now: drop it from kNoReference";
    EXPECT_NE(std::find(quant::recipe_names().begin(), quant::recipe_names().end(), name), quant::recipe_names().end()) << name;
  }
  EXPECT_EQ(quant::recipe_names().size(), recipes_in_ref + kNoReference.size()) << "recipes with a reference vs spool's recipes";
  const std::pair<quant::TensorClass, const char*> classes[] = {{quant::TensorClass::kDense, "dense"},
                                                                {quant::TensorClass::kLmHead, "lm_head"},
                                                                {quant::TensorClass::kExpertGateUp, "expert_gate_up"},
                                                                {quant::TensorClass::kExpertDown, "expert_down"}};
  for (const std::string& name : quant::recipe_names()) {
    if (kNoReference.count(name)) continue;
    ASSERT_TRUE(ref.contains(name) && ref[name].contains("recipe")) << name;
    const quant::Recipe r = quant::recipe(name);
    for (const auto& [cls, key] : classes) {
      const nlohmann::json& want = ref[name]["recipe"][key];
      const quant::ClassSpec& spec = r.spec(cls);
      EXPECT_FALSE(spec.keep) << name << " " << key;
      EXPECT_EQ(type_name(spec.type), type_name(want[0])) << name << " " << key;
      int matrices = 0;
      for (const io::TensorRef& t : ck.tensors()) {
        if (t.shape.size() < 2 || quant::classify(t.name, t.shape) != cls) continue;
        ++matrices;
        EXPECT_EQ(quant::effective_group(spec.group, t.shape.back()), quant::effective_group(want[1].get<int>(), t.shape.back()))
            << name << " " << key << " " << t.name << " (requested g" << spec.group << ", reference g" << want[1] << ")";
      }
      EXPECT_GT(matrices, 0) << name << " " << key;
    }
  }
}

// The quality table of docs/quantization.md (bench/results/quality.md, made by bench/quality.sh over the
// whole dev corpus): model -> (KL to bf16, top-1 agreement).
std::map<std::string, std::pair<double, double>> quality_table() {
  std::ifstream in(std::string(SPOOL_SOURCE_DIR) + "/bench/results/quality.md");
  std::map<std::string, std::pair<double, double>> t;
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("| ") || line.starts_with("| model") || line.starts_with("|---")) continue;
    std::vector<std::string> cells;
    std::stringstream ss(line.substr(1));
    for (std::string c; std::getline(ss, c, '|');) cells.push_back(c.substr(c.find_first_not_of(' '), c.find_last_not_of(' ') - c.find_first_not_of(' ') + 1));
    if (cells.size() >= 4) t[cells[0]] = {std::stod(cells[2]), std::stod(cells[3]) / 100.0};
  }
  return t;
}

// Quantization quality in CI: each recipe, converted by spool, scored against the bf16 model
// on kQualityWindows windows spread over the dev corpus: mean KL(bf16 || recipe) and top-1
// agreement within 10% of the whole-corpus values in that table (10% of the KL; 10% of
// the disagreement 1 - top-1). A recipe that quantized nothing (KL 0, top-1 100%) or the wrong
// class fails. Measured with 8 windows (52 s for all recipes on 2 cores): KL +4.4%..+7.3% and
// disagreement +2.3%..+6.4% of the table. Deterministic: the same windows every run.
constexpr int kQualityWindows = 8;

/// Mean KL(bf16 || model) per token and top-1 agreement of `model` against the fixture's bf16
/// model over the kQualityWindows windows spread over the dev corpus.
struct FewWindowScore {
  double kl = 0, top1 = 0;
};
FewWindowScore few_window_score(models::Model& model, const Fixture& f) {
  const int64_t total = static_cast<int64_t>(f.golden["windows"].size());
  double kl = 0, agree = 0, tokens = 0;
  for (int64_t w : spread(total, kQualityWindows)) {
    PerplexityResult r = score_window(model, f.ids, w, nullptr, f.model.get());
    EXPECT_TRUE(r.compared);
    kl += r.sum_kl;
    agree += static_cast<double>(r.top1_agree);
    tokens += static_cast<double>(r.tokens);
  }
  return {kl / tokens, agree / tokens};
}

/// `model` generates greedily from the first 16 corpus tokens: 8 tokens, each inside the vocabulary.
void expect_generates(models::Model& model, const Fixture& f, const std::string& what) {
  Session s(model);
  GenerateRequest req;
  req.prompt.assign(f.ids.begin(), f.ids.begin() + 16);
  req.max_tokens = 8;
  req.sampling.temperature = 0;
  const GenerateResult g = s.generate(req, {});
  EXPECT_EQ(g.output.size(), 8u) << what;
  for (int32_t id : g.output) EXPECT_TRUE(id >= 0 && id < model.spec().vocab_size) << what << " id " << id;
}

TEST(QuantRecipes, FewWindowKlAndTop1NearTheQualityTable) {
  Fixture f = load();
  const auto table = quality_table();
  ASSERT_GE(table.size(), quant::recipe_names().size() - kNoQualityRow.size()) << "bench/results/quality.md unreadable";
  for (const std::string& name : quant::recipe_names()) {
    if (kNoQualityRow.count(name)) {
      EXPECT_FALSE(table.count(name)) << name << " has a quality row now: drop it from kNoQualityRow";
      continue;
    }
    ASSERT_TRUE(table.count(name)) << name << " missing from bench/results/quality.md";
    const auto [kl_want, top1_want] = table.at(name);
    auto c = convert_demo(name, f.pool.get());
    const auto [kl, top1] = few_window_score(*c->model, f);
    std::printf("%-16s KL %.4f (table %.4f, %+.1f%%)  top-1 %.4f (table %.4f, disagreement %+.1f%%)\n", name.c_str(), kl, kl_want,
                100.0 * (kl / kl_want - 1.0), top1, top1_want, 100.0 * ((1.0 - top1) / (1.0 - top1_want) - 1.0));
    std::fflush(stdout);
    EXPECT_NEAR(kl, kl_want, 0.10 * kl_want) << name;
    EXPECT_NEAR(1.0 - top1, 1.0 - top1_want, 0.10 * (1.0 - top1_want)) << name;
  }
}

// spool convert's default (searched scales, fitted codebooks: quant/fit.h) against the original
// rules on the demo model: the converted model loads and generates, and its next-token
// distributions are closer to bf16's, mean KL(bf16 || model) over the kQualityWindows windows
// lower than the legacy conversion's by at least kMinKlGain (measured: q4 0.0431 -> 0.0300,
// tq3a-tqTe-down4 0.2018 -> 0.1763), with top-1
// agreement no worse.
constexpr double kMinKlGain = 0.05;
TEST(QuantRecipes, ScaleSearchAndFittedCodebooksLowerKl) {
  Fixture f = load();
  for (const std::string name : {"q4", "tq3a-tqTe-down4"}) {
    double kl[2] = {0, 0}, top1[2] = {0, 0};
    for (int mode = 0; mode < 2; ++mode) {
      auto c = convert_demo(name, f.pool.get(), mode == 0 ? quant::QuantOptions::legacy() : quant::QuantOptions{});
      const FewWindowScore sc = few_window_score(*c->model, f);
      kl[mode] = sc.kl;
      top1[mode] = sc.top1;
      if (mode == 1) expect_generates(*c->model, f, name);
    }
    std::printf("%-16s KL legacy %.4f -> %.4f (%+.1f%%)  top-1 %.4f -> %.4f\n", name.c_str(), kl[0], kl[1], 100.0 * (kl[1] / kl[0] - 1.0),
                top1[0], top1[1]);
    std::fflush(stdout);
    EXPECT_LT(kl[1], (1.0 - kMinKlGain) * kl[0]) << name;
    EXPECT_GE(top1[1], top1[0]) << name;
  }
}

// --embed-bits 4 on the demo model (q4, default scale search and codebooks): the converted model
// loads and generates, and its KL to bf16 over the kQualityWindows windows is finite, above the
// bf16-embedding conversion's (the table really is quantized) and within kMaxEmbedKlRatio of it
// (measured on 8 windows: 0.0300 -> 0.0362, x1.21; over 24 chunks of the dev corpus 0.0393 -> 0.0482, the
// file 19% smaller: bench/results/quant_embed.md).
constexpr double kMaxEmbedKlRatio = 1.5;
TEST(QuantRecipes, QuantizedEmbeddingKlNearBf16Embedding) {
  Fixture f = load();
  double kl[2] = {0, 0}, top1[2] = {0, 0};
  for (int mode = 0; mode < 2; ++mode) {
    auto c = convert_demo("q4", f.pool.get(), quant::QuantOptions{}, mode == 1 ? std::optional<std::string>("4") : std::nullopt);
    ASSERT_EQ(c->ckpt->find("embed_tokens.qweight") != nullptr, mode == 1);
    const FewWindowScore sc = few_window_score(*c->model, f);
    kl[mode] = sc.kl;
    top1[mode] = sc.top1;
    if (mode == 1) expect_generates(*c->model, f, "q4 --embed-bits 4");
  }
  std::printf("q4 KL bf16 embedding %.4f -> q4 embedding %.4f (x%.3f)  top-1 %.4f -> %.4f\n", kl[0], kl[1], kl[1] / kl[0], top1[0], top1[1]);
  std::fflush(stdout);
  EXPECT_TRUE(std::isfinite(kl[1]));
  EXPECT_GT(kl[1], kl[0]);
  EXPECT_LT(kl[1], kMaxEmbedKlRatio * kl[0]);
}

// Each recipe converted by spool lands within 1% of the float64 reference simulation of the
// same algorithm over the whole dev corpus (quant_reference.json; its sign vectors differ from
// spool's, which moved perplexity by -0.52%..+0.64%: bench/results/quant_reference_check.txt).
TEST(Perplexity, QuantRecipesWithinOnePercentOfReference) {
  Fixture f = load();
  const nlohmann::json ref = quant_reference();
  for (const std::string& name : quant::recipe_names()) {
    if (kNoReference.count(name)) continue;
    ASSERT_TRUE(ref.contains(name)) << name;
    auto c = convert_demo(name, f.pool.get());
    PerplexityResult r = perplexity(*c->model, f.ids, 512, 0, 512, nullptr);
    const double want = ref[name]["dev"]["ppl"].get<double>();
    EXPECT_EQ(r.tokens, ref[name]["dev"]["tokens"].get<int64_t>());
    EXPECT_NEAR(r.ppl(), want, 0.01 * want) << name;
    std::printf("%-16s ppl %.4f reference %.4f (%+.2f%%)\n", name.c_str(), r.ppl(), want, 100.0 * (r.ppl() / want - 1.0));
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace spool::engine
