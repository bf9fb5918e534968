#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ops/vec.h"

namespace spool::ops {

namespace {
constexpr int64_t kQueryTile = 32;  // query rows (tokens x heads of one KV group) per task
}

// Per task: one KV head and a tile of queries of that head's group: scores against the
// transposed keys (SIMD over positions), causal mask + softmax per row, then P.V
// accumulated row by row with SIMD.
void attention(const float* q, int64_t T, int n_heads, const KVView& kv, int64_t pos0, float scale, float* out,
               ThreadPool* pool) {
  const int group = n_heads / kv.n_kv_heads;
  const int hd = kv.head_dim, vd = kv.v_dim;
  const int64_t rows_per_head = T * group;  // query rows of one KV head: (t, g)
  const int64_t tiles = (rows_per_head + kQueryTile - 1) / kQueryTile;
  auto task = [&](int64_t i, int) {
    const int kvh = static_cast<int>(i / tiles);
    const int64_t r0 = (i % tiles) * kQueryTile;
    const int64_t nr = std::min(kQueryTile, rows_per_head - r0);
    // Row r of the tile is query (t, g) with t = (r0 + r) / group, head kvh * group + g.
    const int64_t t_last = (r0 + nr - 1) / group;
    const int64_t n = pos0 + t_last + 1;  // keys any row of the tile may see
    thread_local std::vector<float> qs, sc, acc;
    qs.resize(nr * hd);
    sc.resize(nr * n);
    acc.assign(nr * vd, 0.0f);
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t t = (r0 + r) / group, g = (r0 + r) % group;
      std::memcpy(qs.data() + r * hd, q + (t * n_heads + kvh * group + g) * hd, hd * sizeof(float));
    }
    // sc[r, p] = q_r . k_p against the transposed keys of this head.
    scores_kt(qs.data(), hd, nr, kv.k + static_cast<int64_t>(kvh) * hd * kv.capacity, kv.capacity, n, hd, sc.data(), n);
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t visible = pos0 + (r0 + r) / group + 1;
      float* row = sc.data() + r * n;
      ops::scale(scale, row, visible);
      softmax_inplace(row, visible);
      std::fill(row + visible, row + n, 0.0f);
    }
    accumulate_rows(sc.data(), n, nr, kv.v + static_cast<int64_t>(kvh) * kv.capacity * vd, vd, n, vd, acc.data(), vd);
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t t = (r0 + r) / group, g = (r0 + r) % group;
      std::memcpy(out + (t * n_heads + kvh * group + g) * vd, acc.data() + r * vd, vd * sizeof(float));
    }
  };
  const int64_t tasks = static_cast<int64_t>(kv.n_kv_heads) * tiles;
  if (pool == nullptr || tasks == 1 || T * n_heads * (pos0 + T) * hd < (1 << 14)) {
    for (int64_t i = 0; i < tasks; ++i) task(i, 0);
  } else {
    pool->run(tasks, task);
  }
}

}  // namespace spool::ops
