// Checkpoint loading: name normalisation, text_config, both expert layouts, bad directories.
#include "io/checkpoint.h"

#include <gtest/gtest.h>

#include <malloc.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.h"

namespace spool::io {
namespace {

const std::string kData = SPOOL_TEST_DATA_DIR;
// No family rules: the fixtures opened here (Qwen3.5, the demo) need none.
const RulesResolver kNoRules;
namespace fs = std::filesystem;

TEST(Checkpoint, NormalizeNames) {
  EXPECT_EQ(normalize_tensor_name("model.language_model.layers.0.mlp.gate.weight"), "layers.0.mlp.gate.weight");
  EXPECT_EQ(normalize_tensor_name("language_model.model.norm.weight"), "norm.weight");
  EXPECT_EQ(normalize_tensor_name("model.embed_tokens.weight"), "embed_tokens.weight");
  EXPECT_EQ(normalize_tensor_name("lm_head.weight"), "lm_head.weight");
  EXPECT_EQ(normalize_tensor_name("model.visual.blocks.0.attn.qkv.weight"), "");
  EXPECT_EQ(normalize_tensor_name("mtp.fc.weight"), "");
}

TEST(TensorNames, ParseExpertAndRouterNames) {
  auto a = parse_expert_name("layers.12.mlp.experts.255.down_proj.qweight");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->layer, 12);
  EXPECT_EQ(a->expert, 255);
  EXPECT_EQ(a->proj, ExpertProj::kDown);
  EXPECT_EQ(a->part, ExpertPart::kQWeight);
  auto f = parse_expert_name("layers.3.mlp.experts.gate_up_proj");
  ASSERT_TRUE(f.has_value());
  EXPECT_TRUE(f->fused);
  EXPECT_EQ(f->proj, ExpertProj::kGate);
  EXPECT_FALSE(parse_expert_name("layers.0.block_sparse_moe.experts.7.w3.weight").has_value());  // a family's rename
  auto l = parse_expert_name("layers.5.experts.down_proj");  // fused, directly under the layer (Gemma 4)
  ASSERT_TRUE(l.has_value());
  EXPECT_TRUE(l->fused);
  EXPECT_EQ(l->layer, 5);
  EXPECT_EQ(l->proj, ExpertProj::kDown);
  EXPECT_TRUE(parse_expert_name("layers.5.experts.gate_up_proj").has_value());
  EXPECT_FALSE(parse_expert_name("layers.5.experts.3.gate_proj.weight").has_value());  // only the fused layout there
  EXPECT_FALSE(parse_expert_name("layers.5.experts.gate_up_proj.weight").has_value());
  EXPECT_FALSE(parse_expert_name("layers.0.mlp.experts.99999999999.gate_proj.weight").has_value());
  EXPECT_FALSE(parse_expert_name("layers.0.mlp.experts.1.gate_proj.bias").has_value());
  EXPECT_FALSE(parse_expert_name("layers.x.mlp.experts.1.gate_proj.weight").has_value());
  EXPECT_FALSE(parse_expert_name("layers.0.mlp.shared_expert.gate_proj.weight").has_value());
  EXPECT_EQ(parse_router_name("layers.4.mlp.gate.weight"), 4);
  EXPECT_FALSE(parse_router_name("layers.4.block_sparse_moe.gate.weight").has_value());
  EXPECT_FALSE(parse_router_name("layers.4.mlp.gate_proj.weight").has_value());
  EXPECT_EQ(expert_tensor_name(1, 2, ExpertProj::kUp, ExpertPart::kScales), "layers.1.mlp.experts.2.up_proj.scales");
}

// TensorRename patterns: "{L}" / "{E}" carry decimal indexes over; the first matching rule wins.
TEST(TensorNames, RenamePatterns) {
  const std::vector<TensorRename> rules = {
      {"layers.{L}.block_sparse_moe.experts.{E}.w3.weight", "layers.{L}.mlp.experts.{E}.up_proj.weight"},
      {"layers.{L}.block_sparse_moe.gate.weight", "layers.{L}.mlp.gate.weight"},
      {"layers.{L}.mlp.moe_statics.e_score_correction_bias", "layers.{L}.mlp.gate.e_score_correction_bias", true},
      {"layers.{L}.x.{E}", "y.{E}.{L}"},
  };
  bool sq = true;
  EXPECT_EQ(apply_renames(rules, "layers.12.block_sparse_moe.experts.7.w3.weight", &sq), "layers.12.mlp.experts.7.up_proj.weight");
  EXPECT_FALSE(sq);
  EXPECT_EQ(apply_renames(rules, "layers.4.block_sparse_moe.gate.weight", &sq), "layers.4.mlp.gate.weight");
  EXPECT_EQ(apply_renames(rules, "layers.0.mlp.moe_statics.e_score_correction_bias", &sq), "layers.0.mlp.gate.e_score_correction_bias");
  EXPECT_TRUE(sq);
  EXPECT_EQ(apply_renames(rules, "layers.3.x.15", &sq), "y.15.3");  // an index as the last segment
  EXPECT_FALSE(sq);
  // No match: a different segment, a leading zero, a non-number, a longer or shorter name.
  EXPECT_EQ(apply_renames(rules, "layers.4.block_sparse_moe.gate.bias", &sq), "");
  EXPECT_EQ(apply_renames(rules, "layers.04.block_sparse_moe.gate.weight", &sq), "");
  EXPECT_EQ(apply_renames(rules, "layers.a.block_sparse_moe.gate.weight", &sq), "");
  EXPECT_EQ(apply_renames(rules, "layers.4.block_sparse_moe.gate.weight.x", &sq), "");
  EXPECT_EQ(apply_renames(rules, "layers.4.block_sparse_moe.gate", &sq), "");
  EXPECT_EQ(apply_renames(rules, "layers.3.x.15a", &sq), "");
  EXPECT_EQ(apply_renames(rules, "layers.3.x.", &sq), "");
}

TEST(Checkpoint, MultimodalDropsVisionAndReadsTextConfig) {
  Checkpoint c = Checkpoint::open(kData + "/models/qwen3_5_moe_vl", kNoRules);
  EXPECT_EQ(c.model_type(), "qwen3_5_moe_text");
  EXPECT_EQ(c.top_model_type(), "qwen3_5_moe");
  EXPECT_EQ(c.config().get_int("hidden_size"), 64);
  EXPECT_GT(c.dropped_tensors(), 10);
  EXPECT_NE(c.find("embed_tokens.weight"), nullptr);
  EXPECT_NE(c.find("lm_head.weight"), nullptr);
  EXPECT_EQ(c.expert_layout(), ExpertLayout::kPerExpert);
}

TEST(Checkpoint, FusedExpertsMatchPerExpert) {
  Checkpoint a = Checkpoint::open(kData + "/models/qwen3_5_moe_vl", kNoRules);
  Checkpoint b = Checkpoint::open(kData + "/models/qwen3_5_moe_vl_fused", kNoRules);
  EXPECT_EQ(b.expert_layout(), ExpertLayout::kFused);
  for (int e = 0; e < 8; ++e) {
    for (auto p : {ExpertProj::kGate, ExpertProj::kUp, ExpertProj::kDown}) {
      const TensorRef& ta = a.expert(2, e, p);
      const TensorRef& tb = b.expert(2, e, p);
      ASSERT_EQ(ta.shape, tb.shape);
      ASSERT_EQ(ta.nbytes, tb.nbytes);
      EXPECT_EQ(std::memcmp(ta.data, tb.data, ta.nbytes), 0) << "expert " << e;
    }
  }
  EXPECT_EQ(a.expert_bytes(), b.expert_bytes());
}

TEST(Checkpoint, ShardedDemo) {
  Checkpoint c = Checkpoint::open(SPOOL_DEFAULT_MODEL_DIR, kNoRules);
  EXPECT_EQ(c.shards().size(), 5u);  // model-0000{1..4}-of-00004 and model-mtp.safetensors (the MTP head, listed in the index)
  EXPECT_EQ(c.config().get_int("num_experts"), 64);
  EXPECT_EQ(c.expert(7, 63, ExpertProj::kDown).shape, (std::vector<int64_t>{256, 32}));
  EXPECT_EQ(c.tensor("embed_tokens.weight").dtype, DType::BF16);
}

// The checkpoint keeps one tensor table: the shards' own are dropped once indexed, and
// table_bytes() (what `spool plan` counts) is the heap that opening leaves in use.
TEST(Checkpoint, OneTableCountedByTableBytes) {
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);  // as spool runs (cli/main.cpp)
  const size_t before = mallinfo2().uordblks + mallinfo2().hblkhd;
  Checkpoint c = Checkpoint::open(SPOOL_DEFAULT_MODEL_DIR, kNoRules, {.map = false});
  const size_t held = mallinfo2().uordblks + mallinfo2().hblkhd - before;
  for (const auto& s : c.shards()) EXPECT_TRUE(s.tensors().empty()) << s.path();
  EXPECT_NE(c.find("layers.3.mlp.experts.5.up_proj.weight"), nullptr);
  EXPECT_NE(c.find("norm.weight"), nullptr);  // a short (in-string) name found through the index
  const uint64_t tables = c.table_bytes();
  // Besides the tables the object holds its configs and the shards' paths: a few KB.
  EXPECT_LE(tables, held);
  EXPECT_GE(tables, held - held / 10) << "held " << held;
}

std::string open_error(const std::string& dir) {
  try {
    Checkpoint::open(dir, kNoRules);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Checkpoint, BadDirectories) {
  std::string base = ::testing::TempDir() + "/ckpt_bad";
  fs::remove_all(base);
  fs::create_directories(base + "/noconfig");
  EXPECT_NE(open_error(base + "/noconfig").find("config.json"), std::string::npos);
  EXPECT_NE(open_error(base + "/nonexistent").find("does not exist"), std::string::npos);
  fs::create_directories(base + "/badjson");
  std::ofstream(base + "/badjson/config.json") << "{\"model_type\": ";
  EXPECT_NE(open_error(base + "/badjson").find("not valid JSON"), std::string::npos);
  fs::create_directories(base + "/noweights");
  std::ofstream(base + "/noweights/config.json") << "{\"model_type\": \"qwen3_moe\"}";
  EXPECT_NE(open_error(base + "/noweights").find("no model weights"), std::string::npos);
  fs::create_directories(base + "/missingshard");
  std::ofstream(base + "/missingshard/config.json") << "{\"model_type\": \"qwen3_moe\"}";
  std::ofstream(base + "/missingshard/model.safetensors.index.json")
      << R"({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}})";
  EXPECT_NE(open_error(base + "/missingshard").find("missing shard"), std::string::npos);
}

}  // namespace
}  // namespace spool::io
