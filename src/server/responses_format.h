// OpenAI Responses API output: the `response` object (output items, usage, status) of a
// finished generation, and the Server-Sent Events of a streamed one (ResponsesStream).
//
// Output items: {"type": "reasoning", "id": "rs_…", "summary": [], "content": [{"type":
// "reasoning_text", "text"}]} for reasoning, {"type": "message", "id": "msg_…", "role":
// "assistant", "status", "content": [{"type": "output_text", "text", "annotations": []}]} for
// text, {"type": "function_call", "id": "fc_…", "call_id", "name", "arguments", "status"} per
// tool call. A generation cut by max_output_tokens is status "incomplete" with
// incomplete_details.reason "max_output_tokens" (its last item "incomplete" too).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/generator.h"

namespace spool::server {

/// Request fields the response object echoes, and its identity.
struct ResponsesEcho {
  std::string id;           ///< "resp_…"
  int64_t created_at = 0;   ///< Unix seconds
  std::string model;
  nlohmann::ordered_json instructions;       ///< string or null
  nlohmann::ordered_json max_output_tokens;  ///< integer or null
  nlohmann::ordered_json previous_response_id;  ///< string or null
  nlohmann::ordered_json reasoning = nlohmann::ordered_json{{"effort", nullptr}, {"summary", nullptr}};
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  nlohmann::ordered_json tool_choice = "auto";
  nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
  double temperature = 1, top_p = 1;  ///< the sampling values used
  bool parallel_tool_calls = true, store = true;
};

/// Makes item ids: `prefix` ("msg_", "rs_", "fc_") + a unique suffix.
using ItemIdSource = std::function<std::string(const std::string& prefix)>;

/// The response object with status "in_progress", "completed" or "incomplete", `output`
/// items and `usage` (null when `usage` is null).
nlohmann::ordered_json response_object(const ResponsesEcho& e, const std::string& status, const nlohmann::ordered_json& output,
                                       const nlohmann::ordered_json& usage);

/// usage: input_tokens (+ input_tokens_details.cached_tokens), output_tokens (+
/// output_tokens_details.reasoning_tokens: `reasoning_tokens`, capped at output_tokens),
/// total_tokens.
nlohmann::ordered_json responses_usage(const GenResult& r, int64_t reasoning_tokens);

/// The output items of a finished generation, in the order reasoning, message, function calls
/// (the message is left out when it would be empty and there are tool calls).
nlohmann::ordered_json output_items(const GenResult& r, const ItemIdSource& ids);

/// The whole response object of a finished generation: completed, or incomplete when
/// finish_reason is "length".
nlohmann::ordered_json finished_response(const ResponsesEcho& e, const GenResult& r, const nlohmann::ordered_json& output,
                                         int64_t reasoning_tokens);

/// `event: TYPE\ndata: JSON\n\n` for an event object carrying "type".
std::string sse_event(const nlohmann::ordered_json& event);

/// The event sequence of one streamed response. Feed it the parser's deltas in order
/// (on_delta) and the result at the end (finish); each call returns the events to send, each
/// with `type` and a `sequence_number` counting from 0. Items open and close as the kind of
/// text changes: reasoning -> response.output_item.added, response.content_part.added
/// (reasoning_text), response.reasoning_text.delta…, then at the next item or the end
/// response.reasoning_text.done, response.content_part.done, response.output_item.done;
/// content -> the same with output_text; a tool call -> output_item.added (function_call),
/// response.function_call_arguments.delta…, .done, output_item.done. Content after a tool call
/// opens a new message item.
class ResponsesStream {
 public:
  ResponsesStream(ResponsesEcho echo, ItemIdSource ids);
  /// response.created and response.in_progress.
  std::vector<nlohmann::ordered_json> start();
  /// Events for one parser delta.
  std::vector<nlohmann::ordered_json> on_delta(const OutputDelta& d);
  /// Closes the open item and returns its events and response.completed (or
  /// response.incomplete when finish_reason is "length"), whose response carries the items
  /// streamed and the usage.
  std::vector<nlohmann::ordered_json> finish(const GenResult& r, int64_t reasoning_tokens);
  /// An "error" event (message, code null, param) that ends a stream which failed midway.
  std::vector<nlohmann::ordered_json> error(const std::string& message, const std::string& param);
  /// The output items so far (closed ones complete, the open one as far as streamed).
  const nlohmann::ordered_json& output() const { return output_; }

 private:
  enum class Kind { kNone, kReasoning, kMessage, kCall };
  void emit(nlohmann::ordered_json ev);
  void open(Kind k, const ToolCallDelta* call);
  void close(const std::string& status);

  ResponsesEcho echo_;
  ItemIdSource ids_;
  int64_t seq_ = 0;
  std::vector<nlohmann::ordered_json> out_;  // events of the current call
  nlohmann::ordered_json output_ = nlohmann::ordered_json::array();
  Kind open_ = Kind::kNone;
  std::string text_;  // the open item's text or arguments
  std::vector<int> call_item_;  // tool-call index -> output index
};

}  // namespace spool::server
