// Routing traces: file round trip and errors, the map onto another shape, forced routing
// (the experts a model fetches are the trace's), and the cache simulation of `spool plan
// --trace` (a hand-computed LRU case; the streaming cache's own counters on a model).
#include "experts/routing_trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "common/error.h"
#include "common/splitmix.h"
#include "experts/cache_sim.h"
#include "experts/streaming.h"
#include "models/family.h"
#include "models/model.h"
#include "support/golden.h"

namespace spool::experts {
namespace {

namespace fs = std::filesystem;

std::string tmp_path(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("spool_trace_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

TraceShape shape_of(std::vector<int> moe_layers, int n_layers, int n_experts, int top_k) {
  TraceShape s;
  s.model_type = "test";
  s.n_layers = n_layers;
  s.moe_layers = std::move(moe_layers);
  s.n_experts = n_experts;
  s.top_k = top_k;
  s.source = "calibrate";
  return s;
}

// A skewed in-memory trace: expert e of a layer is chosen with weight ~ 1 / (e + 1) (distinct
// per token), from a fixed seed.
Trace skewed_trace(int n_moe, int n_experts, int top_k, int64_t tokens, uint64_t seed) {
  Trace t;
  t.shape = shape_of({}, n_moe, n_experts, top_k);
  for (int l = 0; l < n_moe; ++l) t.shape.moe_layers.push_back(l);
  t.n_tokens = tokens;
  double total = 0;
  for (int e = 0; e < n_experts; ++e) total += 1.0 / (e + 1);
  for (int64_t tok = 0; tok < tokens; ++tok)
    for (int l = 0; l < n_moe; ++l) {
      std::vector<int> chosen;
      while (static_cast<int>(chosen.size()) < top_k) {
        double u = static_cast<double>(splitmix64(seed) >> 11) / 9007199254740992.0 * total;
        int e = 0;
        while (e < n_experts - 1 && (u -= 1.0 / (e + 1)) > 0) ++e;
        if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
      }
      for (int i = 0; i < top_k; ++i) {
        t.experts.push_back(chosen[i]);
        t.weights.push_back(1.0f / static_cast<float>(i + 2));
      }
    }
  return t;
}

TEST(RoutingTraceFile, RoundTrip) {
  const std::string path = tmp_path("round_trip.jsonl");
  const TraceShape s = shape_of({0, 2}, 3, 8, 2);
  {
    TraceWriter w(path, s);
    // Any record order: token 1 before token 0, layers mixed.
    w.write(2, 1, std::vector<int>{7, 0}, std::vector<float>{0.75f, 0.25f});
    w.write(0, 0, std::vector<int>{3, 5}, std::vector<float>{0.6f, 0.4f});
    w.write(0, 1, std::vector<int>{1, 2}, std::vector<float>{0.5f, 0.5f});
    w.write(2, 0, std::vector<int>{4, 6}, std::vector<float>{0.9f, 0.1234567f});
    EXPECT_EQ(w.records(), 4u);
    w.close();
  }
  const Trace t = read_trace(path);
  EXPECT_EQ(t.shape.model_type, "test");
  EXPECT_EQ(t.shape.n_layers, 3);
  EXPECT_EQ(t.shape.moe_layers, (std::vector<int>{0, 2}));
  EXPECT_EQ(t.shape.n_experts, 8);
  EXPECT_EQ(t.shape.top_k, 2);
  EXPECT_EQ(t.shape.source, "calibrate");
  ASSERT_EQ(t.n_tokens, 2);
  EXPECT_EQ(std::vector<int>(t.experts_of(0, 0), t.experts_of(0, 0) + 2), (std::vector<int>{3, 5}));
  EXPECT_EQ(std::vector<int>(t.experts_of(0, 1), t.experts_of(0, 1) + 2), (std::vector<int>{4, 6}));
  EXPECT_EQ(std::vector<int>(t.experts_of(1, 0), t.experts_of(1, 0) + 2), (std::vector<int>{1, 2}));
  EXPECT_EQ(std::vector<int>(t.experts_of(1, 1), t.experts_of(1, 1) + 2), (std::vector<int>{7, 0}));
  EXPECT_FLOAT_EQ(t.weights_of(1, 1)[0], 0.75f);
  EXPECT_NEAR(t.weights_of(0, 1)[1], 0.1234567f, 1e-6f);  // 6 significant digits on disk
  EXPECT_FLOAT_EQ(t.weights_of(0, 0)[0], 0.6f);
}

TEST(RoutingTraceFile, BadFilesNameTheProblem) {
  const std::string head =
      R"({"format":"spool-routing-trace","version":1,"model_type":"x","n_layers":2,"moe_layers":[1],"n_experts":4,"top_k":2,"source":"calibrate"})"
      "\n";
  const std::string ok0 = R"({"l":1,"t":0,"e":[0,1],"w":[0.5,0.5]})"
                          "\n";
  struct Case {
    std::string name, text, message;
  };
  const std::vector<Case> cases = {
      {"empty", "", "empty file"},
      {"foreign", "{\"hello\": 1}\n", "not a routing trace"},
      {"format_not_a_string", "{\"format\": 1, \"version\": 1}\n", "not a routing trace"},  // (found by predictor_trace_fuzz)
      {"csv", "layer,token\n", "not a JSON line"},
      {"version", R"({"format":"spool-routing-trace","version":2,"n_layers":2,"moe_layers":[1],"n_experts":4,"top_k":2})"
                  "\n",
       "version 2"},
      {"header_fields", R"({"format":"spool-routing-trace","version":1,"n_layers":2,"n_experts":4,"top_k":2})"
                        "\n",
       "bad header"},
      {"k_above_e", R"({"format":"spool-routing-trace","version":1,"n_layers":2,"moe_layers":[1],"n_experts":4,"top_k":5})"
                    "\n",
       "bad header"},
      {"no_records", head, "no records"},
      {"dense_layer", head + R"({"l":0,"t":0,"e":[0,1],"w":[0.5,0.5]})" "\n", ":2: layer 0 is not one of the header's MoE layers"},
      {"expert_range", head + R"({"l":1,"t":0,"e":[0,4],"w":[0.5,0.5]})" "\n", ":2: expert 4 outside 0..3"},
      {"expert_twice", head + R"({"l":1,"t":0,"e":[2,2],"w":[0.5,0.5]})" "\n", ":2: expert 2 listed twice"},
      {"wrong_k", head + R"({"l":1,"t":0,"e":[0],"w":[1.0]})" "\n", ":2: 1 experts and 1 weights; the header's top_k is 2"},
      {"no_weights", head + R"({"l":1,"t":0,"e":[0,1]})" "\n", ":2: a record needs"},
      {"twice", head + ok0 + ok0, ":3: layer 1 of token 0 recorded twice"},
      {"gap", head + ok0 + R"({"l":1,"t":2,"e":[0,1],"w":[0.5,0.5]})" "\n", "token 1 has no record for layer 1"},
      {"truncated", head + ok0 + R"({"l":1,"t":1,"e":[0,)", ":3: not a JSON line (a truncated trace?)"},
  };
  for (const Case& c : cases) {
    const std::string path = tmp_path("bad_" + c.name + ".jsonl");
    write_text(path, c.text);
    try {
      (void)read_trace(path);
      ADD_FAILURE() << c.name << ": read without an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << c.name << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << c.name << ": the message names the file: " << e.what();
    }
  }
  try {
    (void)read_trace(tmp_path("no_such_file.jsonl"));
    ADD_FAILURE() << "a missing file read without an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open"), std::string::npos) << e.what();
  }
}

// The map onto a larger model keeps each token's experts distinct, keeps the weights' sum and
// keeps the popularity skew (the hottest 10% take the same share of routings, up to sampling).
TEST(TraceMapTest, LargerTargetKeepsSkew) {
  const Trace t = skewed_trace(2, 16, 2, 4000, 7);
  const int Et = 64, Kt = 4;  // 4 copies of each trace expert; top-4 from top-2
  TraceMap map(t, {1, 3, 4, 6}, Et);
  std::vector<int> ids(Kt);
  std::vector<float> w(Kt);
  std::map<int, std::vector<uint64_t>> counts;  // [target layer][expert]
  for (int layer : {1, 3, 4, 6}) counts[layer].assign(Et, 0);
  for (int64_t tok = 0; tok < t.n_tokens; ++tok)
    for (int layer : {1, 3, 4, 6}) {
      map.route(layer, tok, ids, w);
      EXPECT_EQ(std::set<int>(ids.begin(), ids.end()).size(), ids.size()) << "distinct experts";
      const int src = (layer == 1 || layer == 4) ? 0 : 1;  // ordinal j -> trace MoE layer j mod 2
      const int* se = t.experts_of(tok, src);
      EXPECT_EQ(ids[0] % 16, se[0]) << "rank 0 is a copy of the trace's best expert";
      EXPECT_EQ(ids[1] % 16, se[1]);
      EXPECT_NEAR(w[0] + w[1] + w[2] + w[3], t.weights_of(tok, src)[0] + t.weights_of(tok, src)[1], 1e-6f);
      for (int e : ids) {
        ASSERT_GE(e, 0);
        ASSERT_LT(e, Et);
        ++counts[layer][e];
      }
    }
  const std::vector<double> src_share = top_share(t, 0.10);  // hottest 2 of 16
  for (int layer : {1, 3}) {
    std::vector<uint64_t> c = counts[layer];
    std::sort(c.begin(), c.end(), std::greater<>());
    uint64_t top = 0, all = 0;
    for (int i = 0; i < Et; ++i) (i < 8 ? top : all) += c[i];  // hottest 8 of 64 = the 2 hottest's copies
    all += top;
    const double share = static_cast<double>(top) / static_cast<double>(all);
    EXPECT_NEAR(share, src_share[layer == 1 ? 0 : 1], 0.03) << "layer " << layer;
  }
}

TEST(TraceMapTest, SmallerTargetFoldsExperts) {
  const Trace t = skewed_trace(1, 16, 4, 200, 3);
  TraceMap map(t, {0, 1, 2}, 6);
  std::vector<int> ids(3);
  std::vector<float> w(3);
  for (int64_t tok = 0; tok < 400; ++tok) {  // past the trace's end: tokens wrap
    map.route(2, tok, ids, w);
    EXPECT_EQ(std::set<int>(ids.begin(), ids.end()).size(), 3u);
    const int* se = t.experts_of(tok % t.n_tokens, 0);
    EXPECT_EQ(ids[0], se[0] % 6) << "the best expert folds to e mod 6";
    for (int e : ids) EXPECT_TRUE(e >= 0 && e < 6);
  }
  EXPECT_THROW(map.route(3, 0, ids, w), Error);  // not a target MoE layer
}

// CacheSim against a hand-computed LRU case (capacity 3 entries, top-2, layer 0 unless said):
//  {1,2}: misses 1, 2                          LRU (front first) 2 1
//  {3,2}: 2 hit; 3 inserted                    3 2 1
//  {1,4}: 1 hit; 4 evicts 2 (least recent)     4 1 3
//  {2,3}: 3 hit; 2 evicts 1                    3 2 4
//  layer 1 {4}: miss; evicts (0,4)             (1,4) (0,3) (0,2)
// Then capacity 1, top-2: {1,2} grows past capacity (1 is pinned when 2 comes), and {3}
// evicts both to come back to capacity.
TEST(CacheSimTest, HandComputedLru) {
  CacheSim c(3, 2);
  c.layer_step(0, std::vector<int>{2, 1});
  EXPECT_EQ(c.hits(), 0u);
  c.layer_step(0, std::vector<int>{3, 2});
  EXPECT_EQ(c.hits(), 1u);
  c.layer_step(0, std::vector<int>{1, 4});
  EXPECT_EQ(c.hits(), 2u);
  EXPECT_FALSE(c.contains(0, 2));
  EXPECT_TRUE(c.contains(0, 1));
  c.layer_step(0, std::vector<int>{2, 3});
  EXPECT_EQ(c.hits(), 3u);
  EXPECT_FALSE(c.contains(0, 1));
  EXPECT_TRUE(c.contains(0, 4));
  c.layer_step(1, std::vector<int>{4, 4});  // two rows, one expert: one request
  EXPECT_EQ(c.requests(), 9u);
  EXPECT_EQ(c.hits(), 3u);
  EXPECT_EQ(c.evictions(), 3u);
  EXPECT_TRUE(c.contains(1, 4));
  EXPECT_TRUE(c.contains(0, 3));
  EXPECT_TRUE(c.contains(0, 2));
  EXPECT_FALSE(c.contains(0, 4));

  CacheSim g(1, 2);
  g.layer_step(0, std::vector<int>{1, 2});
  EXPECT_EQ(g.size(), 2u);
  EXPECT_EQ(g.evictions(), 0u);
  g.layer_step(0, std::vector<int>{3});
  EXPECT_EQ(g.size(), 1u);
  EXPECT_EQ(g.evictions(), 2u);
  EXPECT_TRUE(g.contains(0, 3));
}

struct Loaded {
  std::shared_ptr<io::Checkpoint> ckpt;
  std::unique_ptr<ops::ThreadPool> pool;
  std::unique_ptr<models::Model> model;
  std::vector<bool> moe_layers;
  std::vector<int> moe_list;
};

Loaded load(const std::string& dir) {
  Loaded s;
  s.ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
  s.pool = std::make_unique<ops::ThreadPool>(2);
  s.model = models::load_model(s.ckpt, s.pool.get());
  const auto& ffns = s.model->spec().ffns;
  for (size_t i = 0; i < ffns.size(); ++i) {
    s.moe_layers.push_back(ffns[i] == models::FfnKind::kMoE);
    if (s.moe_layers.back()) s.moe_list.push_back(static_cast<int>(i));
  }
  return s;
}

// Records what the MoE layers acquire, then serves it from the provider behind.
class RecordingProvider final : public ExpertProvider {
 public:
  explicit RecordingProvider(std::shared_ptr<ExpertProvider> inner) : inner_(std::move(inner)) {}
  void acquire(int layer, std::span<const int> ids, std::span<ExpertWeights> out) override {
    auto& v = acquired[layer];
    v.insert(v.end(), ids.begin(), ids.end());
    inner_->acquire(layer, ids, out);
  }
  void release(int layer) override { inner_->release(layer); }
  std::string describe() const override { return "recording"; }
  std::map<int, std::vector<int>> acquired;

 private:
  std::shared_ptr<ExpertProvider> inner_;
};

// Forced routing: the experts the model fetches at each MoE layer are exactly the mapped
// trace's (the union over the step's rows, ascending), and the route observer sees each row's
// mapped choice in rank order.
TEST(ForcedRouting, ExpertsUsedEqualTheTrace) {
  Loaded s = load(testing::data_dir() + "/models/qwen3_moe");  // MoE layers 0 and 2, 8 experts top-2
  ASSERT_EQ(s.moe_list, (std::vector<int>{0, 2}));
  for (const auto& [n_experts, top_k] : std::vector<std::pair<int, int>>{{32, 3}, {4, 1}}) {
    const Trace t = skewed_trace(1, n_experts, top_k, 50, 11);
    TraceMap map(t, s.moe_list, 8);
    auto rec = std::make_shared<RecordingProvider>(s.model->shared_expert_provider());
    s.model->set_expert_provider(rec);
    const int64_t T = 12, first = 30;  // rows 0..11 replay trace tokens 30..41
    s.model->hooks.route_override = [&](int layer, int64_t row, std::span<int> ids, std::span<float> w) {
      map.route(layer, first + row, ids, w);
    };
    std::map<int, std::vector<std::vector<int>>> observed;
    s.model->hooks.on_route = [&](int layer, int64_t, std::span<const int> e, std::span<const float>) {
      observed[layer].emplace_back(e.begin(), e.end());
    };
    models::State st = s.model->new_state();
    std::vector<int32_t> ids(T);
    for (int64_t i = 0; i < T; ++i) ids[i] = static_cast<int32_t>(i * 7 + 1);
    std::vector<float> logits(s.model->spec().vocab_size);
    s.model->forward(ids, st, models::LogitsMode::kLast, logits.data());
    s.model->hooks = {};
    s.model->set_expert_provider(nullptr);
    for (int layer : s.moe_list) {
      std::set<int> want;
      std::vector<int> r(2);
      std::vector<float> w(2);
      for (int64_t row = 0; row < T; ++row) {
        map.route(layer, first + row, r, w);
        want.insert(r.begin(), r.end());
        ASSERT_LT(static_cast<size_t>(row), observed[layer].size());
        EXPECT_EQ(observed[layer][row], r) << "layer " << layer << " row " << row;
      }
      EXPECT_EQ(rec->acquired[layer], std::vector<int>(want.begin(), want.end())) << "layer " << layer << " from " << n_experts;
    }
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  }
}

// The simulation predicts the streaming cache's own counters: bench's tg test (warm-up + timed
// repetitions of forced routing) run on a real StreamingExperts, one sequence and four decoded
// together (the pipelined two-group path), against simulate_tg over the same trace and budget.
// kLfu keeps the expert asked for more often where kLru keeps the most recent one (capacity 2,
// top-1, one layer): A A B C evicts B under kLfu (1 request against A's 2), A under kLru.
TEST(CacheSimTest, LfuKeepsTheFrequentExpert) {
  const auto step = [](CacheSim& c, int e) { c.layer_step(0, std::vector<int>{e}); };
  CacheSim lru(2, 1), lfu(2, 1, {CachePolicy::kLfu, 0});
  for (int e : {0, 0, 1, 2}) step(lru, e), step(lfu, e);
  EXPECT_FALSE(lru.contains(0, 0));
  EXPECT_TRUE(lru.contains(0, 1));
  EXPECT_TRUE(lfu.contains(0, 0));
  EXPECT_FALSE(lfu.contains(0, 1));
  // A seed (a profile's counts) outweighs fewer requests: expert 3 seeded with 5 stays against 0's 2.
  CacheSim seeded(2, 1, {CachePolicy::kLfu, 0});
  seeded.seed(0, 3, 5.0);
  for (int e : {3, 0, 0, 1}) step(seeded, e);
  EXPECT_TRUE(seeded.contains(0, 3));
  EXPECT_TRUE(seeded.contains(0, 1));
  EXPECT_FALSE(seeded.contains(0, 0));
}

// A request `h` requests old weighs half: after 1 request of A then h of B, A's score is half of one fresh request.
TEST(CacheSimTest, FrequencyScoresDecayByTheHalfLife) {
  FrequencyScores f(4.0);
  f.request(1);
  for (int i = 0; i < 4; ++i) f.request(2);
  f.request(3);  // one request, made now
  EXPECT_NEAR(f.score(1) / f.score(3), 0.5 * std::exp2(-1.0 / 4.0), 1e-12);  // 5 requests old
  FrequencyScores g(2.0);
  g.seed(7, 3.0);
  for (int i = 0; i < 2000; ++i) g.request(8);  // past the rescaling (256 half-lives): still consistent
  g.request(9);
  const double r = std::exp2(-0.5);                 // requests 1..2000 old: sum of r^a = r / (1 - r) (the tail is < 1e-290)
  EXPECT_NEAR(g.score(8) / g.score(9), r / (1 - r), 1e-9);
  EXPECT_EQ(g.score(42), 0.0);
  EXPECT_THROW(cache_policy_options(CachePolicy::kLfu, 0.0, 8, 8), UsageError);
  EXPECT_EQ(cache_policy_options(CachePolicy::kLfu, 2.0, 8, 4).half_life, 64.0);
  EXPECT_EQ(parse_cache_policy("lfu"), CachePolicy::kLfu);
  EXPECT_THROW(parse_cache_policy("arc"), UsageError);
}

TEST(CacheSimTest, MatchesStreamingCache) {
  Loaded s = load(testing::data_dir() + "/models/qwen3_moe");
  const auto& sp = s.model->spec();
  const Trace t = skewed_trace(2, 16, 2, 97, 5);
  TraceMap map(t, s.moe_list, sp.moe.n_experts);
  const int n_gen = 9, reps = 3;
  // LRU; LFU with a half-life of 3 tokens and a seed, as the loader gives a profile's counts.
  const std::vector<ExpertCount> seed = {{s.moe_list.front(), 1, 4.0}, {s.moe_list.back(), 2, 2.5}};
  for (int lfu = 0; lfu < 2; ++lfu)
  for (int n_seqs : {1, 4}) {
    for (int64_t slots : {3, 6, 11}) {
      StreamingOptions o;
      o.top_k = sp.moe.top_k;
      o.workers = 2;
      if (lfu) {
        o.policy = cache_policy_options(CachePolicy::kLfu, 3.0, static_cast<int>(s.moe_list.size()), sp.moe.top_k);
        o.seed = seed;
      }
      const io::ExpertStore store(*s.ckpt, s.moe_layers, sp.moe.n_experts, false);
      o.cache_budget_bytes = store.slot_bytes() * static_cast<uint64_t>(slots);
      auto streaming = std::make_shared<StreamingExperts>(s.ckpt, s.moe_layers, sp.moe.n_experts, sp.hidden_size, sp.moe.intermediate, o);
      s.model->set_expert_provider(streaming);
      std::vector<int64_t> rows;
      s.model->hooks.route_override = [&](int layer, int64_t row, std::span<int> ids, std::span<float> w) {
        map.route(layer, rows.at(static_cast<size_t>(row)), ids, w);
      };
      StreamingStats before;
      std::vector<float> logits(static_cast<size_t>(n_seqs) * sp.vocab_size);
      for (int rep = -1; rep < reps; ++rep) {
        if (rep == 0) before = streaming->stats();
        std::vector<models::State> states;
        for (int q = 0; q < n_seqs; ++q) states.push_back(s.model->new_state());
        for (int i = 0; i < n_gen; ++i) {
          rows.clear();
          std::vector<models::SeqStep> steps;
          std::vector<int32_t> tok(n_seqs);
          for (int q = 0; q < n_seqs; ++q) {
            rows.push_back(tg_trace_token(t.n_tokens, q, n_seqs, rep, n_gen, i));
            tok[q] = (q * 31 + i * 5 + 2) % static_cast<int32_t>(sp.vocab_size);
          }
          for (int q = 0; q < n_seqs; ++q)
            steps.push_back({std::span<const int32_t>(&tok[q], 1), &states[q], models::LogitsMode::kLast, logits.data() + q * sp.vocab_size});
          s.model->forward_batch(steps);
        }
      }
      const StreamingStats got = streaming->stats() - before;
      s.model->hooks = {};
      s.model->set_expert_provider(nullptr);
      const TraceSimResult want = simulate_tg(map, sp.moe.top_k, slots, n_gen, reps, n_seqs, o.policy,
                                              lfu ? std::span<const ExpertCount>(seed) : std::span<const ExpertCount>());
      EXPECT_EQ(got.requests, want.requests) << n_seqs << " sequences, " << slots << " slots, lfu " << lfu;
      EXPECT_EQ(got.hits, want.hits) << n_seqs << " sequences, " << slots << " slots, lfu " << lfu;
      EXPECT_EQ(got.misses, want.misses) << n_seqs << " sequences, " << slots << " slots, lfu " << lfu;
      EXPECT_GT(want.misses, 0u);
      EXPECT_GT(want.hits, 0u);
    }
  }
}

}  // namespace
}  // namespace spool::experts

namespace spool::experts {
namespace {

// Prefetch guesses ("g", calibrate --trace-guesses): written, read back, checked, and mapped
// onto another shape as the routing is (a guess naming a routed expert lands where route() put it).
TEST(RoutingTraceGuesses, RoundTripErrorsAndMap) {
  const std::string path = tmp_path("guesses.jsonl");
  TraceShape s = shape_of({0, 1}, 2, 8, 2);
  s.guesses = 3;
  s.guess_source = "router";
  {
    TraceWriter w(path, s);
    const int e0[] = {1, 2}, e1[] = {3, 4}, g1[] = {4, 3, 7};
    const float wt[] = {0.6f, 0.4f};
    w.write(0, 0, e0, wt);  // the first MoE layer: no guesses
    w.write(1, 0, e1, wt, g1);
    w.close();
  }
  const Trace t = read_trace(path);
  EXPECT_EQ(t.shape.guesses, 3);
  EXPECT_EQ(t.shape.guess_source, "router");
  ASSERT_EQ(t.guesses.size(), 6u);
  EXPECT_EQ(t.guesses_of(0, 0)[0], -1);
  EXPECT_EQ(std::vector<int>(t.guesses_of(0, 1), t.guesses_of(0, 1) + 3), (std::vector<int>{4, 3, 7}));
  auto bad = [&](const std::string& name, const std::string& record, const std::string& words) {
    const std::string p = tmp_path(name);
    std::ifstream in(path);
    std::string header;
    std::getline(in, header);
    write_text(p, header + "\n{\"l\":0,\"t\":0,\"e\":[1,2],\"w\":[0.5,0.5]}\n" + record + "\n");
    try {
      read_trace(p);
      ADD_FAILURE() << name << " read";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  bad("g_len.jsonl", R"({"l":1,"t":0,"e":[1,2],"w":[0.5,0.5],"g":[1,2]})", "2 guesses; the header's guesses is 3");
  bad("g_range.jsonl", R"({"l":1,"t":0,"e":[1,2],"w":[0.5,0.5],"g":[1,2,8]})", "guess 8 outside 0..7");
  bad("g_twice.jsonl", R"({"l":1,"t":0,"e":[1,2],"w":[0.5,0.5],"g":[1,2,1]})", "guess 1 listed twice");
  bad("g_type.jsonl", R"({"l":1,"t":0,"e":[1,2],"w":[0.5,0.5],"g":"x"})", "\"g\", ints");
  // A float where an integer goes (predictor_trace_fuzz: nlohmann's get<int> of 3e30 was undefined behaviour).
  bad("g_float.jsonl", R"({"l":1,"t":0,"e":[1,2],"w":[0.5,0.5],"g":[1,2,3e30]})", "\"g\", ints");
  bad("l_float.jsonl", R"({"l":1.5,"t":0,"e":[1,2],"w":[0.5,0.5]})", "\"l\", \"t\"");

  // The map: guesses equal to each token's routed experts land on route()'s ids (64 -> 256
  // experts: each trace expert splits into 4 by the per-token hash).
  Trace big = skewed_trace(3, 64, 8, 200, 11);
  big.shape.guesses = 8;
  big.guesses = big.experts;
  const TraceMap map(big, {0, 1, 2, 3, 4}, 256);
  int64_t same = 0, all = 0;
  for (int layer = 0; layer < 5; ++layer)
    for (int64_t tok = 0; tok < 200; ++tok) {
      std::vector<int> ids(8), g(8);
      std::vector<float> w(8);
      map.route(layer, tok, ids, w);
      ASSERT_EQ(map.guess(layer, tok, g), 8);
      const std::set<int> a(ids.begin(), ids.end()), b(g.begin(), g.end());
      for (int x : b) same += a.count(x);
      all += 8;
    }
  EXPECT_GE(static_cast<double>(same) / static_cast<double>(all), 0.99);  // (a collision moves an id: rare)
  std::vector<int> few(3);
  EXPECT_EQ(map.guess(1, 5, few), 3);
  Trace none = skewed_trace(2, 8, 2, 4, 1);
  const TraceMap nomap(none, {0, 1}, 8);
  EXPECT_EQ(nomap.guess(1, 0, few), 0);
  EXPECT_THROW(nomap.guess(5, 0, few), Error);
}

}  // namespace
}  // namespace spool::experts

namespace spool::experts {
namespace {

// plan --trace's decode time, by hand: two acquires of one sequence's 2 tokens, (2 hits, 3
// misses) and (0 hits, 1 miss); a miss reads 0.1 GB at 1 GB/s, an expert computes 0.05 GB and the
// shared expert 0.02 GB at 1 GB/s. Stalls: 0.3 - (0.02 + 2 x 0.05) = 0.18 s and 0.1 - 0.02 = 0.08 s.
TEST(DecodeTimeModel, StallIsWhatTheReadsTakeBeyondTheOverlap) {
  TraceSimResult sim;
  sim.tokens = 2;
  sim.acquires = {{2, 3}, {0, 1}};
  DecodeTimeInputs in;
  in.n_moe_layers = 2;
  in.compute_s = 0.5;  // + the 6 acquired experts' 0.3 s over 2 steps: 0.65 s a step
  in.read_bytes = 0.1e9;
  in.expert_bytes = 0.05e9;
  in.shared_bytes = 0.02e9;
  in.mem_gbps = 1;
  in.disk_gbps = 1;
  DecodeTime d = model_decode_time(sim, in);
  EXPECT_NEAR(d.stall_s_per_token, 0.13, 1e-12);
  EXPECT_NEAR(d.tok_s, 1 / 0.78, 1e-9);
  in.hits_first = false;  // the hits no longer overlap: 0.28 + 0.08
  d = model_decode_time(sim, in);
  EXPECT_NEAR(d.stall_s_per_token, 0.18, 1e-12);
  EXPECT_NEAR(d.tok_s, 1 / 0.83, 1e-9);
  // Pipelined (2 sequences: 1 step of 2 tokens): step compute 0.01 + 0.3 = 0.31, the other
  // group's share 0.31 / 4 overlaps too: stalls 0.3 - 0.0975 and 0.1 - 0.0975.
  in.compute_s = 0.01;
  in.n_seqs = 2;
  d = model_decode_time(sim, in);
  EXPECT_NEAR(d.stall_s_per_token, (0.2025 + 0.0025) / 2, 1e-12);
  EXPECT_NEAR(d.tok_s, 2 / (0.31 + 0.205), 1e-9);
  in.disk_gbps = 0.01;  // disk-bound: 40 s of reads, more than compute + stall can be
  d = model_decode_time(sim, in);
  EXPECT_GE(2 / d.tok_s, 40.0 - 1e-9);
  in.disk_gbps = 0;
  EXPECT_THROW(model_decode_time(sim, in), Error);
}

}  // namespace
}  // namespace spool::experts

namespace spool::experts {
namespace {

// plan's compute probe runs the fixture's experts through the CPU kernels and reports a rate:
// positive, finite, and below what summing the same bytes would need no time for (a sanity bound).
TEST(ExpertComputeProbe, MeasuresAPositiveRate) {
  Loaded s = load(testing::data_dir() + "/models/qwen3_moe");
  const auto& sp = s.model->spec();
  const double g = measure_expert_gbps(s.ckpt, s.moe_layers, s.moe_list.front(), sp.moe.n_experts, sp.hidden_size, sp.moe.intermediate, 1, 0.05);
  EXPECT_GT(g, 0.0);
  EXPECT_LT(g, 1e4);
  EXPECT_THROW(measure_expert_gbps(s.ckpt, s.moe_layers, s.moe_list.front(), sp.moe.n_experts, sp.hidden_size, sp.moe.intermediate, 0, 0.05), Error);
}

}  // namespace
}  // namespace spool::experts
