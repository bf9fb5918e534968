#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "common/error.h"

namespace spool::engine {

double PerplexityResult::ppl() const { return std::exp(mean_nll()); }
double PerplexityResult::ref_ppl() const { return tokens > 0 ? std::exp(ref_sum_nll / tokens) : 0; }

namespace {
// log sum exp of logits in double.
double log_sum_exp(const float* x, int64_t n) {
  const float m = *std::max_element(x, x + n);
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(x[i] - m));
  return std::log(s) + m;
}
}  // namespace

double token_nll(const float* logits, int64_t vocab, int32_t target) {
  return log_sum_exp(logits, vocab) - static_cast<double>(logits[target]);
}

double kl_divergence(const float* p, const float* q, int64_t vocab) {
  const double lp = log_sum_exp(p, vocab), lq = log_sum_exp(q, vocab);
  double kl = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    const double a = static_cast<double>(p[i]) - lp;  // log p_i
    const double b = static_cast<double>(q[i]) - lq;  // log q_i
    kl += std::exp(a) * (a - b);
  }
  return std::max(kl, 0.0);
}


PerplexityResult perplexity(models::Model& model, std::span<const int32_t> ids, int64_t window, int64_t max_windows,
                            int64_t step, const std::function<void(int64_t, int64_t, const PerplexityResult&)>& progress,
                            models::Model* reference) {
  if (ids.size() < 2) fail("perplexity needs at least 2 tokens (got %zu)", ids.size());
  if (window <= 0) throw UsageError(strfmt("--window must be positive (got %lld)", (long long)window));
  if (step <= 0) throw UsageError(strfmt("prefill step must be positive (got %lld)", (long long)step));
  const int64_t N = static_cast<int64_t>(ids.size());
  const int64_t V = model.spec().vocab_size;
  int64_t total = (N - 1 + window - 1) / window;
  if (max_windows > 0) total = std::min(total, max_windows);
  if (reference != nullptr && reference->spec().vocab_size != V)
    fail("the reference model's vocabulary (%lld) differs from the model's (%lld)", (long long)reference->spec().vocab_size,
         (long long)V);
  PerplexityResult r;
  r.compared = reference != nullptr;
  models::State st = model.new_state();
  std::optional<models::State> ref_st;
  if (reference != nullptr) ref_st.emplace(reference->new_state());
  std::vector<float> logits, ref_logits;
  for (int64_t w = 0; w < total; ++w) {
    const int64_t s = w * window;
    const int64_t n = std::min(window, N - 1 - s);  // predicted tokens of this window
    st.reset();
    if (ref_st) ref_st->reset();
    // Score each forward step as it finishes: only step x vocab logits are held.
    double nll = 0.0;
    for (int64_t i = 0; i < n; i += step) {
      const int64_t k = std::min(step, n - i);
      logits.resize(static_cast<size_t>(k * V));
      model.forward(ids.subspan(s + i, k), st, models::LogitsMode::kAll, logits.data());
      for (int64_t j = 0; j < k; ++j) nll += token_nll(logits.data() + j * V, V, ids[s + i + j + 1]);
      if (reference != nullptr) {
        ref_logits.resize(logits.size());
        reference->forward(ids.subspan(s + i, k), *ref_st, models::LogitsMode::kAll, ref_logits.data());
        for (int64_t j = 0; j < k; ++j) {
          const float* p = ref_logits.data() + j * V;
          const float* q = logits.data() + j * V;
          r.sum_kl += kl_divergence(p, q, V);
          r.top1_agree += std::max_element(p, p + V) - p == std::max_element(q, q + V) - q;
          r.ref_sum_nll += token_nll(p, V, ids[s + i + j + 1]);
        }
      }
    }
    r.window_nll.push_back(nll);
    r.window_tokens.push_back(n);
    r.sum_nll += nll;
    r.tokens += n;
    if (progress) progress(w + 1, total, r);
  }
  return r;
}

}  // namespace spool::engine
