// Built-in Jinja tests (`x is defined`, `n is odd`, ...; jinja2/tests.py); see builtins.h.
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

// ------------------------------------------------------------------ tests

bool mod_equals(Interp& in, const Value& v, const Value& m, int64_t want) {
  (void)in;
  if (v.is_undefined()) in.fail_undefined(v);
  if (m.is_undefined()) in.fail_undefined(m);
  if (!v.is_number() || !m.is_number()) fail("unsupported operand type(s) for %%: '%s' and '%s'", type_name(v), type_name(m));
  if (v.is_integral() && m.is_integral()) {
    int64_t d = m.as_int();
    if (d == 0) fail("integer division or modulo by zero");
    int64_t r = d == -1 ? 0 : v.as_int() % d;
    if (r != 0 && ((r < 0) != (d < 0))) r += d;
    return r == want;
  }
  double d = m.as_double();
  if (d == 0) fail("float modulo by zero");
  double r = std::fmod(v.as_double(), d);
  if (r != 0 && ((r < 0) != (d < 0))) r += d;
  return r == static_cast<double>(want);
}

bool t_odd(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "odd", {});
  return mod_equals(in, v, Value::integer(2), 1);
}
bool t_even(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "even", {});
  return mod_equals(in, v, Value::integer(2), 0);
}
bool t_divisibleby(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "divisibleby", {"num"});
  return mod_equals(in, v, req(a, 0, "num", "divisibleby"), 0);
}
bool t_defined(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "defined", {});
  return !v.is_undefined();
}
bool t_undefined(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "undefined", {});
  return v.is_undefined();
}
bool t_none(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "none", {});
  return v.is_none();
}
bool t_boolean(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "boolean", {});
  return v.is_bool();
}
bool t_false(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "false", {});
  return v.is_bool() && !v.as_bool();
}
bool t_true(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "true", {});
  return v.is_bool() && v.as_bool();
}
bool t_integer(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "integer", {});
  return v.is_int();
}
bool t_float(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "float", {});
  return v.is_float();
}
bool t_number(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "number", {});
  return v.is_number();
}
bool t_string(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "string", {});
  return v.is_string();
}
bool t_mapping(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "mapping", {});
  return v.is_dict();
}
bool t_sequence(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "sequence", {});
  if (v.is_list()) return v.list()->flavor == ListFlavor::List || v.list()->flavor == ListFlavor::Tuple;
  return v.is_string() || v.is_dict() || v.is_undefined();
}
bool t_iterable(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "iterable", {});
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined() || v.kind() == Kind::Iterator;
}
bool t_callable(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "callable", {});
  return v.kind() == Kind::Callable || v.kind() == Kind::Loop || v.is_undefined();
}
bool t_sameas(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "sameas", {"other"});
  Value o = req(a, 0, "other", "sameas");
  if (v.kind() != o.kind()) return false;
  switch (v.kind()) {
    case Kind::None:
    case Kind::Undefined: return v.is_none() || v.str() == o.str();
    case Kind::Bool: return v.as_bool() == o.as_bool();
    case Kind::Int: return v.as_int() == o.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
    case Kind::Float: return false;
    case Kind::String: return v.str_ptr() == o.str_ptr();
    default: (void)in; return v.obj() == o.obj();
  }
}
bool t_escaped(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "escaped", {});
  return v.is_string() && v.safe();
}
bool t_in(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "in", {"seq"});
  Value seq = req(a, 0, "seq", "in");
  switch (seq.kind()) {
    case Kind::Undefined: return false;
    case Kind::String:
      if (!v.is_string()) fail("'in <string>' requires string as left operand, not %s", type_name(v));
      return seq.str().find(v.str()) != std::string::npos;
    case Kind::List:
      for (const Value& x : seq.list()->items)
        if (equals(x, v)) return true;
      return false;
    case Kind::Dict: return seq.dict()->find(v) != nullptr;
    case Kind::Iterator:
      for (const Value& x : in.iterate(seq))
        if (equals(x, v)) return true;
      return false;
    default: fail("argument of type '%s' is not iterable", type_name(seq));
  }
}
bool cmp_test(const Value& v, CallArgs& a, const char* name, std::string_view op) {
  check_args(a, name, {"other"});
  Value o = req(a, 0, "other", name);
  if (op == "==") return equals(v, o);
  if (op == "!=") return !equals(v, o);
  return compare(v, o, op);
}
bool t_eq(Interp&, const Value& v, CallArgs& a) { return cmp_test(v, a, "eq", "=="); }
bool t_ne(Interp&, const Value& v, CallArgs& a) { return cmp_test(v, a, "ne", "!="); }
bool t_lt(Interp&, const Value& v, CallArgs& a) { return cmp_test(v, a, "lt", "<"); }
bool t_le(Interp&, const Value& v, CallArgs& a) { return cmp_test(v, a, "le", "<="); }
bool t_gt(Interp&, const Value& v, CallArgs& a) { return cmp_test(v, a, "gt", ">"); }
bool t_ge(Interp&, const Value& v, CallArgs& a) { return cmp_test(v, a, "ge", ">="); }
bool t_lower(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "lower", {});
  return py::str_is(to_str(v), py::StrClass::Lower);
}
bool t_upper(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "upper", {});
  return py::str_is(to_str(v), py::StrClass::Upper);
}
bool t_filter(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "filter", {});
  return v.is_string() && find_filter(v.str()) >= 0;
}
bool t_test(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "test", {});
  return v.is_string() && find_test(v.str()) >= 0;
}
/// Extension (not in jinja2): `x is startingwith 'prefix'`.
bool t_startingwith(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "startingwith", {"prefix"});
  Value p = req(a, 0, "prefix", "startingwith");
  return v.is_string() && p.is_string() && v.str().compare(0, p.str().size(), p.str()) == 0;
}

struct TestEntry {
  const char* name;
  TestFn fn;
};

const TestEntry kTests[] = {
    {"odd", t_odd},         {"even", t_even},       {"divisibleby", t_divisibleby},
    {"defined", t_defined}, {"undefined", t_undefined}, {"filter", t_filter},
    {"test", t_test},       {"none", t_none},       {"boolean", t_boolean},
    {"false", t_false},     {"true", t_true},       {"integer", t_integer},
    {"float", t_float},     {"lower", t_lower},     {"upper", t_upper},
    {"string", t_string},   {"mapping", t_mapping}, {"number", t_number},
    {"sequence", t_sequence}, {"iterable", t_iterable}, {"callable", t_callable},
    {"sameas", t_sameas},   {"escaped", t_escaped}, {"in", t_in},
    {"==", t_eq},           {"eq", t_eq},           {"equalto", t_eq},
    {"!=", t_ne},           {"ne", t_ne},           {">", t_gt},
    {"gt", t_gt},           {"greaterthan", t_gt},  {"ge", t_ge},
    {">=", t_ge},           {"<", t_lt},            {"lt", t_lt},
    {"lessthan", t_lt},     {"<=", t_le},           {"le", t_le},
    {"startingwith", t_startingwith},
};

}  // namespace

int find_test(std::string_view name) {
  for (size_t i = 0; i < sizeof(kTests) / sizeof(kTests[0]); ++i)
    if (name == kTests[i].name) return static_cast<int>(i);
  return -1;
}


TestFn test_fn(int id) { return kTests[id].fn; }

}  // namespace spool::tmpl
