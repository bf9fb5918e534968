// Anthropic Messages API responses: the message object, usage, stop reasons, error objects and
// the Server-Sent Events of a streamed message (docs.anthropic.com "Messages" and "Streaming
// Messages").
//
// Content blocks, in this order: a thinking block (the output parser's reasoning), a text block
// (the content; left out when empty), then one tool_use block per parsed tool call with its
// arguments as the `input` object. A stream sends: message_start, ping, then per block
// content_block_start / content_block_delta (thinking_delta, text_delta, input_json_delta) /
// content_block_stop, then message_delta (stop_reason, stop_sequence, usage) and message_stop;
// every event has an `event:` line naming its type and a `data:` line with the JSON. Thinking
// blocks carry "signature": "" (spool has nothing to sign; clients send it back, it is ignored).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "server/generator.h"

namespace spool::server {

/// HTTP status of an error on an Anthropic route: 503 (busy, loading, shutting down) becomes
/// 529, Anthropic's "overloaded" status; other statuses are kept.
int anthropic_status(int status);

/// Anthropic error type for an HTTP status (after anthropic_status): 400 invalid_request_error,
/// 401 authentication_error, 403 permission_error, 404 not_found_error, 413
/// request_too_large, 429 rate_limit_error, 529 overloaded_error, other 4xx
/// invalid_request_error, 5xx api_error.
std::string anthropic_error_type(int status);

/// {"type": "error", "error": {"type": `type`, "message": `message`}}.
nlohmann::ordered_json anthropic_error_json(const std::string& type, const std::string& message);

/// stop_reason of a finished generation: "stop_sequence" when a stop string ended it,
/// "tool_use" when it ended with tool calls, "max_tokens" at the length limit, else "end_turn".
std::string anthropic_stop_reason(const GenResult& r);

/// usage: input_tokens (prompt tokens not read from the prompt cache), output_tokens,
/// cache_read_input_tokens (prompt tokens the prompt cache reused), cache_creation_input_tokens
/// (always 0: spool caches prompts without explicit cache writes).
nlohmann::ordered_json anthropic_usage_json(const GenResult& r);

/// The non-streamed message object {id, type: "message", role: "assistant", model, content,
/// stop_reason, stop_sequence, usage}.
nlohmann::ordered_json anthropic_message_json(const std::string& id, const std::string& model, const GenResult& r);

/// One SSE event: "event: <j.type>\ndata: <j>\n\n".
std::string anthropic_sse_event(const nlohmann::ordered_json& j);

/// The events of one streamed message, produced from the engine's messages in order: start()
/// once, delta() per GenEvent, then finish() (or error()). Returns SSE text to write.
class AnthropicStream {
 public:
  /// `input_tokens`: the prompt's size (message_start's usage; message_delta gives the split
  /// into cache reads and new tokens).
  AnthropicStream(std::string id, std::string model, int64_t input_tokens);

  /// message_start (empty content, null stop_reason) and a ping.
  std::string start() const;
  /// The events for parsed output: reasoning, then content, then tool-call pieces; a block of
  /// another kind (or another tool call) closes the open block and starts the next index.
  std::string delta(const OutputDelta& d);
  /// Closes the open block, then message_delta and message_stop.
  std::string finish(const GenResult& r);
  /// An `error` event (the stream ends after it).
  static std::string error(int status, const std::string& message);
  /// A `ping` event (keep-alive while the engine is busy).
  static std::string ping();

 private:
  enum class Block { kNone, kThinking, kText, kToolUse };
  std::string open(Block kind, const nlohmann::ordered_json& block);
  std::string close();

  std::string id_, model_;
  int64_t input_tokens_;
  Block open_ = Block::kNone;
  int open_call_ = -1;  // the tool call index of the open tool_use block
  int index_ = -1;      // the open (or last) block's index
};

}  // namespace spool::server
