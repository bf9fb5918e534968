// Request-body parsing for the HTTP API: the body as a JSON object, and typed field readers
// that turn every wrong input into a 400 ApiError naming the field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace spool::server {

using json = nlohmann::ordered_json;

/// Arrays and objects nested deeper than this in a request body are refused (400).
inline constexpr int kMaxJsonDepth = 128;
/// Objects with more keys than this in a request body are refused (400).
inline constexpr size_t kMaxJsonKeys = 1024;

/// Parses an HTTP body into a JSON object. 400 for an empty body, bytes that are not valid
/// UTF-8, malformed JSON (the parser's message, with the byte offset), nesting deeper than
/// kMaxJsonDepth, an object with more than kMaxJsonKeys keys, or a non-object.
json parse_body(std::string_view body);

/// The same checks for a body that may be any JSON value (POST /lora-adapters takes an array):
/// everything parse_body refuses but a non-object.
json parse_json_value(std::string_view body);

/// `j` as compact JSON text for a response; bytes that are not valid UTF-8 (e.g. in echoed
/// input) become U+FFFD instead of throwing.
std::string dump_json(const json& j);

/// Field readers: nullopt when `key` is absent or null; 400 naming `key` for a wrong type or
/// a value outside [lo, hi].
std::optional<double> get_number(const json& obj, const char* key, double lo, double hi);
std::optional<int64_t> get_int(const json& obj, const char* key, int64_t lo, int64_t hi);
std::optional<bool> get_bool(const json& obj, const char* key);
std::optional<std::string> get_string(const json& obj, const char* key);

}  // namespace spool::server
