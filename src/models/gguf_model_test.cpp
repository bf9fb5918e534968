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
#include <map>
#include <nlohmann/json.hpp>

#include "support/golden.h"
#include "support/ggml_random.h"
#include "support/gguf_writer.h"
#include "support/random.h"
#include "common/error.h"
#include "engine/loader.h"
#include "ops/ggml_q8.h"
#include "experts/streaming.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "ops/cpu_backend.h"
#include "ops/ggml_blocks.h"
#include "models/family.h"

namespace spool::models {
namespace {

using spool::testing::argmax;
using spool::testing::data_dir;

struct Loaded {
  std::shared_ptr<io::Checkpoint> ckpt;
  std::unique_ptr<ops::ThreadPool> pool;
  std::unique_ptr<Model> model;
};

// `int8_acts`: the CpuBackend's --act-bits option (ops::CpuOptions::int8_activations).
Loaded load(const std::string& path, bool int8_acts = false) {
  Loaded l;
  l.ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(path));
  l.pool = std::make_unique<ops::ThreadPool>(2);
  l.model = load_model(l.ckpt, std::make_shared<ops::CpuBackend>(l.pool.get(), ops::CpuOptions{.int8_activations = int8_acts}));
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
  std::printf("  max |diff| / max |ref| = %.3g\n", spool::testing::expect_max_rel_close(a, b, 1e-4));
}


// Writes `src` (one GGUF file) to `dst` as GGUF v3 with the same metadata, tensor names and order,
// every block-typed tensor replaced by its F32 dequantization (ops::ggml_dequantize_row; float
// tensors copied as they are): the model on the dequantized weights for block-quantized files.
// Tensors for which `drop_tensor` and keys for which `drop_key` return true are left out; `extra`
// then adds metadata and tensors (replacements of dropped ones) after the copied ones.
void write_dequantized_gguf(const std::string& src, const std::string& dst,
                            const std::function<bool(const std::string&)>& drop_tensor = nullptr,
                            const std::function<bool(const std::string&)>& drop_key = nullptr,
                            const std::function<void(testing::GgufWriter&)>& extra = nullptr) {
  const io::GgufFile g = io::GgufFile::open(src);
  testing::GgufWriter w;
  for (const auto& [key, v] : g.metadata())
    if (!drop_key || !drop_key(key)) w.add_value(key, v);
  for (const io::GgufTensor& t : g.tensors()) {
    if (drop_tensor && drop_tensor(t.name)) continue;
    const std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
    if (t.type == GgmlType::F32 || t.type == GgmlType::F16 || t.type == GgmlType::BF16) {
      w.add_tensor(t.name, ne, t.type, g.data(t), t.nbytes);
    } else {
      std::vector<float> f(static_cast<size_t>(t.numel()));
      ops::ggml_dequantize_row(t.type, g.data(t), t.numel(), f.data());
      w.add_tensor_f32(t.name, ne, f);
    }
  }
  if (extra) extra(w);
  w.write(dst);
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

// The fixture's F32 GGUF against the transformers golden of its checkpoint (golden.safetensors,
// tests/reference/make_fixtures*.py) with model_test's tolerance: every prompt row's logits within
// 1e-4 of that row's max |ref|, and the 12 greedy ids (EOS never picked, as generate made them).
TEST_P(GgufModel, F32FileMatchesTransformersGolden) {
  const std::string name = GetParam();
  Loaded g = load(data_dir() + "/gguf/models/" + name + ".f32.gguf");
  spool::testing::Golden gold(data_dir() + "/models/" + name + "/golden.safetensors");
  const std::vector<int32_t> ids = gold.i32("input_ids");
  const std::vector<float> ref = gold.f32("logits");
  const int64_t V = g.model->spec().vocab_size;
  ASSERT_EQ(ref.size(), ids.size() * V);
  State st = g.model->new_state();
  std::vector<float> got(ids.size() * V);
  g.model->forward(ids, st, LogitsMode::kAll, got.data());
  const double worst = spool::testing::expect_rows_close(got.data(), ref.data(), static_cast<int64_t>(ids.size()), V, 1e-4, name);
  std::printf("  %s: max rel error vs transformers %.3g\n", name.c_str(), worst);
  const std::vector<int32_t> want = gold.i32("greedy_ids");
  std::vector<float> logits(got.end() - V, got.end());
  std::vector<int32_t> out;
  for (size_t i = 0; i < want.size(); ++i) {
    const int32_t t = spool::testing::argmax_except(logits.data(), V, g.model->spec().eos_token_ids);
    out.push_back(t);
    if (i + 1 < want.size()) g.model->forward(std::span<const int32_t>(&t, 1), st, LogitsMode::kLast, logits.data());
  }
  EXPECT_EQ(out, want);
}

void expect_load_error(const std::string& path, const std::string& want);

// One tensor of write_gpt_oss_gguf: `shape` in PyTorch order of elements (GGUF ne is its
// reverse); F32 `data`, or, when `blocks` is not empty, MXFP4 blocks (17 bytes per 32 elements of
// a row).
struct F32Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
  std::vector<uint8_t> blocks;
};

// Writes the gpt_oss fixture (`dir`, F32 safetensors with float experts) as the F32 GGUF that
// llama.cpp's converter (class GptOssModel, arch gpt-oss) makes of it, the same file as
// tests/reference/gguf_models.py writes (made at test time: the de-interleaved, transposed experts
// do not compress beside the checkpoint in a pack). Transforms: post_attention_layernorm ->
// post_attention_norm, sinks -> attn_sinks.weight, router -> ffn_gate_inp (+ bias); experts
// gate_up_proj [E, H, 2I] transposed to [E, 2I, H] and split gate = even rows -> ffn_gate_exps,
// up = odd rows -> ffn_up_exps, the bias [E, 2I] likewise; down_proj [E, I, H] transposed to
// ffn_down_exps [E, H, I]; metadata as GptOssModel / TextModel write it (YaRN keys, sliding window).
// `extra` appends metadata entries.
void write_gpt_oss_gguf(const std::string& dir, const std::string& dst,
                        const std::function<void(testing::GgufWriter&)>& extra = nullptr) {
  const io::SafetensorsFile sf = io::SafetensorsFile::open(dir + "/model.safetensors");
  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  auto get = [&](const std::string& hf) {
    const io::TensorInfo* t = sf.find(hf);
    if (t == nullptr) throw std::runtime_error("fixture lacks " + hf);
    return F32Tensor{"", t->shape, testing::tensor_f32(sf, *t, hf)};
  };
  // MXFP4 experts (GptOssModel.repack_mxfp4): HF `*_blocks` [E, R, G, 16] (byte k: element 2k in
  // the low nibble, 2k + 1 in the high) and E8M0 `*_scales` [E, R, G] -> ggml block_mxfp4 per 32
  // elements {e, qs[16]} with qs[j] = element j | element j + 16 << 4; rows `first`, first + step, ...
  auto mxfp4 = [&](const std::string& base, int64_t first, int64_t step, std::string n) {
    const io::TensorInfo* b = sf.find(base + "_blocks");
    const io::TensorInfo* sc = sf.find(base + "_scales");
    if (b == nullptr || sc == nullptr || b->shape.size() != 4) throw std::runtime_error("fixture lacks MXFP4 " + base);
    const int64_t E = b->shape[0], R = b->shape[1], G = b->shape[2], rows = (R - first + step - 1) / step;
    const uint8_t* bd = sf.data(*b);
    const uint8_t* sd = sf.data(*sc);
    F32Tensor o{std::move(n), {E, rows, G * 32}, {}, std::vector<uint8_t>(static_cast<size_t>(E * rows * G * 17))};
    for (int64_t e = 0; e < E; ++e)
      for (int64_t k = 0; k < rows; ++k)
        for (int64_t gi = 0; gi < G; ++gi) {
          const int64_t r = first + k * step;
          const uint8_t* src = bd + ((e * R + r) * G + gi) * 16;
          uint8_t* dst = o.blocks.data() + ((e * rows + k) * G + gi) * 17;
          auto elem = [&](int i) { return (src[i / 2] >> (4 * (i % 2))) & 0xF; };
          dst[0] = sd[(e * R + r) * G + gi];
          for (int j = 0; j < 16; ++j) dst[1 + j] = static_cast<uint8_t>(elem(j) | (elem(j + 16) << 4));
        }
    return o;
  };
  auto named = [](F32Tensor t, std::string n) {
    t.name = std::move(n);
    return t;
  };
  // [E, R, C] -> [E, C, R], then rows `first`, first + step, ... of each expert.
  auto transpose_rows = [](const F32Tensor& t, int64_t first, int64_t step, std::string n) {
    const int64_t E = t.shape[0], R = t.shape[1], C = t.shape[2], rows = (C - first + step - 1) / step;
    F32Tensor o{std::move(n), {E, rows, R}, std::vector<float>(static_cast<size_t>(E * rows * R))};
    for (int64_t e = 0; e < E; ++e)
      for (int64_t k = 0; k < rows; ++k)
        for (int64_t r = 0; r < R; ++r) o.data[(e * rows + k) * R + r] = t.data[(e * R + r) * C + first + k * step];
    return o;
  };
  auto cols = [](const F32Tensor& t, int64_t first, std::string n) {  // [E, 2I] -> columns first, first + 2, ...
    const int64_t E = t.shape[0], C = t.shape[1];
    F32Tensor o{std::move(n), {E, C / 2}, std::vector<float>(static_cast<size_t>(E * C / 2))};
    for (int64_t e = 0; e < E; ++e)
      for (int64_t k = 0; k < C / 2; ++k) o.data[e * C / 2 + k] = t.data[e * C + first + 2 * k];
    return o;
  };
  std::vector<F32Tensor> ts;
  ts.push_back(named(get("model.embed_tokens.weight"), "token_embd.weight"));
  ts.push_back(named(get("model.norm.weight"), "output_norm.weight"));
  ts.push_back(named(get("lm_head.weight"), "output.weight"));
  const int L = cfg["num_hidden_layers"];
  for (int b = 0; b < L; ++b) {
    const std::string p = "model.layers." + std::to_string(b) + ".", q = "blk." + std::to_string(b) + ".";
    ts.push_back(named(get(p + "input_layernorm.weight"), q + "attn_norm.weight"));
    ts.push_back(named(get(p + "post_attention_layernorm.weight"), q + "post_attention_norm.weight"));
    for (auto [g, h] : {std::pair{"attn_q", "q_proj"}, {"attn_k", "k_proj"}, {"attn_v", "v_proj"}, {"attn_output", "o_proj"}}) {
      ts.push_back(named(get(p + "self_attn." + h + ".weight"), q + g + ".weight"));
      ts.push_back(named(get(p + "self_attn." + h + ".bias"), q + g + ".bias"));
    }
    ts.push_back(named(get(p + "self_attn.sinks"), q + "attn_sinks.weight"));
    ts.push_back(named(get(p + "mlp.router.weight"), q + "ffn_gate_inp.weight"));
    ts.push_back(named(get(p + "mlp.router.bias"), q + "ffn_gate_inp.bias"));
    const F32Tensor gub = get(p + "mlp.experts.gate_up_proj_bias");
    const bool mx = sf.find(p + "mlp.experts.gate_up_proj_blocks") != nullptr;
    const F32Tensor gu = mx ? F32Tensor{} : get(p + "mlp.experts.gate_up_proj");
    ts.push_back(mx ? mxfp4(p + "mlp.experts.gate_up_proj", 0, 2, q + "ffn_gate_exps.weight")
                    : transpose_rows(gu, 0, 2, q + "ffn_gate_exps.weight"));
    ts.push_back(cols(gub, 0, q + "ffn_gate_exps.bias"));
    ts.push_back(mx ? mxfp4(p + "mlp.experts.gate_up_proj", 1, 2, q + "ffn_up_exps.weight")
                    : transpose_rows(gu, 1, 2, q + "ffn_up_exps.weight"));
    ts.push_back(cols(gub, 1, q + "ffn_up_exps.bias"));
    ts.push_back(mx ? mxfp4(p + "mlp.experts.down_proj", 0, 1, q + "ffn_down_exps.weight")
                    : transpose_rows(get(p + "mlp.experts.down_proj"), 0, 1, q + "ffn_down_exps.weight"));
    ts.push_back(named(get(p + "mlp.experts.down_proj_bias"), q + "ffn_down_exps.bias"));
  }
  const nlohmann::json& rope = cfg["rope_parameters"];
  const std::string a = "gpt-oss.";
  testing::GgufWriter w;
  auto u32 = [&w](const std::string& k, const nlohmann::json& v) { w.add_u32(k, v.get<uint32_t>()); };
  auto f32 = [&w](const std::string& k, const nlohmann::json& v) { w.add_f32(k, static_cast<float>(v.get<double>())); };
  w.add_string("general.architecture", "gpt-oss");
  u32(a + "context_length", cfg["max_position_embeddings"]);
  u32(a + "embedding_length", cfg["hidden_size"]);
  u32(a + "block_count", L);
  u32(a + "feed_forward_length", cfg["intermediate_size"]);
  u32(a + "attention.head_count", cfg["num_attention_heads"]);
  u32(a + "attention.head_count_kv", cfg["num_key_value_heads"]);
  u32(a + "attention.key_length", cfg["head_dim"]);
  u32(a + "attention.value_length", cfg["head_dim"]);
  f32(a + "rope.freq_base", rope["rope_theta"]);
  f32(a + "attention.layer_norm_rms_epsilon", cfg["rms_norm_eps"]);
  u32(a + "expert_count", cfg["num_local_experts"]);
  u32(a + "expert_used_count", cfg["num_experts_per_tok"]);
  u32(a + "attention.sliding_window", cfg["sliding_window"]);
  u32(a + "expert_feed_forward_length", cfg["intermediate_size"]);
  w.add_string(a + "rope.scaling.type", "yarn");
  f32(a + "rope.scaling.factor", rope["factor"]);
  u32(a + "rope.scaling.original_context_length", rope["original_max_position_embeddings"]);
  f32(a + "rope.scaling.yarn_beta_fast", rope["beta_fast"]);
  f32(a + "rope.scaling.yarn_beta_slow", rope["beta_slow"]);
  if (extra) extra(w);
  for (const F32Tensor& t : ts) {
    const std::vector<int64_t> ne(t.shape.rbegin(), t.shape.rend());
    if (t.blocks.empty()) w.add_tensor_f32(t.name, ne, t.data);
    else w.add_tensor(t.name, ne, GgmlType::MXFP4, t.blocks.data(), t.blocks.size());
  }
  w.write(dst);
}

// gpt-oss (arch "gpt-oss"): gate / up split out of the interleaved gate_up and their biases,
// sinks, router with bias, sliding-window layers and YaRN keys, against the safetensors model
// (float experts, [E, in, out] in the checkpoint). The GGUF is written at test time.
void expect_gpt_oss_gguf_equals_safetensors(const std::string& name) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / ("spool_" + name + ".gguf")).string();
  write_gpt_oss_gguf(data_dir() + "/models/" + name, path);
  Loaded ref = load(data_dir() + "/models/" + name);
  Loaded g = load(path);
  EXPECT_EQ(g.model->spec().model_type, "gpt_oss");
  EXPECT_EQ(g.model->spec().attn.window_layers, ref.model->spec().attn.window_layers);
  std::vector<int32_t> ids_ref, ids;
  const std::vector<float> want = run(*ref.model, &ids_ref);
  const std::vector<float> got = run(*g.model, &ids);
  expect_rel_close(got, want);
  EXPECT_EQ(ids, ids_ref);
  if (std::getenv("SPOOL_KEEP_GPT_OSS_GGUF") == nullptr) std::filesystem::remove(path);
}

TEST(GgufGptOss, F32FileEqualsSafetensorsModel) { expect_gpt_oss_gguf_equals_safetensors("gpt_oss"); }

// The released layout: MXFP4 experts (ffn_*_exps as ggml MXFP4, the gate / up rows of the
// blocks split and re-interleaved whole) against the safetensors model reading the HF MXFP4
// blocks natively; BF16 matrices widened to F32 in the GGUF.
TEST(GgufGptOss, Mxfp4FileEqualsSafetensorsModel) { expect_gpt_oss_gguf_equals_safetensors("gpt_oss_mxfp4"); }

// The re-interleaved gate_up experts (converted into memory) stream from that memory as the
// resident ones read it: bit for bit.
TEST(GgufGptOss, StreamingEqualsResidentBitForBit) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / "spool_gpt_oss_stream.gguf").string();
  write_gpt_oss_gguf(data_dir() + "/models/gpt_oss_mxfp4", path);
  Loaded q = load(path);
  std::vector<int32_t> ids_res, ids_str;
  const std::vector<float> resident = run(*q.model, &ids_res);
  const auto& sp = q.model->spec();
  experts::StreamingOptions o;
  o.top_k = sp.moe.top_k;
  o.cache_budget_bytes = 0;  // every expert read when used
  auto s = std::make_shared<experts::StreamingExperts>(q.ckpt, std::vector<bool>(sp.n_layers, true), sp.moe.n_experts, sp.hidden_size,
                                                       sp.moe.intermediate, o);
  q.model->set_expert_provider(s);
  const std::vector<float> streamed = run(*q.model, &ids_str);
  ASSERT_EQ(streamed.size(), resident.size());
  EXPECT_EQ(0, std::memcmp(streamed.data(), resident.data(), resident.size() * sizeof(float)));
  EXPECT_EQ(ids_str, ids_res);
  std::filesystem::remove(path);
}

// attention.sliding_window_pattern as a period n (layer l slides iff l % n < n - 1, llama.cpp's
// set_swa_pattern; 0: every layer) or as a per-layer bool array sets the windowed layers.
TEST(GgufGptOss, SlidingWindowPatternKey) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / "spool_gpt_oss_swa.gguf").string();
  const std::string key = "gpt-oss.attention.sliding_window_pattern";
  using Add = std::function<void(testing::GgufWriter&)>;
  const std::pair<Add, std::vector<bool>> cases[] = {
      {[&](testing::GgufWriter& w) { w.add_u32(key, 3); }, {true, true, false, true}},
      {[&](testing::GgufWriter& w) { w.add_u32(key, 0); }, {true, true, true, true}},
      {[&](testing::GgufWriter& w) { w.add_bools(key, {false, true, true, false}); }, {false, true, true, false}}};
  for (const auto& [add, want] : cases) {
    write_gpt_oss_gguf(data_dir() + "/models/gpt_oss", path, add);
    Loaded g = load(path);
    EXPECT_EQ(g.model->spec().attn.window_layers, want);
  }
  std::filesystem::remove(path);
}

// An ffn_gate_exps without its ffn_up_exps sibling (weight or bias) is named.
TEST(GgufGptOss, GateWithoutUpNamesTheSibling) {
  const std::string src = (std::filesystem::path(::testing::TempDir()) / "spool_gpt_oss_src.gguf").string();
  const std::string path = (std::filesystem::path(::testing::TempDir()) / "spool_gpt_oss_no_up.gguf").string();
  write_gpt_oss_gguf(data_dir() + "/models/gpt_oss", src);
  for (const char* missing : {"blk.2.ffn_up_exps.weight", "blk.1.ffn_up_exps.bias"}) {
    write_dequantized_gguf(src, path, [&](const std::string& n) { return n == missing; });
    expect_load_error(path, missing);
  }
  std::filesystem::remove(src);
  std::filesystem::remove(path);
}

std::string q_file(const std::string& name) { return data_dir() + "/gguf/models/" + name + ".q.gguf"; }

// The block-typed file `q_path` and `deq_path` (the same file with the block tensors
// dequantized) give the same logits and greedy ids.
void expect_quantized_equals_dequantized(const std::string& q_path, const std::string& deq_path) {
  Loaded deq = load(deq_path);
  Loaded q = load(q_path);
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
  write_dequantized_gguf(q_file(name), deq);
  expect_quantized_equals_dequantized(q_file(name), deq);
  std::filesystem::remove(deq);
}

// gguf-py's dequantization (NAME.deq.gguf, gguf_models.py) for the families the repository
// stores it for.
class GgufModelPyDeq : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufModelPyDeq, QuantizedFileEqualsGgufPyDequantizedModel) {
  const std::string name = GetParam();
  expect_quantized_equals_dequantized(q_file(name), data_dir() + "/gguf/models/" + name + ".deq.gguf");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufModelPyDeq, ::testing::Values("qwen3_moe", "qwen3_next", "qwen3_5_moe_text"));

// The model of `q_path` with every expert streamed from the file gives the resident model's
// logits bit for bit and its greedy ids.
void expect_streaming_equals_resident(const std::string& q_path, bool int8_acts = false) {
  Loaded q = load(q_path, int8_acts);
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

TEST_P(GgufModel, StreamingEqualsResidentBitForBit) { expect_streaming_equals_resident(q_file(GetParam())); }

INSTANTIATE_TEST_SUITE_P(Fixtures, GgufModel, ::testing::Values("qwen3_moe", "qwen3_next", "qwen3_5_moe_text", "olmoe", "mixtral",
                                                                   "glm4_moe", "minimax_m2", "deepseek_v2_lite", "deepseek_v3",
                                                                   "gemma4_text_moe"));

// The qwen3_moe fixture file's architecture made wider (hidden 256, head_dim 64, dense FFN 1280,
// expert FFN 768; its other keys, layer pattern and vocabulary of 512), written to `dst` with
// every matrix in a 256-column block type (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS in turn, random
// valid blocks of weight rms 0.05: tests/support/ggml_random.h), norms and routers F32. The
// 64-wide fixtures cannot hold those types, so this is where they run inside a model: merged
// expert tensors, embedding rows, the output head, prefill and decode shapes (down projections of
// 768 and 1280 columns: the prefill panel of ggml_blocks.cpp, with a partial 1024-column segment).
void write_wide_kquant_gguf(const std::string& dst,
                            std::vector<GgmlType> types = {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                                                           GgmlType::Q6_K, GgmlType::IQ4_XS}) {
  const io::GgufFile fx = io::GgufFile::open(q_file("qwen3_moe"));
  constexpr int64_t H = 256, D = 64, NH = 4, NKV = 2, FF = 1280, EFF = 768, E = 8, V = 512;
  const std::map<std::string, uint32_t> dims = {{"qwen3moe.embedding_length", H},
                                                {"qwen3moe.feed_forward_length", FF},
                                                {"qwen3moe.attention.key_length", D},
                                                {"qwen3moe.attention.value_length", D},
                                                {"qwen3moe.expert_feed_forward_length", EFF}};
  testing::GgufWriter w;
  for (const auto& [key, v] : fx.metadata()) {
    const auto it = dims.find(key);
    if (it != dims.end())
      w.add_u32(key, it->second);
    else
      w.add_value(key, v);
  }
  ASSERT_EQ(fx.metadata().at("qwen3moe.expert_count").to_int("qwen3moe.expert_count"), E);
  int next = 0;
  uint64_t seed = 1;
  const auto ends = [](const std::string& n, const std::string& suffix) {
    return n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (const io::GgufTensor& t : fx.tensors()) {
    const std::string& n = t.name;
    std::vector<int64_t> ne;  // ggml order: columns first
    bool matrix = true;
    if (n == "token_embd.weight" || n == "output.weight") ne = {H, V};
    else if (ends(n, "attn_q.weight")) ne = {H, NH * D};
    else if (ends(n, "attn_k.weight") || ends(n, "attn_v.weight")) ne = {H, NKV * D};
    else if (ends(n, "attn_output.weight")) ne = {NH * D, H};
    else if (ends(n, "ffn_gate.weight") || ends(n, "ffn_up.weight")) ne = {H, FF};
    else if (ends(n, "ffn_down.weight")) ne = {FF, H};
    else if (ends(n, "ffn_gate_exps.weight") || ends(n, "ffn_up_exps.weight")) ne = {H, EFF, E};
    else if (ends(n, "ffn_down_exps.weight")) ne = {EFF, H, E};
    else if (ends(n, "ffn_gate_inp.weight")) ne = {H, E}, matrix = false;
    else if (ends(n, "q_norm.weight") || ends(n, "k_norm.weight")) ne = {D}, matrix = false;
    else if (ends(n, "norm.weight")) ne = {H}, matrix = false;
    else FAIL() << "no wide shape for the fixture's tensor " << n;
    int64_t numel = 1;
    for (int64_t d : ne) numel *= d;
    if (matrix) {
      const GgmlType type = types[next++ % types.size()];
      const std::vector<uint8_t> b = testing::random_ggml_blocks(type, numel / ne[0], ne[0], seed++, 0.05);
      w.add_tensor(n, ne, type, b.data(), b.size());
    } else {
      std::vector<float> f = testing::randn(static_cast<size_t>(numel), seed++, 0.1f);
      if (ends(n, "norm.weight"))
        for (float& x : f) x += 1.0f;
      w.add_tensor_f32(n, ne, f);
    }
  }
  EXPECT_GE(next, 2 * static_cast<int>(types.size()));  // every type at least twice
  w.write(dst);
}

TEST(GgufKQuantModel, WideModelEqualsDequantizedModelAndStreams) {
  const std::filesystem::path dir = ::testing::TempDir();
  const std::string q = (dir / "spool_wide_kquant.gguf").string(), deq = (dir / "spool_wide_kquant.deq.gguf").string();
  ASSERT_NO_FATAL_FAILURE(write_wide_kquant_gguf(q));
  write_dequantized_gguf(q, deq);
  expect_quantized_equals_dequantized(q, deq);
  expect_streaming_equals_resident(q);
  std::filesystem::remove(q);
  std::filesystem::remove(deq);
}

// The wide model with every matrix in an i-quant or ternary type (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS,
// IQ2_S, IQ3_XXS, IQ3_S, TQ1_0, TQ2_0 in turn: random valid blocks, ops/ggml_iquants): loads,
// generates the logits and greedy ids of the same model dequantized to F32, and its streamed
// experts (byte ranges read from the file) give the resident logits bit for bit.
TEST(GgufKQuantModel, WideIquantModelEqualsDequantizedModelAndStreams) {
  const std::filesystem::path dir = ::testing::TempDir();
  const std::string q = (dir / "spool_wide_iquant.gguf").string(), deq = (dir / "spool_wide_iquant.deq.gguf").string();
  ASSERT_NO_FATAL_FAILURE(write_wide_kquant_gguf(q, {GgmlType::IQ1_S, GgmlType::IQ1_M, GgmlType::IQ2_XXS, GgmlType::IQ2_XS,
                                                     GgmlType::IQ2_S, GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::TQ1_0,
                                                     GgmlType::TQ2_0}));
  write_dequantized_gguf(q, deq);
  expect_quantized_equals_dequantized(q, deq);
  expect_streaming_equals_resident(q);
  std::filesystem::remove(q);
  std::filesystem::remove(deq);
}

// --act-bits 8 inside a model: the wide model in Q4_K / Q6_K (the types with int8 kernels). Where
// the CPU has the kernels it takes the int8 path (its logits differ from the f32 kernels' on the
// same file), stays within the activation rounding of the dequantized model, picks the same greedy
// ids and streams bit for bit as it runs resident; elsewhere the switch changes no bit.
TEST(GgufKQuantModel, WideModelWithInt8Activations) {
  const std::filesystem::path dir = ::testing::TempDir();
  const std::string q = (dir / "spool_wide_q4q6.gguf").string(), deq = (dir / "spool_wide_q4q6.deq.gguf").string();
  struct Reset {  // the files removed on every way out
    std::string q, deq;
    ~Reset() {
      std::filesystem::remove(q);
      std::filesystem::remove(deq);
    }
  } reset{q, deq};
  ASSERT_NO_FATAL_FAILURE(write_wide_kquant_gguf(q, {GgmlType::Q4_K, GgmlType::Q6_K}));
  write_dequantized_gguf(q, deq);
  std::vector<int32_t> ids_ref, ids_f32, ids;
  const std::vector<float> want = run(*load(deq).model, &ids_ref);
  const std::vector<float> f32 = run(*load(q).model, &ids_f32);
  ASSERT_EQ(ids_f32, ids_ref);
  const std::vector<float> got = run(*load(q, /*int8_acts=*/true).model, &ids);
  ASSERT_EQ(got.size(), want.size());
  if (!ops::q8_fast()) {  // no int8 kernels on this CPU / build: the switch changes nothing
    EXPECT_EQ(0, std::memcmp(got.data(), f32.data(), got.size() * sizeof(float))) << ops::q8_variant();
    return;
  }
  double md = 0, mb = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << i;
    md = std::max(md, std::fabs(static_cast<double>(got[i]) - want[i]));
    mb = std::max(mb, std::fabs(static_cast<double>(want[i])));
  }
  std::printf("  int8 activations: max |diff| / max |ref| = %.3g\n", md / mb);
  EXPECT_NE(0, std::memcmp(got.data(), f32.data(), got.size() * sizeof(float))) << "the int8 kernels did not run";
  // Each activation moves by up to 1/254 of its block's max (d / 2 = amax / 254): ~0.7% rms per
  // product for Gaussian activations (amax ~ 3 rms), through ~20 products per token of this random
  // model. Measured: 2.0e-2 of the largest logit (the f32 kernels: < 1e-6). The kernel tests hold
  // the exact per-product bound; this checks the wiring at model scale.
  EXPECT_LE(md, 5e-2 * mb) << "max abs diff " << md << ", max |ref| " << mb;
  EXPECT_EQ(ids, ids_ref);
  expect_streaming_equals_resident(q, /*int8_acts=*/true);
}

// --act-bits auto (the default): the engine's loader gives the CPU backend of a GGUF file with
// Q4_K / Q6_K weights int8 activations where the CPU has the kernels, and f32 ones under an explicit
// --act-bits 32; a file without such weights loaded beside it (a --kl-reference) gets its own
// backend's option and leaves the first model's as it is (no process-wide state).
TEST(GgufKQuantModel, DefaultActivationsFollowTheFile) {
  const std::string q = (std::filesystem::path(::testing::TempDir()) / "spool_wide_q4q6_auto.gguf").string();
  struct Reset {
    std::string q;
    ~Reset() { std::filesystem::remove(q); }
  } reset{q};
  ASSERT_NO_FATAL_FAILURE(write_wide_kquant_gguf(q, {GgmlType::Q4_K, GgmlType::Q6_K}));
  auto backend_int8 = [](const engine::LoadedModel& l) {
    return dynamic_cast<const ops::CpuBackend&>(l.model->backend()).options().int8_activations;
  };
  engine::LoadOptions kq, other;
  kq.model_dir = q;
  other.model_dir = q_file("qwen3_moe");  // Q8_0 / Q4_0 / Q5_1 / MXFP4: no int8 kernels
  {
    const engine::LoadedModel l = engine::load(kq);
    EXPECT_EQ(l.int8_activations, ops::q8_auto()) << ops::q8_variant();
    EXPECT_EQ(backend_int8(l), ops::q8_auto());
    const engine::LoadedModel r = engine::load(other);  // loaded beside it
    EXPECT_FALSE(r.int8_activations);
    EXPECT_FALSE(backend_int8(r));
    EXPECT_EQ(backend_int8(l), ops::q8_auto()) << "the second load changed the first model's activations";
  }
  kq.act_bits = 32;
  {
    const engine::LoadedModel l = engine::load(kq);
    EXPECT_FALSE(l.int8_activations);
    EXPECT_FALSE(backend_int8(l));
  }
  // an explicit --act-bits 8 reaches the backend of any model; only K-quant weights read it
  other.act_bits = 8;
  {
    const engine::LoadedModel r = engine::load(other);
    EXPECT_FALSE(r.int8_activations);
    EXPECT_TRUE(backend_int8(r));
  }
}

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

// ---- gemma4 (llama.cpp's Gemma4Model) --------------------------------------------------------
std::string gemma4_f32() { return data_dir() + "/gguf/models/gemma4_text_moe.f32.gguf"; }
std::string temp_gguf(const std::string& name) { return (std::filesystem::path(::testing::TempDir()) / name).string(); }

// The metadata -> config.json hook: per-kind head sizes and RoPE, layer kinds from the sliding
// window pattern, K = V from the full layer's missing attn_v; and the full layer's inverse
// frequencies from rope_freqs.weight equal the safetensors model's (rope_parameters).
TEST(GgufGemma4, ConfigAndRopeFromMetadata) {
  const io::Checkpoint ck = models::open_checkpoint(gemma4_f32(), {.map = false});
  const nlohmann::json& j = ck.raw_config().json();
  EXPECT_EQ(j["model_type"], "gemma4_text");
  EXPECT_EQ(j["head_dim"], 16);
  EXPECT_EQ(j["global_head_dim"], 512);
  EXPECT_EQ(j["num_key_value_heads"], 2);
  EXPECT_FALSE(j.contains("num_global_key_value_heads"));
  EXPECT_EQ(j["attention_k_eq_v"], true);
  EXPECT_EQ(j["enable_moe_block"], true);
  EXPECT_EQ(j["layer_types"], nlohmann::json({"sliding_attention", "sliding_attention", "sliding_attention", "full_attention"}));
  EXPECT_EQ(j["sliding_window"], 8);
  EXPECT_EQ(j["final_logit_softcapping"], 30.0);
  EXPECT_EQ(j["rope_parameters"]["sliding_attention"]["rope_theta"], 10000.0);
  EXPECT_EQ(j["rope_parameters"]["full_attention"]["rope_theta"], 1000000.0);
  EXPECT_EQ(j["top_k_experts"], 2);
  EXPECT_EQ(j["moe_intermediate_size"], 32);
  Loaded g = load(gemma4_f32()), ref = load(data_dir() + "/models/gemma4_text_moe");
  EXPECT_EQ(g.model->spec().attn_of(3).inv_freq, ref.model->spec().attn_of(3).inv_freq);
  EXPECT_EQ(std::count(g.model->spec().attn_of(3).inv_freq.begin(), g.model->spec().attn_of(3).inv_freq.end(), 0.0f), 256 - 64);
}

// attention.head_count_kv as a per-layer array (what the converter writes when the full layers'
// KV heads are given): the same model when the values agree; a different count on the K = V full
// layer is its num_global_key_value_heads.
TEST(GgufGemma4, PerLayerKvHeadArray) {
  const std::string same = temp_gguf("spool_gemma4_kv_array.gguf"), global1 = temp_gguf("spool_gemma4_kv_global.gguf");
  const auto drop = [](const std::string& k) { return k == "gemma4.attention.head_count_kv"; };
  write_dequantized_gguf(gemma4_f32(), same, nullptr, drop,
                         [](testing::GgufWriter& w) { w.add_u32s("gemma4.attention.head_count_kv", {2, 2, 2, 2}); });
  write_dequantized_gguf(gemma4_f32(), global1, nullptr, drop,
                         [](testing::GgufWriter& w) { w.add_u32s("gemma4.attention.head_count_kv", {2, 2, 2, 1}); });
  Loaded a = load(gemma4_f32()), b = load(same);
  std::vector<int32_t> ia, ib;
  EXPECT_EQ(run(*a.model, &ia), run(*b.model, &ib));
  EXPECT_EQ(ia, ib);
  const io::Checkpoint ck = models::open_checkpoint(global1, {.map = false});
  EXPECT_EQ(ck.raw_config().json()["num_global_key_value_heads"], 1);
  EXPECT_EQ(ck.raw_config().json()["num_key_value_heads"], 2);
  std::filesystem::remove(same);
  std::filesystem::remove(global1);
}

TEST(GgufModelErrors, Gemma4RopeFreqsOtherThanProportionalAreNamed) {
  // freq factors other than the converter's 1 / 1e30 pattern (a frequency-scaled RoPE) are named.
  const std::string path = temp_gguf("spool_gemma4_rope_freqs.gguf");
  write_dequantized_gguf(gemma4_f32(), path, [](const std::string& n) { return n == "rope_freqs.weight"; }, nullptr,
                         [](testing::GgufWriter& w) {
                           std::vector<float> ff(256, 1e30f);
                           std::fill(ff.begin(), ff.begin() + 64, 1.0f);
                           ff[10] = 2.0f;
                           w.add_tensor_f32("rope_freqs.weight", {256}, ff);
                         });
  expect_load_error(path, "rope_freqs.weight[10] is 2");
  std::filesystem::remove(path);
}

TEST(GgufModelErrors, Gemma4DenseIsRejectedByName) {
  // Without routers and experts the file is a dense Gemma 4, which spool does not run.
  const std::string path = temp_gguf("spool_gemma4_dense.gguf");
  write_dequantized_gguf(gemma4_f32(), path, [](const std::string& n) {
    return n.find("ffn_gate_inp") != std::string::npos || n.find("_exps") != std::string::npos ||
           n.find("ffn_norm_2") != std::string::npos || n.find("ffw_norm_") != std::string::npos;
  });
  expect_load_error(path, "dense Gemma 4");
  std::filesystem::remove(path);
}

TEST(GgufModelErrors, Gemma4SlidingLayerWithoutVIsNamed) {
  // Only the full layers may share K as V (attention_k_eq_v); a sliding layer without attn_v is named.
  const std::string path = temp_gguf("spool_gemma4_no_v.gguf");
  write_dequantized_gguf(gemma4_f32(), path, [](const std::string& n) { return n == "blk.1.attn_v.weight"; });
  expect_load_error(path, "sliding layer 1 has no blk.1.attn_v.weight");
  std::filesystem::remove(path);
}

TEST(GgufModelErrors, UnsupportedTypeNamesTensorAndType) {
  // A GGUF whose tensor has a type spool cannot run: the error names both.
  try {
    models::open_checkpoint(data_dir() + "/gguf/blocks.gguf");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("architecture"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace spool::models
