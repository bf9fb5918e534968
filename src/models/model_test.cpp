// Golden tests: every tiny fixture family and the demo model against transformers (f32).
// Logits: per row max|diff| <= 1e-4 * max|ref|; greedy ids and routed-expert sets exact.
#include "models/model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include "support/golden.h"
#include "common/error.h"
#include "io/safetensors.h"
#include "models/presets.h"
#include "ops/reference_backend.h"
#include "models/family.h"

namespace spool::models {
namespace {

using spool::testing::argmax;
using spool::testing::argmax_except;
using spool::testing::data_dir;
using spool::testing::expect_rows_close;
using spool::testing::Golden;

constexpr double kTol = 1e-4;

struct Loaded {
  std::shared_ptr<io::Checkpoint> ckpt;
  std::unique_ptr<ops::ThreadPool> pool;
  std::unique_ptr<Model> model;
};

Loaded load(const std::string& dir, int threads = 2) {
  Loaded l;
  l.ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
  l.pool = std::make_unique<ops::ThreadPool>(threads);
  l.model = load_model(l.ckpt, l.pool.get());
  return l;
}

// Prefills `ids` in chunks of `step` and returns logits of every position [T, V].
std::vector<float> prefill_all(Model& m, State& st, const std::vector<int32_t>& ids, int64_t step) {
  const int64_t V = m.spec().vocab_size;
  std::vector<float> out(ids.size() * V);
  for (size_t i = 0; i < ids.size(); i += step) {
    size_t n = std::min<size_t>(step, ids.size() - i);
    m.forward(std::span<const int32_t>(ids.data() + i, n), st, LogitsMode::kAll, out.data() + i * V);
  }
  return out;
}

// Greedy continuation of `n` tokens after prefilling `ids` in chunks of `step`, as the fixtures'
// transformers generate made it (min_new_tokens = n: EOS never picked, spool::testing::argmax_except).
std::vector<int32_t> greedy(Model& m, const std::vector<int32_t>& ids, int n, int64_t step = 512) {
  State st = m.new_state();
  const int64_t V = m.spec().vocab_size;
  std::vector<float> logits(V);
  for (size_t i = 0; i < ids.size(); i += step) {
    size_t k = std::min<size_t>(step, ids.size() - i);
    m.forward(std::span<const int32_t>(ids.data() + i, k), st,
              i + k == ids.size() ? LogitsMode::kLast : LogitsMode::kNone, logits.data());
  }
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    int32_t t = argmax_except(logits.data(), V, m.spec().eos_token_ids);
    out.push_back(t);
    if (i + 1 < n) m.forward(std::span<const int32_t>(&t, 1), st, LogitsMode::kLast, logits.data());
  }
  return out;
}

// Keys or values of KV head h as [T, hd] rows.
std::vector<float> cache_rows(const AttnCache& c, int h, int64_t T, int hd, bool keys) {
  std::vector<float> out(T * hd);
  for (int64_t p = 0; p < T; ++p)
    for (int d = 0; d < hd; ++d) out[p * hd + d] = keys ? c.key(h, p, d) : c.value(h, p, d);
  return out;
}

class TinyFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(TinyFixture, LogitsAndGreedyMatchTransformers) {
  const std::string dir = data_dir() + "/models/" + GetParam();
  Loaded l = load(dir);
  Golden g(dir + "/golden.safetensors");
  std::vector<int32_t> ids = g.i32("input_ids");
  std::vector<float> ref = g.f32("logits");
  State st = l.model->new_state();
  std::vector<float> got = prefill_all(*l.model, st, ids, 512);
  const double worst = expect_rows_close(got.data(), ref.data(), static_cast<int64_t>(ids.size()), l.model->spec().vocab_size, kTol, GetParam());
  RecordProperty("max_rel_error", std::to_string(worst));
  std::printf("%s: max rel error %.3g\n", GetParam().c_str(), worst);
  std::vector<int32_t> want = g.i32("greedy_ids");
  EXPECT_EQ(greedy(*l.model, ids, static_cast<int>(want.size())), want);
}

INSTANTIATE_TEST_SUITE_P(Families, TinyFixture,
                         ::testing::Values("qwen3_moe", "qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe_vl",
                                           "qwen3_5_moe_vl_fused", "mixtral", "olmoe", "deepseek_v3", "deepseek_v3_kimi",
                                           "deepseek_v2_lite", "glm4_moe", "glm4_moe_lite", "minimax_m2",
                                           // q/k norm + head_dim 32 + 2 groups; v_head_dim != qk_nope_head_dim; top-6
                                           "glm4_moe_qknorm", "glm4_moe_lite_v24", "minimax_m2_top6", "gpt_oss", "gpt_oss_mxfp4",
                                           "ernie4_5_moe", "ernie4_5_moe_e16", "gemma4_text_moe"));

// Gemma 4's layer_scalar multiplies the whole residual stream after the layer's adds (HF
// Gemma4TextDecoderLayer), which the fixture (every scalar 1.0) cannot show. A copy of the
// fixture with one scalar changed: scaling the last layer's output leaves the logits as they
// were (the final RMSNorm is scale-invariant; scaling only a branch would not), scaling layer 0's
// changes them (the later layers add their branches to a scaled stream).
std::vector<float> gemma4_logits_with_scalar(int layer, float value) {
  const std::string src = data_dir() + "/models/gemma4_text_moe";
  const std::string dir = ::testing::TempDir() + "/gemma4_scalar_" + std::to_string(layer);
  std::filesystem::create_directories(dir);
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"})
    std::filesystem::copy_file(src + "/" + f, dir + "/" + f, std::filesystem::copy_options::overwrite_existing);
  const uint64_t at = models::open_checkpoint(src).tensor("layers." + std::to_string(layer) + ".layer_scalar").offset;
  {
    std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(reinterpret_cast<const char*>(&value), sizeof value);
  }
  Loaded l = load(dir);
  Golden g(src + "/golden.safetensors");
  State st = l.model->new_state();
  return prefill_all(*l.model, st, g.i32("input_ids"), 512);
}

TEST(Gemma4, LayerScalarScalesTheWholeResidualStream) {
  const std::vector<float> base = gemma4_logits_with_scalar(3, 1.0f);
  const std::vector<float> last = gemma4_logits_with_scalar(3, 4.0f);
  const std::vector<float> first = gemma4_logits_with_scalar(0, 4.0f);
  const int64_t V = 512, T = static_cast<int64_t>(base.size()) / V;
  expect_rows_close(last.data(), base.data(), T, V, 1e-5, "last layer's scalar 4");
  double moved = 0;
  for (size_t i = 0; i < base.size(); ++i) moved = std::max(moved, std::fabs(static_cast<double>(first[i]) - base[i]));
  EXPECT_GT(moved, 1e-2) << "layer 0's scalar 4 changed nothing";
}

// The Gemma-4-26B-A4B preset's spec: two layer geometries (sliding 8 KV x 256 with default RoPE;
// full 2 KV x 512, K = V, proportional RoPE with 64 of 256 frequencies), sqrt(2816) rounded to
// bf16 (53.0), soft-capping 30, every layer dense MLP + MoE.
TEST(Gemma4, PresetSpec) {
  const Preset& p = preset("gemma-4-26b-a4b");
  const ModelSpec s = build_spec(io::text_config_of(io::Config(p.config, "preset"), "preset"), io::GenerationDefaults{},
                                 p.config.value("tie_word_embeddings", false), "preset");
  EXPECT_EQ(s.family, "gemma4_text_moe");
  ASSERT_EQ(s.n_layers, 30);
  EXPECT_TRUE(s.tie_word_embeddings);
  for (int i = 0; i < s.n_layers; ++i) {
    SCOPED_TRACE(i);
    const AttentionSpec& a = s.attn_of(i);
    const bool full = (i + 1) % 6 == 0;
    EXPECT_EQ(s.attn.windowed(i), !full);
    EXPECT_EQ(a.head_dim, full ? 512 : 256);
    EXPECT_EQ(a.n_kv_heads, full ? 2 : 8);
    EXPECT_EQ(a.k_eq_v, full);
    EXPECT_TRUE(a.value_norm);
    EXPECT_EQ(a.softmax_scale, 1.0f);
    if (full) {
      ASSERT_EQ(a.inv_freq.size(), 256u);
      EXPECT_GT(a.inv_freq[63], 0.0f);
      EXPECT_EQ(a.inv_freq[64], 0.0f);
    } else {
      EXPECT_TRUE(a.inv_freq.empty());
      EXPECT_EQ(a.rope_theta, 10000.0);
    }
  }
  EXPECT_EQ(s.embedding_scale, 53.0f);
  EXPECT_EQ(s.final_logit_softcap, 30.0f);
  EXPECT_EQ(s.activation, ActivationKind::kGeluTanh);
  EXPECT_TRUE(s.sandwich_norms && s.parallel_dense_ffn && s.residual_scale);
  EXPECT_TRUE(s.moe.router_input_scale && s.moe.per_expert_scale);
  EXPECT_EQ(s.moe.n_experts, 128);
  EXPECT_EQ(s.moe.top_k, 8);
  EXPECT_EQ(s.dense_intermediate, 2112);
}

// The mechanisms each family file sets (spec.h's enums), per fixture: a family that maps a
// config to the wrong router, q/k norm, RoPE layout, activation or gate/up layout shows here by
// name (and in its golden).
TEST(FamilyMechanisms, EachFixtureNamesItsRouterNormsRopeAndExperts) {
  struct Want {
    const char* fixture;
    RouterScore score;
    RouterSelection selection;
    bool score_bias;
    QkNorm qk_norm;
    RopeLayout rope;  // of the attention, or of MLA's q_pe / k_pe
    ActivationKind act;
    GateUpLayout gate_up;
  };
  using RS = RouterScore;
  using SEL = RouterSelection;
  using Q = QkNorm;
  using R = RopeLayout;
  using A = ActivationKind;
  using G = GateUpLayout;
  const Want wants[] = {
      {"qwen3_moe", RS::kSoftmax, SEL::kTopK, false, Q::kPerHead, R::kHalves, A::kSilu, G::kSeparate},
      {"qwen3_5_moe_text", RS::kSoftmax, SEL::kTopK, false, Q::kPerHead, R::kHalves, A::kSilu, G::kSeparate},
      {"mixtral", RS::kSoftmax, SEL::kTopK, false, Q::kNone, R::kHalves, A::kSilu, G::kSeparate},
      {"olmoe", RS::kSoftmax, SEL::kTopK, false, Q::kWholeProjection, R::kHalves, A::kSilu, G::kSeparate},
      {"deepseek_v2_lite", RS::kSoftmax, SEL::kGroupedTopK, false, Q::kNone, R::kInterleavedPairs, A::kSilu, G::kSeparate},
      {"deepseek_v3", RS::kSigmoid, SEL::kGroupedTopK, true, Q::kNone, R::kInterleavedPairs, A::kSilu, G::kSeparate},
      {"glm4_moe", RS::kSigmoid, SEL::kGroupedTopK, true, Q::kNone, R::kHalves, A::kSilu, G::kSeparate},
      {"glm4_moe_qknorm", RS::kSigmoid, SEL::kGroupedTopK, true, Q::kPerHead, R::kHalves, A::kSilu, G::kSeparate},
      {"minimax_m2", RS::kSigmoid, SEL::kTopK, true, Q::kWholeProjection, R::kHalves, A::kSilu, G::kSeparate},
      {"ernie4_5_moe", RS::kSoftmax, SEL::kTopK, true, Q::kNone, R::kInterleavedPairs, A::kSilu, G::kSeparate},
      {"gpt_oss", RS::kSoftmax, SEL::kTopK, false, Q::kNone, R::kHalves, A::kClampedSwiGLU, G::kFusedInterleaved},
      {"gemma4_text_moe", RS::kSoftmax, SEL::kTopK, false, Q::kPerHead, R::kHalves, A::kGeluTanh, G::kSeparate},
  };
  for (const Want& w : wants) {
    SCOPED_TRACE(w.fixture);
    const ModelSpec s = build_spec(open_checkpoint(data_dir() + "/models/" + w.fixture, {.map = false}));
    EXPECT_EQ(s.moe.score, w.score);
    EXPECT_EQ(s.moe.selection, w.selection);
    EXPECT_EQ(s.moe.score_bias, w.score_bias);
    EXPECT_EQ(s.attn.qk_norm, w.qk_norm);
    const bool mla = std::find(s.mixers.begin(), s.mixers.end(), MixerKind::kMLA) != s.mixers.end();
    EXPECT_EQ(mla ? s.mla.rope_layout : s.attn.rope_layout, w.rope);
    EXPECT_EQ(s.activation, w.act);
    EXPECT_EQ(s.moe.gate_up, w.gate_up);
    // Plain softmax top-k runs Backend::route_softmax_top_k; anything else ops::RouterParams.
    EXPECT_EQ(s.moe.general_router(), w.score != RS::kSoftmax || w.score_bias || w.selection != SEL::kTopK);
  }
}

// GLM-4.7-Flash normalises its MLA latents (q_a_layernorm, kv_a_layernorm) with the RMSNorm
// class default eps 1e-6, not rms_norm_eps 1e-5: the wrong eps moves this fixture's logits by
// ~7e-6 of max|ref| (inside kTol), so here the rows must agree to 3e-6 (the engine is at
// ~1.2e-6).
TEST(TinyFixtureTight, Glm4MoeLiteLatentNormEps) {
  const std::string dir = data_dir() + "/models/glm4_moe_lite";
  Loaded l = load(dir);
  Golden g(dir + "/golden.safetensors");
  const std::vector<int32_t> ids = g.i32("input_ids");
  const std::vector<float> ref = g.f32("logits");
  State st = l.model->new_state();
  const std::vector<float> got = prefill_all(*l.model, st, ids, 512);
  expect_rows_close(got.data(), ref.data(), static_cast<int64_t>(ids.size()), l.model->spec().vocab_size, 3e-6, "glm4_moe_lite");
}

// Mixtral with a sliding window of 5 (the fixture's is null): rows before the window fills are
// the golden's, later rows differ from it (older keys are masked), and the engine matches the
// scalar ReferenceBackend running the same model, prefilled at once and token by token.
TEST(SlidingWindow, MixtralMasksKeysOlderThanTheWindow) {
  const std::string dir = ::testing::TempDir() + "/mixtral_window";
  std::filesystem::create_directories(dir);
  const std::string src = data_dir() + "/models/mixtral";
  std::filesystem::copy_file(src + "/model.safetensors", dir + "/model.safetensors", std::filesystem::copy_options::overwrite_existing);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  cfg["sliding_window"] = 5;
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  Loaded l = load(dir);
  ASSERT_EQ(l.model->spec().attn.sliding_window, 5);
  Golden g(src + "/golden.safetensors");
  const std::vector<int32_t> ids = g.i32("input_ids");
  const std::vector<float> ref = g.f32("logits");
  const int64_t V = l.model->spec().vocab_size, T = static_cast<int64_t>(ids.size());
  State st = l.model->new_state();
  const std::vector<float> got = prefill_all(*l.model, st, ids, 512);
  expect_rows_close(got.data(), ref.data(), 5, V, kTol, "rows inside the window");
  double diff = 0;
  for (int64_t i = 5 * V; i < T * V; ++i) diff = std::max(diff, static_cast<double>(std::fabs(got[i] - ref[i])));
  EXPECT_GT(diff, 1e-3) << "later rows must differ from full attention";
  auto model_ref = load_model(l.ckpt, std::make_shared<ops::ReferenceBackend>());
  State sr = model_ref->new_state();
  const std::vector<float> want = prefill_all(*model_ref, sr, ids, 1);
  expect_rows_close(got.data(), want.data(), T, V, kTol, "windowed engine vs reference backend");
  State s1 = l.model->new_state();
  const std::vector<float> step1 = prefill_all(*l.model, s1, ids, 3);
  expect_rows_close(step1.data(), want.data(), T, V, kTol, "windowed, prefill in chunks of 3");
}

class Demo : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { demo_ = new Loaded(load(SPOOL_DEFAULT_MODEL_DIR)); }
  static void TearDownTestSuite() {
    delete demo_;
    demo_ = nullptr;
  }
  static Loaded* demo_;
};
Loaded* Demo::demo_ = nullptr;

TEST_F(Demo, PromptsLogitsRoutingGreedy) {
  Model& m = *demo_->model;
  Golden g(data_dir() + "/models/spool-demo-moe/golden_prompts.safetensors");
  const int64_t V = m.spec().vocab_size;
  const int L = m.spec().n_layers, K = m.spec().moe.top_k;
  for (int p = 0; p < 4; ++p) {
    const std::string k = "p" + std::to_string(p) + ".";
    std::vector<int32_t> ids = g.i32(k + "input_ids");
    const int64_t T = static_cast<int64_t>(ids.size());
    std::vector<std::set<int>> routes(L * T);
    m.hooks.on_route = [&](int layer, int64_t t, std::span<const int> e, std::span<const float>) {
      routes[layer * T + t] = std::set<int>(e.begin(), e.end());
    };
    State st = m.new_state();
    std::vector<float> got = prefill_all(m, st, ids, 512);
    m.hooks.on_route = nullptr;
    std::vector<float> ref = g.f32(k + "logits");
    expect_rows_close(got.data(), ref.data(), T, V, kTol, "prompt " + std::to_string(p));
    std::vector<int32_t> topk = g.i32(k + "topk_experts");  // [L, T, K]
    for (int layer = 0; layer < L; ++layer)
      for (int64_t t = 0; t < T; ++t) {
        std::set<int> want(topk.begin() + (layer * T + t) * K, topk.begin() + (layer * T + t + 1) * K);
        EXPECT_EQ(routes[layer * T + t], want) << "prompt " << p << " layer " << layer << " token " << t;
      }
    EXPECT_EQ(greedy(m, ids, 48), g.i32(k + "greedy_ids")) << "prompt " << p;
  }
}

TEST_F(Demo, HiddenStatesOfPrompt0) {
  Model& m = *demo_->model;
  Golden g(data_dir() + "/models/spool-demo-moe/demo_hidden_states.safetensors");
  std::vector<int32_t> ids = g.i32("input_ids");
  const int64_t T = static_cast<int64_t>(ids.size()), H = m.spec().hidden_size;
  std::vector<std::vector<float>> hs(m.spec().n_layers + 1);
  m.hooks.on_hidden = [&](int i, const float* h, int64_t n) { hs[i].assign(h, h + n * H); };
  State st = m.new_state();
  std::vector<float> logits(T * m.spec().vocab_size);
  m.forward(ids, st, LogitsMode::kAll, logits.data());
  m.hooks.on_hidden = nullptr;
  for (int i = 0; i <= m.spec().n_layers; ++i) {
    std::vector<float> ref = g.f32("hidden_states." + std::to_string(i));
    expect_rows_close(hs[i].data(), ref.data(), T, H, kTol, "hidden_states." + std::to_string(i));
  }
  // Attention KV cache after the prompt: [n_kv, T, head_dim].
  for (int layer : {3, 7}) {
    const int nkv = m.spec().attn.n_kv_heads, hd = m.spec().attn.head_dim;
    const AttnCache& c = st.attn[layer];
    std::vector<float> rk = g.f32("cache." + std::to_string(layer) + ".keys");
    std::vector<float> rv = g.f32("cache." + std::to_string(layer) + ".values");
    for (int h = 0; h < nkv; ++h) {
      std::vector<float> k = cache_rows(c, h, T, hd, true);
      std::vector<float> v = cache_rows(c, h, T, hd, false);
      expect_rows_close(k.data(), rk.data() + h * T * hd, T, hd, kTol, "keys");
      expect_rows_close(v.data(), rv.data() + h * T * hd, T, hd, kTol, "values");
    }
  }
}

// A 320-token prompt prefilled in chunks of 1, 7, 64 and 512: logits of every 16th row, and the
// keys and values of the attention layers, against transformers. transformers' cache holds no
// Gated DeltaNet state for this model (demo_long_prompt.json), so the GDN conv and recurrent
// states after each chunked prefill are compared with the token-by-token run (step 1: the plain
// recurrence, whose logits, keys and values are themselves checked against transformers).
TEST_F(Demo, LongPromptAcrossChunkBoundaries) {
  Model& m = *demo_->model;
  Golden g(data_dir() + "/models/spool-demo-moe/demo_long_prompt.safetensors");
  std::vector<int32_t> ids = g.i32("input_ids");
  std::vector<int32_t> rows = g.i32("rows");
  std::vector<float> ref = g.f32("logits");
  const int64_t V = m.spec().vocab_size, T = static_cast<int64_t>(ids.size());
  std::vector<GdnState> gdn_step1;
  int gdn_layers = 0;
  for (int64_t step : {1, 512, 64, 7}) {
    const std::string what = "long prompt, prefill step " + std::to_string(step);
    State st = m.new_state();
    std::vector<float> all = prefill_all(m, st, ids, step);
    std::vector<float> got;
    for (int32_t r : rows) got.insert(got.end(), all.begin() + r * V, all.begin() + (r + 1) * V);
    expect_rows_close(got.data(), ref.data(), static_cast<int64_t>(rows.size()), V, kTol, what);
    const int nkv = m.spec().attn.n_kv_heads, hd = m.spec().attn.head_dim;
    for (int layer : {3, 7}) {
      const AttnCache& c = st.attn[layer];
      std::vector<float> rk = g.f32("cache.layers." + std::to_string(layer) + ".keys");
      std::vector<float> rv = g.f32("cache.layers." + std::to_string(layer) + ".values");
      for (int h = 0; h < nkv; ++h) {
        std::vector<float> k = cache_rows(c, h, T, hd, true);
        std::vector<float> v = cache_rows(c, h, T, hd, false);
        expect_rows_close(k.data(), rk.data() + h * T * hd, T, hd, kTol, what + ", keys of layer " + std::to_string(layer));
        expect_rows_close(v.data(), rv.data() + h * T * hd, T, hd, kTol, what + ", values of layer " + std::to_string(layer));
      }
    }
    if (step == 1) {
      gdn_step1 = st.gdn;
      for (const GdnState& s : st.gdn) gdn_layers += !s.recurrent.empty();
      continue;
    }
    ASSERT_EQ(st.gdn.size(), gdn_step1.size());
    const int64_t nv = m.spec().gdn.n_v;
    for (size_t layer = 0; layer < st.gdn.size(); ++layer) {
      const GdnState &a = st.gdn[layer], &r = gdn_step1[layer];
      ASSERT_EQ(a.recurrent.size(), r.recurrent.size()) << layer;
      ASSERT_EQ(a.conv.size(), r.conv.size()) << layer;
      if (r.recurrent.empty()) continue;
      const std::string l = ", layer " + std::to_string(layer);
      // Recurrent state [n_v, d_k, d_v]: one row per value head; conv state as one row.
      expect_rows_close(a.recurrent.data(), r.recurrent.data(), nv, static_cast<int64_t>(r.recurrent.size()) / nv, kTol,
                        what + ", GDN recurrent state" + l);
      expect_rows_close(a.conv.data(), r.conv.data(), 1, static_cast<int64_t>(r.conv.size()), kTol, what + ", GDN conv state" + l);
    }
  }
  EXPECT_GT(gdn_layers, 0) << "the demo model has Gated DeltaNet layers";
}

TEST_F(Demo, GreedyDoesNotDependOnPrefillStep) {
  Model& m = *demo_->model;
  Golden g(data_dir() + "/models/spool-demo-moe/golden_prompts.safetensors");
  std::vector<int32_t> ids = g.i32("p3.input_ids");
  std::vector<int32_t> want = g.i32("p3.greedy_ids");
  for (int64_t step : {1, 7, 64, 512}) EXPECT_EQ(greedy(m, ids, 48, step), want) << "prefill step " << step;
}

// The released gpt-oss config (rope_scaling yarn with truncate false, rope_theta at the top level):
// YaRN frequencies with fractional ramp bounds low = 8.0928, high = 17.3980 (HF _compute_yarn_parameters),
// attention factor 0.1 ln 32 + 1 on cos/sin, windows on the even layers, every layer MoE.
TEST(GptOssSpec, ReleaseConfigYarnAndWindows) {
  for (const char* name : {"gpt-oss-20b", "gpt-oss-120b"}) {
    SCOPED_TRACE(name);
    const Preset& pr = preset(name);
    const io::Config c(nlohmann::json::parse(pr.config.dump()), name);
    const ModelSpec s = build_spec(c, {}, false, name);
    EXPECT_EQ(s.family, "gpt_oss");
    EXPECT_NEAR(s.attn.rope_attention_scaling, 0.1 * std::log(32.0) + 1.0, 1e-6);
    ASSERT_EQ(s.attn.inv_freq.size(), 32u);
    const double low = 64 * std::log(4096 / (32 * 2 * M_PI)) / (2 * std::log(150000.0));
    const double high = 64 * std::log(4096 / (1 * 2 * M_PI)) / (2 * std::log(150000.0));
    EXPECT_NEAR(low, 8.0928, 1e-4);
    EXPECT_NEAR(high, 17.3980, 1e-4);
    for (int i = 0; i < 32; ++i) {
      const double base = std::pow(150000.0, -2.0 * i / 64);
      const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      EXPECT_NEAR(s.attn.inv_freq[i], base * (1 - ramp) + base / 32 * ramp, 1e-6 * base) << i;
    }
    EXPECT_EQ(s.attn.sliding_window, 128);
    for (int i = 0; i < s.n_layers; ++i) EXPECT_EQ(s.attn.windowed(i), i % 2 == 0) << i;
    EXPECT_TRUE(s.attn.sinks);
    EXPECT_TRUE(s.attn.qkv_bias && s.attn.o_bias);
    EXPECT_EQ(s.moe.top_k, 4);
    EXPECT_TRUE(s.moe.router_bias && s.moe.expert_bias);
    EXPECT_EQ(s.moe.gate_up, GateUpLayout::kFusedInterleaved);
    EXPECT_EQ(s.activation, ActivationKind::kClampedSwiGLU);
  }
}

// gpt-oss configs and MXFP4 tensors that spool cannot run are refused with the field or tensor
// named: a layer_types list of the wrong length or with an unknown entry, swiglu_limit other than
// 7, MXFP4 blocks whose last dimension is not 16, scales of the wrong shape.
TEST(ModelErrors, GptOssBadConfigAndMxfp4Shapes) {
  const std::string src = data_dir() + "/models/gpt_oss_mxfp4";
  const std::string dir = ::testing::TempDir() + "/gpt_oss_bad";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(src + "/model.safetensors", dir + "/model.safetensors");
  ops::ThreadPool pool(1);
  auto expect_error = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& what) {
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/config.json"));
    edit(cfg);
    std::ofstream(dir + "/config.json") << cfg.dump(2);
    try {
      auto ck = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
      load_model(ck, &pool);
      FAIL() << "expected an error mentioning " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error([](nlohmann::json& c) { c["layer_types"].erase(0); }, "layer_types has 3 entries for 4 layers");
  expect_error([](nlohmann::json& c) { c["layer_types"][1] = "chunked_attention"; }, "layer_types[1] is 'chunked_attention'");
  expect_error([](nlohmann::json& c) { c["swiglu_limit"] = 8.0; }, "swiglu_limit 8");
  expect_error([](nlohmann::json& c) { c["quantization_config"]["quant_method"] = "fp8"; }, "quant_method 'fp8'");
  // Re-shaped MXFP4 tensors: blocks [8, 128, 4, 8] (bytes per block 8), scales [8, 64, 4].
  io::Checkpoint ck = models::open_checkpoint(src);
  for (int bad = 0; bad < 2; ++bad) {
    std::vector<io::TensorToWrite> ts;
    for (const auto& t : ck.tensors()) {
      if (t.expert_layer >= 0) continue;
      ts.push_back({t.name == "lm_head.weight" ? t.name : "model." + t.name, t.dtype, t.shape, t.data});
    }
    std::vector<std::vector<uint8_t>> keep;
    for (int l = 0; l < 4; ++l)
      for (const char* proj : {"gate_up_proj", "down_proj"}) {
        const bool gu = proj[0] == 'g';
        const int64_t R = gu ? 128 : 64;
        keep.emplace_back(static_cast<size_t>(8 * R * 2 * 16), 0x11);
        keep.emplace_back(static_cast<size_t>(8 * R * 2), 127);
        const std::string base = "model.layers." + std::to_string(l) + ".mlp.experts." + proj;
        std::vector<int64_t> bshape = {8, R, 2, 16}, sshape = {8, R, 2};
        if (bad == 0) bshape = {8, R, 4, 8};
        if (bad == 1) sshape = {8, R / 2, 4};
        ts.push_back({base + "_blocks", io::DType::U8, bshape, keep[keep.size() - 2].data()});
        ts.push_back({base + "_scales", io::DType::U8, sshape, keep.back().data()});
      }
    std::filesystem::remove(dir + "/model.safetensors");
    io::write_safetensors(dir + "/model.safetensors", ts);
    expect_error([](nlohmann::json&) {}, bad == 0 ? "16 bytes per block" : "MXFP4 scales");
  }
}

TEST(ModelErrors, UnknownModelTypeAndBadIds) {
  const std::string dir = ::testing::TempDir() + "/unknown_arch";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(data_dir() + "/models/qwen3_moe/model.safetensors", dir + "/model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir + "/config.json") << R"({"model_type": "llama4_moe", "hidden_size": 64})";
  auto ck = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
  ops::ThreadPool pool(1);
  try {
    load_model(ck, &pool);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("llama4_moe"), std::string::npos) << e.what();
  }
  // Missing a required config field.
  std::ofstream(dir + "/config.json") << R"({"model_type": "qwen3_moe", "hidden_size": 64})";
  auto ck2 = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
  try {
    load_model(ck2, &pool);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing field"), std::string::npos) << e.what();
  }
  Loaded l = load(data_dir() + "/models/qwen3_moe", 1);
  State st = l.model->new_state();
  std::vector<int32_t> bad = {1, 99999};
  std::vector<float> logits(l.model->spec().vocab_size);
  EXPECT_THROW(l.model->forward(bad, st, LogitsMode::kLast, logits.data()), Error);
  EXPECT_EQ(st.pos, 0);
}

// The embedded presets files: each names a registered family, parses, and gives that family's
// model_type; parse errors name the file, the preset and the field.
TEST(Presets, EmbeddedFilesBelongToTheirFamilies) {
  ASSERT_FALSE(preset_files().empty());
  size_t n = 0;
  for (const PresetFile& pf : preset_files()) {
    SCOPED_TRACE(pf.family);
    const Family* f = family_named(pf.family);
    ASSERT_NE(f, nullptr);
    for (const Preset& p : parse_presets(pf.json, pf.family)) {
      ++n;
      EXPECT_EQ(preset(p.name).config, p.config);
      const nlohmann::ordered_json& c = p.config.contains("text_config") ? p.config["text_config"] : p.config;
      EXPECT_NE(family_of_model_type(c.value("model_type", std::string())), nullptr) << p.name;
      EXPECT_EQ(family_of_model_type(c.value("model_type", std::string())), f) << p.name;
    }
  }
  EXPECT_EQ(presets().size(), n);
  EXPECT_EQ(preset("qwen3.5-35b-a3b").name, "qwen3.6-35b-a3b");  // an alias
}

TEST(Presets, ParseErrorsNameTheField) {
  auto error = [](const std::string& text) {
    try {
      parse_presets(text, "x.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error("{").find("x.json: not valid JSON"), std::string::npos);
  EXPECT_NE(error("{}").find("JSON array"), std::string::npos);
  EXPECT_NE(error(R"([{"description": "d", "config": {}}])").find("has no 'name'"), std::string::npos);
  EXPECT_NE(error(R"([{"name": "a", "description": "d"}])").find("preset 'a' has no 'config'"), std::string::npos);
  EXPECT_NE(error(R"([{"name": "a", "description": "d", "config": {}, "fused_experts": 1}])").find("fused_experts"), std::string::npos);
  EXPECT_NE(error(R"([{"name": "a", "description": "d", "config": {}, "aliases": "b"}])").find("aliases"), std::string::npos);
  const std::vector<Preset> ok = parse_presets(R"([{"name": "a", "description": "d", "config": {"model_type": "m"}}])", "x.json");
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].prefix, "model.");
  EXPECT_FALSE(ok[0].fused_experts);
}

}  // namespace
}  // namespace spool::models
