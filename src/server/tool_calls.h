// Tool-call building blocks for the OpenAI-compatible server's output parser
// (see output_parser.h): Python-json.dumps-style serialization, typing of Qwen3.5/3.6 XML
// parameter values by the request's JSON schema, tool-call ids, and an incremental
// validator for the JSON `arguments` object of Qwen3 <tool_call> markup.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/json_string.h"

namespace spool::server {

/// `v` as JSON text with Python json.dumps separators (", " and ": "), keys in stored order,
/// strings as append_json_string (common/json_string.h, ensure_ascii off) writes them.
std::string dump_json_py(const nlohmann::ordered_json& v);

/// The `parameters.properties` object of the tool named `name` in an OpenAI `tools` array
/// (entries {"type": "function", "function": {"name", "parameters"}}; a bare
/// {"name", "parameters"} entry is accepted too), or nullptr when the tool or its properties
/// are missing or `tools` is not an array.
const nlohmann::json* find_tool_properties(const nlohmann::json& tools, std::string_view name);

/// JSON text of one Qwen3.5/3.6 XML parameter value (already stripped of its one leading and
/// one trailing newline), typed by the parameter's schema `props[param]` (props may be null:
/// unknown tool). Rules (after vLLM's qwen3_coder tool parser, with the differences noted):
///  * string-like types (string, str, text, varchar, char, enum): the raw text as a string;
///    "null"/"None" becomes null only when the schema admits null (type list or anyOf);
///  * integer-like (int*, uint*, long*, short*, unsigned*): a JSON integer as written (an
///    integral float such as 5.0 becomes 5); number-like (num*, float*, double, decimal): a
///    JSON number as written;
///  * boolean (boolean, bool, binary): true/false case-insensitively (Python True/False, as
///    the Qwen3.5 template renders them); vLLM degrades other text to false, we keep a string;
///  * any non-string type: "null"/"None" (case-insensitive) is null;
///  * object/array/other types: parsed as JSON;
///  * no usable type, unknown parameter or unknown tool: parsed as JSON if it parses (vLLM keeps
///    a string for unknown parameters);
///  * whatever does not parse as required stays a string (never an error).
/// The type is `type` (first non-"null" entry of a type list) or the first non-null option of
/// anyOf/oneOf; a schema with only a string `enum` counts as string.
std::string typed_param_json(const nlohmann::json* props, std::string_view param,
                             std::string_view value);

/// Tool-call id: `prefix` + 24 lowercase hex digits derived from (seed, index) with
/// SplitMix64 — distinct for distinct indices of one seed, reproducible for tests.
std::string make_tool_call_id(std::string_view prefix, uint64_t seed, int index);

/// Incremental validator/streamer of a JSON object written by the model as tool-call
/// arguments. It starts right after the object's opening '{' (already consumed) and is fed one
/// byte at a time. Text is passed through as written except raw control characters inside
/// strings, which are escaped so the result stays valid JSON. Output is released only up to
/// "safe points" (after an opening bracket, after a complete value, and inside string values
/// after each complete character and escape), so that at any moment
/// released text + healing() is a valid JSON object that nlohmann::json parses: the healing
/// suffix closes an open string and the open containers. Lone or unpaired UTF-16 surrogate
/// escapes are rejected for the same reason.
class JsonArgsStreamer {
 public:
  /// Result of feeding one byte.
  enum class Status { kOk, kDone, kError };

  /// `start_raw` is the raw position just after the opening '{'; the released output starts
  /// with "{".
  explicit JsonArgsStreamer(size_t start_raw);

  /// Feeds byte `c` found at raw position `raw_pos`. kDone: `c` closed the top-level object;
  /// kError: `c` is not valid JSON here (the streamer must not be fed again).
  Status feed(char c, size_t raw_pos);

  /// Removes and returns the output that is safe to emit now.
  std::string take_safe();

  /// Raw position just after the last safe point: raw text from here on is not represented
  /// in take_safe()'s output.
  size_t safe_raw_end() const { return safe_raw_; }

  /// Text that turns the output released so far into a complete, valid JSON object.
  std::string healing() const;

  /// True while the model is writing free text: inside a top-level argument value (strings,
  /// numbers, literals, nested containers) or between ':' and the value once a byte follows
  /// the ':'; false on keys and the punctuation of the top-level object, including right
  /// after a ':' (so --tool-syntax-greedy picks the `: "` punctuation token greedily and
  /// samples the value).
  bool in_value() const;

 private:
  enum class Mode {
    kKeyOrClose,    // after '{'
    kKey,           // after ',' in an object
    kInKey,         // inside a key string
    kColon,         // after a key
    kValue,         // after ':' or after ',' in an array
    kValueOrClose,  // after '['
    kInString,      // inside a string value
    kInNumber,
    kInLiteral,
    kAfterValue,
  };
  enum class Num { kMinus, kZero, kInt, kDot, kFrac, kE, kESign, kExp };

  Status string_byte(char c, size_t raw_pos, bool key);
  Status value_start(char c, size_t raw_pos);
  Status close(char c, size_t raw_pos);
  void mark_safe(size_t raw_after, bool in_string);
  bool number_byte(char c);

  std::vector<char> stack_;  // open containers: '{' or '['
  Mode mode_ = Mode::kKeyOrClose;
  bool just_colon_ = false;  // the last byte fed was a top-level key's ':'
  std::string out_;          // output not yet taken; its first safe_len_ bytes are safe
  size_t safe_len_ = 0;
  size_t safe_raw_ = 0;
  bool safe_in_string_ = false;
  // string state
  int esc_ = 0;              // 0 none, 1 after '\', 2..5 reading \u hex digits
  unsigned hex_ = 0;
  bool want_low_ = false;    // a high surrogate escape must be followed by a low one
  int utf8_rem_ = 0;         // continuation bytes still expected
  // number / literal state
  Num num_ = Num::kMinus;
  const char* lit_ = nullptr;
  size_t lit_pos_ = 0;
};

}  // namespace spool::server
