// OpenAI request bodies (/v1/chat/completions, /v1/completions) to engine requests: sampling,
// limits, stop strings, streaming and logprobs options, validated (ApiError 400 naming the
// field for any bad value).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "constrain/token_mask.h"
#include "engine/sampler.h"
#include "server/chat_prompt.h"
#include "server/lora_adapters.h"
#include "server/output_parser.h"
#include "tokenizer/tokenizer.h"

namespace spool::server {

/// Facts about the loaded model that requests are checked against.
struct ModelFacts {
  std::string name;                         ///< model id (/v1/models)
  const tokenizer::Tokenizer* tok = nullptr;  ///< null: no tokenizer (text endpoints refuse)
  ChatTemplateInfo chat;                    ///< chat template and its settings
  engine::SamplingParams defaults;          ///< generation_config.json defaults
  int64_t ctx_size = 4096;                  ///< prompt + output positions at most
  int64_t vocab_size = 0;                   ///< model vocabulary (ids must be below)
  std::vector<int32_t> stop_ids;            ///< end-of-sequence ids (generation stops, not output)
  /// --reasoning-budget: reasoning tokens a chat request may generate before the server ends the
  /// reasoning (-1 unlimited, 0 ends it at once); a request's `thinking_budget_tokens` overrides it.
  int reasoning_budget = -1;
  /// Vocabulary index for constrained decoding, built on first use (null: built per request from
  /// `tok`, for tests).
  std::shared_ptr<constrain::LazyTokenIndex> token_index;
  /// The LoRA adapters served (--lora) and their default scales; null: none.
  std::shared_ptr<LoraAdapters> lora;
};

/// One generation as the engine runs it.
struct GenRequest {
  bool chat = true;                   ///< chat.completion vs text_completion objects
  std::vector<int32_t> prompt;        ///< token ids, 1 <= size < ctx_size
  engine::SamplingParams sampling;
  bool seeded = false;                ///< `seed` was given
  int max_tokens = 0;                 ///< generated tokens at most (already capped by the context)
  std::vector<int32_t> stop_ids;      ///< ids that end generation (not part of the output)
  bool stream = false;
  bool include_usage = false;         ///< stream_options.include_usage
  bool logprobs = false;              ///< report the chosen tokens' log-probabilities
  int top_logprobs = 0;               ///< and that many alternatives per position (0..20)
  /// logit_bias: (token id, bias in [-100, 100]) added to the logits before sampling (logprobs
  /// report the unbiased distribution); ids ascending, each once.
  std::vector<std::pair<int32_t, float>> logit_bias;
  OutputParser::Options parser;       ///< stop strings, reasoning and tool-call parsing
  /// Thinking budget: once this many tokens were generated inside reasoning (OutputParser::
  /// in_reasoning), the next tokens are forced to `reasoning_end` (the family's closer,
  /// ChatFormat::reasoning_end, tokenized) and the model goes on with the answer. -1: unlimited.
  int reasoning_budget = -1;
  std::vector<int32_t> reasoning_end;
  /// Constrained decoding (server/constrained.h): the grammar the output must follow (null: none)
  /// and the vocabulary index its token masks are computed on.
  std::shared_ptr<const constrain::Constraint> constraint;
  std::shared_ptr<const constrain::TokenIndex> constraint_index;
  /// The LoRA user scale of each adapter the server runs (ModelFacts::lora order, 0 = off) for
  /// this request (LoraAdapters::for_request); empty: the adapters' defaults (or none loaded).
  std::vector<float> lora;
};

/// Parses a /v1/chat/completions body (rendering the chat template). `seed_source` gives the
/// seed when the request has none. Throws ApiError.
GenRequest parse_chat_request(const nlohmann::ordered_json& body, const ModelFacts& facts, uint64_t seed_source);

/// Parses a /v1/completions body: `prompt` is a string, an array of one string, or an array of
/// token ids (a text prompt gets the tokenizer's special tokens, Tokenizer::encode_prompt). Throws ApiError.
GenRequest parse_completion_request(const nlohmann::ordered_json& body, const ModelFacts& facts, uint64_t seed_source);

/// Ids of `text`: with `add_special`, a plain prompt's (Tokenizer::encode_prompt: the BOS of
/// tokenizers that add one, once), else the text alone; 400 when the model has no tokenizer.
std::vector<int32_t> encode_text(const ModelFacts& facts, const std::string& text, bool add_special);

}  // namespace spool::server
