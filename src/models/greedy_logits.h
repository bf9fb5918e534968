// Test helper shared by the model tests that compare two runs of a model (CUDA against CPU,
// expert providers, communicators): the logits of a prompt and of n greedy steps after it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "models/model.h"

namespace spool::models {

/// Logits [V] of `ids` (the last position), then of each of `n` greedy steps after it (the arg-max
/// token fed back), concatenated: (n + 1) x V floats. Runs on a fresh state of `m`.
inline std::vector<float> greedy_logits(Model& m, const std::vector<int32_t>& ids, int n) {
  State st = m.new_state();
  const int64_t V = m.spec().vocab_size;
  std::vector<float> logits(static_cast<size_t>(V)), all;
  m.forward(ids, st, LogitsMode::kLast, logits.data());
  for (int i = 0; i < n; ++i) {
    all.insert(all.end(), logits.begin(), logits.end());
    const int32_t t = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    m.forward(std::span<const int32_t>(&t, 1), st, LogitsMode::kLast, logits.data());
  }
  all.insert(all.end(), logits.begin(), logits.end());
  return all;
}

}  // namespace spool::models
