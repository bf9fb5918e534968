#include "dist/expert_parallel.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace spool::dist {

namespace {
constexpr int64_t kStepMagic = 0x5350'4f4f'4c45'5031;  // "SPOOLEP1"
}

ExpertOwners::ExpertOwners(int n_experts, int ranks) : n_experts_(n_experts), ranks_(ranks) {
  if (ranks < 1) fail("expert owners: %d ranks", ranks);
  if (n_experts < ranks) fail("expert parallelism: %d routed experts cannot be split over %d ranks", n_experts, ranks);
}

ExpertOwners ExpertOwners::balanced(const std::vector<std::vector<double>>& load, int n_experts, int ranks) {
  ExpertOwners o(n_experts, ranks);
  const size_t E = static_cast<size_t>(n_experts);
  const int cap = (n_experts + ranks - 1) / ranks;
  bool any = false;
  o.by_layer_.resize(load.size());
  for (size_t l = 0; l < load.size(); ++l) {
    const std::vector<double>& c = load[l];
    if (c.empty()) continue;
    if (c.size() != E) fail("expert owners: layer %zu has loads of %zu experts, the model %d", l, c.size(), n_experts);
    for (size_t e = 0; e < E; ++e)
      if (!std::isfinite(c[e]) || c[e] < 0) fail("expert owners: layer %zu expert %zu has load %g (want a finite number >= 0)", l, e, c[e]);
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return c[static_cast<size_t>(a)] > c[static_cast<size_t>(b)]; });
    std::vector<double> sum(static_cast<size_t>(ranks), 0.0);
    std::vector<int> held(static_cast<size_t>(ranks), 0);
    std::vector<int>& own = o.by_layer_[l];
    own.assign(E, -1);
    for (int e : order) {
      int best = -1;
      for (int r = 0; r < ranks; ++r) {
        if (held[static_cast<size_t>(r)] >= cap) continue;
        if (best < 0 || sum[static_cast<size_t>(r)] < sum[static_cast<size_t>(best)]) best = r;
      }
      own[static_cast<size_t>(e)] = best;
      sum[static_cast<size_t>(best)] += c[static_cast<size_t>(e)];
      ++held[static_cast<size_t>(best)];
    }
    any = true;
  }
  if (!any) o.by_layer_.clear();
  return o;
}

std::vector<int> ExpertOwners::owned(int layer, int rank) const {
  std::vector<int> v;
  for (int e = 0; e < n_experts_; ++e)
    if (owner(layer, e) == rank) v.push_back(e);
  return v;
}

double ExpertOwners::max_load_share(int layer, std::span<const double> load) const {
  if (load.size() != static_cast<size_t>(n_experts_)) return 0;
  std::vector<double> sum(static_cast<size_t>(ranks_), 0.0);
  double total = 0;
  for (int e = 0; e < n_experts_; ++e) {
    sum[static_cast<size_t>(owner(layer, e))] += load[static_cast<size_t>(e)];
    total += load[static_cast<size_t>(e)];
  }
  return total > 0 ? *std::max_element(sum.begin(), sum.end()) / total : 0;
}

std::string ExpertOwners::describe() const {
  if (contiguous()) return "contiguous";
  size_t n = 0;
  for (const auto& l : by_layer_) n += l.empty() ? 0 : 1;
  return strfmt("balanced by load over %zu layer%s", n, n == 1 ? "" : "s");
}

std::array<int64_t, ExpertStep::kWords> ExpertStep::encode() const {
  return {kStepMagic, static_cast<int64_t>(op), layer, rows, top_k, hidden, lora_n, code};
}

ExpertStep ExpertStep::decode(const std::array<int64_t, kWords>& w) {
  if (w[0] != kStepMagic)
    fail("expert step: bad magic word %016llx (the ranks are out of step: do they run the same command?)", static_cast<unsigned long long>(w[0]));
  ExpertStep s;
  if (w[1] != static_cast<int64_t>(StepOp::kExperts) && w[1] != static_cast<int64_t>(StepOp::kExit))
    fail("expert step: unknown op %lld", static_cast<long long>(w[1]));
  s.op = static_cast<StepOp>(w[1]);
  s.layer = w[2];
  s.rows = w[3];
  s.top_k = w[4];
  s.hidden = w[5];
  s.lora_n = w[6];
  s.code = w[7];
  if (s.layer < 0 || s.rows < 0 || s.top_k < 0 || s.hidden < 0 || s.lora_n < 0)
    fail("expert step: a negative field (layer %lld, rows %lld, top_k %lld, hidden %lld, lora %lld)", (long long)s.layer, (long long)s.rows,
         (long long)s.top_k, (long long)s.hidden, (long long)s.lora_n);
  if (s.top_k > 1024 || s.lora_n > 1024 || s.hidden > (int64_t{1} << 20) || s.rows > (int64_t{1} << 24) ||
      s.rows * std::max(s.hidden, s.top_k) > (int64_t{1} << 31))
    fail("expert step: fields out of range (rows %lld, top_k %lld, hidden %lld, lora %lld)", (long long)s.rows, (long long)s.top_k,
         (long long)s.hidden, (long long)s.lora_n);
  return s;
}

}  // namespace spool::dist
