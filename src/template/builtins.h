// Built-in filters, tests, global functions and Python methods available to templates:
// jinja2's default filters/tests as overridden by transformers (tojson = json.dumps with
// ensure_ascii=False), the raise_exception / strftime_now / namespace / range / dict
// globals, and the str / dict / list methods templates call.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "template/value.h"

namespace spool::tmpl {

class Interp;

/// A filter: input value and call arguments to result.
using FilterFn = Value (*)(Interp& in, const Value& input, CallArgs& args);
/// A test: value and arguments to truth.
using TestFn = bool (*)(Interp& in, const Value& value, CallArgs& args);

/// Index of a filter by name, or -1.
int find_filter(std::string_view name);
/// Index of a test by name, or -1.
int find_test(std::string_view name);
/// Filter implementation by index.
FilterFn filter_fn(int id);
/// Test implementation by index.
TestFn test_fn(int id);

/// Names of the global functions (range, dict, namespace, raise_exception, ...).
const std::vector<std::string>& global_names();
/// The callable for a global function name (allocated on the interpreter's heap).
Value make_global(Interp& in, const std::string& name);

/// True when `name` is a method of the value's Python type that templates may call.
bool has_method(const Value& self, std::string_view name);
/// Calls method `name` on `self` (str/dict/list methods).
Value call_method(Interp& in, const Value& self, std::string_view name, CallArgs& args);

}  // namespace spool::tmpl
