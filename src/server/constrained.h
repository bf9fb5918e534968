// Constrained decoding for the API endpoints: what a request forces (a tool call, a JSON
// schema) compiled into the GenRequest's constraint (constrain/call_format.h), for the family's
// tool-call syntax.
//
// Endpoints map their fields to ForcedOutput and call attach_constraint() after rendering the
// prompt:
//   OpenAI Chat Completions: tool_choice "required" -> kToolCall (any tool); {"type": "function",
//     "function": {"name": N}} -> kToolCall N; response_format {"type": "json_schema",
//     "json_schema": {"schema": S}} -> kJson S; {"type": "json_object"} -> kJson (null schema).
//   Anthropic Messages: tool_choice {"type": "any"} -> kToolCall; {"type": "tool", "name": N}
//     -> kToolCall N.
//   OpenAI Responses: tool_choice "required" / {"type": "function", "name": N} -> kToolCall;
//     text.format {"type": "json_schema", "schema": S} -> kJson S; {"type": "json_object"} -> kJson.
// A forced call is exactly one call; the output parser reads it back as usual (finish_reason
// "tool_calls").
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "constrain/call_format.h"
#include "server/chat_prompt.h"
#include "server/request.h"

namespace spool::server {

/// What a request forces the output to be.
struct ForcedOutput {
  enum Kind {
    kNone,      ///< nothing (no constraint)
    kToolCall,  ///< one tool call: of `tool` when set, else of any of the request's tools
    kJson,      ///< a JSON value valid under `schema` (null: any JSON object)
  };
  Kind kind = kNone;
  std::string tool;               ///< kToolCall: the forced function's name ("" = any tool)
  nlohmann::ordered_json schema;  ///< kJson: the schema (null: json_object)
};

/// The constraint description of tool syntax `s` (nullptr for kNone and for syntaxes with no
/// description yet: forcing a call is then refused). Adding a family is one CallFormat
/// (constrain/call_format.h) and one case here.
const constrain::CallFormat* call_format_for(ToolSyntax s);

/// Compiles `what` for `prompt` (its tools, tool syntax and whether it starts in reasoning) and
/// sets `r.constraint` / `r.constraint_index` (kNone: leaves `r` unchanged). Throws ApiError 400
/// naming `field` for: a tool name not among the prompt's tools, no tools, a template with no
/// known tool-call syntax, a schema outside the supported subset (the message names the keyword).
void attach_constraint(GenRequest& r, const ModelFacts& facts, const ChatPrompt& prompt, const ForcedOutput& what,
                       const std::string& field);

/// Reads OpenAI Chat Completions `response_format` (absent, null or {"type": "text"}: kNone;
/// {"type": "json_object"}; {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}).
/// Throws ApiError 400 naming the field for other shapes.
ForcedOutput parse_response_format(const nlohmann::ordered_json& body);

}  // namespace spool::server
