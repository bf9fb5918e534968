// Global functions: transformers' raise_exception / strftime_now and jinja2's range, dict,
// namespace, joiner; see builtins.h.
#include "template/builtins.h"

#include <sys/time.h>

#include <algorithm>
#include <ctime>
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

// ------------------------------------------------------------------ globals

using GlobalFn = Value (*)(Interp&, CallArgs&);

struct BuiltinObj : CallableObj {
  std::string name;
  GlobalFn fn = nullptr;
  Value call(Interp& in, CallArgs& a) override { return fn(in, a); }
  std::string repr() const override { return "<built-in function " + name + ">"; }
};

Value g_raise_exception(Interp&, CallArgs& a) {
  check_args(a, "raise_exception", {"message"});
  throw RaisedError(to_str(req(a, 0, "message", "raise_exception")));
}

/// The time strftime_now() formats: SOURCE_DATE_EPOCH (reproducible-builds.org: decimal seconds
/// since 1970-01-01 UTC, formatted in UTC) when set, else the local wall clock like
/// transformers' datetime.now(). Throws spool::Error for a malformed SOURCE_DATE_EPOCH.
void strftime_now_time(struct tm& tm, long& usec) {
  const char* env = std::getenv("SOURCE_DATE_EPOCH");
  if (env && *env) {
    const std::string s = env;
    bool digits = s.size() <= 15 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits) fail("SOURCE_DATE_EPOCH must be a non-negative integer number of seconds, got '%s'", s.c_str());
    time_t t = static_cast<time_t>(std::strtoll(s.c_str(), nullptr, 10));
    if (!gmtime_r(&t, &tm)) fail("SOURCE_DATE_EPOCH %s is out of range", s.c_str());
    usec = 0;
    return;
  }
  struct timeval tv;
  gettimeofday(&tv, nullptr);
  time_t t = tv.tv_sec;
  localtime_r(&t, &tm);
  usec = static_cast<long>(tv.tv_usec);
}

Value g_strftime_now(Interp& in, CallArgs& a) {
  check_args(a, "strftime_now", {"format"});
  std::string fmt = str_arg(req(a, 0, "format", "strftime_now"), "strftime() argument 1");
  struct tm tm;
  long usec = 0;
  strftime_now_time(tm, usec);
  // Python's datetime.strftime handles %f itself and, for the naive datetime that
  // datetime.now() returns, turns %z and %Z into ""; everything else goes to the C library.
  std::string f2;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] == '%' && i + 1 < fmt.size()) {
      const char c = fmt[i + 1];
      ++i;
      if (c == 'f') {
        char us[16];
        std::snprintf(us, sizeof us, "%06ld", usec);
        f2 += us;
      } else if (c != 'z' && c != 'Z') {
        f2 += '%';
        f2 += c;
      }
      continue;
    }
    f2 += fmt[i];
  }
  if (f2.empty()) return Value::string("");
  for (size_t cap = 256 + f2.size() * 4;; cap *= 4) {
    if (cap > (1u << 20)) break;
    std::string buf(cap, '\0');
    size_t n = std::strftime(buf.data(), buf.size(), f2.c_str(), &tm);
    if (n > 0) {
      buf.resize(n);
      return str_value(in, std::move(buf));
    }
  }
  return Value::string("");
}

Value g_range(Interp& in, CallArgs& a) {
  if (!a.kw.empty()) fail("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3) fail("range expected 1 to 3 arguments, got %zu", a.pos.size());
  int64_t start = 0, stop, step = 1;
  for (const Value& v : a.pos)
    if (!v.is_integral()) fail("'%s' object cannot be interpreted as an integer", type_name(v));
  if (a.pos.size() == 1) {
    stop = a.pos[0].as_int();
  } else {
    start = a.pos[0].as_int();
    stop = a.pos[1].as_int();
    if (a.pos.size() == 3) step = a.pos[2].as_int();
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  __int128 n = 0;
  if (step > 0 && stop > start) n = (static_cast<__int128>(stop) - start + step - 1) / step;
  if (step < 0 && stop < start) n = (static_cast<__int128>(start) - stop - step - 1) / (-static_cast<__int128>(step));
  if (n > 100000) fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  std::vector<Value> out;
  out.reserve(static_cast<size_t>(n));
  int64_t x = start;
  for (__int128 i = 0; i < n; ++i, x += (i < n ? step : 0)) out.push_back(Value::integer(x));
  Value r = in.make_list(std::move(out), ListFlavor::Tuple);
  ListObj* l = r.list();
  l->is_range = true;
  l->range_start = start;
  l->range_stop = stop;
  l->range_step = step;
  return r;
}

/// dict(*args, **kwargs) into d.
void fill_dict(Interp& in, DictObj* d, CallArgs& a, const char* fn) {
  if (a.pos.size() > 1) fail("%s expected at most 1 argument, got %zu", fn, a.pos.size());
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      for (const auto& kv : src.dict()->items) d->set(kv.first, kv.second);
    } else {
      for (const Value& item : in.iterate(src)) {
        std::vector<Value> pair = in.iterate(item);
        if (pair.size() != 2) fail("dictionary update sequence element has length %zu; 2 is required", pair.size());
        check_hashable(pair[0]);
        d->set(pair[0], pair[1]);
      }
    }
  }
  for (const auto& kv : a.kw) d->set(Value::string(kv.first), kv.second);
  in.heap().charge(d->items.size());
}

Value g_dict(Interp& in, CallArgs& a) {
  DictObj* d = in.heap().make<DictObj>();
  fill_dict(in, d, a, "dict");
  return Value::object(Kind::Dict, d);
}

Value g_namespace(Interp& in, CallArgs& a) {
  DictObj tmp;
  fill_dict(in, &tmp, a, "namespace");
  NamespaceObj* ns = in.heap().make<NamespaceObj>();
  for (const auto& kv : tmp.items) {
    if (!kv.first.is_string()) fail("namespace attribute names must be strings");
    ns->set(kv.first.str(), kv.second);
  }
  return Value::object(Kind::Namespace, ns);
}

struct JoinerObj : CallableObj {
  std::string sep;
  bool used = false;
  Value call(Interp&, CallArgs& a) override {
    check_args(a, "joiner", {});
    if (!used) {
      used = true;
      return Value::string("");
    }
    return Value::string(sep);
  }
  std::string repr() const override { return "<jinja2.utils.Joiner object>"; }
};

Value g_joiner(Interp& in, CallArgs& a) {
  check_args(a, "joiner", {"sep"});
  JoinerObj* j = in.heap().make<JoinerObj>();
  j->sep = to_str(arg(a, 0, "sep", Value::string(", ")));
  return Value::object(Kind::Callable, j);
}

struct GlobalEntry {
  const char* name;
  GlobalFn fn;
};

const GlobalEntry kGlobals[] = {
    {"raise_exception", g_raise_exception}, {"strftime_now", g_strftime_now}, {"range", g_range},
    {"dict", g_dict}, {"namespace", g_namespace}, {"joiner", g_joiner},
};

}  // namespace

const std::vector<std::string>& global_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& g : kGlobals) v.emplace_back(g.name);
    return v;
  }();
  return names;
}

Value make_global(Interp& in, const std::string& name) {
  for (const auto& g : kGlobals) {
    if (name == g.name) {
      BuiltinObj* b = in.heap().make<BuiltinObj>();
      b->name = g.name;
      b->fn = g.fn;
      return Value::object(Kind::Callable, b);
    }
  }
  return Value::undefined("'" + name + "' is undefined");
}

}  // namespace spool::tmpl
