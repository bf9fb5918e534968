// GGUF checkpoints end to end: the fixture models written as GGUF by
// tests/reference/gguf_models.py (llama.cpp's converter transforms, merged experts) give the
// safetensors model's logits (F32 files), the dequantized-weights model's logits (block-quantized
// files), the same greedy ids, and streamed experts equal resident ones bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "../../tests/support/golden.h"
#include "common/error.h"
#include "experts/streaming.h"
#include "models/model.h"

namespace spool::models {
namespace {

using spool::testing::argmax;
using spool::testing::data_dir;

struct Loaded {
  std::shared_ptr<io::Checkpoint> ckpt;
  std::unique_ptr<ops::ThreadPool> pool;
  std::unique_ptr<Model> model;
};

Loaded load(const std::string& path) {
  Loaded l;
  l.ckpt = std::make_shared<io::Checkpoint>(io::Checkpoint::open(path));
  l.pool = std::make_unique<ops::ThreadPool>(2);
  l.model = load_model(l.ckpt, l.pool.get());
  return l;
}

const std::vector<int32_t> kPrompt = {1, 17, 300, 42, 5, 99, 256, 7, 311, 64, 2, 480};

// Logits of every prompt position (prefill in chunks of 5), then 6 greedy decode steps; the
// greedy ids go to *ids.
std::vector<float> run(Model& m, std::vector<int32_t>* ids) {
  const int64_t V = m.spec().vocab_size;
  State st = m.new_state();
  std::vector<float> out(kPrompt.size() * V);
  for (size_t i = 0; i < kPrompt.size(); i += 5) {
    const size_t n = std::min<size_t>(5, kPrompt.size() - i);
    m.forward(std::span<const int32_t>(kPrompt.data() + i, n), st, LogitsMode::kAll, out.data() + i * V);
  }
  std::vector<float> logits(out.end() - V, out.end());
  for (int d = 0; d < 6; ++d) {
    const int32_t t = argmax(logits.data(), V);
    ids->push_back(t);
    m.forward(std::span<const int32_t>(&t, 1), st, LogitsMode::kLast, logits.data());
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

// max |a - b| <= 1e-4 * max |b|.
void expect_rel_close(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  double md = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(a[i])) << "element " << i;
    md = std::max(md, std::fabs(static_cast<double>(a[i]) - b[i]));
    mb = std::max(mb, std::fabs(static_cast<double>(b[i])));
  }
  EXPECT_LE(md, 1e-4 * mb) << "max abs diff " << md << ", max |ref| " << mb;
}

class GgufModel : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufModel, F32FileEqualsSafetensorsModel) {
  const std::string name = GetParam();
  Loaded ref = load(data_dir() + "/models/" + name);
  Loaded g = load(data_dir() + "/gguf/models/" + name + ".f32.gguf");
  EXPECT_EQ(g.model->spec().model_type, ref.model->spec().model_type);
  std::vector<int32_t> ids_ref, ids;
  const std::vector<float> want = run(*ref.model, &ids_ref);
  const std::vector<float> got = run(*g.model, &ids);
  expect_rel_close(got, want);
  EXPECT_EQ(ids, ids_ref);
}

TEST_P(GgufModel, QuantizedFileEqualsDequantizedModel) {
  const std::string name = GetParam();
  Loaded deq = load(data_dir() + "/gguf/models/" + name + ".deq.gguf");
  Loaded q = load(data_dir() + "/gguf/models/" + name + ".q.gguf");
  bool any_ggml = false;
  for (const auto& t : q.ckpt->tensors()) any_ggml = any_ggml || t.ggml;
  EXPECT_TRUE(any_ggml) << "the quantized file's matrices must stay in their block types";
  std::vector<int32_t> ids_ref, ids;
  const std::vector<float> want = run(*deq.model, &ids_ref);
  const std::vector<float> got = run(*q.model, &ids);
  expect_rel_close(got, want);
  EXPECT_EQ(ids, ids_ref);
}

TEST_P(GgufModel, StreamingEqualsResidentBitForBit) {
  const std::string name = GetParam();
  Loaded q = load(data_dir() + "/gguf/models/" + name + ".q.gguf");
  std::vector<int32_t> ids_res, ids_str;
  const std::vector<float> resident = run(*q.model, &ids_res);
  const auto& sp = q.model->spec();
  std::vector<bool> moe;
  for (auto f : sp.ffns) moe.push_back(f == FfnKind::kMoE);
  experts::StreamingOptions o;
  o.top_k = sp.moe.top_k;
  o.cache_budget_bytes = 0;  // every expert read from the file when used
  auto s = std::make_shared<experts::StreamingExperts>(q.ckpt, moe, sp.moe.n_experts, sp.hidden_size, sp.moe.intermediate, o);
  q.model->set_expert_provider(s);
  const std::vector<float> streamed = run(*q.model, &ids_str);
  ASSERT_EQ(streamed.size(), resident.size());
  EXPECT_EQ(0, std::memcmp(streamed.data(), resident.data(), resident.size() * sizeof(float)));
  EXPECT_EQ(ids_str, ids_res);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufModel, ::testing::Values("qwen3_moe", "qwen3_next", "qwen3_5_moe_text"));

TEST(GgufModelErrors, UnsupportedTypeNamesTensorAndType) {
  // A GGUF whose tensor has a type spool cannot run: the error names both.
  try {
    io::Checkpoint::open(data_dir() + "/gguf/blocks.gguf");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("architecture"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace spool::models
