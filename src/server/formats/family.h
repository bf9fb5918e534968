// Internal interface of the family output parsers behind OutputParser (output_parser.h) for the
// formats of chat_format.h other than Qwen's. FamilyParser holds what every family shares (stop
// strings, raw text, emission, aggregates); a family supplies step(). Most families are a
// BlockSpec run by the generic block engine (block_engine.cpp): reasoning between two markers,
// content, and tool-call blocks opened by a marker and parsed whole by the family's function;
// gpt-oss harmony has its own step() (gpt_oss.cpp).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/output_parser.h"
#include "server/stop_strings.h"

namespace spool::server::formats {

/// One complete tool call parsed from markup.
struct Call {
  std::string name;
  std::string arguments;  ///< a JSON object as text
  std::string id;         ///< the id the model wrote (Kimi `functions.NAME:IDX`, Mistral), or ""
};

/// Result of parsing a tool-call block from its opening marker on.
struct BlockParse {
  enum Kind {
    kDone,      ///< the block is complete and ends at `end`
    kNeedMore,  ///< the block may still complete (more text needed)
    kFail,      ///< the text is not (or no longer) a well-formed block
  } kind = kNeedMore;
  /// kDone: end of the block; otherwise end of the last complete call (0 when none).
  size_t end = 0;
  std::vector<Call> calls;  ///< the complete calls, in order (a prefix of the final list)
  /// kNeedMore: the call being written after `calls`, for streaming its arguments. Its name
  /// once known ("" = nothing to announce yet), the id the model wrote ("" = generate one), and
  /// a prefix of its final arguments text as far as it is decided — complete top-level members
  /// only (`{"city": "Paris"`), so that prefix + "}" is a JSON object. Prefix-stable: every
  /// extension of the text reports an extension of it, and the call's final arguments extend it.
  std::string partial_name, partial_id, partial_args;
  /// This parse as kNeedMore / kFail, its complete calls kept (`return r.need();` in a parser).
  BlockParse need() const { return with(kNeedMore); }
  BlockParse fail() const { return with(kFail); }

 private:
  BlockParse with(Kind k) const {
    BlockParse c = *this;
    c.kind = k;
    return c;
  }
};

/// A family format run by the block engine.
struct BlockSpec {
  std::string_view think_open, think_close;  ///< reasoning markers ("": none)
  std::vector<std::string_view> call_open;   ///< markers that open a tool-call block
  /// A call marker inside reasoning ends the reasoning (markers that are special tokens).
  bool call_ends_reasoning = false;
  /// Content markers that are dropped with the whitespace around them (ERNIE <response>).
  std::vector<std::string_view> drop;
  /// Parses `block` (starting with one of call_open) from its start; `eof`: no more text will
  /// come. Must be deterministic and prefix-stable: the calls it reports complete for a text
  /// are reported (with the same `end`s) for every extension of it.
  BlockParse (*parse)(std::string_view block, bool eof, const nlohmann::json& tools) = nullptr;
  /// For --tool-syntax-greedy: true when the unfinished `block` ends inside an argument value
  /// (free text the model should sample), false on markup (tags, names, keys, punctuation).
  bool (*in_value)(std::string_view block) = nullptr;
};

/// Shared state and emission of a family parser.
class FamilyParser {
 public:
  /// `extra_stops`: the family's end-of-turn strings, added to opt.stop.
  FamilyParser(OutputParser::Options opt, const std::vector<std::string>& extra_stops);
  virtual ~FamilyParser();

  /// See OutputParser::push / finish.
  OutputDelta push(std::string_view text);
  OutputDelta finish();

  /// For --tool-syntax-greedy (see OutputParser::in_markup).
  virtual bool in_markup() const = 0;
  /// For thinking budgets (see OutputParser::in_reasoning).
  virtual bool in_reasoning() const = 0;

  bool stopped() const { return stop_.stopped(); }
  bool finished() const { return finished_; }
  const std::string& content() const { return content_; }
  const std::string& reasoning() const { return reasoning_; }
  const std::vector<ToolCall>& tool_calls() const { return calls_; }

 protected:
  /// Processes raw_ from pos_ as far as can be decided; returns false when it needs more text
  /// (or, with eof_, when everything is consumed: pos_ == raw_.size()).
  virtual bool step() = 0;

  std::string_view view(size_t a, size_t b) const { return std::string_view(raw_).substr(a, b - a); }
  std::string_view from(size_t a) const { return std::string_view(raw_).substr(a); }
  void emit_content(std::string_view t);
  void emit_reasoning(std::string_view t);
  /// Emits a complete call (id: the model's, else a generated one). When a call was opened by
  /// open_call(), completes that one instead: its arguments delta is what `c.arguments` adds to
  /// the text streamed so far.
  void emit_call(const Call& c);
  /// Streaming: announces the call being written (id and name, arguments "") unless it is already
  /// open, then streams what `args_prefix` adds to the arguments sent so far (see
  /// BlockParse::partial_args).
  void open_call(const std::string& name, const std::string& id, const std::string& args_prefix);
  /// The open call's markup broke off or went wrong: its arguments are closed as a JSON object
  /// (what was streamed + "}"), and it is marked incomplete. No-op when no call is open.
  void abandon_call();
  /// True while a call announced by open_call() is not complete.
  bool call_open() const { return open_; }

  OutputParser::Options opt_;
  std::string raw_;  // all text released by the stop matcher
  size_t pos_ = 0;   // first unprocessed byte
  bool eof_ = false;

 private:
  void finalize();

  StopMatcher stop_;
  bool finished_ = false;
  OutputDelta cur_;
  std::string content_, reasoning_;
  std::vector<ToolCall> calls_;
  bool open_ = false;  // calls_.back() was announced by open_call() and is not complete
};

/// The block engine's parser for `spec` (which must outlive it).
std::unique_ptr<FamilyParser> make_block_parser(const BlockSpec& spec, OutputParser::Options opt,
                                                const std::vector<std::string>& extra_stops);

/// The gpt-oss harmony parser (gpt_oss.cpp).
std::unique_ptr<FamilyParser> make_harmony_parser(OutputParser::Options opt);

// ---- the families' specs (one file each)
const BlockSpec& deepseek_v3_spec();
const BlockSpec& kimi_k2_spec();
const BlockSpec& glm4_5_spec();
const BlockSpec& minimax_m2_spec();
const BlockSpec& mistral_spec();
const BlockSpec& ernie4_5_spec();
const BlockSpec& gemma4_spec();

// ---- helpers shared by the families (common.cpp)

/// True when `s` is whitespace.
bool is_ws(char c);
/// `s` without leading and trailing whitespace.
std::string_view trim(std::string_view s);
/// 1: `s` starts with `lit`; 0: `s` is a proper prefix of `lit`; -1: neither.
int match_lit(std::string_view s, std::string_view lit);
/// Index just after the JSON value starting at s[p] (after no whitespace): npos when the text
/// ends inside it (needs more), npos - 1 when it is malformed. Only brackets, strings and
/// scalars' extents are checked; callers parse the extent with nlohmann::json.
size_t json_value_end(std::string_view s, size_t p);
constexpr size_t kJsonIncomplete = static_cast<size_t>(-1);
constexpr size_t kJsonBad = static_cast<size_t>(-2);
/// `text` if it is a JSON object (returned re-validated as written), else "" (not an object).
std::string json_object_text(std::string_view text);
/// For streaming JSON arguments: the text of the JSON object starting at s[p] (its '{') up to
/// the end of its last complete top-level member, as written ("{" when none is complete yet, ""
/// when s[p] is not '{'). A prefix of the object's text; followed by "}" it is a JSON object.
std::string json_members_prefix(std::string_view s, size_t p);
/// For a JSON-argument family's parse(): `r` as kNeedMore with the call being written — `name`
/// (when valid_name), the model's `id`, and json_members_prefix(b, j) of its arguments at b[j]
/// (nothing is announced until the arguments' '{' is there).
BlockParse stream(const BlockParse& r, const std::string& name, const std::string& id, std::string_view b, size_t j);
/// typed_args_json of the pairs so far without its closing "}" ("" when `kv` is empty): the
/// streamed prefix of key/value arguments.
std::string typed_args_prefix(const nlohmann::json& tools, std::string_view tool,
                              const std::vector<std::pair<std::string, std::string>>& kv, bool strip_nl);
/// For in_value of JSON-argument families: true when `args` (the text from the arguments'
/// opening '{' on, unfinished) ends inside a top-level value (JsonArgsStreamer::in_value).
bool json_args_in_value(std::string_view args);
/// Builds `{"k": v, ...}` (json.dumps separators) from (name, raw value text) pairs, each value
/// typed by the tool's schema (typed_param_json) after stripping one leading and one trailing
/// newline when `strip_nl`.
std::string typed_args_json(const nlohmann::json& tools, std::string_view tool,
                            const std::vector<std::pair<std::string, std::string>>& kv, bool strip_nl);
/// True when `s` is a plausible function name: non-empty, at most 256 bytes, no whitespace,
/// quotes, '<', '>', '{', '}' or '['.
bool valid_name(std::string_view s);
/// True when `s` ends with a proper prefix of `lit` at least 2 bytes long: used by in_value
/// functions to tell "inside a value" from "writing the closing tag".
bool ends_with_prefix(std::string_view s, std::string_view lit);

}  // namespace spool::server::formats
