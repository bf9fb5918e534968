#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "common/error.h"

namespace spool::engine {

double PerplexityResult::ppl() const { return std::exp(mean_nll()); }
double PerplexityResult::ppl_stderr() const {
  if (tokens < 2) return 0;
  const double mean = sum_nll / tokens, var = sum_nll2 / tokens - mean * mean;
  return var > 0 ? std::sqrt(var / (tokens - 1)) * ppl() : 0;
}
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

namespace {

// Rows [j0, j1) of one forward step against the reference's: adds KL(P_ref || P_model), top-1
// agreement and the reference's NLL of targets[j] (the token each row predicts) to r.
void compare_rows(const float* ref_logits, const float* logits, int64_t V, int64_t j0, int64_t j1, const int32_t* targets,
                  PerplexityResult& r) {
  for (int64_t j = j0; j < j1; ++j) {
    const float* p = ref_logits + j * V;
    const float* q = logits + j * V;
    r.sum_kl += kl_divergence(p, q, V);
    r.top1_agree += std::max_element(p, p + V) - p == std::max_element(q, q + V) - q;
    r.ref_sum_nll += token_nll(p, V, targets[j]);
  }
}

// Throws unless the reference (when given) has the model's vocabulary size V.
void check_reference(const models::Model* reference, int64_t V) {
  if (reference != nullptr && reference->spec().vocab_size != V)
    fail("the reference model's vocabulary (%lld) differs from the model's (%lld)", (long long)reference->spec().vocab_size,
         (long long)V);
}

}  // namespace

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
  check_reference(reference, V);
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
      for (int64_t j = 0; j < k; ++j) {
        const double x = token_nll(logits.data() + j * V, V, ids[s + i + j + 1]);
        nll += x;
        r.sum_nll2 += x * x;
      }
      if (reference != nullptr) {
        ref_logits.resize(logits.size());
        reference->forward(ids.subspan(s + i, k), *ref_st, models::LogitsMode::kAll, ref_logits.data());
        compare_rows(ref_logits.data(), logits.data(), V, 0, k, ids.data() + s + i + 1, r);
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

PerplexityResult perplexity_llama(models::Model& model, std::span<const int32_t> ids, int64_t n_ctx, int64_t max_chunks,
                                  int64_t step, std::optional<int32_t> bos,
                                  const std::function<void(int64_t, int64_t, const PerplexityResult&)>& progress,
                                  models::Model* reference) {
  if (n_ctx < 2) throw UsageError(strfmt("--ctx-size must be at least 2 (got %lld)", (long long)n_ctx));
  if (step <= 0) throw UsageError(strfmt("prefill step must be positive (got %lld)", (long long)step));
  if (max_chunks < 0) throw UsageError("--chunks must be >= 0");
  const int64_t N = static_cast<int64_t>(ids.size());
  if (N < 2 * n_ctx)
    fail("you need at least %lld tokens to evaluate perplexity with a context of %lld (the text tokenizes to %lld)",
         (long long)(2 * n_ctx), (long long)n_ctx, (long long)N);
  const int64_t V = model.spec().vocab_size;
  if (bos && (*bos < 0 || *bos >= V)) fail("BOS id %d is outside the model's vocabulary (%lld)", *bos, (long long)V);
  int64_t total = N / n_ctx;
  if (max_chunks > 0) total = std::min(total, max_chunks);
  const int64_t first = n_ctx / 2;
  check_reference(reference, V);
  PerplexityResult r;
  r.compared = reference != nullptr;
  models::State st = model.new_state();
  std::optional<models::State> ref_st;
  if (reference != nullptr) ref_st.emplace(reference->new_state());
  std::vector<int32_t> chunk(static_cast<size_t>(n_ctx));
  std::vector<float> logits, ref_logits;
  for (int64_t c = 0; c < total; ++c) {
    std::copy_n(ids.begin() + c * n_ctx, n_ctx, chunk.begin());
    if (bos) chunk[0] = *bos;
    st.reset();
    if (ref_st) ref_st->reset();
    double nll = 0.0;
    for (int64_t i = 0; i < n_ctx; i += step) {
      const int64_t k = std::min(step, n_ctx - i);
      const std::span<const int32_t> part(chunk.data() + i, static_cast<size_t>(k));
      if (i + k <= first) {  // no scored position in this step
        model.forward(part, st, models::LogitsMode::kNone, nullptr);
        if (reference != nullptr) reference->forward(part, *ref_st, models::LogitsMode::kNone, nullptr);
        continue;
      }
      logits.resize(static_cast<size_t>(k * V));
      model.forward(part, st, models::LogitsMode::kAll, logits.data());
      const int64_t j0 = std::max<int64_t>(0, first - i);
      const int64_t j1 = std::min(k, n_ctx - 1 - i);  // the chunk's last token predicts nothing
      for (int64_t j = j0; j < j1; ++j) {
        const double x = token_nll(logits.data() + j * V, V, chunk[i + j + 1]);
        nll += x;
        r.sum_nll2 += x * x;
      }
      if (reference != nullptr) {
        ref_logits.resize(logits.size());
        reference->forward(part, *ref_st, models::LogitsMode::kAll, ref_logits.data());
        compare_rows(ref_logits.data(), logits.data(), V, j0, j1, chunk.data() + i + 1, r);
      }
    }
    const int64_t n = n_ctx - 1 - first;
    r.window_nll.push_back(nll);
    r.window_tokens.push_back(n);
    r.sum_nll += nll;
    r.tokens += n;
    if (progress) progress(c + 1, total, r);
  }
  return r;
}

}  // namespace spool::engine
