// models::DeviceExpertCache, the VRAM tier of a GPU run, checked on the CPU: the CPU backend's
// weight slots are host memory filled by the same packing (Backend::copy_weight_into), so a
// stale or misplaced slot shows up as different logits. The GPU runs the same checks in
// backend_test (CudaModel.StreamedExpertsMatchVramResidentBitForBit).
#include "models/device_experts.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "experts/streaming.h"
#include "models/model.h"
#include "ops/cpu_backend.h"

namespace spool::models {
namespace {

// Logits of a prompt and of `n` greedy steps after it, concatenated.
std::vector<float> greedy_logits(Model& m, const std::vector<int32_t>& ids, int n) {
  State st = m.new_state();
  const int64_t V = m.spec().vocab_size;
  std::vector<float> logits(V), all;
  m.forward(ids, st, LogitsMode::kLast, logits.data());
  for (int i = 0; i < n; ++i) {
    all.insert(all.end(), logits.begin(), logits.end());
    const int32_t t = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    m.forward(std::span<const int32_t>(&t, 1), st, LogitsMode::kLast, logits.data());
  }
  all.insert(all.end(), logits.begin(), logits.end());
  return all;
}

std::vector<bool> moe_layers(const ModelSpec& s) {
  std::vector<bool> moe(s.n_layers);
  for (int i = 0; i < s.n_layers; ++i) moe[i] = s.ffns[i] == FfnKind::kMoE;
  return moe;
}

// The demo model with its experts behind slot caches of several sizes, over the resident
// mapping and over a streaming provider (the RAM tier): the logits of a prompt and 12 greedy
// steps are those of the plain provider, bit for bit; hits and misses add up to the experts
// acquired, a cache that holds every expert misses each expert once, and a small one evicts.
TEST(DeviceExpertCache, SlotsGiveTheLogitsOfTheHostProviderBitForBit) {
  auto ckpt = std::make_shared<io::Checkpoint>(io::Checkpoint::open(SPOOL_DEFAULT_MODEL_DIR));
  ops::ThreadPool pool(2);
  auto be = std::make_shared<ops::CpuBackend>(&pool);
  auto m = load_model(ckpt, be);
  const ModelSpec& s = m->spec();
  const std::vector<int32_t> ids = {760, 3469, 369, 1036, 35, 1559, 1090, 3236};
  const std::vector<float> want = greedy_logits(*m, ids, 12);
  const std::vector<bool> moe = moe_layers(s);
  const int n_moe = static_cast<int>(std::count(moe.begin(), moe.end(), true));
  auto resident = m->shared_expert_provider();
  uint64_t slot = 0;
  for (const bool streamed : {false, true}) {
    std::shared_ptr<experts::ExpertProvider> source = resident;
    if (streamed) {
      experts::StreamingOptions so;
      so.cache_budget_bytes = 0;  // every expert from disk
      so.workers = 2;
      so.top_k = s.moe.top_k;
      source = std::make_shared<experts::StreamingExperts>(ckpt, moe, s.moe.n_experts, s.hidden_size, s.moe.intermediate, so);
    }
    for (const int n_slots : {s.moe.top_k, 3 * s.moe.top_k, n_moe * s.moe.n_experts}) {
      SCOPED_TRACE((streamed ? "streamed, " : "resident, ") + std::to_string(n_slots) + " slots");
      if (slot == 0) {
        DeviceExpertCache probe(source, *be, moe, s.moe.n_experts, uint64_t{1} << 40, 1);
        slot = probe.slot_bytes();
      }
      auto cache = std::make_shared<DeviceExpertCache>(source, *be, moe, s.moe.n_experts, slot * n_slots, s.moe.top_k);
      ASSERT_EQ(cache->slots(), static_cast<size_t>(n_slots));
      m->set_expert_provider(cache);
      const std::vector<float> got = greedy_logits(*m, ids, 12);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
      const DeviceExpertCache::Stats st = cache->stats();
      if (n_slots == n_moe * s.moe.n_experts) {
        // Nothing is evicted: a second run hits every time.
        const uint64_t misses = st.misses;
        EXPECT_GT(st.hits, 0u);
        const std::vector<float> again = greedy_logits(*m, ids, 12);
        EXPECT_EQ(std::memcmp(again.data(), want.data(), want.size() * sizeof(float)), 0);
        EXPECT_EQ(cache->stats().misses, misses);
      } else if (n_slots == s.moe.top_k) {
        EXPECT_GT(st.misses, static_cast<uint64_t>(n_slots));  // slots were refilled
      }
      EXPECT_EQ(st.bytes_copied, st.misses * slot);
      m->set_expert_provider(nullptr);
    }
  }
}

// A fake host provider of one MoE layer whose expert e is a 4x4 float matrix filled with e:
// checks the least-recently-used order and that slots handed out are never evicted.
class FakeExperts final : public experts::ExpertProvider {
 public:
  explicit FakeExperts(int n) : data_(static_cast<size_t>(n) * 16) {
    for (int e = 0; e < n; ++e) std::fill(data_.begin() + e * 16, data_.begin() + (e + 1) * 16, static_cast<float>(e));
  }
  void acquire(int layer, std::span<const int> ids, std::span<experts::ExpertWeights> out) override {
    for (size_t i = 0; i < ids.size(); ++i) {
      ops::WeightView v;
      v.type = ops::WType::kF32;
      v.rows = v.cols = 4;
      v.data = data_.data() + ids[i] * 16;
      out[i].gate = out[i].up = out[i].down = v;
      acquired.push_back(ids[i]);
    }
  }
  void release(int) override {}
  std::string describe() const override { return "fake"; }
  std::vector<int> acquired;

 private:
  std::vector<float> data_;
};

float first(const experts::ExpertWeights& w) { return static_cast<const float*>(w.gate.data)[0]; }

TEST(DeviceExpertCache, LeastRecentlyUsedAndInUseSlotsStay) {
  auto src = std::make_shared<FakeExperts>(8);
  ops::ThreadPool pool(1);
  ops::CpuBackend be(&pool);
  DeviceExpertCache c(src, be, {true}, 8, 3 * ops::packed_weight_bytes(ops::WeightView{ops::WType::kF32, 4, 4}) * 3, 2);
  ASSERT_EQ(c.slots(), 3u);
  experts::ExpertWeights w[3];
  auto get = [&](std::vector<int> ids) {
    c.acquire(0, ids, std::span<experts::ExpertWeights>(w, ids.size()));
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(first(w[i]), static_cast<float>(ids[i])) << "expert " << ids[i];
    c.release(0);
  };
  get({0, 1});
  get({2});
  get({0});     // hit: 0 is now the most recent, 1 the least
  get({3});     // evicts 1
  src->acquired.clear();
  get({0, 2});  // both hits
  EXPECT_TRUE(src->acquired.empty());
  get({1});     // 1 was evicted: read again (evicting 3, the least recent)
  EXPECT_EQ(src->acquired, std::vector<int>{1});
  // Three slots all handed out by one acquire: none of them can be taken by the misses of it.
  get({5, 6, 7});
  EXPECT_EQ(c.stats().hits, 3u);
  EXPECT_EQ(c.stats().misses, 8u);
  // Slots handed out and not released are never taken, even when least recently used: with
  // 5 and 6 in use, 7 is the only slot a miss may take, and with 7 in use too none is left.
  const std::vector<int> five_six = {5, 6};
  c.acquire(0, five_six, std::span<experts::ExpertWeights>(w, 2));  // hits, the oldest two (in use)
  const int e0 = 0, e1 = 1;
  c.acquire(0, std::span<const int>(&e0, 1), std::span<experts::ExpertWeights>(w + 2, 1));  // takes 7's slot
  EXPECT_EQ(first(w[2]), 0.0f);
  EXPECT_THROW(c.acquire(0, std::span<const int>(&e1, 1), std::span<experts::ExpertWeights>(w + 2, 1)), Error);
  EXPECT_EQ(first(w[0]), 5.0f);  // still held
  EXPECT_EQ(first(w[1]), 6.0f);
  c.release(0);
  get({1});  // after the release a slot is free again
  // Duplicates in one acquire take one slot.
  src->acquired.clear();
  get({4, 4});
  EXPECT_EQ(src->acquired, std::vector<int>{4});
  // More experts at once than slots, an expert out of range, a budget below one token: errors.
  experts::ExpertWeights many[4];
  const std::vector<int> four = {0, 1, 2, 3};
  EXPECT_THROW(c.acquire(0, four, many), Error);
  const int bad = 9;
  EXPECT_THROW(c.acquire(0, std::span<const int>(&bad, 1), std::span<experts::ExpertWeights>(w, 1)), Error);
  EXPECT_THROW(DeviceExpertCache(src, be, {true}, 8, c.slot_bytes(), 2), Error);
}

}  // namespace
}  // namespace spool::models
