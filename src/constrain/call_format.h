// Constraints for forced tool calls and structured output: a model family's tool-call syntax
// (CallFormat, a few strings per family) around arguments compiled from the tools' JSON
// schemas, or a response_format schema alone.
//
// Reasoning: when the rendered prompt leaves the model inside an open reasoning block
// (Qwen3.5's `<think>\n` generation prompt), the constraint first admits free reasoning text up
// to the family's closer (`</think>`) and at most two newlines, then the call / the JSON. When
// the prompt does not open reasoning, the constraint starts right after the generation prompt
// (as llama.cpp's forced-call grammars do): the model cannot open a reasoning block of its own.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "constrain/json_schema.h"
#include "constrain/token_mask.h"

namespace spool::constrain {

/// How arguments are written inside a call.
enum class ArgsSyntax {
  kJson,  ///< one JSON object (Qwen3 `"arguments": {...}`, DeepSeek, Kimi, ...)
  kXml,   ///< XmlParams per argument (Qwen3.5 / Qwen3-Coder)
};

/// A family's tool-call syntax: a call is begin + NAME + after_name + ARGUMENTS + end.
struct CallFormat {
  std::string name;               ///< e.g. "qwen3_json"
  std::string begin;              ///< text before the function name
  bool name_in_json_string = false;  ///< the name is written inside a JSON string (escaped)
  std::string after_name;         ///< text between the name and the arguments
  ArgsSyntax args = ArgsSyntax::kJson;
  JsonDialect dialect;            ///< spelling of kJson arguments (JSON unless the family has its own)
  XmlParams xml;                  ///< markup of kXml arguments
  std::string end;                ///< text after the arguments
  std::string reasoning_close;    ///< the family's reasoning closer ("" when it has none)
  /// Markup strings that may be special tokens of the vocabulary (admitted by the mask).
  std::vector<std::string> special_markup;
};

/// Qwen3 / Qwen3-Next: `<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>`.
CallFormat qwen3_json_format();
/// Qwen3.5 / Qwen3.6 / Qwen3-Coder:
/// `<tool_call>\n<function=NAME>\n<parameter=P>\nV\n</parameter>\n...</function>\n</tool_call>`.
CallFormat qwen35_xml_format();

/// DeepSeek-V3.1 (and V3 / R1 models whose parser reads it):
/// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜><｜tool▁calls▁end｜>`.
CallFormat deepseek_v3_format();
/// Kimi-K2: `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>ARGS
/// <|tool_call_end|><|tool_calls_section_end|>` (no space before <|tool_call_end|>).
CallFormat kimi_k2_format();
/// GLM-4.5 / 4.6 / 4.7: `<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>`.
CallFormat glm4_5_format();
/// MiniMax-M2: `<minimax:tool_call>\n<invoke name="NAME">\n<parameter name="K">V</parameter>\n...</invoke>\n</minimax:tool_call>`.
CallFormat minimax_m2_format();
/// gpt-oss harmony, right after the `<|start|>assistant` generation prompt:
/// ` to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>`.
CallFormat gpt_oss_format();
/// Mistral (Small 3.2 / Magistral / Ministral templates): `[TOOL_CALLS]NAME[ARGS]ARGS`.
CallFormat mistral_format();

/// ERNIE-4.5 (-Thinking templates): `<tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>`,
/// after `</think>` when the prompt opened reasoning.
CallFormat ernie4_5_format();
/// Gemma 4: `<|tool_call>call:NAME{ARGS}<tool_call|>` with the arguments in Gemma's value syntax
/// (JsonDialect::gemma(): bare keys, `<|"|>`-quoted raw strings, no spaces).
CallFormat gemma4_format();

/// A callable tool: its name and its `parameters` JSON schema (null or {}: no constraint on
/// the arguments object).
struct ToolSpec {
  std::string name;
  nlohmann::ordered_json parameters;
};

/// The constraint for exactly one call of one of `tools` (one tool: a named tool_choice; several:
/// "required", an alternative per tool). `in_reasoning`: the prompt leaves the model inside
/// reasoning (see above). Throws SchemaError naming the tool and keyword for a schema outside
/// the supported subset; spool::Error for an empty `tools`.
std::shared_ptr<const Constraint> compile_tool_call(const CallFormat& fmt, const std::vector<ToolSpec>& tools, bool in_reasoning);

/// The constraint for a JSON value valid under `schema` (nullptr: any JSON object, the
/// response_format json_object), after free reasoning up to `reasoning_close` when
/// `in_reasoning`. Throws SchemaError.
std::shared_ptr<const Constraint> compile_json(const nlohmann::ordered_json* schema, bool in_reasoning, const std::string& reasoning_close);

}  // namespace spool::constrain
