// The serving engine on the demo model: prompt-cache reuse gives the same output as fresh runs
// (same request twice, prefix + 1 token, disk snapshots after a restart), corrupt snapshots are
// deleted and never loaded (memory checkpoints still serve), the disk cache evicts by its access
// counter (not file times) and deletes old-format files, no state leaks between requests,
// logit_bias forces and bans tokens, seeds reproduce, stop strings that
// span tokens cut the same text streamed and not, non-finite logits are an error, and
// --tool-syntax-greedy picks argmax inside tool-call markup, and a thinking budget
// (thinking_budget_tokens / --reasoning-budget) ends the reasoning with the family's closer.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "engine/loader.h"
#include "server/generator.h"
#include "server/serving_engine.h"

namespace spool::server {
namespace {

namespace fs = std::filesystem;

engine::LoadedModel load_demo() {
  engine::LoadOptions o;
  o.model_dir = SPOOL_DEFAULT_MODEL_DIR;
  o.threads = 2;
  return engine::load(o);
}

std::unique_ptr<ServingEngine> make_engine(size_t checkpoints, const std::string& disk = "", int64_t step = 16) {
  EngineOptions eo;
  eo.model_name = "demo";
  eo.prefill_step = step;
  eo.cache_checkpoints = checkpoints;
  eo.disk_cache_dir = disk;
  eo.disk_cache_budget_gb = 1;
  return make_serving_engine(load_demo(), eo);
}

GenRequest request(const ServingEngine& e, const std::string& text, int max_tokens, float temp = 0.0f, uint64_t seed = 1) {
  GenRequest r;
  r.chat = false;
  r.prompt = e.facts.tok->encode(text);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temp;
  r.sampling.seed = seed;
  r.stop_ids = e.facts.stop_ids;
  r.parser.parse_reasoning = false;
  return r;
}

struct Outcome {
  std::vector<int32_t> ids;
  GenResult res;
};

Outcome run(ServingEngine& e, const GenRequest& r) {
  Outcome out;
  GenRequest q = r;
  q.logprobs = true;  // the chosen ids come back with their logprobs
  out.res = e.gen->run(q, nullptr, nullptr);
  for (const auto& t : out.res.logprobs) out.ids.push_back(t.id);
  return out;
}

const std::string kText =
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, and nothing "
    "particular to interest me on shore, I thought I would sail about a little and see the watery part of the world.";

class ServerEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { fresh_ = make_engine(0).release(); }
  static void TearDownTestSuite() { delete fresh_; }
  // Output of a run with no reuse at all (cache disabled, state reset).
  static Outcome reference(const GenRequest& r) { return run(*fresh_, r); }
  static ServingEngine* fresh_;
};
ServingEngine* ServerEngine::fresh_ = nullptr;

TEST_F(ServerEngine, SameRequestTwiceAndPrefixPlusOneReuseWithoutChangingOutput) {
  auto e = make_engine(16);
  GenRequest a = request(*e, kText, 24);
  ASSERT_GT(a.prompt.size(), 40u);
  Outcome ref = reference(a);
  Outcome first = run(*e, a);
  EXPECT_EQ(first.res.cached_tokens, 0);
  EXPECT_EQ(first.ids, ref.ids);
  Outcome second = run(*e, a);
  // The nearest checkpoint at or before prompt length - 1 (step 16).
  EXPECT_EQ(second.res.cached_tokens, (static_cast<int64_t>(a.prompt.size()) - 1) / 16 * 16);
  EXPECT_EQ(second.ids, ref.ids);
  for (size_t i = 0; i < ref.res.logprobs.size(); ++i) EXPECT_EQ(second.res.logprobs[i].logprob, ref.res.logprobs[i].logprob) << i;
  // Prefix + 1 token.
  GenRequest b = a;
  b.prompt.push_back(first.ids[0]);
  Outcome refb = reference(b);
  Outcome got = run(*e, b);
  EXPECT_GT(got.res.cached_tokens, 0);
  EXPECT_EQ(got.ids, refb.ids);
  for (size_t i = 0; i < refb.res.logprobs.size(); ++i) EXPECT_EQ(got.res.logprobs[i].logprob, refb.res.logprobs[i].logprob) << i;
  // A different prompt sharing a prefix, then the first again.
  GenRequest c = request(*e, kText.substr(0, 60) + " and a different ending about whales.", 16);
  EXPECT_EQ(run(*e, c).ids, reference(c).ids);
  EXPECT_EQ(run(*e, a).ids, ref.ids);
}

TEST_F(ServerEngine, NoStateLeaksBetweenRequests) {
  auto e = make_engine(16);
  // Prompts sharing more than two prefill chunks (step 16), then differing: the second of each
  // pair restores a checkpoint of the first and must not see the first's tail or output.
  const std::string shared = kText.substr(0, 150);
  GenRequest a = request(*e, shared + " The sea was calm and the sky", 20, 0.9f, 7);
  GenRequest b = request(*e, shared + " In the morning the captain", 20, 0.9f, 8);
  size_t common = 0;
  while (common < std::min(a.prompt.size(), b.prompt.size()) && a.prompt[common] == b.prompt[common]) ++common;
  ASSERT_GE(common, 33u);
  Outcome ra = reference(a), rb = reference(b);
  // b after a (and a after b, and repeated) equals b and a alone.
  EXPECT_EQ(run(*e, a).ids, ra.ids);
  Outcome got_b = run(*e, b);
  EXPECT_GE(got_b.res.cached_tokens, 32);  // the reuse path ran
  EXPECT_EQ(got_b.ids, rb.ids);
  Outcome got_a = run(*e, a);
  EXPECT_GE(got_a.res.cached_tokens, 32);
  EXPECT_EQ(got_a.ids, ra.ids);
  EXPECT_EQ(run(*e, a).ids, ra.ids);
}

TEST_F(ServerEngine, LogitBiasForcesAndBansTokens) {
  GenRequest a = request(*fresh_, "Whales are", 6);
  Outcome plain = run(*fresh_, a);
  ASSERT_FALSE(plain.ids.empty());
  GenRequest forced = a;
  forced.logit_bias = {{300, 100.0f}};
  EXPECT_EQ(run(*fresh_, forced).ids, std::vector<int32_t>(6, 300));
  GenRequest banned = a;
  banned.logit_bias = {{plain.ids[0], -100.0f}};
  Outcome b = run(*fresh_, banned);
  ASSERT_FALSE(b.ids.empty());
  EXPECT_NE(b.ids[0], plain.ids[0]);
  // Logprobs report the model's distribution, not the biased one (where 300 has probability ~1).
  EXPECT_LT(run(*fresh_, forced).res.logprobs[0].logprob, -0.5f);
}

TEST_F(ServerEngine, CorruptDiskSnapshotFallsBackToMemoryCheckpoints) {
  const std::string dir = ::testing::TempDir() + "/server_disk_fallback";
  fs::remove_all(dir);
  // Prefill step 8 (a fresh run with the same step is the reference: chunking is part of the result).
  GenRequest full = request(*fresh_, kText, 8);
  GenRequest part = request(*fresh_, kText.substr(0, 100), 4);
  ASSERT_GT(full.prompt.size(), part.prompt.size() + 16);
  Outcome ref = run(*make_engine(0, "", 8), full);
  {
    auto e = make_engine(16, dir, 8);
    run(*e, full);  // writes a snapshot of `full` (further than `part` reaches)
  }
  std::vector<fs::path> files;
  for (const auto& f : fs::directory_iterator(dir)) files.push_back(f.path());
  ASSERT_EQ(files.size(), 1u);
  auto e = make_engine(16, dir, 8);
  run(*e, part);  // memory checkpoints of `part`'s chunks
  // The checkpoint a request for `full` restores from memory: the last one within the common prefix.
  size_t common = 0;
  while (common < part.prompt.size() && part.prompt[common] == full.prompt[common]) ++common;
  int64_t mem = 0;
  for (int64_t p : e->cache->checkpoint_positions())
    if (p <= static_cast<int64_t>(common)) mem = p;
  ASSERT_GE(mem, 16);
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    const auto mid = static_cast<std::streamoff>(fs::file_size(files[0]) / 2);
    f.seekg(mid);
    char c;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(mid);
    f.write(&c, 1);
  }
  // The snapshot reaches further than memory but fails its check: deleted, and the memory
  // checkpoint is still used.
  Outcome r = run(*e, full);
  EXPECT_EQ(e->disk->stats().corrupt, 1u);
  EXPECT_EQ(r.res.cached_tokens, mem);
  EXPECT_EQ(r.ids, ref.ids);
  for (size_t i = 0; i < ref.res.logprobs.size(); ++i) EXPECT_EQ(r.res.logprobs[i].logprob, ref.res.logprobs[i].logprob) << i;
}

TEST_F(ServerEngine, SeedsReproduce) {
  GenRequest a = request(*fresh_, "Whales are", 24, 1.0f, 1234);
  a.sampling.top_k = 0;
  a.sampling.top_p = 1.0f;
  a.sampling.min_p = 0.0f;
  Outcome x = run(*fresh_, a), y = run(*fresh_, a);
  EXPECT_EQ(x.ids, y.ids);
  GenRequest b = a;
  b.sampling.seed = 99;
  EXPECT_NE(run(*fresh_, b).ids, x.ids);  // 24 tokens at temperature 1 with all the vocabulary
}

TEST_F(ServerEngine, StopStringsSpanningTokensCutTheSameTextStreamedOrNot) {
  GenRequest a = request(*fresh_, kText, 40);
  Outcome full = run(*fresh_, a);
  const std::string text = full.res.content;
  ASSERT_GT(full.ids.size(), 20u);
  // A stop string made of the end of token 10's text and the start of token 11's.
  std::string before = fresh_->facts.tok->decode(std::vector<int32_t>(full.ids.begin(), full.ids.begin() + 10));
  std::string upto = fresh_->facts.tok->decode(std::vector<int32_t>(full.ids.begin(), full.ids.begin() + 11));
  ASSERT_GT(upto.size(), before.size() + 1);
  ASSERT_GE(before.size(), 2u);
  const std::string stop = before.substr(before.size() - 2) + upto.substr(before.size(), 1);
  const size_t at = text.find(stop);
  ASSERT_NE(at, std::string::npos);
  GenRequest s = a;
  s.parser.stop = {stop};
  Outcome cut = run(*fresh_, s);
  EXPECT_EQ(cut.res.content, text.substr(0, at));
  EXPECT_EQ(cut.res.finish_reason, "stop");
  std::string streamed;
  GenResult r = fresh_->gen->run(s, [&](const GenEvent& ev) { streamed += ev.delta.content; return true; }, nullptr);
  EXPECT_EQ(streamed, text.substr(0, at));
  EXPECT_EQ(r.content, streamed);
}

TEST_F(ServerEngine, MaxTokensEndsWithLength) {
  GenRequest a = request(*fresh_, "Once", 3, 0.8f, 3);
  a.stop_ids.clear();
  Outcome r = run(*fresh_, a);
  EXPECT_EQ(r.ids.size(), 3u);
  EXPECT_EQ(r.res.finish_reason, "length");
  EXPECT_EQ(r.res.completion_tokens, 3);
}

TEST_F(ServerEngine, DiskSnapshotsSurviveRestartAndCorruptFilesAreDeleted) {
  const std::string dir = ::testing::TempDir() + "/server_disk_cache";
  fs::remove_all(dir);
  GenRequest a = request(*fresh_, kText, 12);
  Outcome ref = reference(a);
  {
    auto e = make_engine(16, dir);
    EXPECT_EQ(run(*e, a).ids, ref.ids);
    EXPECT_EQ(e->disk->stats().saves, 1u);
  }
  std::vector<fs::path> files;
  for (const auto& f : fs::directory_iterator(dir)) files.push_back(f.path());
  ASSERT_EQ(files.size(), 1u);
  {
    // Restart: the snapshot is loaded from disk and gives the same output.
    auto e = make_engine(16, dir);
    Outcome r = run(*e, a);
    EXPECT_GT(r.res.cached_tokens, 0);
    EXPECT_EQ(e->disk->stats().hits, 1u);
    EXPECT_EQ(r.ids, ref.ids);
  }
  // Flip one byte in the middle: the checksum fails, the file is deleted, output unchanged.
  {
    std::fstream f(files[0], std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(files[0]) / 2));
    char c;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(static_cast<std::streamoff>(fs::file_size(files[0]) / 2));
    f.write(&c, 1);
  }
  {
    auto e = make_engine(16, dir);
    Outcome r = run(*e, a);
    EXPECT_EQ(r.res.cached_tokens, 0);
    EXPECT_EQ(e->disk->stats().corrupt, 1u);  // deleted, not loaded
    EXPECT_EQ(r.ids, ref.ids);
    EXPECT_EQ(e->disk->stats().saves, 1u);  // written again, under the same name
  }
  // A garbage file is deleted when the cache opens; a truncated snapshot when it is loaded.
  ASSERT_TRUE(fs::exists(files[0]));
  fs::resize_file(files[0], fs::file_size(files[0]) / 3);
  std::ofstream(dir + "/garbage.spc") << "not a snapshot";
  {
    auto e = make_engine(16, dir);
    EXPECT_FALSE(fs::exists(dir + "/garbage.spc"));
    EXPECT_EQ(e->disk->stats().corrupt, 1u);
    Outcome r = run(*e, a);
    EXPECT_EQ(r.res.cached_tokens, 0);
    EXPECT_EQ(e->disk->stats().corrupt, 2u);
    EXPECT_EQ(r.ids, ref.ids);
  }
}

// The files of `dir` (sorted).
std::vector<fs::path> files_in(const std::string& dir) {
  std::vector<fs::path> v;
  for (const auto& f : fs::directory_iterator(dir)) v.push_back(f.path());
  std::sort(v.begin(), v.end());
  return v;
}

// The one file of `after` that is not in `before`.
fs::path new_file(const std::vector<fs::path>& before, const std::vector<fs::path>& after) {
  for (const auto& f : after)
    if (std::find(before.begin(), before.end(), f) == before.end()) return f;
  ADD_FAILURE() << "no new file";
  return {};
}

TEST(DiskCache, EvictsLeastRecentlyUsedByAccessCounter) {
  const std::string dir = ::testing::TempDir() + "/server_disk_lru";
  fs::remove_all(dir);
  engine::LoadedModel l = load_demo();
  engine::Session s(*l.model);
  std::vector<int32_t> p1 = l.tok->encode(kText), p2 = l.tok->encode(
      "Another prompt entirely, with words enough for one chunk of sixteen tokens and then a few more of them.");
  ASSERT_GE(p2.size(), 16u);
  ASSERT_GE(p1.size(), 32u);
  auto first = [](const std::vector<int32_t>& p, size_t n) { return std::span<const int32_t>(p).first(n); };
  s.prefill(first(p1, 16), 16);
  uint64_t one = 0;
  {
    DiskCache sizing(dir, 1ull << 30, "fp");
    sizing.save(first(p1, 16), s.state(), s.state().snapshot());
    one = sizing.stats().bytes;
  }
  ASSERT_GT(one, 0u);
  fs::remove_all(dir);
  // A snapshot of an older format version is deleted at start (not loaded, not counted corrupt).
  fs::create_directories(dir);
  std::ofstream(dir + "/old.spc") << std::string("SPOOLPC1") + std::string(64, '\x01');
  DiskCache c(dir, one * 2 + one / 2, "fp");  // room for two snapshots
  EXPECT_FALSE(fs::exists(dir + "/old.spc"));
  EXPECT_EQ(c.stats().corrupt, 0u);
  EXPECT_EQ(c.stats().files, 0u);
  c.save(first(p1, 16), s.state(), s.state().snapshot());
  const fs::path f1 = files_in(dir).at(0);
  s.state().reset();
  s.prefill(first(p2, 16), 16);
  auto before = files_in(dir);
  c.save(first(p2, 16), s.state(), s.state().snapshot());
  const fs::path f2 = new_file(before, files_in(dir));
  EXPECT_EQ(c.last_use(first(p1, 16)), 1u);
  EXPECT_EQ(c.last_use(first(p2, 16)), 2u);
  EXPECT_EQ(c.best_match(p1, 100), 16);
  EXPECT_EQ(c.best_match(p2, 100), 16);
  EXPECT_EQ(c.best_match(p2, 15), 0);  // longer than the limit
  EXPECT_EQ(c.load(p1, 100, s.state()), 16);  // p1 is now the most recently used
  EXPECT_EQ(c.last_use(first(p1, 16)), 3u);
  // File times say the opposite (p1's file is years older than p2's): the counter decides.
  const auto t0 = fs::file_time_type() + std::chrono::hours(24 * 365 * 40);
  fs::last_write_time(f1, t0);
  fs::last_write_time(f2, t0 + std::chrono::hours(24 * 365));
  s.state().reset();
  s.prefill(first(p1, 32), 16);
  c.save(first(p1, 32), s.state(), s.state().snapshot());
  EXPECT_EQ(c.last_use(first(p1, 32)), 4u);
  EXPECT_EQ(c.stats().files, 2u);
  EXPECT_EQ(c.stats().evictions, 1u);
  EXPECT_EQ(c.best_match(p2, 100), 0);  // p2 was the least recently used
  EXPECT_EQ(c.best_match(p1, 100), 32);
  EXPECT_EQ(c.best_match(p1, 20), 16);
  // Saving a snapshot that exists counts as a use.
  c.save(first(p1, 32), s.state(), s.state().snapshot());
  EXPECT_EQ(c.last_use(first(p1, 32)), 5u);
  EXPECT_EQ(c.stats().saves, 3u);
  {
    // Restart: the counters come back from the files, and the next use continues after them.
    DiskCache again(dir, 1ull << 30, "fp");
    EXPECT_EQ(again.last_use(first(p1, 16)), 3u);
    EXPECT_EQ(again.last_use(first(p1, 32)), 5u);
    EXPECT_EQ(again.load(p1, 20, s.state()), 16);  // the 16-token snapshot
    EXPECT_EQ(again.last_use(first(p1, 16)), 6u);
  }
  {
    // The load's counter was written to the file: with room for one snapshot, the 32-token one
    // (used at 5, before 6) goes.
    DiskCache small(dir, c.stats().bytes - 1, "fp");
    EXPECT_EQ(small.stats().evictions, 1u);
    EXPECT_EQ(small.best_match(p1, 100), 16);
  }
  DiskCache other(dir, 1ull << 30, "other-model");
  EXPECT_EQ(other.best_match(p1, 100), 0);  // another fingerprint never matches
  EXPECT_EQ(other.last_use(first(p1, 16)), 0u);
}

// A model that follows a script: position p's logits favour script[p - prompt] by `bump[p]`
// (over 0 elsewhere), or are NaN at `nan_at`. Lets the sampler paths be tested exactly.
class ScriptModel : public models::Model {
 public:
  ScriptModel(models::Model& base, std::vector<int32_t> script, std::vector<float> bump, int64_t prompt_len)
      : base_(base), script_(std::move(script)), bump_(std::move(bump)), prompt_len_(prompt_len) {}
  const models::ModelSpec& spec() const override { return base_.spec(); }
  models::State new_state() const override { return models::State(); }
  void set_kv_type(ops::KvType) override {}
  void forward(std::span<const int32_t> ids, models::State& st, models::LogitsMode mode, float* logits) override {
    st.pos += static_cast<int64_t>(ids.size());
    if (mode == models::LogitsMode::kNone) return;
    const int64_t V = spec().vocab_size, k = st.pos - prompt_len_;
    std::fill(logits, logits + V, 0.0f);
    if (k == nan_at) logits[3] = NAN;
    if (k >= 0 && k < static_cast<int64_t>(script_.size())) logits[script_[k]] = bump_[k];
  }
  void set_max_active_experts(int) override {}
  void set_expert_provider(std::shared_ptr<experts::ExpertProvider>) override {}
  experts::ExpertProvider& expert_provider() override { return base_.expert_provider(); }
  std::shared_ptr<experts::ExpertProvider> shared_expert_provider() override { return base_.shared_expert_provider(); }
  void forward_batch(std::span<const models::SeqStep> seqs) override {
    for (const models::SeqStep& q : seqs) forward(q.ids, *q.state, q.mode, q.logits);
  }
  void reserve_workspace(int64_t, int) override {}
  uint64_t workspace_capacity() const override { return 0; }
  ops::Backend& backend() override { return base_.backend(); }
  int64_t nan_at = -1;

 private:
  models::Model& base_;
  std::vector<int32_t> script_;
  std::vector<float> bump_;
  int64_t prompt_len_;
};

TEST(ServerGenerator, NonFiniteLogitsAreAnErrorNotAToken) {
  engine::LoadedModel l = load_demo();
  std::vector<int32_t> prompt = l.tok->encode("Hello there");
  ScriptModel m(*l.model, {}, {}, static_cast<int64_t>(prompt.size()));
  m.nan_at = 2;  // the third generated token's logits
  engine::Session s(m);
  PromptCache cache(16, 4, nullptr);
  Generator g(s, cache, *l.tok, false);
  GenRequest r;
  r.prompt = prompt;
  r.max_tokens = 10;
  r.sampling.temperature = 0.0f;
  int tokens = 0;
  EXPECT_THROW(g.run(r, [&](const GenEvent& ev) { tokens += static_cast<int>(ev.logprobs.size()); return true; }, nullptr), Error);
  r.logprobs = true;
  try {
    g.run(r, [&](const GenEvent& ev) { tokens += static_cast<int>(ev.logprobs.size()); return true; }, nullptr);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tokens, 2);  // two tokens, then the error: nothing sampled from the NaN logits
}

TEST(ServerGenerator, ToolSyntaxGreedyTakesArgmaxInsideMarkupOnly) {
  engine::LoadedModel l = load_demo();
  const tokenizer::Tokenizer& tok = *l.tok;
  std::vector<int32_t> prompt = tok.encode("Call the tool.");
  // Free text and the argument value are strongly preferred (sampled either way); the markup
  // only weakly (a near-uniform distribution over the vocabulary unless chosen by argmax).
  struct Piece {
    std::string text;
    float bump;
  };
  const std::vector<Piece> pieces = {{"Sure.\n", 60}, {"<tool_call>", 60}, {"\n{\"name\": \"get_weather\", \"arguments\": {\"city\":", 0.5f},
                                     {" \"", 0.5f}, {"Paris", 60}, {"\"", 60}, {"}}\n</tool_call>", 0.5f}};
  std::vector<int32_t> script;
  std::vector<float> bump;
  for (const auto& p : pieces)
    for (int32_t id : tok.encode(p.text)) {
      script.push_back(id);
      bump.push_back(p.bump);
    }
  script.push_back(0);  // eos
  bump.push_back(60);
  auto go = [&](bool greedy) {
    ScriptModel m(*l.model, script, bump, static_cast<int64_t>(prompt.size()));
    engine::Session s(m);
    PromptCache cache(16, 4, nullptr);
    Generator g(s, cache, tok, greedy);
    GenRequest r;
    r.prompt = prompt;
    r.max_tokens = static_cast<int>(script.size());
    r.sampling.temperature = 1.0f;
    r.sampling.top_k = 0;
    r.sampling.top_p = 1.0f;
    r.sampling.min_p = 0.0f;
    r.sampling.seed = 5;
    r.stop_ids = {0};
    r.parser.syntax = ToolSyntax::kQwen3Json;
    return g.run(r, nullptr, nullptr);
  };
  GenResult on = go(true);
  ASSERT_EQ(on.tool_calls.size(), 1u) << on.content;
  EXPECT_EQ(on.tool_calls[0].name, "get_weather");
  EXPECT_EQ(on.tool_calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_EQ(on.content, "Sure.");
  EXPECT_EQ(on.finish_reason, "tool_calls");
  GenResult off = go(false);  // sampling in the markup almost surely breaks it
  EXPECT_TRUE(off.tool_calls.empty() || off.tool_calls[0].arguments != on.tool_calls[0].arguments);
}

// Thinking budget on the demo model with the Qwen3.5 template (thinking on: the prompt ends
// inside `<think>\n`, so every token is reasoning until </think>): after N sampled tokens the
// next ones are exactly "\n</think>\n\n" tokenized, the reasoning is made of those N tokens
// only, and the model goes on with content.
TEST(ServerGenerator, ThinkingBudgetEndsReasoningWithTheFamilyCloser) {
  EngineOptions eo;
  eo.model_name = "demo";
  eo.prefill_step = 64;
  eo.parallel = 0;
  eo.chat_template_file = std::string(SPOOL_TEST_DATA_DIR) + "/tokenizers/qwen3_5/chat_template.jinja";
  eo.reasoning_budget = 3;  // --reasoning-budget: used when a request sets none
  auto e = make_serving_engine(load_demo(), eo);
  const tokenizer::Tokenizer& tok = *e->facts.tok;
  const std::vector<int32_t> close = tok.encode("\n</think>\n\n");
  ASSERT_FALSE(close.empty());
  auto body = [](int budget) {
    nlohmann::ordered_json b;
    b["messages"] = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Tell me about Paris."}])");
    b["chat_template_kwargs"] = {{"enable_thinking", true}};
    b["temperature"] = 1.0;
    b["seed"] = 11;
    b["max_tokens"] = 40;
    b["logprobs"] = true;
    if (budget != -2) b["thinking_budget_tokens"] = budget;
    return b;
  };
  for (int budget : {0, 1, 5, -2 /* the server's default, 3 */}) {
    const int n = budget == -2 ? 3 : budget;
    GenRequest r = parse_chat_request(body(budget), e->facts, 1);
    ASSERT_TRUE(r.parser.starts_in_reasoning);
    ASSERT_EQ(r.reasoning_budget, n);
    GenResult res = e->gen->run(r, nullptr, nullptr);
    std::vector<int32_t> ids;
    for (const auto& t : res.logprobs) ids.push_back(t.id);
    ASSERT_GE(ids.size(), n + close.size()) << "budget " << budget << ": ended before the closer";
    EXPECT_EQ(std::vector<int32_t>(ids.begin() + n, ids.begin() + n + close.size()), close) << "budget " << budget;
    // The reasoning is (the trimmed text of) the N tokens before the closer, nothing more.
    const std::string thought = tok.decode(std::vector<int32_t>(ids.begin(), ids.begin() + n));
    EXPECT_NE(thought.find(res.reasoning), std::string::npos) << "budget " << budget << ": " << res.reasoning;
    if (n == 0) EXPECT_EQ(res.reasoning, "");
    EXPECT_FALSE(res.content.empty() && res.tool_calls.empty()) << "budget " << budget << ": nothing after the reasoning";
    EXPECT_EQ(res.content.find("</think>"), std::string::npos) << res.content;
  }
  {  // A closer token that is also an end-of-generation id (gpt-oss's <|end|> in some GGUFs) is
     // written, not taken as the end: the answer still follows.
    GenRequest r = parse_chat_request(body(2), e->facts, 1);
    r.stop_ids.push_back(close.front());
    GenResult res = e->gen->run(r, nullptr, nullptr);
    std::vector<int32_t> ids;
    for (const auto& t : res.logprobs) ids.push_back(t.id);
    ASSERT_GE(ids.size(), 2 + close.size()) << "stopped at the forced closer";
    EXPECT_FALSE(res.content.empty() && res.tool_calls.empty()) << "nothing after the forced closer";
  }
  // Unlimited (-1): no closer is forced within max_tokens.
  GenRequest r = parse_chat_request(body(-1), e->facts, 1);
  GenResult res = e->gen->run(r, nullptr, nullptr);
  EXPECT_EQ(res.content, "") << "the demo model does not close <think> by itself within 40 tokens";
  EXPECT_FALSE(res.reasoning.empty());
}

}  // namespace
}  // namespace spool::server
