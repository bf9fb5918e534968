#include "ops/mla.h"

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "ops/kv_kernels.h"
#include "ops/vec.h"

namespace spool::ops {

namespace {
constexpr int64_t kRowTile = 16;  // query rows (token, head) per task
}

void mla_attention(const float* q, int64_t T, int n_heads, const KvCache& kv, int64_t pos0, float scale, int dv, float* out,
                   ThreadPool* pool) {
  if (!kv.keys_only() || kv.n_kv_heads() != 1) fail("mla_attention: the cache must be a keys-only latent cache of one head");
  kv.settle();  // once, before the pool's threads read the storage
  const int D = kv.head_dim();
  if (dv <= 0 || dv > D) fail("mla_attention: value width %d outside (0, %d]", dv, D);
  if (pos0 + T > kv.capacity()) fail("mla_attention: positions up to %lld beyond the cache's %lld", (long long)(pos0 + T), (long long)kv.capacity());
  const int64_t cap = kv.capacity();
  const int64_t rows = T * n_heads;  // row r = (t, h), t = r / n_heads
  const int64_t tiles = (rows + kRowTile - 1) / kRowTile;
  auto task = [&](int64_t i, int) {
    const int64_t r0 = i * kRowTile, nr = std::min(kRowTile, rows - r0);
    const int64_t n = pos0 + (r0 + nr - 1) / n_heads + 1;  // keys any row of the tile may see
    thread_local std::vector<float> sc, krow;
    sc.resize(nr * n);
    const float* qt = q + r0 * D;
    switch (kv.type()) {
      case KvType::kF32: scores_kt(qt, D, nr, reinterpret_cast<const float*>(kv.k_data()), cap, n, D, sc.data(), n); break;
      case KvType::kF16: scores_kt_f16(qt, D, nr, reinterpret_cast<const uint16_t*>(kv.k_data()), cap, n, D, sc.data(), n); break;
      case KvType::kI8:
        scores_kt_i8(qt, D, nr, reinterpret_cast<const int8_t*>(kv.k_data()), kv.k_scales(), cap, kv.group_dim(), n, D, sc.data(), n);
        break;
    }
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t visible = pos0 + (r0 + r) / n_heads + 1;
      float* row = sc.data() + r * n;
      ops::scale(scale, row, visible);
      softmax_inplace(row, visible);
      std::fill(row + visible, row + n, 0.0f);
    }
    // out[r, d] = sum_p P[r, p] * key[d][p]: key rows are contiguous over positions.
    krow.resize(n);
    for (int d = 0; d < dv; ++d) {
      const float* k;
      if (kv.type() == KvType::kF32) {
        k = reinterpret_cast<const float*>(kv.k_data()) + static_cast<int64_t>(d) * cap;
      } else {
        for (int64_t p = 0; p < n; ++p) krow[p] = kv.key(0, p, d);
        k = krow.data();
      }
      for (int64_t r = 0; r < nr; ++r) out[(r0 + r) * dv + d] = dot(sc.data() + r * n, k, n);
    }
  };
  if (pool == nullptr || tiles == 1 || rows * (pos0 + T) * D < (1 << 14)) {
    for (int64_t i = 0; i < tiles; ++i) task(i, 0);
  } else {
    pool->run(tiles, task);
  }
}

}  // namespace spool::ops
