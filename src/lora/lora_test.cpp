// LoRA adapters applied unmerged against PEFT 0.21.2 (transformers 5.17, f32): for each tiny
// fixture family an adapter on attention / Gated DeltaNet / shared-expert / dense linears
// (attn_mlp) and one that also targets the routed experts' 3D parameters (with_experts,
// PEFT target_parameters), resident and streamed at a zero expert budget; the demo model's
// trained rank-8 adapter with and without it, also both in one forward_batch (per-sequence
// adapters, models::SeqStep::lora; resident and streamed). Logits: per row max|diff| <= 1e-4 *
// max|ref|; greedy ids exact. Then bad adapters: clear errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "experts/streaming.h"
#include "io/safetensors.h"
#include "lora/adapter.h"
#include "lora/lora_set.h"
#include "models/family.h"
#include "models/model.h"
#include "ops/cpu_backend.h"
#ifdef SPOOL_HAVE_CUDA
#include "ops/cuda/cuda_backend.h"
#endif
#include "support/golden.h"

namespace spool::lora {
namespace {

using spool::testing::argmax;
using spool::testing::data_dir;
using spool::testing::expect_rows_close;
using spool::testing::Golden;

constexpr double kTol = 1e-4;

struct Loaded {
  std::shared_ptr<io::Checkpoint> ckpt;
  std::unique_ptr<ops::ThreadPool> pool;
  std::unique_ptr<models::Model> model;
};

// Whether this build and machine run the CUDA cases (GPU tests: SKIPPED otherwise).
bool have_cuda() {
#ifdef SPOOL_HAVE_CUDA
  return ops::cuda_device_count() > 0;
#else
  return false;
#endif
}

// The checkpoint at `dir` with the adapters (path, scale) applied; `stream`: routed experts read
// from disk per use (a zero cache budget) instead of the resident mapping; `cuda`: on CudaBackend
// (device 0; the caller checks have_cuda()), experts from the host mapping or the stream.
Loaded load(const std::string& dir, const std::vector<std::pair<std::string, float>>& adapters, bool stream = false,
            bool cuda = false) {
  Loaded l;
  l.ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
  l.pool = std::make_unique<ops::ThreadPool>(2);
  auto set = std::make_shared<LoraSet>();
  for (const auto& [path, scale] : adapters) set->add(load_adapter(path, *l.ckpt, models::checkpoint_rules()), scale);
  std::shared_ptr<ops::Backend> backend = std::make_shared<ops::CpuBackend>(l.pool.get());
#ifdef SPOOL_HAVE_CUDA
  if (cuda) backend = std::make_shared<ops::CudaBackend>(0);
#else
  if (cuda) fail("lora_test: a CUDA case in a build without CUDA");
#endif
  l.model = models::load_model(l.ckpt, backend, set);
  if (stream) {
    const models::ModelSpec& sp = l.model->spec();
    std::vector<bool> moe(sp.n_layers);
    for (int i = 0; i < sp.n_layers; ++i) moe[i] = sp.ffns[i] == models::FfnKind::kMoE;
    experts::StreamingOptions o;
    o.top_k = sp.moe.top_k;
    o.cache_budget_bytes = 0;  // every expert read when used
    l.model->set_expert_provider(
        std::make_shared<experts::StreamingExperts>(l.ckpt, moe, sp.moe.n_experts, sp.hidden_size, sp.moe.intermediate, o));
  }
  return l;
}

std::vector<float> logits_all(models::Model& m, const std::vector<int32_t>& ids) {
  models::State st = m.new_state();
  std::vector<float> out(ids.size() * m.spec().vocab_size);
  m.forward(ids, st, models::LogitsMode::kAll, out.data());
  return out;
}

// Greedy continuation of n tokens (transformers generate, do_sample=False: plain argmax; a
// golden that met EOS ends with it, so n tokens of argmax reproduce it either way).
std::vector<int32_t> greedy(models::Model& m, const std::vector<int32_t>& ids, size_t n) {
  models::State st = m.new_state();
  const int64_t V = m.spec().vocab_size;
  std::vector<float> logits(V);
  m.forward(ids, st, models::LogitsMode::kLast, logits.data());
  std::vector<int32_t> out;
  while (out.size() < n) {
    out.push_back(argmax(logits.data(), V));
    if (out.size() < n) m.forward(std::span<const int32_t>(&out.back(), 1), st, models::LogitsMode::kLast, logits.data());
  }
  return out;
}

std::vector<int32_t> json_ids(const std::string& path, const char* key) {
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f);
  return j.at(key).get<std::vector<int32_t>>();
}

struct Case {
  std::string family, kind;
  bool stream;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.family << "/" << c.kind << (c.stream ? " streamed" : " resident"); }

std::string case_name(const ::testing::TestParamInfo<Case>& i) {
  return i.param.family + "_" + i.param.kind + (i.param.stream ? "_streamed" : "_resident");
}

class PeftGolden : public ::testing::TestWithParam<Case> {};

TEST_P(PeftGolden, LogitsAndGreedyMatchPeft) {
  const Case& c = GetParam();
  const std::string fix = data_dir() + "/lora/" + c.family;
  Loaded l = load(data_dir() + "/models/" + c.family, {{fix + "/" + c.kind, 1.0f}}, c.stream);
  const std::vector<int32_t> ids = json_ids(fix + "/golden_lora.json", "prompt_ids");
  Golden g(fix + "/golden_lora.safetensors");
  const std::vector<float> ref = g.f32(c.kind + ".logits");
  const std::vector<float> got = logits_all(*l.model, ids);
  const double worst = expect_rows_close(got.data(), ref.data(), static_cast<int64_t>(ids.size()), l.model->spec().vocab_size, kTol,
                                         case_name({c, 0}));
  std::printf("%s: max rel error %.3g\n", case_name({c, 0}).c_str(), worst);
  const std::vector<int32_t> want = g.i32(c.kind + ".greedy_ids");
  EXPECT_EQ(greedy(*l.model, ids, want.size()), want);
}

std::vector<Case> cases() {
  std::vector<Case> v;
  for (const char* f : {"qwen3_5_moe_text", "qwen3_moe", "deepseek_v3"})
    for (const char* k : {"attn_mlp", "with_experts"})
      for (bool s : {false, true}) v.push_back({f, k, s});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Families, PeftGolden, ::testing::ValuesIn(cases()), case_name);

// The same goldens on CudaBackend (Impl::lora_add: cuBLAS f32 beside each product, the experts'
// terms in the per-expert path), resident and streamed; the GGUF adapters too (GPU tests).
class CudaPeftGolden : public ::testing::TestWithParam<Case> {};

TEST_P(CudaPeftGolden, LogitsAndGreedyMatchPeft) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device (or a build without CUDA): LoRA on CUDA not checked";
  const Case& c = GetParam();
  const std::string fix = data_dir() + "/lora/" + c.family;
  for (const std::string& adapter : {fix + "/" + c.kind, fix + "/" + c.kind + ".gguf"}) {
    if (!std::filesystem::exists(adapter)) continue;  // (GGUF adapters: qwen3_5_moe_text, qwen3_moe)
    SCOPED_TRACE(adapter);
    Loaded l = load(data_dir() + "/models/" + c.family, {{adapter, 1.0f}}, c.stream, /*cuda=*/true);
    const std::vector<int32_t> ids = json_ids(fix + "/golden_lora.json", "prompt_ids");
    Golden g(fix + "/golden_lora.safetensors");
    const std::vector<float> ref = g.f32(c.kind + ".logits");
    const std::vector<float> got = logits_all(*l.model, ids);
    const double worst = expect_rows_close(got.data(), ref.data(), static_cast<int64_t>(ids.size()), l.model->spec().vocab_size, kTol,
                                           "cuda " + case_name({c, 0}) + " " + adapter);
    std::printf("cuda %s (%s): max rel error %.3g\n", case_name({c, 0}).c_str(), adapter.ends_with(".gguf") ? "gguf" : "peft", worst);
    const std::vector<int32_t> want = g.i32(c.kind + ".greedy_ids");
    EXPECT_EQ(greedy(*l.model, ids, want.size()), want);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaPeftGolden, ::testing::ValuesIn(cases()), case_name);

// The same adapters as llama.cpp GGUF LoRA files (tests/reference/gguf_lora.py: GGUF names, the
// converter's tiled V heads on B's rows / A's columns, experts as 3-D ffn_{gate,up,down}_exps
// pairs), over the safetensors checkpoint and over its F32 GGUF: PEFT's goldens.
struct GgufCase {
  std::string family, kind;
  bool gguf_base, stream;
};

std::string gguf_case_name(const ::testing::TestParamInfo<GgufCase>& i) {
  return i.param.family + "_" + i.param.kind + (i.param.gguf_base ? "_over_gguf" : "_over_safetensors") +
         (i.param.stream ? "_streamed" : "_resident");
}

class GgufLoraGolden : public ::testing::TestWithParam<GgufCase> {};

TEST_P(GgufLoraGolden, LogitsAndGreedyMatchPeft) {
  const GgufCase& c = GetParam();
  const std::string fix = data_dir() + "/lora/" + c.family;
  const std::string base = c.gguf_base ? data_dir() + "/gguf/models/" + c.family + ".f32.gguf" : data_dir() + "/models/" + c.family;
  Loaded l = load(base, {{fix + "/" + c.kind + ".gguf", 1.0f}}, c.stream);
  const std::vector<int32_t> ids = json_ids(fix + "/golden_lora.json", "prompt_ids");
  Golden g(fix + "/golden_lora.safetensors");
  const std::vector<float> ref = g.f32(c.kind + ".logits");
  const std::vector<float> got = logits_all(*l.model, ids);
  const std::string name = gguf_case_name({c, 0});
  const double worst = expect_rows_close(got.data(), ref.data(), static_cast<int64_t>(ids.size()), l.model->spec().vocab_size, kTol, name);
  std::printf("%s: max rel error %.3g\n", name.c_str(), worst);
  EXPECT_EQ(greedy(*l.model, ids, g.i32(c.kind + ".greedy_ids").size()), g.i32(c.kind + ".greedy_ids"));
}

std::vector<GgufCase> gguf_cases() {
  std::vector<GgufCase> v;
  for (const char* f : {"qwen3_5_moe_text", "qwen3_moe"})
    for (const char* k : {"attn_mlp", "with_experts"})
      for (bool gb : {false, true}) v.push_back({f, k, gb, false});
  v.push_back({"qwen3_5_moe_text", "with_experts", false, true});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Families, GgufLoraGolden, ::testing::ValuesIn(gguf_cases()), gguf_case_name);

// The adapter changes the logits well beyond the tolerance (a golden test that cannot tell the
// adapter from the base would pass with the adapter ignored).
TEST(PeftGolden, AdaptersMoveTheLogits) {
  for (const char* f : {"qwen3_5_moe_text", "qwen3_moe", "deepseek_v3"}) {
    const std::string fix = data_dir() + "/lora/" + f;
    Loaded base = load(data_dir() + "/models/" + f, {});
    const std::vector<int32_t> ids = json_ids(fix + "/golden_lora.json", "prompt_ids");
    const std::vector<float> b = logits_all(*base.model, ids);
    Golden g(fix + "/golden_lora.safetensors");
    for (const char* k : {"attn_mlp", "with_experts"}) {
      const std::vector<float> ref = g.f32(std::string(k) + ".logits");
      EXPECT_GT(spool::testing::max_row_ratio(b, ref, static_cast<int64_t>(ids.size()), base.model->spec().vocab_size), 100 * kTol)
          << f << " " << k;
    }
  }
}

// Over GGUF bases: the fixtures as F32 GGUF (llama.cpp's names and layouts, mapped back to the HF
// names the adapter keys use) give PEFT's logits; over llama.cpp block types (the q mix) an adapter
// adds exactly what it adds over the same weights dequantized to F32 (the low-rank products never
// touch W's storage).
TEST(GgufBase, F32GgufWithAdapterMatchesPeft) {
  for (const char* f : {"qwen3_5_moe_text", "qwen3_moe", "deepseek_v3"})
    for (const char* k : {"attn_mlp", "with_experts"}) {
      const std::string fix = data_dir() + "/lora/" + f;
      Loaded l = load(data_dir() + "/gguf/models/" + f + ".f32.gguf", {{fix + "/" + k, 1.0f}});
      const std::vector<int32_t> ids = json_ids(fix + "/golden_lora.json", "prompt_ids");
      Golden g(fix + "/golden_lora.safetensors");
      const std::vector<float> ref = g.f32(std::string(k) + ".logits");
      const std::vector<float> got = logits_all(*l.model, ids);
      expect_rows_close(got.data(), ref.data(), static_cast<int64_t>(ids.size()), l.model->spec().vocab_size, kTol,
                        std::string(f) + " gguf " + k);
    }
}

TEST(GgufBase, BlockTypesTakeTheSameTermsAsTheirDequantizedWeights) {
  for (const char* f : {"qwen3_5_moe_text", "qwen3_moe"})
    for (const char* k : {"attn_mlp", "with_experts"}) {
      const std::string fix = data_dir() + "/lora/" + f, base = data_dir() + "/gguf/models/" + f;
      const std::vector<int32_t> ids = json_ids(fix + "/golden_lora.json", "prompt_ids");
      Loaded q = load(base + ".q.gguf", {{fix + "/" + k, 1.0f}});
      Loaded d = load(base + ".deq.gguf", {{fix + "/" + k, 1.0f}});
      Loaded q0 = load(base + ".q.gguf", {});
      const std::vector<float> got = logits_all(*q.model, ids), ref = logits_all(*d.model, ids), plain = logits_all(*q0.model, ids);
      const int64_t V = q.model->spec().vocab_size, T = static_cast<int64_t>(ids.size());
      expect_rows_close(got.data(), ref.data(), T, V, kTol, std::string(f) + " q vs deq " + k);
      EXPECT_GT(spool::testing::max_row_ratio(got, plain, T, V), 100 * kTol) << f << " " << k;  // the adapter did act
    }
}

// The demo adapter's goldens: with it, golden_prompts_lora's prompt p ("p{p}." keys); without it
// (PEFT's disable_adapter), the demo model's own goldens (models/spool-demo-moe/golden_prompts:
// the fixture's golden_prompts_base holds the same prompts among its four with the same logits bit
// for bit, so it is not stored). demo_key(p): the key prefix there of prompt p's input ids.
const std::string kDemoGolden = data_dir() + "/models/spool-demo-moe/golden_prompts.safetensors";
std::string demo_key(int p) {
  Golden lora(data_dir() + "/lora/spool-demo-moe-dev/golden_prompts_lora.safetensors"), demo(kDemoGolden);
  const std::vector<int32_t> ids = lora.i32("p" + std::to_string(p) + ".input_ids");
  for (int j = 0; j < 4; ++j)
    if (demo.i32("p" + std::to_string(j) + ".input_ids") == ids) return "p" + std::to_string(j) + ".";
  ADD_FAILURE() << "prompt " << p << " of the adapter's goldens is none of the demo's golden prompts";
  return "p" + std::to_string(p) + ".";
}

// The demo model's trained adapter (rank 8, alpha 16 on attention, Gated DeltaNet and the shared
// experts): the goldens with it, and without it (PEFT's disable_adapter) from the base alone and
// from the adapter at scale 0.
class DemoAdapter : public ::testing::Test {
 protected:
  // `base`: the goldens without the adapter (kDemoGolden, demo_key), else golden_prompts_lora.
  static void check(models::Model& m, bool base) {
    const std::string golden = base ? kDemoGolden : data_dir() + "/lora/spool-demo-moe-dev/golden_prompts_lora.safetensors";
    Golden g(golden);
    for (int p = 0; p < 3; ++p) {
      const std::string k = base ? demo_key(p) : "p" + std::to_string(p) + ".";
      const std::vector<int32_t> ids = g.i32(k + "input_ids");
      const std::vector<float> got = logits_all(m, ids);
      const std::vector<float> ref = g.f32(k + "logits");
      expect_rows_close(got.data(), ref.data(), static_cast<int64_t>(ids.size()), m.spec().vocab_size, kTol,
                        golden + " prompt " + std::to_string(p));
      const std::vector<int32_t> want = g.i32(k + "greedy_ids");
      EXPECT_EQ(greedy(m, ids, want.size()), want) << golden << " prompt " << p;
    }
  }
  const std::string model_ = SPOOL_DEFAULT_MODEL_DIR;
  const std::string fix_ = data_dir() + "/lora/spool-demo-moe-dev";
};

TEST_F(DemoAdapter, WithAdapterMatchesPeft) {
  Loaded l = load(model_, {{fix_, 1.0f}});
  check(*l.model, /*base=*/false);
}

TEST_F(DemoAdapter, StreamedWithAdapterMatchesPeft) {
  Loaded l = load(model_, {{fix_ + "/adapter_model.safetensors", 1.0f}}, /*stream=*/true);
  check(*l.model, /*base=*/false);
}

// Continuous batching with per-sequence adapters (models::SeqStep::lora): every golden prompt
// with the adapter and without it, all six sequences in each forward_batch step (prefill, then
// greedy decoding in lockstep), the adapter loaded at default scale 0: each sequence's logits
// and greedy ids are its golden's. A third sequence per prompt without a lora field takes the
// default (0: the base).
void batch_with_and_without(const std::string& model_dir, const std::string& fix, bool stream, bool cuda = false) {
  Loaded l = load(model_dir, {{fix, 0.0f}}, stream, cuda);
  models::Model& m = *l.model;
  const int64_t V = m.spec().vocab_size;
  Golden with(fix + "/golden_prompts_lora.safetensors"), base(kDemoGolden);
  const std::vector<float> on = {1.0f}, off = {0.0f};
  struct Seq {
    int prompt;
    const std::vector<float>* lora;  // null: no lora field (the defaults)
    Golden* golden;
    models::State st;
    std::vector<int32_t> ids, out;
    std::vector<float> logits;
    std::string key;  // its golden's key prefix
  };
  std::vector<Seq> seqs;
  for (int p = 0; p < 3; ++p)
    for (int v = 0; v < 3; ++v) {
      Seq s{p, v == 0 ? &on : v == 1 ? &off : nullptr, v == 0 ? &with : &base, m.new_state(), {}, {}, {}};
      s.key = v == 0 ? "p" + std::to_string(p) + "." : demo_key(p);
      s.ids = s.golden->i32(s.key + "input_ids");
      s.logits.resize(s.ids.size() * V);
      seqs.push_back(std::move(s));
    }
  std::vector<models::SeqStep> step;
  for (Seq& s : seqs) {
    models::SeqStep q{s.ids, &s.st, models::LogitsMode::kAll, s.logits.data()};
    if (s.lora != nullptr) q.lora = *s.lora;
    step.push_back(q);
  }
  m.forward_batch(step);
  for (Seq& s : seqs) {
    const std::string& k = s.key;
    const std::vector<float> ref = s.golden->f32(k + "logits");
    expect_rows_close(s.logits.data(), ref.data(), static_cast<int64_t>(s.ids.size()), V, kTol,
                      k + (s.golden == &with ? " with the adapter" : " without it"));
  }
  const size_t n = with.i32("p0.greedy_ids").size();
  std::vector<std::vector<float>> last(seqs.size(), std::vector<float>(V));
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq& s = seqs[i];
    std::copy(s.logits.end() - V, s.logits.end(), last[i].begin());
    s.out.push_back(argmax(last[i].data(), V));
  }
  while (seqs[0].out.size() < n) {  // one decode row per sequence per step
    step.clear();
    for (size_t i = 0; i < seqs.size(); ++i) {
      models::SeqStep q{std::span<const int32_t>(&seqs[i].out.back(), 1), &seqs[i].st, models::LogitsMode::kLast, last[i].data()};
      if (seqs[i].lora != nullptr) q.lora = *seqs[i].lora;
      step.push_back(q);
    }
    m.forward_batch(step);
    for (size_t i = 0; i < seqs.size(); ++i) seqs[i].out.push_back(argmax(last[i].data(), V));
  }
  for (Seq& s : seqs) {
    const std::vector<int32_t> want = s.golden->i32(s.key + "greedy_ids");
    EXPECT_EQ(std::vector<int32_t>(s.out.begin(), s.out.begin() + want.size()), want)
        << "prompt " << s.prompt << (s.golden == &with ? " with the adapter" : s.lora ? " at scale 0" : " without a lora field");
  }
  // A scale count other than the model's adapters is refused.
  models::State st = m.new_state();
  const std::vector<float> two = {1.0f, 1.0f};
  std::vector<float> logits(V);
  models::SeqStep q{seqs[0].ids, &st, models::LogitsMode::kLast, logits.data()};
  q.lora = two;
  EXPECT_THROW(m.forward_batch(std::span<const models::SeqStep>(&q, 1)), Error);
}

TEST_F(DemoAdapter, OneBatchRunsEachSequenceWithItsOwnAdapters) { batch_with_and_without(model_, fix_, false); }

// The same with the experts streamed at a zero budget: several sequences then run as two
// pipelined groups on two threads (DecoderModel::run_pipelined), each with its own rows' scales.
TEST_F(DemoAdapter, StreamedBatchRunsEachSequenceWithItsOwnAdapters) { batch_with_and_without(model_, fix_, true); }

// On CudaBackend: the demo's goldens with the adapter, and the per-sequence batch (row scales
// gathered with the experts' rows), resident and streamed (GPU tests).
TEST_F(DemoAdapter, CudaWithAdapterAndPerSequenceBatch) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device (or a build without CUDA): LoRA on CUDA not checked";
  {
    Loaded l = load(model_, {{fix_, 1.0f}}, false, /*cuda=*/true);
    check(*l.model, /*base=*/false);
  }
  batch_with_and_without(model_, fix_, false, /*cuda=*/true);
  batch_with_and_without(model_, fix_, true, /*cuda=*/true);
}

TEST_F(DemoAdapter, WithoutAdapterMatchesPeftsBase) {
  Loaded base = load(model_, {});
  check(*base.model, /*base=*/true);
  Loaded zero = load(model_, {{fix_, 0.0f}});
  check(*zero.model, /*base=*/true);
}

// ---- bad adapters ---------------------------------------------------------------------------

// A copy of the qwen3_moe attn_mlp adapter in a fresh directory, its config edited by `cfg` and
// its tensors by `tensors` (name -> f32 data and shape).
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};
std::string edited_adapter(const std::string& tag, const std::function<void(nlohmann::json&)>& cfg,
                           const std::function<void(std::map<std::string, Tensor>&)>& tensors) {
  const std::string src = data_dir() + "/lora/qwen3_moe/with_experts";
  const std::string dir = ::testing::TempDir() + "/lora_bad_" + tag;
  std::filesystem::create_directories(dir);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(src + "/adapter_config.json"));
  cfg(j);
  std::ofstream(dir + "/adapter_config.json") << j.dump(1);
  const io::SafetensorsFile f = io::SafetensorsFile::open(src + "/adapter_model.safetensors");
  std::map<std::string, Tensor> t;
  for (const io::TensorInfo& ti : f.tensors()) t[ti.name] = {ti.shape, spool::testing::tensor_f32(f, ti, ti.name)};
  tensors(t);
  std::vector<io::TensorToWrite> w;
  for (const auto& [name, x] : t) w.push_back({name, io::DType::F32, x.shape, x.data.data()});
  io::write_safetensors(dir + "/adapter_model.safetensors", w);
  return dir;
}

// The spool::Error message of loading `adapter` on the qwen3_moe fixture ("" when it loads).
std::string load_error(const std::string& adapter) {
  try {
    load(data_dir() + "/models/qwen3_moe", {{adapter, 1.0f}});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const auto kSameConfig = [](nlohmann::json&) {};
const auto kSameTensors = [](std::map<std::string, Tensor>&) {};
const std::string kQ = "base_model.model.model.layers.0.self_attn.q_proj.";

TEST(BadAdapter, EditedCopyStillLoads) {  // the helper itself changes nothing
  EXPECT_EQ(load_error(edited_adapter("same", kSameConfig, kSameTensors)), "");
}

TEST(BadAdapter, OtherPeftTypeIsNamed) {
  const std::string e = load_error(edited_adapter("ia3", [](nlohmann::json& j) { j["peft_type"] = "IA3"; }, kSameTensors));
  EXPECT_NE(e.find("peft_type IA3 is not supported"), std::string::npos) << e;
}

TEST(BadAdapter, DoraIsNamed) {
  const std::string e = load_error(edited_adapter("dora", [](nlohmann::json& j) { j["use_dora"] = true; }, kSameTensors));
  EXPECT_NE(e.find("DoRA"), std::string::npos) << e;
}

TEST(BadAdapter, MissingBIsNamed) {
  const std::string e =
      load_error(edited_adapter("missing", kSameConfig, [](std::map<std::string, Tensor>& t) { t.erase(kQ + "lora_B.weight"); }));
  EXPECT_NE(e.find("missing tensor '" + kQ + "lora_B.weight'"), std::string::npos) << e;
}

TEST(BadAdapter, DoraMagnitudeTensorIsNamed) {
  const std::string e = load_error(edited_adapter("magnitude", kSameConfig, [](std::map<std::string, Tensor>& t) {
    t[kQ + "lora_magnitude_vector"] = {{64}, std::vector<float>(64, 1.0f)};
  }));
  EXPECT_NE(e.find("DoRA magnitude vector"), std::string::npos) << e;
}

TEST(BadAdapter, ShapeMismatchIsNamed) {
  // q_proj's B with one output row too many: A and B agree, the model's [64, 64] does not.
  const std::string e = load_error(edited_adapter("shape", kSameConfig, [](std::map<std::string, Tensor>& t) {
    Tensor& b = t[kQ + "lora_B.weight"];
    b.shape[0] += 1;
    b.data.resize(b.data.size() + b.shape[1], 0.5f);
  }));
  EXPECT_NE(e.find("shape mismatch"), std::string::npos) << e;
  EXPECT_NE(e.find("q_proj"), std::string::npos) << e;
}

TEST(BadAdapter, RankDisagreeingWithConfigIsNamed) {
  const std::string e = load_error(edited_adapter("rank", [](nlohmann::json& j) { j["r"] = 8; }, kSameTensors));
  EXPECT_NE(e.find("shape mismatch: lora_A has rank 4, adapter_config.json gives r = 8"), std::string::npos) << e;
}

TEST(BadAdapter, ExpertWrapperOfNoFittingShapeIsNamed) {
  const std::string e = load_error(edited_adapter("experts", kSameConfig, [](std::map<std::string, Tensor>& t) {
    Tensor& a = t["base_model.model.model.layers.0.mlp.experts.lora_A.weight"];  // down_proj's A: in 32 -> 33
    a.shape[1] += 1;
    a.data.assign(a.shape[0] * a.shape[1], 0.5f);
  }));
  EXPECT_NE(e.find("fit neither experts.gate_up_proj"), std::string::npos) << e;
}

TEST(BadAdapter, TargetTheModelDoesNotHaveIsNamed) {
  const std::string e = load_error(edited_adapter("absent", kSameConfig, [](std::map<std::string, Tensor>& t) {
    t["base_model.model.model.layers.0.self_attn.nope_proj.lora_A.weight"] = {{4, 64}, std::vector<float>(256, 0.1f)};
    t["base_model.model.model.layers.0.self_attn.nope_proj.lora_B.weight"] = {{64, 4}, std::vector<float>(256, 0.1f)};
  }));
  EXPECT_NE(e.find("model.layers.0.self_attn.nope_proj"), std::string::npos) << e;
}

TEST(BadAdapter, MissingFilesAreNamed) {
  EXPECT_NE(load_error(::testing::TempDir() + "/no_such_adapter").find("no such LoRA adapter"), std::string::npos);
  const std::string bare = ::testing::TempDir() + "/lora_no_config";
  std::filesystem::create_directories(bare);
  EXPECT_NE(load_error(bare).find("no adapter_config.json"), std::string::npos);
  EXPECT_NE(load_error(::testing::TempDir() + "/adapter.gguf").find("no such LoRA adapter file"), std::string::npos);
}

// GGUF files that are not a LoRA for this model are refused by name (the base is qwen3_moe).
TEST(BadAdapter, GgufThatIsNotThisModelsLora) {
  EXPECT_NE(load_error(data_dir() + "/gguf/models/qwen3_moe.f32.gguf").find("not 'adapter'"), std::string::npos);
  EXPECT_NE(load_error(data_dir() + "/lora/qwen3_5_moe_text/attn_mlp.gguf").find("the adapter is for architecture 'qwen35moe'"),
            std::string::npos);
  EXPECT_EQ(load_error(data_dir() + "/lora/qwen3_moe/attn_mlp.gguf"), "");
}

// The fingerprint the server's disk snapshots carry: the same for the same adapters and scales,
// different for another adapter, another scale, or another order of two adapters.
TEST(LoraSetTest, FingerprintTellsAdaptersAndScalesApart) {
  const io::Checkpoint ck = models::open_checkpoint(data_dir() + "/models/qwen3_moe");
  const std::string a = data_dir() + "/lora/qwen3_moe/attn_mlp", b = data_dir() + "/lora/qwen3_moe/with_experts";
  auto fp = [&](const std::vector<std::pair<std::string, float>>& ads) {
    LoraSet s;
    for (const auto& [p, scale] : ads) s.add(load_adapter(p, ck, models::checkpoint_rules()), scale);
    return s.fingerprint();
  };
  EXPECT_EQ(fp({{a, 1.0f}}), fp({{a, 1.0f}}));
  EXPECT_NE(fp({{a, 1.0f}}), fp({{b, 1.0f}}));
  EXPECT_NE(fp({{a, 1.0f}}), fp({{a, 0.5f}}));
  EXPECT_NE(fp({{a, 1.0f}, {b, 0.5f}}), fp({{b, 0.5f}, {a, 1.0f}}));
}

// Per-request scales: adapters at scale 0 leave no trace (all 0: "", the base model's key; an
// adapter at 0 beside one at 1 keys like the one alone), and another scale is another key;
// names are unique ("-2" for a second adapter of one directory) and trailing slashes don't count.
TEST(LoraSetTest, FingerprintOfScalesSkipsAdaptersAtZeroAndNamesAreUnique) {
  const io::Checkpoint ck = models::open_checkpoint(data_dir() + "/models/qwen3_moe");
  const std::string a = data_dir() + "/lora/qwen3_moe/attn_mlp", b = data_dir() + "/lora/qwen3_moe/with_experts";
  LoraSet two, one;
  two.add(load_adapter(a + "/", ck, models::checkpoint_rules()), 1.0f);
  two.add(load_adapter(b, ck, models::checkpoint_rules()), 0.0f);
  two.add(load_adapter(a + "/adapter_model.safetensors", ck, models::checkpoint_rules()), 0.0f);
  one.add(load_adapter(a, ck, models::checkpoint_rules()), 1.0f);
  EXPECT_EQ(two.fingerprint({0, 0, 0}), "");
  EXPECT_EQ(two.fingerprint({1, 0, 0}), one.fingerprint({1}));
  EXPECT_EQ(two.fingerprint(), one.fingerprint());  // the defaults
  EXPECT_NE(two.fingerprint({0.5f, 0, 0}), one.fingerprint({1}));
  EXPECT_NE(two.fingerprint({1, 1, 0}), one.fingerprint({1}));
  EXPECT_NE(two.fingerprint({0, 0, 1}), one.fingerprint({1}));  // keyed by id too (conservative: never shares wrongly)
  EXPECT_THROW(two.fingerprint({1}), Error);
  ASSERT_EQ(two.size(), 3u);
  EXPECT_EQ(two.adapters()[0].name, "attn_mlp");
  EXPECT_EQ(two.adapters()[1].name, "with_experts");
  EXPECT_EQ(two.adapters()[2].name, "attn_mlp-2");
}

// PEFT's pattern rule: the first rank_pattern / alpha_pattern regex matching the key's end
// (.*\.)?(pattern)$ wins; rslora divides by sqrt(r).
TEST(PeftConfigTest, RankAndScalingFollowPatterns) {
  PeftConfig c = parse_peft_config(R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8,
      "rank_pattern": {".*\\.gate_up_proj": 8}, "alpha_pattern": {".*\\.gate_up_proj": 16, "q_proj": 2}})", "test");
  EXPECT_EQ(c.rank_and_scaling("model.layers.1.mlp.experts.gate_up_proj"), (std::pair<int64_t, float>{8, 2.0f}));
  EXPECT_EQ(c.rank_and_scaling("model.layers.1.mlp.experts.down_proj"), (std::pair<int64_t, float>{4, 2.0f}));
  EXPECT_EQ(c.rank_and_scaling("model.layers.0.self_attn.q_proj"), (std::pair<int64_t, float>{4, 0.5f}));
  EXPECT_EQ(c.rank_and_scaling("model.layers.0.self_attn.kq_proj"), (std::pair<int64_t, float>{4, 2.0f}));  // not a suffix match
  c.use_rslora = true;
  EXPECT_EQ(c.rank_and_scaling("model.layers.0.self_attn.k_proj"), (std::pair<int64_t, float>{4, 4.0f}));
}

}  // namespace
}  // namespace spool::lora
