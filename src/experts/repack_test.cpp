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
