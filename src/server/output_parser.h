// Incremental parser of generated text into OpenAI chat-completion output: `content`,
// `reasoning_content` and `tool_calls`, as streaming deltas and aggregated, with `stop`
// strings. Text is fed in arbitrary pieces of complete UTF-8; the result does not depend on
// how the text is split (the concatenation of all deltas equals the aggregated result and the
// result of pushing the whole text at once).
//
// Formats (docs architectures.md §9):
//  * reasoning: `<think>\n...\n</think>\n\n` (Qwen3 writes <think> itself; Qwen3.5/3.6 and
//    Qwen3 -Thinking prompts end with `<think>\n`, see Options::starts_in_reasoning);
//  * Qwen3 JSON tool calls: `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`;
//  * Qwen3.5/3.6 XML tool calls: `<tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n
//    </function>\n</tool_call>`.
//
// Semantics (decisions, with the vLLM / llama.cpp behaviour they follow or depart from):
//  * Stop strings are matched on the raw generated text before any parsing, so they also cut
//    reasoning and tool-call markup (vLLM's v1 detokenizer does the same; hosted APIs that
//    scope stops to the answer differ). The stop string and everything after it is dropped.
//  * Reasoning: `<think>` is recognized only at the start of the output (after optional
//    whitespace, which is dropped); one newline after <think> and one before </think> are
//    stripped and the newlines after </think> never start the content (the templates write
//    `<think>\n` + r + `\n</think>\n\n` and strip them again when re-rendering). Output that
//    never closes </think> is all reasoning, held-back text included (vLLM's Qwen3 reasoning
//    parser with thinking enabled does the same). With XML tool syntax, `<tool_call>` followed
//    by `<function=` also ends reasoning (vLLM: Qwen3.5 sometimes omits </think> before a call).
//    A `<think>` later in the text, or `</think>` outside reasoning, is plain content.
//  * Tool calls: a call is announced (a ToolCallDelta with id and name, arguments "") once its
//    opening markup is known to be well formed: XML at `<function=NAME>`, JSON at
//    `{"name": "NAME", "arguments": {` (those keys in that order). Markup that goes wrong before
//    that point — bad JSON, unknown shape, unterminated at the end — is plain content, verbatim
//    (vLLM's hermes parser and llama.cpp also fall back to content). After the announcement a
//    streamed call cannot be taken back: if its markup then breaks or the output ends inside it
//    (max_tokens, stop string) the call keeps the arguments streamed so far, closed into a
//    valid JSON object, its `complete` flag is false, and the raw text not represented in the
//    arguments is emitted as content (never dropped).
//  * JSON arguments are passed through as written (the Qwen3 template re-inserts the string
//    verbatim, which keeps re-rendered prompts identical), streamed as they arrive, except that
//    raw control characters inside strings are escaped. XML arguments are a JSON object with
//    json.dumps separators (`{"city": "Paris", "unit": "c"}`), streamed one fragment per
//    completed parameter (`{"city": "Paris"`, `, "unit": "c"`, `}` at </function>); values are
//    typed with the request's tool schemas (typed_param_json in tool_calls.h).
//  * A `</parameter>` ends a value only when followed (after whitespace) by `<parameter=`,
//    `</function>`, `</tool_call>` or the end of the output (vLLM's structural check), so values
//    may contain the literal text `</parameter>`.
//  * Whitespace right before a tool call, and after the last call when nothing else follows,
//    belongs to the markup and is dropped (up to 64 bytes; longer runs are content).
//  * Text between or after calls is content (vLLM drops text after the first call; we never
//    drop text).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace spool::server {

/// A model family's output format (reasoning and tool-call syntax); see chat_format.h for the
/// registry (names, detection from a chat template, markup). kNone, kQwen3Json and kQwen35Xml
/// are parsed by this file's Qwen engine, the others by the family parsers in formats/.
enum class ToolSyntax {
  kNone,         ///< no tool calls: tool-call markup stays plain content (Qwen <think> reasoning)
  kQwen3Json,    ///< `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Qwen3, Qwen3-Next)
  kQwen35Xml,    ///< `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>...` (Qwen3.5/3.6, Qwen3-Coder)
  kDeepSeekV3,   ///< `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}...` (V3, V3.1, R1)
  kKimiK2,       ///< `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX...` (Kimi-K2)
  kGlm45,        ///< `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>` (GLM-4.5/4.6/4.7)
  kMiniMaxM2,    ///< `<minimax:tool_call><invoke name="N"><parameter name="K">V</parameter>...` (MiniMax-M2)
  kGptOss,       ///< harmony channels (gpt-oss)
  kMistral,      ///< `[TOOL_CALLS][{...}]` or `[TOOL_CALLS]NAME[ARGS]{...}` (Mistral, Mixtral, Magistral)
  kErnie45,      ///< `<think>`, `<response>`, `<tool_call>\n{json}\n</tool_call>` (ERNIE-4.5)
  kGemma4,       ///< `<|channel>thought..<channel|>`, `<|tool_call>call:NAME{k:v}<tool_call|>` (Gemma 4)
};

/// Picks the output format from a chat template's text by each family's markers (see
/// chat_format.h: detect_chat_format); kNone when no family's markers are present.
ToolSyntax detect_tool_syntax(std::string_view chat_template);

/// One streamed piece of a tool call (OpenAI `delta.tool_calls[i]`). The first delta of a call
/// carries `id` and `name` and empty `arguments`; later ones carry only argument text to append.
struct ToolCallDelta {
  int index = 0;          ///< position of the call in the response (0, 1, ...)
  std::string id;         ///< set only on the first delta of a call
  std::string name;       ///< set only on the first delta of a call
  std::string arguments;  ///< argument text to append
};

/// What became known since the previous push()/finish().
struct OutputDelta {
  std::string content;                   ///< text to append to `content`
  std::string reasoning;                 ///< text to append to `reasoning_content`
  std::vector<ToolCallDelta> tool_calls; ///< tool-call pieces, in order
  /// True when there is nothing to send.
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
  /// Appends the later delta `d`: texts are joined, and tool-call pieces of the call the last
  /// entry belongs to join that entry (one entry per call index and delta).
  void append(OutputDelta d);
};

/// One aggregated tool call.
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  ///< a JSON object as text (always valid JSON)
  /// False when the markup broke off or went wrong after the call was announced: the
  /// arguments were closed to stay valid JSON but may lack what the model meant to write.
  bool complete = true;
};

namespace formats {
/// The family parser behind OutputParser for the formats of src/server/formats/ (internal).
class FamilyParser;
}  // namespace formats

/// Incremental parser of one generation's text (see the file comment for the semantics; the
/// family formats of chat_format.h follow the same contract, with the differences listed there).
class OutputParser {
 public:
  /// Per-request configuration.
  struct Options {
    ToolSyntax syntax = ToolSyntax::kNone;  ///< the output format (kNone: Qwen reasoning, no tool calls)
    /// False (tool_choice "none"): the format's tool-call markup stays plain content; its
    /// reasoning is still parsed. (With the Qwen formats, syntax kNone does the same.)
    bool tool_calls = true;
    bool parse_reasoning = true;            ///< text inside <think>...</think> goes to reasoning
    /// The prompt already opened <think> (Qwen3.5/3.6 generation prompt with thinking on, Qwen3
    /// "-Thinking" templates): output is reasoning until </think>. Ignored without
    /// parse_reasoning.
    bool starts_in_reasoning = false;
    std::vector<std::string> stop;  ///< OpenAI `stop` strings (non-empty, valid UTF-8)
    nlohmann::json tools;           ///< the request's `tools` array (may be null): XML value types
    std::string id_prefix = "call_";  ///< tool call ids: id_prefix + 24 hex digits
    uint64_t id_seed = 0;           ///< seeds the id suffixes (use a random value per request)
  };

  /// Throws spool::Error for invalid stop strings (empty, not UTF-8).
  explicit OutputParser(Options opt);
  ~OutputParser();
  OutputParser(OutputParser&&) noexcept;
  OutputParser& operator=(OutputParser&&) noexcept;

  /// Feeds the next piece of generated text (complete UTF-8) and returns what can be emitted
  /// now; text that may still turn out to be (part of) a stop string or of markup is held back.
  /// When this push completes a stop string, the rest is flushed as by finish() and stopped()
  /// becomes true; later pushes are ignored and return an empty delta.
  OutputDelta push(std::string_view text);

  /// End of generation: flushes held-back text (unfinished tags and unannounced tool-call
  /// markup as content, unclosed reasoning as reasoning, announced calls closed as described in
  /// the file comment). Later calls return an empty delta.
  OutputDelta finish();

  /// A stop string was completed: the caller ends generation with finish_reason "stop".
  bool stopped() const;

  /// True when a finish() happened (or a stop string ended the output).
  bool finished() const;

  /// For --tool-syntax-greedy: true while the next token should be chosen greedily because the
  /// model is inside tool-call markup (from a complete `<tool_call>` on: tags, JSON keys and
  /// punctuation, XML tag and parameter names, a partly written `</parameter>`); false in free
  /// text, reasoning, and inside argument values.
  bool in_markup() const;

  /// For thinking budgets: true while the output is inside reasoning (after the family's opener,
  /// or from the start when Options::starts_in_reasoning, until its closer); false once content,
  /// a tool call or the end came, and always without Options::parse_reasoning.
  bool in_reasoning() const;

  /// Aggregated content so far.
  const std::string& content() const;
  /// Aggregated reasoning so far.
  const std::string& reasoning() const;
  /// Tool calls announced so far (arguments as streamed so far).
  const std::vector<ToolCall>& tool_calls() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;                   // Qwen formats (kNone, kQwen3Json, kQwen35Xml)
  std::unique_ptr<formats::FamilyParser> fam_;  // the other formats
};

}  // namespace spool::server
