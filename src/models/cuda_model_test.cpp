// Whole models on CudaBackend (GPU tests: each is SKIPPED without a GPU, like the "cuda" cases of
// ops/backend_test.cpp; scripts/test-cuda.sh runs them on a GPU machine): the fixture families and
// the demo model against transformers' goldens and CpuBackend — the families whose ops all run on
// the GPU in strict device mode, experts in VRAM — expert placements (VRAM, host mapping, streaming,
// slots, static) bit for bit, the routed expert path, device-resident state round trips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "support/golden.h"
#include "support/load.h"
#include "support/mtp.h"
#include "common/error.h"
#include "experts/streaming.h"
#include "io/checkpoint.h"
#include "models/family.h"
#include "experts/device_experts.h"
#include "models/greedy_logits.h"
#include "models/model.h"
#include "models/ops_used.h"
#include "ops/cpu_backend.h"
#include "ops/cuda/cuda_backend.h"
#include "quant/convert.h"
#include "quant/recipe.h"

namespace spool::ops {
namespace {

using spool::testing::max_row_ratio;

// Whole models on CudaBackend, checked as model_test checks CpuBackend: every tiny fixture
// family's prompt logits against transformers' f32 goldens (per row max|diff| <= 1e-4 *
// max|ref|) and its greedy ids equal to the goldens' (which CpuBackend also reproduces, checked
// here too); the demo model's four golden prompts likewise, with their routed-expert sets and 48
// greedy tokens. The CUDA-vs-CPU logits ratio is printed for the record (each engine is within
// 1e-4 of the goldens).
std::vector<int32_t> greedy_ids(models::Model& m, const std::vector<int32_t>& ids, int n) {
  models::State st = m.new_state();
  const int64_t V = m.spec().vocab_size;
  std::vector<float> logits(V);
  m.forward(ids, st, models::LogitsMode::kLast, logits.data());
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const int32_t t = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(t);
    if (i + 1 < n) m.forward(std::span<const int32_t>(&t, 1), st, models::LogitsMode::kLast, logits.data());
  }
  return out;
}

std::vector<float> prompt_logits(models::Model& m, const std::vector<int32_t>& ids) {
  std::vector<float> out(ids.size() * m.spec().vocab_size);
  models::State st = m.new_state();
  m.forward(ids, st, models::LogitsMode::kAll, out.data());
  return out;
}

// The fixture families that leave ops on the host on CUDA (models::optional_ops_used(spec) that
// are in CudaBackend::host_fallback_ops()), with those ops: they run as they are (experts read
// from the host mapping). Every other family runs natively and is checked in strict device mode
// (Backend::set_strict_device) with its experts in VRAM (experts::DeviceExperts): a host fallback
// or a host weight copied for one call would throw. The test checks this list against the table.
const std::map<std::string, std::vector<std::string>>& host_fallback_families() {
  // Empty since attention_window, attention_sinks and mla_attention run on the device
  // (cuda_attention.cu): every family is checked in strict mode.
  static const std::map<std::string, std::vector<std::string>> m = {};
  return m;
}

// The ops of `m` that CudaBackend `be` leaves on the host.
std::vector<std::string> host_fallbacks(const models::Model& m, const Backend& be) {
  std::vector<std::string> out;
  for (const std::string& op : models::optional_ops_used(m.spec()))
    if (be.op_run(op) == OpRun::kHostFallback) out.push_back(op);
  return out;
}

// Which layers of `s` have routed experts ([n_layers]), as the expert stores take them.
std::vector<bool> moe_layers(const models::ModelSpec& s) {
  std::vector<bool> moe(s.n_layers);
  for (int i = 0; i < s.n_layers; ++i) moe[i] = s.ffns[i] == models::FfnKind::kMoE;
  return moe;
}

// Puts every routed expert of `m` in VRAM (experts::DeviceExperts), as the loader does when they fit.
void experts_to_vram(models::Model& m, CudaBackend& be) {
  const models::ModelSpec& s = m.spec();
  m.set_expert_provider(std::make_shared<experts::DeviceExperts>(m.expert_provider(), be, moe_layers(s), s.moe.n_experts));
}

TEST(CudaModel, FixturesMatchGoldensAndCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine: model forward on CUDA not checked";
  std::vector<std::string> strict_run, listed;
  for (const char* f : {"qwen3_moe", "qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe_vl", "qwen3_5_moe_vl_fused",
                        "deepseek_v3", "deepseek_v3_kimi", "deepseek_v2_lite", "glm4_moe", "glm4_moe_qknorm",
                        "glm4_moe_lite", "glm4_moe_lite_v24", "minimax_m2", "minimax_m2_top6", "gpt_oss",
                        "gpt_oss_mxfp4", "mixtral", "olmoe", "ernie4_5_moe", "gemma4_text_moe"}) {
    SCOPED_TRACE(f);
    const std::string dir = spool::testing::data_dir() + "/models/" + f;
    auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
    auto cuda = std::make_shared<CudaBackend>(0);
    auto mg = models::load_model(ckpt, cuda);
    auto mc = models::load_model(ckpt, std::make_shared<CpuBackend>(nullptr));
    const std::vector<std::string> fallbacks = host_fallbacks(*mg, *cuda);
    const auto listed_it = host_fallback_families().find(f);
    EXPECT_EQ(fallbacks, listed_it == host_fallback_families().end() ? std::vector<std::string>{} : listed_it->second)
        << "host_fallback_families() is out of date";
    const bool strict = fallbacks.empty();
    if (strict) {
      experts_to_vram(*mg, *cuda);
      cuda->set_strict_device(true);
      strict_run.push_back(f);
    } else {
      listed.push_back(f);
    }
    spool::testing::Golden g(dir + "/golden.safetensors");
    const std::vector<int32_t> ids = g.i32("input_ids"), want_ids = g.i32("greedy_ids");
    const std::vector<float> want = g.f32("logits");
    const int64_t V = mg->spec().vocab_size, T = static_cast<int64_t>(ids.size());
    const std::vector<float> lg = prompt_logits(*mg, ids), lc = prompt_logits(*mc, ids);
    const double vs_golden = spool::testing::expect_rows_close(lg.data(), want.data(), T, V, 1e-4, f);
    std::printf("[ cuda-model ] %-22s logits vs golden %.3g (cpu %.3g), cuda vs cpu %.3g%s\n", f, vs_golden,
                max_row_ratio(lc, want, T, V), max_row_ratio(lg, lc, T, V), strict ? " (strict device mode)" : "");
    const std::vector<int32_t> gg = greedy_ids(*mg, ids, static_cast<int>(want_ids.size()));
    EXPECT_EQ(gg, want_ids);
    EXPECT_EQ(gg, greedy_ids(*mc, ids, static_cast<int>(want_ids.size())));
    if (strict) {
      EXPECT_EQ(cuda->host_fallback_calls(), 0u);
    } else {  // strict mode refuses the first fallback, naming it
      EXPECT_GT(cuda->host_fallback_calls(), 0u);
      experts_to_vram(*mg, *cuda);  // (so that the first refusal is a fallback op, not a host expert)
      cuda->set_strict_device(true);
      try {
        (void)prompt_logits(*mg, ids);
        ADD_FAILURE() << "strict device mode ran a model with host fallbacks";
      } catch (const Error& e) {
        bool named = false;
        for (const std::string& op : fallbacks) named = named || std::string(e.what()).find(op) != std::string::npos;
        EXPECT_TRUE(named) << e.what();
      }
    }
  }
  std::printf("[ cuda-model ] strict device mode: %zu families; host fallbacks (not strict):", strict_run.size());
  for (const std::string& f : listed) std::printf(" %s", f.c_str());
  std::printf("\n");
  // The demo model (strict, experts in VRAM): four prompts, routing and 48 greedy tokens each.
  auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(SPOOL_DEFAULT_MODEL_DIR));
  auto cuda = std::make_shared<CudaBackend>(0);
  auto mg = models::load_model(ckpt, cuda);
  ASSERT_TRUE(host_fallbacks(*mg, *cuda).empty());
  experts_to_vram(*mg, *cuda);
  cuda->set_strict_device(true);
  spool::testing::Golden g(spool::testing::data_dir() + "/models/spool-demo-moe/golden_prompts.safetensors");
  const int64_t V = mg->spec().vocab_size;
  const int L = mg->spec().n_layers, K = mg->spec().moe.top_k;
  for (int p = 0; p < 4; ++p) {
    const std::string k = "p" + std::to_string(p) + ".";
    const std::vector<int32_t> ids = g.i32(k + "input_ids");
    const int64_t T = static_cast<int64_t>(ids.size());
    std::vector<std::set<int>> routes(L * T);
    mg->hooks.on_route = [&](int layer, int64_t t, std::span<const int> e, std::span<const float>) {
      routes[layer * T + t] = std::set<int>(e.begin(), e.end());  // ids only: the weights live on the device
    };
    const std::vector<float> lg = prompt_logits(*mg, ids);
    mg->hooks.on_route = nullptr;
    const double r = spool::testing::expect_rows_close(lg.data(), g.f32(k + "logits").data(), T, V, 1e-4, "demo prompt " + std::to_string(p));
    std::printf("[ cuda-model ] demo prompt %d (%lld tokens) logits vs golden %.3g\n", p, static_cast<long long>(T), r);
    const std::vector<int32_t> topk = g.i32(k + "topk_experts");  // [L, T, K]
    for (int layer = 0; layer < L; ++layer)
      for (int64_t t = 0; t < T; ++t) {
        const std::set<int> want(topk.begin() + (layer * T + t) * K, topk.begin() + (layer * T + t + 1) * K);
        EXPECT_EQ(routes[layer * T + t], want) << "prompt " << p << " layer " << layer << " token " << t;
      }
    EXPECT_EQ(greedy_ids(*mg, ids, 48), g.i32(k + "greedy_ids")) << "prompt " << p;
  }
}

using models::greedy_logits;

// Routed experts resident in VRAM (DeviceExperts), served from the host mapping (copied to the
// GPU per use) and streamed through a cache far smaller than the experts (the small-VRAM-budget
// fallback): the same kernels on the same bytes, so the logits are bit-identical.
TEST(CudaModel, StreamedExpertsMatchVramResidentBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine: CUDA expert placement not checked";
  auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(SPOOL_DEFAULT_MODEL_DIR));
  auto be = std::make_shared<CudaBackend>(0);
  auto m = models::load_model(ckpt, be);
  const models::ModelSpec& s = m->spec();
  const std::vector<bool> moe = moe_layers(s);
  spool::testing::Golden g(spool::testing::data_dir() + "/models/spool-demo-moe/golden_prompts.safetensors");
  const std::vector<int32_t> ids = g.i32("p1.input_ids");
  const uint64_t before = be->uploaded_bytes();
  auto dev = std::make_shared<experts::DeviceExperts>(m->expert_provider(), *be, moe, s.moe.n_experts);
  EXPECT_EQ(be->uploaded_bytes() - before >= dev->bytes(), true);
  m->set_expert_provider(dev);
  const std::vector<float> vram = greedy_logits(*m, ids, 8);
  m->set_expert_provider(nullptr);  // the host mapping
  const uint64_t staged0 = be->staged_bytes();
  const std::vector<float> host = greedy_logits(*m, ids, 8);
  EXPECT_GT(be->staged_bytes(), staged0);  // experts really came from the host
  experts::StreamingOptions so;
  so.cache_budget_bytes = 2 * (dev->bytes() / (static_cast<uint64_t>(s.n_layers) * s.moe.n_experts)) * s.moe.top_k;
  so.workers = 2;
  so.top_k = s.moe.top_k;
  auto streaming = std::make_shared<experts::StreamingExperts>(ckpt, moe, s.moe.n_experts, s.hidden_size, s.moe.intermediate, so);
  m->set_expert_provider(streaming);
  const std::vector<float> streamed = greedy_logits(*m, ids, 8);
  ASSERT_EQ(vram.size(), host.size());
  EXPECT_EQ(std::memcmp(vram.data(), host.data(), vram.size() * 4), 0) << "VRAM-resident vs host-mapped experts";
  EXPECT_EQ(std::memcmp(vram.data(), streamed.data(), vram.size() * 4), 0) << "VRAM-resident vs streamed experts";
  // The three tiers: VRAM expert slots (experts::DeviceExpertCache) of two sizes in front of the
  // host mapping and in front of the streaming cache (RAM tier, then disk).
  m->set_expert_provider(nullptr);
  auto mapping = m->shared_expert_provider();
  const int n_moe = static_cast<int>(std::count(moe.begin(), moe.end(), true));
  for (const bool over_streaming : {false, true})
    for (const int slots : {s.moe.top_k, n_moe * s.moe.n_experts}) {  // one token's experts; every expert
      SCOPED_TRACE(std::string(over_streaming ? "slots over streaming, " : "slots over the mapping, ") + std::to_string(slots));
      std::shared_ptr<experts::ExpertProvider> src = over_streaming ? std::shared_ptr<experts::ExpertProvider>(streaming) : mapping;
      experts::DeviceExpertCache probe(src, *be, moe, s.moe.n_experts, uint64_t{1} << 40, 1);
      const uint64_t before_slots = be->slot_copied_bytes();
      auto cache = std::make_shared<experts::DeviceExpertCache>(src, *be, moe, s.moe.n_experts, probe.slot_bytes() * slots, s.moe.top_k);
      m->set_expert_provider(cache);
      const std::vector<float> tiered = greedy_logits(*m, ids, 8);
      m->set_expert_provider(nullptr);
      EXPECT_EQ(std::memcmp(vram.data(), tiered.data(), vram.size() * 4), 0) << "VRAM-resident vs VRAM slots";
      // With every expert in a slot, experts routed to again are hits (with one token's worth,
      // each layer evicts the previous one's: LRU over 8 layers never hits).
      if (slots == n_moe * s.moe.n_experts) {
        EXPECT_GT(cache->stats().hits, 0u);
      }
      EXPECT_GT(cache->stats().misses, 0u);
      EXPECT_GT(be->slot_copied_bytes(), before_slots);  // the misses were copied into VRAM slots
    }
  // The loader's tiers on a GPU: VRAM slots at two sizes in front of a page-locked streaming
  // cache (StreamingOptions::pin_with; copies on the copy stream, started by prepare() for experts
  // in RAM) with a small RAM budget (disk behind it) and one that holds every expert.
  for (const bool all_in_ram : {false, true})
    for (const int slots : {s.moe.top_k, 3 * s.moe.top_k}) {
      SCOPED_TRACE(std::string(all_in_ram ? "pinned RAM tier of every expert, " : "small pinned RAM tier, ") + std::to_string(slots) + " slots");
      experts::StreamingOptions po = so;
      po.pin_with = be.get();
      po.hold_all = all_in_ram;
      auto pinned = std::make_shared<experts::StreamingExperts>(ckpt, moe, s.moe.n_experts, s.hidden_size, s.moe.intermediate, po);
      EXPECT_GT(pinned->stats().pinned_bytes, 0u) << "cudaHostRegister of the cache failed";
      experts::DeviceExpertCache probe(pinned, *be, moe, s.moe.n_experts, uint64_t{1} << 40, 1);
      auto cache = std::make_shared<experts::DeviceExpertCache>(pinned, *be, moe, s.moe.n_experts, probe.slot_bytes() * slots, s.moe.top_k);
      // Constructing the probe and the cache read expert 0 of each MoE layer (the slot size): count from here.
      const uint64_t requests0 = pinned->stats().requests;
      m->set_expert_provider(cache);
      const std::vector<float> first = greedy_logits(*m, ids, 8);
      const std::vector<float> second = greedy_logits(*m, ids, 8);  // experts now in RAM: copies start in prepare()
      m->set_expert_provider(nullptr);
      EXPECT_EQ(std::memcmp(vram.data(), first.data(), vram.size() * 4), 0) << "VRAM-resident vs slots over pinned RAM";
      EXPECT_EQ(std::memcmp(vram.data(), second.data(), vram.size() * 4), 0) << "VRAM-resident vs slots over pinned RAM, again";
      be->synchronize();
      cache->update_stall();
      const experts::DeviceExpertCache::Stats st = cache->stats();
      EXPECT_GT(st.misses, 0u);
      EXPECT_EQ(st.bytes_copied, st.misses * probe.slot_bytes());
      EXPECT_EQ(pinned->stats().requests - requests0, st.misses);
      if (all_in_ram) {
        EXPECT_GT(st.early, 0u);
      }
      EXPECT_GE(st.stall_s, 0.0);
    }
}

// The routed expert path on a GPU (DeviceExperts' tables, Backend::expert_ffn_routed: the routing
// ids stay on the device) decodes the q4-converted demo model with the bits of the host-grouped
// path (forced here by a routing observer, which needs the ids on the host).
TEST(CudaModel, RoutedExpertPathMatchesHostGroupedPathBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine: the routed expert path not checked";
  const std::string dir = ::testing::TempDir() + "/cuda_routed_q4";
  spool::testing::convert_demo(dir, "q4");
  auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
  auto be = std::make_shared<CudaBackend>(0);
  auto m = models::load_model(ckpt, be);
  const models::ModelSpec& s = m->spec();
  const std::vector<bool> moe = moe_layers(s);
  auto dev = std::make_shared<experts::DeviceExperts>(m->expert_provider(), *be, moe, s.moe.n_experts);
  for (int i = 0; i < s.n_layers; ++i)
    if (moe[i]) {
      ASSERT_NE(dev->device_table(i), nullptr) << "layer " << i << ": no device table for q4 experts";
    }
  m->set_expert_provider(dev);
  spool::testing::Golden g(spool::testing::data_dir() + "/models/spool-demo-moe/golden_prompts.safetensors");
  const std::vector<int32_t> ids = g.i32("p1.input_ids");
  const std::vector<float> routed = greedy_logits(*m, ids, 8);
  int observed = 0;
  m->hooks.on_route = [&](int, int64_t, std::span<const int>, std::span<const float>) { ++observed; };
  const std::vector<float> host = greedy_logits(*m, ids, 8);
  m->hooks.on_route = nullptr;
  EXPECT_GT(observed, 0);
  ASSERT_EQ(routed.size(), host.size());
  EXPECT_EQ(std::memcmp(routed.data(), host.data(), routed.size() * 4), 0) << "routed path vs host-grouped path";
  // Static placement (--vram-experts static): a share of each layer's experts in VRAM, the rest in
  // mapped page-locked host memory that the kernels read in place; same bits at every share.
  m->set_expert_provider(nullptr);
  auto mapping = m->shared_expert_provider();
  for (const double frac : {0.0, 0.4}) {
    SCOPED_TRACE("static placement, VRAM share " + std::to_string(frac));
    const uint64_t mapped0 = be->host_mapped_bytes();
    auto st = std::make_shared<experts::DeviceExperts>(*mapping, *be, moe, s.moe.n_experts, static_cast<uint64_t>(frac * dev->bytes()));
    EXPECT_GT(st->experts_in_host(), 0);
    EXPECT_GT(be->host_mapped_bytes(), mapped0);
    for (int i = 0; i < s.n_layers; ++i)
      if (moe[i]) {
        ASSERT_NE(st->device_table(i), nullptr) << "layer " << i;
      }
    m->set_expert_provider(st);
    const std::vector<float> placed = greedy_logits(*m, ids, 8);
    m->set_expert_provider(nullptr);
    EXPECT_EQ(std::memcmp(routed.data(), placed.data(), routed.size() * 4), 0) << "static placement vs all experts in VRAM";
  }
  m.reset();
  std::filesystem::remove_all(dir);
}

// A spool-quantized embedding table (spool convert --embed-bits 4) on CUDA: the rows are
// dequantized on the host (DecoderModel::embed) and copied up as f32, so the GPU run equals the
// CPU run of the same file (1e-4); with tied embeddings (ernie4_5_moe) the quantized table is
// also the output projection, uploaded and run by the device's quantized matmul. qwen3_moe runs
// in strict device mode (no host fallbacks, experts in VRAM).
TEST(CudaModel, QuantizedEmbeddingMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine: quantized embeddings on CUDA not checked";
  for (const char* f : {"qwen3_moe", "ernie4_5_moe"}) {
    SCOPED_TRACE(f);
    const std::string src = spool::testing::data_dir() + "/models/" + f;
    const std::string dir = ::testing::TempDir() + "/cuda_qembed_" + f;
    std::filesystem::remove_all(dir);
    quant::ConvertOptions o;
    o.in_dir = src;
    o.out_dir = dir;
    o.rules = &models::checkpoint_rules();
    o.recipe = quant::recipe("q4");
    quant::apply_overrides(&o.recipe, quant::RecipeOverrides{.embed_bits = "4"});
    o.threads = 2;
    quant::convert(o, nullptr);
    auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
    ASSERT_NE(ckpt->find("embed_tokens.qweight"), nullptr);
    auto cuda = std::make_shared<CudaBackend>(0);
    auto mg = models::load_model(ckpt, cuda);
    auto mc = models::load_model(ckpt, std::make_shared<CpuBackend>(nullptr));
    if (host_fallbacks(*mg, *cuda).empty()) {
      experts_to_vram(*mg, *cuda);
      cuda->set_strict_device(true);
    }
    spool::testing::Golden g(src + "/golden.safetensors");
    const std::vector<int32_t> ids = g.i32("input_ids");
    const int64_t V = mg->spec().vocab_size, T = static_cast<int64_t>(ids.size());
    const std::vector<float> lg = prompt_logits(*mg, ids), lc = prompt_logits(*mc, ids);
    spool::testing::expect_rows_close(lg.data(), lc.data(), T, V, 1e-4, f);
    EXPECT_EQ(greedy_ids(*mg, ids, 6), greedy_ids(*mc, ids, 6));
    mg.reset();
    mc.reset();
    std::filesystem::remove_all(dir);
  }
}

// The Gated DeltaNet states live on the GPU (State::place); snapshot / restore / serialize /
// deserialize move them through the host. Continuing after a restore, or from a deserialized
// image in a fresh state, gives the logits of the uninterrupted run, bit for bit.
TEST(CudaModel, DeviceStateSnapshotsAndImagesRoundTrip) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine: device-resident model state not checked";
  for (const char* f : {"qwen3_5_moe_text", "qwen3_next"}) {
    SCOPED_TRACE(f);
    auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(spool::testing::data_dir() + "/models/" + f));
    auto m = models::load_model(ckpt, std::make_shared<CudaBackend>(0));
    spool::testing::Golden g(spool::testing::data_dir() + "/models/" + f + "/golden.safetensors");
    const std::vector<int32_t> ids = g.i32("input_ids");
    ASSERT_GE(ids.size(), 4u);
    const size_t half = ids.size() / 2;
    const std::vector<int32_t> a(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(half)), b(ids.begin() + static_cast<std::ptrdiff_t>(half), ids.end());
    const int64_t V = m->spec().vocab_size;
    std::vector<float> want(V), got(V), scratch(V);
    models::State st = m->new_state();
    m->forward(a, st, models::LogitsMode::kLast, scratch.data());
    const models::StateSnapshot snap = st.snapshot(true);
    std::string image;
    st.serialize(image);
    m->forward(b, st, models::LogitsMode::kLast, want.data());
    // restore, then the same continuation
    st.restore(snap);
    m->forward(b, st, models::LogitsMode::kLast, got.data());
    EXPECT_EQ(std::memcmp(want.data(), got.data(), V * 4), 0) << "after restore()";
    // a fresh state from the image
    models::State fresh = m->new_state();
    fresh.reserve(static_cast<int64_t>(half));
    fresh.deserialize(image, static_cast<int64_t>(half));
    m->forward(b, fresh, models::LogitsMode::kLast, got.data());
    EXPECT_EQ(std::memcmp(want.data(), got.data(), V * 4), 0) << "after deserialize()";
    // reset() zeroes the device state: the prompt from scratch gives the first run's logits again
    fresh.reset();
    m->forward(a, fresh, models::LogitsMode::kLast, got.data());
    EXPECT_EQ(std::memcmp(scratch.data(), got.data(), V * 4), 0) << "after reset()";
  }
}

// The demo model's MTP head on the GPU (mtp_forward through CudaBackend ops) against the CPU, and
// a verify step cut back inside the step (the Gated DeltaNet trail in device memory,
// State::rewind_in_step) against the shorter run: speculative decoding's two device paths.
TEST(CudaModel, MtpHeadAndStepRewindMatchTheCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device on this machine: the MTP head on the GPU not checked";
  auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(SPOOL_DEFAULT_MODEL_DIR, {.mtp = true}));
  auto cpu = models::load_model(ckpt, std::make_shared<CpuBackend>(nullptr));
  auto gpu = models::load_model(ckpt, std::make_shared<CudaBackend>(0));
  ASSERT_EQ(gpu->mtp_layers(), 1);
  const std::vector<int32_t> ids = {48, 475, 471, 2201, 4562, 7666, 27, 2774, 735, 1879, 25, 330, 557, 272};
  const int64_t V = cpu->spec().vocab_size, T = static_cast<int64_t>(ids.size()) - 1;
  EXPECT_LE(max_row_ratio(spool::testing::head_logits(*gpu, ids), spool::testing::head_logits(*cpu, ids), T, V), 1e-4) << "head logits";
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 8), more = {100, 200, 300, 400};
  std::vector<float> a(V), b(4 * V);
  for (int keep = 1; keep <= 3; ++keep) {
    SCOPED_TRACE(keep);
    models::State ref = gpu->new_state(), st = gpu->new_state();
    gpu->forward(prompt, ref, models::LogitsMode::kNone, a.data());
    gpu->forward(std::span<const int32_t>(more.data(), keep), ref, models::LogitsMode::kNone, a.data());
    const int32_t seven = 7;
    gpu->forward(std::span<const int32_t>(&seven, 1), ref, models::LogitsMode::kLast, a.data());
    st.keep_step_trail(3);
    gpu->forward(prompt, st, models::LogitsMode::kNone, b.data());
    st.arm_step_trail();
    gpu->forward(more, st, models::LogitsMode::kAll, b.data());
    st.rewind_in_step(static_cast<int64_t>(prompt.size()) + keep);
    gpu->forward(std::span<const int32_t>(&seven, 1), st, models::LogitsMode::kLast, b.data());
    EXPECT_LE(max_row_ratio(b, a, 1, V), 1e-5) << "rewound inside the step";
  }
}

}  // namespace
}  // namespace spool::ops
