// GGUF checkpoints end to end: the fixture models written as GGUF by
// tests/reference/gguf_models.py (llama.cpp's converter transforms, merged experts) give the
// safetensors model's logits (F32 files), the dequantized-weights model's logits (block-quantized
// files: against the NAME.deq.gguf gguf-py wrote where the repository has one, and for every family
// against a copy of NAME.q.gguf that this test writes with each block tensor dequantized to F32),
// the same greedy ids, and streamed experts equal resident ones bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <functional>

#include "../../tests/support/golden.h"
#include "common/error.h"
#include "experts/streaming.h"
#include "io/gguf.h"
#include "models/model.h"
#include "ops/ggml_blocks.h"

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
  std::printf("  max |diff| / max |ref| = %.3g\n", mb > 0 ? md / mb : md);
}


// Writes `src` (one GGUF file) to `dst` as GGUF v3 with the same metadata, tensor names and order,
// every block-typed tensor replaced by its F32 dequantization (ops::ggml_dequantize_row; float
// tensors copied as they are): the model on the dequantized weights for block-quantized files.
// Tensors for which `drop_tensor` and keys for which `drop_key` return true are left out.
void write_dequantized_gguf(const std::string& src, const std::string& dst,
                            const std::function<bool(const std::string&)>& drop_tensor = nullptr,
                            const std::function<bool(const std::string&)>& drop_key = nullptr) {
  const io::GgufFile g = io::GgufFile::open(src);
  std::vector<const io::GgufTensor*> tensors;
  for (const io::GgufTensor& t : g.tensors())
    if (!drop_tensor || !drop_tensor(t.name)) tensors.push_back(&t);
  std::vector<std::pair<std::string, const io::GgufValue*>> kvs;
  for (const auto& [key, v] : g.metadata())
    if (!drop_key || !drop_key(key)) kvs.emplace_back(key, &v);
  std::string out = "GGUF";
  auto put = [&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  auto u32 = [&put](uint32_t v) { put(&v, 4); };
  auto u64 = [&put](uint64_t v) { put(&v, 8); };
  auto str = [&](const std::string& v) {
    u64(v.size());
    put(v.data(), v.size());
  };
  auto scalar_size = [](io::GgufType t) -> size_t {
    switch (t) {
      case io::GgufType::kUint8: case io::GgufType::kInt8: case io::GgufType::kBool: return 1;
      case io::GgufType::kUint16: case io::GgufType::kInt16: return 2;
      case io::GgufType::kUint32: case io::GgufType::kInt32: case io::GgufType::kFloat32: return 4;
      default: return 8;
    }
  };
  u32(3);
  u64(tensors.size());
  u64(kvs.size());
  uint64_t alignment = 32;
  for (const auto& [key, vp] : kvs) {
    const io::GgufValue& v = *vp;
    if (key == "general.alignment") alignment = static_cast<uint64_t>(v.to_int(key));
    str(key);
    u32(static_cast<uint32_t>(v.type));
    if (v.type == io::GgufType::kString) {
      str(v.str);
    } else if (v.is_array()) {
      u32(static_cast<uint32_t>(v.elem));
      u64(v.count);
      if (v.elem == io::GgufType::kString)
        for (const std::string& x : v.strs) str(x);
      else
        put(v.raw.data(), v.raw.size());
    } else {
      put(&v.bits, scalar_size(v.type));
    }
  }
  std::vector<std::vector<uint8_t>> blobs;
  uint64_t at = 0;
  for (const io::GgufTensor* tp : tensors) {
    const io::GgufTensor& t = *tp;
    const bool is_float = t.type == GgmlType::F32 || t.type == GgmlType::F16 || t.type == GgmlType::BF16;
    std::vector<uint8_t> b;
    if (is_float) {
      b.assign(g.data(t), g.data(t) + t.nbytes);
    } else {
      b.resize(static_cast<size_t>(t.numel()) * 4);
      ops::ggml_dequantize_row(t.type, g.data(t), t.numel(), reinterpret_cast<float*>(b.data()));
    }
    str(t.name);
    u32(t.n_dims);
    for (uint32_t d = 0; d < t.n_dims; ++d) u64(static_cast<uint64_t>(t.ne[d]));
    u32(static_cast<uint32_t>(is_float ? t.type : GgmlType::F32));
    at = (at + alignment - 1) / alignment * alignment;
    u64(at);
    at += b.size();
    blobs.push_back(std::move(b));
  }
  uint64_t rel = 0;
  out.resize((out.size() + alignment - 1) / alignment * alignment, '\0');
  for (const auto& b : blobs) {
    const uint64_t pad = (rel + alignment - 1) / alignment * alignment - rel;
    out.append(pad, '\0');
    rel += pad;
    put(b.data(), b.size());
    rel += b.size();
  }
  std::ofstream f(dst, std::ios::binary | std::ios::trunc);
  f.write(out.data(), static_cast<std::streamsize>(out.size()));
  ASSERT_TRUE(f.good()) << "cannot write " << dst;
}

class GgufModel : public ::testing::TestWithParam<std::string> {};

// The fixture checkpoint `name` and its F32 GGUF give the same logits and greedy ids.
void expect_f32_file_equals_safetensors(const std::string& name) {
  Loaded ref = load(data_dir() + "/models/" + name);
  Loaded g = load(data_dir() + "/gguf/models/" + name + ".f32.gguf");
  EXPECT_EQ(g.model->spec().model_type, ref.model->spec().model_type);
  std::vector<int32_t> ids_ref, ids;
  const std::vector<float> want = run(*ref.model, &ids_ref);
  const std::vector<float> got = run(*g.model, &ids);
  expect_rel_close(got, want);
  EXPECT_EQ(ids, ids_ref);
}

TEST_P(GgufModel, F32FileEqualsSafetensorsModel) { expect_f32_file_equals_safetensors(GetParam()); }

// gpt-oss (arch "gpt-oss"): gate / up split out of the interleaved gate_up and their biases,
// sinks, router with bias, sliding-window layers and YaRN keys, against the safetensors model
// (float experts, [E, in, out] in the checkpoint). No block-typed file in the repository.
TEST(GgufGptOss, F32FileEqualsSafetensorsModel) { expect_f32_file_equals_safetensors("gpt_oss"); }

// The block-typed file and `deq_path` (the same file with the block tensors dequantized) give
// the same logits and greedy ids.
void expect_quantized_equals_dequantized(const std::string& name, const std::string& deq_path) {
  Loaded deq = load(deq_path);
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

TEST_P(GgufModel, QuantizedFileEqualsDequantizedModel) {
  const std::string name = GetParam();
  const std::string deq = (std::filesystem::path(::testing::TempDir()) / ("spool_" + name + ".deq.gguf")).string();
  write_dequantized_gguf(data_dir() + "/gguf/models/" + name + ".q.gguf", deq);
  expect_quantized_equals_dequantized(name, deq);
  std::filesystem::remove(deq);
}

// gguf-py's dequantization (NAME.deq.gguf, gguf_models.py) for the families the repository
// stores it for.
class GgufModelPyDeq : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufModelPyDeq, QuantizedFileEqualsGgufPyDequantizedModel) {
  const std::string name = GetParam();
  expect_quantized_equals_dequantized(name, data_dir() + "/gguf/models/" + name + ".deq.gguf");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufModelPyDeq, ::testing::Values("qwen3_moe", "qwen3_next", "qwen3_5_moe_text"));

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

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufModel, ::testing::Values("qwen3_moe", "qwen3_next", "qwen3_5_moe_text", "olmoe", "mixtral",
                                                                   "glm4_moe", "minimax_m2", "deepseek_v2_lite", "deepseek_v3"));

// Loading `path` throws spool::Error whose message contains `want`.
void expect_load_error(const std::string& path, const std::string& want) {
  try {
    load(path);
    FAIL() << "expected an error containing '" << want << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(GgufModelErrors, DenseLlamaIsRejectedByName) {
  // The Mixtral file without its routers and experts is a dense Llama, which spool does not run.
  const std::string path = (std::filesystem::path(::testing::TempDir()) / "spool_dense_llama.gguf").string();
  write_dequantized_gguf(data_dir() + "/gguf/models/mixtral.f32.gguf", path,
                         [](const std::string& n) { return n.find("ffn_gate_inp") != std::string::npos || n.find("_exps") != std::string::npos; },
                         [](const std::string& k) { return k.starts_with("llama.expert_"); });
  expect_load_error(path, "dense Llama");
  std::filesystem::remove(path);
}

TEST(GgufModelErrors, SplitKvBNeedsBothHalves) {
  // A deepseek2 file with attn_k_b but no attn_v_b in a layer names the missing tensor.
  const std::string path = (std::filesystem::path(::testing::TempDir()) / "spool_no_v_b.gguf").string();
  write_dequantized_gguf(data_dir() + "/gguf/models/deepseek_v3.f32.gguf", path,
                         [](const std::string& n) { return n == "blk.1.attn_v_b.weight"; });
  expect_load_error(path, "blk.1.attn_v_b.weight");
  std::filesystem::remove(path);
}

TEST(GgufModelErrors, Glm4MoeDenseLayerCountMustMatchRouters) {
  // leading_dense_block_count disagreeing with the routers present is named.
  const std::string path = (std::filesystem::path(::testing::TempDir()) / "spool_glm_dense.gguf").string();
  write_dequantized_gguf(data_dir() + "/gguf/models/glm4_moe.f32.gguf", path, nullptr,
                         [](const std::string& k) { return k == "glm4moe.leading_dense_block_count"; });
  expect_load_error(path, "leading_dense_block_count");
  std::filesystem::remove(path);
}

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
