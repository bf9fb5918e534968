#include "ops/backend.h"

#include "common/error.h"

namespace spool::ops {

const char* device_name(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

ExpertGroups group_by_expert(const int* ids, int64_t T, int K, int n_experts) {
  ExpertGroups g;
  g.T = T;
  g.K = K;
  const int64_t n = T * K;
  std::vector<int64_t> count(static_cast<size_t>(n_experts), 0);
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= n_experts) fail("routing chose expert %d, outside 0..%d", ids[i], n_experts - 1);
    ++count[ids[i]];
  }
  std::vector<int64_t> start(static_cast<size_t>(n_experts), 0);
  g.first.push_back(0);
  for (int e = 0; e < n_experts; ++e) {
    if (count[e] == 0) continue;
    start[e] = g.first.back();
    g.active.push_back(e);
    g.first.push_back(g.first.back() + count[e]);
  }
  g.rows.resize(n);
  g.row_of.resize(n);
  for (int64_t r = 0; r < n; ++r) {  // ascending r within each expert's block
    const int64_t j = start[ids[r]]++;
    g.rows[j] = r;
    g.row_of[r] = j;
  }
  return g;
}

}  // namespace spool::ops
