// spool::Error: the one exception type for bad input and failed operations.
// The message names the file, tensor or field at fault. The CLI prints it and exits 1;
// the server maps it to a 4xx/5xx JSON error. Never abort() on user input.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

namespace spool {

/// Error raised for bad input (corrupt file, wrong config, out-of-range parameter) or a
/// failed system call. what() is a complete, user-facing sentence fragment.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Error raised for command-line misuse (exit code 2 instead of 1).
class UsageError : public Error {
 public:
  using Error::Error;
};

/// printf-style formatting into a std::string (GCC 12 has no std::format).
template <typename... Args>
std::string strfmt(const char* fmt, Args&&... args) {
  int n = std::snprintf(nullptr, 0, fmt, args...);
  if (n <= 0) return std::string();
  std::string s(static_cast<size_t>(n), '\0');
  std::snprintf(s.data(), s.size() + 1, fmt, args...);
  return s;
}

/// Throws spool::Error with a formatted message.
template <typename... Args>
[[noreturn]] void fail(const char* fmt, Args&&... args) {
  throw Error(strfmt(fmt, std::forward<Args>(args)...));
}

}  // namespace spool
