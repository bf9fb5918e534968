// Generation of one request, step by step (GenStepper: logits in, next token or the end out —
// sampling with logit_bias, penalties and seed, --tool-syntax-greedy, stop ids and strings,
// logprobs, streaming detokenization and output parsing) and Generator, which drives one
// GenStepper on one Session through the prompt cache. The batched server engine
// (server/batch_engine.h) drives one GenStepper per slot: both paths share this code.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "constrain/token_mask.h"
#include "engine/session.h"
#include "server/output_parser.h"
#include "server/prompt_cache.h"
#include "server/request.h"
#include "server/stop_strings.h"
#include "tokenizer/stream_decoder.h"
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
  std::string stop_sequence;    ///< the request's stop string that ended the output ("" when none did)
  bool cancelled = false;       ///< the client went away (on_event or alive returned false)
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  std::string content, reasoning;
  std::vector<ToolCall> tool_calls;
  std::vector<TokenLogprob> logprobs;
  double prefill_s = 0, decode_s = 0;
};

/// One request's generation as a state machine, independent of how the forward passes are run.
/// Construct it (validates the request), feed the next-token logits of the sequence to
/// on_logits() after the prompt and after every token it returns to feed, collect events with
/// take_event(), and call finish() once on_logits() returned false. Not thread-safe.
class GenStepper {
 public:
  /// Checks the prompt ids against `vocab`, the sampling parameters and the stop strings
  /// (spool::Error / UsageError). `req` and `tok` must outlive the stepper.
  GenStepper(const GenRequest& req, const tokenizer::Tokenizer& tok, int64_t vocab, bool tool_syntax_greedy);

  /// Samples the next token from `logits` [vocab] (the model's next-token logits; copied,
  /// not modified); with req.constraint, only among the tokens its grammar allows (EOS only once
  /// the output is complete). Once req.reasoning_budget tokens were generated inside reasoning,
  /// the next tokens are req.reasoning_end instead (not sampled; they count as generated). Returns true when the token must be fed to the model (then token() is it
  /// and on_logits is called again with the logits after it); false when generation ended
  /// (stop id, stop string or max_tokens): call finish(). Throws spool::Error for non-finite
  /// logits (no token is sampled from them).
  bool on_logits(const float* logits);
  /// The token on_logits() chose last.
  int32_t token() const { return last_; }
  /// What became known since the previous take_event() (empty delta and logprobs: nothing).
  GenEvent take_event();
  /// After on_logits() returned false: flushes the detokenizer and the parser into the pending
  /// event (take it with take_event()) and returns the result (content, tool calls, reason,
  /// completion tokens, logprobs; timings and prompt counts are the caller's to fill).
  GenResult finish();
  /// Tokens generated so far.
  int64_t generated() const { return static_cast<int64_t>(generated_.size()); }

 private:
  void push_text(const std::string& text);  // decoded text to the parser (and stops_)

  const GenRequest& req_;
  const tokenizer::Tokenizer& tok_;
  int64_t vocab_;
  bool greedy_markup_;
  OutputParser parser_;
  /// The request's stop strings matched on the same text as the parser's (which does not say
  /// which one matched): GenResult::stop_sequence. Empty when the request has none.
  std::optional<StopMatcher> stops_;
  engine::Sampler sampler_, greedy_;
  tokenizer::StreamDecoder dec_;
  std::vector<int32_t> context_, generated_;
  std::vector<float> work_;
  std::optional<constrain::ConstraintState> constraint_;  // req.constraint's state (none: unconstrained)
  std::vector<uint64_t> mask_;                            // allowed tokens of this step (constrained only)
  std::vector<TokenLogprob> logprobs_;
  int64_t reasoning_tokens_ = 0;   // tokens generated inside reasoning (req.reasoning_budget)
  std::vector<int32_t> forced_;    // tokens still to emit, in order (the reasoning closer)
  bool budget_done_ = false;       // the budget ran out and the closer was forced
  GenEvent ev_;
  std::string finish_ = "length";
  int32_t last_ = -1;
};

/// Runs requests one at a time on one Session through a PromptCache (tests, and the reference
/// the batched engine is checked against).
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
