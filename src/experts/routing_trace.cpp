#include "experts/routing_trace.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/splitmix.h"

namespace spool::experts {

namespace {
constexpr const char* kFormat = "spool-routing-trace";
// An integer JSON value in [lo, hi] (a float, a string or a value out of range: a
// nlohmann type_error, reported as the field's error; nlohmann's own get<int> of a float outside
// int's range is undefined behaviour).
int64_t json_int(const nlohmann::json& v, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) throw nlohmann::json::type_error::create(302, "not an integer", nullptr);
  if (v.is_number_unsigned() ? v.get<uint64_t>() > static_cast<uint64_t>(hi) : (v.get<int64_t>() < lo || v.get<int64_t>() > hi))
    throw nlohmann::json::type_error::create(302, "integer out of range", nullptr);
  return v.get<int64_t>();
}

// A list of integers in [lo, hi] (json_int's errors).
std::vector<int> json_ints(const nlohmann::json& v, int64_t lo, int64_t hi) {
  if (!v.is_array()) throw nlohmann::json::type_error::create(302, "not a list", nullptr);
  std::vector<int> out;
  for (const auto& x : v) out.push_back(static_cast<int>(json_int(x, lo, hi)));
  return out;
}

}  // namespace

TraceWriter::TraceWriter(const std::string& path, const TraceShape& s) : path_(path), guesses_(s.guesses) {
  if (s.moe_layers.empty() || s.n_experts <= 0 || s.top_k <= 0) fail("%s: a routing trace needs a model with routed experts", path.c_str());
  f_ = std::fopen(path.c_str(), "wb");
  if (f_ == nullptr) fail("%s: cannot create the trace file (%s)", path.c_str(), std::strerror(errno));
  nlohmann::ordered_json h;
  h["format"] = kFormat;
  h["version"] = kTraceVersion;
  h["model_type"] = s.model_type;
  h["n_layers"] = s.n_layers;
  h["moe_layers"] = s.moe_layers;
  h["n_experts"] = s.n_experts;
  h["top_k"] = s.top_k;
  h["source"] = s.source;
  if (s.guesses > 0) {
    h["guesses"] = s.guesses;
    h["guess_source"] = s.guess_source;
  }
  const std::string line = h.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size()) {
    std::fclose(f_);
    f_ = nullptr;
    fail("%s: write failed", path.c_str());
  }
}

TraceWriter::~TraceWriter() {
  if (f_ != nullptr) std::fclose(f_);
}

void TraceWriter::write(int layer, int64_t token, std::span<const int> experts, std::span<const float> weights,
                        std::span<const int> guesses) {
  if (f_ == nullptr) fail("%s: the trace file is closed", path_.c_str());
  if (experts.size() != weights.size()) fail("%s: %zu experts but %zu weights", path_.c_str(), experts.size(), weights.size());
  if (!guesses.empty() && static_cast<int>(guesses.size()) != guesses_)
    fail("%s: %zu guesses; the header says %d", path_.c_str(), guesses.size(), guesses_);
  std::string s = "{\"l\":" + std::to_string(layer) + ",\"t\":" + std::to_string(token) + ",\"e\":[";
  for (size_t i = 0; i < experts.size(); ++i) s += (i ? "," : "") + std::to_string(experts[i]);
  s += "],\"w\":[";
  char buf[32];
  for (size_t i = 0; i < weights.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.6g", i ? "," : "", static_cast<double>(weights[i]));
    s += buf;
  }
  s += "]";
  if (!guesses.empty()) {
    s += ",\"g\":[";
    for (size_t i = 0; i < guesses.size(); ++i) s += (i ? "," : "") + std::to_string(guesses[i]);
    s += "]";
  }
  s += "}\n";
  if (std::fwrite(s.data(), 1, s.size(), f_) != s.size()) fail("%s: write failed (%s)", path_.c_str(), std::strerror(errno));
  ++records_;
}

void TraceWriter::flush() {
  if (f_ != nullptr && std::fflush(f_) != 0) fail("%s: write failed (%s)", path_.c_str(), std::strerror(errno));
}

void TraceWriter::close() {
  if (f_ == nullptr) return;
  std::FILE* f = f_;
  f_ = nullptr;
  if (std::fclose(f) != 0) fail("%s: write failed (%s)", path_.c_str(), std::strerror(errno));
}

Trace read_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("%s: cannot open the routing trace", path.c_str());
  Trace t;
  TraceShape& s = t.shape;
  std::string line;
  int64_t lineno = 0;
  auto parse = [&](const std::string& l) {
    try {
      return nlohmann::json::parse(l);
    } catch (const nlohmann::json::exception&) {
      fail("%s:%lld: not a JSON line (a truncated trace?)", path.c_str(), (long long)lineno);
    }
  };
  if (!std::getline(in, line)) fail("%s: empty file, not a routing trace", path.c_str());
  ++lineno;
  const nlohmann::json h = parse(line);
  if (!h.is_object() || !h.contains("format") || !h["format"].is_string() || h["format"].get<std::string>() != kFormat)
    fail("%s:1: not a routing trace (the first line must be a header with \"format\": \"%s\")", path.c_str(), kFormat);
  if (!h.contains("version") || !h["version"].is_number_integer())
    fail("%s:1: the header has no integer \"version\"", path.c_str());
  if (h["version"].get<int>() != kTraceVersion)
    fail("%s:1: trace format version %d; this spool reads version %d", path.c_str(), h["version"].get<int>(), kTraceVersion);
  try {
    s.model_type = h.value("model_type", std::string());
    s.source = h.value("source", std::string());
    s.n_layers = static_cast<int>(json_int(h.at("n_layers"), 0, 1 << 20));
    s.moe_layers = json_ints(h.at("moe_layers"), -1, 1 << 20);
    s.n_experts = static_cast<int>(json_int(h.at("n_experts"), 0, 1 << 20));
    s.top_k = static_cast<int>(json_int(h.at("top_k"), 0, 1 << 20));
    s.guesses = h.contains("guesses") ? static_cast<int>(json_int(h.at("guesses"), -1, 1 << 20)) : 0;
    s.guess_source = h.value("guess_source", std::string());
  } catch (const nlohmann::json::exception& e) {
    fail("%s:1: bad header (needs integers n_layers, n_experts, top_k, a list moe_layers, and an integer guesses if any): %s", path.c_str(),
         e.what());
  }
  if (s.guesses < 0 || s.guesses > s.n_experts) fail("%s:1: bad header: %d guesses per record of %d experts", path.c_str(), s.guesses, s.n_experts);
  if (s.n_layers <= 0 || s.n_experts <= 0 || s.top_k <= 0 || s.top_k > s.n_experts || s.moe_layers.empty())
    fail("%s:1: bad header: n_layers %d, n_experts %d, top_k %d, %zu MoE layers", path.c_str(), s.n_layers, s.n_experts, s.top_k,
         s.moe_layers.size());
  std::vector<int> ordinal(s.n_layers, -1);
  for (size_t i = 0; i < s.moe_layers.size(); ++i) {
    const int l = s.moe_layers[i];
    if (l < 0 || l >= s.n_layers || ordinal[l] >= 0 || (i > 0 && l <= s.moe_layers[i - 1]))
      fail("%s:1: bad header: moe_layers must be ascending distinct layers in 0..%d", path.c_str(), s.n_layers - 1);
    ordinal[l] = static_cast<int>(i);
  }
  const int L = t.n_moe(), K = s.top_k;
  std::vector<uint8_t> seen;  // [token][ordinal]
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    const nlohmann::json r = parse(line);
    int layer = 0;
    int64_t token = 0;
    std::vector<int> e;
    std::vector<float> w;
    std::vector<int> g;
    try {
      layer = static_cast<int>(json_int(r.at("l"), -1, 1 << 20));
      token = json_int(r.at("t"), -1, int64_t{1} << 41);
      e = json_ints(r.at("e"), -1, 1 << 20);
      w = r.at("w").get<std::vector<float>>();
      if (r.contains("g")) g = json_ints(r.at("g"), -1, 1 << 20);
    } catch (const nlohmann::json::exception&) {
      fail("%s:%lld: a record needs integers \"l\", \"t\" and lists \"e\" (ints), \"w\" (numbers) (and \"g\", ints)", path.c_str(),
           (long long)lineno);
    }
    if (r.contains("g") && static_cast<int>(g.size()) != s.guesses)
      fail("%s:%lld: %zu guesses; the header's guesses is %d", path.c_str(), (long long)lineno, g.size(), s.guesses);
    for (size_t i = 0; i < g.size(); ++i) {
      if (g[i] < 0 || g[i] >= s.n_experts) fail("%s:%lld: guess %d outside 0..%d", path.c_str(), (long long)lineno, g[i], s.n_experts - 1);
      for (size_t j = 0; j < i; ++j)
        if (g[j] == g[i]) fail("%s:%lld: guess %d listed twice", path.c_str(), (long long)lineno, g[i]);
    }
    if (layer < 0 || layer >= s.n_layers || ordinal[layer] < 0)
      fail("%s:%lld: layer %d is not one of the header's MoE layers", path.c_str(), (long long)lineno, layer);
    if (token < 0 || token > (int64_t{1} << 40)) fail("%s:%lld: token %lld out of range", path.c_str(), (long long)lineno, (long long)token);
    if (static_cast<int>(e.size()) != K || static_cast<int>(w.size()) != K)
      fail("%s:%lld: %zu experts and %zu weights; the header's top_k is %d", path.c_str(), (long long)lineno, e.size(), w.size(), K);
    for (int i = 0; i < K; ++i) {
      if (e[i] < 0 || e[i] >= s.n_experts)
        fail("%s:%lld: expert %d outside 0..%d", path.c_str(), (long long)lineno, e[i], s.n_experts - 1);
      for (int j = 0; j < i; ++j)
        if (e[j] == e[i]) fail("%s:%lld: expert %d listed twice", path.c_str(), (long long)lineno, e[i]);
      if (!std::isfinite(w[i])) fail("%s:%lld: weight %d is not finite", path.c_str(), (long long)lineno, i);
    }
    if (token >= t.n_tokens) {
      t.n_tokens = token + 1;
      seen.resize(static_cast<size_t>(t.n_tokens) * L, 0);
      t.experts.resize(seen.size() * K, 0);
      t.weights.resize(seen.size() * K, 0.0f);
      t.guesses.resize(seen.size() * s.guesses, -1);
    }
    const size_t slot = static_cast<size_t>(token) * L + ordinal[layer];
    if (seen[slot]) fail("%s:%lld: layer %d of token %lld recorded twice", path.c_str(), (long long)lineno, layer, (long long)token);
    seen[slot] = 1;
    std::copy(e.begin(), e.end(), t.experts.begin() + slot * K);
    std::copy(w.begin(), w.end(), t.weights.begin() + slot * K);
    std::copy(g.begin(), g.end(), t.guesses.begin() + slot * s.guesses);
  }
  if (in.bad()) fail("%s: read error", path.c_str());
  if (t.n_tokens == 0) fail("%s: the trace has a header but no records", path.c_str());
  for (size_t i = 0; i < seen.size(); ++i)
    if (!seen[i])
      fail("%s: token %lld has no record for layer %d (a truncated or partial trace)", path.c_str(), (long long)(i / L),
           s.moe_layers[i % L]);
  return t;
}

std::vector<double> top_share(const Trace& t, double fraction) {
  const int L = t.n_moe(), E = t.shape.n_experts, K = t.shape.top_k;
  const int top = std::clamp(static_cast<int>(std::ceil(fraction * E - 1e-9)), 1, E);
  std::vector<double> out(L, 0.0);
  for (int o = 0; o < L; ++o) {
    std::vector<uint64_t> c(E, 0);
    for (int64_t tok = 0; tok < t.n_tokens; ++tok)
      for (int i = 0; i < K; ++i) ++c[t.experts_of(tok, o)[i]];
    std::sort(c.begin(), c.end(), std::greater<>());
    uint64_t s = 0;
    for (int i = 0; i < top; ++i) s += c[i];
    out[o] = t.n_tokens ? static_cast<double>(s) / (static_cast<double>(t.n_tokens) * K) : 0.0;
  }
  return out;
}

TraceMap::TraceMap(const Trace& trace, std::vector<int> target_moe_layers, int target_experts)
    : trace_(trace), moe_layers_(std::move(target_moe_layers)), n_experts_(target_experts) {
  if (moe_layers_.empty() || n_experts_ <= 0) fail("routing trace replay: the target model has no routed experts");
  if (trace_.n_tokens <= 0) fail("routing trace replay: the trace has no tokens");
  ordinal_.assign(moe_layers_.back() + 1, -1);
  for (size_t i = 0; i < moe_layers_.size(); ++i) ordinal_[moe_layers_[i]] = static_cast<int>(i);
}

void TraceMap::route(int layer, int64_t token, std::span<int> ids, std::span<float> weights) const {
  if (layer < 0 || layer >= static_cast<int>(ordinal_.size()) || ordinal_[layer] < 0)
    fail("routing trace replay: layer %d is not a MoE layer of the target", layer);
  if (ids.size() != weights.size() || static_cast<int>(ids.size()) > n_experts_)
    fail("routing trace replay: %zu experts asked of a layer of %d", ids.size(), n_experts_);
  const int j = ordinal_[layer];
  const int src = j % trace_.n_moe();
  const int64_t tok = token % trace_.n_tokens;
  const int Es = trace_.shape.n_experts, Ks = trace_.shape.top_k, Et = n_experts_;
  const int kt = static_cast<int>(ids.size());
  const int* se = trace_.experts_of(tok, src);
  const float* sw = trace_.weights_of(tok, src);
  const int R = Et >= Es ? Et / Es : 1;
  std::vector<int> uses(Ks, 0);  // target experts produced by each trace rank
  std::vector<int> rank_of(kt);
  for (int i = 0; i < kt; ++i) {
    const int rank = i % Ks, pass = i / Ks;
    const int e = se[rank];
    int id;
    if (Et >= Es) {
      uint64_t st = (static_cast<uint64_t>(j) << 48) ^ (static_cast<uint64_t>(tok) << 16) ^ static_cast<uint64_t>(e) ^
                    (static_cast<uint64_t>(pass) << 56);
      id = e + Es * static_cast<int>(splitmix64(st) % static_cast<uint64_t>(R));
    } else {
      id = e % Et;
    }
    while (std::find(ids.begin(), ids.begin() + i, id) != ids.begin() + i) id = (id + 1) % Et;  // taken: the next free id
    ids[i] = id;
    rank_of[i] = rank;
    ++uses[rank];
  }
  for (int i = 0; i < kt; ++i) weights[i] = sw[rank_of[i]] / static_cast<float>(uses[rank_of[i]]);
}

}  // namespace spool::experts

namespace spool::experts {

int TraceMap::guess(int layer, int64_t token, std::span<int> ids) const {
  if (layer < 0 || layer >= static_cast<int>(ordinal_.size()) || ordinal_[layer] < 0)
    fail("routing trace replay: layer %d is not a MoE layer of the target", layer);
  const int G = trace_.shape.guesses;
  if (G == 0) return 0;
  const int j = ordinal_[layer];
  const int src = j % trace_.n_moe();
  const int64_t tok = token % trace_.n_tokens;
  const int Es = trace_.shape.n_experts, Et = n_experts_;
  const int R = Et >= Es ? Et / Es : 1;
  const int* g = trace_.guesses_of(tok, src);
  int n = 0;
  for (int i = 0; i < G && n < static_cast<int>(ids.size()); ++i) {
    const int e = g[i];
    if (e < 0) return 0;  // no guesses for this record
    int id;
    if (Et >= Es) {  // route()'s map of a rank-0 pass
      uint64_t st = (static_cast<uint64_t>(j) << 48) ^ (static_cast<uint64_t>(tok) << 16) ^ static_cast<uint64_t>(e);
      id = e + Es * static_cast<int>(splitmix64(st) % static_cast<uint64_t>(R));
    } else {
      id = e % Et;
    }
    if (std::find(ids.begin(), ids.begin() + n, id) == ids.begin() + n) ids[n++] = id;
  }
  return n;
}

}  // namespace spool::experts
