// ApiError: a request failure that the HTTP layer turns into an OpenAI-style error response
// {"error": {"message", "type", "param", "code"}} with an HTTP status.
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace spool::server {

/// Thrown by request parsing and handlers; `status` is the HTTP status (400, 401, 404, 413,
/// 500, 503), `type` the OpenAI error type ("invalid_request_error", "authentication_error",
/// "server_error", ...), `param` the offending request field ("" when none).
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, const std::string& message, std::string param = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)) {}
  int status;
  std::string type;
  std::string param;
};

/// 400 invalid_request_error naming `param`.
inline ApiError bad_request(const std::string& message, const std::string& param = "") {
  return ApiError(400, "invalid_request_error", message, param);
}

/// The OpenAI error object {"error": {"message", "type", "param", "code"}}; `param` and `code`
/// are null when empty.
inline nlohmann::ordered_json error_json(const std::string& message, const std::string& type,
                                         const std::string& param = "", const std::string& code = "") {
  nlohmann::ordered_json e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(param);
  e["code"] = code.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(code);
  return {{"error", e}};
}

/// error_json of an ApiError.
inline nlohmann::ordered_json error_json(const ApiError& e) { return error_json(e.what(), e.type, e.param); }

}  // namespace spool::server
