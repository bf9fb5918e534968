#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace spool::ops {

void attention(const float* q, int64_t T, int n_heads, const KVView& kv, int64_t pos0, float scale, float* out,
               ThreadPool* pool) {
  const int group = n_heads / kv.n_kv_heads;
  const int hd = kv.head_dim, vd = kv.v_dim;
  auto task = [&](int64_t i, int) {
    const int64_t t = i / n_heads;
    const int h = static_cast<int>(i % n_heads);
    const int kvh = h / group;
    const int64_t n = pos0 + t + 1;  // keys visible to this query
    thread_local std::vector<float> scores;
    if (scores.size() < static_cast<size_t>(n)) scores.resize(n);
    const float* qh = q + (t * n_heads + h) * hd;
    const float* kb = kv.k + static_cast<int64_t>(kvh) * kv.capacity * hd;
    const float* vb = kv.v + static_cast<int64_t>(kvh) * kv.capacity * vd;
    float m = -INFINITY;
    for (int64_t p = 0; p < n; ++p) {
      scores[p] = dot(qh, kb + p * hd, hd) * scale;
      m = std::max(m, scores[p]);
    }
    double sum = 0.0;
    for (int64_t p = 0; p < n; ++p) {
      scores[p] = std::exp(scores[p] - m);
      sum += scores[p];
    }
    const float inv = static_cast<float>(1.0 / sum);
    float* o = out + (t * n_heads + h) * vd;
    std::fill(o, o + vd, 0.0f);
    for (int64_t p = 0; p < n; ++p) {
      const float w = scores[p] * inv;
      const float* vp = vb + p * vd;
      for (int d = 0; d < vd; ++d) o[d] += w * vp[d];
    }
  };
  const int64_t tasks = T * n_heads;
  if (pool == nullptr || tasks * (pos0 + T) * hd < (1 << 14)) {
    for (int64_t i = 0; i < tasks; ++i) task(i, 0);
  } else {
    pool->run(tasks, task);
  }
}

}  // namespace spool::ops
