// JSON Schema to grammar (constrained decoding), and a validator of the same subset.
//
// Supported (everything else, other than annotations, is a SchemaError naming the keyword):
//   type (a name or a list of names): object, array, string, integer, number, boolean, null;
//   object: properties, required, additionalProperties false / true / absent (no property
//     outside `properties` is ever generated; an object without `properties` takes any keys);
//   string: enum, const, minLength, maxLength (code points);
//   array: items, minItems, maxItems;
//   enum / const of any JSON values; anyOf / oneOf (generated as alternatives: oneOf's
//   exclusivity is not enforced); $ref to "#", "#/$defs/NAME" or "#/definitions/NAME";
//   annotations (title, description, default, examples, $schema, $id, $comment, strict,
//   deprecated, readOnly, writeOnly) are ignored. An empty schema (or true) is any JSON value.
// Generated text is canonical: no whitespace except Python json.dumps separators ", " and
// ": "; object properties in the order `properties` lists them (every required one, optional
// ones may be left out); integers have at most 16 digits, fractions at most 16 and exponents at
// most 2 (so every number is finite in a double); strings are well-formed UTF-8, with escapes
// \" \\ \/ \b \f \n \r \t and \uXXXX other than surrogates.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "constrain/grammar.h"

namespace spool::constrain {

/// A schema the compiler cannot handle: what() names the keyword and where it is (a JSON
/// pointer-like path such as "parameters.properties.city.pattern").
class SchemaError : public Error {
 public:
  using Error::Error;
};

/// Markup of Qwen3.5 / Qwen3-Coder XML tool-call parameters:
/// `<parameter=NAME>\nVALUE\n</parameter>\n`.
struct XmlParams {
  std::string open = "<parameter=";    ///< before the parameter name
  std::string name_end = ">\n";        ///< after the name, before the value
  std::string close = "\n</parameter>\n";  ///< after the value
};

/// How values are spelled: JSON (canonical, the default) or a family's JSON-like syntax.
struct JsonDialect {
  std::string quote = "\"";  ///< around strings (and quoted keys)
  bool raw_strings = false;  ///< strings are raw text without escapes ('\n' and '<' excluded) instead of JSON strings
  bool bare_keys = false;    ///< object keys unquoted ([A-Za-z0-9_]+ where any key may come)
  std::string colon = ": ", comma = ", ";  ///< key/value and item separators
  /// Gemma 4's tool-call arguments: `{city:<|"|>Paris<|"|>,days:3,tags:[<|"|>a<|"|>]}`.
  static JsonDialect gemma() { return JsonDialect{"<|\"|>", true, true, ":", ","}; }
};

/// Text of `v` in dialect `d` (canonical_json for the JSON dialect). Keys are written bare in a
/// bare_keys dialect.
std::string dialect_text(const nlohmann::ordered_json& v, const JsonDialect& d);

/// Compiles schemas into rules of one GrammarBuilder. `root` is the document that "#" refs
/// resolve against (the tool's `parameters`, or the response_format schema); values are spelled
/// in `dialect`.
class SchemaCompiler {
 public:
  SchemaCompiler(GrammarBuilder& g, const nlohmann::ordered_json& root, JsonDialect dialect = {});
  /// Rule for the JSON text of a value valid under `schema`; `path` names it in errors.
  /// Throws SchemaError.
  int32_t value(const nlohmann::ordered_json& schema, const std::string& path);
  /// Rule for an object schema's properties written as XML parameters (XmlParams), in
  /// `properties` order. String-typed values (type string, or a string enum/const, optionally
  /// or null: then also the text "null") are raw text without '\n' or '<' (so the value never
  /// runs into the closing markup); other values are JSON text (as the server's
  /// typed_param_json reads them back). A property whose schema mixes string and non-null
  /// non-string alternatives is a SchemaError.
  int32_t xml_arguments(const nlohmann::ordered_json& schema, const XmlParams& markup, const std::string& path);
  /// Rule for any JSON value (canonical form).
  int32_t any_value();
  /// Rule for any JSON object (canonical form).
  int32_t any_object();

 private:
  const nlohmann::ordered_json& resolve(const nlohmann::ordered_json& schema, const std::string& path, int depth);
  int32_t typed(const std::string& type, const nlohmann::ordered_json& s, const std::string& path);
  int32_t object(const nlohmann::ordered_json& s, const std::string& path, const XmlParams* xml);
  int32_t string_rule(const nlohmann::ordered_json& s, const std::string& path, bool raw);
  int32_t xml_value(const nlohmann::ordered_json& s, const std::string& path);
  int32_t literal_rule(const std::string& text);
  int32_t quoted(int32_t body);  // d_.quote body d_.quote
  int32_t char_rule(bool raw);

  GrammarBuilder& g_;
  const nlohmann::ordered_json& root_;
  JsonDialect d_;
  std::map<std::string, int32_t> refs_;  // resolved $ref -> rule (recursion)
  int32_t any_ = -1, any_obj_ = -1, json_char_ = -1, raw_char_ = -1, ws_digits_ = -1;
};

/// Canonical JSON text of `v` (Python json.dumps separators, UTF-8 as is): what the grammar
/// generates for enum/const values.
std::string canonical_json(const nlohmann::ordered_json& v);

/// True when `value` is valid under `schema` (the supported subset above; oneOf means exactly
/// one alternative). On false, `why` (if given) names the first problem. Throws SchemaError
/// for an unsupported keyword.
bool validate(const nlohmann::ordered_json& schema, const nlohmann::ordered_json& value, std::string* why = nullptr);

}  // namespace spool::constrain
