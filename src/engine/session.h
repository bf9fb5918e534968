// Session: one sequence's state plus the prefill/decode/sample loop.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/speculative.h"
#include "models/model.h"

namespace spool::engine {

/// What to generate.
struct GenerateRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 256;            // generated tokens at most
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;   // generation ends after any of these (the id is kept in output)
  int64_t prefill_step = 512;      // prompt tokens per forward() call (--prefill-step-size)
  int64_t ctx_size = 0;            // prompt + output positions at most (0 = no limit)
  SpecParams spec;                 // speculative decoding (--spec mtp, --draft-max)
};

/// Wall-clock timings of one generate() call (seconds).
struct Timings {
  double prefill_s = 0, decode_s = 0;
  int64_t prompt_tokens = 0, decode_forwards = 0;
  int64_t decode_tokens = 0;  // tokens generated after the first (= decode_forwards without speculation)
  double prefill_tok_s() const { return prefill_s > 0 ? prompt_tokens / prefill_s : 0; }
  double decode_tok_s() const { return decode_s > 0 ? decode_tokens / decode_s : 0; }
};

struct GenerateResult {
  std::vector<int32_t> output;  // generated ids (including a final stop id, if any)
  std::string finish_reason;    // "stop" (stop id or callback) or "length"
  Timings timings;
  SpecStats spec;               // speculative decoding (zeros without --spec)
};

class Session {
 public:
  explicit Session(models::Model& model);

  /// Resets the state and generates from req.prompt. on_token(id) is called for every
  /// generated id; returning false stops generation (finish_reason "stop").
  /// Throws spool::Error for an empty prompt, a prompt longer than ctx_size, bad ids or
  /// non-finite logits.
  GenerateResult generate(const GenerateRequest& req, const std::function<bool(int32_t)>& on_token);

  /// Feeds `ids` in chunks of `step`, keeping the last token's logits in logits().
  void prefill(std::span<const int32_t> ids, int64_t step);
  /// Feeds one token; logits() then holds the next-token logits.
  void decode(int32_t id);
  /// LoRA user scales for the next prefill() and decode() calls (models::SeqStep::lora: one per
  /// adapter of the model; empty = the adapters' defaults).
  void set_lora(std::vector<float> scales) { lora_ = std::move(scales); }
  const std::vector<float>& logits() const { return logits_; }
  models::State& state() { return state_; }
  models::Model& model() { return model_; }

 private:
  // generate() with req.spec.mtp (engine/speculative.h).
  GenerateResult generate_mtp(const GenerateRequest& req, const std::function<bool(int32_t)>& on_token, Sampler& sampler);
  models::Model& model_;
  models::State state_;
  std::vector<float> logits_;
  std::vector<float> lora_;  // set_lora
};

}  // namespace spool::engine
