// Perplexity over a token sequence with the golden's window definition: window k is
// ids[w*k : w*k + w + 1] (neighbouring windows share one boundary token), scored with fresh
// state; it predicts ids[w*k + 1 : w*k + w + 1], so every token but the first is predicted
// exactly once. NLL in nats, log-softmax in double.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "models/model.h"

namespace spool::engine {

struct PerplexityResult {
  int64_t tokens = 0;               // predicted tokens
  double sum_nll = 0;               // nats
  double sum_nll2 = 0;              // sum of squared per-token NLL (nats^2), for ppl_stderr()
  std::vector<double> window_nll;   // summed NLL per window
  std::vector<int64_t> window_tokens;
  // Against a reference model (perplexity(..., reference)): summed KL(P_ref || P_model) in
  // nats, predicted tokens whose argmax agrees, and the reference's own summed NLL.
  bool compared = false;
  double sum_kl = 0;
  int64_t top1_agree = 0;
  double ref_sum_nll = 0;
  double mean_nll() const { return tokens > 0 ? sum_nll / tokens : 0; }
  double ppl() const;
  /// llama-perplexity's "+/-" of its final estimate: ppl * sqrt((E[nll^2] - E[nll]^2) / (n - 1));
  /// 0 with fewer than 2 tokens.
  double ppl_stderr() const;
  /// Mean KL divergence to the reference per predicted token (nats).
  double mean_kl() const { return tokens > 0 ? sum_kl / tokens : 0; }
  /// Fraction of predicted tokens whose top-1 token equals the reference's.
  double top1_agreement() const { return tokens > 0 ? static_cast<double>(top1_agree) / tokens : 0; }
  /// The reference model's perplexity on the same tokens.
  double ref_ppl() const;
};

/// Scores `ids` in windows of `window` predicted tokens; at most `max_windows` windows
/// (0 = all). Each window is run in forward() calls of `step` tokens. `progress(done, total)`
/// is called after each window. With `reference` (same vocabulary), every step also runs the
/// reference on the same tokens and accumulates KL(P_ref || P_model) and top-1 agreement.
/// Throws spool::Error if fewer than 2 ids are given or the vocabularies differ.
PerplexityResult perplexity(models::Model& model, std::span<const int32_t> ids, int64_t window, int64_t max_windows,
                            int64_t step, const std::function<void(int64_t, int64_t, const PerplexityResult&)>& progress,
                            models::Model* reference = nullptr);

/// llama.cpp's llama-perplexity definition (tools/perplexity, read for facts): `ids` (already
/// holding the leading BOS when the vocabulary adds one) is cut into N / n_ctx chunks of n_ctx
/// tokens (the tail is dropped; at most `max_chunks`, 0 = all); each chunk runs with fresh state,
/// its first token replaced by `bos` when given; only the second half is scored: the logits at
/// positions first = n_ctx / 2 .. n_ctx - 2 predict the next token, n_ctx - 1 - first tokens per
/// chunk. window_nll / window_tokens hold each chunk's sums; `progress(done, total, acc)` runs
/// after each chunk (acc.ppl() is llama-perplexity's running "[k]ppl" value). Forward calls of
/// `step` tokens; positions before `first` are run without logits. Throws spool::Error when the
/// text has fewer than 2 * n_ctx tokens (llama-perplexity's requirement), UsageError on
/// n_ctx < 2 or step < 1. With `reference` (same vocabulary), it runs the same chunks and the
/// scored positions also accumulate KL(P_ref || P_model), top-1 agreement and the reference's NLL
/// (llama-perplexity --kl-divergence's "Mean KLD" and "Same top p" over the same tokens).
PerplexityResult perplexity_llama(models::Model& model, std::span<const int32_t> ids, int64_t n_ctx, int64_t max_chunks,
                                  int64_t step, std::optional<int32_t> bos,
                                  const std::function<void(int64_t, int64_t, const PerplexityResult&)>& progress,
                                  models::Model* reference = nullptr);

/// KL(P || Q) in nats of the softmax distributions of logits p and q (vocab entries each),
/// computed in double.
double kl_divergence(const float* p, const float* q, int64_t vocab);

/// -log softmax(logits)[target] in double precision.
double token_nll(const float* logits, int64_t vocab, int32_t target);

}  // namespace spool::engine
