#include "experts/predictor.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <cstdio>
#include <cstring>

#include "common/error.h"
#include "io/safetensors.h"

namespace spool::experts {

namespace {

constexpr const char* kFormat = "spool-expert-predictor";
constexpr int kVersion = 1;

// The m best of scores s [E] into out[0..m), best first, ties to the lower id.
void best_m(const float* s, int E, int m, int* out, std::vector<int>& order) {
  order.resize(static_cast<size_t>(E));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + m, order.end(), [&](int a, int b) { return s[a] > s[b] || (s[a] == s[b] && a < b); });
  std::copy(order.begin(), order.begin() + m, out);
}

// y[r] = sum_c A[r, c] x[c] for A [R, C].
void gemv(const float* A, const float* x, int R, int C, float* y) {
  for (int r = 0; r < R; ++r) {
    const float* a = A + static_cast<size_t>(r) * C;
    float acc = 0;
    for (int c = 0; c < C; ++c) acc += a[c] * x[c];
    y[r] = acc;
  }
}

int parse_int(const std::map<std::string, std::string>& md, const std::string& key, const std::string& path) {
  auto it = md.find(key);
  if (it == md.end()) fail("%s: not a spool expert predictor (metadata %s missing)", path.c_str(), key.c_str());
  try {
    size_t used = 0;
    const int v = std::stoi(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument(key);
    return v;
  } catch (const std::exception&) {
    fail("%s: metadata %s is not an integer (\"%s\")", path.c_str(), key.c_str(), it->second.c_str());
  }
}

// Adam on one parameter vector.
struct Adam {
  std::vector<float> m, v;
  void step(std::vector<float>& p, const std::vector<float>& g, float lr, int t) {
    if (m.empty()) m.assign(p.size(), 0.0f), v.assign(p.size(), 0.0f);
    constexpr float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float c1 = 1.0f - std::pow(b1, static_cast<float>(t)), c2 = 1.0f - std::pow(b2, static_cast<float>(t));
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      p[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
    }
  }
};

}  // namespace

ExpertPredictor::ExpertPredictor(std::string model_type, int n_layers, int hidden, int n_experts, int top_k, float eps)
    : model_type_(std::move(model_type)), n_layers_(n_layers), hidden_(hidden), n_experts_(n_experts), top_k_(top_k), eps_(eps) {
  if (n_layers <= 0 || n_layers > (1 << 16) || hidden <= 0 || hidden > (1 << 20) || n_experts <= 0 || n_experts > (1 << 16) ||
      top_k <= 0 || top_k > n_experts || !(eps >= 0) || !std::isfinite(eps))
    fail("expert predictor: bad shape (layers %d, hidden %d, experts %d, top-k %d)", n_layers, hidden, n_experts, top_k);
}

void ExpertPredictor::add(PredictorHead h) {
  const size_t E = n_experts_, H = hidden_, D = h.mlp;
  if (h.target_layer < 1 || h.target_layer >= n_layers_ || h.source_layer < 0 || h.source_layer >= h.target_layer)
    fail("expert predictor: head for layer %d reading layer %d is out of range (%d layers)", h.target_layer, h.source_layer, n_layers_);
  if (h.mlp < 0 || h.w.size() != E * H || h.b.size() != E || h.w1.size() != D * H || h.b1.size() != D || h.w2.size() != E * D)
    fail("expert predictor: head for layer %d has tensors of the wrong size", h.target_layer);
  auto it = std::lower_bound(heads_.begin(), heads_.end(), h.target_layer, [](const PredictorHead& a, int l) { return a.target_layer < l; });
  if (it != heads_.end() && it->target_layer == h.target_layer)
    *it = std::move(h);
  else
    heads_.insert(it, std::move(h));
}

const PredictorHead* ExpertPredictor::head(int target_layer) const {
  for (const PredictorHead& h : heads_)
    if (h.target_layer == target_layer) return &h;
  return nullptr;
}

const PredictorHead* ExpertPredictor::head_from(int source_layer) const {
  for (const PredictorHead& h : heads_)
    if (h.source_layer == source_layer) return &h;
  return nullptr;
}

void ExpertPredictor::normalise(const float* h, int64_t T, float* u) const {
  const int H = hidden_;
  for (int64_t t = 0; t < T; ++t) {
    const float* x = h + t * H;
    double ss = 0;
    for (int c = 0; c < H; ++c) ss += static_cast<double>(x[c]) * x[c];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / H + eps_));
    float* y = u + t * H;
    for (int c = 0; c < H; ++c) y[c] = x[c] * r;
  }
}

void ExpertPredictor::scores_normed(const PredictorHead& hd, const float* u, int64_t T, float* out) const {
  const int E = n_experts_, H = hidden_, D = hd.mlp;
  std::vector<float> a(static_cast<size_t>(D)), z(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* x = u + t * H;
    float* s = out + t * E;
    gemv(hd.w.data(), x, E, H, s);
    for (int e = 0; e < E; ++e) s[e] += hd.b[e];
    if (D > 0) {
      gemv(hd.w1.data(), x, D, H, a.data());
      for (int d = 0; d < D; ++d) a[d] = std::max(0.0f, a[d] + hd.b1[d]);
      gemv(hd.w2.data(), a.data(), E, D, z.data());
      for (int e = 0; e < E; ++e) s[e] += z[e];
    }
  }
}

void ExpertPredictor::scores(const PredictorHead& hd, const float* h, int64_t T, float* out) const {
  std::vector<float> u(static_cast<size_t>(T * hidden_));
  normalise(h, T, u.data());
  scores_normed(hd, u.data(), T, out);
}

void ExpertPredictor::top_m(const PredictorHead& hd, const float* h, int64_t T, int m, int* out) const {
  if (m < 1 || m > n_experts_) fail("expert predictor: %d best of %d experts asked for", m, n_experts_);
  std::vector<float> s(static_cast<size_t>(T * n_experts_));
  scores(hd, h, T, s.data());
  std::vector<int> order;
  for (int64_t t = 0; t < T; ++t) best_m(s.data() + t * n_experts_, n_experts_, m, out + t * m, order);
}

void ExpertPredictor::save(const std::string& path) const {
  std::map<std::string, std::string> md{{"format", kFormat},
                                        {"version", std::to_string(kVersion)},
                                        {"model_type", model_type_},
                                        {"n_layers", std::to_string(n_layers_)},
                                        {"hidden_size", std::to_string(hidden_)},
                                        {"n_experts", std::to_string(n_experts_)},
                                        {"top_k", std::to_string(top_k_)},
                                        {"rms_norm_eps", strfmt("%.9g", eps_)}};
  std::vector<io::TensorToWrite> t;
  const int64_t E = n_experts_, H = hidden_;
  for (const PredictorHead& h : heads_) {
    const std::string p = "heads." + std::to_string(h.target_layer) + ".";
    md[p + "source_layer"] = std::to_string(h.source_layer);
    t.push_back({p + "weight", io::DType::F32, {E, H}, h.w.data()});
    t.push_back({p + "bias", io::DType::F32, {E}, h.b.data()});
    if (h.mlp > 0) {
      const int64_t D = h.mlp;
      t.push_back({p + "mlp.up.weight", io::DType::F32, {D, H}, h.w1.data()});
      t.push_back({p + "mlp.up.bias", io::DType::F32, {D}, h.b1.data()});
      t.push_back({p + "mlp.down.weight", io::DType::F32, {E, D}, h.w2.data()});
    }
  }
  io::write_safetensors(path, t, md);
}

ExpertPredictor ExpertPredictor::load(const std::string& path) {
  io::SafetensorsFile f = io::SafetensorsFile::open(path);
  const auto& md = f.metadata();
  auto fmt = md.find("format");
  if (fmt == md.end() || fmt->second != kFormat) fail("%s: not a spool expert predictor (metadata format is not \"%s\")", path.c_str(), kFormat);
  const int version = parse_int(md, "version", path);
  if (version != kVersion) fail("%s: expert predictor version %d; this spool reads version %d", path.c_str(), version, kVersion);
  auto mt = md.find("model_type");
  auto ep = md.find("rms_norm_eps");
  if (mt == md.end() || ep == md.end()) fail("%s: not a spool expert predictor (model_type or rms_norm_eps missing)", path.c_str());
  float eps = 0;
  try {
    size_t used = 0;
    eps = std::stof(ep->second, &used);
    if (used != ep->second.size()) throw std::invalid_argument("rms_norm_eps");
  } catch (const std::exception&) {
    fail("%s: metadata rms_norm_eps is not a number (\"%s\")", path.c_str(), ep->second.c_str());
  }
  if (!std::isfinite(eps) || !(eps > 0) || eps > 1) fail("%s: metadata rms_norm_eps %g is not in (0, 1]", path.c_str(), eps);
  ExpertPredictor p;
  try {
    p = ExpertPredictor(mt->second, parse_int(md, "n_layers", path), parse_int(md, "hidden_size", path), parse_int(md, "n_experts", path),
                        parse_int(md, "top_k", path), eps);
  } catch (const Error& e) {
    fail("%s: %s", path.c_str(), e.what());
  }
  const int64_t E = p.n_experts_, H = p.hidden_;
  auto read = [&](const std::string& name, std::vector<int64_t> shape, bool required) -> std::vector<float> {
    const io::TensorInfo* ti = f.find(name);
    if (ti == nullptr) {
      if (required) fail("%s: tensor %s missing", path.c_str(), name.c_str());
      return {};
    }
    if (ti->dtype != io::DType::F32 || ti->shape != shape) fail("%s: tensor %s has the wrong dtype or shape", path.c_str(), name.c_str());
    std::vector<float> v(static_cast<size_t>(ti->numel()));
    std::memcpy(v.data(), f.data(*ti), v.size() * sizeof(float));  // (file offsets need not be aligned)
    for (float x : v)
      if (!std::isfinite(x)) fail("%s: tensor %s holds a value that is not finite", path.c_str(), name.c_str());
    return v;
  };
  // The heads named by the file's tensors (not a loop over n_layers: that number comes from the file).
  std::set<int> targets;
  for (const io::TensorInfo& t : f.tensors()) {
    int l = -1;
    char rest[64];
    if (t.name.rfind("heads.", 0) != 0 || std::sscanf(t.name.c_str(), "heads.%d.%63s", &l, rest) != 2 || l < 1 || l >= p.n_layers_)
      fail("%s: unexpected tensor %s", path.c_str(), t.name.c_str());
    const std::string r = rest;
    if (r != "weight" && r != "bias" && r != "mlp.up.weight" && r != "mlp.up.bias" && r != "mlp.down.weight")
      fail("%s: unexpected tensor %s", path.c_str(), t.name.c_str());
    targets.insert(l);
  }
  for (int l : targets) {
    const std::string pre = "heads." + std::to_string(l) + ".";
    if (f.find(pre + "weight") == nullptr) fail("%s: tensor %sweight missing", path.c_str(), pre.c_str());
    PredictorHead h;
    h.target_layer = l;
    h.source_layer = parse_int(md, pre + "source_layer", path);
    h.w = read(pre + "weight", {E, H}, true);
    h.b = read(pre + "bias", {E}, true);
    if (const io::TensorInfo* up = f.find(pre + "mlp.up.weight"); up != nullptr) {
      if (up->shape.size() != 2 || up->shape[0] <= 0 || up->shape[0] > (1 << 20)) fail("%s: tensor %smlp.up.weight has a bad shape", path.c_str(), pre.c_str());
      const int64_t D = up->shape[0];
      h.mlp = static_cast<int>(D);
      h.w1 = read(pre + "mlp.up.weight", {D, H}, true);
      h.b1 = read(pre + "mlp.up.bias", {D}, true);
      h.w2 = read(pre + "mlp.down.weight", {E, D}, true);
    }
    try {
      p.add(std::move(h));
    } catch (const Error& e) {
      fail("%s: %s", path.c_str(), e.what());
    }
  }
  for (const PredictorHead& h : p.heads_)
    if (h.mlp == 0)
      for (const char* part : {"mlp.up.bias", "mlp.down.weight"})
        if (f.find("heads." + std::to_string(h.target_layer) + "." + part) != nullptr)
          fail("%s: tensor heads.%d.%s without heads.%d.mlp.up.weight", path.c_str(), h.target_layer, part, h.target_layer);
  if (p.heads_.empty()) fail("%s: the predictor has no heads", path.c_str());
  return p;
}

void ExpertPredictor::check_matches(const std::string& label, const std::string& model_type, int n_layers, int hidden, int n_experts) const {
  if (model_type != model_type_ || n_layers != n_layers_ || hidden != hidden_ || n_experts != n_experts_)
    fail("%s: expert predictor made for %s (%d layers, hidden %d, %d experts); this model is %s (%d layers, hidden %d, %d experts)",
         label.c_str(), model_type_.c_str(), n_layers_, hidden_, n_experts_, model_type.c_str(), n_layers, hidden, n_experts);
}

double recall_at(const float* scores, const int* targets, int64_t N, int E, int K, int m) {
  if (N <= 0) return 0;
  m = std::min(m, E);
  std::vector<int> order, best(static_cast<size_t>(m));
  int64_t hit = 0;
  for (int64_t t = 0; t < N; ++t) {
    best_m(scores + t * E, E, m, best.data(), order);
    for (int k = 0; k < K; ++k)
      if (std::find(best.begin(), best.end(), targets[t * K + k]) != best.end()) ++hit;
  }
  return static_cast<double>(hit) / (static_cast<double>(N) * K);
}

PredictorTrainReport train_head(const ExpertPredictor& p, PredictorHead& head, const float* u, const int* targets, int64_t N, int K,
                                const PredictorTrainOptions& opt) {
  const int E = p.n_experts(), H = p.hidden(), D = head.mlp;
  if (K < 1 || K > E) fail("predictor training: %d experts per row of %d", K, E);
  if (opt.batch < 1 || opt.epochs < 0 || !(opt.lr > 0) || !(opt.validation > 0 && opt.validation < 1))
    fail("predictor training: bad options (batch %d, epochs %d, lr %g, validation %g)", opt.batch, opt.epochs, opt.lr, opt.validation);
  for (int64_t i = 0; i < N * K; ++i)
    if (targets[i] < 0 || targets[i] >= E) fail("predictor training: target expert %d outside 0..%d", targets[i], E - 1);
  const int64_t n_val = std::clamp<int64_t>(static_cast<int64_t>(std::llround(N * static_cast<double>(opt.validation))), 1, N);
  const int64_t n_train = N - n_val;
  if (n_train < 1) fail("predictor training: %lld rows are too few (need a training and a validation part)", (long long)N);
  std::mt19937_64 rng(opt.seed ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(head.target_layer + 1)));
  if (D > 0) {  // the branch: W1 ~ N(0, 2/H) (He), b1 = 0, W2 = 0 (the head starts as its linear part)
    std::normal_distribution<float> nd(0.0f, std::sqrt(2.0f / static_cast<float>(H)));
    head.w1.resize(static_cast<size_t>(D) * H);
    for (float& x : head.w1) x = nd(rng);
    head.b1.assign(static_cast<size_t>(D), 0.0f);
    head.w2.assign(static_cast<size_t>(E) * D, 0.0f);
  }
  const float* uv = u + n_train * H;
  const int* tv = targets + n_train * K;
  std::vector<float> sv(static_cast<size_t>(n_val * E));
  auto validate = [&](double* rk, double* r2k) {
    p.scores_normed(head, uv, n_val, sv.data());
    *rk = recall_at(sv.data(), tv, n_val, E, K, K);
    *r2k = recall_at(sv.data(), tv, n_val, E, K, 2 * K);
  };
  PredictorTrainReport rep;
  rep.train_rows = n_train;
  rep.validation_rows = n_val;
  validate(&rep.router_recall_k, &rep.router_recall_2k);
  rep.head_recall_k = rep.router_recall_k;
  rep.head_recall_2k = rep.router_recall_2k;
  PredictorHead best = head;

  std::vector<float> gw(head.w.size()), gb(head.b.size()), gw1(head.w1.size()), gb1(head.b1.size()), gw2(head.w2.size());
  Adam aw, ab, aw1, ab1, aw2;
  std::vector<float> s(static_cast<size_t>(E)), a(static_cast<size_t>(D)), g(static_cast<size_t>(E)), da(static_cast<size_t>(D));
  std::vector<int64_t> rows(static_cast<size_t>(n_train));
  std::iota(rows.begin(), rows.end(), 0);
  int step = 0;
  const float tk = 1.0f / static_cast<float>(K);
  for (int epoch = 1; epoch <= opt.epochs; ++epoch) {
    std::shuffle(rows.begin(), rows.end(), rng);
    for (int64_t b0 = 0; b0 < n_train; b0 += opt.batch) {
      const int64_t nb = std::min<int64_t>(opt.batch, n_train - b0);
      std::fill(gw.begin(), gw.end(), 0.0f), std::fill(gb.begin(), gb.end(), 0.0f);
      std::fill(gw1.begin(), gw1.end(), 0.0f), std::fill(gb1.begin(), gb1.end(), 0.0f), std::fill(gw2.begin(), gw2.end(), 0.0f);
      for (int64_t i = 0; i < nb; ++i) {
        const int64_t r = rows[static_cast<size_t>(b0 + i)];
        const float* x = u + r * H;
        // Forward: s = W x + b (+ W2 relu(W1 x + b1)); softmax; g = p - target.
        gemv(head.w.data(), x, E, H, s.data());
        for (int e = 0; e < E; ++e) s[e] += head.b[e];
        if (D > 0) {
          gemv(head.w1.data(), x, D, H, a.data());
          for (int d = 0; d < D; ++d) a[d] = std::max(0.0f, a[d] + head.b1[d]);
          for (int e = 0; e < E; ++e) {
            const float* w2 = head.w2.data() + static_cast<size_t>(e) * D;
            float acc = 0;
            for (int d = 0; d < D; ++d) acc += w2[d] * a[d];
            s[e] += acc;
          }
        }
        const float mx = *std::max_element(s.begin(), s.end());
        float sum = 0;
        for (int e = 0; e < E; ++e) sum += (g[e] = std::exp(s[e] - mx));
        for (int e = 0; e < E; ++e) g[e] /= sum;
        for (int k = 0; k < K; ++k) g[targets[r * K + k]] -= tk;
        // Backward (sums over the batch; divided by nb at the step).
        for (int e = 0; e < E; ++e) {
          const float ge = g[e];
          float* gwr = gw.data() + static_cast<size_t>(e) * H;
          for (int c = 0; c < H; ++c) gwr[c] += ge * x[c];
          gb[e] += ge;
        }
        if (D > 0) {
          std::fill(da.begin(), da.end(), 0.0f);
          for (int e = 0; e < E; ++e) {
            const float ge = g[e];
            const float* w2 = head.w2.data() + static_cast<size_t>(e) * D;
            float* gw2r = gw2.data() + static_cast<size_t>(e) * D;
            for (int d = 0; d < D; ++d) {
              gw2r[d] += ge * a[d];
              da[d] += ge * w2[d];
            }
          }
          for (int d = 0; d < D; ++d) {
            if (a[d] <= 0.0f) continue;  // ReLU: no gradient where the unit is off
            float* gw1r = gw1.data() + static_cast<size_t>(d) * H;
            for (int c = 0; c < H; ++c) gw1r[c] += da[d] * x[c];
            gb1[d] += da[d];
          }
        }
      }
      const float inv = 1.0f / static_cast<float>(nb);
      for (auto* v : {&gw, &gb, &gw1, &gb1, &gw2})
        for (float& x : *v) x *= inv;
      ++step;
      aw.step(head.w, gw, opt.lr, step);
      ab.step(head.b, gb, opt.lr, step);
      if (D > 0) {
        aw1.step(head.w1, gw1, opt.lr, step);
        ab1.step(head.b1, gb1, opt.lr, step);
        aw2.step(head.w2, gw2, opt.lr, step);
      }
    }
    double rk = 0, r2k = 0;
    validate(&rk, &r2k);
    if (rk + r2k > rep.head_recall_k + rep.head_recall_2k) {
      rep.head_recall_k = rk, rep.head_recall_2k = r2k, rep.epoch = epoch;
      best = head;
    }
  }
  head = std::move(best);
  return rep;
}

}  // namespace spool::experts
