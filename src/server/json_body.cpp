#include "server/json_body.h"

#include <cmath>
#include <vector>

#include "common/error.h"
#include "server/stop_strings.h"

namespace spool::server {

json parse_body(std::string_view body) {
  if (body.empty()) throw bad_request("the request body is empty; expected a JSON object");
  json j = parse_json_value(body);
  if (!j.is_object()) throw bad_request("the request body must be a JSON object");
  return j;
}

json parse_json_value(std::string_view body) {
  if (body.empty()) throw bad_request("the request body is empty");
  if (!valid_utf8(body)) throw bad_request("the request body is not valid UTF-8");
  // JSON text never holds a raw NUL; nlohmann's lexer would read one as the end of input.
  if (body.find('\0') != std::string_view::npos) throw bad_request("malformed JSON in the request body: a NUL byte");
  // The limits are checked while parsing, before a deep or wide value is built: nesting is
  // bounded because later copies and renders of the value recurse, and keys per object because
  // ordered_json finds a key by a linear scan (n keys cost n^2 / 2 comparisons).
  std::vector<size_t> keys;  // per open container: keys seen so far (arrays stay 0)
  auto limits = [&keys](int depth, json::parse_event_t ev, json&) {
    switch (ev) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth)
          throw bad_request(strfmt("the request body nests arrays and objects deeper than %d levels", kMaxJsonDepth));
        keys.push_back(0);
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && ++keys.back() > kMaxJsonKeys)
          throw bad_request(strfmt("an object in the request body has more than %zu keys", kMaxJsonKeys));
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(body, limits);
  } catch (const json::exception& e) {
    throw bad_request(strfmt("malformed JSON in the request body: %s", e.what()));
  }
  return j;
}

std::string dump_json(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

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
  // is_number_integer() is true for unsigned values too: test unsigned first, or a value above
  // INT64_MAX (e.g. 18446744073709551615) would wrap to a negative number.
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (hi < 0 || u > static_cast<uint64_t>(hi))
      throw bad_request(strfmt("'%s' must be in [%lld, %lld] (got %llu)", key, (long long)lo, (long long)hi, (unsigned long long)u), key);
    i = static_cast<int64_t>(u);
  } else if (v->is_number_integer()) {
    i = v->get<int64_t>();
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
