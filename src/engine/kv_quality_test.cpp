// KV cache quantization quality on the demo model: the f16 cache generates 256 tokens greedily
// after a prompt; the same tokens are then fed to an int8 cache and an f16 cache, and the mean
// KL(p_f16 || p_int8) of the next-token distributions over the 256 positions is printed (the
// number docs/quantization.md reports under "KV cache") and bounded. The f32 cache is the exact reference for both.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "common/files.h"
#include "engine/loader.h"

namespace spool::engine {
namespace {

// log_softmax of logits [V] in double.
std::vector<double> log_softmax(const std::vector<float>& x) {
  double m = -INFINITY, s = 0;
  for (float v : x) m = std::max(m, static_cast<double>(v));
  for (float v : x) s += std::exp(v - m);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] - m - std::log(s);
  return out;
}

double kl(const std::vector<float>& p_logits, const std::vector<float>& q_logits) {
  const auto lp = log_softmax(p_logits), lq = log_softmax(q_logits);
  double k = 0;
  for (size_t i = 0; i < lp.size(); ++i) k += std::exp(lp[i]) * (lp[i] - lq[i]);
  return k;
}

TEST(KvQuality, Int8AgainstF16MeanKlOver256GeneratedTokens) {
  LoadOptions o;
  o.model_dir = SPOOL_DEFAULT_MODEL_DIR;
  o.threads = 2;
  LoadedModel l = load(o);
  models::Model& m = *l.model;
  const int64_t V = m.spec().vocab_size;
  std::string text = read_whole_file(std::string(SPOOL_TEST_DATA_DIR) + "/corpus/dev.txt").substr(0, 2000);
  std::vector<int32_t> prompt = l.tok->encode(text);
  prompt.resize(std::min<size_t>(prompt.size(), 256));
  auto state_of = [&](ops::KvType t) {
    m.set_kv_type(t);
    return m.new_state();
  };
  models::State s16 = state_of(ops::KvType::kF16), s8 = state_of(ops::KvType::kI8), s32 = state_of(ops::KvType::kF32);
  std::vector<float> l16(V), l8(V), l32(V);
  m.forward(prompt, s16, models::LogitsMode::kLast, l16.data());
  m.forward(prompt, s8, models::LogitsMode::kLast, l8.data());
  m.forward(prompt, s32, models::LogitsMode::kLast, l32.data());
  double sum8 = 0, max8 = 0, sum16 = 0;
  const int kTokens = 256;
  for (int i = 0; i < kTokens; ++i) {
    const double k8 = kl(l16, l8);
    sum8 += k8;
    max8 = std::max(max8, k8);
    sum16 += kl(l32, l16);
    // The f16 cache's greedy choice drives all three.
    const int32_t next = static_cast<int32_t>(std::max_element(l16.begin(), l16.end()) - l16.begin());
    m.forward(std::span<const int32_t>(&next, 1), s16, models::LogitsMode::kLast, l16.data());
    m.forward(std::span<const int32_t>(&next, 1), s8, models::LogitsMode::kLast, l8.data());
    m.forward(std::span<const int32_t>(&next, 1), s32, models::LogitsMode::kLast, l32.data());
  }
  const double mean8 = sum8 / kTokens, mean16 = sum16 / kTokens;
  std::printf("kv-bits 8 vs 16: mean KL %.3e nats (max %.3e) over %d generated tokens after a %zu-token prompt; "
              "kv-bits 16 vs 32: mean KL %.3e\n",
              mean8, max8, kTokens, prompt.size(), mean16);
  RecordProperty("mean_kl_int8_vs_f16", std::to_string(mean8));
  EXPECT_GT(mean8, 0.0);   // int8 does change the cache
  EXPECT_LT(mean8, 1e-2);  // but not the distributions noticeably
  EXPECT_LT(mean16, mean8);
}

}  // namespace
}  // namespace spool::engine
