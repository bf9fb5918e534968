// Registry of model-family output formats: how each family writes reasoning and tool calls, how
// it is recognised from a chat template, and what the server needs to know to parse it
// (OutputParser, output_parser.h, does the parsing; each family's parser is in formats/).
//
// Contract shared by the family formats (differences from the Qwen engine of output_parser.h):
//  * Reasoning starts when the output begins (after whitespace) with the family's reasoning
//    opener, or right away when the rendered generation prompt ends inside an open one
//    (prompt_opens_reasoning; e.g. GLM-4.7-Flash, MiniMax-M2, Qwen3.5 with thinking on). Leading
//    and trailing whitespace of the reasoning is dropped, as are the newlines after its closer.
//  * Tool calls are streamed: a call is announced (id and name) once its opening markup is
//    well formed (the arguments' '{' of JSON formats, the first <arg_key> of GLM, `<invoke
//    name=...>` of MiniMax), and its arguments follow one complete top-level member at a time
//    (`{"city": "Paris"`, `, "days": 3`, `}`); only Mistral's `[TOOL_CALLS][...]` list form
//    still emits its calls whole at the closing bracket. Markup that is held back is never sent as content. A
//    block that goes wrong or is cut off keeps its complete calls; a streamed call it broke
//    off in is closed (its arguments so far + "}", ToolCall::complete false), and the rest is
//    content, verbatim; markup that never became a call is content too (never dropped).
//  * Where the family writes argument values as text (GLM <arg_value>, MiniMax <parameter>),
//    they are typed by the request's tool schema (typed_param_json, tool_calls.h); JSON
//    arguments are passed through as written (validated to be a JSON object).
//  * The family's end-of-turn text (e.g. `<|im_end|>`, `<｜end▁of▁sentence｜>`, `[e~[`) ends the
//    output like a stop string (the server normally stops on the token before it is decoded).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "server/output_parser.h"

namespace spool::models {
struct Family;
}

namespace spool::server {

/// What the server and tests need to know about one family's output format.
struct ChatFormat {
  ToolSyntax id;                 ///< the value OutputParser::Options::syntax takes for it
  std::string_view name;         ///< registry name (selectable with --chat-format), e.g. "glm4_5"
  std::string_view description;  ///< the models that use it
  /// Opener and closer of reasoning in the output ("" when the family has none); the opener is
  /// also what prompt_opens_reasoning looks for at the end of a rendered prompt.
  std::string_view reasoning_open, reasoning_close;
  /// What the server writes to end reasoning when a thinking budget runs out (--reasoning-budget,
  /// Anthropic `thinking.budget_tokens`): the closer as the family's template writes it, e.g.
  /// "\n</think>\n\n" for Qwen, "</think>" for GLM, harmony's
  /// "<|end|><|start|>assistant<|channel|>final<|message|>" for gpt-oss ("" when none).
  std::string reasoning_end;
  /// Text that ends the assistant turn (treated as stop strings; may be empty).
  std::vector<std::string> end_of_turn;
  /// All markup the format uses: none of it may appear in content or reasoning parsed from a
  /// well-formed output (tests check streamed deltas against it).
  std::vector<std::string> markup;
  /// Generated text must be decoded with special tokens kept (the markup may be made of
  /// special tokens, e.g. harmony's <|channel|>); end-of-turn tokens are stop ids anyway.
  bool keep_special_tokens = false;
  /// True when the chat template has tool-call syntax (false: reasoning/content only).
  bool has_tools = true;
};

/// All registered formats, kNone first.
const std::vector<ChatFormat>& chat_formats();

/// The registry entry of `id` (every ToolSyntax has one).
const ChatFormat& chat_format(ToolSyntax id);

/// The format named `name` (ChatFormat::name, or the aliases "qwen3" for kQwen3Json,
/// "qwen3_coder" / "qwen3_5" for kQwen35Xml, "deepseek_v3_1", "kimi_k2_thinking", "glm4_6",
/// "glm4_7", "gpt-oss", "harmony", "magistral"), or nullptr.
const ChatFormat* find_chat_format(std::string_view name);

/// The format of a chat template, recognised by markers only that family's templates contain
/// (several per family, so one stray substring does not decide): gpt-oss `<|channel|>` and
/// `<|message|>`; DeepSeek `tool▁calls▁begin` and `tool▁sep`; Kimi `tool_calls_section_begin`
/// and `<|tool_call_argument_begin|>`; MiniMax `<minimax:tool_call>` and `<invoke name=`; GLM
/// `<arg_key>` and `<arg_value>`; Gemma 4 `<|tool_call>` / `<|turn>` with `<turn|>`; Mistral
/// `[TOOL_CALLS]` (with `[INST]` or `[AVAILABLE_TOOLS]`); ERNIE `<response>` with
/// `<tool_call>`; Qwen XML `<function=` and `<parameter=`; Qwen JSON `<tool_call>` and
/// `</tool_call>`. kNone when none matches.
ToolSyntax detect_chat_format(std::string_view chat_template);

/// The format the server uses for a model of `family` (null: unknown) whose chat template is
/// `chat_template`: the format recognised in the template (detect_chat_format) when the family
/// lists it in Family::chat_formats, or lists none; the family's first format when the template
/// has no recognisable tool syntax. A recognised format the family does not list is still used
/// (the template decides what the model is asked to write: e.g. a replaced template) and `note`
/// (may be null) says so; it also says when the family's default was taken. Throws spool::Error
/// when the family lists a name the registry lacks.
ToolSyntax resolve_chat_format(std::string_view chat_template, const models::Family* family, std::string* note);

/// True when the rendered prompt `prompt` ends inside an open reasoning block of format `id`:
/// its last reasoning opener is followed only by whitespace (so the output starts as
/// reasoning). Follows the prompt, not the family: GLM-4.7-Flash ends with `<think>`,
/// DeepSeek-V3.1 non-thinking with `<think></think>` (closed: false).
bool prompt_opens_reasoning(ToolSyntax id, std::string_view prompt);

}  // namespace spool::server
