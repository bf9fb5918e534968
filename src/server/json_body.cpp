#include "server/json_body.h"

#include <cmath>

#include "common/error.h"
#include "server/stop_strings.h"

namespace spool::server {

json parse_body(std::string_view body) {
  if (body.empty()) throw bad_request("the request body is empty; expected a JSON object");
  if (!valid_utf8(body)) throw bad_request("the request body is not valid UTF-8");
  // JSON text never holds a raw NUL; nlohmann's lexer would read one as the end of input.
  if (body.find('\0') != std::string_view::npos) throw bad_request("malformed JSON in the request body: a NUL byte");
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    throw bad_request(strfmt("malformed JSON in the request body: %s", e.what()));
  }
  if (!j.is_object()) throw bad_request("the request body must be a JSON object");
  return j;
}

namespace {

const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace

std::optional<double> get_number(const json& obj, const char* key, double lo, double hi) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw bad_request(strfmt("'%s' must be a number", key), key);
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) throw bad_request(strfmt("'%s' must be in [%g, %g] (got %g)", key, lo, hi, d), key);
  return d;
}

std::optional<int64_t> get_int(const json& obj, const char* key, int64_t lo, int64_t hi) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  int64_t i = 0;
  if (v->is_number_integer()) {
    i = v->get<int64_t>();
  } else if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) throw bad_request(strfmt("'%s' must be at most %lld", key, (long long)hi), key);
    i = static_cast<int64_t>(u);
  } else if (v->is_number_float() && std::isfinite(v->get<double>()) && v->get<double>() == std::floor(v->get<double>()) &&
             std::fabs(v->get<double>()) < 9e15) {
    i = static_cast<int64_t>(v->get<double>());  // 5.0 is accepted as 5, as Python clients may send it
  } else {
    throw bad_request(strfmt("'%s' must be an integer", key), key);
  }
  if (i < lo || i > hi) throw bad_request(strfmt("'%s' must be in [%lld, %lld] (got %lld)", key, (long long)lo, (long long)hi, (long long)i), key);
  return i;
}

std::optional<bool> get_bool(const json& obj, const char* key) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw bad_request(strfmt("'%s' must be a boolean", key), key);
  return v->get<bool>();
}

std::optional<std::string> get_string(const json& obj, const char* key) {
  const json* v = field(obj, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw bad_request(strfmt("'%s' must be a string", key), key);
  return v->get<std::string>();
}

}  // namespace spool::server
