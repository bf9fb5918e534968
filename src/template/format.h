// Python string formatting used by templates: printf-style `fmt % args` (also the `format`
// filter) and str.format() with the format-spec mini-language.
#pragma once

#include <string>

#include "template/value.h"

namespace spool::tmpl {

class Interp;

/// Python `fmt % args` (args: a tuple, a mapping for %(name)s, or a single value).
std::string percent_format(Interp& in, const std::string& fmt, const Value& args);
/// Python `fmt.format(*args, **kwargs)`.
std::string str_format(Interp& in, const std::string& fmt, const CallArgs& args);
/// Python `format(value, spec)`.
std::string format_value(Interp& in, const Value& v, const std::string& spec);

}  // namespace spool::tmpl
