// The planner on the non-Qwen model families (DeepSeek-V2/V3, Mixtral, OLMoE, GLM-4.5,
// GLM-4.7-Flash, MiniMax-M2): KV bytes per token against hand-computed values from each
// fixture's config.json, the sliding window cap, and routed-expert bytes against sums over the
// safetensors headers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "common/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "models/presets.h"
#include "models/spec.h"
#include "plan/arch.h"
#include "plan/projection.h"
#include "models/family.h"

namespace spool::plan {
namespace {

namespace fs = std::filesystem;

std::string fixture(const char* name) { return std::string(SPOOL_TEST_DATA_DIR) + "/models/" + name; }

struct HeaderSums {
  uint64_t experts = 0;  // routed experts' gate/up/down weights of layers < n_layers
  uint64_t kept = 0;     // every tensor but those of layers >= n_layers
};

// Reads model.safetensors' header directly (not through io::) and sums tensor sizes.
HeaderSums header_sums(const std::string& dir, int n_layers) {
  std::ifstream f(dir + "/model.safetensors", std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string h(n, '\0');
  f.read(h.data(), static_cast<std::streamsize>(n));
  const auto j = nlohmann::json::parse(h);
  static const std::regex expert(R"(model\.layers\.(\d+)\.(mlp\.experts\.\d+\.(gate|up|down)_proj|block_sparse_moe\.experts\.\d+\.w[123])\.weight)");
  static const std::regex layer(R"(model\.layers\.(\d+)\..*)");
  HeaderSums s;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") continue;
    const uint64_t bytes = v["data_offsets"][1].get<uint64_t>() - v["data_offsets"][0].get<uint64_t>();
    std::smatch m;
    if (std::regex_match(name, m, layer) && std::stoi(m[1]) >= n_layers) continue;
    s.kept += bytes;
    if (std::regex_match(name, m, expert)) s.experts += bytes;
  }
  return s;
}

PlanInputs inputs(int64_t ctx, int kv_bits = 32) {
  PlanInputs in;
  in.available = 64ull << 30;
  in.shape.ctx = ctx;
  in.shape.kv_bits = kv_bits;
  in.kv_bits_given = true;
  in.model_arg = "m";
  return in;
}

// A copy of fixture `name` whose config.json is edited by `edit` (the weights are linked).
struct EditedFixture {
  std::string dir;
  template <class F>
  EditedFixture(const char* name, F edit) {
    char tmpl[] = "/tmp/spool_arch_test_XXXXXX";
    dir = mkdtemp(tmpl);
    const std::string src = fixture(name);
    nlohmann::json c = nlohmann::json::parse(std::ifstream(src + "/config.json"));
    edit(c);
    std::ofstream(dir + "/config.json") << c.dump(2);
    fs::create_symlink(src + "/model.safetensors", dir + "/model.safetensors");
  }
  ~EditedFixture() { fs::remove_all(dir); }
};

TEST(PlanArch, DeepSeekCachesTheMlaLatent) {
  for (const char* name : {"deepseek_v3", "deepseek_v2_lite"}) {
    SCOPED_TRACE(name);
    const io::Checkpoint ck = models::open_checkpoint(fixture(name), {.map = false});
    const PlanModel pm = plan_model(ck);
    // config.json: kv_lora_rank 32 + qk_rope_head_dim 8 per layer and token, 3 layers.
    EXPECT_EQ(pm.spec.attn.kv_latent_dim, 32 + 8);
    ASSERT_EQ(pm.spec.ffns.size(), 3u);  // first_k_dense_replace 1: layer 0 dense, 1 and 2 MoE
    EXPECT_EQ(pm.spec.ffns[0], models::FfnKind::kDense);
    EXPECT_EQ(pm.spec.ffns[1], models::FfnKind::kMoE);
    EXPECT_EQ(pm.spec.ffns[2], models::FfnKind::kMoE);
    EXPECT_EQ(pm.spec.moe.n_experts, 16);
    EXPECT_EQ(pm.spec.moe.top_k, 4);
    EXPECT_EQ(pm.spec.moe.shared_intermediate, (std::string(name) == "deepseek_v3" ? 1 : 2) * 32);  // n_shared_experts x 32

    const Projection p = project(ck, inputs(1000));
    EXPECT_EQ(p.state.kv_per_token, 3u * (32 + 8) * 4);  // f32
    EXPECT_EQ(p.kv_capacity, 1024);
    EXPECT_EQ(p.state.kv, 3u * (32 + 8) * 4 * 1024);
    EXPECT_EQ(project(ck, inputs(1000, 16)).state.kv_per_token, 3u * (32 + 8) * 2);
    EXPECT_EQ(project(ck, inputs(1000, 8)).state.kv_per_token, 3u * (32 + 8 + 4));  // int8 + one f32 scale (40 % 32 != 0)
    EXPECT_NE(p.command, "");
    EXPECT_EQ(p.verdict, Verdict::kResident);

    // Routed experts: 2 MoE layers x 16 experts x (gate + up + down) [32 x 64] f32.
    const HeaderSums h = header_sums(fixture(name), 3);
    EXPECT_EQ(h.experts, 2u * 16 * 3 * 32 * 64 * 4);
    EXPECT_EQ(p.weights.experts, h.experts);
    EXPECT_EQ(p.weights.total, h.kept);
    EXPECT_EQ(p.expert_count, 2u * 16);
    EXPECT_EQ(p.expert_bytes_per_token, 2u * 4 * 3 * 32 * 64 * 4);  // top-4 in each MoE layer
  }
}

TEST(PlanArch, DeepSeekLayersPastNumHiddenLayersAreLeftOut) {
  // DeepSeek-V3 stores its multi-token-prediction layer as layers.<num_hidden_layers>: with
  // num_hidden_layers 2, the fixture's layer 2 plays that part.
  EditedFixture d("deepseek_v3", [](nlohmann::json& c) { c["num_hidden_layers"] = 2; });
  const io::Checkpoint ck = models::open_checkpoint(d.dir, {.map = false});
  const Projection p = project(ck, inputs(256));
  const HeaderSums h = header_sums(d.dir, 2);
  EXPECT_EQ(h.experts, 1u * 16 * 3 * 32 * 64 * 4);
  EXPECT_EQ(p.weights.experts, h.experts);
  EXPECT_EQ(p.weights.total, h.kept);
  EXPECT_EQ(p.weights.dense, h.kept - h.experts);
  EXPECT_EQ(p.state.kv_per_token, 2u * 40 * 4);
}

TEST(PlanArch, MixtralAndOlmoeCacheKAndVPerKvHead) {
  {
    // Mixtral: 2 layers x (K + V) x 2 KV heads x head_dim 64/4 = 16, f32.
    const io::Checkpoint ck = models::open_checkpoint(fixture("mixtral"), {.map = false});
    const Projection p = project(ck, inputs(4096));
    EXPECT_EQ(p.state.kv_per_token, 2u * 2 * 2 * 16 * 4);
    EXPECT_EQ(p.kv_capacity, 4096);  // sliding_window null: the whole context
    EXPECT_EQ(p.state.kv, 2u * 2 * 2 * 16 * 4 * 4096);
    // Experts from block_sparse_moe.experts.E.w1/w2/w3: 2 layers x 4 x 3 x [96 x 64] f32.
    const HeaderSums h = header_sums(fixture("mixtral"), 2);
    EXPECT_EQ(h.experts, 2u * 4 * 3 * 96 * 64 * 4);
    EXPECT_EQ(p.weights.experts, h.experts);
    EXPECT_EQ(p.weights.total, h.kept);
    EXPECT_EQ(p.expert_count, 8u);
    EXPECT_EQ(p.expert_bytes_per_token, 2u * 2 * 3 * 96 * 64 * 4);
  }
  {
    // OLMoE: 2 layers x (K + V) x 4 KV heads x 16, f32.
    const io::Checkpoint ck = models::open_checkpoint(fixture("olmoe"), {.map = false});
    const Projection p = project(ck, inputs(300));
    EXPECT_EQ(p.state.kv_per_token, 2u * 2 * 4 * 16 * 4);
    EXPECT_EQ(p.kv_capacity, 512);
    const HeaderSums h = header_sums(fixture("olmoe"), 2);
    EXPECT_EQ(h.experts, 2u * 8 * 3 * 32 * 64 * 4);
    EXPECT_EQ(p.weights.experts, h.experts);
    EXPECT_EQ(p.weights.total, h.kept);
    EXPECT_EQ(p.expert_count, 16u);
  }
}

// GLM-4.5 (glm4_moe: GQA with q/k/v biases, first_k_dense_replace 1), GLM-4.7-Flash
// (glm4_moe_lite: MLA latent, mlp_layer_types [dense, sparse, sparse]) and MiniMax-M2 (GQA, MoE
// in every layer, experts as block_sparse_moe.experts.E.w1/w2/w3): hand-computed from each
// fixture's config.json (H 64, 3 layers, 16 experts top-4 of width 32).
TEST(PlanArch, GlmAndMiniMaxFixtures) {
  struct Want {
    const char* name;
    uint64_t kv_per_token;  // f32
    int moe_layers;
    int shared;  // shared-expert width
  };
  for (const Want& w : {Want{"glm4_moe", 3u * 2 * 2 * 16 * 4, 2, 32},      // 3 layers x (K + V) x 2 KV heads x head_dim 16
                        Want{"glm4_moe_lite", 3u * (32 + 8) * 4, 2, 32},  // kv_lora_rank 32 + qk_rope_head_dim 8
                        Want{"minimax_m2", 3u * 2 * 2 * 16 * 4, 3, 0}}) {
    SCOPED_TRACE(w.name);
    const io::Checkpoint ck = models::open_checkpoint(fixture(w.name), {.map = false});
    const PlanModel pm = plan_model(ck);
    ASSERT_EQ(pm.spec.ffns.size(), 3u);
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(pm.spec.ffns[i], i >= 3 - w.moe_layers ? models::FfnKind::kMoE : models::FfnKind::kDense) << "layer " << i;
    EXPECT_EQ(pm.spec.moe.n_experts, 16);
    EXPECT_EQ(pm.spec.moe.top_k, 4);
    EXPECT_EQ(pm.spec.moe.shared_intermediate, w.shared);
    const Projection p = project(ck, inputs(1000));
    EXPECT_EQ(p.state.kv_per_token, w.kv_per_token);
    EXPECT_EQ(p.state.kv, w.kv_per_token * 1024);
    const HeaderSums h = header_sums(fixture(w.name), 3);
    EXPECT_EQ(h.experts, static_cast<uint64_t>(w.moe_layers) * 16 * 3 * 32 * 64 * 4);
    EXPECT_EQ(p.weights.experts, h.experts);
    EXPECT_EQ(p.weights.total, h.kept);
    EXPECT_EQ(p.expert_count, static_cast<uint64_t>(w.moe_layers) * 16);
    EXPECT_EQ(p.expert_bytes_per_token, static_cast<uint64_t>(w.moe_layers) * 4 * 3 * 32 * 64 * 4);  // top-4 per MoE layer
    EXPECT_EQ(p.verdict, Verdict::kResident);
  }
  // glm4_moe's attention: q/k/v biases, half of each head rotated; glm4_moe_lite's latent norms
  // at 1e-6 beside rms_norm_eps 1e-5; MiniMax-M2's q/k norms over the whole projection.
  const PlanModel glm = plan_model(models::open_checkpoint(fixture("glm4_moe"), {.map = false}));
  EXPECT_TRUE(glm.spec.attn.qkv_bias);
  EXPECT_EQ(glm.spec.attn.rotary_dim, 8);
  EXPECT_EQ(glm.spec.attn.qk_norm, models::QkNorm::kNone);
  const PlanModel lite = plan_model(models::open_checkpoint(fixture("glm4_moe_lite"), {.map = false}));
  EXPECT_FLOAT_EQ(lite.spec.mla.latent_norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(lite.spec.rms_norm_eps, 1e-5f);
  EXPECT_EQ(lite.spec.mla.v_head_dim, 16);
  EXPECT_FLOAT_EQ(lite.spec.moe.routed_scaling_factor, 1.8f);
  const PlanModel mm = plan_model(models::open_checkpoint(fixture("minimax_m2"), {.map = false}));
  EXPECT_EQ(mm.spec.attn.qk_norm, models::QkNorm::kWholeProjection);
  EXPECT_EQ(mm.spec.attn.rotary_dim, 8);
  EXPECT_TRUE(mm.spec.moe.score_bias);
  // MiniMax-M2's release config names rotary_dim; transformers reads only partial_rotary_factor,
  // so without it every head dim rotates, and the plan says so.
  EditedFixture rot("minimax_m2", [](nlohmann::json& c) {
    c["rope_parameters"].erase("partial_rotary_factor");
    c["rotary_dim"] = 8;
  });
  const PlanModel mr = plan_model(models::open_checkpoint(rot.dir, {.map = false}));
  EXPECT_EQ(mr.spec.attn.rotary_dim, 16);
  bool noted = false;
  for (const std::string& n : mr.notes) noted = noted || n.find("rotary_dim") != std::string::npos;
  EXPECT_TRUE(noted);
  // A mlp_layer_types list of the wrong length is refused, naming the field.
  EditedFixture bad("glm4_moe_lite", [](nlohmann::json& c) { c["mlp_layer_types"] = {"dense", "sparse"}; });
  try {
    plan_model(models::open_checkpoint(bad.dir, {.map = false}));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mlp_layer_types"), std::string::npos) << e.what();
  }
}

// The synth presets of the new families at their released shapes: parameter counts (without
// the multi-token-prediction layers) against the published totals (2.5%; 106.85B, 352.80B,
// 29.94B, 228.69B here) and, without the embedding table and lm_head, the "A..B" active sizes
// of the model names (10%; 12.18B, 32.08B, 3.26B, 9.80B here).
TEST(PlanArch, GlmAndMiniMaxPresetsHaveTheReleasedSizes) {
  struct Want {
    const char* preset;
    double total, active;  // billions, as published
  };
  for (const Want& w : {Want{"glm-4.5-air", 106, 12}, Want{"glm-4.6", 355, 32}, Want{"glm-4.7-flash", 30, 3},
                        Want{"minimax-m2", 230, 10}}) {
    SCOPED_TRACE(w.preset);
    const models::Preset& p = models::preset(w.preset);
    const models::ModelSpec s = models::build_spec(io::Config(p.config, "preset"), io::GenerationDefaults{}, false, "preset");
    const double tables = 2.0 * static_cast<double>(s.vocab_size) * s.hidden_size;  // embed_tokens + lm_head (untied)
    std::printf("%s: %.2fB total, %.2fB active (%.2fB without the tables)\n", w.preset, s.params_total / 1e9,
                s.params_active / 1e9, (s.params_active - tables) / 1e9);
    EXPECT_FALSE(s.tie_word_embeddings);
    EXPECT_NEAR(s.params_total / 1e9, w.total, 0.025 * w.total);
    EXPECT_NEAR((s.params_active - tables) / 1e9, w.active, 0.10 * w.active);
  }
}

// gpt-oss: K and V per KV head on every layer (sinks add no KV), the window of the sliding
// layers (0 and 2 of 4, W = 8) bounds both what a token reads there and what their caches hold
// (W - 1 + the 300-token prefill chunk), the full layers hold the context; MXFP4 experts
// counted as their blocks + E8M0 scales.
TEST(PlanArch, GptOssWindowsEveryOtherLayerAndCountsMxfp4Experts) {
  for (const char* name : {"gpt_oss", "gpt_oss_mxfp4"}) {
    SCOPED_TRACE(name);
    const io::Checkpoint ck = models::open_checkpoint(fixture(name), {.map = false});
    const Projection p = project(ck, inputs(300));
    EXPECT_TRUE(p.spec.attn.sinks);
    EXPECT_EQ(p.spec.attn.sliding_window, 8);
    EXPECT_EQ(p.spec.attn.window_layers, (std::vector<bool>{true, false, true, false}));
    const uint64_t per_layer = 2u * 2 * 16 * 4;  // K + V x 2 KV heads x 16 dims, f32
    EXPECT_EQ(p.state.kv_per_token, 4 * per_layer);
    EXPECT_TRUE(p.spec.attn.window_bounds_kv);
    EXPECT_EQ(p.kv_capacity, 512);           // full layers: every position (capacity rounded up to 256s)
    EXPECT_EQ(p.kv_capacity_windowed, 307);  // sliding layers: 8 - 1 + one prefill chunk of 300
    EXPECT_EQ(p.state.kv, per_layer * (2 * 512 + 2 * 307));
    const Projection big = project(ck, inputs(100000));  // the sliding layers stay at 8 - 1 + a 512 chunk
    EXPECT_EQ(big.kv_capacity_windowed, 8 - 1 + 512);
    EXPECT_EQ(big.state.kv, per_layer * (2 * static_cast<uint64_t>(big.kv_capacity) + 2 * (8 - 1 + 512)));
    // 4 layers x 8 experts: gate_up [128, 64] and down [64, 64].
    const uint64_t per_expert = std::string(name) == "gpt_oss" ? (128u * 64 + 64 * 64) * 4 : 128u * (32 + 2) + 64 * (32 + 2);
    EXPECT_EQ(p.weights.experts, 4 * 8 * per_expert);
    EXPECT_EQ(p.expert_bytes_per_token, 4u * 2 * per_expert);
    const uint64_t embed_row = p.weights.embed_on_demand / p.spec.vocab_size;
    EXPECT_EQ(p.active_bytes_per_token,
              p.weights.resident_dense + embed_row + p.expert_bytes_per_token + per_layer * (2 * 8 + 2 * 300));
  }
}

// Mixtral's sliding window bounds every layer's cache (about W - 1 + the prefill step
// positions, whatever the context) and the bytes read per token (the window).
TEST(PlanArch, SlidingWindowBoundsReadsAndTheKvCache) {
  EditedFixture d("mixtral", [](nlohmann::json& c) { c["sliding_window"] = 300; });
  const io::Checkpoint ck = models::open_checkpoint(d.dir, {.map = false});
  const uint64_t per = 2u * 2 * 2 * 16 * 4;
  const Projection p = project(ck, inputs(4096));
  EXPECT_EQ(p.spec.attn.sliding_window, 300);
  EXPECT_TRUE(p.spec.attn.window_bounds_kv);
  EXPECT_EQ(p.state.kv_per_token, per);         // per token unchanged
  EXPECT_EQ(p.kv_capacity_windowed, 300 - 1 + 512);  // positions held: the window before a 512-token chunk
  EXPECT_EQ(p.state.kv, per * (300 - 1 + 512));
  EXPECT_EQ(project(ck, inputs(100000)).state.kv, p.state.kv);  // independent of the context
  // Per token: KV over the window, not the context (and one row of the untied embedding).
  EXPECT_EQ(p.active_bytes_per_token,
            p.weights.resident_dense + p.weights.embed_on_demand / p.spec.vocab_size + p.expert_bytes_per_token + per * 300);
  EditedFixture bad("mixtral", [](nlohmann::json& c) { c["sliding_window"] = 0; });
  EXPECT_THROW(project(models::open_checkpoint(bad.dir, {.map = false}), inputs(4096)), Error);
}

// Bytes read per decoded token: the engine reads one row of an untied embedding table
// (models/decoder.cpp: pread of the token's row), all of lm_head and the other resident dense
// weights, the top-k experts and the KV cache; never the whole embedding table.
TEST(PlanArch, ActiveBytesCountOneEmbeddingRow) {
  const std::string src = fixture("qwen3_moe");
  auto expect_active = [](const Projection& p, uint64_t embed_row, int64_t ctx) {
    EXPECT_EQ(p.active_bytes_per_token, p.weights.resident_dense + embed_row + p.expert_bytes_per_token + p.state.kv_per_token * ctx);
  };
  {
    SCOPED_TRACE("untied, float lm_head");
    const io::Checkpoint ck = models::open_checkpoint(src, {.map = false});
    const Projection p = project(ck, inputs(300));
    const uint64_t table = ck.tensor("embed_tokens.weight").nbytes;
    EXPECT_EQ(p.weights.embed_on_demand, table);
    expect_active(p, table / p.spec.vocab_size, 300);
  }
  // Rewrites the fixture's shard with lm_head replaced by `lm_head` tensors (none: tied).
  auto rewrite = [&](const std::string& dir, bool quantized_head) {
    fs::create_directories(dir);
    nlohmann::json c = nlohmann::json::parse(std::ifstream(src + "/config.json"));
    if (!quantized_head) c["tie_word_embeddings"] = true;
    std::ofstream(dir + "/config.json") << c.dump(2);
    io::SafetensorsFile f = io::SafetensorsFile::open(src + "/model.safetensors");
    std::vector<io::TensorToWrite> ts;
    std::vector<uint8_t> q, scales;
    int64_t V = 0, H = 0;
    for (const auto& t : f.tensors()) {
      if (t.name == "lm_head.weight") {
        V = t.shape[0], H = t.shape[1];
        continue;
      }
      ts.push_back({t.name, t.dtype, t.shape, f.data(t)});
    }
    ASSERT_GT(V, 0);
    q.assign(static_cast<size_t>(V * H / 2), 0);
    scales.assign(static_cast<size_t>(V * (H / 32) * 2), 0);
    if (quantized_head) {  // spool's quantized layout: 4-bit codes, f16 scales per 32 columns
      ts.push_back({"lm_head.qweight", io::DType::U8, {V, H / 2}, q.data()});
      ts.push_back({"lm_head.scales", io::DType::F16, {V, H / 32}, scales.data()});
    }
    io::write_safetensors(dir + "/model.safetensors", ts);
  };
  const std::string tmp = testing::TempDir() + "arch_test_active";
  fs::remove_all(tmp);
  {
    SCOPED_TRACE("untied, quantized lm_head (lm_head.qweight)");
    rewrite(tmp + "/qhead", true);
    const io::Checkpoint ck = models::open_checkpoint(tmp + "/qhead", {.map = false});
    const Projection p = project(ck, inputs(300));
    const uint64_t table = ck.tensor("embed_tokens.weight").nbytes;
    EXPECT_EQ(p.weights.embed_on_demand, table);  // the table is read row by row, not resident
    EXPECT_EQ(p.weights.resident_dense + table + p.weights.experts, p.weights.total);
    expect_active(p, table / p.spec.vocab_size, 300);
  }
  {
    SCOPED_TRACE("tied: the embedding table is lm_head");
    rewrite(tmp + "/tied", false);
    const io::Checkpoint ck = models::open_checkpoint(tmp + "/tied", {.map = false});
    const Projection p = project(ck, inputs(300));
    EXPECT_EQ(p.weights.embed_on_demand, 0u);
    EXPECT_EQ(p.weights.resident_dense + p.weights.experts, p.weights.total);
    expect_active(p, 0, 300);
  }
  // The memory-bandwidth decode bound divides by these bytes.
  PlanInputs in = inputs(300);
  in.mem_gbps = 10.0;
  const Projection p = project(models::open_checkpoint(src, {.map = false}), in);
  ASSERT_TRUE(p.tok_s_mem_bound.has_value());
  EXPECT_DOUBLE_EQ(*p.tok_s_mem_bound, 10e9 / static_cast<double>(p.active_bytes_per_token));
  fs::remove_all(tmp);
}

TEST(PlanArch, SupportedModelsStayRunnableAndOthersAreRefused) {
  const io::Checkpoint ck = models::open_checkpoint(fixture("qwen3_moe"), {.map = false});
  const PlanModel pm = plan_model(ck);
  EXPECT_EQ(pm.spec.attn.kv_latent_dim, 0);
  EXPECT_EQ(pm.spec.attn.sliding_window, 0);
  const Projection p = project(ck, inputs(512));
  EXPECT_NE(p.command.find("spool generate"), std::string::npos);

  EditedFixture d("olmoe", [](nlohmann::json& c) { c["model_type"] = "llama4_text"; });
  try {
    project(models::open_checkpoint(d.dir, {.map = false}), inputs(512));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported model_type 'llama4_text'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("deepseek_v3"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace spool::plan
