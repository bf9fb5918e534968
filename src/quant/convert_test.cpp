// spool convert end to end: the quantized checkpoint loads and runs, and it computes exactly
// what a float model made of its dequantized weights computes (so the format, the loader and
// the kernels agree with the quantizer); streaming quantized experts is bit-identical to
// keeping them resident; the size on disk follows the recipe's bits per weight; corrupt
// quantized files are rejected clearly.
#include "quant/convert.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/golden.h"
#include "common/error.h"
#include "engine/loader.h"
#include "ops/quant_q8.h"
#include "experts/weight_views.h"
#include "io/safetensors.h"
#include "models/family.h"
#include "plan/footprint.h"
#include "quant/hadamard.h"
#include "quant/quantize.h"

namespace spool::quant {
namespace {

namespace fs = std::filesystem;
using spool::testing::data_dir;
using spool::testing::expect_rows_close;

std::string fixture(const std::string& name) {
  return name == "demo" ? std::string(SPOOL_DEFAULT_MODEL_DIR) : data_dir() + "/models/" + name;
}

/// The scratch directory of `tag` (as scratch() names it), left as it is.
std::string scratch_path(const std::string& tag) { return ::testing::TempDir() + "/convert_" + tag; }

/// The scratch directory of `tag`, emptied.
std::string scratch(const std::string& tag) {
  const std::string d = scratch_path(tag);
  fs::remove_all(d);
  return d;
}

/// `embed_bits`: RecipeOverrides::embed_bits (--embed-bits) when set.
ConvertResult run_convert(const std::string& in, const std::string& out, const std::string& recipe_name, bool rotate = true,
                          uint64_t shard_bytes = 4ull << 30, std::optional<std::string> embed_bits = {}) {
  ConvertOptions o;
  o.in_dir = in;
  o.out_dir = out;
  o.rules = &models::checkpoint_rules();
  static std::map<int, std::vector<double>> shares;  // (outlives convert())
  if (recipe_name.rfind("bpw", 0) == 0 || recipe_name.rfind("cbpw", 0) == 0) {  // "bpwX": --target-bpw X, allocated per matrix
    const bool cal = recipe_name[0] == 'c';
    o.target_bpw = std::stod(recipe_name.substr(cal ? 4 : 3));
    o.expert_usage = 0.25;
    if (cal) {  // "cbpwX": per-expert shares as a calibration would give them, rising with the expert id
      const models::ModelSpec sp = models::build_spec(models::open_checkpoint(in, {.map = false}));
      shares.clear();
      for (int l = 0; l < sp.n_layers; ++l) {
        if (sp.ffns[l] != models::FfnKind::kMoE) continue;
        std::vector<double>& v = shares[l];
        double sum = 0;
        for (int e = 0; e < sp.moe.n_experts; ++e) sum += (e + 1.0) * (e + 1.0) * (e + 1.0);
        for (int e = 0; e < sp.moe.n_experts; ++e) v.push_back((e + 1.0) * (e + 1.0) * (e + 1.0) / sum);
      }
      o.expert_shares = &shares;
    }
  } else {
    o.recipe = recipe(recipe_name);
  }
  if (embed_bits) apply_overrides(&o.recipe, RecipeOverrides{.embed_bits = embed_bits});
  o.rotate = rotate;
  o.threads = 2;
  o.shard_bytes = shard_bytes;
  // As spool convert: the family's bf16 keep-list (DeepSeek keeps kv_b_proj).
  const models::Family* f = models::family_named(models::build_spec(models::open_checkpoint(in, {.map = false})).family);
  if (f != nullptr) o.keep_float = f->keep_float;
  return convert(o, nullptr);
}

/// Writes `out` = the quantized checkpoint `q` with every quantized matrix replaced by its f32
/// dequantization (original basis) and every other tensor copied: the float model the
/// quantized one must compute exactly.
void write_dequantized(const std::string& src_dir, const std::string& q, const std::string& out) {
  io::Checkpoint ck = models::open_checkpoint(q);
  io::Checkpoint src = models::open_checkpoint(src_dir, {.map = false});
  std::vector<std::vector<uint8_t>> keep;
  std::vector<io::TensorToWrite> tensors;
  for (const auto& t : ck.tensors()) {
    const std::string& n = t.name;
    auto ends = [&](const char* s) { return n.size() > std::strlen(s) && n.compare(n.size() - std::strlen(s), std::strlen(s), s) == 0; };
    if (ends(".scales") || ends(".codebook") || ends(".signs")) continue;
    if (!ends(".qweight")) {
      keep.emplace_back(t.data, t.data + t.nbytes);
      tensors.push_back({"model." + n, t.dtype, t.shape, keep.back().data()});
      continue;
    }
    const std::string base = n.substr(0, n.size() - 8);
    const io::TensorRef& sc = ck.tensor(base + ".scales");
    const io::TensorRef* cb = ck.find(base + ".codebook");  // none for q8 (its fixed grid)
    const io::TensorRef* sg = nullptr;
    if (t.expert_layer >= 0) sg = ck.find(io::expert_signs_name(t.expert_layer, t.expert_proj));
    else sg = ck.find(base + ".signs");
    // The matrix shape is the source tensor's.
    const io::TensorRef& orig = t.expert_layer >= 0 ? src.expert(t.expert_layer, t.expert_id, t.expert_proj)
                                                    : src.tensor(base + ".weight");
    const int64_t rows = orig.shape[0], cols = orig.shape[1];
    ops::WeightView v = experts::quant_view_of(t, sc, cb, sg, rows, cols, n);
    std::vector<float> w(static_cast<size_t>(rows * cols));
    dequantize(v.quant, w.data());
    keep.emplace_back(reinterpret_cast<uint8_t*>(w.data()), reinterpret_cast<uint8_t*>(w.data() + w.size()));
    tensors.push_back({"model." + base + ".weight", io::DType::F32, {rows, cols}, keep.back().data()});
  }
  fs::create_directories(out);
  io::write_safetensors(out + "/model.safetensors", tensors);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(q + "/config.json"));
  cfg.erase("quantization");
  std::ofstream(out + "/config.json") << cfg.dump(2);
}

engine::LoadedModel load(const std::string& dir, std::optional<bool> stream = false, const std::string& budget = "auto") {
  engine::LoadOptions o;
  o.model_dir = dir;
  o.threads = 2;
  o.stream = stream;
  o.cache_budget = budget;
  o.page_cache = true;
  o.act_bits = 32;  // f32 activations: these tests check the quantized kernels against the dequantized model at 1e-4
  return engine::load(o);
}

std::vector<int32_t> prompt_ids(int64_t vocab, int n) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 7919 + 13) % vocab));
  return ids;
}

/// Logits of every position of `ids` [T, V], prefilled in chunks of 5.
std::vector<float> all_logits(models::Model& m, const std::vector<int32_t>& ids) {
  const int64_t V = m.spec().vocab_size;
  models::State st = m.new_state();
  std::vector<float> out(ids.size() * V);
  for (size_t i = 0; i < ids.size(); i += 5) {
    const size_t n = std::min<size_t>(5, ids.size() - i);
    m.forward(std::span<const int32_t>(ids.data() + i, n), st, models::LogitsMode::kAll, out.data() + i * V);
  }
  return out;
}

struct Case {
  std::string model, recipe;
  bool rotate;
};

// Readable parameter in test listings (gtest would hex-dump the struct otherwise).
void PrintTo(const Case& c, std::ostream* os) { *os << c.model << "/" << c.recipe << (c.rotate ? "" : "/norot"); }

class ConvertEquivalence : public ::testing::TestWithParam<Case> {};

// The quantized engine equals a float engine running the dequantized weights (1e-4, the f32
// golden tolerance), so every quantized tensor is where the loader expects it, in the basis
// the kernels assume; and streaming the quantized experts gives bit-identical logits.
void check_equivalence(const std::string& src, const std::string& recipe_name, bool rotate, const std::string& tag,
                       std::optional<std::string> embed_bits = {}) {
  const std::string q = scratch(tag), f = scratch(tag + "_deq");
  ConvertResult r = run_convert(src, q, recipe_name, rotate, /*shard_bytes=*/1 << 20, embed_bits);
  // gpt-oss MXFP4 experts stay MXFP4 (copied as stored); every other source is quantized.
  const bool mxfp4 = models::open_checkpoint(src, {.map = false}).expert_part(0, 0, io::ExpertProj::kDown, io::ExpertPart::kMxBlocks) != nullptr;
  if (!mxfp4) {
    EXPECT_GT(r.classes["expert_gate_up"].params, 0);
  }
  EXPECT_GT(r.classes["dense"].params, 0);
  // With rotation every quantized matrix has its sign vector (the loader refuses otherwise).
  io::Checkpoint qck = models::open_checkpoint(q, {.map = false});
  int64_t qweights = 0, signs = 0;
  for (const auto& t : qck.tensors()) {
    qweights += t.name.ends_with(".qweight") && t.expert_layer < 0;
    signs += t.name.ends_with(".signs") && t.name.find(".experts.") == std::string::npos;
  }
  EXPECT_EQ(signs, rotate ? qweights : 0) << tag;
  write_dequantized(src, q, f);

  engine::LoadedModel lq = load(q), lf = load(f);
  if (mxfp4) {  // every expert's blocks and scales are the source's bytes
    ASSERT_FALSE(lq.ckpt->experts_quantized());
    ASSERT_NE(lq.ckpt->expert_part(0, 0, io::ExpertProj::kGate, io::ExpertPart::kMxBlocks), nullptr);
    io::Checkpoint sck = models::open_checkpoint(src);
    int64_t compared = 0;
    for (const auto& t : lq.ckpt->tensors()) {
      if (t.expert_layer < 0) continue;
      const io::TensorRef* o = sck.expert_part(t.expert_layer, t.expert_id, t.expert_proj, t.expert_part);
      ASSERT_NE(o, nullptr) << t.name;
      ASSERT_EQ(t.nbytes, o->nbytes) << t.name;
      EXPECT_EQ(0, std::memcmp(t.data, o->data, t.nbytes)) << t.name;
      ++compared;
    }
    EXPECT_EQ(compared, 4 * 8 * 4);  // layers x experts x (gate_up, down) x (blocks, scales)
  } else {
    ASSERT_TRUE(lq.ckpt->experts_quantized());
  }
  const int64_t V = lq.model->spec().vocab_size;
  const std::vector<int32_t> ids = prompt_ids(V, 12);
  const std::vector<float> got = all_logits(*lq.model, ids), want = all_logits(*lf.model, ids);
  expect_rows_close(got.data(), want.data(), static_cast<int64_t>(ids.size()), V, 1e-4, tag);

  engine::LoadedModel ls = load(q, /*stream=*/true, "0.0001");
  ASSERT_NE(ls.streaming, nullptr);
  const std::vector<float> streamed = all_logits(*ls.model, ids);
  EXPECT_EQ(0, std::memcmp(streamed.data(), got.data(), got.size() * sizeof(float))) << tag << ": streaming differs";
  EXPECT_GT(ls.streaming->stats().misses, 0u);
}

TEST_P(ConvertEquivalence, QuantizedEqualsDequantizedFloatModel) {
  const Case& c = GetParam();
  check_equivalence(fixture(c.model), c.recipe, c.rotate, c.model + "_" + c.recipe + (c.rotate ? "" : "_norot"));
}

// tie_word_embeddings with a separate lm_head tensor: the quantized lm_head is used, not the
// embedding.
TEST(Convert, TiedConfigWithLmHeadTensor) {
  const std::string src = scratch("tied_src");
  fs::copy(fixture("qwen3_moe"), src, fs::copy_options::recursive);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src + "/config.json"));
  cfg["tie_word_embeddings"] = true;
  std::ofstream(src + "/config.json") << cfg.dump(2);
  check_equivalence(src, "q4", true, "tied");
}

// --embed-bits: the embedding table quantized like any matrix (rotated or not). The lookup
// dequantizes one row per token (read with pread: lm_head is its own tensor) and equals the
// float model made of the dequantized table (check_equivalence: the dequantized reference
// writes embed_tokens.weight from the codes); streaming is unaffected; the footprint counts
// the codes and scales as the table read on demand.
TEST(Convert, QuantizedEmbedding) {
  for (bool rotate : {true, false}) {
    const std::string tag = rotate ? "qembed" : "qembed_norot";
    check_equivalence(fixture("qwen3_moe"), "q4", rotate, tag, "4");
    const std::string q = scratch(tag + "_probe");
    ConvertResult r = run_convert(fixture("qwen3_moe"), q, "q4", rotate, 4ull << 30, "3");
    io::Checkpoint ck = models::open_checkpoint(q);
    EXPECT_EQ(ck.find("embed_tokens.weight"), nullptr);
    const io::TensorRef* qw = ck.find("embed_tokens.qweight");
    ASSERT_NE(qw, nullptr);
    EXPECT_EQ(ck.find("embed_tokens.signs") != nullptr, rotate);
    EXPECT_EQ(ck.tensor("embed_tokens.codebook").shape, std::vector<int64_t>{8});
    EXPECT_EQ(r.classes["embed_tokens"].tensors, 1);
    nlohmann::json cfg = nlohmann::json::parse(std::ifstream(q + "/config.json"));
    EXPECT_EQ(cfg["quantization"]["classes"]["embed_tokens"]["bits"], 3);
    EXPECT_EQ(cfg["quantization"]["classes"]["embed_tokens"]["group_size"], 64);
    EXPECT_FALSE(cfg["quantization"]["classes"]["lm_head"].contains("tied_to"));
    const plan::WeightBytes w = plan::weight_bytes(ck, models::build_spec(ck));
    EXPECT_EQ(w.embed_on_demand, qw->nbytes + ck.tensor("embed_tokens.scales").nbytes);
  }
}

// Tied embeddings (no lm_head tensor): the quantized table is also the output projection
// (quant_matmul over it), and config.json says so.
TEST(Convert, QuantizedTiedEmbedding) {
  check_equivalence(fixture("ernie4_5_moe"), "q4", true, "qembed_tied", "4");
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(scratch_path("qembed_tied") + "/config.json"));
  const nlohmann::json& head = cfg["quantization"]["classes"]["lm_head"];
  EXPECT_EQ(head["bits"], 4) << head.dump();
  EXPECT_EQ(head["group_size"], 64) << head.dump();
  EXPECT_EQ(head["tied_to"], "embed_tokens") << head.dump();
  // The bf16 table keeps the earlier description.
  const std::string q = scratch("qembed_tied_bf16");
  run_convert(fixture("ernie4_5_moe"), q, "q4");
  cfg = nlohmann::json::parse(std::ifstream(q + "/config.json"));
  EXPECT_EQ(cfg["quantization"]["classes"]["lm_head"], nlohmann::json({{"bits", "bf16"}, {"tied_to", "embed_tokens"}}));
  EXPECT_FALSE(cfg["quantization"]["classes"].contains("embed_tokens"));
}

// Gemma 4 scales the looked-up rows by sqrt(H) (embedding_scale) and ties the head to the
// unscaled table: both still hold with a quantized table.
TEST(Convert, QuantizedEmbeddingWithEmbeddingScale) {
  check_equivalence(fixture("gemma4_text_moe"), "q4", true, "qembed_gemma4", "4");
}

// --act-bits 8 (and auto on x86) on spool q4 / q8 (ops/quant_q8.h): the demo's q4 (and, in q4-hi8, q8)
// matrices with 256 input columns (attention, DeltaNet, expert gate/up, lm_head) take int8 activations. Its next-token
// distributions stay within a small KL of the f32 ones, streaming equals resident bit for bit, and
// --act-bits 32 keeps the exact kernels.
class Int8Activations : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Recipes, Int8Activations, ::testing::Values("q4", "q4-hi8"),
                         [](const auto& i) { return i.param == "q4" ? std::string("q4") : std::string("q4_hi8"); });

TEST_P(Int8Activations, DemoWithinTenPercentOfItsKl) {
  const std::string q = scratch("int8_" + GetParam());
  run_convert(fixture("demo"), q, GetParam());
  const auto load_bits = [&](int bits, bool stream) {
    engine::LoadOptions o;
    o.model_dir = q;
    o.threads = 2;
    o.stream = stream;
    o.cache_budget = stream ? "0.0001" : "auto";
    o.page_cache = true;
    o.act_bits = bits;
    return engine::load(o);
  };
  engine::LoadedModel l8 = load_bits(8, false), l32 = load_bits(32, false), lauto = load_bits(0, false), ls = load_bits(8, true);
  if (!ops::quant_q8_fast()) {  // no int8 kernels for spool q4 on this CPU: f32 everywhere
    EXPECT_FALSE(l8.int8_activations);
    EXPECT_FALSE(lauto.int8_activations);
    return;
  }
  EXPECT_TRUE(l8.int8_activations);
  EXPECT_EQ(lauto.int8_activations, ops::quant_q8_auto());  // (aarch64: --act-bits 8 only, not measured there yet)
  EXPECT_FALSE(l32.int8_activations);
  const int64_t V = l8.model->spec().vocab_size;
  const std::vector<int32_t> ids = prompt_ids(V, 40);
  const std::vector<float> a = all_logits(*l8.model, ids), f = all_logits(*l32.model, ids), au = all_logits(*lauto.model, ids),
                           st = all_logits(*ls.model, ids);
  const std::vector<float>& auto_wants = lauto.int8_activations ? a : f;
  EXPECT_EQ(0, std::memcmp(auto_wants.data(), au.data(), a.size() * sizeof(float))) << "auto is --act-bits 8 or 32 here";
  EXPECT_EQ(0, std::memcmp(a.data(), st.data(), a.size() * sizeof(float))) << "streaming differs";
  EXPECT_NE(0, std::memcmp(a.data(), f.data(), a.size() * sizeof(float))) << "int8 activations changed nothing";
  // Mean KL(unquantized || q4) over the positions, with f32 and with int8 activations: the int8
  // rounding (activations per 8 columns, the codebook per matrix) adds little to q4's own error.
  engine::LoadedModel lo = load(fixture("demo"));
  const std::vector<float> o = all_logits(*lo.model, ids);
  const auto mean_kl = [&](const std::vector<float>& m) {
    double sum = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const float* p = o.data() + t * V;
      const float* r = m.data() + t * V;
      double mp = p[0], mr = r[0];
      for (int64_t v = 1; v < V; ++v) mp = std::max<double>(mp, p[v]), mr = std::max<double>(mr, r[v]);
      double zp = 0, zr = 0;
      for (int64_t v = 0; v < V; ++v) zp += std::exp(p[v] - mp), zr += std::exp(r[v] - mr);
      for (int64_t v = 0; v < V; ++v) {
        const double lp = p[v] - mp - std::log(zp), lr = r[v] - mr - std::log(zr);
        sum += std::exp(lp) * (lp - lr);
      }
    }
    return sum / static_cast<double>(ids.size());
  };
  const double kl_f32 = mean_kl(f), kl_int8 = mean_kl(a);
  std::printf("demo %s, %zu positions: mean KL to the unquantized model %.4f (f32 activations), %.4f (int8)\n", GetParam().c_str(),
              ids.size(), kl_f32, kl_int8);
  EXPECT_LT(kl_int8, 1.1 * kl_f32) << "int8 activations add more than 10% to q4's KL";
}


INSTANTIATE_TEST_SUITE_P(Fixtures, ConvertEquivalence,
                         ::testing::Values(Case{"qwen3_moe", "q4", true}, Case{"qwen3_next", "tq3a-tqTe-down3", true},
                                           Case{"qwen3_5_moe_text", "tq3", true}, Case{"qwen3_5_moe_vl_fused", "q2", false},
                                           Case{"qwen3_5_moe_vl", "tq3a-tqTe", true}, Case{"demo", "tq3a-tqTe-down4", true},
                                           Case{"mixtral", "q4", true}, Case{"olmoe", "q4", true}, Case{"deepseek_v3", "q4", true},
                                           Case{"deepseek_v3_kimi", "q4", true}, Case{"deepseek_v2_lite", "q4", true},
                                           Case{"glm4_moe", "q4", true}, Case{"glm4_moe_lite", "q4", true}, Case{"minimax_m2", "q4", true},
                                           Case{"gpt_oss", "q4", true}, Case{"gpt_oss_mxfp4", "q4", true},
                                           Case{"ernie4_5_moe", "q4", true},
                                           // q5 / q6 / q8 (issue 31): dense and experts, streamed too.
                                           Case{"qwen3_moe", "q4-hi8-down6", true}, Case{"qwen3_next", "q5-hi8", true},
                                           Case{"qwen3_5_moe_text", "q6", true}, Case{"olmoe", "q8", false},
                                           // --target-bpw: formats mixed per matrix and per expert layer.
                                           Case{"qwen3_5_moe_text", "bpw3.9", true}, Case{"deepseek_v3", "bpw5.5", true},
                                           // --calibration: formats mixed between the experts of a layer.
                                           Case{"qwen3_5_moe_text", "cbpw3.5", true}, Case{"mixtral", "cbpw4.5", true}),
                         [](const auto& i) {
                           std::string s = i.param.model + "_" + i.param.recipe + (i.param.rotate ? "" : "_norot");
                           for (char& ch : s) if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

// Bits per weight of a class, computed from the format's definition, independently of the
// converter: b bits per code (ternary: 8/5 per code in whole bytes per group), 16 per group
// scale.
double class_bits(const char* bits, int g) {
  const std::string b = bits;
  if (b == "ternary") return 8.0 * ((g + 4) / 5) / g + 16.0 / g;
  return std::stod(b) + 16.0 / g;
}

TEST(Convert, SizeOnDiskFollowsTheRecipe) {
  const std::string q = scratch("size");
  ConvertResult r = run_convert(fixture("demo"), q, "tq3a-tqTe-down4");
  io::Checkpoint src = models::open_checkpoint(fixture("demo"), {.mtp = true});  // the MTP head is converted too
  // Expected: per source tensor, its class's bits per weight (codebooks and signs are
  // per-tensor constants, < 0.1% here); bf16 for kept tensors.
  double bits = 0;
  for (const auto& t : src.tensors()) {
    const TensorClass c = classify(t.name, t.shape);
    const int64_t cols = t.shape.size() == 2 ? t.shape[1] : 0;
    switch (c) {
      case TensorClass::kKeep:
      case TensorClass::kEmbed: bits += 16.0 * t.numel(); break;  // (bf16 in every named recipe)
      case TensorClass::kDense:
      case TensorClass::kLmHead: bits += class_bits("3", 64) * t.numel(); break;
      case TensorClass::kExpertGateUp: bits += class_bits("ternary", 64) * t.numel(); break;
      case TensorClass::kExpertDown: bits += class_bits("4", std::min<int64_t>(64, cols)) * t.numel(); break;
    }
  }
  uint64_t files = 0, headers = 0;
  for (const auto& e : fs::directory_iterator(q))
    if (e.path().extension() == ".safetensors") {
      io::SafetensorsFile f = io::SafetensorsFile::open(e.path().string(), false);
      files += f.file_size();
      headers += f.data_start();
    }
  const double data = static_cast<double>(files - headers);
  EXPECT_NEAR(data, bits / 8, 0.01 * bits / 8) << "data " << data << " expected " << bits / 8;
  EXPECT_EQ(static_cast<uint64_t>(data), r.data_bytes);
  EXPECT_EQ(files, r.file_bytes);
  // The quantization block describes the recipe.
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(q + "/config.json"));
  EXPECT_EQ(cfg["quantization"]["quant_method"], "spool");
  EXPECT_EQ(cfg["quantization"]["recipe"], "tq3a-tqTe-down4");
  EXPECT_EQ(cfg["quantization"]["classes"]["expert_gate_up"]["bits"], "ternary");
  EXPECT_EQ(cfg["quantization"]["classes"]["expert_down"]["bits"], 4);
  EXPECT_TRUE(fs::exists(q + "/tokenizer.json"));
  EXPECT_TRUE(fs::exists(q + "/generation_config.json"));
}

TEST(Convert, ExpertIsOneContiguousRange) {
  const std::string q = scratch("contig");
  run_convert(fixture("qwen3_moe"), q, "tq3a-tqTe-down3");
  io::Checkpoint ck = models::open_checkpoint(q);
  for (const auto& t : ck.tensors()) {
    if (t.expert_layer < 0 || t.expert_proj != io::ExpertProj::kGate || t.expert_part != io::ExpertPart::kQWeight) continue;
    std::vector<const io::TensorRef*> parts = ck.expert_tensors(t.expert_layer, t.expert_id);
    ASSERT_EQ(parts.size(), 9u);
    std::sort(parts.begin(), parts.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < parts.size(); ++i) {
      EXPECT_EQ(parts[i]->shard, parts[0]->shard);
      EXPECT_EQ(parts[i]->offset, parts[i - 1]->offset + parts[i - 1]->nbytes) << parts[i]->name;
    }
  }
}

TEST(Convert, RejectsBadInputAndOutput) {
  const std::string q = scratch("bad");
  run_convert(fixture("qwen3_moe"), q, "q4");
  EXPECT_THROW(run_convert(fixture("qwen3_moe"), q, "q4"), Error);  // not empty
  try {
    run_convert(q, scratch("bad2"), "q4");
    FAIL() << "converting a quantized checkpoint must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already"), std::string::npos) << e.what();
  }
  EXPECT_THROW(recipe("q7"), UsageError);
  Recipe r = recipe("q4");
  RecipeOverrides o;
  o.expert_bits = "7";
  EXPECT_THROW(apply_overrides(&r, o), UsageError);
}

// The 4-8 bit recipes (docs/quantization.md's table) and the overrides that take 5, 6 and 8.
TEST(Convert, FourToEightBitRecipesAndOverrides) {
  using ops::QType;
  const struct {
    const char* name;
    QType dense, lm_head, gate_up, down;
  } want[] = {{"q8", QType::kQ8, QType::kQ8, QType::kQ8, QType::kQ8},
              {"q6", QType::kQ6, QType::kQ6, QType::kQ6, QType::kQ6},
              {"q5", QType::kQ5, QType::kQ5, QType::kQ5, QType::kQ5},
              {"q4-hi8", QType::kQ8, QType::kQ8, QType::kQ4, QType::kQ4},
              {"q4-hi6", QType::kQ6, QType::kQ6, QType::kQ4, QType::kQ4},
              {"q4-hi8-down6", QType::kQ8, QType::kQ8, QType::kQ4, QType::kQ6},
              {"q5-hi8", QType::kQ8, QType::kQ8, QType::kQ5, QType::kQ5}};
  for (const auto& w : want) {
    SCOPED_TRACE(w.name);
    const Recipe r = recipe(w.name);
    for (const ClassSpec* c : {&r.dense, &r.lm_head, &r.expert_gate_up, &r.expert_down}) {
      EXPECT_FALSE(c->keep);
      EXPECT_EQ(c->group, 64);
    }
    EXPECT_EQ(r.dense.type, w.dense);
    EXPECT_EQ(r.lm_head.type, w.lm_head);
    EXPECT_EQ(r.expert_gate_up.type, w.gate_up);
    EXPECT_EQ(r.expert_down.type, w.down);
  }
  EXPECT_EQ(recipe("q4-hi8-down6").expert_down.describe(), "q6 g64");
  Recipe r = recipe("q4");
  RecipeOverrides o;
  o.attn_bits = "8";
  o.lm_head_bits = "6";
  o.expert_bits = "5";
  o.expert_down_bits = "8";
  apply_overrides(&r, o);
  EXPECT_EQ(r.dense.type, QType::kQ8);
  EXPECT_EQ(r.lm_head.type, QType::kQ6);
  EXPECT_EQ(r.expert_gate_up.type, QType::kQ5);
  EXPECT_EQ(r.expert_down.type, QType::kQ8);
  for (int b : {5, 6, 8}) {
    Recipe all = recipe("q4");
    RecipeOverrides ob;
    ob.bits = b;
    apply_overrides(&all, ob);
    EXPECT_EQ(ops::qtype_bits(all.expert_down.type), b);
    EXPECT_EQ(ops::qtype_bits(all.dense.type), b);
  }
  for (int b : {1, 7, 9, 16}) {
    Recipe bad = recipe("q4");
    RecipeOverrides ob;
    ob.bits = b;
    EXPECT_THROW(apply_overrides(&bad, ob), UsageError) << b;
  }
}

// q8 keeps its fixed grid, so with fitted codebooks (the default) no `.codebook` tensor is
// written: 1 KiB less per matrix, same codes as the file that stores the grid (--codebook
// gaussian), and the same logits.
TEST(Convert, Q8StoresNoCodebook) {
  const std::string a = scratch("q8_fit"), b = scratch("q8_gauss");
  run_convert(fixture("olmoe"), a, "q8");
  ConvertOptions o;
  o.in_dir = fixture("olmoe");
  o.out_dir = b;
  o.rules = &models::checkpoint_rules();
  o.recipe = recipe("q8");
  o.quant.codebook = CodebookSource::kGaussian;
  o.threads = 2;
  convert(o, nullptr);
  const io::Checkpoint ca = models::open_checkpoint(a), cb = models::open_checkpoint(b);
  int64_t matrices = 0;
  for (const auto& t : cb.tensors())
    if (t.name.ends_with(".codebook")) ++matrices;
  ASSERT_GT(matrices, 0);
  for (const auto& t : ca.tensors()) EXPECT_FALSE(t.name.ends_with(".codebook")) << t.name;
  EXPECT_EQ(fs::file_size(b + "/model.safetensors") - fs::file_size(a + "/model.safetensors"),
            static_cast<uintmax_t>(matrices) * 1024 + [&] {  // the header's entries for the codebooks
              auto hdr = [](const std::string& f) {
                std::ifstream in(f, std::ios::binary);
                uint64_t n = 0;
                in.read(reinterpret_cast<char*>(&n), 8);
                return n;
              };
              return hdr(b + "/model.safetensors") - hdr(a + "/model.safetensors");
            }());
  for (bool stream : {false, true}) {
    engine::LoadedModel la = load(a, stream, "0.0001"), lb = load(b, stream, "0.0001");
    const std::vector<int32_t> ids = prompt_ids(la.model->spec().vocab_size, 6);
    EXPECT_EQ(all_logits(*la.model, ids), all_logits(*lb.model, ids)) << "stream " << stream;
  }
}

/// Converts the qwen3_moe fixture (q4), rewrites its shard with `edit` applied to every tensor
/// `match` accepts (bytes, dtype, shape; an emptied name drops the tensor), then expects loading
/// and a forward pass (resident, or streamed with a tiny cache) to fail mentioning `want`.
/// `embed_bits`: convert with --embed-bits.
void expect_corrupt_rejected(const std::string& tag, const std::function<bool(const std::string&)>& match,
                             const std::function<void(io::TensorToWrite&, std::vector<uint8_t>&)>& edit, const std::string& want,
                             bool stream = false, std::optional<std::string> embed_bits = {}) {
  const std::string q = scratch("corrupt_" + tag);
  run_convert(fixture("qwen3_moe"), q, "q4", true, 4ull << 30, embed_bits);
  const std::string path = q + "/model.safetensors";
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<io::TensorToWrite> ts;
  {
    io::SafetensorsFile f = io::SafetensorsFile::open(path);
    for (const auto& t : f.tensors()) bytes.emplace_back(f.data(t), f.data(t) + t.nbytes);
    size_t i = 0;
    for (const auto& t : f.tensors()) {
      ts.push_back({t.name, t.dtype, t.shape, bytes[i].data()});
      if (match(t.name)) edit(ts.back(), bytes[i]);
      ts.back().data = bytes[i].data();
      if (ts.back().name.empty()) ts.pop_back();  // the edit removed the tensor
      ++i;
    }
  }
  fs::remove(path);
  io::write_safetensors(path, ts);
  try {
    engine::LoadedModel l = load(q, stream, "0.0001");
    std::vector<int32_t> ids = prompt_ids(l.model->spec().vocab_size, 6);
    all_logits(*l.model, ids);
    FAIL() << tag << ": corrupt file was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << tag << ": " << e.what();
  }
}

std::function<bool(const std::string&)> is(const std::string& name) {
  return [name](const std::string& n) { return n == name; };
}

TEST(Convert, CorruptQuantizedFilesAreRejected) {
  const std::string dense = "model.layers.0.self_attn.q_proj";
  const std::string expert = "model.layers.0.mlp.experts.3.down_proj";
  expect_corrupt_rejected("codebook_len", is(dense + ".codebook"), [](io::TensorToWrite& t, std::vector<uint8_t>& b) {
    t.shape = {5};
    b.resize(20);
  }, "codebook has 5 entries");
  expect_corrupt_rejected("codebook_order", is(dense + ".codebook"), [](io::TensorToWrite&, std::vector<uint8_t>& b) {
    std::swap_ranges(b.begin(), b.begin() + 4, b.begin() + 4);
  }, "codebook");
  expect_corrupt_rejected("signs", is(dense + ".signs"), [](io::TensorToWrite&, std::vector<uint8_t>& b) { b[3] = 2; },
                          "sign vector entry 3");
  expect_corrupt_rejected("qweight_shape", is(dense + ".qweight"), [](io::TensorToWrite& t, std::vector<uint8_t>& b) {
    t.shape[1] -= 1;
    b.resize(static_cast<size_t>(t.shape[0] * t.shape[1]));
  }, "qweight has shape");
  expect_corrupt_rejected("scales_dtype", is(dense + ".scales"), [](io::TensorToWrite& t, std::vector<uint8_t>&) {
    t.dtype = io::DType::BF16;
  }, "has dtype BF16");
  // Sign vectors removed from a rotated checkpoint: refused, not run unrotated.
  expect_corrupt_rejected("signs_dropped", is(dense + ".signs"), [](io::TensorToWrite& t, std::vector<uint8_t>&) { t.name.clear(); },
                          "missing sign vector 'layers.0.self_attn.q_proj.signs'");
  expect_corrupt_rejected("expert_signs_dropped", is("model.layers.0.mlp.experts.down.signs"),
                          [](io::TensorToWrite& t, std::vector<uint8_t>&) { t.name.clear(); },
                          "missing sign vector 'layers.0.mlp.experts.down.signs'", /*stream=*/true);
  // A q4 matrix without its codebook (only q8 may omit it): refused, dense and streamed expert.
  expect_corrupt_rejected("codebook_dropped", is(dense + ".codebook"), [](io::TensorToWrite& t, std::vector<uint8_t>&) { t.name.clear(); },
                          "layers.0.self_attn.q_proj: missing codebook tensor");
  expect_corrupt_rejected("expert_codebook_dropped", is("model.layers.0.mlp.experts.5.down_proj.codebook"),
                          [](io::TensorToWrite& t, std::vector<uint8_t>&) { t.name.clear(); }, "missing codebook tensor",
                          /*stream=*/true);
  expect_corrupt_rejected("expert_codebook", is(expert + ".codebook"), [](io::TensorToWrite&, std::vector<uint8_t>& b) {
    const float nan = std::nanf("");
    std::memcpy(b.data() + 8, &nan, 4);
  }, "codebook");
  auto streamed = [](const std::string& n) {
    return n.starts_with("model.layers.0.mlp.experts.") && n.ends_with("down_proj.codebook") &&
           !n.starts_with("model.layers.0.mlp.experts.0.");
  };
  expect_corrupt_rejected("streamed_codebook", streamed, [](io::TensorToWrite&, std::vector<uint8_t>& b) {
    const float nan = std::nanf("");
    std::memcpy(b.data() + 8, &nan, 4);
  }, "codebook", /*stream=*/true);
}

// A quantized embedding table with wrong shapes or a missing piece: a clear error naming it.
TEST(Convert, CorruptQuantizedEmbeddingIsRejected) {
  const std::string e = "model.embed_tokens";
  expect_corrupt_rejected("embed_scales_shape", is(e + ".scales"), [](io::TensorToWrite& t, std::vector<uint8_t>& b) {
    t.shape[0] -= 1;
    b.resize(static_cast<size_t>(t.shape[0] * t.shape[1] * 2));
  }, "embed_tokens: scales have shape", false, "4");
  expect_corrupt_rejected("embed_qweight_shape", is(e + ".qweight"), [](io::TensorToWrite& t, std::vector<uint8_t>& b) {
    t.shape[1] -= 1;
    b.resize(static_cast<size_t>(t.shape[0] * t.shape[1]));
  }, "embed_tokens: qweight has shape", false, "4");
  expect_corrupt_rejected("embed_signs_dropped", is(e + ".signs"), [](io::TensorToWrite& t, std::vector<uint8_t>&) { t.name.clear(); },
                          "missing sign vector 'embed_tokens.signs'", false, "4");
  expect_corrupt_rejected("embed_scales_dropped", is(e + ".scales"), [](io::TensorToWrite& t, std::vector<uint8_t>&) { t.name.clear(); },
                          "embed_tokens.scales", false, "4");
}

// The embedding class: bf16 in every named recipe (their files are unchanged), quantized only
// by --embed-bits, with the dense class's group size; MTP copies of the table stay bf16.
TEST(Convert, EmbedClassAndFlag) {
  EXPECT_EQ(classify("embed_tokens.weight", {1000, 64}), TensorClass::kEmbed);
  EXPECT_EQ(classify("layers.4.embed_tokens.weight", {1000, 64}), TensorClass::kKeep);
  EXPECT_EQ(classify("embed_tokens_per_layer.weight", {1000, 64}), TensorClass::kKeep);
  for (const std::string& n : recipe_names()) {
    EXPECT_TRUE(recipe(n).embed.keep) << n;
    EXPECT_TRUE(recipe(n).spec(TensorClass::kEmbed).keep) << n;
  }
  Recipe r = recipe("tq3a-tqTe-down4");
  apply_overrides(&r, RecipeOverrides{.group_size = 32, .embed_bits = "4"});
  EXPECT_FALSE(r.spec(TensorClass::kEmbed).keep);
  EXPECT_EQ(r.embed.type, ops::QType::kQ4);
  EXPECT_EQ(r.embed.group, 32);
  EXPECT_EQ(r.embed.describe(), "q4 g32");
  EXPECT_EQ(r.expert_down.type, ops::QType::kQ4);  // nothing else moved
  EXPECT_EQ(r.dense.type, ops::QType::kQ3);
  apply_overrides(&r, RecipeOverrides{.embed_bits = "ternary"});
  EXPECT_EQ(r.embed.type, ops::QType::kTernary);
  apply_overrides(&r, RecipeOverrides{.embed_bits = "bf16"});
  EXPECT_TRUE(r.embed.keep);
  apply_overrides(&r, RecipeOverrides{.bits = 2});  // --bits leaves the table alone
  EXPECT_TRUE(r.embed.keep);
  try {
    apply_overrides(&r, RecipeOverrides{.embed_bits = "q4"});
    FAIL() << "--embed-bits q4 was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--embed-bits must be 2, 3, 4, 5, 6, 8, ternary or bf16 (got 'q4')"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace spool::quant
