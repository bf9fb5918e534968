#include "models/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "models/bind.h"
#include "ops/vec.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace spool::models {

void route_top_k(float* logits, int n_experts, int k, bool renormalize, int* ids, float* weights, float* margin) {
  // Softmax numerators e_i = exp(l_i - max), each computed on its own; everything below
  // depends on the logits as a set, not on expert numbering (so a repacked checkpoint with
  // permuted experts and router rows routes and weighs bit-identically).
  const float m = *std::max_element(logits, logits + n_experts);
  for (int i = 0; i < n_experts; ++i) logits[i] = std::exp(logits[i] - m);
  int order[1024];
  std::vector<int> big;
  int* idx = order;
  if (n_experts > 1024) {
    big.resize(n_experts);
    idx = big.data();
  }
  std::iota(idx, idx + n_experts, 0);
  // Best k (k + 1 when the margin is wanted) by (probability desc, id asc).
  const int sorted = margin != nullptr && k < n_experts ? k + 1 : k;
  std::partial_sort(idx, idx + sorted, idx + n_experts, [&](int a, int b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  double z = 0.0;
  if (margin != nullptr) {
    std::vector<float> e(logits, logits + n_experts);
    std::sort(e.begin(), e.end());
    double full = 0.0;
    for (float x : e) full += x;
    *margin = k < n_experts ? static_cast<float>((logits[idx[k - 1]] - logits[idx[k]]) / full) : 1.0f;
  }
  if (renormalize) {
    for (int i = 0; i < k; ++i) z += logits[idx[i]];  // rank order
  } else {
    // Full normaliser summed in ascending order of value: independent of numbering.
    std::vector<float> e(logits, logits + n_experts);
    std::sort(e.begin(), e.end());
    for (float x : e) z += x;
  }
  for (int i = 0; i < k; ++i) {
    ids[i] = idx[i];
    weights[i] = static_cast<float>(logits[idx[i]] / z);
  }
}

void MoeBlock::bind(const io::Checkpoint& ck, const std::string& prefix, const ModelSpec& spec) {
  m_ = spec.moe;
  hidden_ = spec.hidden_size;
  router_ = bind_matrix(ck, prefix + "gate.weight", m_.n_experts, hidden_);
  if (m_.shared_intermediate > 0) {
    shared_.bind(ck, prefix + "shared_expert.", hidden_, m_.shared_intermediate);
    if (m_.shared_expert_gate) shared_gate_ = bind_f32(ck, prefix + "shared_expert_gate.weight", {1, hidden_});
  }
}

void MoeBlock::forward(const float* x, int64_t T, int layer, int top_k, experts::ExpertProvider& provider,
                       const RouteObserver& observer, const MarginObserver& margins, float* out, ops::ThreadPool* pool) {
  const int E = m_.n_experts, K = top_k, H = hidden_, I = m_.intermediate;
  logits_.resize(T * E);
  ids_.resize(T * K);
  weights_.resize(T * K);
  ops::matmul(router_, x, T, logits_.data(), pool);  // [T, E]
  for (int64_t t = 0; t < T; ++t) {
    float margin = 0.0f;
    route_top_k(logits_.data() + t * E, E, K, m_.norm_topk_prob, ids_.data() + t * K, weights_.data() + t * K,
                margins ? &margin : nullptr);
    if (margins) margins(layer, t, margin);
    if (observer)
      observer(layer, t, std::span<const int>(ids_.data() + t * K, K), std::span<const float>(weights_.data() + t * K, K));
  }

  // Group (token, slot) pairs by expert; experts in ascending id order.
  std::vector<int> count(E, 0);
  for (int64_t i = 0; i < T * K; ++i) ++count[ids_[i]];
  std::vector<int> active;
  std::vector<int64_t> first(E + 1, 0);  // row offset of each expert's block in ybuf
  for (int e = 0; e < E; ++e) {
    first[e + 1] = first[e] + count[e];
    if (count[e] > 0) active.push_back(e);
  }
  std::vector<int64_t> rows(T * K);  // rows[r] = token*K + slot, grouped by expert
  {
    std::vector<int64_t> fill(first.begin(), first.end() - 1);
    for (int64_t t = 0; t < T; ++t)
      for (int s = 0; s < K; ++s) rows[fill[ids_[t * K + s]]++] = t * K + s;
  }
  ybuf_.resize(T * K * H);
  // Experts are acquired in batches the provider can hold at once (a streaming cache may be
  // smaller than a prefill chunk's expert set); each batch is released before the next.
  const size_t batch = static_cast<size_t>(std::max(1, provider.max_batch()));
  std::vector<experts::ExpertWeights> w(std::min(batch, active.size()));
  for (size_t b0 = 0; b0 < active.size(); b0 += batch) {
    const size_t nb = std::min(batch, active.size() - b0);
    provider.acquire(layer, std::span<const int>(active.data() + b0, nb), std::span<experts::ExpertWeights>(w.data(), nb));
    auto run_expert = [&](int64_t bi, int) {
      const int e = active[b0 + bi];
      const int64_t n = count[e], r0 = first[e];
      thread_local std::vector<float> xe, g, u;
      xe.resize(n * H);
      g.resize(n * I);
      u.resize(n * I);
      for (int64_t j = 0; j < n; ++j) std::copy_n(x + (rows[r0 + j] / K) * H, H, xe.data() + j * H);
      ops::matmul_rows_pair(w[bi].gate, g.data(), w[bi].up, u.data(), xe.data(), n);  // [n, I] each
      ops::swiglu(g.data(), u.data(), n * I, g.data());
      ops::matmul_rows(w[bi].down, g.data(), n, ybuf_.data() + r0 * H, H, 0, H);  // [n, H]
    };
    try {
      if (pool == nullptr) {
        for (size_t i = 0; i < nb; ++i) run_expert(static_cast<int64_t>(i), 0);
      } else {
        pool->run(static_cast<int64_t>(nb), run_expert);
      }
    } catch (...) {
      provider.release(layer);
      throw;
    }
    provider.release(layer);
  }

  // out[t] = sum over the token's experts in routing-rank order (best first) of w * y.
  // (HF adds in ascending expert id; rank order differs only by float rounding and makes
  // the result independent of how experts are numbered, so a repacked checkpoint whose
  // experts and router rows are permuted together gives bit-identical output.)
  std::vector<int64_t> row_of(T * K);
  for (int64_t j = 0; j < T * K; ++j) row_of[rows[j]] = j;
  std::fill(out, out + T * H, 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int s = 0; s < K; ++s) ops::axpy(weights_[t * K + s], ybuf_.data() + row_of[t * K + s] * H, H, out + t * H);
  if (shared_.bound()) {
    shared_out_.resize(T * H);
    shared_.forward(x, T, shared_out_.data(), pool);
    for (int64_t t = 0; t < T; ++t) {
      const float gate = shared_gate_.empty() ? 1.0f : ops::sigmoid(ops::dot(x + t * H, shared_gate_.data(), H));
      ops::axpy(gate, shared_out_.data() + t * H, H, out + t * H);
    }
  }
}

}  // namespace spool::models
