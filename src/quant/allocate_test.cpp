// The --target-bpw allocator: the greedy choice is the optimum where the greedy is provably
// optimal (concave gains in equal byte steps) and never exceeds its budget; measured errors fall
// with the bits; on a real conversion the allocation's byte count is the file's, the size stays
// within the target, and more bits never raise the estimated loss.
#include "quant/allocate.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "models/family.h"
#include "quant/convert.h"
#include "quant/hadamard.h"
#include "support/golden.h"

namespace spool::quant {
namespace {

using ops::QType;

AllocSlot slot(std::vector<uint64_t> bytes, std::vector<double> err, double weight = 1.0) {
  AllocSlot s;
  s.weight = weight;
  s.bytes = std::move(bytes);
  s.rel_err = std::move(err);
  s.candidates.resize(s.bytes.size());
  return s;
}

double loss(const std::vector<AllocSlot>& slots) {
  double l = 0;
  for (const AllocSlot& s : slots) l += s.weight * s.rel_err[s.chosen];
  return l;
}

// Brute force over every combination within the budget.
double best_loss(const std::vector<AllocSlot>& slots, uint64_t budget) {
  double best = 1e300;
  std::function<void(size_t, uint64_t, double)> go = [&](size_t i, uint64_t used, double l) {
    if (used > budget) return;
    if (i == slots.size()) {
      best = std::min(best, l);
      return;
    }
    for (size_t k = 0; k < slots[i].bytes.size(); ++k)
      go(i + 1, used + slots[i].bytes[k], l + slots[i].weight * slots[i].rel_err[k]);
  };
  go(0, 0, 0.0);
  return best;
}

// Candidates 100 bytes apart with convex losses: the greedy on marginal gains is optimal for
// every budget that is a multiple of the step, so it must find the brute-force optimum.
TEST(Allocate, GreedyFindsTheOptimumOnConvexSteps) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.05, 0.9);
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<AllocSlot> slots;
    for (int s = 0; s < 4; ++s) {
      std::vector<uint64_t> b;
      std::vector<double> e;
      std::vector<double> drops(4);
      for (double& d : drops) d = u(rng);
      std::sort(drops.rbegin(), drops.rend());  // shrinking drops: convex in bytes
      double err = 4.0;
      for (int k = 0; k < 5; ++k) {
        b.push_back(100 * (k + 1));
        e.push_back(err);
        if (k < 4) err -= drops[k];
      }
      // Shuffle the candidate order: choose() must not rely on it.
      std::vector<size_t> p = {0, 1, 2, 3, 4};
      std::shuffle(p.begin(), p.end(), rng);
      std::vector<uint64_t> b2;
      std::vector<double> e2;
      for (size_t i : p) b2.push_back(b[i]), e2.push_back(e[i]);
      slots.push_back(slot(b2, e2, 0.5 + s));
    }
    for (uint64_t budget = 400; budget <= 2000; budget += 100) {
      std::vector<AllocSlot> got = slots;
      const uint64_t used = choose(&got, budget);
      EXPECT_LE(used, budget);
      uint64_t sum = 0;
      for (const AllocSlot& s : got) sum += s.bytes[s.chosen];
      EXPECT_EQ(used, sum);
      EXPECT_NEAR(loss(got), best_loss(slots, budget), 1e-12) << "trial " << trial << " budget " << budget;
    }
  }
}

// Non-convex candidates and uneven sizes: never over budget, never worse than the cheapest
// choice, never better than the brute-force optimum.
TEST(Allocate, StaysWithinBudgetOnAnyCandidates) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint64_t> bytes(10, 500);
  std::uniform_real_distribution<double> err(0.0, 1.0);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<AllocSlot> slots;
    uint64_t min_total = 0;
    double cheapest = 0;
    for (int s = 0; s < 4; ++s) {
      std::vector<uint64_t> b;
      std::vector<double> e;
      for (int k = 0; k < 4; ++k) b.push_back(bytes(rng)), e.push_back(err(rng));
      const size_t lo = std::min_element(b.begin(), b.end()) - b.begin();
      min_total += b[lo];
      cheapest += e[lo];
      slots.push_back(slot(b, e));
    }
    const uint64_t budget = min_total + bytes(rng) * 2;
    std::vector<AllocSlot> got = slots;
    EXPECT_LE(choose(&got, budget), budget);
    const double opt = best_loss(slots, budget);
    EXPECT_GE(loss(got), opt - 1e-12);
    EXPECT_LE(loss(got), cheapest) << trial;
  }
  std::vector<AllocSlot> s = {slot({100, 200}, {1.0, 0.5})};
  EXPECT_THROW(choose(&s, 99), Error);
}

TEST(Allocate, ErrorsFallWithTheBits) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.f, 0.02f);
  const int64_t cols = 256;
  std::vector<float> w(64 * cols);
  for (float& x : w) x = n(rng);
  const std::vector<int8_t> signs = rotation_signs(42, "t", cols);
  double prev = 1e9;
  for (const ClassSpec& s : alloc_candidates(cols)) {
    const double e = sample_error(w, cols, s, signs.data(), QuantOptions{});
    if (s.group == 64 || s.keep) {  // one group size: strictly better with every type up the list
      EXPECT_LT(e, prev) << s.describe();
      prev = e;
    }
    if (s.keep) {
      EXPECT_LT(e, 1e-5);
    }
    if (!s.keep && s.type == QType::kQ4 && s.group == 64) EXPECT_NEAR(e, 0.0075, 0.0015);  // ~Lloyd-Max 4-bit on N(0, 1) with fp16 group scales
  }
  EXPECT_EQ(sample_error(std::vector<float>(cols, 0.f), cols, ClassSpec{false, QType::kQ4, 64}, nullptr, QuantOptions{}), 0.0);
  // Narrow matrices: groups narrowed, no duplicates.
  for (const ClassSpec& s : alloc_candidates(96))
    if (!s.keep) EXPECT_EQ(96 % s.group, 0) << s.describe();
  EXPECT_EQ(alloc_candidates(256).size(), 17u);
}

ConvertResult convert_to(const std::string& model, const std::string& out, double bpw) {
  ConvertOptions o;
  o.in_dir = model;
  o.out_dir = out;
  o.rules = &models::checkpoint_rules();
  o.threads = 2;
  o.target_bpw = bpw;
  o.expert_usage = 0.25;
  std::filesystem::remove_all(out);
  return convert(o, nullptr);
}

TEST(Allocate, ConversionMeetsTheTargetExactly) {
  const std::string model = spool::testing::data_dir() + "/models/qwen3_5_moe_text";
  double prev = 1e9;
  for (double bpw : {3.0, 4.0, 4.5, 6.0, 9.0}) {
    const std::string out = ::testing::TempDir() + "/alloc_" + std::to_string(bpw);
    const ConvertResult r = convert_to(model, out, bpw);
    SCOPED_TRACE(bpw);
    EXPECT_EQ(r.data_bytes, r.allocation.bytes);  // the allocator's accounting is the file's
    EXPECT_LE(r.bpw(), bpw);
    EXPECT_GT(r.bpw(), bpw - 0.5);                // the budget is spent
    EXPECT_LE(r.allocation.estimated_loss, prev);
    prev = r.allocation.estimated_loss;
    const nlohmann::json cfg = nlohmann::json::parse(std::ifstream(out + "/config.json"));
    EXPECT_EQ(cfg["quantization"]["tensors"].size(), r.allocation.slots.size());
    EXPECT_EQ(cfg["quantization"]["classes"]["dense"]["bits"], "per tensor");
  }
  EXPECT_THROW(convert_to(model, ::testing::TempDir() + "/alloc_low", 1.0), Error);
  EXPECT_THROW(convert_to(model, ::testing::TempDir() + "/alloc_bad", 17.0), UsageError);
}

}  // namespace
}  // namespace spool::quant
