// Shared helpers of the builtin filters, tests, globals and methods: Python-style argument
// binding (positional or keyword, defaults, TypeErrors) and small conversions.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>

#include "common/error.h"
#include "template/evaluator.h"
#include "template/value.h"

namespace spool::tmpl::detail {

/// Validates call arguments against a Python signature (names in positional order).
inline void check_args(const CallArgs& a, const char* fn, std::initializer_list<const char*> names) {
  if (a.pos.size() > names.size())
    fail("%s() takes at most %zu argument(s) (%zu given)", fn, names.size(), a.pos.size());
  for (const auto& kv : a.kw) {
    size_t idx = 0;
    bool ok = false;
    for (const char* n : names) {
      if (kv.first == n) {
        ok = true;
        if (idx < a.pos.size()) fail("%s() got multiple values for argument '%s'", fn, n);
      }
      ++idx;
    }
    if (!ok) fail("%s() got an unexpected keyword argument '%s'", fn, kv.first.c_str());
  }
}

/// Argument i (or keyword `name`), else `dflt`.
inline Value arg(const CallArgs& a, size_t i, const char* name, const Value& dflt = Value()) {
  if (i < a.pos.size()) return a.pos[i];
  for (const auto& kv : a.kw)
    if (kv.first == name) return kv.second;
  return dflt;
}

inline bool has_arg(const CallArgs& a, size_t i, const char* name) {
  if (i < a.pos.size()) return true;
  for (const auto& kv : a.kw)
    if (kv.first == name) return true;
  return false;
}

/// Required argument.
inline Value req(const CallArgs& a, size_t i, const char* name, const char* fn) {
  if (!has_arg(a, i, name)) fail("%s() missing required argument: '%s'", fn, name);
  return arg(a, i, name);
}

inline int64_t int_arg(const Value& v, const char* what) {
  if (v.is_integral()) return v.as_int();
  fail("'%s' object cannot be interpreted as an integer (%s)", type_name(v), what);
}

inline const std::string& str_arg(const Value& v, const char* what) {
  if (!v.is_string()) fail("%s must be str, not %s", what, type_name(v));
  return v.str();
}

inline std::optional<int64_t> opt_index(const Value& v) {
  if (v.is_undefined() || v.is_none()) return std::nullopt;
  if (!v.is_integral()) fail("slice indices must be integers or None");
  return v.as_int();
}

/// jinja2 soft_str: strings unchanged (Markup kept), everything else str().
inline Value soft_str(const Value& v) { return v.is_string() ? v : Value::string(to_str(v)); }

inline Value str_value(Interp& in, std::string s, bool safe = false) {
  in.check_size(s.size());
  return Value::string(std::move(s), safe);
}

}  // namespace spool::tmpl::detail
