// Repack: permuting experts and router rows together leaves the output bit-identical;
// calibration picks the hottest experts and orders co-activated ones together.
#include "experts/repack.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <random>

#include "support/golden.h"
#include "common/error.h"
#include "io/safetensors.h"
#include "experts/calibrate.h"
#include "models/model.h"
#include "models/family.h"

namespace spool::experts {
namespace {

std::vector<float> logits_of(const std::string& dir, const std::vector<int32_t>& ids) {
  auto ck = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
  ops::ThreadPool pool(2);
  auto m = models::load_model(ck, &pool);
  models::State st = m->new_state();
  std::vector<float> out(ids.size() * m->spec().vocab_size);
  m->forward(ids, st, models::LogitsMode::kAll, out.data());
  return out;
}

class Repack : public ::testing::TestWithParam<std::string> {};

TEST_P(Repack, PermutedCheckpointGivesIdenticalLogits) {
  const std::string src = GetParam() == "demo" ? std::string(SPOOL_DEFAULT_MODEL_DIR) : spool::testing::data_dir() + "/models/" + GetParam();
  io::Checkpoint ck = models::open_checkpoint(src);
  const int L = static_cast<int>(ck.config().get_int("num_hidden_layers"));
  const int E = static_cast<int>(ck.config().has("num_experts") ? ck.config().get_int("num_experts") : ck.config().get_int("num_local_experts"));
  std::mt19937 rng(7);
  std::vector<std::vector<int>> perm(L);
  for (auto& p : perm) {
    for (int e = 0; e < E; ++e) p.push_back(e);
    std::shuffle(p.begin(), p.end(), rng);
  }
  const std::string out = ::testing::TempDir() + "/repack_" + GetParam();
  std::filesystem::remove_all(out);
  repack(ck, perm, out, nullptr);
  io::Checkpoint rp = models::open_checkpoint(out);
  // Expert e of the output is expert perm[e] of the input.
  for (int l = 0; l < L; ++l) {
    if (!rp.has_expert(l, 0, io::ExpertProj::kGate)) continue;
    for (int e = 0; e < E; ++e) {
      const auto& a = rp.expert(l, e, io::ExpertProj::kDown);
      const auto& b = ck.expert(l, perm[l][e], io::ExpertProj::kDown);
      ASSERT_EQ(std::memcmp(a.data, b.data, a.nbytes), 0);
    }
  }
  std::vector<int32_t> ids;
  for (int i = 0; i < 30; ++i) ids.push_back((i * 53 + 7) % 500);
  std::vector<float> a = logits_of(src, ids), b = logits_of(out, ids);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  EXPECT_THROW(repack(ck, perm, out, nullptr), Error);  // refuses a non-empty directory
}

// Experts of one layer stored in different formats (here expert 1's down_proj in bf16, the
// others f32; a calibrated conversion mixes q-types the same way): moving bytes between their
// slots would misplace every boundary, so repack refuses, naming the experts.
TEST(Repack, RefusesExpertsOfDifferentFormats) {
  const std::string src = spool::testing::data_dir() + "/models/qwen3_moe", mixed = ::testing::TempDir() + "/repack_mixed_src";
  std::filesystem::remove_all(mixed);
  std::filesystem::create_directories(mixed);
  for (const auto& f : std::filesystem::directory_iterator(src))
    if (f.path().extension() != ".safetensors") std::filesystem::copy_file(f.path(), mixed + "/" + f.path().filename().string());
  {
    const io::SafetensorsFile sh = io::SafetensorsFile::open(src + "/model.safetensors");
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<io::TensorToWrite> ts;
    for (const auto& t : sh.tensors()) {
      const uint8_t* d = sh.data(t);
      if (t.name == "model.layers.0.mlp.experts.1.down_proj.weight" && t.dtype == io::DType::F32) {
        std::vector<uint8_t> h(t.nbytes / 2);
        for (size_t i = 0; i < t.nbytes / 4; ++i) {
          uint32_t u;
          std::memcpy(&u, d + 4 * i, 4);
          const uint16_t b = static_cast<uint16_t>(u >> 16);
          std::memcpy(h.data() + 2 * i, &b, 2);
        }
        bytes.push_back(std::move(h));
        ts.push_back({t.name, io::DType::BF16, t.shape, nullptr});
      } else {
        bytes.emplace_back(d, d + t.nbytes);
        ts.push_back({t.name, t.dtype, t.shape, nullptr});
      }
    }
    ASSERT_EQ(ts.size(), bytes.size());
    for (size_t i = 0; i < ts.size(); ++i) ts[i].data = bytes[i].data();
    io::write_safetensors(mixed + "/model.safetensors", ts);
  }
  io::Checkpoint ck = models::open_checkpoint(mixed);
  ASSERT_EQ(ck.expert(0, 1, io::ExpertProj::kDown).dtype, io::DType::BF16) << "the fixture's expert tensor names changed";
  const int L = static_cast<int>(ck.config().get_int("num_hidden_layers"));
  const int E = static_cast<int>(ck.config().has("num_experts") ? ck.config().get_int("num_experts") : ck.config().get_int("num_local_experts"));
  std::vector<std::vector<int>> perm(L);
  for (auto& p : perm)
    for (int e = 0; e < E; ++e) p.push_back(e);
  const std::string out = ::testing::TempDir() + "/repack_mixed_out";
  std::filesystem::remove_all(out);
  repack(ck, perm, out, nullptr);  // the identity moves nothing: fine
  std::swap(perm[0][1], perm[0][2]);
  std::filesystem::remove_all(out);
  try {
    repack(ck, perm, out, nullptr);
    FAIL() << "experts of different formats were swapped";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("experts 1 and 2 of layer 0 are stored in different formats"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, Repack, ::testing::Values("demo", "qwen3_5_moe_vl_fused", "qwen3_moe", "qwen3_next"));

TEST(Calibrate, HotSetAndCoactivationOrder) {
  RoutingTrace t(1, 6);
  for (int i = 0; i < 10; ++i) t.record(0, std::vector<int>{4, 1});
  for (int i = 0; i < 5; ++i) t.record(0, std::vector<int>{2, 5});
  t.record(0, std::vector<int>{1, 2});
  auto hot = hot_set(t, 3 * 100, 100);
  ASSERT_EQ(hot.size(), 3u);
  EXPECT_EQ(hot[0], std::make_pair(0, 1));  // 11 uses
  EXPECT_EQ(hot[1], std::make_pair(0, 4));  // 10
  EXPECT_EQ(hot[2], std::make_pair(0, 2));  // 6
  auto order = coactivation_order(t);
  ASSERT_EQ(order[0].size(), 6u);
  EXPECT_EQ(order[0][0], 1);
  EXPECT_EQ(order[0][1], 4);  // most co-activated with 1
  std::vector<int> sorted = order[0];
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int>{0, 1, 2, 3, 4, 5}));
}

}  // namespace
}  // namespace spool::experts
