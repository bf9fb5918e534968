// Exact next-layer prefetch (Model::set_next_layer_prefetch + StreamingExperts::hint): the
// outputs are bit-identical to resident experts at several cache budgets and guess counts, one
// sequence and two decoded together, and the staging area is used (its reads become the misses
// the next layer would have read).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "experts/streaming.h"
#include "models/family.h"
#include "models/model.h"
#include "support/golden.h"

namespace spool::experts {
namespace {

struct Loaded {
  std::shared_ptr<io::Checkpoint> ckpt;
  std::unique_ptr<ops::ThreadPool> pool;
  std::unique_ptr<models::Model> model;
  std::vector<bool> moe_layers;
};

Loaded load(const std::string& dir) {
  Loaded s;
  s.ckpt = std::make_shared<io::Checkpoint>(models::open_checkpoint(dir));
  s.pool = std::make_unique<ops::ThreadPool>(2);
  s.model = models::load_model(s.ckpt, s.pool.get());
  for (auto f : s.model->spec().ffns) s.moe_layers.push_back(f == models::FfnKind::kMoE);
  return s;
}

// Logits of a chunked prefill of `prompt` then `decode` greedy steps, for `n_seqs` sequences
// decoded together (sequence q's prompt shifted by q), concatenated.
std::vector<float> run(models::Model& m, const std::vector<int32_t>& prompt, int64_t step, int decode, int n_seqs) {
  const int64_t V = m.spec().vocab_size;
  std::vector<models::State> st;
  for (int q = 0; q < n_seqs; ++q) st.push_back(m.new_state());
  std::vector<float> out;
  std::vector<std::vector<float>> last(n_seqs, std::vector<float>(V));
  for (int q = 0; q < n_seqs; ++q) {
    std::vector<int32_t> p(prompt);
    for (auto& x : p) x = static_cast<int32_t>((x + q) % V);
    for (size_t i = 0; i < p.size(); i += step) {
      const size_t n = std::min<size_t>(step, p.size() - i);
      m.forward(std::span<const int32_t>(p.data() + i, n), st[q], models::LogitsMode::kLast, last[q].data());
    }
    out.insert(out.end(), last[q].begin(), last[q].end());
  }
  for (int d = 0; d < decode; ++d) {
    std::vector<int32_t> next(n_seqs);
    std::vector<models::SeqStep> steps;
    for (int q = 0; q < n_seqs; ++q) next[q] = spool::testing::argmax(last[q].data(), V);
    for (int q = 0; q < n_seqs; ++q)
      steps.push_back({std::span<const int32_t>(&next[q], 1), &st[q], models::LogitsMode::kLast, last[q].data()});
    m.forward_batch(steps);
    for (int q = 0; q < n_seqs; ++q) out.insert(out.end(), last[q].begin(), last[q].end());
  }
  return out;
}

TEST(NextLayerPrefetch, BitIdenticalAtSeveralBudgets) {
  Loaded s = load(SPOOL_DEFAULT_MODEL_DIR);  // the demo model: trained routing, 8 MoE layers of 64 experts top-8
  const auto& sp = s.model->spec();
  std::vector<int32_t> prompt;
  for (int i = 0; i < 24; ++i) prompt.push_back((i * 37 + 11) % static_cast<int>(sp.vocab_size));
  const io::ExpertStore store(*s.ckpt, s.moe_layers, sp.moe.n_experts, false);
  const uint64_t all = static_cast<uint64_t>(std::count(s.moe_layers.begin(), s.moe_layers.end(), true)) * sp.moe.n_experts;
  for (int n_seqs : {1, 2}) {
    const std::vector<float> want = run(*s.model, prompt, 8, 10, n_seqs);
    for (double frac : {0.1, 0.3}) {
      for (int m : {8, 16}) {
        StreamingOptions o;
        o.top_k = sp.moe.top_k;
        o.workers = 2;
        o.cache_budget_bytes = static_cast<uint64_t>(frac * static_cast<double>(all)) * store.slot_bytes();
        o.stage_slots = 2 * m;
        auto streaming = std::make_shared<StreamingExperts>(s.ckpt, s.moe_layers, sp.moe.n_experts, sp.hidden_size, sp.moe.intermediate, o);
        s.model->set_expert_provider(streaming);
        s.model->set_next_layer_prefetch(m);
        const std::vector<float> got = run(*s.model, prompt, 8, 10, n_seqs);
        s.model->set_next_layer_prefetch(0);
        s.model->set_expert_provider(nullptr);
        const std::string what = std::to_string(n_seqs) + " sequence(s), budget " + std::to_string(frac) + ", m " + std::to_string(m);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << what << ": logits differ";
        const StreamingStats st = streaming->stats();
        EXPECT_GT(st.staged, 0u) << what;
        EXPECT_GT(st.staged_used, 0u) << what;
        EXPECT_LE(st.staged_used, st.misses) << what;
      }
    }
  }
}

}  // namespace
}  // namespace spool::experts

