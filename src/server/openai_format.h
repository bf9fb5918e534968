// OpenAI response objects: chat.completion, chat.completion.chunk, text_completion, usage,
// logprobs, and Server-Sent Events framing.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "server/generator.h"
#include "tokenizer/tokenizer.h"

namespace spool::server {

/// Identity shared by every object of one response.
struct ResponseMeta {
  std::string id;       ///< "chatcmpl-..." or "cmpl-..."
  int64_t created = 0;  ///< Unix seconds
  std::string model;
};

/// usage: prompt/completion/total tokens and prompt_tokens_details.cached_tokens.
nlohmann::ordered_json usage_json(const GenResult& r);

/// The non-streamed chat.completion object.
nlohmann::ordered_json chat_completion_json(const ResponseMeta& m, const GenResult& r, bool logprobs, const tokenizer::Tokenizer& tok);

/// One chat.completion.chunk with `delta` (role/content/reasoning_content/tool_calls) and
/// finish_reason (null when empty); `logprobs` entries when requested.
nlohmann::ordered_json chat_chunk_json(const ResponseMeta& m, const nlohmann::ordered_json& delta, const std::string& finish_reason,
                                       const std::vector<TokenLogprob>* logprobs, const tokenizer::Tokenizer& tok);

/// The delta object of a GenEvent (empty object when it carries no text).
nlohmann::ordered_json delta_json(const OutputDelta& d);

/// The final chunk of a stream with include_usage: empty choices and the usage.
nlohmann::ordered_json usage_chunk_json(const ResponseMeta& m, const GenResult& r, bool chat);

/// The non-streamed text_completion object.
nlohmann::ordered_json completion_json(const ResponseMeta& m, const GenResult& r, bool logprobs, const tokenizer::Tokenizer& tok);

/// One streamed text_completion chunk.
nlohmann::ordered_json completion_chunk_json(const ResponseMeta& m, const std::string& text, const std::string& finish_reason,
                                             const std::vector<TokenLogprob>* logprobs, const tokenizer::Tokenizer& tok);

/// "data: <json>\n\n" (invalid UTF-8 cannot occur: every string is valid; replaced if it did).
std::string sse_data(const nlohmann::ordered_json& j);

/// A response id: `prefix` + 24 random hex digits.
std::string new_response_id(const std::string& prefix);

}  // namespace spool::server
