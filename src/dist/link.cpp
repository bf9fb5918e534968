#include "dist/link.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "common/error.h"

namespace spool::dist {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

LinkMeasure measure_link(Comm& c, int reps, size_t bytes_per_rank) {
  if (reps < 1) fail("measure_link: reps must be >= 1 (got %d)", reps);
  if (bytes_per_rank < sizeof(float)) fail("measure_link: %zu bytes per rank is below one float", bytes_per_rank);
  LinkMeasure m;
  m.ranks = c.size();
  if (c.size() < 2) return m;
  const int R = c.size(), me = c.rank();
  // Latency: one row of 4 floats per rank (a decode step's exchange is a few rows of hidden_size).
  constexpr int64_t kSmall = 4;
  std::vector<float> small(static_cast<size_t>(R * kSmall), 1.0f);
  std::vector<double> t(static_cast<size_t>(reps));
  for (int i = 0; i < 5; ++i) c.allgather_rows_in_place(small.data(), me, 1, R, kSmall);
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_s();
    c.allgather_rows_in_place(small.data(), me, 1, R, kSmall);
    t[static_cast<size_t>(i)] = now_s() - t0;
  }
  std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
  const double lat = t[static_cast<size_t>(reps / 2)];
  // Bandwidth: one row of bytes_per_rank per rank, best of 3 after one unmeasured.
  // (at most 256 MiB of buffer on a rank however many ranks there are)
  const size_t per = std::min(bytes_per_rank, std::max<size_t>(sizeof(float), (size_t{256} << 20) / static_cast<size_t>(R)));
  const int64_t width = static_cast<int64_t>(per / sizeof(float));
  std::vector<float> big(static_cast<size_t>(R * width), 0.5f);
  double best = 1e300;
  for (int i = 0; i < 4; ++i) {
    const double t0 = now_s();
    c.allgather_rows_in_place(big.data(), me, 1, R, width);
    if (i > 0) best = std::min(best, now_s() - t0);
  }
  const double recv = static_cast<double>(R - 1) * static_cast<double>(width) * sizeof(float);
  double v[2] = {lat * 1e6, recv / std::max(best, 1e-12) / 1e9};
  c.broadcast(v, sizeof(v), 0);  // every rank reports rank 0's figures
  m.latency_us = v[0];
  m.gbps = v[1];
  return m;
}

}  // namespace spool::dist
