// Batched forward == each sequence alone: several sequences with mixed prompt lengths (some
// sharing a prefix) run through Model::forward_batch with continuous-batching schedules
// (prefill chunks of one sequence beside decode tokens of others, sequences joining and
// leaving), against each run alone with forward(). Greedy ids exact, logits within 1e-4 of
// max|logit| per row; resident and streaming (zero cache budget); every fixture family.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "support/golden.h"
#include "support/load.h"
#include "common/error.h"
#include "engine/loader.h"

namespace spool::engine {
namespace {

using spool::testing::argmax;
using spool::testing::data_dir;

constexpr double kTol = 1e-4;

struct SeqSpec {
  std::vector<int32_t> prompt;
  int n_new;      // greedy tokens to generate
  int join_step;  // first step the sequence takes part in
};

struct Trace {
  std::vector<int32_t> ids;                  // generated ids
  std::vector<std::vector<float>> logits;    // logits before each generated id
};

LoadedModel load_model(const std::string& dir, bool stream) { return load(spool::testing::test_load_options(dir, stream)); }

// One sequence alone: prefill in chunks of `step`, then greedy decode.
Trace run_alone(models::Model& m, const SeqSpec& q, int64_t step) {
  const int64_t V = m.spec().vocab_size;
  models::State st = m.new_state();
  std::vector<float> logits(V);
  for (size_t i = 0; i < q.prompt.size(); i += step) {
    const size_t n = std::min<size_t>(step, q.prompt.size() - i);
    m.forward(std::span<const int32_t>(q.prompt.data() + i, n), st, models::LogitsMode::kLast, logits.data());
  }
  Trace tr;
  for (int k = 0; k < q.n_new; ++k) {
    tr.logits.push_back(logits);
    const int32_t id = argmax(logits.data(), V);
    tr.ids.push_back(id);
    if (k + 1 < q.n_new) m.forward(std::span<const int32_t>(&id, 1), st, models::LogitsMode::kLast, logits.data());
  }
  return tr;
}

// All sequences through forward_batch. Each step: every decoding sequence's next token, plus
// the next prefill chunk (up to `step` tokens) of at most `prefills_per_step` prefilling
// sequences (the server's schedule: decode never waits behind a long prompt for more than one
// chunk). Sequences join at their join_step and leave when done.
std::vector<Trace> run_batched(models::Model& m, const std::vector<SeqSpec>& seqs, int64_t step, int prefills_per_step,
                               int* max_rows_seen = nullptr) {
  const int64_t V = m.spec().vocab_size;
  const size_t n = seqs.size();
  std::vector<models::State> st;
  for (size_t i = 0; i < n; ++i) st.push_back(m.new_state());
  std::vector<size_t> fed(n, 0);  // prompt tokens fed
  std::vector<std::vector<float>> logits(n, std::vector<float>(V));
  std::vector<Trace> tr(n);
  std::vector<int32_t> next(n, -1);
  int max_rows = 0;
  for (int s = 0;; ++s) {
    std::vector<models::SeqStep> batch;
    std::vector<size_t> who;
    int prefills = 0;
    bool pending = false;
    for (size_t i = 0; i < n; ++i) {
      const SeqSpec& q = seqs[i];
      if (static_cast<int>(tr[i].ids.size()) == q.n_new) continue;  // done
      pending = true;
      if (s < q.join_step) continue;
      if (fed[i] < q.prompt.size()) {
        if (prefills == prefills_per_step) continue;
        ++prefills;
        const size_t k = std::min<size_t>(step, q.prompt.size() - fed[i]);
        batch.push_back({std::span<const int32_t>(q.prompt.data() + fed[i], k), &st[i], models::LogitsMode::kLast, logits[i].data()});
        fed[i] += k;
      } else {
        batch.push_back({std::span<const int32_t>(&next[i], 1), &st[i], models::LogitsMode::kLast, logits[i].data()});
      }
      who.push_back(i);
    }
    if (!pending) break;
    if (batch.empty()) continue;
    int rows = 0;
    for (const auto& b : batch) rows += static_cast<int>(b.ids.size());
    max_rows = std::max(max_rows, rows);
    m.forward_batch(batch);
    for (size_t i : who) {
      if (fed[i] < seqs[i].prompt.size()) continue;  // mid-prompt: no token yet
      tr[i].logits.push_back(logits[i]);
      next[i] = argmax(logits[i].data(), V);
      tr[i].ids.push_back(next[i]);
    }
  }
  if (max_rows_seen) *max_rows_seen = max_rows;
  return tr;
}

std::vector<SeqSpec> mixed_sequences(int64_t vocab) {
  // Mixed lengths; 0/1/2 share a 24-token prefix; 3 is unrelated; 4 is 1 token; 5-7 join late.
  auto ids = [&](int n, int seed) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back(static_cast<int32_t>((seed * 7919 + i * 104729) % (vocab - 2) + 1));
    return v;
  };
  std::vector<int32_t> shared = ids(24, 1);
  auto with_prefix = [&](int extra, int seed) {
    std::vector<int32_t> v = shared;
    for (int32_t x : ids(extra, seed)) v.push_back(x);
    return v;
  };
  return {
      {with_prefix(5, 2), 6, 0}, {with_prefix(31, 3), 4, 0}, {shared, 5, 1},   {ids(70, 4), 5, 0},
      {ids(1, 5), 7, 0},         {ids(13, 6), 3, 2},         {with_prefix(2, 7), 4, 4}, {ids(40, 8), 2, 6},
  };
}

void expect_same(const std::vector<Trace>& got, const std::vector<Trace>& want, int64_t V, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(what + ", sequence " + std::to_string(i));
    EXPECT_EQ(got[i].ids, want[i].ids);
    ASSERT_EQ(got[i].logits.size(), want[i].logits.size());
    for (size_t k = 0; k < got[i].logits.size(); ++k)
      spool::testing::expect_rows_close(got[i].logits[k].data(), want[i].logits[k].data(), 1, V, kTol, what);
  }
}

class BatchEqualsAlone : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(BatchEqualsAlone, GreedyIdsAndLogits) {
  const auto& [name, stream] = GetParam();
  const std::string dir = name == "demo" ? std::string(SPOOL_DEFAULT_MODEL_DIR) : data_dir() + "/models/" + name;
  LoadedModel l = load_model(dir, stream);
  models::Model& m = *l.model;
  const int64_t V = m.spec().vocab_size;
  const std::vector<SeqSpec> seqs = mixed_sequences(V);
  for (int64_t step : {16, 512}) {
    SCOPED_TRACE("prefill step " + std::to_string(step));
    std::vector<Trace> alone;
    for (const SeqSpec& q : seqs) alone.push_back(run_alone(m, q, step));
    int rows = 0;
    expect_same(run_batched(m, seqs, step, 1, &rows), alone, V, "one prefill per step");
    EXPECT_GT(rows, 1);  // sequences really shared steps
    expect_same(run_batched(m, seqs, step, 8), alone, V, "all prefills together");
  }
}

INSTANTIATE_TEST_SUITE_P(Families, BatchEqualsAlone,
                         ::testing::Combine(::testing::Values("qwen3_moe", "qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe_vl_fused", "demo",
                                                              "mixtral", "olmoe", "deepseek_v3", "deepseek_v3_kimi", "deepseek_v2_lite",
                                                              "glm4_moe", "glm4_moe_lite", "minimax_m2",
                                                              "gpt_oss", "gpt_oss_mxfp4", "ernie4_5_moe", "gemma4_text_moe"),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_streaming" : "_resident");
                         });

TEST(BatchForward, SharedExpertsAreAcquiredOnce) {
  LoadedModel l = load_model(SPOOL_DEFAULT_MODEL_DIR, true);
  models::Model& m = *l.model;
  // Experts routed per layer by each sequence alone vs by the batch: the batch reads the union.
  std::vector<std::set<int>> per_layer(m.spec().n_layers);
  int64_t routed = 0;
  m.hooks.on_route = [&](int layer, int64_t, std::span<const int> e, std::span<const float>) {
    per_layer[layer].insert(e.begin(), e.end());
    routed += static_cast<int64_t>(e.size());
  };
  const std::vector<int32_t> a = {10, 20, 30}, b = {10, 20, 31}, c = {500, 600, 700};
  std::vector<models::State> st = {m.new_state(), m.new_state(), m.new_state()};
  std::vector<float> la(m.spec().vocab_size), lb(la.size()), lc(la.size());
  const models::SeqStep batch[] = {{a, &st[0], models::LogitsMode::kLast, la.data()},
                                   {b, &st[1], models::LogitsMode::kLast, lb.data()},
                                   {c, &st[2], models::LogitsMode::kLast, lc.data()}};
  const auto before = l.streaming->stats();
  m.forward_batch(batch);
  const auto after = l.streaming->stats();
  int64_t distinct = 0;
  for (const auto& s : per_layer) distinct += static_cast<int64_t>(s.size());
  EXPECT_EQ(routed, 9 * m.spec().n_layers * m.spec().moe.top_k);
  // With a zero budget every acquisition is a read: exactly one per distinct (layer, expert).
  EXPECT_EQ(static_cast<int64_t>(after.requests - before.requests), distinct);
  EXPECT_LT(distinct, routed);
}

// A decode step of several sequences with streamed experts runs as two pipelined groups (each
// group's expert reads overlap the other's compute). An expert both groups route to is read
// from disk once: the second group finds it in the cache. Same logits as the unpipelined step
// (hooks turn pipelining off, so the hooked run below is the one-group step).
TEST(BatchForward, PipelinedGroupsReadEachExpertOnce) {
  LoadOptions o;
  o.model_dir = SPOOL_DEFAULT_MODEL_DIR;
  o.threads = 2;
  o.stream = true;
  o.cache_budget = "1";  // 1 GB holds every expert of the demo: a miss is a first read
  LoadedModel hooked = load(o), piped = load(o);
  const int64_t V = hooked.model->spec().vocab_size;
  std::set<std::pair<int, int>> distinct;
  hooked.model->hooks.on_route = [&](int layer, int64_t, std::span<const int> e, std::span<const float>) {
    for (int x : e) distinct.insert({layer, x});
  };
  const std::vector<std::vector<int32_t>> prompts = {{10}, {11}, {500}, {10}};
  auto step = [&](LoadedModel& l) {
    std::vector<models::State> st;
    for (size_t i = 0; i < prompts.size(); ++i) st.push_back(l.model->new_state());
    std::vector<std::vector<float>> logits(prompts.size(), std::vector<float>(V));
    std::vector<models::SeqStep> batch;
    for (size_t i = 0; i < prompts.size(); ++i) batch.push_back({prompts[i], &st[i], models::LogitsMode::kLast, logits[i].data()});
    l.model->forward_batch(batch);
    return logits;
  };
  const auto want = step(hooked);
  const auto got = step(piped);
  const auto s = piped.streaming->stats();
  EXPECT_EQ(static_cast<int64_t>(s.misses), static_cast<int64_t>(distinct.size()));
  EXPECT_EQ(s.bytes_read, hooked.streaming->stats().bytes_read);
  // Sequences 0 and 3 (one per group) route alike: the second group's request is a cache hit.
  EXPECT_GT(s.hits, 0u);
  for (size_t i = 0; i < prompts.size(); ++i)
    spool::testing::expect_rows_close(got[i].data(), want[i].data(), 1, V, kTol, "sequence " + std::to_string(i));
}

TEST(BatchForward, BadIdLeavesEveryStateUntouched) {
  LoadedModel l = load_model(SPOOL_DEFAULT_MODEL_DIR, false);
  models::Model& m = *l.model;
  std::vector<models::State> st = {m.new_state(), m.new_state()};
  std::vector<float> la(m.spec().vocab_size), lb(la.size());
  const std::vector<int32_t> ok = {1, 2}, bad = {3, static_cast<int32_t>(m.spec().vocab_size)};
  const models::SeqStep batch[] = {{ok, &st[0], models::LogitsMode::kLast, la.data()}, {bad, &st[1], models::LogitsMode::kLast, lb.data()}};
  EXPECT_THROW(m.forward_batch(batch), spool::Error);
  EXPECT_EQ(st[0].pos, 0);
  EXPECT_EQ(st[1].pos, 0);
  EXPECT_FALSE(st[0].poisoned);
  const models::SeqStep twice[] = {{ok, &st[0], models::LogitsMode::kLast, la.data()}, {ok, &st[0], models::LogitsMode::kLast, lb.data()}};
  EXPECT_THROW(m.forward_batch(twice), spool::Error);
}

}  // namespace
}  // namespace spool::engine
