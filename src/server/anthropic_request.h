// Anthropic Messages API request bodies (POST /v1/messages, /v1/messages/count_tokens) to the
// OpenAI chat request the rest of the server renders and runs: `system` and `messages` (text,
// tool_use, tool_result and thinking blocks) become OpenAI messages, `tools` become function
// tools, `tool_choice` / `thinking` / sampling fields are checked and mapped. Pure JSON: no
// model is needed (the libFuzzer target fuzz/anthropic_request_fuzz.cpp drives it alone).
//
// Mapping (docs.anthropic.com "Messages" reference; llama.cpp's server maps the same way):
//  * system (a string or text blocks, joined with "\n") -> a leading {"role": "system"} message
//    (none when empty);
//  * a user turn's text blocks -> {"role": "user"} messages; each tool_result block ->
//    {"role": "tool", "tool_call_id": tool_use_id, "content": its text}, in block order;
//  * an assistant turn -> one {"role": "assistant"} message: text blocks joined with "\n" as
//    content, thinking blocks as reasoning_content, tool_use blocks as tool_calls
//    ({id, type: "function", function: {name, arguments: the input as JSON text with Python
//    json.dumps separators, as Qwen models write arguments, so re-rendered turns match the
//    generated tokens and the prompt cache reuses them});
//    redacted_thinking blocks are dropped (their data is opaque);
//  * tools [{name, description, input_schema}] -> [{"type": "function", "function": {name,
//    description, parameters}}];
//  * tool_choice auto / any / tool -> the tools are rendered, and the chat tool_choice "auto" /
//    "required" / that function (any / tool are enforced by constrained decoding,
//    server/constrained.h); none -> no tools in the prompt and no tool-call parsing;
//  * thinking {type: enabled} / {type: disabled} -> chat_template_kwargs.enable_thinking
//    true / false; {type: adaptive} leaves the template's default; budget_tokens ->
//    thinking_budget_tokens (the server ends the reasoning after that many tokens);
//  * max_tokens, temperature (0..1), top_p, top_k -> the same OpenAI fields; stop_sequences are
//    returned apart (AnthropicRequest::stop_sequences) so that the response can name the one
//    that matched.
// Every wrong input is an ApiError 400 (invalid_request_error) naming the field, e.g.
// "messages[1].content[0].type".
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace spool::server {

/// A checked Anthropic request and the OpenAI chat request it maps to.
struct AnthropicRequest {
  /// OpenAI chat request: messages, tools, tool_choice, chat_template_kwargs, max_tokens,
  /// temperature, top_p, top_k, stream (only the fields that were given).
  nlohmann::ordered_json chat;
  /// stop_sequences (non-empty strings), in request order.
  std::vector<std::string> stop_sequences;
  /// tool_choice.type: "auto" (also when absent), "any", "tool" or "none". "any" and "tool"
  /// render the prompt as "auto" does and force a call (one of the tools / the named one) by
  /// constrained decoding.
  std::string tool_choice = "auto";
  /// tool_choice.name when tool_choice is "tool" (a name among `tools`).
  std::string tool_name;
  bool stream = false;
  int64_t max_tokens = 0;  ///< >= 1 for /v1/messages; 0 when absent (count_tokens)
};

/// Checks and maps an Anthropic Messages request body (see the file comment). With
/// `count_tokens` (POST /v1/messages/count_tokens) max_tokens is optional and sampling fields
/// are ignored. Throws ApiError 400 for every malformed or unsupported field (image and
/// document blocks, server tools, a final assistant message used as prefill).
AnthropicRequest parse_anthropic_request(const nlohmann::ordered_json& body, bool count_tokens);

}  // namespace spool::server
