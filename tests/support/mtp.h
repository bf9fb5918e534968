// Test support for the multi-token-prediction head (models::Model::mtp_forward).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "models/model.h"

namespace spool::testing {

/// The head's logits [ids.size() - 1, vocab] for every position t of `ids` but the last (row t
/// predicts ids[t + 2]): the main model over ids[0..n-1) keeping its final-norm hidden rows, then
/// the head over ids[1..n) in `pieces` calls (its cache carried between them). Needs a model
/// loaded with its head (LoadOptions::mtp).
inline std::vector<float> head_logits(models::Model& m, const std::vector<int32_t>& ids, int pieces = 1) {
  const int64_t H = m.spec().hidden_size, V = m.spec().vocab_size, T = static_cast<int64_t>(ids.size()) - 1;
  models::State st = m.new_state();
  std::vector<float> hidden(T * H), logits(V), out(T * V);
  const models::SeqStep s{std::span<const int32_t>(ids.data(), T), &st, models::LogitsMode::kLast, logits.data(), hidden.data()};
  m.forward_batch(std::span<const models::SeqStep>(&s, 1));
  const int64_t chunk = (T + pieces - 1) / pieces;
  for (int64_t a = 0; a < T; a += chunk) {
    const int64_t n = std::min(chunk, T - a);
    models::MtpStep q;
    q.ids = std::span<const int32_t>(ids.data() + a + 1, n);
    q.hidden = hidden.data() + a * H;
    q.state = &st;
    q.pos0 = a;
    q.mode = models::LogitsMode::kAll;
    q.logits = out.data() + a * V;
    m.mtp_forward(q);
  }
  return out;
}

}  // namespace spool::testing
