// Built-in filters (jinja2/filters.py semantics, transformers' tojson); see builtins.h.
#include "template/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

#include "common/error.h"
#include "template/builtins_util.h"
#include "template/evaluator.h"
#include "template/format.h"
#include "template/pystr.h"

namespace spool::tmpl {

using namespace detail;

namespace {

Value lower_if_str(const Value& v) { return v.is_string() ? Value::string(py::lower(v.str())) : v; }

/// jinja2 _prepare_attribute_parts: "a.0.b" -> ["a", 0, "b"].
std::vector<Value> attr_parts(const Value& attribute) {
  std::vector<Value> parts;
  if (attribute.is_none() || attribute.is_undefined()) return parts;
  if (attribute.is_string()) {
    for (const std::string& p : py::split(attribute.str(), std::string_view("."), -1)) {
      bool digits = !p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (digits && p.size() < 18) {
        parts.push_back(Value::integer(std::stoll(p)));
      } else {
        parts.push_back(Value::string(p));
      }
    }
    return parts;
  }
  parts.push_back(attribute);
  return parts;
}

/// jinja2 make_attrgetter.
Value get_path(Interp& in, Value item, const std::vector<Value>& parts, const Value* dflt = nullptr) {
  for (const Value& p : parts) {
    item = in.getitem(item, p);
    if (dflt && item.is_undefined()) item = *dflt;
  }
  return item;
}

/// Stable merge sort with a throwing "less" (Python sorted() is stable).
template <typename T, typename Less>
void stable_sort_values(std::vector<T>& v, Less less) {
  if (v.size() < 2) return;
  std::vector<T> tmp(v.size());
  for (size_t width = 1; width < v.size(); width *= 2) {
    for (size_t lo = 0; lo < v.size(); lo += 2 * width) {
      size_t mid = std::min(lo + width, v.size()), hi = std::min(lo + 2 * width, v.size());
      size_t i = lo, j = mid, k = lo;
      while (i < mid && j < hi) {
        if (less(v[j], v[i])) {
          tmp[k++] = v[j++];
        } else {
          tmp[k++] = v[i++];
        }
      }
      while (i < mid) tmp[k++] = v[i++];
      while (j < hi) tmp[k++] = v[j++];
    }
    v.swap(tmp);
  }
}

int64_t py_len(Interp& in, const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return 0;
    case Kind::String: return static_cast<int64_t>(py::length(v.str()));
    case Kind::List: return static_cast<int64_t>(v.list()->items.size());
    case Kind::Dict: return static_cast<int64_t>(v.dict()->items.size());
    default: (void)in; fail("object of type '%s' has no len()", type_name(v));
  }
}

// ------------------------------------------------------------------ filters

Value f_abs(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "abs", {});
  if (v.is_float()) return Value::number(std::fabs(v.as_double()));
  if (v.is_integral()) {
    if (v.as_int() == INT64_MIN) fail("integer overflow");
    return Value::integer(std::llabs(v.as_int()));
  }
  fail("bad operand type for abs(): '%s'", type_name(v));
}

Value f_attr(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "attr", {"name"});
  const std::string& name = str_arg(req(a, 0, "name", "attr"), "attribute name");
  if (v.is_undefined()) in.fail_undefined(v);
  if (v.is_dict() || v.is_string() || v.is_list()) {
    if (has_method(v, name)) return in.getattr(v, name);
    return Value::undefined("'" + std::string(type_name(v)) + " object' has no attribute '" + name + "'");
  }
  if (v.kind() == Kind::Namespace || v.kind() == Kind::Loop) return in.getattr(v, name);
  return Value::undefined("'" + std::string(type_name(v)) + " object' has no attribute '" + name + "'");
}

Value f_batch_now(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "batch", {"linecount", "fill_with"});
  int64_t n = int_arg(req(a, 0, "linecount", "batch"), "linecount");
  Value fill = arg(a, 1, "fill_with", Value::none());
  std::vector<Value> out, tmp;
  for (const Value& x : in.iterate(v)) {
    if (static_cast<int64_t>(tmp.size()) == n) {
      out.push_back(in.make_list(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(x);
  }
  if (!tmp.empty()) {
    if (!fill.is_none()) {
      if (n > static_cast<int64_t>(in.limits().max_heap_cells)) in.heap().charge(SIZE_MAX / 2);
      while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(fill);
    }
    out.push_back(in.make_list(std::move(tmp)));
  }
  return in.make_iter(std::move(out), "generator");
}

Value f_capitalize(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "capitalize", {});
  Value s = soft_str(v);
  return str_value(in, py::capitalize(s.str()), s.safe());
}

Value f_center(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "center", {"width"});
  int64_t w = int_arg(arg(a, 0, "width", Value::integer(80)), "width");
  in.check_size(static_cast<size_t>(std::max<int64_t>(w, 0)));
  Value s = soft_str(v);
  return Value::string(py::pad(s.str(), w, " ", '^'), s.safe());
}

Value f_length(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "length", {});
  return Value::integer(py_len(in, v));
}

Value f_default(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "default", {"default_value", "boolean"});
  Value dflt = arg(a, 0, "default_value", Value::string(""));
  bool boolean = truthy(arg(a, 1, "boolean", Value::boolean(false)));
  if (v.is_undefined() || (boolean && !truthy(v))) return dflt;
  return v;
}

Value f_dictsort(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "dictsort", {"case_sensitive", "by", "reverse"});
  bool cs = truthy(arg(a, 0, "case_sensitive", Value::boolean(false)));
  Value by = arg(a, 1, "by", Value::string("key"));
  bool reverse = truthy(arg(a, 2, "reverse", Value::boolean(false)));
  size_t pos;
  if (by.is_string() && by.str() == "key") {
    pos = 0;
  } else if (by.is_string() && by.str() == "value") {
    pos = 1;
  } else {
    fail("You can only sort by either \"key\" or \"value\"");
  }
  if (v.is_undefined()) in.fail_undefined(v);
  if (!v.is_dict()) fail("'%s' object has no attribute 'items'", type_name(v));
  std::vector<std::pair<Value, Value>> items;  // (sort key, item tuple)
  for (const auto& kv : v.dict()->items) {
    Value key = pos == 0 ? kv.first : kv.second;
    if (!cs) key = lower_if_str(key);
    items.emplace_back(key, in.make_list({kv.first, kv.second}, ListFlavor::Tuple));
  }
  stable_sort_values(items, [&](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first, "<") : compare(x.first, y.first, "<");
  });
  std::vector<Value> out;
  for (auto& it : items) out.push_back(it.second);
  return in.make_list(std::move(out));
}

Value f_escape(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "escape", {});
  if (v.is_string() && v.safe()) return v;
  return str_value(in, py::html_escape(to_str(v)), true);
}

Value f_forceescape(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "forceescape", {});
  return str_value(in, py::html_escape(to_str(v)), true);
}

Value f_first(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "first", {});
  if (v.kind() == Kind::Iterator) {
    IterObj* it = v.iter();
    in.force(it);
    if (it->pos < it->items.size()) return it->items[it->pos++];
    return Value::undefined("No first item, sequence was empty.");
  }
  if (v.is_string() || v.is_list() || v.is_dict() || v.is_undefined()) {
    if (v.is_list() && !v.list()->items.empty()) return v.list()->items.front();
    if (v.is_dict() && !v.dict()->items.empty()) return v.dict()->items.front().first;
    if (v.is_string() && !v.str().empty()) {
      size_t i = 0;
      py::decode_at(v.str(), i);
      return Value::string(v.str().substr(0, i));
    }
    return Value::undefined("No first item, sequence was empty.");
  }
  return in.iterate(v).empty() ? Value() : Value();  // iterate() throws for non-iterables
}

Value f_last(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "last", {});
  if (v.kind() == Kind::Iterator) fail("'%s' object is not reversible", type_name(v));
  if (v.is_list() && !v.list()->items.empty()) return v.list()->items.back();
  if (v.is_dict() && !v.dict()->items.empty()) return v.dict()->items.back().first;
  if (v.is_string() && !v.str().empty()) {
    std::vector<Value> chars = in.iterate(v);
    return chars.back();
  }
  if (v.is_string() || v.is_list() || v.is_dict() || v.is_undefined())
    return Value::undefined("No last item, sequence was empty.");
  fail("'%s' object is not reversible", type_name(v));
}

/// Python float(str) parsing (whitespace, sign, digits with '_' separators, inf/nan).
bool parse_py_float(const std::string& s0, double* out) {
  std::string s = py::strip(s0, std::nullopt, true, true);
  std::string t;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) t.push_back(s[i++]);
  std::string rest = py::lower(s.substr(i));
  if (rest == "inf" || rest == "infinity" || rest == "nan") {
    *out = std::strtod((t + rest).c_str(), nullptr);
    return true;
  }
  bool digits = false, dot = false, exp = false;
  char prev = 0;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c >= '0' && c <= '9') {
      digits = true;
      t.push_back(c);
    } else if (c == '_') {
      if (!(prev >= '0' && prev <= '9') || i + 1 >= s.size() || !(s[i + 1] >= '0' && s[i + 1] <= '9')) return false;
    } else if (c == '.' && !dot && !exp) {
      dot = true;
      t.push_back(c);
    } else if ((c == 'e' || c == 'E') && digits && !exp) {
      exp = true;
      t.push_back('e');
      if (i + 1 < s.size() && (s[i + 1] == '+' || s[i + 1] == '-')) t.push_back(s[++i]);
      if (i + 1 >= s.size()) return false;
      digits = false;
    } else {
      return false;
    }
    prev = c;
  }
  if (!digits) return false;
  *out = std::strtod(t.c_str(), nullptr);
  return true;
}

/// Python int(str, base).
bool parse_py_int(const std::string& s0, int base, int64_t* out) {
  std::string s = py::strip(s0, std::nullopt, true, true);
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  if (base == 0 || base == 2 || base == 8 || base == 16) {
    if (i + 1 < s.size() && s[i] == '0') {
      char p = static_cast<char>(s[i + 1] | 0x20);
      int b = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
      if (b && (base == 0 || base == b)) {
        base = b;
        i += 2;
        if (i < s.size() && s[i] == '_') ++i;
      }
    }
    if (base == 0) base = 10;
  }
  if (base < 2 || base > 36) return false;
  if (i >= s.size()) return false;
  unsigned __int128 v = 0;
  char prev = 0;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_') {
      if (prev == '_' || prev == 0 || i + 1 >= s.size()) return false;
      prev = c;
      continue;
    }
    int d = (c >= '0' && c <= '9') ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10 : 99;
    if (d >= base) return false;
    v = v * static_cast<unsigned>(base) + static_cast<unsigned>(d);
    if (v > static_cast<unsigned __int128>(INT64_MAX) + 1) fail("integer value too large");
    prev = c;
  }
  if (!neg && v > static_cast<unsigned __int128>(INT64_MAX)) fail("integer value too large");
  *out = neg ? static_cast<int64_t>(-static_cast<__int128>(v)) : static_cast<int64_t>(v);
  return true;
}

Value f_int(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "int", {"default", "base"});
  Value dflt = arg(a, 0, "default", Value::integer(0));
  int64_t base = int_arg(arg(a, 1, "base", Value::integer(10)), "base");
  if (v.is_undefined()) in.fail_undefined(v);
  if (v.is_integral()) return Value::integer(v.as_int());
  auto from_double = [&](double d) -> Value {
    if (std::isnan(d) || std::isinf(d)) return dflt;
    if (std::fabs(d) >= 9.2233720368547758e18) fail("integer value too large");
    return Value::integer(static_cast<int64_t>(d));
  };
  if (v.is_float()) return from_double(v.as_double());
  if (v.is_string()) {
    int64_t r;
    if (parse_py_int(v.str(), static_cast<int>(base), &r)) return Value::integer(r);
    double d;
    if (parse_py_float(v.str(), &d)) return from_double(d);
  }
  return dflt;
}

Value f_float(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "float", {"default"});
  Value dflt = arg(a, 0, "default", Value::number(0.0));
  if (v.is_undefined()) in.fail_undefined(v);
  if (v.is_number()) return Value::number(v.as_double());
  if (v.is_string()) {
    double d;
    if (parse_py_float(v.str(), &d)) return Value::number(d);
  }
  return dflt;
}

Value f_format(Interp& in, const Value& v, CallArgs& a) {
  if (!a.pos.empty() && !a.kw.empty()) fail("can't handle positional and keyword arguments at the same time");
  Value args;
  if (!a.kw.empty()) {
    DictObj* d = in.heap().make<DictObj>();
    for (const auto& kv : a.kw) d->set(Value::string(kv.first), kv.second);
    args = Value::object(Kind::Dict, d);
  } else {
    args = in.make_list(a.pos, ListFlavor::Tuple);
  }
  return Value::string(percent_format(in, soft_str(v).str(), args));
}

Value f_groupby(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "groupby", {"attribute", "default", "case_sensitive"});
  std::vector<Value> parts = attr_parts(req(a, 0, "attribute", "groupby"));
  Value dflt = arg(a, 1, "default", Value::none());
  bool cs = truthy(arg(a, 2, "case_sensitive", Value::boolean(false)));
  const Value* dp = dflt.is_none() ? nullptr : &dflt;
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& x : in.iterate(v)) {
    Value k = get_path(in, x, parts, dp);
    if (!cs) k = lower_if_str(k);
    keyed.emplace_back(k, x);
  }
  stable_sort_values(keyed, [&](const auto& p, const auto& q) { return compare(p.first, q.first, "<"); });
  std::vector<Value> out;
  size_t i = 0;
  while (i < keyed.size()) {
    size_t j = i;
    std::vector<Value> group;
    while (j < keyed.size() && equals(keyed[j].first, keyed[i].first)) group.push_back(keyed[j++].second);
    Value grouper = cs ? keyed[i].first : get_path(in, group.front(), parts, dp);
    Value t = in.make_list({grouper, in.make_list(std::move(group))}, ListFlavor::Tuple);
    t.list()->named_group = true;
    out.push_back(t);
    i = j;
  }
  return in.make_list(std::move(out));
}

Value f_indent(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "indent", {"width", "first", "blank"});
  Value w = arg(a, 0, "width", Value::integer(4));
  bool first = truthy(arg(a, 1, "first", Value::boolean(false)));
  bool blank = truthy(arg(a, 2, "blank", Value::boolean(false)));
  std::string ind;
  if (w.is_string()) {
    ind = w.str();
  } else {
    int64_t n = int_arg(w, "width");
    in.check_size(static_cast<size_t>(std::max<int64_t>(n, 0)));
    ind.assign(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
  }
  if (v.is_undefined()) in.fail_undefined(v);
  if (!v.is_string()) fail("unsupported operand type(s) for +=: '%s' and 'str'", type_name(v));
  std::string s = v.str() + "\n";
  std::vector<std::string> lines = py::splitlines(s, false);
  std::string rv;
  size_t total = s.size() + lines.size() * ind.size();
  in.check_size(total);
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + ind;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? std::string() : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += ind;
      rv += lines[i];
    }
  }
  if (first) rv = ind + rv;
  return Value::string(std::move(rv), v.safe());
}

Value f_items_now(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "items", {});
  if (v.is_undefined()) return in.make_iter({}, "generator");
  if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& kv : v.dict()->items) out.push_back(in.make_list({kv.first, kv.second}, ListFlavor::Tuple));
  return in.make_iter(std::move(out), "generator");
}

Value f_join(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "join", {"d", "attribute"});
  Value d = arg(a, 0, "d", Value::string(""));
  Value attribute = arg(a, 1, "attribute", Value::none());
  std::string sep = to_str(d);
  std::vector<Value> parts = attr_parts(attribute);
  std::string out;
  bool first = true;
  for (const Value& x : in.iterate(v)) {
    if (!first) out += sep;
    first = false;
    append_str(out, parts.empty() ? x : get_path(in, x, parts));
    in.check_size(out.size());
  }
  return Value::string(std::move(out));
}

Value f_list(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "list", {});
  return in.make_list(in.iterate(v));
}

Value f_lower(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "lower", {});
  Value s = soft_str(v);
  return str_value(in, py::lower(s.str()), s.safe());
}

Value f_upper(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "upper", {});
  Value s = soft_str(v);
  return str_value(in, py::upper(s.str()), s.safe());
}

Value f_title(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "title", {});
  // jinja2: words start after runs of [-\s({\[<]; first char upper, rest lower.
  std::u32string u = py::decode(soft_str(v).str());
  std::string out;
  bool start = true;
  for (char32_t c : u) {
    bool delim = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py::is_space(c);
    if (delim) {
      py::append_utf8(out, c);
      start = true;
    } else if (start) {
      py::append_utf8(out, py::to_upper(c));
      start = false;
    } else {
      py::append_utf8(out, py::to_lower(c));
    }
  }
  return str_value(in, std::move(out));
}

Value f_trim(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "trim", {"chars"});
  Value chars = arg(a, 0, "chars", Value::none());
  Value s = soft_str(v);
  std::optional<std::string_view> cs;
  if (!chars.is_none()) cs = str_arg(chars, "strip arg");
  return str_value(in, py::strip(s.str(), cs, true, true), s.safe());
}

Value f_string(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "string", {});
  return soft_str(v);
}

Value f_safe(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "safe", {});
  return str_value(in, to_str(v), true);
}

Value f_map_now(Interp& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  if (!truthy(v)) return in.make_iter({}, "generator");
  if (a.pos.empty() && has_arg(a, 99, "attribute")) {
    Value attribute, dflt = Value::none();
    for (const auto& kv : a.kw) {
      if (kv.first == "attribute") {
        attribute = kv.second;
      } else if (kv.first == "default") {
        dflt = kv.second;
      } else {
        fail("Unexpected keyword argument '%s'", kv.first.c_str());
      }
    }
    std::vector<Value> parts = attr_parts(attribute);
    const Value* dp = dflt.is_none() ? nullptr : &dflt;
    for (const Value& x : in.iterate(v)) out.push_back(get_path(in, x, parts, dp));
    return in.make_iter(std::move(out), "generator");
  }
  if (a.pos.empty()) fail("map requires a filter argument");
  const std::string& name = str_arg(a.pos[0], "filter name");
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const Value& x : in.iterate(v)) {
    CallArgs copy = rest;
    out.push_back(in.apply_filter(name, x, copy));
  }
  return in.make_iter(std::move(out), "generator");
}

Value select_or_reject_now(Interp& in, const Value& v, CallArgs& a, bool select, bool lookup_attr) {
  if (!truthy(v)) return in.make_iter({}, "generator");
  size_t off = 0;
  std::vector<Value> parts;
  if (lookup_attr) {
    if (a.pos.empty()) fail("Missing parameter for attribute name");
    parts = attr_parts(a.pos[0]);
    off = 1;
  }
  bool have_test = a.pos.size() > off;
  std::string test = have_test ? str_arg(a.pos[off], "test name") : std::string();
  CallArgs rest;
  if (have_test) rest.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(off + 1), a.pos.end());
  rest.kw = a.kw;
  std::vector<Value> out;
  for (const Value& x : in.iterate(v)) {
    Value probe = lookup_attr ? get_path(in, x, parts) : x;
    bool r;
    if (have_test) {
      CallArgs copy = rest;
      r = in.apply_test(test, probe, copy);
    } else {
      r = truthy(probe);
    }
    if (r == select) out.push_back(x);
  }
  return in.make_iter(std::move(out), "generator");
}

/// A filter returning a Python generator: its body runs when the result is first consumed.
Value lazy(Interp& in, const Value& v, CallArgs& a, Value (*now)(Interp&, const Value&, CallArgs&)) {
  return in.make_lazy_iter(
      [&in, v, a, now]() mutable {
        Value r = now(in, v, a);
        in.force(r.iter());
        return r.iter()->items;
      },
      "generator");
}

Value select_or_reject(Interp& in, const Value& v, CallArgs& a, bool select, bool lookup_attr) {
  return in.make_lazy_iter(
      [&in, v, a, select, lookup_attr]() mutable {
        Value r = select_or_reject_now(in, v, a, select, lookup_attr);
        return r.iter()->items;
      },
      "generator");
}

Value f_select(Interp& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, true, false); }
Value f_reject(Interp& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, false, false); }
Value f_selectattr(Interp& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, true, true); }
Value f_rejectattr(Interp& in, const Value& v, CallArgs& a) { return select_or_reject(in, v, a, false, true); }

Value min_max(Interp& in, const Value& v, CallArgs& a, bool want_max) {
  check_args(a, want_max ? "max" : "min", {"case_sensitive", "attribute"});
  bool cs = truthy(arg(a, 0, "case_sensitive", Value::boolean(false)));
  std::vector<Value> parts = attr_parts(arg(a, 1, "attribute", Value::none()));
  std::vector<Value> items = in.iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& x) {
    Value k = get_path(in, x, parts);
    return cs ? k : lower_if_str(k);
  };
  Value best = items[0], best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (compare(k, best_key, want_max ? ">" : "<")) {
      best = items[i];
      best_key = k;
    }
  }
  return best;
}

Value f_min(Interp& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); }
Value f_max(Interp& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); }

Value f_replace(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "replace", {"old", "new", "count"});
  std::string old = to_str(req(a, 0, "old", "replace"));
  std::string repl = to_str(req(a, 1, "new", "replace"));
  Value c = arg(a, 2, "count", Value::none());
  int64_t count = c.is_none() ? -1 : int_arg(c, "count");
  std::string s = to_str(v);
  if (old.empty()) {
    in.check_size(s.size() + (py::length(s) + 1) * repl.size());
  } else if (!repl.empty() && repl.size() > old.size()) {
    in.check_size(s.size() + (s.size() / old.size() + 1) * (repl.size() - old.size()));
  }
  return Value::string(py::replace(s, old, repl, count));
}

Value f_reverse(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "reverse", {});
  if (v.is_string()) {
    std::u32string u = py::decode(v.str());
    std::reverse(u.begin(), u.end());
    return Value::string(py::encode(u));
  }
  if (v.is_list() || v.is_dict() || v.is_undefined()) {
    std::vector<Value> items = in.iterate(v);
    std::reverse(items.begin(), items.end());
    return in.make_iter(std::move(items), v.is_list() ? "list_reverseiterator" : "reversed");
  }
  std::vector<Value> items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  return in.make_list(std::move(items));
}

/// Python round(x, ndigits) for floats (correctly rounded, half-even on exact ties).
double py_round(double x, int64_t nd) {
  if (std::isnan(x) || std::isinf(x)) return x;
  if (nd > 300) return x;
  if (nd < -308) return std::copysign(0.0, x);
  if (nd >= 0) {
    char buf[400];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(nd), x);
    return std::strtod(buf, nullptr);
  }
  double p = std::pow(10.0, static_cast<double>(-nd));
  double y = x / p;
  double r = std::nearbyint(y);
  return r * p;
}

Value f_round(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "round", {"precision", "method"});
  int64_t prec = int_arg(arg(a, 0, "precision", Value::integer(0)), "precision");
  Value method = arg(a, 1, "method", Value::string("common"));
  std::string m = method.is_string() ? method.str() : "";
  if (m != "common" && m != "ceil" && m != "floor") fail("method must be common, ceil or floor");
  if (!v.is_number()) fail("type %s doesn't define __round__ method", type_name(v));
  if (m == "common") {
    if (v.is_integral()) {
      int64_t x = v.as_int();
      if (prec >= 0) return Value::integer(x);
      if (prec < -18) return Value::integer(0);
      int64_t p = 1;
      for (int64_t i = 0; i < -prec; ++i) p *= 10;
      int64_t q = x / p, r = x % p;
      if (r < 0) {
        r += p;
        q -= 1;
      }
      if (2 * r > p || (2 * r == p && (q & 1))) ++q;
      return Value::integer(q * p);
    }
    return Value::number(py_round(v.as_double(), prec));
  }
  double p = std::pow(10.0, static_cast<double>(prec));
  double x = v.as_double() * p;
  double r = m == "ceil" ? std::ceil(x) : std::floor(x);
  if (std::isinf(r) || std::isnan(r)) fail("cannot convert float infinity to integer");
  return Value::number(r / p);
}

Value f_slice_now(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "slice", {"slices", "fill_with"});
  int64_t slices = int_arg(req(a, 0, "slices", "slice"), "slices");
  Value fill = arg(a, 1, "fill_with", Value::none());
  std::vector<Value> seq = in.iterate(v);
  if (slices <= 0) {
    if (slices == 0 && !seq.empty()) fail("integer division or modulo by zero");
    return in.make_iter({}, "generator");
  }
  if (slices > static_cast<int64_t>(in.limits().max_heap_cells)) in.heap().charge(SIZE_MAX / 2);
  int64_t len = static_cast<int64_t>(seq.size());
  int64_t per = len / slices, extra = len % slices, offset = 0;
  std::vector<Value> out;
  for (int64_t n = 0; n < slices; ++n) {
    int64_t start = offset + n * per;
    if (n < extra) ++offset;
    int64_t end = offset + (n + 1) * per;
    std::vector<Value> tmp(seq.begin() + start, seq.begin() + end);
    if (!fill.is_none() && n >= extra) tmp.push_back(fill);
    out.push_back(in.make_list(std::move(tmp)));
  }
  return in.make_iter(std::move(out), "generator");
}

Value f_sort(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "sort", {"reverse", "case_sensitive", "attribute"});
  bool reverse = truthy(arg(a, 0, "reverse", Value::boolean(false)));
  bool cs = truthy(arg(a, 1, "case_sensitive", Value::boolean(false)));
  Value attribute = arg(a, 2, "attribute", Value::none());
  std::vector<std::vector<Value>> paths;
  if (attribute.is_string()) {
    for (const std::string& p : py::split(attribute.str(), std::string_view(","), -1))
      paths.push_back(attr_parts(Value::string(p)));
  } else {
    paths.push_back(attr_parts(attribute));
  }
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& x : in.iterate(v)) {
    std::vector<Value> ks;
    for (const auto& path : paths) {
      Value k = get_path(in, x, path);
      ks.push_back(cs ? k : lower_if_str(k));
    }
    keyed.emplace_back(in.make_list(std::move(ks)), x);
  }
  stable_sort_values(keyed, [&](const auto& p, const auto& q) {
    return reverse ? compare(q.first, p.first, "<") : compare(p.first, q.first, "<");
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(kv.second);
  return in.make_list(std::move(out));
}

Value f_sum(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "sum", {"attribute", "start"});
  std::vector<Value> parts = attr_parts(arg(a, 0, "attribute", Value::none()));
  Value total = arg(a, 1, "start", Value::integer(0));
  if (total.is_string()) fail("sum() can't sum strings [use ''.join(seq) instead]");
  CallArgs none;
  for (const Value& x : in.iterate(v)) {
    Value item = parts.empty() ? x : get_path(in, x, parts);
    // reuse the interpreter's + semantics through a tiny expression-free path
    if (total.is_number() && item.is_number()) {
      if (total.is_integral() && item.is_integral()) {
        int64_t r;
        if (__builtin_add_overflow(total.as_int(), item.as_int(), &r)) fail("integer overflow");
        total = Value::integer(r);
      } else {
        total = Value::number(total.as_double() + item.as_double());
      }
    } else if (total.is_list() && item.is_list() && total.list()->flavor == item.list()->flavor) {
      std::vector<Value> items = total.list()->items;
      items.insert(items.end(), item.list()->items.begin(), item.list()->items.end());
      total = in.make_list(std::move(items), total.list()->flavor);
    } else {
      if (item.is_undefined()) in.fail_undefined(item);
      fail("unsupported operand type(s) for +: '%s' and '%s'", type_name(total), type_name(item));
    }
  }
  return total;
}

Value f_tojson(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonFormat fmt;
  fmt.ensure_ascii = truthy(arg(a, 0, "ensure_ascii", Value::boolean(false)));
  Value indent = arg(a, 1, "indent", Value::none());
  Value seps = arg(a, 2, "separators", Value::none());
  fmt.sort_keys = truthy(arg(a, 3, "sort_keys", Value::boolean(false)));
  if (!indent.is_none()) {
    fmt.indent = true;
    if (indent.is_string()) {
      fmt.indent_str = indent.str();
    } else if (indent.is_integral()) {
      int64_t n = indent.as_int();
      in.check_size(static_cast<size_t>(std::max<int64_t>(n, 0)));
      fmt.indent_str.assign(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
    } else {
      fail("indent must be an int or a str, not %s", type_name(indent));
    }
    fmt.item_sep = ",";
  }
  if (!seps.is_none()) {
    std::vector<Value> s = in.iterate(seps);
    if (s.size() != 2) fail("separators must be a (item_separator, key_separator) pair");
    fmt.item_sep = str_arg(s[0], "item separator");
    fmt.key_sep = str_arg(s[1], "key separator");
  }
  if (v.is_undefined()) fail("Object of type Undefined is not JSON serializable");
  std::string out;
  append_json(out, v, fmt);
  return str_value(in, std::move(out));
}

Value f_truncate(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "truncate", {"length", "killwords", "end", "leeway"});
  int64_t length = int_arg(arg(a, 0, "length", Value::integer(255)), "length");
  bool killwords = truthy(arg(a, 1, "killwords", Value::boolean(false)));
  std::string end = to_str(arg(a, 2, "end", Value::string("...")));
  Value lw = arg(a, 3, "leeway", Value::none());
  int64_t leeway = lw.is_none() ? 5 : int_arg(lw, "leeway");
  int64_t end_len = static_cast<int64_t>(py::length(end));
  if (length < end_len) fail("expected length >= %lld, got %lld", static_cast<long long>(end_len), static_cast<long long>(length));
  if (leeway < 0) fail("expected leeway >= 0, got %lld", static_cast<long long>(leeway));
  if (v.is_undefined()) return v;
  if (!v.is_string()) {
    int64_t n = py_len(in, v);  // throws for unsized values
    if (n <= length + leeway) return v;
    fail("can only truncate strings, not %s", type_name(v));
  }
  const std::string& s = v.str();
  std::u32string u = py::decode(s);
  if (static_cast<int64_t>(u.size()) <= length + leeway) return v;
  std::string head = py::encode(u.data(), u.data() + (length - end_len));
  if (killwords) return str_value(in, head + end);
  std::vector<std::string> parts = py::rsplit(head, std::string_view(" "), 1);
  return str_value(in, parts[0] + end);
}

/// A string that is equal for values Python considers equal (for hashable values).
void hash_key(std::string& out, const Value& v, int depth = 0) {
  if (depth > kMaxValueDepth) fail("value nesting too deep");
  switch (v.kind()) {
    case Kind::String: out += 's'; out += std::to_string(v.str().size()); out += ':'; out += v.str(); return;
    case Kind::Bool:
    case Kind::Int: out += 'i'; out += std::to_string(v.as_int()); out += ';'; return;
    case Kind::Float: {
      double d = v.as_double();
      if (d == std::floor(d) && std::fabs(d) < 9.2e18) {
        out += 'i';
        out += std::to_string(static_cast<int64_t>(d));
        out += ';';
      } else {
        out += 'f';
        out += py::float_repr(d);
        out += ';';
      }
      return;
    }
    case Kind::None: out += 'n'; return;
    case Kind::Undefined: out += 'u'; return;
    case Kind::List:
      out += '(';
      for (const Value& x : v.list()->items) hash_key(out, x, depth + 1);
      out += ')';
      return;
    default: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "p%p;", static_cast<const void*>(v.obj()));
      out += buf;
    }
  }
}

Value f_unique_now(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "unique", {"case_sensitive", "attribute"});
  bool cs = truthy(arg(a, 0, "case_sensitive", Value::boolean(false)));
  std::vector<Value> parts = attr_parts(arg(a, 1, "attribute", Value::none()));
  std::unordered_set<std::string> seen;
  std::vector<Value> out;
  for (const Value& x : in.iterate(v)) {
    Value k = get_path(in, x, parts);
    if (!cs) k = lower_if_str(k);
    check_hashable(k);
    std::string key;
    hash_key(key, k);
    if (seen.insert(std::move(key)).second) out.push_back(x);
  }
  return in.make_iter(std::move(out), "generator");
}

Value f_wordcount(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "wordcount", {});
  std::u32string u = py::decode(soft_str(v).str());
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : u) {
    bool w = c == '_' || py::str_is(py::encode(&c, &c + 1), py::StrClass::Alnum);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

Value f_batch(Interp& in, const Value& v, CallArgs& a) { return lazy(in, v, a, f_batch_now); }
Value f_items(Interp& in, const Value& v, CallArgs& a) { return lazy(in, v, a, f_items_now); }
Value f_map(Interp& in, const Value& v, CallArgs& a) { return lazy(in, v, a, f_map_now); }
Value f_slice(Interp& in, const Value& v, CallArgs& a) { return lazy(in, v, a, f_slice_now); }
Value f_unique(Interp& in, const Value& v, CallArgs& a) { return lazy(in, v, a, f_unique_now); }

struct FilterEntry {
  const char* name;
  FilterFn fn;
};

const FilterEntry kFilters[] = {
    {"abs", f_abs},           {"attr", f_attr},         {"batch", f_batch},
    {"capitalize", f_capitalize}, {"center", f_center}, {"count", f_length},
    {"d", f_default},         {"default", f_default},   {"dictsort", f_dictsort},
    {"e", f_escape},          {"escape", f_escape},     {"first", f_first},
    {"float", f_float},       {"forceescape", f_forceescape}, {"format", f_format},
    {"groupby", f_groupby},   {"indent", f_indent},     {"int", f_int},
    {"items", f_items},       {"join", f_join},         {"last", f_last},
    {"length", f_length},     {"list", f_list},         {"lower", f_lower},
    {"map", f_map},           {"max", f_max},           {"min", f_min},
    {"reject", f_reject},     {"rejectattr", f_rejectattr}, {"replace", f_replace},
    {"reverse", f_reverse},   {"round", f_round},       {"safe", f_safe},
    {"select", f_select},     {"selectattr", f_selectattr}, {"slice", f_slice},
    {"sort", f_sort},         {"string", f_string},     {"sum", f_sum},
    {"title", f_title},       {"tojson", f_tojson},     {"trim", f_trim},
    {"truncate", f_truncate}, {"unique", f_unique},     {"upper", f_upper},
    {"wordcount", f_wordcount},
};

}  // namespace

int find_filter(std::string_view name) {
  for (size_t i = 0; i < sizeof(kFilters) / sizeof(kFilters[0]); ++i)
    if (name == kFilters[i].name) return static_cast<int>(i);
  return -1;
}


FilterFn filter_fn(int id) { return kFilters[id].fn; }

}  // namespace spool::tmpl
