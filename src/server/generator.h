// Generator: runs one GenRequest on the engine — prompt-cache prefill, sampling (logit_bias, penalties,
// seed, --tool-syntax-greedy), stop ids and strings, streaming detokenization and output
// parsing — and reports what became known after each token.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/session.h"
#include "server/output_parser.h"
#include "server/prompt_cache.h"
#include "server/request.h"
#include "tokenizer/tokenizer.h"

namespace spool::server {

/// Log-probability of one generated token (natural log, of the model's distribution before
/// penalties and temperature), with the `top` most likely alternatives.
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  ///< (id, logprob), most likely first
};

/// What became known after one step (a generated token, or the end).
struct GenEvent {
  OutputDelta delta;                    ///< parsed text since the previous event
  std::vector<TokenLogprob> logprobs;   ///< tokens generated since the previous event (req.logprobs)
};

/// Outcome of a request.
struct GenResult {
  std::string finish_reason;    ///< "stop", "length" or "tool_calls"; "" when cancelled
  bool cancelled = false;       ///< the client went away (on_event or alive returned false)
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;
  std::vector<TokenLogprob> logprobs;
  double prefill_s = 0, decode_s = 0;
};

class Generator {
 public:
  /// `tok` decodes output (required); with `tool_syntax_greedy`, tokens are chosen by argmax
  /// while the output parser reports in_markup().
  Generator(engine::Session& session, PromptCache& cache, const tokenizer::Tokenizer& tok, bool tool_syntax_greedy);

  /// Runs `req`. `on_event` gets every non-empty event (and the final one); returning false
  /// cancels. `alive` is polled between prefill chunks and tokens; false cancels. Throws
  /// spool::Error when the model fails (e.g. non-finite logits: no token is sampled from them).
  GenResult run(const GenRequest& req, const std::function<bool(const GenEvent&)>& on_event, const std::function<bool()>& alive);

 private:
  engine::Session& session_;
  PromptCache& cache_;
  tokenizer::Tokenizer tok_;
  bool greedy_markup_;
};

/// log_softmax of `logits` [vocab] for `id` and the `k` most likely tokens (ties by lower id).
TokenLogprob token_logprob(const float* logits, int64_t vocab, int32_t id, int k);

}  // namespace spool::server
