// Request-body parsing for the HTTP API: the body as a JSON object, and typed field readers
// that turn every wrong input into a 400 ApiError naming the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace spool::server {

using json = nlohmann::ordered_json;

/// Parses an HTTP body into a JSON object. 400 for an empty body, bytes that are not valid
/// UTF-8, malformed JSON (the parser's message, with the byte offset) or a non-object.
json parse_body(std::string_view body);

/// Field readers: nullopt when `key` is absent or null; 400 naming `key` for a wrong type or
/// a value outside [lo, hi].
std::optional<double> get_number(const json& obj, const char* key, double lo, double hi);
std::optional<int64_t> get_int(const json& obj, const char* key, int64_t lo, int64_t hi);
std::optional<bool> get_bool(const json& obj, const char* key);
std::optional<std::string> get_string(const json& obj, const char* key);

}  // namespace spool::server
