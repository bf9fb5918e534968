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

void route_grouped(const float* logits, int n_experts, int k, const RouterParams& r, int* ids, float* weights, float* margin) {
  const int E = n_experts;
  std::vector<float> sc(E), sel(E);
  if (r.sigmoid) {
    for (int i = 0; i < E; ++i) sc[i] = 1.0f / (1.0f + std::exp(-logits[i]));
  } else {
    const float m = *std::max_element(logits, logits + E);
    double z = 0.0;
    for (int i = 0; i < E; ++i) z += (sc[i] = std::exp(logits[i] - m));
    for (int i = 0; i < E; ++i) sc[i] = static_cast<float>(sc[i] / z);
  }
  for (int i = 0; i < E; ++i) sel[i] = sc[i] + (r.bias != nullptr ? r.bias[i] : 0.0f);
  const int G = std::max(1, r.n_group);
  if (G > 1 && r.topk_group < G && E % G == 0) {
    const int per = E / G;
    std::vector<float> gs(G);
    for (int g = 0; g < G; ++g) {
      const float* s = sel.data() + g * per;
      if (r.group_top2_sum) {
        float a = -INFINITY, b = -INFINITY;  // best, second best
        for (int i = 0; i < per; ++i) {
          if (s[i] > a) {
            b = a;
            a = s[i];
          } else if (s[i] > b) {
            b = s[i];
          }
        }
        gs[g] = per > 1 ? a + b : a;
      } else {
        gs[g] = *std::max_element(s, s + per);
      }
    }
    std::vector<int> go(G);
    std::iota(go.begin(), go.end(), 0);
    std::partial_sort(go.begin(), go.begin() + r.topk_group, go.end(),
                      [&](int a, int b) { return gs[a] != gs[b] ? gs[a] > gs[b] : a < b; });
    std::vector<char> keep(G, 0);
    for (int i = 0; i < r.topk_group; ++i) keep[go[i]] = 1;
    for (int i = 0; i < E; ++i)
      if (!keep[i / per]) sel[i] = r.mask_neg_inf ? -INFINITY : 0.0f;
  }
  std::vector<int> idx(E);
  std::iota(idx.begin(), idx.end(), 0);
  const int sorted = margin != nullptr && k < E ? k + 1 : k;
  std::partial_sort(idx.begin(), idx.begin() + sorted, idx.end(),
                    [&](int a, int b) { return sel[a] != sel[b] ? sel[a] > sel[b] : a < b; });
  if (margin != nullptr) *margin = k < E && std::isfinite(sel[idx[k]]) ? sel[idx[k - 1]] - sel[idx[k]] : 1.0f;
  double z = 0.0;
  for (int i = 0; i < k; ++i) z += sc[idx[i]];
  for (int i = 0; i < k; ++i) {
    ids[i] = idx[i];
    const float w = r.renormalize ? static_cast<float>(sc[idx[i]] / (z + 1e-20)) : sc[idx[i]];
    weights[i] = w * r.scaling;
  }
}

}  // namespace spool::ops
