// The planner's memory accounting against the engine's real allocations: KV growth and
// state bytes against models::State, the forward-pass workspace against the process's
// measured anonymous RSS growth, weight classes against the checkpoint, and the budget rule.
#include <malloc.h>

#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "engine/loader.h"
#include "io/checkpoint.h"
#include "models/model.h"
#include "models/presets.h"
#include "ops/thread_pool.h"
#include "plan/budget.h"
#include "plan/footprint.h"
#include "plan/gpu.h"
#include "plan/projection.h"
#include "models/family.h"

namespace spool::plan {
namespace {

const std::string kDemo = SPOOL_DEFAULT_MODEL_DIR;

uint64_t rss_anon() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
  return 0;
}

TEST(Footprint, KvCapacityFollowsKvCacheGrowth) {
  io::Checkpoint ck = models::open_checkpoint(kDemo);
  const models::ModelSpec spec = models::build_spec(ck);
  struct Case {
    int64_t prompt, total, step;
  } cases[] = {{10, 58, 512}, {778, 1034, 512}, {3000, 3100, 512}, {100, 100, 7}, {1, 5000, 512}, {4096, 4096, 128}};
  for (const auto& c : cases) {
    models::State st(spec);
    int64_t pos = 0;
    for (; pos < c.prompt; pos += c.step) {
      st.reserve(std::min(c.prompt, pos + c.step));
      st.pos = std::min(c.prompt, pos + c.step);
    }
    for (pos = c.prompt; pos < c.total; ++pos) {
      st.reserve(pos + 1);
      st.pos = pos + 1;
    }
    const int64_t cap = kv_capacity(c.prompt, c.total, c.step);
    EXPECT_EQ(st.attn[3].capacity(), cap) << c.prompt << " " << c.total << " " << c.step;
    for (int bits : {32, 16, 8}) {
      models::State s2(spec, ops::kv_type_from_bits(bits));
      s2.reserve(cap);
      const StateBytes b = state_bytes(spec, KvCapacity{cap, cap}, bits);
      EXPECT_EQ(s2.bytes(), b.kv + b.recurrent) << bits;
    }
  }
}

// gpt-oss windows every other layer (the fixture: W = 8 on layers 0 and 2): the planner's two
// capacities are what models::State's caches reach over the same run, windowed layers stay
// bounded by KvCache::window_rows whatever the context, and state_bytes counts each layer at its own.
TEST(Footprint, WindowedLayersFollowTheirBoundedCache) {
  io::Checkpoint ck = models::open_checkpoint(std::string(SPOOL_TEST_DATA_DIR) + "/models/gpt_oss", {.map = false});
  const models::ModelSpec spec = models::build_spec(ck);
  ASSERT_EQ(spec.attn.sliding_window, 8);
  ASSERT_TRUE(spec.attn.window_bounds_kv);
  struct Case {
    int64_t prompt, total, step;
  } cases[] = {{10, 58, 512}, {778, 1034, 512}, {100, 100, 7}, {1, 600, 512}, {3, 3, 512}, {4096, 4200, 128}};
  for (const auto& c : cases) {
    SCOPED_TRACE(std::to_string(c.prompt) + " " + std::to_string(c.total) + " " + std::to_string(c.step));
    for (int bits : {32, 8}) {
      models::State st(spec, ops::kv_type_from_bits(bits));
      for (int64_t pos = 0; pos < c.prompt; pos += c.step) {
        st.reserve(std::min(c.prompt, pos + c.step));
        st.pos = std::min(c.prompt, pos + c.step);
      }
      for (int64_t pos = c.prompt; pos < c.total; ++pos) {
        st.reserve(pos + 1);
        st.pos = pos + 1;
      }
      const KvCapacity cap = kv_capacities(spec, c.prompt, c.total, c.step);
      EXPECT_EQ(cap.full, kv_capacity(c.prompt, c.total, c.step));
      EXPECT_EQ(st.attn[1].capacity(), cap.full);  // full attention
      EXPECT_EQ(st.attn[0].capacity(), cap.windowed);
      EXPECT_EQ(st.attn[2].capacity(), cap.windowed);
      EXPECT_LE(cap.windowed, ops::KvCache::window_rows(8, std::min(c.step, c.prompt)));
      const StateBytes b = state_bytes(spec, cap, bits);
      EXPECT_EQ(st.bytes(), b.kv + b.recurrent) << bits;
      EXPECT_EQ(b.kv, b.kv_per_token / 4 * static_cast<uint64_t>(2 * cap.full + 2 * cap.windowed));
      // A KV-less snapshot (serve's prompt-cache checkpoints): the two windowed layers' W - 1 rows.
      if (c.total >= 7) EXPECT_EQ(st.snapshot().bytes(), b.snapshot);
      EXPECT_EQ(b.snapshot, b.kv_per_token / 4 * 2 * 7);
    }
  }
}

TEST(Footprint, WeightClassesMatchTheCheckpoint) {
  io::Checkpoint ck = models::open_checkpoint(kDemo, {.map = false});
  const models::ModelSpec spec = models::build_spec(ck);
  const WeightBytes w = weight_bytes(ck, spec);
  EXPECT_EQ(w.total, ck.total_bytes());
  EXPECT_EQ(w.experts, ck.expert_bytes());
  EXPECT_EQ(w.embed_on_demand, ck.tensor("embed_tokens.weight").nbytes);  // lm_head is its own tensor
  EXPECT_EQ(w.resident_dense + w.embed_on_demand + w.experts, w.total);
  EXPECT_GT(w.f32_copies, 0u);
  // One slot holds one expert's three projections (4 KiB-aligned regions).
  const uint64_t per_expert = w.experts / (static_cast<uint64_t>(spec.n_layers) * spec.moe.n_experts);
  EXPECT_GE(expert_slot_bytes(ck, spec, false), per_expert);
  EXPECT_LT(expert_slot_bytes(ck, spec, false), per_expert + 3 * 8192);
}

// The forward pass allocates what workspace_bytes() says (within 5%): measured as the growth
// of anonymous RSS over the first forward of T tokens on a fresh model (the KV cache it
// allocates is added to the expectation; logits are allocated before measuring). One T per
// process: a second model would reuse the first one's freed pages.
TEST(Footprint, WorkspaceMatchesMeasuredAllocation) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's allocator (redzones, quarantine) changes resident sizes";
#endif
  // The allocator as spool runs it (cli/main.cpp): blocks from 128 KiB on are mapped on their
  // own. With glibc's default, moving threshold the kernels' growing scratch vectors land in
  // the heap and the growth depends on which holes earlier loads happened to leave.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  for (int64_t T : {512}) {
    auto ck = std::make_shared<io::Checkpoint>(models::open_checkpoint(kDemo));
    ops::ThreadPool pool(2);
    auto model = models::load_model(ck, &pool);
    const models::ModelSpec& spec = model->spec();
    std::vector<float> logits(spec.vocab_size);
    std::vector<int32_t> ids(T);
    for (int64_t i = 0; i < T; ++i) ids[i] = static_cast<int32_t>((i * 7919) % spec.vocab_size);
    models::State st = model->new_state();
    const uint64_t before = rss_anon();
    model->forward(ids, st, models::LogitsMode::kLast, logits.data());
    const uint64_t grown = rss_anon() - before;
    // The arena is exactly what the planner's shared sizing function says, and it is committed.
    const uint64_t arena = models::workspace_arena_bytes(spec, T);
    EXPECT_EQ(model->workspace_capacity(), arena);
    EXPECT_GE(grown, arena) << "the workspace arena is not resident after a forward pass";
    // The rest (kernels' per-thread scratch, KV/state) is bounded by the planner's terms:
    // the planner may over-count (an expert gets at most T rows) but never under-count.
    const uint64_t v = static_cast<uint64_t>(spec.vocab_size);
    const uint64_t want = workspace_bytes(spec, T, T, 2) - v * 16 + st.bytes();  // minus logits + sampler
    EXPECT_LE(grown, want + want / 20) << "T=" << T;
  }
}

// Resident bytes of the mappings of files whose path ends with ".safetensors" (/proc/self/smaps).
uint64_t shard_rss() {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool shard = false;
  uint64_t rss = 0;
  while (std::getline(f, line)) {
    const size_t sp = line.find(' ');
    if (sp != std::string::npos && line.find('-') < sp) {  // a mapping's header line: "lo-hi perms ... path"
      shard = line.size() >= 12 && line.compare(line.size() - 12, 12, ".safetensors") == 0;
    } else if (shard && line.rfind("Rss:", 0) == 0) {
      rss += std::stoull(line.substr(4)) * 1024;
    }
  }
  return rss;
}

// A resident load holds every weight the plan counts (resident dense + experts, the embedding
// read on demand left out) before any token runs: the planned peak does not depend on which
// experts a prompt routes to.
TEST(Footprint, ResidentLoadHoldsTheWholeModel) {
  engine::LoadOptions lo;
  lo.model_dir = kDemo;
  lo.stream = false;
  lo.threads = 1;
  lo.ctx_size = 16;
  engine::LoadedModel l = engine::load(lo);
  const WeightBytes w = weight_bytes(*l.ckpt, l.model->spec());
  const uint64_t mapped = w.resident_dense + w.experts;  // file bytes the forward pass reads through the mapping
  const uint64_t rss = shard_rss();
  EXPECT_GE(rss, mapped);
  // At most a page more per shard boundary and tensor edge next to the embedding (header pages too).
  EXPECT_LE(rss, mapped + static_cast<uint64_t>(l.ckpt->shards().size()) * 4 * 4096 + (256u << 10));
}

TEST(Budget, SharedRule) {
  EXPECT_EQ(reserve_bytes(1ull << 30), 512ull << 20);
  EXPECT_EQ(reserve_bytes(100ull << 30), (100ull << 30) / 20);
  BaseNeeds b;
  b.dense = 1ull << 30;
  b.workspace = 1ull << 28;
  const uint64_t experts = 10ull << 30;
  EXPECT_TRUE(must_stream(8ull << 30, b, experts));
  EXPECT_FALSE(must_stream(16ull << 30, b, experts));
  const uint64_t avail = 8ull << 30;
  EXPECT_EQ(auto_cache_budget(avail, b, experts), avail - b.sum() - reserve_bytes(avail));
  EXPECT_EQ(auto_cache_budget(64ull << 30, b, experts), experts);  // capped at the experts
  EXPECT_EQ(auto_cache_budget(1ull << 30, b, experts), 0u);        // never negative
  EXPECT_EQ(cache_peak_bytes(10 * 100 + 50, 100, 8, 1000), 1000u);  // 10 slots
  EXPECT_EQ(cache_peak_bytes(0, 100, 8, 1000), 800u);               // a token's top-8 at least
  EXPECT_EQ(cache_peak_bytes(1ull << 40, 100, 8, 1000), 100000u);   // at most every expert
}

TEST(Projection, VerdictsAndCommand) {
  io::Checkpoint ck = models::open_checkpoint(kDemo, {.map = false});
  PlanInputs in;
  in.model_arg = "DIR";
  in.shape.threads = 2;
  in.available = 16ull << 30;
  Projection p = project(ck, in);
  EXPECT_EQ(p.verdict, Verdict::kResident);
  EXPECT_EQ(p.command, "spool generate --model DIR --no-stream --prompt \"...\"");
  EXPECT_EQ(p.peak, p.base.sum() + p.weights.experts);
  // Just enough for everything but 10 MB of experts: stream with the auto budget.
  in.available = p.base.sum() + p.weights.experts + (512ull << 20) - (10ull << 20);
  p = project(ck, in);
  EXPECT_EQ(p.verdict, Verdict::kStream);
  EXPECT_EQ(p.cache_budget, auto_cache_budget(in.available, p.base, p.weights.experts));
  EXPECT_NE(p.command.find("--stream --cache-budget-gb "), std::string::npos) << p.command;
  EXPECT_LE(p.peak + p.reserve, in.available);
  in.available = 64ull << 20;
  EXPECT_EQ(project(ck, in).verdict, Verdict::kNoFit);
}

}  // namespace
}  // namespace spool::plan

namespace spool::plan {
namespace {

// The workspace is one arena sized by the widest layer: a 40-layer Qwen3.6-35B-A3B needs the
// same workspace as its first 8 layers (per-layer buffers made it grow with the layer count).
TEST(Footprint, WorkspaceDoesNotGrowWithLayers) {
  const models::Preset& p = models::preset("qwen3.6-35b-a3b");
  auto spec_with = [&](int layers) {
    nlohmann::json cfg = p.config;
    nlohmann::json& text = cfg.contains("text_config") ? cfg["text_config"] : cfg;
    text["num_hidden_layers"] = layers;
    if (text.contains("layer_types")) text["layer_types"] = std::vector<nlohmann::json>(text["layer_types"].begin(), text["layer_types"].begin() + layers);
    return models::build_spec(io::Config(text, "preset"), io::GenerationDefaults{}, false, "preset");
  };
  const models::ModelSpec s8 = spec_with(8), s40 = spec_with(40);
  ASSERT_EQ(s40.n_layers, 40);
  const uint64_t w8 = workspace_bytes(s8, 512, 4096, 2, true), w40 = workspace_bytes(s40, 512, 4096, 2, true);
  EXPECT_LE(static_cast<double>(w40), 1.10 * static_cast<double>(w8)) << "8 layers " << w8 << " B, 40 layers " << w40 << " B";
  EXPECT_EQ(models::workspace_arena_bytes(s8, 512), models::workspace_arena_bytes(s40, 512));
}

}  // namespace
}  // namespace spool::plan

// --vram-budget-gb auto: the free VRAM (another process's allocations excluded) less 512 MiB, at
// most 90% of the card; nothing when less than the reserve is free.
TEST(PlanGpu, AutoVramBudgetIsTheFreeMemoryLessTheReserve) {
  constexpr uint64_t GiB = 1ull << 30, MiB = 1ull << 20;
  EXPECT_EQ(spool::plan::auto_vram_budget(100 * GiB, 50 * GiB), 50 * GiB - 512 * MiB);
  EXPECT_EQ(spool::plan::auto_vram_budget(10 * GiB, 10 * GiB), 10 * GiB / 10 * 9);
  EXPECT_EQ(spool::plan::auto_vram_budget(10 * GiB, 300 * MiB), 0u);
  EXPECT_EQ(spool::plan::auto_vram_budget(10 * GiB, 0), 10 * GiB / 10 * 9);  // free memory unknown
}
