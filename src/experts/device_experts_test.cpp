// experts::DeviceExpertCache, the VRAM tier of a GPU run, checked on the CPU: the CPU backend's
// weight slots are host memory filled by the same packing (Backend::copy_weight_into), so a
// stale or misplaced slot shows up as different logits. The GPU runs the same checks in
// backend_test (CudaModel.StreamedExpertsMatchVramResidentBitForBit).
#include "experts/device_experts.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "experts/streaming.h"
#include "models/greedy_logits.h"
#include "models/model.h"
#include "ops/cpu_backend.h"
#include "models/family.h"

namespace spool::experts {
namespace {

using namespace models;  // the test runs whole models over the tiers

using models::greedy_logits;

std::vector<bool> moe_layers(const ModelSpec& s) {
  std::vector<bool> moe(s.n_layers);
  for (int i = 0; i < s.n_layers; ++i) moe[i] = s.ffns[i] == FfnKind::kMoE;
  return moe;
}

// Passes calls through to the cache in front of it, counting the experts acquired.
class Counting final : public experts::ExpertProvider {
 public:
  explicit Counting(std::shared_ptr<experts::ExpertProvider> inner) : inner_(std::move(inner)) {}
  void acquire(int layer, std::span<const int> ids, std::span<experts::ExpertWeights> out) override {
    acquired += ids.size();
    inner_->acquire(layer, ids, out);
  }
  void prepare(int layer, std::span<const int> ids) override { inner_->prepare(layer, ids); }
  void unprepare(int layer, std::span<const int> ids) override { inner_->unprepare(layer, ids); }
  void release(int layer) override { inner_->release(layer); }
  std::string describe() const override { return inner_->describe(); }
  int max_batch() const override { return inner_->max_batch(); }
  uint64_t acquired = 0;

 private:
  std::shared_ptr<experts::ExpertProvider> inner_;
};

// A CPU backend whose "mapped host memory" is plain heap memory (the CPU reads it in place, as a
// GPU reads CUDA's mapped pinned memory), to check DeviceExperts' static placement on the CPU.
class MappedCpu final : public ops::CpuBackend {
 public:
  explicit MappedCpu(ops::ThreadPool* pool) : ops::CpuBackend(pool) {}
  void* alloc_host_mapped(uint64_t bytes) override {
    blocks.push_back(std::make_unique<char[]>(bytes));
    mapped += bytes;
    return blocks.back().get();
  }
  std::vector<std::unique_ptr<char[]>> blocks;
  uint64_t mapped = 0;
};

// Calls f with the packed bytes (ops::packed_weight_bytes) of expert e of layer l.
void with_expert_bytes(experts::ExpertProvider& p, int l, int e, const std::function<void(uint64_t)>& f) {
  experts::ExpertWeights w;
  p.acquire(l, std::span<const int>(&e, 1), std::span<experts::ExpertWeights>(&w, 1));
  const uint64_t b = ops::packed_weight_bytes(w.gate) + ops::packed_weight_bytes(w.up) + ops::packed_weight_bytes(w.down);
  p.release(l);
  f(b);
}

// The demo model on a MappedCpu backend: its MoE layers and the logits of a prompt and 6 greedy
// steps with the resident experts (what every static placement must give bit for bit).
struct MappedDemo {
  std::shared_ptr<io::Checkpoint> ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(SPOOL_DEFAULT_MODEL_DIR));
  ops::ThreadPool pool{2};
  std::shared_ptr<MappedCpu> be = std::make_shared<MappedCpu>(&pool);
  std::unique_ptr<Model> m = load_model(ckpt, be);
  const std::vector<int32_t> ids = {760, 3469, 369, 1036, 35, 1559, 1090, 3236};
  const std::vector<float> want = greedy_logits(*m, ids, 6);
  const std::vector<bool> moe = moe_layers(m->spec());
  // The logits with `provider` in place of the resident experts.
  std::vector<float> logits_with(std::shared_ptr<experts::ExpertProvider> provider) {
    m->set_expert_provider(std::move(provider));
    std::vector<float> got = greedy_logits(*m, ids, 6);
    m->set_expert_provider(nullptr);
    return got;
  }
};

// Static placement (--vram-experts static): a share of each layer's experts "uploaded", the rest
// packed into mapped host memory; the demo model's logits are those of the resident experts bit
// for bit at every budget, the split follows the budget (none, about half, all), and a backend
// without mapped memory is a clear error.
TEST(DeviceExperts, StaticPlacementSplitsByTheBudgetAndKeepsTheLogits) {
  MappedDemo d;
  const ModelSpec& s = d.m->spec();
  const int64_t n_moe = std::count(d.moe.begin(), d.moe.end(), true), all = n_moe * s.moe.n_experts;
  auto resident = d.m->shared_expert_provider();
  DeviceExperts everything(*resident, *d.be, d.moe, s.moe.n_experts);  // (the bytes of all experts)
  const uint64_t total = everything.bytes();
  ASSERT_GT(total, 0u);
  for (const double frac : {0.0, 0.5, 4.0}) {
    SCOPED_TRACE("VRAM budget " + std::to_string(frac) + " x the experts");
    const uint64_t mapped0 = d.be->mapped;
    auto dev = std::make_shared<DeviceExperts>(*resident, *d.be, d.moe, s.moe.n_experts, static_cast<uint64_t>(frac * static_cast<double>(total)));
    EXPECT_EQ(dev->experts_on_device() + dev->experts_in_host(), all);
    if (frac == 0.0) EXPECT_EQ(dev->experts_on_device(), 0);
    if (frac == 4.0) EXPECT_EQ(dev->experts_in_host(), 0);
    if (frac == 0.5) {
      EXPECT_GT(dev->experts_on_device(), all / 4);
      EXPECT_LT(dev->experts_on_device(), all * 3 / 4);
      EXPECT_EQ(dev->experts_on_device() % n_moe, 0) << "an equal share of every layer";
    }
    EXPECT_EQ(d.be->mapped - mapped0 > 0, dev->experts_in_host() > 0) << "host share packed into mapped memory";
    EXPECT_NE(dev->describe().find(dev->experts_in_host() > 0 ? "page-locked host memory" : "resident"), std::string::npos) << dev->describe();
    const std::vector<float> got = d.logits_with(dev);
    ASSERT_EQ(got.size(), d.want.size());
    EXPECT_EQ(std::memcmp(got.data(), d.want.data(), d.want.size() * sizeof(float)), 0);
  }
  ops::CpuBackend plain(&d.pool);
  EXPECT_THROW(DeviceExperts(*resident, plain, d.moe, s.moe.n_experts, 0), Error) << "no mapped host memory";
}

// Static placement with a hot list (spool calibrate's pin file): the listed experts take the VRAM
// share first, hottest first while the budget holds them (a repeated pair counts once; a pair
// naming no expert of the model is an error), the rest of the budget goes by id, the rest of the
// experts exactly fill the mapped memory; the logits stay those of the resident experts bit for bit.
TEST(DeviceExperts, StaticPlacementPutsTheHotListInVramFirst) {
  MappedDemo d;
  const ModelSpec& s = d.m->spec();
  const int E = s.moe.n_experts;
  std::vector<int> ml;
  for (int l = 0; l < static_cast<int>(d.moe.size()); ++l)
    if (d.moe[static_cast<size_t>(l)]) ml.push_back(l);
  ASSERT_GE(ml.size(), 2u) << "the demo model has two MoE layers or more";
  const int l0 = ml[0], l1 = ml[1];
  auto resident = d.m->shared_expert_provider();
  uint64_t per_expert = 0;  // packed bytes of one expert (the demo model's are all the same size: checked below)
  with_expert_bytes(*resident, l0, 0, [&](uint64_t b) { per_expert = b; });
  for (const auto& [l, e] : std::vector<std::pair<int, int>>{{l0, 0}, {l1, 0}, {l0, E - 3}, {l1, E - 4}})
    with_expert_bytes(*resident, l, e, [&](uint64_t b) { ASSERT_EQ(b, per_expert) << "experts of equal size"; });
  // Room for 3 experts; the hot list names 4 (high ids, so the by-id fill cannot place them), one twice.
  const std::vector<std::pair<int, int>> hot = {{l1, E - 1}, {l0, E - 2}, {l1, E - 1}, {l0, E - 3}, {l1, E - 4}};
  const uint64_t mapped0 = d.be->mapped;
  const int64_t all = static_cast<int64_t>(ml.size()) * E;
  auto dev = std::make_shared<DeviceExperts>(*resident, *d.be, d.moe, E, 3 * per_expert + per_expert / 2, hot);
  EXPECT_EQ(d.be->mapped - mapped0, static_cast<uint64_t>(all - 3) * per_expert) << "the rest, exactly, in mapped memory";
  EXPECT_EQ(dev->experts_on_device(), 3);
  EXPECT_EQ(dev->experts_from_hot_list(), 3);
  EXPECT_TRUE(dev->on_device(l1, E - 1));
  EXPECT_TRUE(dev->on_device(l0, E - 2));
  EXPECT_TRUE(dev->on_device(l0, E - 3));
  EXPECT_FALSE(dev->on_device(l1, E - 4)) << "the budget is full after three";
  EXPECT_FALSE(dev->on_device(l0, 0));
  EXPECT_NE(dev->describe().find("3 of them from the hot list"), std::string::npos) << dev->describe();
  // Room for 5: the 4 hot ones, then the first by id (expert 0 of the first MoE layer).
  auto dev5 = std::make_shared<DeviceExperts>(*resident, *d.be, d.moe, E, 5 * per_expert + per_expert / 2, hot);
  EXPECT_EQ(dev5->experts_on_device(), 5);
  EXPECT_EQ(dev5->experts_from_hot_list(), 4);
  EXPECT_TRUE(dev5->on_device(l1, E - 4));
  EXPECT_TRUE(dev5->on_device(l0, 0));
  EXPECT_FALSE(dev5->on_device(l1, 0));
  // A pair naming no expert of this model (a pin file of another model) is an error, as with --stream.
  for (const auto& bad : std::vector<std::pair<int, int>>{{99, 0}, {l0, E}, {l0, -1}}) {
    const std::vector<std::pair<int, int>> one = {bad};
    EXPECT_THROW(DeviceExperts(*resident, *d.be, d.moe, E, per_expert, one), Error);
  }
  for (const auto& p : {dev, dev5}) {
    const std::vector<float> got = d.logits_with(p);
    ASSERT_EQ(got.size(), d.want.size());
    EXPECT_EQ(std::memcmp(got.data(), d.want.data(), d.want.size() * sizeof(float)), 0);
  }
}

// The demo model with its experts behind slot caches of several sizes, over the resident
// mapping and over a streaming provider (the RAM tier): the logits of a prompt and 12 greedy
// steps are those of the plain provider, bit for bit; hits and misses add up to the experts
// acquired, a cache that holds every expert misses each expert once, and a small one evicts.
TEST(DeviceExpertCache, SlotsGiveTheLogitsOfTheHostProviderBitForBit) {
  auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(SPOOL_DEFAULT_MODEL_DIR));
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
  for (const int streamed : {0, 1, 2}) {  // the mapping; streaming with no RAM tier; streaming with every expert in RAM
    std::shared_ptr<experts::ExpertProvider> source = resident;
    std::shared_ptr<experts::StreamingExperts> ram;
    if (streamed) {
      experts::StreamingOptions so;
      so.cache_budget_bytes = streamed == 1 ? 0 : uint64_t{1} << 30;  // every expert from disk, or each read once
      so.workers = 2;
      so.top_k = s.moe.top_k;
      source = ram = std::make_shared<experts::StreamingExperts>(ckpt, moe, s.moe.n_experts, s.hidden_size, s.moe.intermediate, so);
    }
    for (const int n_slots : {s.moe.top_k, 3 * s.moe.top_k, n_moe * s.moe.n_experts}) {
      SCOPED_TRACE(std::string(streamed == 0 ? "resident, " : streamed == 1 ? "streamed, " : "streamed with a RAM tier, ") +
                   std::to_string(n_slots) + " slots");
      if (slot == 0) {
        DeviceExpertCache probe(source, *be, moe, s.moe.n_experts, uint64_t{1} << 40, 1);
        slot = probe.slot_bytes();
      }
      auto cache = std::make_shared<DeviceExpertCache>(source, *be, moe, s.moe.n_experts, slot * n_slots, s.moe.top_k);
      ASSERT_EQ(cache->slots(), static_cast<size_t>(n_slots));
      // (after the constructor's reads of expert 0 of each layer, for the slot size)
      const experts::StreamingStats ram0 = ram ? ram->stats() : experts::StreamingStats{};
      auto counting = std::make_shared<Counting>(cache);
      m->set_expert_provider(counting);
      const std::vector<float> got = greedy_logits(*m, ids, 12);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
      cache->update_stall();
      const DeviceExpertCache::Stats st = cache->stats();
      // Every expert acquired is a hit or a miss; each miss was copied (packed sizes: one slot each).
      EXPECT_EQ(st.hits + st.misses, counting->acquired);
      EXPECT_GE(st.stall_s, 0.0);  // (host slots: the time spent copying)
      if (streamed == 0) {
        // The mapping has every expert in memory: prepare() starts the copies of the first batch.
        EXPECT_GT(st.early, 0u);
        EXPECT_LE(st.early, st.misses);
      }
      if (ram) {
        // The RAM tier is asked for exactly the VRAM tier's misses, and each request is a hit or a miss there.
        const experts::StreamingStats r = ram->stats() - ram0;
        EXPECT_EQ(r.requests, st.misses);
        EXPECT_EQ(r.hits + r.misses, r.requests);
        if (streamed == 2 && ram0.requests > 0) EXPECT_GT(r.hits, 0u);  // the second size on finds its experts in RAM
        EXPECT_GE(r.stall_s, 0.0);
      }
      if (n_slots == n_moe * s.moe.n_experts) {
        // Nothing is evicted: a second run hits every time.
        const uint64_t misses = st.misses;
        EXPECT_GT(st.hits, 0u);
        const uint64_t before = counting->acquired;
        const std::vector<float> again = greedy_logits(*m, ids, 12);
        EXPECT_EQ(std::memcmp(again.data(), want.data(), want.size() * sizeof(float)), 0);
        EXPECT_EQ(cache->stats().misses, misses);
        EXPECT_EQ(cache->stats().hits, st.hits + (counting->acquired - before));
      } else if (n_slots == s.moe.top_k) {
        EXPECT_GT(st.misses, static_cast<uint64_t>(n_slots));  // slots were refilled
      }
      EXPECT_EQ(st.bytes_copied, st.misses * slot);
      m->set_expert_provider(nullptr);
    }
  }
}

// Records the page-locking calls a GPU backend would serve (and says they succeeded).
class PinRecorder final : public ops::CpuBackend {
 public:
  using CpuBackend::CpuBackend;
  bool pin_host(void* p, uint64_t bytes) override {
    pins.emplace_back(p, bytes);
    return true;
  }
  void unpin_host(void* p) override { unpins.push_back(p); }
  std::vector<std::pair<void*, uint64_t>> pins;
  std::vector<void*> unpins;
};

// The RAM tier of a GPU run (StreamingOptions::pin_with): the cache's buffers are one block,
// locked once at construction and unlocked at destruction, every expert's bytes are read into
// it, and slots over it give the resident logits bit for bit.
TEST(DeviceExpertCache, PinnedRamTierIsOneLockedBlock) {
  auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(SPOOL_DEFAULT_MODEL_DIR));
  ops::ThreadPool pool(2);
  auto be = std::make_shared<ops::CpuBackend>(&pool);
  PinRecorder rec(&pool);
  auto m = load_model(ckpt, be);
  const ModelSpec& s = m->spec();
  const std::vector<int32_t> ids = {760, 3469, 369, 1036, 35, 1559, 1090, 3236};
  const std::vector<float> want = greedy_logits(*m, ids, 6);
  const std::vector<bool> moe = moe_layers(s);
  const uint64_t all = static_cast<uint64_t>(std::count(moe.begin(), moe.end(), true)) * static_cast<uint64_t>(s.moe.n_experts);
  for (const bool hold_all : {false, true}) {
    SCOPED_TRACE(hold_all ? "hold_all" : "1 GB budget");
    rec.pins.clear();
    rec.unpins.clear();
    {
      experts::StreamingOptions so;
      so.cache_budget_bytes = hold_all ? 0 : uint64_t{1} << 30;  // both hold every expert of the demo
      so.workers = 2;
      so.top_k = s.moe.top_k;
      so.pin_with = &rec;
      so.hold_all = hold_all;
      auto ram = std::make_shared<experts::StreamingExperts>(ckpt, moe, s.moe.n_experts, s.hidden_size, s.moe.intermediate, so);
      ASSERT_EQ(rec.pins.size(), 1u);
      EXPECT_EQ(rec.pins[0].second, all * ram->store().slot_bytes());  // the budget's entries, at most every expert
      EXPECT_EQ(reinterpret_cast<uintptr_t>(rec.pins[0].first) % 4096, 0u);
      EXPECT_EQ(ram->stats().pinned_bytes, rec.pins[0].second);
      EXPECT_NE(ram->describe().find("pinned"), std::string::npos) << ram->describe();
      const uint64_t slot = DeviceExpertCache::slot_bytes_for(*ram, moe);
      // Every view the RAM tier hands out lies in the locked block.
      experts::ExpertWeights w;
      const int e = s.moe.n_experts - 1;
      const int layer = static_cast<int>(std::find(moe.begin(), moe.end(), true) - moe.begin());
      ram->acquire(layer, std::span<const int>(&e, 1), std::span<experts::ExpertWeights>(&w, 1));
      const auto* p = static_cast<const uint8_t*>(w.down.type == ops::WType::kQuant ? static_cast<const void*>(w.down.quant.qweight) : w.down.data);
      const auto* b = static_cast<const uint8_t*>(rec.pins[0].first);
      EXPECT_TRUE(p >= b && p < b + rec.pins[0].second);
      ram->release(layer);
      auto cache = std::make_shared<DeviceExpertCache>(ram, *be, moe, s.moe.n_experts, slot * 2 * s.moe.top_k, s.moe.top_k);
      m->set_expert_provider(cache);
      const std::vector<float> got = greedy_logits(*m, ids, 6);
      m->set_expert_provider(nullptr);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
      EXPECT_GT(cache->stats().early, 0u);  // experts already in RAM were copied by prepare()
    }
    EXPECT_EQ(rec.unpins, std::vector<void*>{rec.pins[0].first});
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
    (void)layer;
    restore();
    for (size_t i = 0; i < ids.size(); ++i) {
      ops::WeightView v;
      v.type = ops::WType::kF32;
      v.rows = v.cols = 4;
      v.data = data_.data() + ids[i] * 16;
      out[i].gate = out[i].up = out[i].down = v;
      acquired.push_back(ids[i]);
    }
  }
  void release(int) override {
    ++releases;
    // Views handed out are no longer the caller's: their bytes may change (a cache reuses the
    // buffer). Poisoned here until the next acquire, so a copy that reads them late sees -1.
    std::fill(data_.begin(), data_.end(), -1.0f);
  }
  size_t acquire_available(int layer, std::span<const int> ids, std::span<experts::ExpertWeights> out, std::span<uint8_t> got) override {
    if (!available) return ExpertProvider::acquire_available(layer, ids, out, got);
    acquire(layer, ids, out);
    std::fill(got.begin(), got.end(), uint8_t{1});
    return ids.size();
  }
  std::string describe() const override { return "fake"; }
  std::vector<int> acquired;
  int releases = 0;
  bool available = false;  // acquire_available() hands out every expert

 private:
  void restore() {
    for (size_t e = 0; e < data_.size() / 16; ++e) std::fill(data_.begin() + e * 16, data_.begin() + (e + 1) * 16, static_cast<float>(e));
  }
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

// A CPU backend whose weight copies behave as a GPU's copy stream: copy_weight_into only queues
// them; they run (memcpy from the source's memory as it is then) when the compute side waits
// for them (wait_weight_copies) or a blocking weight_copies_done() asks. A slot handed out
// without a wait holds stale bytes, and a source released before its copies ran gives -1s.
class AsyncCopyBackend final : public ops::CpuBackend {
 public:
  using CpuBackend::CpuBackend;
  ops::WeightView copy_weight_into(const ops::WeightView& w, void* slot) override {
    return ops::pack_weight(w, slot, device(), [this](void* to, const void* from, size_t n) {
      queue_.push_back([to, from, n] { std::memcpy(to, from, n); });
    });
  }
  uint64_t weight_copy_fence() override {
    if (queue_.size() > fenced_) {
      ends_.push_back(queue_.size());
      fenced_ = queue_.size();
    }
    return ends_.size();  // ticket i ends at ends_[i - 1]
  }
  void wait_weight_copies(uint64_t ticket) override {
    waits.push_back(ticket);
    run_to(ticket);
  }
  bool weight_copies_done(uint64_t ticket, bool block) override {
    if (block) run_to(ticket);
    return ticket <= done_;
  }
  std::vector<uint64_t> waits;

 private:
  void run_to(uint64_t ticket) {
    for (; done_ < ticket && done_ < ends_.size(); ++done_)
      for (; ran_ < ends_[done_]; ++ran_) queue_[ran_]();
  }
  std::vector<std::function<void()>> queue_;
  std::vector<size_t> ends_;
  size_t fenced_ = 0, ran_ = 0;
  uint64_t done_ = 0;
};

// prepare() starts the copies of experts the source has in memory; acquire() orders the work
// after them (no slot is read before its copy ran) and the source's views are released only
// once the copies have read them; slots named by prepare() are never evicted before their
// acquire() or unprepare().
TEST(DeviceExpertCache, PreparedCopiesAreWaitedForAndKeepTheirSlots) {
  auto src = std::make_shared<FakeExperts>(8);
  src->available = true;
  ops::ThreadPool pool(1);
  AsyncCopyBackend be(&pool);
  DeviceExpertCache c(src, be, {true}, 8, 3 * ops::packed_weight_bytes(ops::WeightView{ops::WType::kF32, 4, 4}) * 3, 2);
  ASSERT_EQ(c.slots(), 3u);
  src->acquired.clear();  // (the constructor read expert 0 for the slot size)
  src->releases = 0;
  experts::ExpertWeights w[3];
  const std::vector<int> three_four = {3, 4};
  c.prepare(0, three_four);
  EXPECT_EQ(src->acquired, three_four);  // taken from the source's memory at once
  EXPECT_EQ(src->releases, 0);           // ... and held while the copies are queued
  EXPECT_EQ(c.stats().early, 2u);
  src->acquired.clear();
  c.acquire(0, three_four, w);
  EXPECT_TRUE(src->acquired.empty());    // no second read: the slots were filled by prepare()
  ASSERT_FALSE(be.waits.empty());        // the expert kernels wait for the copies
  EXPECT_EQ(first(w[0]), 3.0f);
  EXPECT_EQ(first(w[1]), 4.0f);
  EXPECT_EQ(c.stats().misses, 2u);       // copied for this acquire: misses, not hits
  EXPECT_EQ(c.stats().hits, 0u);
  c.release(0);
  EXPECT_EQ(src->releases, 1);           // the copies ran: the source's views are given back
  // A plain miss (no prepare): the source is held until the copy has run.
  const int two = 2;
  c.acquire(0, std::span<const int>(&two, 1), std::span<experts::ExpertWeights>(w, 1));
  EXPECT_EQ(first(w[0]), 2.0f);
  c.release(0);
  EXPECT_EQ(src->releases, 2);
  // Slots 2, 3, 4 (LRU: 3, 4, 2). prepare({5, 6}) fills the two least recent; acquire({7})
  // without a prepare may take only the third, and then none is left for another expert.
  const std::vector<int> five_six = {5, 6};
  c.prepare(0, five_six);
  const int seven = 7, one = 1;
  c.acquire(0, std::span<const int>(&seven, 1), std::span<experts::ExpertWeights>(w + 2, 1));
  EXPECT_EQ(first(w[2]), 7.0f);
  EXPECT_THROW(c.acquire(0, std::span<const int>(&one, 1), std::span<experts::ExpertWeights>(w + 1, 1)), Error);  // 7 in use, 5 and 6 reserved
  c.release(0);
  src->acquired.clear();
  c.acquire(0, five_six, w);  // both still in their slots: no new copy
  EXPECT_TRUE(src->acquired.empty());
  EXPECT_EQ(first(w[0]), 5.0f);
  EXPECT_EQ(first(w[1]), 6.0f);
  c.release(0);
  // unprepare() gives reserved slots back to the LRU order.
  c.prepare(0, std::vector<int>{0, 1});
  c.unprepare(0, std::vector<int>{0, 1});
  c.acquire(0, std::span<const int>(&one, 1), std::span<experts::ExpertWeights>(w, 1));
  EXPECT_EQ(first(w[0]), 1.0f);
  c.release(0);
}

}  // namespace
}  // namespace spool::experts
