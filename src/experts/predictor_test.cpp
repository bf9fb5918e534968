// Expert predictor heads (experts::ExpertPredictor): training fits a learnable rule, the file
// round-trips and bad files are refused, an untrained head guesses exactly as the next router
// (Model::router_as_linear), prefetch guided by trained heads keeps outputs bit-identical,
// and --route-by-predictor routes each headed layer among its head's top-k.
#include "experts/predictor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "common/error.h"
#include "experts/streaming.h"
#include "io/safetensors.h"
#include "models/family.h"
#include "models/model.h"
#include "support/golden.h"

namespace spool::experts {
namespace {

namespace fs = std::filesystem;

std::string tmp_path(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / "predictor_test";
  fs::create_directories(dir);
  return (dir / name).string();
}

// Rows u [N, H] of unit RMS and targets [N, K]: the K best of A u for a random A [E, H].
void learnable(int N, int H, int E, int K, std::vector<float>* u, std::vector<int>* t) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> A(static_cast<size_t>(E) * H);
  for (float& x : A) x = nd(rng);
  u->resize(static_cast<size_t>(N) * H);
  for (float& x : *u) x = nd(rng);
  ExpertPredictor p("x", 2, H, E, K, 0.0f);
  p.normalise(u->data(), N, u->data());
  PredictorHead truth;
  truth.target_layer = 1, truth.source_layer = 0;
  truth.w = A;
  truth.b.assign(static_cast<size_t>(E), 0.0f);
  std::vector<float> s(static_cast<size_t>(N) * E);
  p.scores_normed(truth, u->data(), N, s.data());
  t->resize(static_cast<size_t>(N) * K);
  for (int r = 0; r < N; ++r) {
    std::vector<int> order(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) order[e] = e;
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int a, int b) { return s[r * E + a] > s[r * E + b]; });
    std::copy_n(order.begin(), K, t->begin() + static_cast<ptrdiff_t>(r) * K);
  }
}

TEST(Predictor, TrainingFitsALinearRule) {
  const int N = 4000, H = 16, E = 12, K = 2;
  std::vector<float> u;
  std::vector<int> t;
  learnable(N, H, E, K, &u, &t);
  for (int mlp : {0, 32}) {
    ExpertPredictor p("x", 2, H, E, K, 0.0f);
    PredictorHead h;
    h.target_layer = 1, h.source_layer = 0, h.mlp = mlp;
    h.w.assign(static_cast<size_t>(E) * H, 0.0f);  // starts knowing nothing: every expert ties
    h.b.assign(static_cast<size_t>(E), 0.0f);
    PredictorTrainOptions o;
    o.epochs = 30;
    o.lr = 0.01f;
    const PredictorTrainReport r = train_head(p, h, u.data(), t.data(), N, K, o);
    EXPECT_LT(r.router_recall_k, 0.4) << "mlp " << mlp;
    EXPECT_GT(r.head_recall_k, 0.85) << "mlp " << mlp;
    EXPECT_GE(r.head_recall_2k, r.head_recall_k);
    EXPECT_GT(r.epoch, 0);
    EXPECT_EQ(r.validation_rows, 400);
    if (mlp > 0) {
      EXPECT_EQ(h.w1.size(), static_cast<size_t>(mlp) * H);
      EXPECT_NE(*std::max_element(h.w2.begin(), h.w2.end()), 0.0f) << "the branch was trained";
    }
  }
}

TEST(Predictor, RecallCountsTargetsAmongTheBestM) {
  const float s[2 * 4] = {4, 3, 2, 1,  //
                          1, 2, 3, 4};
  const int t[2 * 2] = {0, 2, 0, 1};
  EXPECT_DOUBLE_EQ(recall_at(s, t, 2, 4, 2, 2), 0.25);  // row 0: {0,1} has 0; row 1: {3,2} has none
  EXPECT_DOUBLE_EQ(recall_at(s, t, 2, 4, 2, 3), 0.75);  // row 0: {0,1,2} has both; row 1: {3,2,1} has 1
  EXPECT_DOUBLE_EQ(recall_at(s, t, 2, 4, 2, 4), 1.0);
}

ExpertPredictor small_predictor(int mlp) {
  ExpertPredictor p("qwen3_moe", 4, 8, 6, 2, 1e-6f);
  for (int l : {1, 3}) {
    PredictorHead h;
    h.target_layer = l, h.source_layer = l - 1, h.mlp = mlp;
    for (int i = 0; i < 6 * 8; ++i) h.w.push_back(0.01f * static_cast<float>(i * l));
    for (int i = 0; i < 6; ++i) h.b.push_back(-0.5f * static_cast<float>(i));
    for (int i = 0; i < mlp * 8; ++i) h.w1.push_back(0.02f * static_cast<float>(i % 7) - 0.05f);
    for (int i = 0; i < mlp; ++i) h.b1.push_back(0.1f);
    for (int i = 0; i < 6 * mlp; ++i) h.w2.push_back(0.03f * static_cast<float>(i % 5));
    p.add(std::move(h));
  }
  return p;
}

TEST(Predictor, FileRoundTrip) {
  for (int mlp : {0, 3}) {
    const ExpertPredictor p = small_predictor(mlp);
    const std::string path = tmp_path("p" + std::to_string(mlp) + ".safetensors");
    p.save(path);
    const ExpertPredictor q = ExpertPredictor::load(path);
    EXPECT_EQ(q.model_type(), "qwen3_moe");
    EXPECT_EQ(q.n_layers(), 4);
    EXPECT_EQ(q.top_k(), 2);
    EXPECT_FLOAT_EQ(q.eps(), 1e-6f);
    ASSERT_EQ(q.heads().size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      const PredictorHead &a = p.heads()[i], &b = q.heads()[i];
      EXPECT_EQ(a.target_layer, b.target_layer);
      EXPECT_EQ(a.source_layer, b.source_layer);
      EXPECT_EQ(a.mlp, b.mlp);
      EXPECT_EQ(a.w, b.w);
      EXPECT_EQ(a.b, b.b);
      EXPECT_EQ(a.w1, b.w1);
      EXPECT_EQ(a.b1, b.b1);
      EXPECT_EQ(a.w2, b.w2);
    }
    EXPECT_EQ(q.head(2), nullptr);
    EXPECT_EQ(q.head_from(2), q.head(3));
    EXPECT_NO_THROW(q.check_matches("x", "qwen3_moe", 4, 8, 6));
    EXPECT_THROW(q.check_matches("x", "qwen3_moe", 4, 8, 7), Error);
    EXPECT_THROW(q.check_matches("x", "deepseek_v3", 4, 8, 6), Error);
  }
}

// Writes a predictor-like file with `md` changed and tensors changed by `edit`.
std::string bad_file(const std::string& name, const std::map<std::string, std::string>& md_edit,
                     const std::function<void(std::vector<io::TensorToWrite>&, std::vector<float>&)>& edit) {
  const std::string good = tmp_path("good.safetensors");
  small_predictor(0).save(good);
  io::SafetensorsFile f = io::SafetensorsFile::open(good);
  std::map<std::string, std::string> md = f.metadata();
  for (const auto& [k, v] : md_edit) {
    if (v == "<erase>")
      md.erase(k);
    else
      md[k] = v;
  }
  std::vector<io::TensorToWrite> t;
  std::vector<float> storage(1 << 12, 0.0f);
  for (const io::TensorInfo& ti : f.tensors()) t.push_back({ti.name, ti.dtype, ti.shape, f.data(ti)});
  edit(t, storage);
  const std::string path = tmp_path(name);
  io::write_safetensors(path, t, md);
  return path;
}

TEST(Predictor, BadFilesAreRefusedWithTheirProblem) {
  auto none = [](std::vector<io::TensorToWrite>&, std::vector<float>&) {};
  auto expect_error = [](const std::string& path, const std::string& words) {
    try {
      ExpertPredictor::load(path);
      ADD_FAILURE() << path << " loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  };
  expect_error(bad_file("foreign.safetensors", {{"format", "something"}}, none), "not a spool expert predictor");
  expect_error(bad_file("v2.safetensors", {{"version", "2"}}, none), "version 2");
  expect_error(bad_file("nolayers.safetensors", {{"n_layers", "<erase>"}}, none), "n_layers missing");
  expect_error(bad_file("badint.safetensors", {{"top_k", "2x"}}, none), "not an integer");
  expect_error(bad_file("topk.safetensors", {{"top_k", "9"}}, none), "bad shape");
  expect_error(bad_file("nosource.safetensors", {{"heads.3.source_layer", "<erase>"}}, none), "heads.3.source_layer missing");
  expect_error(bad_file("source.safetensors", {{"heads.3.source_layer", "3"}}, none), "out of range");
  expect_error(bad_file("nobias.safetensors", {}, [](auto& t, auto&) { std::erase_if(t, [](auto& x) { return x.name == "heads.1.bias"; }); }),
               "heads.1.bias missing");
  expect_error(bad_file("shape.safetensors", {}, [](auto& t, auto& st) {
                 for (auto& x : t)
                   if (x.name == "heads.1.bias") x.shape = {5}, x.data = st.data();
               }),
               "wrong dtype or shape");
  expect_error(bad_file("nan.safetensors", {}, [](auto& t, auto& st) {
                 st[2] = std::nanf("");
                 for (auto& x : t)
                   if (x.name == "heads.1.bias") x.data = st.data();
               }),
               "not finite");
  expect_error(bad_file("extra.safetensors", {}, [](auto& t, auto& st) { t.push_back({"router.weight", io::DType::F32, {4}, st.data()}); }),
               "unexpected tensor");
  expect_error(bad_file("empty.safetensors", {}, [](auto& t, auto&) { t.clear(); }), "no heads");
  // A truncated file: the safetensors reader names it.
  const std::string good = tmp_path("good.safetensors");
  const std::string cut = tmp_path("cut.safetensors");
  fs::copy_file(good, cut, fs::copy_options::overwrite_existing);
  fs::resize_file(cut, fs::file_size(good) - 9);
  EXPECT_THROW(ExpertPredictor::load(cut), Error);
  EXPECT_THROW(ExpertPredictor::load(tmp_path("missing.safetensors")), Error);
}

// Forwards to another provider and records every hint().
class HintRecorder : public ExpertProvider {
 public:
  explicit HintRecorder(std::shared_ptr<ExpertProvider> inner) : inner_(std::move(inner)) {}
  void acquire(int layer, std::span<const int> ids, std::span<ExpertWeights> out) override { inner_->acquire(layer, ids, out); }
  void hint(int layer, std::span<const int> ids) override { hints.push_back({layer, std::vector<int>(ids.begin(), ids.end())}); }
  void release(int layer) override { inner_->release(layer); }
  std::string describe() const override { return "hint recorder"; }
  std::vector<std::pair<int, std::vector<int>>> hints;

 private:
  std::shared_ptr<ExpertProvider> inner_;
};

struct Demo {
  std::shared_ptr<io::Checkpoint> ckpt;
  std::unique_ptr<ops::ThreadPool> pool;
  std::unique_ptr<models::Model> model;
  std::vector<bool> moe_layers;
};

Demo load_demo() {
  Demo s;
  s.ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(SPOOL_DEFAULT_MODEL_DIR));
  s.pool = std::make_unique<ops::ThreadPool>(2);
  s.model = models::load_model(s.ckpt, s.pool.get());
  for (auto f : s.model->spec().ffns) s.moe_layers.push_back(f == models::FfnKind::kMoE);
  return s;
}

std::vector<int32_t> demo_prompt(const models::Model& m, int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back((i * 37 + 11 + salt * 101) % static_cast<int>(m.spec().vocab_size));
  return p;
}

// The predictor of `m`'s untrained heads (each the next router as a linear map).
std::shared_ptr<ExpertPredictor> router_heads(models::Model& m) {
  const auto& sp = m.spec();
  auto p = std::make_shared<ExpertPredictor>(sp.model_type, sp.n_layers, static_cast<int>(sp.hidden_size), sp.moe.n_experts,
                                             sp.moe.top_k, sp.rms_norm_eps);
  for (int j = 0; j < sp.n_layers; ++j) {
    if (m.predictor_source(j) < 0) continue;
    PredictorHead h;
    h.target_layer = j, h.source_layer = m.predictor_source(j);
    m.router_as_linear(j, &h.w, &h.b);
    p->add(std::move(h));
  }
  return p;
}

TEST(Predictor, UntrainedHeadsGuessAsTheNextRouter) {
  Demo s = load_demo();
  models::Model& m = *s.model;
  const int L = m.spec().n_layers;
  EXPECT_EQ(m.predictor_source(0), -1);
  for (int j = 1; j < L; ++j) EXPECT_EQ(m.predictor_source(j), j - 1);
  auto heads = router_heads(m);
  ASSERT_EQ(static_cast<int>(heads->heads().size()), L - 1);
  auto guesses = [&](std::shared_ptr<const ExpertPredictor> p) {
    auto rec = std::make_shared<HintRecorder>(m.shared_expert_provider());
    m.set_expert_provider(rec);
    m.set_next_layer_prefetch(12);
    m.set_expert_predictor(p, false);
    models::State st = m.new_state();
    const std::vector<int32_t> prompt = demo_prompt(m, 20, 0);
    std::vector<float> logits(static_cast<size_t>(m.spec().vocab_size));
    m.forward(std::span<const int32_t>(prompt.data(), 9), st, models::LogitsMode::kLast, logits.data());
    for (size_t i = 9; i < prompt.size(); ++i) m.forward(std::span<const int32_t>(&prompt[i], 1), st, models::LogitsMode::kLast, logits.data());
    m.set_expert_predictor(nullptr, false);
    m.set_next_layer_prefetch(0);
    m.set_expert_provider(nullptr);
    // (as sets: the order of two guesses whose scores differ by rounding may differ)
    for (auto& h : rec->hints) std::sort(h.second.begin(), h.second.end());
    return rec->hints;
  };
  const auto want = guesses(nullptr);
  const auto got = guesses(heads);
  ASSERT_EQ(want.size(), static_cast<size_t>((L - 1) * 12));  // every layer but the last, 12 forward calls
  EXPECT_EQ(got, want);
  // Heads moved away from the router guess otherwise: the hints are the heads' (their top-12 per row).
  ExpertPredictor moved(heads->model_type(), L, heads->hidden(), heads->n_experts(), heads->top_k(), heads->eps());
  for (PredictorHead h : heads->heads()) {
    for (size_t i = 0; i < h.b.size(); ++i) h.b[i] += static_cast<float>((i * 7919) % 13);  // reorders the experts
    moved.add(std::move(h));
  }
  const auto other = guesses(std::make_shared<const ExpertPredictor>(moved));
  ASSERT_EQ(other.size(), want.size());
  int differ = 0;
  for (size_t i = 0; i < want.size(); ++i) differ += other[i].second != want[i].second;
  EXPECT_GT(differ, static_cast<int>(want.size()) / 2);
}

TEST(Predictor, PrefetchFromTrainedHeadsIsExact) {
  Demo s = load_demo();
  models::Model& m = *s.model;
  const auto& sp = m.spec();
  // Heads moved away from the router (trained on a few rows), so the guesses differ from (2)'s.
  auto heads = router_heads(m);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  ExpertPredictor moved(sp.model_type, sp.n_layers, static_cast<int>(sp.hidden_size), sp.moe.n_experts, sp.moe.top_k, sp.rms_norm_eps);
  for (PredictorHead h : heads->heads()) {
    for (float& x : h.w) x += nd(rng);
    moved.add(std::move(h));
  }
  auto pred = std::make_shared<const ExpertPredictor>(std::move(moved));
  const std::vector<int32_t> prompt = demo_prompt(m, 24, 1);
  auto run = [&] {
    models::State st = m.new_state();
    std::vector<float> out, last(static_cast<size_t>(sp.vocab_size));
    for (size_t i = 0; i < prompt.size(); i += 8) {
      m.forward(std::span<const int32_t>(prompt.data() + i, std::min<size_t>(8, prompt.size() - i)), st, models::LogitsMode::kLast, last.data());
      out.insert(out.end(), last.begin(), last.end());
    }
    for (int d = 0; d < 8; ++d) {
      const int32_t next = spool::testing::argmax(last.data(), sp.vocab_size);
      m.forward(std::span<const int32_t>(&next, 1), st, models::LogitsMode::kLast, last.data());
      out.insert(out.end(), last.begin(), last.end());
    }
    return out;
  };
  const std::vector<float> want = run();
  const io::ExpertStore store(*s.ckpt, s.moe_layers, sp.moe.n_experts, false);
  const uint64_t all = static_cast<uint64_t>(std::count(s.moe_layers.begin(), s.moe_layers.end(), true)) * sp.moe.n_experts;
  for (double frac : {0.1, 0.3}) {
    StreamingOptions o;
    o.top_k = sp.moe.top_k;
    o.workers = 2;
    o.cache_budget_bytes = static_cast<uint64_t>(frac * static_cast<double>(all)) * store.slot_bytes();
    o.stage_slots = 2 * 12;
    auto streaming = std::make_shared<StreamingExperts>(s.ckpt, s.moe_layers, sp.moe.n_experts, sp.hidden_size, sp.moe.intermediate, o);
    m.set_expert_provider(streaming);
    m.set_next_layer_prefetch(12);
    m.set_expert_predictor(pred, false);
    const std::vector<float> got = run();
    m.set_expert_predictor(nullptr, false);
    m.set_next_layer_prefetch(0);
    m.set_expert_provider(nullptr);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "budget " << frac << ": logits differ";
    const StreamingStats st = streaming->stats();
    EXPECT_GT(st.staged_used, 0u) << "budget " << frac;
  }
}

TEST(Predictor, RouteByPredictorRoutesAmongTheHeadsTopK) {
  Demo s = load_demo();
  models::Model& m = *s.model;
  const auto& sp = m.spec();
  const int K = sp.moe.top_k, H = static_cast<int>(sp.hidden_size);
  auto heads = router_heads(m);
  const std::vector<int32_t> prompt = demo_prompt(m, 16, 2);
  std::map<int, std::vector<int>> routed;  // layer -> [T, K]
  std::map<int, std::vector<float>> residual;  // layer -> [T, H]
  m.hooks.on_route = [&](int layer, int64_t, std::span<const int> e, std::span<const float>) {
    routed[layer].insert(routed[layer].end(), e.begin(), e.end());
  };
  m.hooks.on_ffn_input = [&](int layer, const float* h, int64_t T) { residual[layer].insert(residual[layer].end(), h, h + T * H); };
  std::vector<float> exact(static_cast<size_t>(sp.vocab_size)), by(exact.size());
  {
    models::State st = m.new_state();
    m.forward(prompt, st, models::LogitsMode::kLast, exact.data());
  }
  const std::map<int, std::vector<int>> exact_routes = routed;
  routed.clear();
  residual.clear();
  m.set_expert_predictor(heads, true);
  {
    models::State st = m.new_state();
    m.forward(prompt, st, models::LogitsMode::kLast, by.data());
  }
  m.set_expert_predictor(nullptr, false);
  m.hooks = {};
  const int64_t T = static_cast<int64_t>(prompt.size());
  EXPECT_EQ(routed[0], exact_routes.at(0)) << "layer 0 has no head: exact routing";
  int differ = 0;
  for (int j = 1; j < sp.n_layers; ++j) {
    std::vector<int> top(static_cast<size_t>(T * K));
    heads->top_m(*heads->head(j), residual[j - 1].data(), T, K, top.data());
    ASSERT_EQ(routed[j].size(), top.size());
    for (int64_t t = 0; t < T; ++t) {
      const std::set<int> want(top.begin() + t * K, top.begin() + (t + 1) * K);
      const std::set<int> got(routed[j].begin() + t * K, routed[j].begin() + (t + 1) * K);
      EXPECT_EQ(got, want) << "layer " << j << " row " << t;
    }
    differ += routed[j] != exact_routes.at(j);
  }
  EXPECT_GT(differ, 0) << "the router one layer early is not the exact routing on a trained model";
  EXPECT_NE(std::memcmp(exact.data(), by.data(), exact.size() * sizeof(float)), 0);
  // A GPU-less CPU model with a bias-free softmax router takes it; a predictor for another model does not.
  ExpertPredictor other("qwen3_moe", sp.n_layers, H, sp.moe.n_experts, K, sp.rms_norm_eps);
  EXPECT_THROW(m.set_expert_predictor(std::make_shared<const ExpertPredictor>(other), false), Error);
  EXPECT_THROW(m.set_expert_predictor(nullptr, true), Error);
}

}  // namespace
}  // namespace spool::experts
