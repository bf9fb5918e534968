// Python str / dict / list methods callable from templates (with the sandbox's refusal of
// mutating methods, except list.append); see builtins.h.
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

// ------------------------------------------------------------------ methods

const char* const kStrMethods[] = {
    "capitalize", "casefold", "center", "count", "endswith", "find", "format", "index", "isalnum", "isalpha",
    "isascii", "isdecimal", "isdigit", "islower", "isnumeric", "isspace", "istitle", "isupper", "join", "ljust",
    "lower", "lstrip", "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust",
    "rpartition", "rsplit", "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title", "upper",
    "zfill"};
const char* const kDictMethods[] = {"clear", "copy", "get", "items", "keys", "pop", "popitem", "setdefault",
                                    "update", "values"};
const char* const kListMethods[] = {"append", "clear", "copy", "count", "extend", "index", "insert",
                                    "pop", "remove", "reverse", "sort"};
const char* const kTupleMethods[] = {"count", "index"};

template <size_t N>
bool in_list(const char* const (&names)[N], std::string_view name) {
  for (const char* n : names)
    if (name == n) return true;
  return false;
}

bool affix_match(Interp& in, const std::string& s, CallArgs& a, bool at_end, const char* fn) {
  check_args(a, fn, {"prefix", "start", "end"});
  Value p = req(a, 0, "prefix", fn);
  auto start = opt_index(arg(a, 1, "start", Value::none()));
  auto end = opt_index(arg(a, 2, "end", Value::none()));
  if (p.is_string()) return py::starts_ends_with(s, p.str(), start, end, at_end);
  if (p.is_list() && p.list()->flavor == ListFlavor::Tuple) {
    for (const Value& x : in.iterate(p)) {
      if (!x.is_string())
        fail("tuple for %s must only contain str, not %s", fn, type_name(x));
      if (py::starts_ends_with(s, x.str(), start, end, at_end)) return true;
    }
    return false;
  }
  fail("%s first arg must be str or a tuple of str, not %s", fn, type_name(p));
}

Value str_method(Interp& in, const Value& self, std::string_view name, CallArgs& a) {
  const std::string& s = self.str();
  auto strv = [&](std::string r) { return str_value(in, std::move(r)); };
  auto list_of = [&](std::vector<std::string> parts) {
    std::vector<Value> out;
    out.reserve(parts.size());
    for (auto& p : parts) out.push_back(Value::string(std::move(p)));
    return in.make_list(std::move(out));
  };
  auto opt_str = [&](size_t i, const char* n) -> std::optional<std::string_view> {
    Value v = arg(a, i, n, Value::none());
    if (v.is_none()) return std::nullopt;
    return std::string_view(str_arg(v, n));
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    check_args(a, "strip", {"chars"});
    return strv(py::strip(s, opt_str(0, "chars"), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    check_args(a, "split", {"sep", "maxsplit"});
    int64_t maxsplit = int_arg(arg(a, 1, "maxsplit", Value::integer(-1)), "maxsplit");
    auto sep = opt_str(0, "sep");
    in.check_size(s.size() * 8);
    return list_of(name == "split" ? py::split(s, sep, maxsplit) : py::rsplit(s, sep, maxsplit));
  }
  if (name == "splitlines") {
    check_args(a, "splitlines", {"keepends"});
    return list_of(py::splitlines(s, truthy(arg(a, 0, "keepends", Value::boolean(false)))));
  }
  if (name == "startswith") return Value::boolean(affix_match(in, s, a, false, "startswith"));
  if (name == "endswith") return Value::boolean(affix_match(in, s, a, true, "endswith"));
  if (name == "replace") {
    check_args(a, "replace", {"old", "new", "count"});
    const std::string& old = str_arg(req(a, 0, "old", "replace"), "replace() argument 1");
    const std::string& repl = str_arg(req(a, 1, "new", "replace"), "replace() argument 2");
    int64_t count = int_arg(arg(a, 2, "count", Value::integer(-1)), "count");
    if (old.empty()) {
      in.check_size(s.size() + (py::length(s) + 1) * repl.size());
    } else if (repl.size() > old.size()) {
      in.check_size(s.size() + (s.size() / old.size() + 1) * (repl.size() - old.size()));
    }
    return strv(py::replace(s, old, repl, count));
  }
  if (name == "lower" || name == "casefold") {
    check_args(a, "lower", {});
    return strv(py::lower(s));
  }
  if (name == "upper") {
    check_args(a, "upper", {});
    return strv(py::upper(s));
  }
  if (name == "title") {
    check_args(a, "title", {});
    return strv(py::title(s));
  }
  if (name == "capitalize") {
    check_args(a, "capitalize", {});
    return strv(py::capitalize(s));
  }
  if (name == "swapcase") {
    check_args(a, "swapcase", {});
    return strv(py::swapcase(s));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    check_args(a, std::string(name).c_str(), {"sub", "start", "end"});
    const std::string& sub = str_arg(req(a, 0, "sub", "find"), "must be str");
    auto start = opt_index(arg(a, 1, "start", Value::none()));
    auto end = opt_index(arg(a, 2, "end", Value::none()));
    if (name == "count") return Value::integer(py::count(s, sub, start, end));
    int64_t r = py::find(s, sub, start, end, name[0] == 'r');
    if (r < 0 && (name == "index" || name == "rindex")) fail("substring not found");
    return Value::integer(r);
  }
  if (name == "join") {
    check_args(a, "join", {"iterable"});
    std::string out;
    size_t i = 0;
    for (const Value& x : in.iterate(req(a, 0, "iterable", "join"))) {
      if (!x.is_string()) fail("sequence item %zu: expected str instance, %s found", i, type_name(x));
      if (i++) out += s;
      out += x.str();
      in.check_size(out.size());
    }
    return Value::string(std::move(out));
  }
  if (name == "format") return strv(str_format(in, s, a));
  if (name.substr(0, 2) == "is") {
    check_args(a, std::string(name).c_str(), {});
    if (name == "isascii") return Value::boolean(py::is_ascii(s));
    static const std::pair<const char*, py::StrClass> classes[] = {
        {"isalnum", py::StrClass::Alnum},     {"isalpha", py::StrClass::Alpha},
        {"isdecimal", py::StrClass::Decimal}, {"isdigit", py::StrClass::Digit},
        {"islower", py::StrClass::Lower},     {"isnumeric", py::StrClass::Numeric},
        {"isspace", py::StrClass::Space},     {"istitle", py::StrClass::Title},
        {"isupper", py::StrClass::Upper}};
    for (const auto& c : classes)
      if (name == c.first) return Value::boolean(py::str_is(s, c.second));
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    check_args(a, "center", {"width", "fillchar"});
    int64_t w = int_arg(req(a, 0, "width", "center"), "width");
    std::string fill = " ";
    Value fc = arg(a, 1, "fillchar", Value::none());
    if (!fc.is_none()) {
      fill = str_arg(fc, "fillchar");
      if (py::length(fill) != 1) fail("The fill character must be exactly one character long");
    }
    in.check_size(static_cast<size_t>(std::max<int64_t>(w, 0)) * fill.size());
    return Value::string(py::pad(s, w, fill, name == "center" ? '^' : name == "ljust" ? '<' : '>'));
  }
  if (name == "zfill") {
    check_args(a, "zfill", {"width"});
    int64_t w = int_arg(req(a, 0, "width", "zfill"), "width");
    int64_t len = static_cast<int64_t>(py::length(s));
    if (w <= len) return self;
    in.check_size(static_cast<size_t>(w));
    std::string pad(static_cast<size_t>(w - len), '0');
    if (!s.empty() && (s[0] == '+' || s[0] == '-')) return Value::string(s.substr(0, 1) + pad + s.substr(1));
    return Value::string(pad + s);
  }
  if (name == "partition" || name == "rpartition") {
    check_args(a, "partition", {"sep"});
    const std::string& sep = str_arg(req(a, 0, "sep", "partition"), "sep");
    if (sep.empty()) fail("empty separator");
    size_t p = name == "partition" ? s.find(sep) : s.rfind(sep);
    std::vector<Value> parts;
    if (p == std::string::npos) {
      if (name == "partition") {
        parts = {self, Value::string(""), Value::string("")};
      } else {
        parts = {Value::string(""), Value::string(""), self};
      }
    } else {
      parts = {Value::string(s.substr(0, p)), Value::string(sep), Value::string(s.substr(p + sep.size()))};
    }
    return in.make_list(std::move(parts), ListFlavor::Tuple);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    check_args(a, std::string(name).c_str(), {"affix"});
    const std::string& x = str_arg(req(a, 0, "affix", "removeprefix"), "argument");
    if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) return Value::string(s.substr(x.size()));
    if (name == "removesuffix" && !x.empty() && s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
      return Value::string(s.substr(0, s.size() - x.size()));
    return self;
  }
  fail("'str' object has no attribute '%.*s'", static_cast<int>(name.size()), name.data());
}

Value dict_method(Interp& in, const Value& self, std::string_view name, CallArgs& a) {
  DictObj* d = self.dict();
  if (name == "keys" || name == "values" || name == "items") {
    check_args(a, std::string(name).c_str(), {});
    std::vector<Value> out;
    out.reserve(d->items.size());
    for (const auto& kv : d->items) {
      if (name == "keys") {
        out.push_back(kv.first);
      } else if (name == "values") {
        out.push_back(kv.second);
      } else {
        out.push_back(in.make_list({kv.first, kv.second}, ListFlavor::Tuple));
      }
    }
    return in.make_list(std::move(out),
                        name == "keys" ? ListFlavor::Keys : name == "values" ? ListFlavor::Values : ListFlavor::Items);
  }
  if (name == "get") {
    if (!a.kw.empty()) fail("get() takes no keyword arguments");
    if (a.pos.empty() || a.pos.size() > 2) fail("get expected 1 or 2 arguments, got %zu", a.pos.size());
    const Value* v = d->find(a.pos[0]);
    if (v) return *v;
    return a.pos.size() > 1 ? a.pos[1] : Value::none();
  }
  if (name == "copy") {
    check_args(a, "copy", {});
    DictObj* c = in.heap().make<DictObj>();
    in.heap().charge(d->items.size());
    for (const auto& kv : d->items) c->set(kv.first, kv.second);
    return Value::object(Kind::Dict, c);
  }
  fail("access to attribute '%.*s' of 'dict' object is unsafe.", static_cast<int>(name.size()), name.data());
}

Value list_method(Interp& in, const Value& self, std::string_view name, CallArgs& a) {
  ListObj* l = self.list();
  add_work(l->items.size());
  if (name == "count") {
    check_args(a, "count", {"value"});
    Value x = req(a, 0, "value", "count");
    int64_t n = 0;
    for (const Value& v : l->items)
      if (equals(v, x)) ++n;
    return Value::integer(n);
  }
  if (name == "index") {
    check_args(a, "index", {"value", "start", "stop"});
    Value x = req(a, 0, "value", "index");
    int64_t len = static_cast<int64_t>(l->items.size()), lo, hi;
    py::clamp_range(len, opt_index(arg(a, 1, "start", Value::none())), opt_index(arg(a, 2, "stop", Value::none())),
                    &lo, &hi);
    for (int64_t i = lo; i < hi; ++i)
      if (equals(l->items[static_cast<size_t>(i)], x)) return Value::integer(i);
    fail("%s.index(x): x not in %s", type_name(self), type_name(self));
  }
  if (name == "copy" && l->flavor == ListFlavor::List) {
    check_args(a, "copy", {});
    return in.make_list(l->items);
  }
  if (name == "append" && l->flavor == ListFlavor::List) {
    // Extension: transformers' sandbox rejects list.append; spool allows it (docs/serving.md, "Requests", Chat templates).
    check_args(a, "append", {"object"});
    in.heap().charge(1);
    l->items.push_back(req(a, 0, "object", "append"));
    return Value::none();
  }
  fail("access to attribute '%.*s' of '%s' object is unsafe.", static_cast<int>(name.size()), name.data(),
       type_name(self));
}

}  // namespace

bool has_method(const Value& self, std::string_view name) {
  if (self.is_string()) return in_list(kStrMethods, name);
  if (self.is_dict()) return in_list(kDictMethods, name);
  if (self.is_list()) {
    if (self.list()->flavor == ListFlavor::List) return in_list(kListMethods, name);
    if (self.list()->flavor == ListFlavor::Tuple) return in_list(kTupleMethods, name);
  }
  return false;
}

Value call_method(Interp& in, const Value& self, std::string_view name, CallArgs& args) {
  if (self.is_string()) return str_method(in, self, name, args);
  if (self.is_dict()) return dict_method(in, self, name, args);
  if (self.is_list()) return list_method(in, self, name, args);
  fail("'%s' object has no attribute '%.*s'", type_name(self), static_cast<int>(name.size()), name.data());
}

}  // namespace spool::tmpl
