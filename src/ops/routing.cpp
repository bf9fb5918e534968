#include "ops/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace spool::ops {

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

}  // namespace spool::ops
