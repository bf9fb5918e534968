// Chat requests to prompt text: validation and normalization of OpenAI `messages` / `tools`
// and rendering with the model's (or a request's) chat template.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "server/output_parser.h"
#include "template/chat_template.h"

namespace spool::server {

/// The chat-template side of a loaded model.
struct ChatTemplateInfo {
  const tmpl::Template* tmpl = nullptr;  ///< the model's template (null: the model has none)
  nlohmann::ordered_json special_tokens;  ///< bos_token, eos_token, ... (special_tokens_from_config)
  nlohmann::ordered_json default_kwargs;  ///< --chat-template-kwargs (an object, or null)
  ToolSyntax tool_syntax = ToolSyntax::kNone;  ///< the output format: detect_chat_format of the template text, or --chat-format
  std::string source;                    ///< the template text (feature checks, e.g. reasoning_kwargs)
};

/// A rendered chat prompt and what the output parser needs to know about it.
struct ChatPrompt {
  std::string text;                 ///< the rendered prompt
  nlohmann::ordered_json tools;     ///< the request's tools (null when absent)
  ToolSyntax syntax = ToolSyntax::kNone;  ///< the output format (Qwen formats: kNone for tool_choice "none")
  bool tool_calls = true;           ///< false for tool_choice "none"
  bool starts_in_reasoning = false; ///< the prompt ends inside an open reasoning block (prompt_opens_reasoning)
  bool force_tool = false;          ///< tool_choice forces a call ("required" or a named function)
  std::string forced_tool;          ///< the named function ("" with "required": any tool)
};

/// Renders `req` (an OpenAI chat request object: messages, tools, tool_choice ("auto", "none",
/// "required", or a named function, which must be among the tools),
/// add_generation_prompt, chat_template_kwargs and, when `allow_template_override`,
/// chat_template). Messages are checked (roles are strings; content is a string, null (read as ""), or an
/// array of text parts, joined with "\n"; tool_calls is an array of function calls; a message
/// needs content or a non-empty tool_calls: null / missing content only with tool calls) and, for
/// XML tool syntax, assistant tool-call `arguments` strings are parsed into objects (the
/// template iterates them). Throws ApiError 400 naming the field for bad input, and for
/// template errors (raise_exception text, syntax errors of an override template).
ChatPrompt render_chat(const nlohmann::ordered_json& req, const ChatTemplateInfo& info, bool allow_template_override);

}  // namespace spool::server
