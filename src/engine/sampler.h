// Token sampling from logits: penalties, temperature, top-k, top-p, min-p (HF
// generation order: repetition penalty -> temperature -> top_k -> top_p -> min_p), seeded RNG.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace spool::io {
struct GenerationDefaults;
}

namespace spool::engine {

/// Sampling parameters; names follow llama.cpp flags and OpenAI/HF fields.
struct SamplingParams {
  float temperature = 0.8f;         // 0 = greedy (argmax)
  float top_p = 0.95f;              // 1 = off
  int top_k = 40;                   // 0 = off
  float min_p = 0.05f;              // 0 = off; keep tokens with p >= min_p * p_max
  float repetition_penalty = 1.0f;  // HF: logit / r if > 0 else logit * r, for tokens seen so far
  float presence_penalty = 0.0f;    // OpenAI: - presence for each token generated at least once
  float frequency_penalty = 0.0f;   // OpenAI: - frequency * count for generated tokens
  uint64_t seed = 0;

  /// Throws spool::UsageError naming the parameter when a value is out of range
  /// (temperature < 0, top_p outside (0, 1], top_k < 0, min_p outside [0, 1],
  /// repetition_penalty <= 0, penalties outside [-2, 2]).
  void validate() const;
};

/// spool's defaults overridden by a checkpoint's generation_config.json (do_sample false means
/// greedy), validated: an out-of-range value throws spool::Error naming generation_config.json.
SamplingParams sampling_defaults(const io::GenerationDefaults& g);

class Sampler {
 public:
  Sampler(SamplingParams p, int64_t vocab_size);
  /// Picks the next token. `logits` [vocab] is modified (penalties, temperature). `context`
  /// holds prompt + generated ids (repetition penalty); `generated` the generated ids only
  /// (presence/frequency penalties). Throws spool::Error if any logit is NaN or infinite.
  /// `allowed` (constrained decoding; null = every token): a bit mask of ceil(vocab/64) words,
  /// bit (id % 64) of word id / 64 set when token id may be chosen; the others get -inf before
  /// penalties, temperature and the truncations, so they are never sampled. At least one token
  /// must be allowed (spool::Error otherwise). Without a mask this costs nothing extra.
  int32_t sample(float* logits, std::span<const int32_t> context, std::span<const int32_t> generated,
                 const uint64_t* allowed = nullptr);

  /// The distribution sample() draws from: the kept candidates (ids best first) and their
  /// unnormalised probabilities (total = their sum). Greedy (temperature 0): the argmax alone.
  struct Distribution {
    std::vector<int32_t> ids;
    std::vector<double> prob;
    double total = 0;
    /// Normalised probability of `id` (0 when it is not kept).
    double p(int32_t id) const;
  };
  /// The same transforms as sample() (mask, penalties, temperature, top-k, top-p, min-p) on
  /// `logits` (modified), writing the result into `out` instead of drawing. Same errors.
  void distribution(float* logits, std::span<const int32_t> context, std::span<const int32_t> generated, Distribution& out,
                    const uint64_t* allowed = nullptr);
  /// Draws from `d` (one uniform number; none for a single candidate): what sample() returns.
  int32_t draw(const Distribution& d);
  /// A uniform number in [0, 1) from this sampler's generator (speculative acceptance tests).
  double uniform();
  /// Log-probabilities of the last sample()'s distribution before truncation are not kept;
  /// this returns log_softmax of `logits` for token `id` (for logprobs reporting).
  static float log_prob(const float* logits, int64_t vocab, int32_t id);
  const SamplingParams& params() const { return p_; }

 private:
  SamplingParams p_;
  int64_t vocab_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> cand_;
  std::vector<int32_t> counts_;
  Distribution dist_;
};

}  // namespace spool::engine
