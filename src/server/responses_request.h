// OpenAI Responses API request bodies (POST /v1/responses) to the chat-completions form the
// rest of the server runs: validation of every field spool reads (ApiError 400 naming the
// field, as "input[2].content[0].text"), normalization of `input` into items, the conversion
// of items (plus a stored conversation for previous_response_id) into chat `messages`, flat
// function tools into chat tools, and `reasoning.effort` into the chat template's switch.
//
// Supported: `input` (string, or items: messages with role user/assistant/system/developer and
// content as a string or input_text/output_text/refusal parts; function_call; function_call_output;
// reasoning), `instructions`, function `tools`, `tool_choice` "auto"/"none" ("none" leaves the
// tools out of the prompt)/"required"/{"type": "function", "name"} (the call forced by constrained
// decoding, server/constrained.h), `max_output_tokens`, `temperature`, `top_p`, `reasoning.effort`,
// `previous_response_id`, `store`, `stream`, `metadata`, `parallel_tool_calls`, `text.format`
// text / json_object / json_schema (constrained decoding); accepted and ignored: include, user, safety_identifier, prompt_cache_key,
// service_tier, stream_options, truncation, text.verbosity, reasoning.summary, model. Extensions
// (as /v1/chat/completions takes them): stop, seed, logit_bias, top_k, min_p, repetition_penalty,
// presence_penalty, frequency_penalty.
// Refused with 400: tool_choice allowed_tools, non-function tools, non-text content
// parts (images, files, audio), item types other than the four above, background, conversation, prompt, max_tool_calls, top_logprobs > 0.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace spool::server {

/// A validated /v1/responses body.
struct ResponsesRequest {
  /// This request's input as normalized items (an array), each one of:
  ///  {"type": "message", "role", "content": [{"type": "input_text"|"output_text", "text"}]},
  ///  {"type": "function_call", "call_id", "name", "arguments"},
  ///  {"type": "function_call_output", "call_id", "output"} (output a string),
  ///  {"type": "reasoning", "content": [{"type": "reasoning_text", "text"}]}.
  nlohmann::ordered_json input = nlohmann::ordered_json::array();
  std::optional<std::string> instructions;        ///< the system message (not carried to later turns)
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  ///< function tools as given (flat form)
  nlohmann::ordered_json tool_choice = "auto";     ///< "auto", "none", "required" or {"type": "function", "name"}
  /// text.format as the chat path's response_format ({"type": "json_object"} or {"type":
  /// "json_schema", "json_schema": {...}}); null for text.
  nlohmann::ordered_json response_format;
  std::optional<std::string> previous_response_id;
  bool store = true;
  bool stream = false;
  bool parallel_tool_calls = true;                 ///< accepted and echoed; not enforced
  nlohmann::ordered_json metadata = nlohmann::ordered_json::object();  ///< up to 16 string pairs
  std::optional<int64_t> max_output_tokens;
  std::optional<double> temperature, top_p;
  std::optional<std::string> reasoning_effort;     ///< none, minimal, low, medium, high, xhigh
  std::optional<std::string> reasoning_summary;    ///< accepted and echoed; no summaries are written
  /// spool's chat-completions sampling extensions given in the body (stop, seed, logit_bias,
  /// top_k, min_p, repetition_penalty, presence_penalty, frequency_penalty), passed on as they
  /// are and validated by the chat path (400 naming the field).
  nlohmann::ordered_json extensions = nlohmann::ordered_json::object();
};

/// Validates `body` (a JSON object). Throws ApiError 400 naming the field.
ResponsesRequest parse_responses_request(const nlohmann::ordered_json& body);

/// The chat template kwargs that carry `effort` to a template whose source is `template_text`:
/// {"reasoning_effort": low|medium|high} when the template reads reasoning_effort (gpt-oss;
/// none/minimal -> "low", xhigh -> "high"); {"enable_thinking": bool} when it reads
/// enable_thinking (Qwen3, GLM; false for none/minimal); {"thinking": bool} when it tests
/// `thinking is defined` (DeepSeek-V3.1). Empty object when the template has no such switch.
nlohmann::ordered_json reasoning_kwargs(std::string_view template_text, const std::string& effort);

/// Thinking budgets (tokens) of the efforts low and medium where the template has no effort of
/// its own (see reasoning_effort_budget).
constexpr int kLowEffortBudget = 1024, kMediumEffortBudget = 8192;

/// The thinking budget (GenRequest::reasoning_budget) `effort` maps to for a template whose source
/// is `template_text`: -1 (none) when the template reads reasoning_effort (gpt-oss: the effort goes
/// into the prompt), 0 for none/minimal, kLowEffortBudget for low, kMediumEffortBudget for
/// medium, -1 (unlimited) for high and xhigh.
int reasoning_effort_budget(std::string_view template_text, const std::string& effort);

/// The /v1/chat/completions body that runs `r` after the conversation `history` (normalized
/// items of a stored response, or an empty array): messages from instructions + history +
/// input (function_call items join the assistant message before them; reasoning text becomes
/// the next assistant message's reasoning_content; function_call_output becomes a "tool"
/// message), tools in chat form, max_completion_tokens, temperature, top_p, stream and
/// chat_template_kwargs (reasoning_kwargs). 400 when there are no messages at all.
nlohmann::ordered_json responses_chat_body(const ResponsesRequest& r, const nlohmann::ordered_json& history,
                                           std::string_view template_text);

}  // namespace spool::server
