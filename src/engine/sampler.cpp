#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/error.h"
#include "io/config.h"

namespace spool::engine {

void SamplingParams::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) throw UsageError(strfmt("temperature must be >= 0 (got %g)", temperature));
  if (!(top_p > 0.0f && top_p <= 1.0f)) throw UsageError(strfmt("top_p must be in (0, 1] (got %g)", top_p));
  if (top_k < 0) throw UsageError(strfmt("top_k must be >= 0 (got %d)", top_k));
  if (!(min_p >= 0.0f && min_p <= 1.0f)) throw UsageError(strfmt("min_p must be in [0, 1] (got %g)", min_p));
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty))
    throw UsageError(strfmt("repetition penalty must be > 0 (got %g)", repetition_penalty));
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    throw UsageError(strfmt("presence_penalty must be in [-2, 2] (got %g)", presence_penalty));
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    throw UsageError(strfmt("frequency_penalty must be in [-2, 2] (got %g)", frequency_penalty));
}

SamplingParams sampling_defaults(const io::GenerationDefaults& g) {
  SamplingParams p;  // spool defaults: 0.8 / 0.95 / 40 / 0.05 / 1.0
  if (g.do_sample.has_value() && !*g.do_sample) p.temperature = 0.0f;
  if (g.temperature) p.temperature = static_cast<float>(*g.temperature);
  if (g.top_p) p.top_p = static_cast<float>(*g.top_p);
  if (g.top_k) p.top_k = static_cast<int>(*g.top_k);
  if (g.min_p) p.min_p = static_cast<float>(*g.min_p);
  if (g.repetition_penalty) p.repetition_penalty = static_cast<float>(*g.repetition_penalty);
  // A bad file is an error (exit 1) naming the file, not a usage error.
  try {
    p.validate();
  } catch (const UsageError& e) {
    throw Error(strfmt("generation_config.json: %s", e.what()));
  }
  return p;
}

Sampler::Sampler(SamplingParams p, int64_t vocab_size) : p_(p), vocab_(vocab_size), rng_(p.seed) {}

float Sampler::log_prob(const float* logits, int64_t vocab, int32_t id) {
  float m = *std::max_element(logits, logits + vocab);
  double s = 0.0;
  for (int64_t i = 0; i < vocab; ++i) s += std::exp(static_cast<double>(logits[i]) - m);
  return static_cast<float>(logits[id] - m - std::log(s));
}

double Sampler::Distribution::p(int32_t id) const {
  if (total <= 0) return 0;
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == id) return prob[i] / total;
  return 0;
}

double Sampler::uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

int32_t Sampler::sample(float* logits, std::span<const int32_t> context, std::span<const int32_t> generated, const uint64_t* allowed) {
  distribution(logits, context, generated, dist_, allowed);
  return draw(dist_);
}

int32_t Sampler::draw(const Distribution& d) {
  if (d.ids.size() == 1 && p_.temperature == 0.0f) return d.ids[0];  // greedy: no random number
  std::uniform_real_distribution<double> u(0.0, d.total);
  double r = u(rng_), acc = 0.0;
  const size_t n = d.ids.size();
  for (size_t i = 0; i < n; ++i) {
    acc += d.prob[i];
    if (r < acc) return d.ids[i];
  }
  // Rounding left r at the total: the last candidate of non-zero probability (a masked token
  // has probability 0 and is never returned).
  for (size_t i = n; i-- > 0;)
    if (d.prob[i] > 0) return d.ids[i];
  return d.ids[0];
}

void Sampler::distribution(float* logits, std::span<const int32_t> context, std::span<const int32_t> generated, Distribution& out,
                           const uint64_t* allowed) {
  for (int64_t i = 0; i < vocab_; ++i)
    if (!std::isfinite(logits[i]))
      fail("the model produced a non-finite logit (%s) for token %lld; refusing to sample", std::isnan(logits[i]) ? "NaN" : "inf",
           (long long)i);
  if (allowed) {
    bool any = false;
    for (int64_t i = 0; i < vocab_; ++i) {
      const bool ok = (allowed[i >> 6] >> (i & 63)) & 1;
      any = any || ok;
      if (!ok) logits[i] = -std::numeric_limits<float>::infinity();
    }
    if (!any) fail("constrained decoding: no token is allowed at this step");
  }
  if (p_.repetition_penalty != 1.0f) {
    // Each distinct token once (HF gathers, penalises and scatters).
    std::vector<char> seen(vocab_, 0);
    for (int32_t id : context) {
      if (id < 0 || id >= vocab_ || seen[id]) continue;
      seen[id] = 1;
      logits[id] = logits[id] > 0 ? logits[id] / p_.repetition_penalty : logits[id] * p_.repetition_penalty;
    }
  }
  if (p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f) {
    counts_.assign(vocab_, 0);
    for (int32_t id : generated)
      if (id >= 0 && id < vocab_) ++counts_[id];
    for (int64_t i = 0; i < vocab_; ++i)
      if (counts_[i] > 0) logits[i] -= p_.presence_penalty + p_.frequency_penalty * counts_[i];
  }
  out.ids.clear();
  out.prob.clear();
  if (p_.temperature == 0.0f) {
    out.ids.push_back(static_cast<int32_t>(std::max_element(logits, logits + vocab_) - logits));
    out.prob.push_back(1.0);
    out.total = 1.0;
    return;
  }
  // Candidates sorted by logit (descending); truncations keep prefixes.
  cand_.resize(vocab_);
  for (int64_t i = 0; i < vocab_; ++i) cand_[i] = {logits[i] / p_.temperature, static_cast<int32_t>(i)};
  auto by_logit = [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; };
  int64_t n = vocab_;
  if (p_.top_k > 0 && p_.top_k < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = p_.top_k;
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Softmax over the kept candidates.
  std::vector<double> prob(n);
  const double m = cand_[0].first;
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    prob[i] = std::exp(cand_[i].first - m);
    s += prob[i];
  }
  for (auto& x : prob) x /= s;
  if (p_.top_p < 1.0f) {
    // HF TopPWarper keeps the smallest prefix whose mass reaches top_p (at least one token).
    double cum = 0.0;
    int64_t keep = n;
    for (int64_t i = 0; i < n; ++i) {
      cum += prob[i];
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  if (p_.min_p > 0.0f) {
    const double thr = p_.min_p * prob[0];
    int64_t keep = 1;
    while (keep < n && prob[keep] >= thr) ++keep;
    n = keep;
  }
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += prob[i];
  out.ids.resize(n);
  out.prob.assign(prob.begin(), prob.begin() + n);
  for (int64_t i = 0; i < n; ++i) out.ids[i] = cand_[i].second;
  out.total = total;
}

}  // namespace spool::engine
