// Backend op table (backend_test.h), what the models call: a counting backend runs every tiny
// fixture family and the demo model; the table covers every op they call, the capability table
// names exactly the table's ops, models::optional_ops_used says which optional ops each calls,
// and ReferenceBackend (the table's oracle) reproduces the transformers goldens.
#include "ops/backend_test.h"

#include "support/golden.h"
#include "models/family.h"
#include "models/model.h"
#include "models/ops_used.h"

namespace spool::ops {
namespace {

using namespace op_table;

// ---- What the models call --------------------------------------------------------------------

// Forwards every op to CpuBackend and records its name.
class CountingBackend final : public Backend {
 public:
  explicit CountingBackend(ThreadPool* pool) : cpu_(pool) {}
  std::set<std::string> called;
  Device device() const override { return cpu_.device(); }
  const char* name() const override { return "counting"; }
  int threads() const override { return cpu_.threads(); }
#define SPOOL_FWD(op, params, args) \
  void op params override {         \
    called.insert(#op);             \
    cpu_.op args;                   \
  }
  SPOOL_FWD(matmul, (const WeightView& w, const float* x, int64_t T, float* y), (w, x, T, y))
  SPOOL_FWD(matmul_multi, (std::span<const MatmulOut> o, const float* x, int64_t T), (o, x, T))
  SPOOL_FWD(matmul_heads,
            (std::span<const WeightView> w, const float* x, int64_t lx, int64_t hx, int64_t T, float* y, int64_t ly, int64_t hy, float* xs,
             float* ys),
            (w, x, lx, hx, T, y, ly, hy, xs, ys))
  SPOOL_FWD(expert_ffn, (std::span<const ExpertMats> e, const ExpertGroups& g, size_t g0, const float* x, int64_t H, Activation a, float* y),
            (e, g, g0, x, H, a, y))
  SPOOL_FWD(moe_combine, (const float* y, const ExpertGroups& g, const float* w, int64_t H, float* out), (y, g, w, H, out))
  SPOOL_FWD(route_softmax_top_k, (float* l, int64_t T, int E, int k, bool r, int* ids, float* w, float* m), (l, T, E, k, r, ids, w, m))
  SPOOL_FWD(kv_append, (KvCache& c, int64_t p, int64_t T, const float* k, const float* v), (c, p, T, k, v))
  SPOOL_FWD(attention, (const float* q, int64_t T, int nh, const KvCache& kv, int64_t p, float s, float* o), (q, T, nh, kv, p, s, o))
  SPOOL_FWD(rope, (const Rope& r, float* x, int64_t T, int64_t st, int nh, int hd, int64_t p), (r, x, T, st, nh, hd, p))
  SPOOL_FWD(route_grouped_top_k, (const float* l, int64_t T, int E, int k, const RouterParams& r, int* ids, float* w, float* m),
            (l, T, E, k, r, ids, w, m))
  SPOOL_FWD(attention_window, (const float* q, int64_t T, int nh, const KvCache& kv, int64_t p, float s, int64_t win, float* o),
            (q, T, nh, kv, p, s, win, o))
  SPOOL_FWD(mla_attention, (const float* q, int64_t T, int nh, const KvCache& kv, int64_t p, float s, int dv, float* o),
            (q, T, nh, kv, p, s, dv, o))
  SPOOL_FWD(attention_sinks,
            (const float* q, int64_t T, int nh, const KvCache& kv, int64_t p, float s, int64_t win, const float* sk, float* o),
            (q, T, nh, kv, p, s, win, sk, o))
  SPOOL_FWD(causal_conv1d_silu, (const float* x, int64_t T, int64_t C, const float* w, int K, float* s, float* o), (x, T, C, w, K, s, o))
  SPOOL_FWD(gated_delta, (const GatedDeltaArgs& a, int c), (a, c))
  SPOOL_FWD(gdn_gates, (const float* b, const float* a, const float* ae, const float* dt, int64_t T, int nv, float* be, float* g),
            (b, a, ae, dt, T, nv, be, g))
  SPOOL_FWD(rms_norm, (const float* x, const float* w, int64_t r, int64_t n, float e, float* y), (x, w, r, n, e, y))
  SPOOL_FWD(l2_norm, (float* x, int64_t r, int64_t n, float e, float p), (x, r, n, e, p))
  SPOOL_FWD(rms_norm_gated, (float* x, const float* z, const float* w, int64_t r, int64_t n, float e), (x, z, w, r, n, e))
  SPOOL_FWD(add, (float* y, const float* x, int64_t n), (y, x, n))
  SPOOL_FWD(add_bias, (float* y, const float* b, int64_t r, int64_t n), (y, b, r, n))
  SPOOL_FWD(swiglu, (const float* g, const float* u, int64_t n, float* o), (g, u, n, o))
  SPOOL_FWD(mul_sigmoid, (float* x, const float* g, int64_t n), (x, g, n))
  SPOOL_FWD(gelu_tanh_glu, (const float* g, const float* u, int64_t n, float* o), (g, u, n, o))
  SPOOL_FWD(scale, (float* x, int64_t n, float a), (x, n, a))
  SPOOL_FWD(softcap, (float* x, int64_t n, float c), (x, n, c))
  SPOOL_FWD(mul_indexed, (float* w, const int* ids, const float* t, int64_t n), (w, ids, t, n))
  SPOOL_FWD(add_gated_rows, (float* o, const float* s, const float* x, const float* w, int64_t T, int64_t n), (o, s, x, w, T, n))
  SPOOL_FWD(copy_2d, (float* d, int64_t ld, const float* s, int64_t ls, int64_t r, int64_t c), (d, ld, s, ls, r, c))
  SPOOL_FWD(row_to_f32, (WType t, const void* s, int64_t n, float* d), (t, s, n, d))
  SPOOL_FWD(to_host, (const float* s, int64_t n, float* d), (s, n, d))
#undef SPOOL_FWD

 private:
  CpuBackend cpu_;
};

const char* const kFamilies[] = {"qwen3_moe", "qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe_vl_fused", "mixtral", "olmoe",
                                 "deepseek_v3", "deepseek_v3_kimi", "deepseek_v2_lite", "glm4_moe", "glm4_moe_lite", "minimax_m2",
                                 "glm4_moe_qknorm", "glm4_moe_lite_v24", "minimax_m2_top6", "gpt_oss", "gpt_oss_mxfp4",
                                 "ernie4_5_moe", "gemma4_text_moe"};

// The capability table (Backend::capabilities, checked per backend in capability_test.cpp) names
// exactly the ops of this table.
TEST(BackendOps, CapabilityTableNamesTheOpTable) {
  std::set<std::string> names(backend_op_names().begin(), backend_op_names().end());
  EXPECT_EQ(names.size(), backend_op_names().size());
  for (const std::string& op : names) EXPECT_TRUE(covered().count(op)) << op << ": in the capability table but not in the op table";
  for (const std::string& op : covered()) {
    if (op == "make_expert_table" || op == "routed_takes_shared") continue;  // (bookkeeping of expert_ffn_routed)
    EXPECT_TRUE(names.count(op)) << op << ": in the op table but not in the capability table";
  }
}

// covered() is filled during static initialisation, so the order of tests does not matter.
TEST(BackendOps, TableCoversEveryOpTheModelsCall) {
  std::set<std::string> called;
  auto run = [&](const std::string& dir) {
    auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
    auto be = std::make_shared<CountingBackend>(nullptr);
    auto model = models::load_model(ckpt, be);
    models::State st = model->new_state();
    std::vector<float> logits(model->spec().vocab_size);
    const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
    model->forward(prompt, st, models::LogitsMode::kLast, logits.data());  // prefill (chunked forms)
    const int32_t next = 6;
    model->forward(std::span<const int32_t>(&next, 1), st, models::LogitsMode::kLast, logits.data());  // decode
    called.insert(be->called.begin(), be->called.end());
  };
  for (const char* f : kFamilies) run(spool::testing::data_dir() + "/models/" + f);
  run(SPOOL_DEFAULT_MODEL_DIR);
  for (const std::string& op : called) EXPECT_TRUE(covered().count(op)) << "op '" << op << "' is called by a model but not in the op table";
  EXPECT_GE(called.size(), 15u);  // the counting backend saw the models' ops
}

// models::optional_ops_used(spec) names exactly the optional ops (those with a generic host form)
// each fixture family and the demo model call (a prefill and a decode step on the counting
// backend), and a sliding window shows up once set (no fixture has one without sinks).
TEST(BackendOps, OptionalOpsUsedMatchTheModelsCalls) {
  const std::set<std::string> optional(generic_host_fallback_ops().begin(), generic_host_fallback_ops().end());
  auto check = [&](const std::string& dir) {
    SCOPED_TRACE(dir);
    auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
    auto be = std::make_shared<CountingBackend>(nullptr);
    auto model = models::load_model(ckpt, be);
    models::State st = model->new_state();
    std::vector<float> logits(model->spec().vocab_size);
    const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // past the gpt-oss fixtures' window of 8
    model->forward(prompt, st, models::LogitsMode::kLast, logits.data());
    const int32_t next = 6;
    model->forward(std::span<const int32_t>(&next, 1), st, models::LogitsMode::kLast, logits.data());
    std::vector<std::string> called;
    for (const char* op : generic_host_fallback_ops())
      if (be->called.count(op)) called.push_back(op);
    const std::vector<std::string> said = models::optional_ops_used(model->spec());
    EXPECT_EQ(said, called);
    std::string line;
    for (const std::string& op : said) line += " " + op;
    std::printf("[ optional ops ] %-22s%s\n", model->spec().family.c_str(), line.empty() ? " (none)" : line.c_str());
  };
  for (const char* f : kFamilies) check(spool::testing::data_dir() + "/models/" + f);
  check(SPOOL_DEFAULT_MODEL_DIR);
  auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(spool::testing::data_dir() + "/models/mixtral"));
  models::ModelSpec spec = models::build_spec(*ckpt);
  EXPECT_TRUE(models::optional_ops_used(spec).empty());
  spec.attn.sliding_window = 4;
  EXPECT_EQ(models::optional_ops_used(spec), std::vector<std::string>{"attention_window"});
  spec.attn.window_layers.assign(spec.n_layers, false);
  EXPECT_TRUE(models::optional_ops_used(spec).empty());
}

// The oracle itself: whole fixture models on ReferenceBackend match transformers' f32 logits.
TEST(BackendOps, ReferenceBackendReproducesGoldens) {
  for (const char* f : kFamilies) {
    SCOPED_TRACE(f);
    const std::string dir = spool::testing::data_dir() + "/models/" + f;
    auto ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
    auto model = models::load_model(ckpt, std::make_shared<ReferenceBackend>());
    spool::testing::Golden g(dir + "/golden.safetensors");
    const std::vector<int32_t> ids = g.i32("input_ids");
    const std::vector<float> want = g.f32("logits");
    models::State st = model->new_state();
    std::vector<float> got(want.size());
    model->forward(ids, st, models::LogitsMode::kAll, got.data());
    spool::testing::expect_rows_close(got.data(), want.data(), static_cast<int64_t>(ids.size()), model->spec().vocab_size, 1e-4, f);
  }
}

}  // namespace
}  // namespace spool::ops
