// Multi-token prediction on the families whose checkpoints carry an MTP head, with random head
// weights added to their tiny fixtures at test time (no reference forward exists for them in
// transformers 5.17, so the test is exactness, not logits): DeepSeek-V3 and GLM-4.5
// (num_nextn_predict_layers: layer num_hidden_layers holds enorm, hnorm, eh_proj,
// shared_head.norm, optionally shared_head.head, a copy of embed_tokens and a whole decoder
// layer of the model's own kind) and Qwen3-Next (mtp_num_hidden_layers: mtp.fc,
// mtp.pre_fc_norm_embedding / _hidden, mtp.norm, mtp.layers.0.* a full-attention layer; the layout
// of make_fixtures_mtp.py's header). Each fixture's head layer is its last MoE (or full-attention)
// layer with seeded noise added; its fc / eh_proj maps token embeddings to the output rows of the
// tokens that follow them in the plain greedy continuations, so some drafts are right. Checks: the
// head loads only when asked; greedy speculative decoding (draft_max 1 and 3, no auto-off) gives
// the plain greedy output, resident and with the experts streaming at a zero cache budget, with
// some drafts accepted and some rejected; and, with its decoder layer zeroed, the head's arithmetic
// around the layer matches a hand computation (exactness alone cannot see a wrong head).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "support/golden.h"
#include "support/load.h"
#include "common/error.h"
#include "engine/loader.h"
#include "engine/session.h"
#include "engine/speculative.h"
#include "io/safetensors.h"

namespace spool::engine {
namespace {

namespace fs = std::filesystem;
using spool::testing::data_dir;

// One fixture and the head layout it gets.
struct Fixture {
  const char* name;      // tests/data/models/<name>
  bool qwen_layout;      // mtp.* (Qwen3-Next) rather than layers.{num_hidden_layers}.* (DeepSeek-V3 / GLM-4.5)
  bool own_head;         // shared_head.head.weight stored (else the head reads lm_head)
};

void PrintTo(const Fixture& f, std::ostream* os) { *os << f.name; }

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(f);
}

// Owned tensors for write_safetensors (F32).
struct Tensors {
  std::vector<std::pair<std::string, std::vector<int64_t>>> meta;
  std::vector<std::vector<float>> data;
  void add(std::string name, std::vector<int64_t> shape, std::vector<float> v) {
    meta.emplace_back(std::move(name), std::move(shape));
    data.push_back(std::move(v));
  }
};

// The fixture copied to a fresh directory with a random MTP head in model-mtp.safetensors, listed
// with the fixture's own tensors in model.safetensors.index.json, and the config's head count set.
// `bigrams`: token pairs (a, b) the head is built to draft (b after a). `zero_layer`: the head's
// decoder layer adds nothing to the residual stream (its attention output projection and every
// expert's down projection zero). Returns the directory (named after `tag`).
std::string fixture_with_head(const Fixture& fx, uint64_t seed, const std::vector<std::pair<int32_t, int32_t>>& bigrams,
                              bool zero_layer = false, const std::string& tag = "") {
  const std::string src = data_dir() + "/models/" + fx.name;
  const std::string dst = ::testing::TempDir() + "/mtp_families_" + fx.name + tag + "_" + std::to_string(getpid());
  fs::remove_all(dst);
  fs::create_directories(dst);
  for (const char* f : {"generation_config.json", "model.safetensors"}) fs::copy_file(src + "/" + f, dst + "/" + f);
  nlohmann::json cfg = read_json(src + "/config.json");
  const int N = cfg["num_hidden_layers"].get<int>();
  const int64_t H = cfg["hidden_size"].get<int64_t>(), V = cfg["vocab_size"].get<int64_t>();
  cfg[fx.qwen_layout ? "mtp_num_hidden_layers" : "num_nextn_predict_layers"] = 1;
  std::ofstream(dst + "/config.json") << cfg.dump(2);

  const io::SafetensorsFile main = io::SafetensorsFile::open(src + "/model.safetensors");
  auto floats = [&](const io::TensorInfo& t) {
    if (t.dtype != io::DType::F32) throw std::runtime_error("fixture tensor " + t.name + " is not F32");
    std::vector<float> v(static_cast<size_t>(t.numel()));
    std::memcpy(v.data(), main.data(t), t.nbytes);
    return v;
  };
  // The head's decoder layer: the fixture's last MoE layer (DeepSeek / GLM) or last
  // full-attention layer (Qwen3-Next: MoE everywhere).
  int from = -1;
  for (int i = 0; i < N; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    if (fx.qwen_layout ? main.find(p + "self_attn.q_proj.weight") != nullptr : main.find(p + "mlp.gate.weight") != nullptr) from = i;
  }
  if (from < 0) throw std::runtime_error(std::string(fx.name) + ": no layer to copy for the head");
  const std::string from_p = "model.layers." + std::to_string(from) + ".";
  const std::string head_p = fx.qwen_layout ? "mtp." : "model.layers." + std::to_string(N) + ".";
  const std::string layer_p = fx.qwen_layout ? "mtp.layers.0." : head_p;

  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto randn = [&](int64_t n, float scale, float mean = 0) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = mean + scale * nd(g);
    return v;
  };
  Tensors out;
  for (const io::TensorInfo& t : main.tensors()) {
    if (!t.name.starts_with(from_p)) continue;
    std::vector<float> v = floats(t);
    double ss = 0;
    for (float x : v) ss += static_cast<double>(x) * x;
    const float s = 0.3f * static_cast<float>(std::sqrt(ss / static_cast<double>(v.size()))) + 0.02f;
    for (float& x : v) x += s * nd(g);
    const std::string rest = t.name.substr(from_p.size());
    if (zero_layer && (rest == "self_attn.o_proj.weight" || rest.ends_with("down_proj.weight"))) std::fill(v.begin(), v.end(), 0.0f);
    out.add(layer_p + t.name.substr(from_p.size()), t.shape, std::move(v));
  }
  // Norm weights: x * w (DeepSeek / GLM) or x * (1 + w) (Qwen3-Next).
  const float norm_mean = fx.qwen_layout ? 0.0f : 1.0f;
  const std::vector<float> embed = floats(*main.find("model.embed_tokens.weight"));
  const std::vector<float> head = fx.own_head ? randn(V * H, 1.0f / std::sqrt(static_cast<float>(H))) : floats(*main.find("lm_head.weight"));
  // The fc / eh_proj matrix [H, 2H]: noise, plus on the embedding half a map sending token a's
  // (RMS-normed) embedding towards the output row of b for each pair (a, b) of `bigrams`, so the
  // head drafts some tokens right (a head of noise alone drafts none).
  std::vector<float> fc = randn(H * 2 * H, 0.1f / std::sqrt(static_cast<float>(2 * H)));
  for (const auto& [a, b] : bigrams) {
    double ea = 0, hb = 0;
    for (int64_t c = 0; c < H; ++c) {
      ea += static_cast<double>(embed[a * H + c]) * embed[a * H + c];
      hb += static_cast<double>(head[b * H + c]) * head[b * H + c];
    }
    const double sa = 1.0 / std::sqrt(ea / static_cast<double>(H)), sb = 1.0 / std::sqrt(hb / static_cast<double>(H));
    for (int64_t r = 0; r < H; ++r)
      for (int64_t c = 0; c < H; ++c)
        fc[r * 2 * H + c] += static_cast<float>(head[b * H + r] * sb * embed[a * H + c] * sa / static_cast<double>(H));
  }
  out.add(head_p + (fx.qwen_layout ? "fc.weight" : "eh_proj.weight"), {H, 2 * H}, std::move(fc));
  out.add(head_p + (fx.qwen_layout ? "pre_fc_norm_embedding.weight" : "enorm.weight"), {H}, randn(H, 0.1f, norm_mean));
  out.add(head_p + (fx.qwen_layout ? "pre_fc_norm_hidden.weight" : "hnorm.weight"), {H}, randn(H, 0.1f, norm_mean));
  out.add(head_p + (fx.qwen_layout ? "norm.weight" : "shared_head.norm.weight"), {H}, randn(H, 0.1f, norm_mean));
  if (!fx.qwen_layout) {
    // DeepSeek-V3 and GLM-4.5 checkpoints store the (shared) embedding again in the nextn layer.
    out.add(head_p + "embed_tokens.weight", {V, H}, embed);
    if (fx.own_head) out.add(head_p + "shared_head.head.weight", {V, H}, head);
  }
  std::vector<io::TensorToWrite> w;
  for (size_t i = 0; i < out.meta.size(); ++i) w.push_back({out.meta[i].first, io::DType::F32, out.meta[i].second, out.data[i].data()});
  io::write_safetensors(dst + "/model-mtp.safetensors", w, {{"format", "pt"}});
  nlohmann::json idx;
  idx["metadata"] = nlohmann::json::object();
  for (const io::TensorInfo& t : main.tensors()) idx["weight_map"][t.name] = "model.safetensors";
  for (const auto& [name, shape] : out.meta) idx["weight_map"][name] = "model-mtp.safetensors";
  std::ofstream(dst + "/model.safetensors.index.json") << idx.dump(2);
  return dst;
}

LoadedModel open(const std::string& dir, bool mtp, bool stream = false) {
  LoadOptions o = spool::testing::test_load_options(dir, stream);
  o.mtp = mtp;
  o.ctx_size = 256;
  return load(o);
}

GenerateResult run(models::Model& m, const std::vector<int32_t>& prompt, int n, const SpecParams& spec) {
  Session s(m);
  GenerateRequest r;
  r.prompt = prompt;
  r.max_tokens = n;
  r.sampling.temperature = 0;
  r.spec = spec;
  r.prefill_step = 5;  // several chunks: the head follows the prompt chunk by chunk
  return s.generate(r, {});
}

// The fixture's golden prompt and a longer seeded one.
std::vector<std::vector<int32_t>> prompts(const Fixture& fx, int64_t vocab) {
  const nlohmann::json j = read_json(data_dir() + "/models/" + fx.name + "/golden.json");
  std::vector<std::vector<int32_t>> out{j["prompt_ids"].get<std::vector<int32_t>>()};
  std::mt19937 g(17);
  std::uniform_int_distribution<int32_t> id(2, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> p(23);
  for (int32_t& x : p) x = id(g);
  out.push_back(p);
  return out;
}

class MtpFamilies : public ::testing::TestWithParam<Fixture> {
 protected:
  // The head drafts from the bigrams of the plain greedy continuations of prompts().
  void SetUp() override {
    const Fixture& fx = GetParam();
    LoadedModel plain = open(data_dir() + "/models/" + fx.name, false);
    std::set<std::pair<int32_t, int32_t>> pairs;
    for (const auto& prompt : prompts(fx, plain.model->spec().vocab_size)) {
      std::vector<int32_t> seq = prompt;
      const GenerateResult r = run(*plain.model, prompt, 40, {});
      seq.insert(seq.end(), r.output.begin(), r.output.end());
      for (size_t i = prompt.size() - 1; i + 1 < seq.size(); ++i) pairs.emplace(seq[i], seq[i + 1]);
    }
    dir_ = fixture_with_head(fx, 1234, std::vector<std::pair<int32_t, int32_t>>(pairs.begin(), pairs.end()));
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_P(MtpFamilies, HeadLoadsOnlyWhenAsked) {
  const Fixture& fx = GetParam();
  LoadedModel plain = open(dir_, false);
  EXPECT_EQ(plain.model->mtp_layers(), 0);
  EXPECT_EQ(plain.model->spec().mtp_declared, 1);
  EXPECT_GT(plain.ckpt->mtp_bytes(), 0u);
  EXPECT_THROW(plain.model->mtp_forward({}), Error);
  LoadedModel mtp = open(dir_, true);
  EXPECT_EQ(mtp.model->mtp_layers(), 1);
  EXPECT_EQ(mtp.ckpt->mtp_bytes(), plain.ckpt->mtp_bytes());
  const int N = mtp.model->spec().n_layers;
  // Kept: every MTP tensor but the nextn layer's copy of the embedding table (the head reads the
  // model's own).
  const io::TensorRef& embed = mtp.ckpt->tensor("embed_tokens.weight");
  EXPECT_EQ(mtp.ckpt->find("layers." + std::to_string(N) + ".embed_tokens.weight"), nullptr);
  EXPECT_EQ(mtp.ckpt->total_bytes(), plain.ckpt->total_bytes() + mtp.ckpt->mtp_bytes() - (fx.qwen_layout ? 0 : embed.nbytes));
  EXPECT_NE(mtp.ckpt->find("layers." + std::to_string(N) + ".input_layernorm.weight"), nullptr);
  if (fx.qwen_layout) EXPECT_NE(mtp.ckpt->find("mtp.fc.weight"), nullptr);
  else EXPECT_NE(mtp.ckpt->find("layers." + std::to_string(N) + ".eh_proj.weight"), nullptr);
  EXPECT_TRUE(mtp.ckpt->has_expert(N, 0, io::ExpertProj::kDown));
}

TEST_P(MtpFamilies, GreedyOutputIdenticalToPlain) {
  const Fixture& fx = GetParam();
  LoadedModel res = open(dir_, true), str = open(dir_, true, true);
  ASSERT_EQ(res.model->mtp_layers(), 1);
  ASSERT_NE(str.streaming, nullptr);
  const int64_t V = res.model->spec().vocab_size;
  for (const auto& prompt : prompts(fx, V)) {
    const GenerateResult plain = run(*res.model, prompt, 40, {});
    ASSERT_EQ(plain.output.size(), 40u);
    for (int k : {1, 3}) {
      SpecParams sp;
      sp.mtp = true;
      sp.draft_max = k;
      sp.min_acceptance = 0;
      for (LoadedModel* l : {&res, &str}) {
        const bool streaming = l == &str;
        const GenerateResult r = run(*l->model, prompt, 40, sp);
        EXPECT_EQ(r.output, plain.output) << "draft_max " << k << (streaming ? " streaming" : " resident");
        EXPECT_GT(r.spec.steps, 0);
        EXPECT_LE(r.spec.drafted, r.spec.steps * k);
        EXPECT_GT(r.spec.accepted, 0) << "the head drafts some of the continuation's bigrams right";
        EXPECT_LT(r.spec.accepted, r.spec.drafted);  // and gets some wrong: both branches ran
        // Every token after the first from a verify step, or a plain step where no draft fits.
        EXPECT_EQ(r.spec.emitted + (r.timings.decode_forwards - r.spec.steps) + 1, static_cast<int64_t>(r.output.size()));
        std::printf("[ %s ] prompt of %zu, draft_max %d, %s: acceptance %.3f (%lld of %lld drafts), %.2f tokens per verify step\n",
                    fx.name, prompt.size(), k, streaming ? "streaming" : "resident", r.spec.acceptance(),
                    static_cast<long long>(r.spec.accepted), static_cast<long long>(r.spec.drafted), r.spec.tokens_per_step());
      }
    }
  }
}

// The head's arithmetic around its decoder layer, against a hand computation: with the layer
// adding nothing, row t's logits are head · norm(fc · [enorm(embed(ids[t])); hnorm(hidden[t])])
// (RMSNorm x / rms(x) * w, or * (1 + w) for Qwen3-Next; head = shared_head.head if stored, else
// lm_head). Catches swapped norms, the halves of fc in the other order, the wrong output matrix.
TEST_P(MtpFamilies, HeadArithmeticMatchesAHandComputation) {
  const Fixture& fx = GetParam();
  const std::string dir = fixture_with_head(fx, 99, {}, true, "_zero");
  LoadedModel l = open(dir, true);
  models::Model& m = *l.model;
  const int64_t H = m.spec().hidden_size, V = m.spec().vocab_size;
  const float eps = m.spec().rms_norm_eps;
  const int N = m.spec().n_layers;
  const std::vector<int32_t> ids = {5, 77, 301, 12, 440, 9};
  const int64_t T = static_cast<int64_t>(ids.size());
  std::mt19937_64 g(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> hidden(static_cast<size_t>(T * H));
  for (float& x : hidden) x = nd(g);
  std::vector<float> got(static_cast<size_t>(T * V));
  models::State st = m.new_state();
  models::MtpStep q;
  q.ids = ids;
  q.hidden = hidden.data();
  q.state = &st;
  q.mode = models::LogitsMode::kAll;
  q.logits = got.data();
  m.mtp_forward(q);

  const spool::testing::Golden main_st(dir + "/model.safetensors"), head_st(dir + "/model-mtp.safetensors");
  const std::string p = fx.qwen_layout ? "mtp." : "model.layers." + std::to_string(N) + ".";
  const std::vector<float> embed = main_st.f32("model.embed_tokens.weight");
  const std::vector<float> fc = head_st.f32(p + (fx.qwen_layout ? "fc.weight" : "eh_proj.weight"));
  const std::vector<float> en = head_st.f32(p + (fx.qwen_layout ? "pre_fc_norm_embedding.weight" : "enorm.weight"));
  const std::vector<float> hn = head_st.f32(p + (fx.qwen_layout ? "pre_fc_norm_hidden.weight" : "hnorm.weight"));
  const std::vector<float> fn = head_st.f32(p + (fx.qwen_layout ? "norm.weight" : "shared_head.norm.weight"));
  const std::vector<float> head = fx.own_head ? head_st.f32(p + "shared_head.head.weight") : main_st.f32("lm_head.weight");
  auto norm = [&](const float* x, const std::vector<float>& w, double* out) {
    double ss = 0;
    for (int64_t c = 0; c < H; ++c) ss += static_cast<double>(x[c]) * x[c];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(H) + eps);
    for (int64_t c = 0; c < H; ++c) out[c] = x[c] * r * ((fx.qwen_layout ? 1.0 : 0.0) + w[c]);
  };
  std::vector<float> want(static_cast<size_t>(T * V));
  std::vector<double> cat(static_cast<size_t>(2 * H)), u(static_cast<size_t>(H)), v(static_cast<size_t>(H));
  std::vector<float> uf(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    norm(embed.data() + ids[t] * H, en, cat.data());
    norm(hidden.data() + t * H, hn, cat.data() + H);
    for (int64_t r = 0; r < H; ++r) {
      double a = 0;
      for (int64_t c = 0; c < 2 * H; ++c) a += fc[r * 2 * H + c] * cat[c];
      uf[r] = static_cast<float>(a);
    }
    norm(uf.data(), fn, v.data());
    for (int64_t o = 0; o < V; ++o) {
      double a = 0;
      for (int64_t c = 0; c < H; ++c) a += head[o * H + c] * v[c];
      want[t * V + o] = static_cast<float>(a);
    }
  }
  spool::testing::expect_rows_close(got.data(), want.data(), T, V, 1e-4, std::string(fx.name) + " head logits");
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, MtpFamilies,
                         ::testing::Values(Fixture{"deepseek_v3", false, true}, Fixture{"deepseek_v3_kimi", false, false},
                                           Fixture{"glm4_moe", false, true}, Fixture{"qwen3_next", true, false}),
                         [](const ::testing::TestParamInfo<Fixture>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace spool::engine
