// Streaming experts: bit-identical to resident experts under every reader setting and
// cache budget; coalesced reads; pins; prefetch; read errors; K-reduction goldens.
#include "experts/streaming.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/golden.h"
#include "common/error.h"
#include "models/model.h"
#include "models/family.h"

namespace spool::experts {
namespace {

using spool::testing::argmax;
using spool::testing::data_dir;

struct Bench {
  std::shared_ptr<io::Checkpoint> ckpt;
  std::unique_ptr<ops::ThreadPool> pool;
  std::unique_ptr<models::Model> model;
  std::vector<bool> moe_layers;
};

Bench load(const std::string& dir) {
  Bench s;
  s.ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
  s.pool = std::make_unique<ops::ThreadPool>(2);
  s.model = models::load_model(s.ckpt, s.pool.get());
  for (auto f : s.model->spec().ffns) s.moe_layers.push_back(f == models::FfnKind::kMoE);
  return s;
}

std::shared_ptr<StreamingExperts> make_streaming(Bench& s, StreamingOptions o) {
  const auto& sp = s.model->spec();
  o.top_k = sp.moe.top_k;
  return std::make_shared<StreamingExperts>(s.ckpt, s.moe_layers, sp.moe.n_experts, sp.hidden_size, sp.moe.intermediate, o);
}

// Logits of a prefill (all rows, in chunks of `step`) followed by `decode` greedy steps.
std::vector<float> run(models::Model& m, const std::vector<int32_t>& prompt, int64_t step, int decode) {
  const int64_t V = m.spec().vocab_size;
  models::State st = m.new_state();
  std::vector<float> out(prompt.size() * V);
  for (size_t i = 0; i < prompt.size(); i += step) {
    const size_t n = std::min<size_t>(step, prompt.size() - i);
    m.forward(std::span<const int32_t>(prompt.data() + i, n), st, models::LogitsMode::kAll, out.data() + i * V);
  }
  std::vector<float> logits(out.end() - V, out.end());
  for (int d = 0; d < decode; ++d) {
    int32_t t = argmax(logits.data(), V);
    m.forward(std::span<const int32_t>(&t, 1), st, models::LogitsMode::kLast, logits.data());
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

// One reader setting. The cache budget is a fraction of all expert bytes (0 = no room:
// every expert is read when used and evicted after its layer).
struct Config {
  double budget_frac;
  int workers;
  bool direct;
  io::IoEngine engine;
  int prefetch;
  bool hits_first = true;                   // StreamingOptions::hits_first (the MoE block's two-half acquire)
  CachePolicy policy = CachePolicy::kLru;   // StreamingOptions::policy (kLfu with a short half-life)
  std::string name() const {
    return "budget" + std::to_string(static_cast<int>(budget_frac * 100)) + "_w" + std::to_string(workers) +
           (direct ? "_direct" : "_pagecache") + (engine == io::IoEngine::kUring ? "_uring" : "_pread") +
           (prefetch ? "_prefetch" + std::to_string(prefetch) : "") + (hits_first ? "" : "_nohitsfirst") +
           (policy == CachePolicy::kLfu ? "_lfu" : "");
  }
};

// Readable parameter in test listings (gtest would hex-dump the struct otherwise).
void PrintTo(const Config& c, std::ostream* os) { *os << c.name(); }

class BitIdentical : public ::testing::TestWithParam<std::tuple<std::string, Config>> {};

TEST_P(BitIdentical, StreamingEqualsResident) {
  const auto& [model_name, cfg] = GetParam();
  Bench s = load(model_name == "demo" ? std::string(SPOOL_DEFAULT_MODEL_DIR) : data_dir() + "/models/" + model_name);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back((i * 37 + 11) % static_cast<int>(s.model->spec().vocab_size));
  const std::vector<float> want = run(*s.model, prompt, 16, 12);
  StreamingOptions o;
  o.engine = cfg.engine;
  o.direct = cfg.direct;
  o.prefetch_ahead = cfg.prefetch;
  o.workers = cfg.workers;
  o.hits_first = cfg.hits_first;
  o.policy = cache_policy_options(cfg.policy, 2.0, 8, 8);  // a half-life of 128 requests: the decay matters within the run
  // All experts' bytes, or their slots when the 4096-byte alignment of each extent makes those
  // larger (gpt-oss MXFP4: four small extents per expert in the tiny fixture).
  const io::ExpertStore plan(*s.ckpt, s.moe_layers, s.model->spec().moe.n_experts, cfg.direct);
  const uint64_t n_experts = static_cast<uint64_t>(std::count(s.moe_layers.begin(), s.moe_layers.end(), true)) *
                             static_cast<uint64_t>(s.model->spec().moe.n_experts);
  const uint64_t all = std::max(s.ckpt->expert_bytes(), n_experts * plan.slot_bytes());
  o.cache_budget_bytes = static_cast<uint64_t>(cfg.budget_frac * static_cast<double>(all));
  auto streaming = make_streaming(s, o);
  s.model->set_expert_provider(streaming);
  const std::vector<float> got = run(*s.model, prompt, 16, 12);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << cfg.name() << ": logits differ";
  StreamingStats st = streaming->stats();
  EXPECT_GT(st.misses, 0u);
  EXPECT_GT(st.bytes_read, 0u);
  EXPECT_EQ(st.requests, st.hits + st.misses);
  if (cfg.budget_frac >= 1.0) {
    EXPECT_LE(st.misses, static_cast<uint64_t>(all / streaming->store().slot_bytes() + 1));
  }
  // The reads went the way the name says: O_DIRECT, or through the page cache. A filesystem
  // that refuses O_DIRECT (tmpfs) gets buffered reads + DONTNEED: the results above still
  // hold, and the test is reported as skipped, not passed (a failure under SPOOL_NO_SKIP=1).
  const std::string how = streaming->describe();
  if (!cfg.direct) {
    EXPECT_NE(how.find("page cache"), std::string::npos) << how;
  } else if (how.find("O_DIRECT") == std::string::npos) {
    EXPECT_NE(how.find("buffered+DONTNEED"), std::string::npos) << how;
    GTEST_SKIP() << "O_DIRECT was refused for " << s.ckpt->shards().front().path() << "; ran buffered: " << how;
  }
}

std::vector<Config> all_configs() {
  std::vector<Config> v;
  for (double b : {0.0, 0.1, 0.5, 1.0})
    for (int w : {1, 8})
      for (bool direct : {false, true})
        for (auto eng : {io::IoEngine::kPread, io::IoEngine::kUring})
          for (int pf : {0, 2}) v.push_back({b, w, direct, eng, pf});
  // The replacement policy and the one-call acquire, at the budgets where the cache evicts.
  for (double b : {0.0, 0.1, 0.5})
    for (bool hf : {false, true})
      for (auto pol : {CachePolicy::kLru, CachePolicy::kLfu})
        if (!hf || pol == CachePolicy::kLfu) v.push_back({b, 8, true, io::IoEngine::kPread, 0, hf, pol});
  return v;
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<std::string, Config>>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param).name();
}

// Every combination on the demo model; a cross-section on the tiny fixtures of each family.
INSTANTIATE_TEST_SUITE_P(Demo, BitIdentical, ::testing::Combine(::testing::Values("demo"), ::testing::ValuesIn(all_configs())),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Fixtures, BitIdentical,
                         ::testing::Combine(::testing::Values("qwen3_5_moe_vl_fused", "qwen3_next", "qwen3_moe", "mixtral", "olmoe",
                                                              "deepseek_v3", "deepseek_v3_kimi", "deepseek_v2_lite", "glm4_moe", "glm4_moe_lite",
                                                              "minimax_m2", "gpt_oss_mxfp4", "ernie4_5_moe", "gemma4_text_moe"),
                                            ::testing::Values(Config{0.0, 1, true, io::IoEngine::kPread, 0},
                                                              Config{0.1, 8, false, io::IoEngine::kUring, 2, true, CachePolicy::kLfu},
                                                              Config{0.5, 8, true, io::IoEngine::kUring, 0},
                                                              Config{0.5, 8, true, io::IoEngine::kPread, 0, false, CachePolicy::kLfu},
                                                              Config{1.0, 1, false, io::IoEngine::kPread, 1})),
                         param_name);
// gpt-oss float experts ([E, in, out] in the file) are streamed from the in-memory shard that
// holds their transposed copy (io::Checkpoint): a memfd, which refuses O_DIRECT, so page-cache
// reads only.
INSTANTIATE_TEST_SUITE_P(GptOssFloat, BitIdentical,
                         ::testing::Combine(::testing::Values("gpt_oss"),
                                            ::testing::Values(Config{0.0, 1, false, io::IoEngine::kPread, 0},
                                                              Config{0.1, 8, false, io::IoEngine::kUring, 2},
                                                              Config{1.0, 1, false, io::IoEngine::kPread, 1})),
                         param_name);

// The MXFP4 experts of gpt_oss_mxfp4 are streamed as their own bytes: each expert's slot holds
// its FP4 blocks and E8M0 scales (two ranges of each fused [E, ...] tensor), nothing else.
TEST(GptOssMxfp4, ExpertsStreamAsStoredBlocksAndScales) {
  Bench s = load(data_dir() + "/models/gpt_oss_mxfp4");
  const auto& sp = s.model->spec();
  const int64_t H = sp.hidden_size, I = sp.moe.intermediate;
  StreamingOptions o;
  o.cache_budget_bytes = 0;
  auto st = make_streaming(s, o);
  const io::ExpertLocation& loc = st->store().at(1, 3);
  // gate_up [2I, H] and down [H, I]: blocks (in/2 bytes per row) + scales (in/32 per row).
  EXPECT_EQ(loc.payload_bytes, static_cast<uint64_t>(2 * I * (H / 2 + H / 32) + H * (I / 2 + I / 32)));
  EXPECT_EQ(loc.extents.size(), 4u);  // blocks and scales of gate_up and of down
  const io::TensorRef* b = s.ckpt->expert_part(1, 3, io::ExpertProj::kGate, io::ExpertPart::kMxBlocks);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->shape, (std::vector<int64_t>{2 * I, H / 32, 16}));
  EXPECT_EQ(s.ckpt->expert_part(1, 3, io::ExpertProj::kUp, io::ExpertPart::kWeight), nullptr);
}

TEST(KReduction, RenormalisesOnlyWhenTheModelDoes) {
  float logits[6] = {1.0f, 3.0f, 2.0f, 0.5f, 2.5f, -1.0f};
  int ids[2];
  float w[2];
  float l2[6];
  std::memcpy(l2, logits, sizeof(l2));
  models::route_top_k(logits, 6, 2, /*renormalize=*/true, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 4);
  EXPECT_NEAR(w[0] + w[1], 1.0f, 1e-6f);
  EXPECT_NEAR(w[0] / w[1], std::exp(0.5f), 1e-5f);
  models::route_top_k(l2, 6, 2, /*renormalize=*/false, ids, w);
  double z = 0;
  for (float x : {1.0f, 3.0f, 2.0f, 0.5f, 2.5f, -1.0f}) z += std::exp(x);
  EXPECT_NEAR(w[0], std::exp(3.0) / z, 1e-6);  // raw softmax probability
  EXPECT_NEAR(w[1], std::exp(2.5) / z, 1e-6);
}

TEST(Streaming, CoalescesAdjacentExperts) {
  Bench s = load(SPOOL_DEFAULT_MODEL_DIR);
  StreamingOptions o;
  o.cache_budget_bytes = 1ull << 30;
  auto st = make_streaming(s, o);
  std::vector<int> all(64);
  for (int e = 0; e < 64; ++e) all[e] = e;
  std::vector<ExpertWeights> w(64);
  st->acquire(2, all, w);
  st->release(2);
  StreamingStats a = st->stats();
  EXPECT_EQ(a.misses, 64u);
  // 64 experts x 3 tensors stored back to back: a handful of vectored reads, not 192.
  EXPECT_LE(a.reads, 8u) << "reads issued for one layer's 64 experts";
  // The views hold the checkpoint's bytes.
  for (int e = 0; e < 64; ++e) {
    const io::TensorRef& t = s.ckpt->expert(2, e, io::ExpertProj::kDown);
    ASSERT_EQ(std::memcmp(w[e].down.data, t.data, t.nbytes), 0);
  }
  // A second acquire is all hits.
  st->acquire(2, all, w);
  st->release(2);
  EXPECT_EQ(st->stats().misses, 64u);
  EXPECT_EQ(st->stats().hits, 64u);
}

TEST(Streaming, PinsStayResident) {
  Bench s = load(SPOOL_DEFAULT_MODEL_DIR);
  StreamingOptions o;
  o.pins = {{0, 5}, {1, 7}};
  auto probe = make_streaming(s, {});
  o.cache_budget_bytes = 12 * probe->store().slot_bytes();
  probe.reset();
  auto st = make_streaming(s, o);
  std::vector<ExpertWeights> w(8);
  for (int rep = 0; rep < 3; ++rep)
    for (int l = 0; l < 8; ++l) {
      std::vector<int> ids = {8, 9, 10, 11, 12, 13, 14, 15};
      st->acquire(l, ids, w);
      st->release(l);
    }
  const uint64_t before = st->stats().misses;
  std::vector<int> pinned = {5};
  st->acquire(0, pinned, std::span<ExpertWeights>(w.data(), 1));
  st->release(0);
  EXPECT_EQ(st->stats().misses, before) << "a pinned expert was evicted";
}

TEST(Streaming, ReadErrorIsAClearError) {
  const std::string dir = ::testing::TempDir() + "/stream_trunc";
  std::filesystem::remove_all(dir);
  std::filesystem::copy(data_dir() + "/models/qwen3_moe", dir, std::filesystem::copy_options::recursive);
  Bench s = load(dir);
  StreamingOptions o;
  o.cache_budget_bytes = 1 << 20;
  auto st = make_streaming(s, o);
  // Truncate the file under the running model (as a failing disk or a concurrent writer would).
  std::filesystem::resize_file(dir + "/model.safetensors", 4096);
  std::vector<ExpertWeights> w(2);
  std::vector<int> ids = {3, 6};
  try {
    st->acquire(0, ids, w);
    FAIL() << "expected a read error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
    EXPECT_NE(msg.find("offset"), std::string::npos) << msg;
  }
  // The failed experts were not cached: asking again fails again instead of serving garbage.
  EXPECT_THROW(st->acquire(0, ids, w), Error);
}

TEST(KReduction, GreedyMatchesTransformers) {
  Bench s = load(SPOOL_DEFAULT_MODEL_DIR);
  std::ifstream f(data_dir() + "/models/spool-demo-moe/k_reduction.json");
  nlohmann::json kr = nlohmann::json::parse(f);
  spool::testing::Golden g(data_dir() + "/models/spool-demo-moe/golden_prompts.safetensors");
  const int64_t V = s.model->spec().vocab_size;
  EXPECT_THROW(s.model->set_max_active_experts(9), Error);
  for (auto& [k, v] : kr["k"].items()) {
    s.model->set_max_active_experts(std::stoi(k));
    for (size_t p = 0; p < v["greedy"].size(); ++p) {
      std::vector<int32_t> ids = g.i32("p" + std::to_string(p) + ".input_ids");
      std::vector<int32_t> want = v["greedy"][p]["greedy_ids"].get<std::vector<int32_t>>();
      models::State st = s.model->new_state();
      std::vector<float> logits(V);
      s.model->forward(ids, st, models::LogitsMode::kLast, logits.data());
      std::vector<int32_t> got;
      for (size_t i = 0; i < want.size(); ++i) {
        got.push_back(argmax(logits.data(), V));
        s.model->forward(std::span<const int32_t>(&got.back(), 1), st, models::LogitsMode::kLast, logits.data());
      }
      EXPECT_EQ(got, want) << "K=" << k << " prompt " << p;
    }
  }
  s.model->set_max_active_experts(0);
}

}  // namespace
}  // namespace spool::experts
