#include "experts/calibrate.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"

namespace spool::experts {

RoutingTrace::RoutingTrace(int n_layers, int n_experts)
    : n_layers_(n_layers),
      n_experts_(n_experts),
      counts_(static_cast<size_t>(n_layers) * n_experts, 0),
      coact_(static_cast<size_t>(n_layers) * n_experts * n_experts, 0) {}

void RoutingTrace::record(int layer, std::span<const int> experts) {
  ++events_;
  for (size_t i = 0; i < experts.size(); ++i) {
    ++counts_[idx(layer, experts[i])];
    for (size_t j = i + 1; j < experts.size(); ++j) {
      int a = std::min(experts[i], experts[j]), b = std::max(experts[i], experts[j]);
      ++coact_[(static_cast<size_t>(layer) * n_experts_ + a) * n_experts_ + b];
    }
  }
}

uint64_t RoutingTrace::coactivation(int layer, int a, int b) const {
  if (a > b) std::swap(a, b);
  return coact_[(static_cast<size_t>(layer) * n_experts_ + a) * n_experts_ + b];
}

uint64_t RoutingTrace::total_requests() const {
  uint64_t n = 0;
  for (auto c : counts_) n += c;
  return n;
}

std::vector<std::pair<int, int>> hot_set(const RoutingTrace& t, uint64_t budget_bytes, uint64_t expert_bytes) {
  std::vector<std::pair<int, int>> all;
  for (int l = 0; l < t.n_layers(); ++l)
    for (int e = 0; e < t.n_experts(); ++e)
      if (t.count(l, e) > 0) all.emplace_back(l, e);
  std::stable_sort(all.begin(), all.end(), [&](auto a, auto b) { return t.count(a.first, a.second) > t.count(b.first, b.second); });
  const size_t n = expert_bytes ? static_cast<size_t>(budget_bytes / expert_bytes) : 0;
  if (all.size() > n) all.resize(n);
  return all;
}

std::vector<std::vector<int>> coactivation_order(const RoutingTrace& t) {
  const int E = t.n_experts();
  std::vector<std::vector<int>> order(t.n_layers());
  for (int l = 0; l < t.n_layers(); ++l) {
    std::vector<int>& o = order[l];
    std::vector<char> placed(E, 0);
    auto better = [&](int a, int b, uint64_t sa, uint64_t sb) {
      if (sa != sb) return sa > sb;
      if (t.count(l, a) != t.count(l, b)) return t.count(l, a) > t.count(l, b);
      return a < b;
    };
    while (static_cast<int>(o.size()) < E) {
      int best = -1;
      uint64_t best_score = 0;
      for (int e = 0; e < E; ++e) {
        if (placed[e]) continue;
        uint64_t score = 0;
        for (size_t k = o.size() >= 2 ? o.size() - 2 : 0; k < o.size(); ++k) score += t.coactivation(l, e, o[k]);
        if (best < 0 || better(e, best, score, best_score)) {
          best = e;
          best_score = score;
        }
      }
      placed[best] = 1;
      o.push_back(best);
    }
  }
  return order;
}

void write_pin_file(const std::string& path, const std::vector<std::pair<int, int>>& pins, uint64_t expert_bytes,
                    double coverage, uint64_t tokens) {
  nlohmann::ordered_json j;
  nlohmann::json arr = nlohmann::json::array();
  for (auto [l, e] : pins) arr.push_back({l, e});
  j["pin"] = arr;
  j["bytes"] = pins.size() * expert_bytes;
  j["expected_hit_rate"] = coverage;
  j["calibration_tokens"] = tokens;
  write_file_atomic(path, j.dump() + "\n");
}

void write_perm_file(const std::string& path, const std::vector<std::vector<int>>& order) {
  nlohmann::ordered_json j;
  j["perm"] = order;
  j["note"] = "perm[layer][new_position] = old expert id";
  write_file_atomic(path, j.dump() + "\n");
}

std::vector<std::vector<int>> read_perm_file(const std::string& path, int n_layers, int n_experts) {
  std::ifstream f(path);
  if (!f) fail("%s: cannot open perm file", path.c_str());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail("%s: not valid JSON (%s)", path.c_str(), e.what());
  }
  if (!j.is_object() || !j.contains("perm") || !j["perm"].is_array()) fail("%s: expected {\"perm\": [[...], ...]}", path.c_str());
  std::vector<std::vector<int>> perm(n_layers);
  if (static_cast<int>(j["perm"].size()) > n_layers) fail("%s: %zu layers given, the model has %d", path.c_str(), j["perm"].size(), n_layers);
  for (size_t l = 0; l < j["perm"].size(); ++l) {
    const auto& p = j["perm"][l];
    if (!p.is_array()) fail("%s: perm[%zu] is not a list", path.c_str(), l);
    if (p.empty()) continue;
    if (static_cast<int>(p.size()) != n_experts) fail("%s: perm[%zu] has %zu entries, the model has %d experts", path.c_str(), l, p.size(), n_experts);
    std::vector<char> seen(n_experts, 0);
    for (const auto& x : p) {
      if (!x.is_number_integer() || x.get<int>() < 0 || x.get<int>() >= n_experts || seen[x.get<int>()])
        fail("%s: perm[%zu] is not a permutation of 0..%d", path.c_str(), l, n_experts - 1);
      seen[x.get<int>()] = 1;
      perm[l].push_back(x.get<int>());
    }
  }
  for (auto& p : perm)
    if (p.empty())
      for (int e = 0; e < n_experts; ++e) p.push_back(e);
  return perm;
}

}  // namespace spool::experts
