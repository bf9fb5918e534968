// Sampler: greedy, truncations, determinism, penalties, refusal of non-finite logits, the
// constrained-decoding mask.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "common/error.h"

namespace spool::engine {
namespace {

// Sampling from the whole softmax (temperature 1, no top-k / top-p / min-p truncation), seeded.
SamplingParams untruncated(uint64_t seed) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = seed;
  return p;
}

TEST(Sampler, GreedyIsArgmax) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 5);
  float l[5] = {0.1f, 3.0f, 2.9f, -1.0f, 0.0f};
  EXPECT_EQ(s.sample(l, {}, {}), 1);
}

TEST(Sampler, TopKOneIsGreedy) {
  SamplingParams p;
  p.temperature = 1.5f;
  p.top_k = 1;
  Sampler s(p, 4);
  for (int i = 0; i < 20; ++i) {
    float l[4] = {0.0f, 0.5f, 2.0f, 1.9f};
    EXPECT_EQ(s.sample(l, {}, {}), 2);
  }
}

TEST(Sampler, SameSeedSameTokens) {
  const SamplingParams p = untruncated(1234);
  std::vector<int32_t> a, b;
  Sampler s1(p, 50), s2(p, 50);
  for (int i = 0; i < 100; ++i) {
    std::vector<float> l1(50), l2(50);
    for (int j = 0; j < 50; ++j) l1[j] = l2[j] = std::sin(j * 0.7f + i);
    a.push_back(s1.sample(l1.data(), {}, {}));
    b.push_back(s2.sample(l2.data(), {}, {}));
  }
  EXPECT_EQ(a, b);
  std::map<int32_t, int> distinct;
  for (int32_t x : a) ++distinct[x];
  EXPECT_GT(distinct.size(), 5u);  // it actually samples
}

TEST(Sampler, TopPAndMinPTruncate) {
  // probs ~ [0.6, 0.3, 0.1*...]: top_p 0.5 keeps only the best.
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 0.5f;
  p.min_p = 0.0f;
  Sampler s(p, 3);
  for (int i = 0; i < 50; ++i) {
    float l[3] = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
    EXPECT_EQ(s.sample(l, {}, {}), 0);
  }
  p.top_p = 1.0f;
  p.min_p = 0.4f;  // threshold 0.24: keeps tokens 0 and 1
  Sampler s2(p, 3);
  for (int i = 0; i < 200; ++i) {
    float l[3] = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
    EXPECT_NE(s2.sample(l, {}, {}), 2);
  }
}

TEST(Sampler, RepetitionAndPresencePenalties) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  Sampler s(p, 3);
  float l[3] = {1.0f, 0.9f, -1.0f};
  std::vector<int32_t> ctx = {0};
  EXPECT_EQ(s.sample(l, ctx, {}), 1);  // 1.0 / 2 < 0.9
  p.repetition_penalty = 1.0f;
  p.presence_penalty = 0.5f;
  Sampler s2(p, 3);
  float l2[3] = {1.0f, 0.9f, -1.0f};
  std::vector<int32_t> gen = {0};
  EXPECT_EQ(s2.sample(l2, gen, gen), 1);
}

// Masked tokens are never chosen, greedy or sampled with every truncation off, however likely;
// the allowed ones keep their relative frequencies; an all-zero mask is an error.
TEST(Sampler, MaskExcludesTokens) {
  const int64_t V = 70;  // two mask words
  uint64_t mask[2] = {0, 0};
  auto allow = [&](int id) { mask[id >> 6] |= uint64_t{1} << (id & 63); };
  allow(3);
  allow(65);
  SamplingParams g;
  g.temperature = 0;
  Sampler greedy(g, V);
  std::vector<float> l(V, 0.0f);
  l[10] = 9.0f;
  l[3] = 1.0f;
  EXPECT_EQ(greedy.sample(std::vector<float>(l).data(), {}, {}, mask), 3);
  EXPECT_EQ(greedy.sample(std::vector<float>(l).data(), {}, {}), 10);  // no mask: argmax
  const SamplingParams p = untruncated(5);
  Sampler s(p, V);
  std::map<int, int> counts;
  for (int i = 0; i < 4000; ++i) {
    std::vector<float> x(l);
    x[65] = 1.0f + std::log(3.0f);  // three times as likely as token 3
    ++counts[s.sample(x.data(), {}, {}, mask)];
  }
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_NEAR(counts[65] / 4000.0, 0.75, 0.03);
  uint64_t none[2] = {0, 0};
  EXPECT_THROW(s.sample(std::vector<float>(l).data(), {}, {}, none), Error);
}

TEST(Sampler, RefusesNonFiniteLogits) {
  SamplingParams p;
  Sampler s(p, 3);
  float l[3] = {0.0f, NAN, 1.0f};
  EXPECT_THROW(s.sample(l, {}, {}), Error);
  float l2[3] = {0.0f, INFINITY, 1.0f};
  EXPECT_THROW(s.sample(l2, {}, {}), Error);
}

TEST(Sampler, ValidatesParameters) {
  SamplingParams p;
  p.temperature = -1;
  EXPECT_THROW(p.validate(), UsageError);
  p = {};
  p.top_p = 0;
  EXPECT_THROW(p.validate(), UsageError);
  p = {};
  p.top_k = -3;
  EXPECT_THROW(p.validate(), UsageError);
  p = {};
  p.repetition_penalty = 0;
  EXPECT_THROW(p.validate(), UsageError);
  p = {};
  EXPECT_NO_THROW(p.validate());
}

}  // namespace
}  // namespace spool::engine
