// The batched serving engine (BatchEngine, `spool serve --parallel N`) on the demo model: up to
// 8 concurrent requests with mixed prompt lengths (some sharing a prefix) give each the greedy
// ids of a run alone and logprobs within 1e-4, resident and streaming (zero cache budget), the
// second time with prompt-cache hits; stop strings and a cancellation mid-batch leave the
// others unchanged; non-finite logits fail one request only; requests beyond N wait in FIFO
// order and never more than N run; the step counters add up (token rows, expert acquisitions
// = disk reads with a zero budget, savings > 0).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "support/load.h"
#include "common/error.h"
#include "engine/loader.h"
#include "server/batch_engine.h"
#include "plan/projection.h"
#include "server/serving_engine.h"

namespace spool::server {
namespace {

constexpr double kTol = 1e-4;
constexpr int kWaitMs = 120000;  // deadline of any one wait for a message (a hang fails, not a clock)

std::unique_ptr<ServingEngine> make_engine(int parallel, bool stream, int64_t step = 16, size_t checkpoints = 16,
                                           engine::SpecParams spec = {}) {
  engine::LoadOptions o = spool::testing::test_load_options(SPOOL_DEFAULT_MODEL_DIR, stream);
  o.mtp = spec.mtp;
  o.parallel = std::max(parallel, 1);
  o.prefill_step = step;
  EngineOptions eo;
  eo.model_name = "demo";
  eo.prefill_step = step;
  eo.cache_checkpoints = checkpoints;
  eo.parallel = parallel;
  eo.spec = spec;
  return make_serving_engine(engine::load(o), eo);
}

const std::string kText =
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my purse, and nothing "
    "particular to interest me on shore, I thought I would sail about a little and see the watery part of the world.";

GenRequest request(const ServingEngine& e, const std::string& text, int max_tokens) {
  GenRequest r;
  r.chat = false;
  r.prompt = e.facts.tok->encode(text);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.stop_ids = e.facts.stop_ids;
  r.parser.parse_reasoning = false;
  r.logprobs = true;
  r.top_logprobs = 2;
  return r;
}

// Mixed lengths: three share a long prefix (beyond two chunks of 16), one is a single word,
// others unrelated; max_tokens differ so requests leave the batch at different steps.
std::vector<GenRequest> mixed(const ServingEngine& e) {
  std::vector<GenRequest> v;
  v.push_back(request(e, kText, 12));
  v.push_back(request(e, kText.substr(0, 120) + " The sea was calm", 9));
  v.push_back(request(e, kText.substr(0, 120) + " In the morning the captain said", 14));
  v.push_back(request(e, "Whales", 7));
  v.push_back(request(e, "The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat by the door.", 10));
  v.push_back(request(e, kText.substr(0, 60), 5));
  v.push_back(request(e, "Once upon a time", 11));
  v.push_back(request(e, "A list of numbers: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21", 8));
  return v;
}

std::vector<int32_t> ids_of(const GenResult& r) {
  std::vector<int32_t> ids;
  for (const auto& t : r.logprobs) ids.push_back(t.id);
  return ids;
}

// A request run alone (Generator on the engine's own Session; the BatchEngine idle).
GenResult alone(ServingEngine& e, const GenRequest& r) { return e.gen->run(r, nullptr, nullptr); }

struct Got {
  std::vector<GenMessage> msgs;  // everything received, in order
  const GenMessage& last() const { return msgs.back(); }
  std::string streamed;          // concatenated event content
};

// Reads `t` to its end (kDone / kFailed); fails the test on the deadline.
Got drain(GenTicket& t) {
  Got g;
  for (;;) {
    GenMessage m;
    if (!t.next(m, kWaitMs)) {
      ADD_FAILURE() << "no message within the deadline";
      return g;
    }
    if (m.kind == GenMessage::kEvent) g.streamed += m.event.delta.content;
    const bool end = m.kind == GenMessage::kDone || m.kind == GenMessage::kFailed;
    g.msgs.push_back(std::move(m));
    if (end) return g;
  }
}

void expect_same(const GenResult& got, const GenResult& want, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(ids_of(got), ids_of(want));
  EXPECT_EQ(got.content, want.content);
  EXPECT_EQ(got.finish_reason, want.finish_reason);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t k = 0; k < got.logprobs.size(); ++k) {
    EXPECT_NEAR(got.logprobs[k].logprob, want.logprobs[k].logprob, kTol) << "token " << k;
    ASSERT_EQ(got.logprobs[k].top.size(), want.logprobs[k].top.size());
    for (size_t j = 0; j < got.logprobs[k].top.size(); ++j) {
      EXPECT_EQ(got.logprobs[k].top[j].first, want.logprobs[k].top[j].first) << "token " << k;
      EXPECT_NEAR(got.logprobs[k].top[j].second, want.logprobs[k].top[j].second, kTol) << "token " << k;
    }
  }
}

// Submits every request of `reqs` to the batch at once (token events for the even ones), then
// drains them in order: each must finish (kDone; a fatal failure otherwise, which ends the drain)
// with the output of its run alone `ref[i]` (expect_same), and where it streamed, its deltas must
// add up to its content. `got[i]` is what request i received.
void run_batched(ServingEngine& e, const std::vector<GenRequest>& reqs, const std::vector<GenResult>& ref,
                 std::vector<Got>& got) {
  std::vector<std::shared_ptr<GenTicket>> tickets;
  for (size_t i = 0; i < reqs.size(); ++i)
    tickets.push_back(e.batch->submit(std::make_shared<const GenRequest>(reqs[i]), /*events=*/i % 2 == 0));
  got.clear();
  for (size_t i = 0; i < reqs.size(); ++i) {
    got.push_back(drain(*tickets[i]));
    const Got& g = got.back();
    ASSERT_FALSE(g.msgs.empty());
    ASSERT_EQ(g.last().kind, GenMessage::kDone) << g.last().error;
    const GenResult& r = g.last().result;
    expect_same(r, ref[i], "request " + std::to_string(i));
    if (i % 2 == 0) EXPECT_EQ(g.streamed, r.content) << "request " << i;
  }
}

class BatchedEqualsAlone : public ::testing::TestWithParam<bool> {};

TEST_P(BatchedEqualsAlone, EightConcurrentRequestsTwice) {
  const bool stream = GetParam();
  auto e = make_engine(8, stream);
  const std::vector<GenRequest> reqs = mixed(*e);
  std::vector<GenResult> ref;
  for (const GenRequest& r : reqs) ref.push_back(alone(*e, r));
  const auto exp0 = e->loaded.streaming ? e->loaded.streaming->stats() : experts::StreamingStats{};
  const BatchStats s0 = e->batch->stats();
  int64_t rows_expected = 0;
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "first round (cold slots)" : "second round (prompt-cache hits)");
    std::vector<Got> got;
    ASSERT_NO_FATAL_FAILURE(run_batched(*e, reqs, ref, got));
    int64_t cached = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const GenResult& r = got[i].last().result;
      if (i % 2 == 1) EXPECT_TRUE(got[i].streamed.empty());
      cached += r.cached_tokens;
      rows_expected += r.prompt_tokens - r.cached_tokens + r.completion_tokens - 1;
    }
    if (round == 0) EXPECT_EQ(cached, 0);
    else EXPECT_GT(cached, 100);  // the same prompts again: slots restore their checkpoints
  }
  // Counters: every computed prompt token and every fed decode token is one row of a step.
  const BatchStats s1 = e->batch->stats();
  EXPECT_EQ(static_cast<int64_t>(s1.step_tokens - s0.step_tokens), rows_expected);
  EXPECT_GT(s1.step_seqs - s0.step_seqs, s1.steps - s0.steps);  // sequences shared steps
  EXPECT_EQ(s1.tokens_le.back() - s0.tokens_le.back(), s1.steps - s0.steps);
  EXPECT_LT(s1.expert_acquisitions, s1.expert_acquisitions_alone);  // shared experts were acquired once
  EXPECT_EQ(s1.busy, 0);
  EXPECT_EQ(s1.waiting, 0);
  if (stream) {
    // A zero budget reads every acquisition: exactly one read per distinct (layer, expert) of a step.
    const auto exp1 = e->loaded.streaming->stats();
    EXPECT_EQ(exp1.requests - exp0.requests, s1.expert_acquisitions - s0.expert_acquisitions);
  }
}

INSTANTIATE_TEST_SUITE_P(Demo, BatchedEqualsAlone, ::testing::Bool(),
                         [](const auto& info) { return info.param ? std::string("streaming") : std::string("resident"); });

// --spec mtp: each decoding slot's row is its token and the head's drafts, verified in the
// batched step; the output of every request is that of a plain run alone (greedy ids, content,
// logprobs), in both rounds (the second restores prompt-cache checkpoints, where the head
// continues from the reused prefix), resident and streaming.
TEST_P(BatchedEqualsAlone, SpeculativeMtpKeepsEveryRequestsOutput) {
  const bool stream = GetParam();
  engine::SpecParams spec;
  spec.mtp = true;
  spec.draft_max = 2;
  spec.min_acceptance = 0;
  auto e = make_engine(4, stream, 16, 16, spec);
  const std::vector<GenRequest> reqs = mixed(*e);
  std::vector<GenResult> ref;
  for (const GenRequest& r : reqs) ref.push_back(alone(*e, r));  // the Generator: plain decoding
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "first round (cold slots)" : "second round (prompt-cache hits)");
    const BatchStats s0 = e->batch->stats();
    std::vector<Got> got;
    ASSERT_NO_FATAL_FAILURE(run_batched(*e, reqs, ref, got));
    int64_t fed = 0;
    for (const Got& g : got) fed += g.last().result.completion_tokens - 1;
    const BatchStats s1 = e->batch->stats();
    EXPECT_GT(s1.spec_steps, s0.spec_steps);
    EXPECT_GT(s1.spec_accepted, s0.spec_accepted);  // the trained head gets drafts right
    EXPECT_LT(s1.spec_accepted - s0.spec_accepted, s1.spec_drafted - s0.spec_drafted);
    EXPECT_LE(static_cast<int64_t>(s1.spec_steps - s0.spec_steps), fed);  // a verify row feeds >= 1 token
    EXPECT_EQ(s1.busy, 0);
  }
  EXPECT_THROW(make_engine(1, false, 16, 16, [] {
                 engine::SpecParams p;
                 p.mtp = true;
                 p.draft_max = 0;
                 return p;
               }()),
               UsageError);
}

TEST(BatchEngine, StopStringAndCancellationMidBatchLeaveTheOthersUnchanged) {
  auto e = make_engine(4, false);
  std::vector<GenRequest> reqs = mixed(*e);
  reqs.resize(4);
  for (auto& r : reqs) {
    r.max_tokens = 30;
    r.stop_ids.clear();  // run to max_tokens (or the stop string)
  }
  std::vector<GenResult> ref;
  for (const GenRequest& r : reqs) ref.push_back(alone(*e, r));
  // Request 1 stops at a string cut out of its own output; request 2 is cancelled after its
  // third event.
  GenRequest stopped = reqs[1];
  const std::string text = ref[1].content;
  ASSERT_GT(text.size(), 12u);
  const std::string stop = text.substr(text.size() / 2, 3);
  stopped.parser.stop = {stop};
  const GenResult ref_stop = alone(*e, stopped);
  ASSERT_EQ(ref_stop.finish_reason, "stop");
  ASSERT_LT(ref_stop.completion_tokens, 30);
  auto t0 = e->batch->submit(std::make_shared<const GenRequest>(reqs[0]), true);
  auto t1 = e->batch->submit(std::make_shared<const GenRequest>(stopped), true);
  auto t2 = e->batch->submit(std::make_shared<const GenRequest>(reqs[2]), true);
  auto t3 = e->batch->submit(std::make_shared<const GenRequest>(reqs[3]), false);
  int events = 0;
  GenMessage m;
  bool cancelled_result = false;
  for (;;) {
    ASSERT_TRUE(t2->next(m, kWaitMs)) << "no message within the deadline";
    if (m.kind == GenMessage::kEvent && ++events == 3) e->batch->cancel(t2);
    if (m.kind == GenMessage::kDone) {
      cancelled_result = m.result.cancelled;
      break;
    }
    ASSERT_NE(m.kind, GenMessage::kFailed) << m.error;
  }
  EXPECT_TRUE(cancelled_result);
  EXPECT_LT(m.result.completion_tokens, 30);
  Got g0 = drain(*t0), g1 = drain(*t1), g3 = drain(*t3);
  ASSERT_EQ(g0.last().kind, GenMessage::kDone);
  ASSERT_EQ(g1.last().kind, GenMessage::kDone);
  ASSERT_EQ(g3.last().kind, GenMessage::kDone);
  expect_same(g0.last().result, ref[0], "request 0");
  expect_same(g1.last().result, ref_stop, "request 1 (stop string)");
  EXPECT_EQ(g1.streamed, g1.last().result.content);
  EXPECT_EQ(g1.last().result.content, text.substr(0, text.find(stop)));
  expect_same(g3.last().result, ref[3], "request 3");
}

// Forwards to the demo model; a sequence whose prompt starts with `marker` gets NaN logits
// from its `nan_after`-th logits row on.
class NanModel : public models::Model {
 public:
  NanModel(models::Model& base, int32_t marker, int nan_after) : base_(base), marker_(marker), nan_after_(nan_after) {}
  const models::ModelSpec& spec() const override { return base_.spec(); }
  models::State new_state() const override { return base_.new_state(); }
  void set_kv_type(ops::KvType t) override { base_.set_kv_type(t); }
  void forward(std::span<const int32_t> ids, models::State& st, models::LogitsMode mode, float* logits) override {
    const models::SeqStep one{ids, &st, mode, logits};
    forward_batch(std::span<const models::SeqStep>(&one, 1));
  }
  void forward_batch(std::span<const models::SeqStep> seqs) override {
    for (const auto& q : seqs)
      if (q.state->pos == 0) marked_[q.state] = !q.ids.empty() && q.ids[0] == marker_ ? 0 : -1;
    base_.forward_batch(seqs);
    for (const auto& q : seqs) {
      auto it = marked_.find(q.state);
      if (it == marked_.end() || it->second < 0 || q.mode != models::LogitsMode::kLast) continue;
      if (it->second++ >= nan_after_) q.logits[3] = std::nanf("");
    }
  }
  void set_max_active_experts(int k) override { base_.set_max_active_experts(k); }
  void set_expert_provider(std::shared_ptr<experts::ExpertProvider> p) override { base_.set_expert_provider(std::move(p)); }
  experts::ExpertProvider& expert_provider() override { return base_.expert_provider(); }
  std::shared_ptr<experts::ExpertProvider> shared_expert_provider() override { return base_.shared_expert_provider(); }
  void reserve_workspace(int64_t t, int s) override { base_.reserve_workspace(t, s); }
  uint64_t workspace_capacity() const override { return base_.workspace_capacity(); }
  ops::Backend& backend() override { return base_.backend(); }

 private:
  models::Model& base_;
  int32_t marker_;
  int nan_after_;
  std::map<const models::State*, int> marked_;
};

TEST(BatchEngine, NonFiniteLogitsFailOneRequestOnly) {
  auto e = make_engine(0, false);  // no BatchEngine of its own: one is made over NanModel below
  const std::vector<GenRequest> reqs = mixed(*e);
  std::vector<GenResult> ref;
  for (size_t i = 0; i < 3; ++i) ref.push_back(alone(*e, reqs[i]));
  GenRequest bad = request(*e, "Whales are large", 10);
  NanModel nm(*e->loaded.model, bad.prompt[0], 2);
  for (size_t i = 0; i < 3; ++i) ASSERT_NE(reqs[i].prompt[0], bad.prompt[0]);
  BatchOptions bo;
  bo.parallel = 4;
  bo.prefill_step = 16;
  {
    BatchEngine be(nm, *e->facts.tok, bo);
    std::vector<std::shared_ptr<GenTicket>> t;
    for (size_t i = 0; i < 3; ++i) t.push_back(be.submit(std::make_shared<const GenRequest>(reqs[i]), false));
    auto tb = be.submit(std::make_shared<const GenRequest>(bad), true);
    Got gb = drain(*tb);
    ASSERT_EQ(gb.last().kind, GenMessage::kFailed);
    EXPECT_EQ(gb.last().status, 500);
    EXPECT_NE(gb.last().error.find("non-finite"), std::string::npos) << gb.last().error;
    int tokens = 0;
    for (const auto& m : gb.msgs) tokens += static_cast<int>(m.event.logprobs.size());
    EXPECT_EQ(tokens, 2);  // two tokens, then the error: nothing sampled from the NaN logits
    for (size_t i = 0; i < 3; ++i) {
      Got g = drain(*t[i]);
      ASSERT_EQ(g.last().kind, GenMessage::kDone) << g.last().error;
      expect_same(g.last().result, ref[i], "request " + std::to_string(i));
    }
  }
}

TEST(BatchEngine, RequestsBeyondNWaitInFifoOrderAndAtMostNRun) {
  auto e = make_engine(2, false);
  std::vector<GenRequest> reqs = mixed(*e);
  std::vector<GenResult> ref;
  for (const GenRequest& r : reqs) ref.push_back(alone(*e, r));
  std::vector<std::shared_ptr<GenTicket>> t;
  for (const GenRequest& r : reqs) t.push_back(e->batch->submit(std::make_shared<const GenRequest>(r), false));
  std::vector<uint64_t> started, ended;
  for (size_t i = 0; i < reqs.size(); ++i) {
    Got g = drain(*t[i]);
    ASSERT_EQ(g.msgs.size(), 2u);
    ASSERT_EQ(g.msgs[0].kind, GenMessage::kStarted);
    ASSERT_EQ(g.msgs[1].kind, GenMessage::kDone);
    started.push_back(g.msgs[0].order);
    ended.push_back(g.msgs[1].order);
    expect_same(g.msgs[1].result, ref[i], "request " + std::to_string(i));
  }
  for (size_t i = 1; i < started.size(); ++i) EXPECT_LT(started[i - 1], started[i]) << "admitted out of order";
  // When request k (k >= 2) was admitted, at least k - 1 requests had ended: never more than 2 ran.
  for (size_t k = 2; k < started.size(); ++k) {
    size_t done_before = 0;
    for (uint64_t x : ended) done_before += x < started[k];
    EXPECT_GE(done_before, k - 1) << "request " << k;
  }
  // A queued request cancelled before a slot frees never starts.
  GenRequest long_one = reqs[0];
  long_one.max_tokens = 200;
  long_one.stop_ids.clear();
  auto a = e->batch->submit(std::make_shared<const GenRequest>(long_one), false);
  auto b = e->batch->submit(std::make_shared<const GenRequest>(long_one), false);
  auto c = e->batch->submit(std::make_shared<const GenRequest>(reqs[1]), false);
  GenMessage m;
  ASSERT_TRUE(a->next(m, kWaitMs));
  ASSERT_TRUE(b->next(m, kWaitMs));  // both slots taken
  e->batch->cancel(c);
  EXPECT_FALSE(c->next(m, 0));
  EXPECT_EQ(e->batch->stats().waiting, 0);
  e->batch->cancel(a);
  e->batch->cancel(b);
  EXPECT_TRUE(drain(*a).last().result.cancelled);
  EXPECT_TRUE(drain(*b).last().result.cancelled);
  EXPECT_FALSE(c->next(m, 0));
}

TEST(BatchEngine, BadRequestValuesFailWith400) {
  auto e = make_engine(2, false);
  GenRequest r = request(*e, "Whales", 4);
  r.prompt.push_back(static_cast<int32_t>(e->facts.vocab_size));  // outside the vocabulary
  Got g = drain(*e->batch->submit(std::make_shared<const GenRequest>(r), false));
  ASSERT_EQ(g.last().kind, GenMessage::kFailed);
  EXPECT_NE(g.last().error.find("outside the vocabulary"), std::string::npos) << g.last().error;
  GenRequest ok = request(*e, "Whales", 4);
  Got g2 = drain(*e->batch->submit(std::make_shared<const GenRequest>(ok), false));
  ASSERT_EQ(g2.last().kind, GenMessage::kDone);
}

// The route observer installed before the engine (the loader's --expert-profile recorder) keeps
// seeing every row of every step: the engine calls it before its own, and puts it back when it
// goes.
TEST(BatchEngine, CallsTheRouteObserverInstalledBeforeIt) {
  engine::LoadOptions o = spool::testing::test_load_options(SPOOL_DEFAULT_MODEL_DIR, false);
  o.prefill_step = 16;
  engine::LoadedModel l = engine::load(o);
  models::Model& m = *l.model;
  int64_t calls = 0;
  m.hooks.on_route = [&](int, int64_t, std::span<const int>, std::span<const float>) { ++calls; };
  m.hooks.on_route_any_order = true;
  EngineOptions eo;
  eo.model_name = "demo";
  eo.prefill_step = 16;
  eo.parallel = 2;
  auto e = make_serving_engine(std::move(l), eo);
  GenRequest r = request(*e, kText.substr(0, 60), 5);
  const int64_t prompt = static_cast<int64_t>(r.prompt.size());
  Got g = drain(*e->batch->submit(std::make_shared<const GenRequest>(r), false));
  ASSERT_EQ(g.last().kind, GenMessage::kDone);
  // Every prompt token and every generated token but the last went through the 8 MoE layers.
  const int64_t generated = static_cast<int64_t>(ids_of(g.last().result).size());
  ASSERT_GT(generated, 0);
  EXPECT_EQ(calls, (prompt + generated - 1) * 8);
  EXPECT_FALSE(e->loaded.model->hooks.on_route_any_order);  // the engine's own observer is not order-free
  e->batch.reset();
  EXPECT_TRUE(e->loaded.model->hooks.on_route_any_order);
  const int64_t before = calls;
  e->loaded.model->hooks.on_route(0, 0, {}, {});
  EXPECT_EQ(calls, before + 1);
}

// The loader's memory decision and the planner's projection count every slot the same way:
// N x (KV + recurrent state) and the workspace of a step of prefill_step + N - 1 rows over N
// sequences, which is also what the model's arena is sized to.
TEST(BatchMemory, LoaderAndPlanCountEverySlot) {
  engine::LoadOptions o;
  o.model_dir = SPOOL_DEFAULT_MODEL_DIR;
  o.threads = 2;
  o.ctx_size = 512;
  o.prefill_step = 16;
  engine::LoadedModel one = engine::load(o);
  o.parallel = 4;
  engine::LoadedModel four = engine::load(o);
  const models::ModelSpec& spec = four.model->spec();
  const plan::StateBytes st = plan::state_bytes(spec, plan::kv_capacities(spec, 512, 512, 16), 32);
  EXPECT_EQ(four.memory.base.state - one.memory.base.state, 3 * (st.kv + st.recurrent));
  EXPECT_GE(four.memory.base.workspace - one.memory.base.workspace,
            models::workspace_arena_bytes(spec, 19, 4) - models::workspace_arena_bytes(spec, 16, 1));
  EXPECT_EQ(four.model->workspace_capacity(), models::workspace_arena_bytes(spec, 19, 4));
  plan::RunShape sh;
  sh.ctx = 512;
  sh.prefill_step = 16;
  sh.parallel = 4;
  sh.threads = 2;
  const plan::BaseNeeds b = plan::base_needs(plan::weight_bytes(*four.ckpt, spec), spec, sh);
  EXPECT_EQ(b.state, four.memory.base.state);
  EXPECT_EQ(b.workspace, four.memory.base.workspace);
  EXPECT_EQ(four.memory.parallel, 4);
  // The serving engine over it keeps that arena (no larger step is ever run).
  EngineOptions eo;
  eo.prefill_step = 16;
  eo.ctx_size = 512;
  eo.parallel = 4;
  auto e = make_serving_engine(std::move(four), eo);
  EXPECT_EQ(e->loaded.model->workspace_capacity(), models::workspace_arena_bytes(spec, 19, 4));
}

}  // namespace
}  // namespace spool::server
