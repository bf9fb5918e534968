#include "experts/expert_profile.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/files.h"
#include "common/log.h"
#include "common/splitmix.h"
#include "experts/routing_trace.h"
#include "io/checkpoint.h"

namespace spool::experts {

namespace {

constexpr const char* kFormat = "spool-expert-profile";
// growth_ is folded into the counts once it passes this (2^64: far from double's range, and the
// counts keep their relative precision).
constexpr double kMaxGrowth = 18446744073709551616.0;

std::string join(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

// A count with 6 significant digits (the file's precision).
double round6(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return std::strtod(buf, nullptr);
}

}  // namespace

std::string ProfileShape::mismatch(const ProfileShape& f) const {
  if (f.model_type != model_type) return strfmt("model_type %s, not %s", f.model_type.c_str(), model_type.c_str());
  if (f.n_layers != n_layers) return strfmt("%d layers, not %d", f.n_layers, n_layers);
  if (f.moe_layers != moe_layers)
    return strfmt("MoE layers %s, not %s", join(f.moe_layers).c_str(), join(moe_layers).c_str());
  if (f.n_experts != n_experts) return strfmt("%d experts per layer, not %d", f.n_experts, n_experts);
  if (f.router_hash != router_hash)
    return strfmt("router_hash %s, not %s (another checkpoint: other router weights, or experts repacked)", f.router_hash.c_str(),
                  router_hash.c_str());
  return "";
}

ProfileData read_profile(const std::string& path) {
  const std::string text = read_whole_file(path);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) fail("%s: not a valid expert profile: not JSON (a truncated or corrupt file?)", path.c_str());
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat)
    fail("%s: not an expert profile (no \"format\": \"%s\")", path.c_str(), kFormat);
  auto need = [&](const char* key, bool ok) -> const nlohmann::json& {
    if (!j.contains(key)) fail("%s: expert profile: the header has no \"%s\"", path.c_str(), key);
    if (!ok) fail("%s: expert profile: \"%s\" has the wrong type or value (%s)", path.c_str(), key, j[key].dump().c_str());
    return j[key];
  };
  auto is_int = [&](const char* key, int64_t lo) {
    return j.contains(key) && j[key].is_number_integer() && j[key].get<int64_t>() >= lo && j[key].get<int64_t>() <= INT32_MAX;
  };
  const nlohmann::json& version = need("version", j.contains("version") && j["version"].is_number_integer());
  if (version.get<int64_t>() != kProfileVersion)
    fail("%s: expert profile version %lld; this spool reads version %d", path.c_str(), (long long)version.get<int64_t>(), kProfileVersion);
  ProfileData d;
  ProfileShape& s = d.shape;
  s.model_type = need("model_type", j.contains("model_type") && j["model_type"].is_string()).get<std::string>();
  s.n_layers = need("n_layers", is_int("n_layers", 1)).get<int>();
  s.n_experts = need("n_experts", is_int("n_experts", 1)).get<int>();
  s.top_k = need("top_k", is_int("top_k", 1)).get<int>();
  s.router_hash = need("router_hash", j.contains("router_hash") && j["router_hash"].is_string()).get<std::string>();
  s.expert_bytes = need("expert_bytes", j.contains("expert_bytes") && j["expert_bytes"].is_number_unsigned()).get<uint64_t>();
  const nlohmann::json& ml = need("moe_layers", j.contains("moe_layers") && j["moe_layers"].is_array() && !j["moe_layers"].empty());
  for (const auto& x : ml) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() >= s.n_layers ||
        (!s.moe_layers.empty() && x.get<int64_t>() <= s.moe_layers.back()))
      fail("%s: expert profile: moe_layers must be ascending layer indices below n_layers %d (got %s)", path.c_str(), s.n_layers,
           ml.dump().c_str());
    s.moe_layers.push_back(x.get<int>());
  }
  const nlohmann::json& hl = need("half_life_tokens", j.contains("half_life_tokens") && j["half_life_tokens"].is_number());
  d.half_life = hl.get<double>();
  if (!(d.half_life > 0) || !std::isfinite(d.half_life))
    fail("%s: expert profile: half_life_tokens must be a positive number (got %s)", path.c_str(), hl.dump().c_str());
  d.tokens_total = need("tokens_total", j.contains("tokens_total") && j["tokens_total"].is_number_unsigned()).get<uint64_t>();
  const nlohmann::json& w = need("weight", j.contains("weight") && j["weight"].is_number());
  d.weight = w.get<double>();
  if (!(d.weight >= 0) || !std::isfinite(d.weight))
    fail("%s: expert profile: weight must be a finite number >= 0 (got %s)", path.c_str(), w.dump().c_str());
  const nlohmann::json& c = need("counts", j.contains("counts") && j["counts"].is_array());
  if (c.size() != s.moe_layers.size())
    fail("%s: expert profile: counts has %zu lists, not one per MoE layer (%zu)", path.c_str(), c.size(), s.moe_layers.size());
  d.counts.reserve(s.moe_layers.size() * static_cast<size_t>(s.n_experts));
  for (size_t o = 0; o < c.size(); ++o) {
    if (!c[o].is_array() || c[o].size() != static_cast<size_t>(s.n_experts))
      fail("%s: expert profile: counts of layer %d must be a list of n_experts (%d) numbers", path.c_str(), s.moe_layers[o], s.n_experts);
    for (const auto& x : c[o]) {
      const double v = x.is_number() ? x.get<double>() : -1.0;
      if (!(v >= 0) || !std::isfinite(v))
        fail("%s: expert profile: a count of layer %d is not a finite number >= 0 (%s)", path.c_str(), s.moe_layers[o], x.dump().c_str());
      d.counts.push_back(v);
    }
  }
  return d;
}

void write_profile(const std::string& path, const ProfileData& d) {
  const ProfileShape& s = d.shape;
  if (d.counts.size() != s.moe_layers.size() * static_cast<size_t>(s.n_experts))
    fail("%s: expert profile: %zu counts for %zu MoE layers of %d experts", path.c_str(), d.counts.size(), s.moe_layers.size(), s.n_experts);
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["version"] = kProfileVersion;
  j["model_type"] = s.model_type;
  j["n_layers"] = s.n_layers;
  j["moe_layers"] = s.moe_layers;
  j["n_experts"] = s.n_experts;
  j["top_k"] = s.top_k;
  j["router_hash"] = s.router_hash;
  j["expert_bytes"] = s.expert_bytes;
  j["half_life_tokens"] = d.half_life;
  j["tokens_total"] = d.tokens_total;
  j["weight"] = round6(d.weight);
  nlohmann::ordered_json counts = nlohmann::ordered_json::array();
  for (size_t o = 0; o < s.moe_layers.size(); ++o) {
    nlohmann::ordered_json row = nlohmann::ordered_json::array();
    for (int e = 0; e < s.n_experts; ++e) row.push_back(round6(d.counts[o * static_cast<size_t>(s.n_experts) + static_cast<size_t>(e)]));
    counts.push_back(std::move(row));
  }
  j["counts"] = std::move(counts);
  // One line per MoE layer's counts: readable, and diffs stay small.
  std::string out = "{";
  bool first = true;
  for (auto it = j.begin(); it != j.end(); ++it) {
    out += first ? "\n" : ",\n";
    first = false;
    out += "  " + nlohmann::ordered_json(it.key()).dump() + ": ";
    if (it.key() != "counts") {
      out += it.value().dump();
      continue;
    }
    out += "[";
    for (size_t o = 0; o < it.value().size(); ++o) out += (o ? ",\n    " : "\n    ") + it.value()[o].dump();
    out += "\n  ]";
  }
  out += "\n}\n";
  write_file_atomic(path, out);
}

std::vector<ExpertCount> profile_counts(const ProfileData& d) {
  std::vector<ExpertCount> out;
  const int E = d.shape.n_experts;
  for (size_t o = 0; o < d.shape.moe_layers.size(); ++o)
    for (int e = 0; e < E; ++e) {
      const double c = d.counts[o * static_cast<size_t>(E) + static_cast<size_t>(e)];
      if (c > 0) out.push_back({d.shape.moe_layers[o], e, c});
    }
  return out;
}

std::vector<std::pair<int, int>> hottest(const ProfileData& d) {
  const int E = d.shape.n_experts;
  std::vector<std::pair<double, std::pair<int, int>>> v;
  for (size_t o = 0; o < d.shape.moe_layers.size(); ++o)
    for (int e = 0; e < E; ++e) {
      const double c = d.counts[o * static_cast<size_t>(E) + static_cast<size_t>(e)];
      if (c > 0) v.push_back({c, {d.shape.moe_layers[o], e}});
    }
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::pair<int, int>> out;
  out.reserve(v.size());
  for (const auto& x : v) out.push_back(x.second);
  return out;
}

std::string router_fingerprint(const io::Checkpoint& ckpt, const std::vector<int>& moe_layers, const std::string& router_stem,
                               int* hashed) {
  uint64_t h = 0x5370306f6c707266ull;  // any fixed start
  auto mix = [&](uint64_t x) {
    uint64_t state = h ^ x;
    h = splitmix64(state);
  };
  auto mix_bytes = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, b + i, 8);
      mix(w);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, b + i, n - i);
    mix(tail ^ (static_cast<uint64_t>(n - i) << 56));
  };
  int n = 0;
  for (int L : moe_layers) {
    const std::string prefix = "layers." + std::to_string(L) + ".";
    // A router tensor: "layers.L." then optional segments, then the stem's segments, then its part
    // ("weight", "bias", "qweight", ...), matched at segment boundaries.
    std::vector<const io::TensorRef*> found;
    for (const io::TensorRef& t : ckpt.tensors()) {
      if (t.expert_layer >= 0 || t.name.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string rest = t.name.substr(prefix.size());
      const size_t at = rest.compare(0, router_stem.size() + 1, router_stem + ".") == 0 ? 0 : rest.find("." + router_stem + ".");
      if (at == std::string::npos) continue;
      const std::string part = rest.substr(at == 0 ? router_stem.size() + 1 : at + router_stem.size() + 2);
      if (part.empty() || part.find('.') != std::string::npos) continue;
      found.push_back(&t);
    }
    std::sort(found.begin(), found.end(), [](const io::TensorRef* a, const io::TensorRef* b) { return a->name < b->name; });
    for (const io::TensorRef* t : found) {
      mix_bytes(t->name.data(), t->name.size());
      mix(static_cast<uint64_t>(t->dtype));
      for (int64_t d : t->shape) mix(static_cast<uint64_t>(d));
      mix(t->nbytes);
      if (t->data != nullptr) mix_bytes(t->data, t->nbytes);
      ++n;
    }
  }
  if (hashed != nullptr) *hashed = n;
  return strfmt("%016llx", (unsigned long long)h);
}

ExpertProfile::ExpertProfile(ProfileShape shape, double half_life) : shape_(std::move(shape)), half_life_(half_life) {
  if (!(half_life > 0) || !std::isfinite(half_life))
    throw UsageError(strfmt("--expert-profile-half-life must be a positive number of tokens (got %g)", half_life));
  if (shape_.moe_layers.empty() || shape_.n_experts <= 0) fail("an expert profile needs a model with routed experts");
  acc_.assign(shape_.moe_layers.size() * static_cast<size_t>(shape_.n_experts), 0.0);
  ordinal_.assign(static_cast<size_t>(std::max(shape_.n_layers, shape_.moe_layers.back() + 1)), -1);
  for (size_t o = 0; o < shape_.moe_layers.size(); ++o) ordinal_[static_cast<size_t>(shape_.moe_layers[o])] = static_cast<int>(o);
}

void ExpertProfile::seed(const ProfileData& d) {
  if (d.shape.moe_layers != shape_.moe_layers || d.shape.n_experts != shape_.n_experts || d.counts.size() != acc_.size())
    fail("expert profile: the stored profile's MoE layers or experts differ from the model's");
  std::lock_guard<std::mutex> lk(mu_);
  for (size_t i = 0; i < acc_.size(); ++i) acc_[i] = d.counts[i] * growth_;
  weight_acc_ = d.weight * growth_;
  tokens_total_ = d.tokens_total;
}

void ExpertProfile::renormalize() {
  const double inv = 1.0 / growth_;
  for (double& a : acc_) a *= inv;
  weight_acc_ *= inv;
  growth_ = 1;
  clock_ = 0;
}

void ExpertProfile::record(int layer, std::span<const int> experts) {
  if (layer < 0 || layer >= static_cast<int>(ordinal_.size()) || ordinal_[static_cast<size_t>(layer)] < 0) return;
  const int o = ordinal_[static_cast<size_t>(layer)];
  std::lock_guard<std::mutex> lk(mu_);
  if (o == 0) {  // a new token: the clock advances, older counts weigh half as much every half_life tokens
    ++clock_;
    ++tokens_total_;
    ++tokens_run_;
    growth_ = std::exp2(static_cast<double>(clock_) / half_life_);
    if (growth_ > kMaxGrowth) renormalize();
    weight_acc_ += growth_;
  }
  double* row = acc_.data() + static_cast<size_t>(o) * static_cast<size_t>(shape_.n_experts);
  for (int e : experts)
    if (e >= 0 && e < shape_.n_experts) row[e] += growth_;
}

ProfileData ExpertProfile::snapshot() const {
  ProfileData d;
  d.shape = shape_;
  d.half_life = half_life_;
  std::lock_guard<std::mutex> lk(mu_);
  const double inv = 1.0 / growth_;
  d.counts.resize(acc_.size());
  for (size_t i = 0; i < acc_.size(); ++i) d.counts[i] = acc_[i] * inv;
  d.weight = weight_acc_ * inv;
  d.tokens_total = tokens_total_;
  return d;
}

uint64_t ExpertProfile::tokens_total() const {
  std::lock_guard<std::mutex> lk(mu_);
  return tokens_total_;
}

uint64_t ExpertProfile::tokens_this_run() const {
  std::lock_guard<std::mutex> lk(mu_);
  return tokens_run_;
}

ProfileSaver::ProfileSaver(std::shared_ptr<const ExpertProfile> profile, std::string path, double interval_s)
    : profile_(std::move(profile)), path_(std::move(path)), interval_s_(interval_s) {
  saved_tokens_ = profile_->tokens_total() - profile_->tokens_this_run();  // the seeded profile's
  if (interval_s_ > 0)
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> lk(mu_);
      while (!stop_) {
        if (cv_.wait_for(lk, std::chrono::duration<double>(interval_s_), [this] { return stop_; })) break;
        lk.unlock();
        save_if_changed(/*announce=*/false);
        lk.lock();
      }
    });
}

ProfileSaver::~ProfileSaver() { finish(); }

void ProfileSaver::finish() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  save_if_changed(/*announce=*/true);
}

bool ProfileSaver::save_if_changed(bool announce) {
  std::lock_guard<std::mutex> lk(save_mu_);
  const ProfileData d = profile_->snapshot();
  if (d.tokens_total == saved_tokens_) return false;
  try {
    write_profile(path_, d);
  } catch (const std::exception& e) {
    log_warn("--expert-profile: %s; the profile was not saved", e.what());
    return false;
  }
  saved_tokens_ = d.tokens_total;
  if (announce)
      log_info("expert profile saved to %s (%llu tokens recorded in all, %.0f after decay)", path_.c_str(),
             (unsigned long long)d.tokens_total, d.weight);
  return true;
}

std::vector<std::vector<double>> routing_load(const std::string& path, int n_layers, int n_experts) {
  std::string first;
  {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) fail("%s: cannot open: %s", path.c_str(), std::strerror(errno));
    char buf[4096];
    const size_t n = std::fread(buf, 1, sizeof(buf), f);
    std::fclose(f);
    first.assign(buf, n);
  }
  std::vector<std::vector<double>> load(static_cast<size_t>(n_layers));
  const auto check_shape = [&](int file_experts, const std::vector<int>& layers) {
    if (file_experts != n_experts) fail("%s: routing of %d experts per layer; this model has %d", path.c_str(), file_experts, n_experts);
    for (int l : layers)
      if (l < 0 || l >= n_layers) fail("%s: MoE layer %d; this model has %d layers", path.c_str(), l, n_layers);
  };
  double total = 0;
  if (first.find("spool-routing-trace") != std::string::npos && first.find("spool-routing-trace") < first.find('\n')) {
    const Trace t = read_trace(path);
    check_shape(t.shape.n_experts, t.shape.moe_layers);
    for (int o = 0; o < t.n_moe(); ++o) {
      std::vector<double>& c = load[static_cast<size_t>(t.shape.moe_layers[static_cast<size_t>(o)])];
      c.assign(static_cast<size_t>(n_experts), 0.0);
      for (int64_t tok = 0; tok < t.n_tokens; ++tok) {
        const int* e = t.experts_of(tok, o);
        for (int k = 0; k < t.shape.top_k; ++k) c[static_cast<size_t>(e[k])] += 1;
      }
      total += static_cast<double>(t.n_tokens) * t.shape.top_k;
    }
  } else {
    const ProfileData d = read_profile(path);
    check_shape(d.shape.n_experts, d.shape.moe_layers);
    for (size_t o = 0; o < d.shape.moe_layers.size(); ++o) {
      std::vector<double>& c = load[static_cast<size_t>(d.shape.moe_layers[o])];
      c.assign(d.counts.begin() + static_cast<ptrdiff_t>(o * static_cast<size_t>(n_experts)),
               d.counts.begin() + static_cast<ptrdiff_t>((o + 1) * static_cast<size_t>(n_experts)));
      for (double v : c) total += v;
    }
  }
  if (!(total > 0)) fail("%s: no routing recorded (every count is 0)", path.c_str());
  return load;
}

}  // namespace spool::experts
