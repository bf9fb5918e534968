// Multi-token prediction: the demo model's trained MTP head against the reference forward of
// make_fixtures_mtp.py (golden_mtp: head logits of every position of the four demo prompts plus their
// greedy continuations, the greedy acceptance a drafter sees on each), and speculative decoding
// with it against plain decoding: greedy output identical (draft_max 1..3, resident and streaming
// at a zero budget), sampled output of the same distribution (two-sample chi-square over seeds),
// the auto-off, and State::rewind_in_step against an unrewound run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "support/golden.h"
#include "support/load.h"
#include "support/mtp.h"
#include "common/error.h"
#include "engine/loader.h"
#include "engine/session.h"
#include "engine/speculative.h"
#include "models/family.h"
#include "quant/convert.h"
#include "quant/recipe.h"
#include "models/synth.h"

namespace spool::engine {
namespace {

using spool::testing::argmax;
using spool::testing::data_dir;
using spool::testing::head_logits;

constexpr double kTol = 1e-4;

LoadedModel load_demo(bool mtp, bool stream = false) {
  LoadOptions o = spool::testing::test_load_options(SPOOL_DEFAULT_MODEL_DIR, stream);
  o.mtp = mtp;
  o.ctx_size = 512;
  return load(o);
}

nlohmann::json golden_json() {
  std::ifstream f(data_dir() + "/models/spool-demo-moe-mtp/golden_mtp.json");
  return nlohmann::json::parse(f);
}


TEST(MtpHead, LoadsOnlyWhenAskedAndCountsItsBytes) {
  LoadedModel plain = load_demo(false);
  EXPECT_EQ(plain.model->mtp_layers(), 0);
  EXPECT_EQ(plain.model->spec().mtp_declared, 1);
  EXPECT_GT(plain.ckpt->mtp_bytes(), 0u);
  EXPECT_EQ(plain.ckpt->find("mtp.fc.weight"), nullptr);
  EXPECT_THROW(plain.model->mtp_forward({}), Error);
  LoadedModel mtp = load_demo(true);
  EXPECT_EQ(mtp.model->mtp_layers(), 1);
  EXPECT_NE(mtp.ckpt->find("mtp.fc.weight"), nullptr);
  EXPECT_NE(mtp.ckpt->find("layers.8.self_attn.q_proj.weight"), nullptr);  // mtp.layers.0 -> layers.{num_hidden_layers}
  EXPECT_TRUE(mtp.ckpt->has_expert(8, 63, io::ExpertProj::kDown));
  EXPECT_EQ(mtp.ckpt->mtp_bytes(), plain.ckpt->mtp_bytes());
  EXPECT_EQ(mtp.ckpt->total_bytes(), plain.ckpt->total_bytes() + mtp.ckpt->mtp_bytes());
}

TEST(MtpHead, LogitsMatchTheReferenceAndGreedyAcceptance) {
  LoadedModel l = load_demo(true);
  models::Model& m = *l.model;
  const int64_t V = m.spec().vocab_size;
  const spool::testing::Golden g(data_dir() + "/models/spool-demo-moe-mtp/golden_mtp_rows.safetensors");
  const nlohmann::json j = golden_json();
  ASSERT_EQ(j["prompts"].size(), 4u);
  for (size_t p = 0; p < 4; ++p) {
    const std::string k = "p" + std::to_string(p);
    const std::vector<int32_t> ids = g.i32(k + ".ids");
    const std::vector<float> got = head_logits(m, ids);
    const int64_t T = static_cast<int64_t>(ids.size()) - 1;
    // Logits of the stored rows (every 6th) within 1e-4 of max |logit|.
    const std::vector<int32_t> rows = g.i32(k + ".rows");
    const std::vector<float> ref = g.f32(k + ".mtp_logits");
    ASSERT_EQ(ref.size(), rows.size() * static_cast<size_t>(V));
    std::vector<float> sel;
    for (int32_t r : rows) sel.insert(sel.end(), got.begin() + r * V, got.begin() + (r + 1) * V);
    spool::testing::expect_rows_close(sel.data(), ref.data(), static_cast<int64_t>(rows.size()), V, kTol, k + " head logits");
    // Argmax of every row, and the greedy acceptance over the generated rows.
    const auto& want = j["prompts"][p]["mtp_argmax"];
    ASSERT_EQ(static_cast<int64_t>(want.size()), T);
    for (int64_t t = 0; t < T; ++t) EXPECT_EQ(argmax(got.data() + t * V, V), want[t].get<int32_t>()) << k << " row " << t;
    const int64_t n0 = static_cast<int64_t>(ids.size()) - 48;  // prompt + 48 greedy ids
    int hits = 0, n = 0;
    for (int64_t t = n0 - 1; t < T - 1; ++t, ++n) hits += argmax(got.data() + t * V, V) == ids[t + 2];
    EXPECT_NEAR(static_cast<double>(hits) / n, j["prompts"][p]["greedy_acceptance"].get<double>(), 1e-12) << k;
  }
  // The head's cache carried over several calls gives the same rows.
  const std::vector<int32_t> ids = g.i32("p1.ids");
  const std::vector<float> one = head_logits(m, ids, 1), three = head_logits(m, ids, 3);
  spool::testing::expect_rows_close(three.data(), one.data(), static_cast<int64_t>(ids.size()) - 1, V, 1e-5, "head in 3 calls");
}

std::vector<std::vector<int32_t>> demo_prompts() {
  std::vector<std::vector<int32_t>> out;
  const nlohmann::json j = golden_json();
  for (const auto& p : j["prompts"]) {
    std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    ids.resize(ids.size() - 48);
    out.push_back(ids);
  }
  return out;
}

GenerateResult run(models::Model& m, const std::vector<int32_t>& prompt, int n, SpecParams spec, SamplingParams sp = {}) {
  Session s(m);
  GenerateRequest r;
  r.prompt = prompt;
  r.max_tokens = n;
  r.sampling = sp;
  r.spec = spec;
  r.prefill_step = 5;  // several chunks: the head follows the prompt chunk by chunk
  return s.generate(r, {});
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

TEST(Speculative, GreedyOutputIdenticalToPlain) {
  LoadedModel l = load_demo(true);
  for (const auto& prompt : demo_prompts()) {
    const GenerateResult plain = run(*l.model, prompt, 40, {}, greedy());
    for (int k : {1, 2, 3}) {
      SpecParams sp;
      sp.mtp = true;
      sp.draft_max = k;
      sp.min_acceptance = 0;
      const GenerateResult r = run(*l.model, prompt, 40, sp, greedy());
      EXPECT_EQ(r.output, plain.output) << "draft_max " << k;
      EXPECT_GT(r.spec.steps, 0);
      EXPECT_GT(r.spec.accepted, 0) << "a trained head gets some drafts right";
      EXPECT_LT(r.spec.accepted, r.spec.drafted);
      // Every token after the first from a verify step, or a plain step where no draft fits.
      EXPECT_EQ(r.spec.emitted + (r.timings.decode_forwards - r.spec.steps) + 1, static_cast<int64_t>(r.output.size()));
      EXPECT_LT(r.timings.decode_forwards, static_cast<int64_t>(r.output.size()) - 1);
    }
  }
}

TEST(Speculative, GreedyIdenticalWhenExpertsStreamAtAZeroBudget) {
  LoadedModel res = load_demo(true), str = load_demo(true, true);
  ASSERT_NE(str.streaming, nullptr);
  SpecParams sp;
  sp.mtp = true;
  sp.draft_max = 2;
  for (const auto& prompt : demo_prompts()) {
    const GenerateResult a = run(*res.model, prompt, 24, {}, greedy());
    const GenerateResult b = run(*str.model, prompt, 24, sp, greedy());
    EXPECT_EQ(a.output, b.output);
  }
}

TEST(Speculative, StopIdsAndLengthEndAsWithoutIt) {
  LoadedModel l = load_demo(true);
  const auto prompt = demo_prompts()[1];
  const GenerateResult plain = run(*l.model, prompt, 30, {}, greedy());
  SpecParams sp;
  sp.mtp = true;
  sp.draft_max = 3;
  for (int n : {1, 2, 3, 7}) {  // lengths that end inside a step
    const GenerateResult r = run(*l.model, prompt, n, sp, greedy());
    EXPECT_EQ(r.output, std::vector<int32_t>(plain.output.begin(), plain.output.begin() + n));
    EXPECT_EQ(r.finish_reason, "length");
  }
  // A stop id in the middle of what a step accepts.
  for (size_t at : {3u, 10u, 17u}) {
    Session s(*l.model);
    GenerateRequest q;
    q.prompt = prompt;
    q.max_tokens = 30;
    q.sampling = greedy();
    q.spec = sp;
    q.stop_ids = {plain.output[at]};
    const GenerateResult r = s.generate(q, {});
    const size_t first = std::find(plain.output.begin(), plain.output.end(), plain.output[at]) - plain.output.begin();
    EXPECT_EQ(r.output, std::vector<int32_t>(plain.output.begin(), plain.output.begin() + first + 1));
    EXPECT_EQ(r.finish_reason, "stop");
  }
}

// Two-sample chi-square: the 2nd and 3rd generated tokens over many seeds, speculative against
// plain sampling (temperature 1, top-k 12). Categories with fewer than 10 draws pooled.
TEST(Speculative, SampledTokensKeepTheModelsDistribution) {
  LoadedModel l = load_demo(true);
  const auto prompt = demo_prompts()[0];
  SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 12;
  sp.top_p = 1.0f;
  sp.min_p = 0.0f;
  SpecParams mtp;
  mtp.mtp = true;
  mtp.draft_max = 2;
  mtp.min_acceptance = 0;
  constexpr int kSeeds = 400;
  for (size_t pos : {1u, 2u}) {
    std::map<int32_t, int> a, b;
    int64_t drafted = 0, accepted = 0;
    for (int seed = 0; seed < kSeeds; ++seed) {
      sp.seed = static_cast<uint64_t>(seed);
      ++a[run(*l.model, prompt, 3, {}, sp).output[pos]];
      sp.seed = static_cast<uint64_t>(seed) + 1000000;
      const GenerateResult r = run(*l.model, prompt, 3, mtp, sp);
      ++b[r.output[pos]];
      drafted += r.spec.drafted;
      accepted += r.spec.accepted;
    }
    EXPECT_GT(accepted, 0);
    EXPECT_LT(accepted, drafted);  // both branches of the acceptance test ran
    // Pool rare categories, then the statistic sum (a - b)^2 / (a + b) (equal sample sizes).
    double chi2 = 0;
    int df = -1, ra = 0, rb = 0;
    std::map<int32_t, int> all = a;
    for (auto [id, n] : b) all[id] += n;
    for (auto [id, n] : all) {
      if (n < 10) {
        ra += a[id];
        rb += b[id];
        continue;
      }
      chi2 += std::pow(a[id] - b[id], 2) / (a[id] + b[id]);
      ++df;
    }
    if (ra + rb > 0) {
      chi2 += std::pow(ra - rb, 2) / (ra + rb);
      ++df;
    }
    ASSERT_GE(df, 3);
    // Critical value at p = 0.001 (Wilson-Hilferty approximation of the chi-square quantile).
    const double z = 3.090, h = 2.0 / (9.0 * df), crit = df * std::pow(1 - h + z * std::sqrt(h), 3);
    EXPECT_LT(chi2, crit) << "token " << pos << ": chi2 " << chi2 << " with " << df << " degrees of freedom";
  }
}

TEST(Speculative, AutoOffStopsDraftingWhenAcceptanceIsLow) {
  LoadedModel l = load_demo(true);
  const auto prompt = demo_prompts()[2];
  SpecParams sp;
  sp.mtp = true;
  sp.min_acceptance = 0.99;  // the trained head never reaches it
  sp.probe_steps = 4;
  const GenerateResult plain = run(*l.model, prompt, 40, {}, greedy());
  const GenerateResult r = run(*l.model, prompt, 40, sp, greedy());
  EXPECT_TRUE(r.spec.auto_off);
  EXPECT_EQ(r.spec.steps, 4);
  EXPECT_EQ(r.output, plain.output);
  sp.min_acceptance = 0;
  EXPECT_FALSE(run(*l.model, prompt, 40, sp, greedy()).spec.auto_off);
}

TEST(Speculative, RewindInStepEqualsTheShorterRun) {
  LoadedModel l = load_demo(true);
  models::Model& m = *l.model;
  const int64_t V = m.spec().vocab_size;
  const std::vector<int32_t> prompt = demo_prompts()[3];
  const std::vector<int32_t> more = {100, 200, 300, 400};
  std::vector<float> a(V), b(4 * V);
  for (int keep = 1; keep <= 4; ++keep) {
    // Reference: the prompt, then `keep` of the tokens, then token 7.
    models::State ref = m.new_state();
    m.forward(prompt, ref, models::LogitsMode::kNone, a.data());
    m.forward(std::span<const int32_t>(more.data(), keep), ref, models::LogitsMode::kNone, a.data());
    const int32_t seven = 7;
    m.forward(std::span<const int32_t>(&seven, 1), ref, models::LogitsMode::kLast, a.data());
    // All four in one step with the trail kept, cut back to `keep`, then token 7.
    models::State st = m.new_state();
    st.keep_step_trail(3);
    m.forward(prompt, st, models::LogitsMode::kNone, b.data());
    st.arm_step_trail();
    m.forward(more, st, models::LogitsMode::kAll, b.data());
    st.rewind_in_step(static_cast<int64_t>(prompt.size()) + keep);
    m.forward(std::span<const int32_t>(&seven, 1), st, models::LogitsMode::kLast, b.data());
    spool::testing::expect_rows_close(b.data(), a.data(), 1, V, 1e-5, "rewound to " + std::to_string(keep));
  }
  models::State st = m.new_state();
  st.keep_step_trail(3);
  m.forward(prompt, st, models::LogitsMode::kNone, b.data());
  EXPECT_THROW(st.rewind_in_step(static_cast<int64_t>(prompt.size()) - 1), Error);  // the prompt step kept nothing
  m.forward(more, st, models::LogitsMode::kNone, b.data());  // not armed: keeps nothing either
  EXPECT_THROW(st.rewind_in_step(static_cast<int64_t>(prompt.size()) + 1), Error);
  st.arm_step_trail();
  m.forward(more, st, models::LogitsMode::kNone, b.data());
  EXPECT_THROW(st.rewind_in_step(static_cast<int64_t>(prompt.size()) + 4), Error);  // before the step's first token's state
}

// spool convert carries the head (quantized by its classes); a run without --spec mtp drops it
// again, one with it drafts from the quantized head and keeps the quantized model's output.
TEST(Speculative, ConvertedCheckpointKeepsItsHead) {
  const std::string out = ::testing::TempDir() + "spec_q4_" + std::to_string(::getpid());
  spool::testing::convert_demo(out, "q4");
  LoadOptions lo = spool::testing::test_load_options(out, false);
  LoadedModel plain = load(lo);
  EXPECT_EQ(plain.model->mtp_layers(), 0);
  EXPECT_GT(plain.ckpt->mtp_bytes(), 0u);
  lo.mtp = true;
  LoadedModel mtp = load(lo);
  ASSERT_EQ(mtp.model->mtp_layers(), 1);
  EXPECT_NE(mtp.ckpt->find("mtp.fc.qweight"), nullptr);
  SpecParams sp;
  sp.mtp = true;
  sp.min_acceptance = 0;
  for (const auto& prompt : demo_prompts()) {
    const GenerateResult a = run(*plain.model, prompt, 32, {}, greedy());
    const GenerateResult b = run(*mtp.model, prompt, 32, sp, greedy());
    EXPECT_EQ(b.output, a.output);
    EXPECT_GT(b.spec.accepted, 0);
  }
  std::filesystem::remove_all(out);
}

TEST(Speculative, BadParametersAndModelsWithoutAHead) {
  SpecParams p;
  p.draft_max = 0;
  EXPECT_THROW(p.validate(), UsageError);
  p.draft_max = 17;
  EXPECT_THROW(p.validate(), UsageError);
  p.draft_max = 1;
  p.min_acceptance = 1.5;
  EXPECT_THROW(p.validate(), UsageError);
  LoadedModel plain = load_demo(false);
  models::State st = plain.model->new_state();
  p.min_acceptance = 0.2;
  p.mtp = true;
  EXPECT_THROW(MtpDecoder(*plain.model, st, p), Error);
  LoadOptions o;
  o.model_dir = data_dir() + "/models/qwen3_moe";
  o.mtp = true;
  EXPECT_THROW(load(o), Error);
}

// `spool synth --mtp`: a random MTP head in each layout (Qwen3.5 mtp.*, DeepSeek-V3 nextn under
// layers.{N}) loads as one MTP layer; greedy output with it equals plain decoding, and its
// random drafts (acceptance near 0) switch speculation off at the first probe (probe_steps steps).
TEST(Speculative, SynthMtpHeadLoadsAndAutoOffEngages) {
  for (const char* preset : {"tiny-qwen3.5", "tiny-deepseek-v3"}) {
    SCOPED_TRACE(preset);
    models::SynthOptions so;
    so.preset = preset;
    so.layers = std::string(preset) == "tiny-deepseek-v3" ? 2 : 0;
    so.out_dir = ::testing::TempDir() + "/synth_mtp_" + preset;
    so.force = true;
    so.mtp = true;
    models::write_synthetic(so, nullptr);
    LoadOptions o;
    o.model_dir = so.out_dir;
    o.threads = 2;
    o.ctx_size = 256;
    o.mtp = true;
    LoadedModel l = load(o);
    ASSERT_EQ(l.model->mtp_layers(), 1);
    o.mtp = false;
    EXPECT_EQ(load(o).model->mtp_layers(), 0);  // the head is skipped unless asked for
    const std::vector<int32_t> prompt = {11, 22, 33, 44, 55, 66, 77};
    const GenerateResult plain = run(*l.model, prompt, 48, {}, greedy());
    SpecParams sp;
    sp.mtp = true;  // the default auto-off: 0.25 after probe_steps steps
    const GenerateResult r = run(*l.model, prompt, 48, sp, greedy());
    EXPECT_EQ(r.output, plain.output);
    EXPECT_TRUE(r.spec.auto_off) << "acceptance " << r.spec.acceptance();
    EXPECT_EQ(r.spec.steps, SpecParams{}.probe_steps);
    EXPECT_LT(r.spec.acceptance(), 0.25);
    // Without the auto-off every step verifies a draft, and the output is still the plain one.
    sp.min_acceptance = 0;
    const GenerateResult all = run(*l.model, prompt, 48, sp, greedy());
    EXPECT_EQ(all.output, plain.output);
    EXPECT_FALSE(all.spec.auto_off);
    EXPECT_GT(all.spec.steps, SpecParams{}.probe_steps);
  }
  models::SynthOptions bad;
  bad.preset = "tiny-gemma4-moe";
  bad.out_dir = ::testing::TempDir() + "/synth_mtp_bad";
  bad.mtp = true;
  EXPECT_THROW(models::write_synthetic(bad, nullptr), UsageError);  // no MTP layout for the family
  bad.preset = "tiny-qwen3.5";
  bad.layers = 2;  // two linear-attention layers: no attention layer for the head to copy
  EXPECT_THROW(models::write_synthetic(bad, nullptr), UsageError);
}

}  // namespace
}  // namespace spool::engine
