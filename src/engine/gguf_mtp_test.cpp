// The multi-token-prediction head from GGUF: the demo model (bf16 safetensors with its trained
// MTP head, model-mtp.safetensors) written at test time as the qwen35moe GGUF llama.cpp's
// convert_hf_to_gguf.py makes of it (Qwen3_5MoeTextModel with _QwenMtpMixin, --outtype bf16),
// loaded with LoadOptions::mtp: the head's logits equal the safetensors model's, greedy
// speculative decoding gives plain greedy's tokens, and without the option the head is skipped but
// counted.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include "support/gguf_writer.h"
#include "support/golden.h"
#include "support/mtp.h"
#include "support/random.h"
#include "common/error.h"
#include "engine/loader.h"
#include "engine/session.h"
#include "engine/speculative.h"
#include "io/gguf.h"
#include "io/safetensors.h"

namespace spool::engine {
namespace {

using spool::testing::argmax;
using spool::testing::data_dir;

// A tensor in PyTorch order of elements, as floats (bf16 widened exactly).
struct Floats {
  std::vector<int64_t> shape;
  std::vector<float> v;
};

// The safetensors shards of a checkpoint directory, read by stored name.
class Shards {
 public:
  explicit Shards(const std::string& dir) {
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") files_.push_back(io::SafetensorsFile::open(e.path().string()));
  }
  bool has(const std::string& name) const {
    for (const io::SafetensorsFile& f : files_)
      if (f.find(name) != nullptr) return true;
    return false;
  }
  Floats get(const std::string& name) const {
    for (const io::SafetensorsFile& f : files_)
      if (const io::TensorInfo* t = f.find(name)) {
        return Floats{t->shape, spool::testing::tensor_f32(f, *t, name)};
      }
    throw std::runtime_error("checkpoint lacks " + name);
  }

 private:
  std::vector<io::SafetensorsFile> files_;
};

// llama.cpp's _LinearAttentionVReorderBase._reorder_v_heads along axis 0 (rows) or 1 (columns)
// of a 2-D tensor (a 1-D one as one column): V heads of `blk` elements grouped by K head
// [g0: v0..v{r-1}, g1: ...] -> tiled [v0: g0..g{nk-1}, v1: ...]; the first `skip` rows are not V.
Floats tile_v(const Floats& t, int axis, int64_t nk, int64_t r, int64_t blk, int64_t skip = 0) {
  Floats o = t;
  const int64_t rows = t.shape[0], cols = t.shape.size() > 1 ? t.v.size() / rows : 1;
  for (int64_t g = 0; g < nk; ++g)
    for (int64_t q = 0; q < r; ++q)
      for (int64_t k = 0; k < blk; ++k) {
        const int64_t from = (g * r + q) * blk + k, to = (q * nk + g) * blk + k;
        if (axis == 0) {
          std::memcpy(&o.v[(skip + to) * cols], &t.v[(skip + from) * cols], cols * 4);
        } else {
          for (int64_t row = 0; row < rows; ++row) o.v[row * cols + to] = t.v[row * cols + from];
        }
      }
  return o;
}

Floats plus_one(Floats t) {
  for (float& x : t.v) x += 1.0f;  // in f32, as the converter (it widens bf16 to f32 first)
  return t;
}

// Stacks per-expert [out, in] matrices into [E, out, in].
Floats stack(const std::vector<Floats>& xs) {
  Floats o{{static_cast<int64_t>(xs.size()), xs[0].shape[0], xs[0].shape[1]}, {}};
  for (const Floats& x : xs) o.v.insert(o.v.end(), x.v.begin(), x.v.end());
  return o;
}

// Rows [a, b) of each expert of [E, R, C].
Floats expert_rows(const Floats& t, int64_t a, int64_t b) {
  const int64_t E = t.shape[0], R = t.shape[1], C = t.shape[2];
  Floats o{{E, b - a, C}, {}};
  for (int64_t e = 0; e < E; ++e) o.v.insert(o.v.end(), t.v.begin() + (e * R + a) * C, t.v.begin() + (e * R + b) * C);
  return o;
}

// Writes the Qwen3.5-MoE checkpoint `dir` (config.json, bf16 safetensors shards, the MTP head as
// mtp.*) as the GGUF that llama.cpp's converter writes (convert_hf_to_gguf.py --outtype bf16 of
// the llama-cpp-python 0.3.36 sdist; docs/models.md "MTP heads"), with the tokenizer metadata of
// `tokenizer_gguf` (tokenizer.* keys) copied in:
//  - every norm ending in "norm.weight" stored as 1 + w, except linear_attn.norm (ssm_norm);
//    A_log as -exp(A_log); dt_bias as ssm_dt.bias; conv1d squeezed to {K, C}; the Gated
//    DeltaNet V heads grouped -> tiled (qkv's V rows, z rows, a / b rows, conv1d's V channels,
//    A, dt, out_proj's columns); experts stacked (per-expert) or the fused gate_up split in
//    halves into ffn_gate_exps / ffn_up_exps;
//  - the MTP head (_QwenMtpMixin): mtp.layers.{k}.X as block num_hidden_layers + k (its attention
//    and MoE tensors under the usual blk names), mtp.fc -> blk.{L}.nextn.eh_proj,
//    pre_fc_norm_embedding -> nextn.enorm, pre_fc_norm_hidden -> nextn.hnorm, norm ->
//    nextn.shared_head_norm; block_count = L + mtp_num_hidden_layers, nextn_predict_layers,
//    attention.recurrent_layers false for the MTP blocks;
//  - types: 1-D tensors, *_norm.weight, ffn_gate_inp(_shexp) and ssm_conv1d F32, other matrices BF16.
void write_qwen35moe_gguf(const std::string& dir, const std::string& tokenizer_gguf, const std::string& dst) {
  const Shards sh(dir);
  const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(dir + "/config.json"));
  const int64_t L = cfg["num_hidden_layers"], n_mtp = cfg.value("mtp_num_hidden_layers", 0);
  const int64_t E = cfg["num_experts"], nk = cfg["linear_num_key_heads"], nv = cfg["linear_num_value_heads"];
  const int64_t dk = cfg["linear_key_head_dim"], dv = cfg["linear_value_head_dim"], r = nv / nk, qk = 2 * nk * dk;
  const int64_t hd = cfg["head_dim"];
  struct Out {
    std::string name;
    Floats t;
    bool bf16;
  };
  std::vector<Out> out;
  auto f32 = [&](std::string n, Floats t) { out.push_back({std::move(n), std::move(t), false}); };
  auto bf16 = [&](std::string n, Floats t) { out.push_back({std::move(n), std::move(t), true}); };
  bf16("token_embd.weight", sh.get("model.embed_tokens.weight"));
  f32("output_norm.weight", plus_one(sh.get("model.norm.weight")));
  bf16("output.weight", sh.get("lm_head.weight"));
  const std::vector<std::string> types = cfg["layer_types"];
  for (int64_t b = 0; b < L + n_mtp; ++b) {
    const std::string p = b < L ? "model.layers." + std::to_string(b) + "." : "mtp.layers." + std::to_string(b - L) + ".";
    const std::string q = "blk." + std::to_string(b) + ".";
    f32(q + "attn_norm.weight", plus_one(sh.get(p + "input_layernorm.weight")));
    f32(q + "post_attention_norm.weight", plus_one(sh.get(p + "post_attention_layernorm.weight")));
    if (b < L && types[b] == "linear_attention") {
      const std::string la = p + "linear_attn.";
      bf16(q + "attn_qkv.weight", tile_v(sh.get(la + "in_proj_qkv.weight"), 0, nk, r, dv, qk));
      bf16(q + "attn_gate.weight", tile_v(sh.get(la + "in_proj_z.weight"), 0, nk, r, dv));
      bf16(q + "ssm_beta.weight", tile_v(sh.get(la + "in_proj_b.weight"), 0, nk, r, 1));
      bf16(q + "ssm_alpha.weight", tile_v(sh.get(la + "in_proj_a.weight"), 0, nk, r, 1));
      Floats conv = sh.get(la + "conv1d.weight");  // [C, 1, K] -> [C, K]
      conv.shape = {conv.shape[0], conv.shape[2]};
      f32(q + "ssm_conv1d.weight", tile_v(conv, 0, nk, r, dv, qk));
      Floats a = sh.get(la + "A_log");
      for (float& x : a.v) x = -std::exp(x);
      f32(q + "ssm_a", tile_v(a, 0, nk, r, 1));
      f32(q + "ssm_dt.bias", tile_v(sh.get(la + "dt_bias"), 0, nk, r, 1));
      f32(q + "ssm_norm.weight", sh.get(la + "norm.weight"));
      bf16(q + "ssm_out.weight", tile_v(sh.get(la + "out_proj.weight"), 1, nk, r, dv));
    } else {
      for (auto [g, h] : {std::pair{"attn_q", "q_proj"}, {"attn_k", "k_proj"}, {"attn_v", "v_proj"}, {"attn_output", "o_proj"}})
        bf16(q + g + ".weight", sh.get(p + "self_attn." + h + ".weight"));
      f32(q + "attn_q_norm.weight", plus_one(sh.get(p + "self_attn.q_norm.weight")));
      f32(q + "attn_k_norm.weight", plus_one(sh.get(p + "self_attn.k_norm.weight")));
    }
    f32(q + "ffn_gate_inp.weight", sh.get(p + "mlp.gate.weight"));
    if (sh.has(p + "mlp.experts.gate_up_proj")) {  // fused [E, 2I, H], gate rows first; down [E, H, I]
      const Floats gu = sh.get(p + "mlp.experts.gate_up_proj");
      bf16(q + "ffn_gate_exps.weight", expert_rows(gu, 0, gu.shape[1] / 2));
      bf16(q + "ffn_up_exps.weight", expert_rows(gu, gu.shape[1] / 2, gu.shape[1]));
      bf16(q + "ffn_down_exps.weight", sh.get(p + "mlp.experts.down_proj"));
    } else {
      for (auto [g, h] : {std::pair{"ffn_gate_exps", "gate_proj"}, {"ffn_up_exps", "up_proj"}, {"ffn_down_exps", "down_proj"}}) {
        std::vector<Floats> xs;
        for (int64_t e = 0; e < E; ++e) xs.push_back(sh.get(p + "mlp.experts." + std::to_string(e) + "." + h + ".weight"));
        bf16(q + g + ".weight", stack(xs));
      }
    }
    for (auto [g, h] : {std::pair{"ffn_gate_shexp", "gate_proj"}, {"ffn_up_shexp", "up_proj"}, {"ffn_down_shexp", "down_proj"}})
      bf16(q + g + ".weight", sh.get(p + "mlp.shared_expert." + h + ".weight"));
    f32(q + "ffn_gate_inp_shexp.weight", sh.get(p + "mlp.shared_expert_gate.weight"));  // [1, H]: ne {H, 1}
    if (b == L) {  // the head: _QwenMtpMixin's remapper, then the nextn names
      bf16(q + "nextn.eh_proj.weight", sh.get("mtp.fc.weight"));
      f32(q + "nextn.enorm.weight", plus_one(sh.get("mtp.pre_fc_norm_embedding.weight")));
      f32(q + "nextn.hnorm.weight", plus_one(sh.get("mtp.pre_fc_norm_hidden.weight")));
      f32(q + "nextn.shared_head_norm.weight", plus_one(sh.get("mtp.norm.weight")));
    }
  }

  testing::GgufWriter w;
  const std::string a = "qwen35moe.";
  auto u32 = [&w](const std::string& k, const nlohmann::json& v) { w.add_u32(k, v.get<uint32_t>()); };
  w.add_string("general.architecture", "qwen35moe");
  u32(a + "block_count", L + n_mtp);
  u32(a + "context_length", cfg["max_position_embeddings"]);
  u32(a + "embedding_length", cfg["hidden_size"]);
  u32(a + "attention.head_count", cfg["num_attention_heads"]);
  u32(a + "attention.head_count_kv", cfg["num_key_value_heads"]);
  w.add_f32(a + "rope.freq_base", static_cast<float>(cfg["rope_parameters"]["rope_theta"].get<double>()));
  w.add_f32(a + "attention.layer_norm_rms_epsilon", static_cast<float>(cfg["rms_norm_eps"].get<double>()));
  u32(a + "expert_count", cfg["num_experts"]);
  u32(a + "expert_used_count", cfg["num_experts_per_tok"]);
  u32(a + "attention.key_length", cfg["head_dim"]);
  u32(a + "attention.value_length", cfg["head_dim"]);
  u32(a + "expert_feed_forward_length", cfg["moe_intermediate_size"]);
  u32(a + "expert_shared_feed_forward_length", cfg["shared_expert_intermediate_size"]);
  if (n_mtp > 0) w.add_u32(a + "nextn_predict_layers", static_cast<uint32_t>(n_mtp));
  u32(a + "ssm.conv_kernel", cfg["linear_conv_kernel_dim"]);
  u32(a + "ssm.state_size", cfg["linear_key_head_dim"]);
  u32(a + "ssm.group_count", cfg["linear_num_key_heads"]);
  u32(a + "ssm.time_step_rank", cfg["linear_num_value_heads"]);
  w.add_u32(a + "ssm.inner_size", static_cast<uint32_t>(dv * nv));
  std::vector<bool> recurrent;
  for (const std::string& t : types) recurrent.push_back(t == "linear_attention");
  recurrent.resize(static_cast<size_t>(L + n_mtp), false);
  w.add_bools(a + "attention.recurrent_layers", recurrent);
  w.add_u32(a + "full_attention_interval", 4);
  w.add_u32(a + "rope.dimension_count", static_cast<uint32_t>(hd * cfg["rope_parameters"]["partial_rotary_factor"].get<double>()));
  w.add_i32s(a + "rope.dimension_sections", {11, 11, 10, 0});
  const io::GgufFile tok = io::GgufFile::open(tokenizer_gguf);
  for (const auto& [key, v] : tok.metadata())
    if (key.starts_with("tokenizer.")) w.add_value(key, v);
  for (const Out& o : out) {
    const std::vector<int64_t> ne(o.t.shape.rbegin(), o.t.shape.rend());
    if (!o.bf16) {
      w.add_tensor_f32(o.name, ne, o.t.v);
      continue;
    }
    std::vector<uint16_t> h(o.t.v.size());
    for (size_t i = 0; i < h.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &o.t.v[i], 4);
      if ((bits & 0xFFFF) != 0) throw std::runtime_error(o.name + ": not a bf16 value");  // moved, never computed
      h[i] = static_cast<uint16_t>(bits >> 16);
    }
    w.add_tensor(o.name, ne, GgmlType::BF16, h.data(), h.size() * 2);
  }
  w.write(dst);
}

// A scratch file of this process (ctest runs each test in a process of its own, several at
// once), removed at exit unless SPOOL_KEEP_MTP_GGUF is set (to compare it with the converter's).
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name)
      : path((std::filesystem::path(::testing::TempDir()) / (std::to_string(::getpid()) + "_" + name)).string()) {}
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (std::getenv("SPOOL_KEEP_MTP_GGUF") == nullptr) std::filesystem::remove(path);
  }
};

// The demo model as a GGUF with its MTP head, written once per process.
const std::string& demo_gguf() {
  static const TempFile f("spool_demo_mtp.gguf");
  static const bool written = (write_qwen35moe_gguf(SPOOL_DEFAULT_MODEL_DIR, data_dir() + "/gguf/demo_tokenizer.gguf", f.path), true);
  (void)written;
  return f.path;
}

LoadedModel load_model(const std::string& path, bool mtp) {
  LoadOptions o;
  o.model_dir = path;
  o.threads = 2;
  o.mtp = mtp;
  o.ctx_size = 512;
  return load(o);
}

// The demo prompts of the MTP goldens (prompt ids, then 48 greedy ids: both used).
std::vector<std::vector<int32_t>> demo_ids() {
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(data_dir() + "/models/spool-demo-moe-mtp/golden_mtp.json"));
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : j["prompts"]) out.push_back(p["ids"].get<std::vector<int32_t>>());
  return out;
}


TEST(GgufMtp, HeadIsSkippedButCountedUnlessAsked) {
  const io::GgufFile g = io::GgufFile::open(demo_gguf());
  uint64_t head_bytes = 0;  // every tensor of block 8 (the MTP block): its layer and its nextn head
  for (const io::GgufTensor& t : g.tensors())
    if (t.name.starts_with("blk.8.")) head_bytes += t.nbytes;
  ASSERT_GT(head_bytes, 0u);
  LoadedModel plain = load_model(demo_gguf(), false);
  EXPECT_EQ(plain.model->mtp_layers(), 0);
  EXPECT_EQ(plain.model->spec().n_layers, 8);
  EXPECT_EQ(plain.model->spec().mtp_declared, 1);  // qwen35moe.nextn_predict_layers -> mtp_num_hidden_layers
  EXPECT_EQ(plain.ckpt->mtp_bytes(), head_bytes);
  EXPECT_EQ(plain.ckpt->find("mtp.fc.weight"), nullptr);
  EXPECT_EQ(plain.ckpt->find("layers.8.self_attn.q_proj.weight"), nullptr);
  EXPECT_THROW(plain.model->mtp_forward({}), Error);
  LoadedModel mtp = load_model(demo_gguf(), true);
  EXPECT_EQ(mtp.model->mtp_layers(), 1);
  EXPECT_EQ(mtp.ckpt->mtp_layers(), 1);
  EXPECT_EQ(mtp.ckpt->mtp_bytes(), head_bytes);
  for (const char* n : {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight",
                        "layers.8.self_attn.q_proj.weight", "layers.8.input_layernorm.weight"})
    EXPECT_NE(mtp.ckpt->find(n), nullptr) << n;
  EXPECT_EQ(mtp.ckpt->tensor("mtp.fc.weight").shape, (std::vector<int64_t>{256, 512}));
  EXPECT_TRUE(mtp.ckpt->has_expert(8, 63, io::ExpertProj::kDown));
}

TEST(GgufMtp, HeadLogitsEqualTheSafetensorsModel) {
  LoadedModel ref = load_model(SPOOL_DEFAULT_MODEL_DIR, true), g = load_model(demo_gguf(), true);
  const int64_t V = ref.model->spec().vocab_size;
  for (const std::vector<int32_t>& ids : demo_ids()) {
    const std::vector<float> want = spool::testing::head_logits(*ref.model, ids), got = spool::testing::head_logits(*g.model, ids);
    ASSERT_EQ(got.size(), want.size());
    std::printf("  head logits: max |diff| / max |logit| = %.3g\n", spool::testing::expect_max_rel_close(got, want, 1e-5));
    for (int64_t t = 0; t + 1 < static_cast<int64_t>(ids.size()); ++t)
      EXPECT_EQ(argmax(got.data() + t * V, V), argmax(want.data() + t * V, V)) << "row " << t;
  }
}

TEST(GgufMtp, SpeculativeGreedyEqualsPlainGreedy) {
  LoadedModel g = load_model(demo_gguf(), true);
  const std::vector<std::vector<int32_t>> ids = demo_ids();
  for (size_t i : {0u, 2u}) {  // two of the four (speculative_test.cpp runs all on safetensors)
    std::vector<int32_t> prompt = ids[i];
    prompt.resize(prompt.size() - 48);  // the prompt alone
    GenerateRequest r;
    r.prompt = prompt;
    r.max_tokens = 40;
    r.sampling.temperature = 0;
    r.prefill_step = 5;
    Session plain_session(*g.model);
    const GenerateResult plain = plain_session.generate(r, {});
    for (int k : {1, 3}) {
      r.spec.mtp = true;
      r.spec.draft_max = k;
      r.spec.min_acceptance = 0;
      Session s(*g.model);
      const GenerateResult spec = s.generate(r, {});
      EXPECT_EQ(spec.output, plain.output) << "draft_max " << k;
      EXPECT_GT(spec.spec.accepted, 0) << "the trained head gets some drafts right";
      EXPECT_LT(spec.timings.decode_forwards, static_cast<int64_t>(spec.output.size()) - 1);
    }
    r.spec = {};
  }
}

TEST(GgufMtp, FileWithoutTheHeadSaysSo) {
  const io::GgufFile g = io::GgufFile::open(demo_gguf());
  const TempFile f("spool_demo_no_mtp.gguf");
  const std::string& path = f.path;
  testing::GgufWriter w;  // as convert_hf_to_gguf.py --no-mtp writes it: no block 8, no nextn key
  for (const auto& [key, v] : g.metadata()) {
    if (key == "qwen35moe.nextn_predict_layers") continue;
    if (key == "qwen35moe.block_count") {
      w.add_u32(key, 8);
    } else if (key == "qwen35moe.attention.recurrent_layers") {
      std::vector<bool> rl;
      for (int i = 0; i < 8; ++i) rl.push_back(v.raw[i] != 0);
      w.add_bools(key, rl);
    } else {
      w.add_value(key, v);
    }
  }
  for (const io::GgufTensor& t : g.tensors())
    if (!t.name.starts_with("blk.8.")) w.add_tensor(t.name, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.type, g.data(t), t.nbytes);
  w.write(path);
  LoadedModel plain = load_model(path, false);
  EXPECT_EQ(plain.model->spec().mtp_declared, 0);
  EXPECT_EQ(plain.ckpt->mtp_bytes(), 0u);
  try {
    load_model(path, true);
    ADD_FAILURE() << "loaded --spec mtp without a head";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blk.N.nextn.* head"), std::string::npos) << e.what();
  }
}

// GLM-4.5 (glm4moe; DeepSeek-V3 names): the fixture's GGUF declares nextn_predict_layers 1 of
// block_count 4 but holds no block 3 (as the fixture writer leaves it out). Written here with one, as
// Glm4MoeModel writes HF's layers.3: its layer tensors (copies of block 2's) and
// blk.3.nextn.{eh_proj, enorm, hnorm, shared_head_norm, shared_head_head} (random): they load
// under the HF names with the stored values (glm4moe norms are plain w), and the head drafts.
TEST(GgufMtp, Glm4MoeNextnLayerKeepsTheDeepSeekNames) {
  const io::GgufFile g = io::GgufFile::open(data_dir() + "/gguf/models/glm4_moe.f32.gguf");
  ASSERT_EQ(g.get_int("glm4moe.block_count"), 4);
  ASSERT_EQ(g.get_int("glm4moe.nextn_predict_layers"), 1);
  const int64_t H = 64, V = 512;
  testing::GgufWriter w;
  for (const auto& [key, v] : g.metadata()) w.add_value(key, v);
  for (const io::GgufTensor& t : g.tensors()) {
    const std::vector<int64_t> ne(t.ne, t.ne + t.n_dims);
    w.add_tensor(t.name, ne, t.type, g.data(t), t.nbytes);
    if (t.name.starts_with("blk.2.")) w.add_tensor("blk.3." + t.name.substr(6), ne, t.type, g.data(t), t.nbytes);
  }
  const std::vector<float> eh = spool::testing::randn(static_cast<size_t>(2 * H * H), 1, 0.1f),
                           head = spool::testing::randn(static_cast<size_t>(V * H), 2, 0.1f);
  std::vector<float> enorm = spool::testing::randn(H, 3, 0.1f), hnorm = spool::testing::randn(H, 4, 0.1f),
                     snorm = spool::testing::randn(H, 5, 0.1f);
  for (auto* v : {&enorm, &hnorm, &snorm})
    for (float& x : *v) x += 1.0f;  // plain RMSNorm weights near 1
  w.add_tensor_f32("blk.3.nextn.eh_proj.weight", {2 * H, H}, eh);
  w.add_tensor_f32("blk.3.nextn.enorm.weight", {H}, enorm);
  w.add_tensor_f32("blk.3.nextn.hnorm.weight", {H}, hnorm);
  w.add_tensor_f32("blk.3.nextn.shared_head_norm.weight", {H}, snorm);
  w.add_tensor_f32("blk.3.nextn.shared_head_head.weight", {H, V}, head);
  const TempFile f("spool_glm4_moe_mtp.gguf");
  w.write(f.path);

  LoadedModel plain = load_model(f.path, false);
  EXPECT_EQ(plain.model->spec().mtp_declared, 1);
  EXPECT_EQ(plain.ckpt->find("layers.3.eh_proj.weight"), nullptr);
  LoadedModel l = load_model(f.path, true);
  EXPECT_EQ(l.ckpt->mtp_layers(), 1);
  EXPECT_EQ(l.ckpt->mtp_bytes(), plain.ckpt->mtp_bytes());
  EXPECT_EQ(l.ckpt->find("mtp.fc.weight"), nullptr);
  auto floats = [&](const std::string& n, const std::vector<int64_t>& shape) {
    const io::TensorRef& t = l.ckpt->tensor(n);
    EXPECT_EQ(t.shape, shape) << n;
    EXPECT_EQ(t.dtype, io::DType::F32) << n;
    std::vector<float> v(static_cast<size_t>(t.numel()));
    std::memcpy(v.data(), t.data, v.size() * 4);
    return v;
  };
  EXPECT_EQ(floats("layers.3.eh_proj.weight", {H, 2 * H}), eh);
  EXPECT_EQ(floats("layers.3.enorm.weight", {H}), enorm);
  EXPECT_EQ(floats("layers.3.hnorm.weight", {H}), hnorm);
  EXPECT_EQ(floats("layers.3.shared_head.norm.weight", {H}), snorm);
  EXPECT_EQ(floats("layers.3.shared_head.head.weight", {V, H}), head);
  EXPECT_EQ(floats("layers.3.input_layernorm.weight", {H}), floats("layers.2.input_layernorm.weight", {H}));
  EXPECT_TRUE(l.ckpt->has_expert(3, 15, io::ExpertProj::kDown));
  // The head runs (its own output head: its rows differ from the model's) and speculative
  // greedy decoding keeps plain greedy's tokens.
  const std::vector<int32_t> prompt = {1, 17, 300, 42, 5, 99, 256, 7};
  const std::vector<float> logits = spool::testing::head_logits(*l.model, prompt);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  GenerateRequest r;
  r.prompt = prompt;
  r.max_tokens = 16;
  r.sampling.temperature = 0;
  Session a(*l.model);
  const GenerateResult want = a.generate(r, {});
  r.spec.mtp = true;
  r.spec.draft_max = 2;
  r.spec.min_acceptance = 0;
  Session b(*l.model);
  const GenerateResult got = b.generate(r, {});
  EXPECT_EQ(got.output, want.output);
  EXPECT_GT(got.spec.drafted, 0);
}

}  // namespace
}  // namespace spool::engine
