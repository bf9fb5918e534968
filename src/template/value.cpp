// Template runtime values: Python-compatible str/repr/==/ordering/json.dumps; see value.h.
#include "template/value.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "template/pystr.h"

namespace spool::tmpl {

namespace {

void check_depth_only(int depth) {
  if (depth > kMaxValueDepth) fail("value nesting deeper than %d levels (recursive structure?)", kMaxValueDepth);
}

/// Depth guard that also counts one unit of work per visited value.
void check_depth(int depth) {
  check_depth_only(depth);
  add_work(1);
}

long double exact(const Value& v) {
  return v.is_float() ? static_cast<long double>(v.as_double()) : static_cast<long double>(v.as_int());
}

bool num_eq(const Value& a, const Value& b) {
  if (a.is_integral() && b.is_integral()) return a.as_int() == b.as_int();
  return exact(a) == exact(b);
}

bool num_cmp(const Value& a, const Value& b, std::string_view op) {
  if (a.is_integral() && b.is_integral()) {
    int64_t x = a.as_int(), y = b.as_int();
    if (op == "<") return x < y;
    if (op == "<=") return x <= y;
    if (op == ">") return x > y;
    return x >= y;
  }
  long double x = exact(a), y = exact(b);
  if (op == "<") return x < y;
  if (op == "<=") return x <= y;
  if (op == ">") return x > y;
  return x >= y;
}

/// Lists of the same Python type compare elementwise (list vs tuple never).
bool same_seq_type(const Value& a, const Value& b) {
  return a.is_list() && b.is_list() && a.list()->flavor == b.list()->flavor &&
         a.list()->is_range == b.list()->is_range;
}

}  // namespace

uint64_t& work_counter() {
  thread_local uint64_t counter = 0;
  return counter;
}

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::string(std::string s, bool safe) {
  Value v(Kind::String);
  v.s_ = std::make_shared<const std::string>(std::move(s));
  v.safe_ = safe;
  return v;
}

Value Value::string(Str s, bool safe) {
  Value v(Kind::String);
  v.s_ = std::move(s);
  v.safe_ = safe;
  return v;
}

const std::string& Value::str() const {
  static const std::string empty;
  return s_ ? *s_ : empty;
}

const Value* DictObj::find(const Value& key) const {
  if (key.is_string()) {
    if (!index_.empty()) {
      auto it = index_.find(std::string_view(key.str()));
      return it == index_.end() ? nullptr : &items[it->second].second;
    }
    for (const auto& kv : items)
      if (kv.first.is_string() && kv.first.str() == key.str()) return &kv.second;
    return nullptr;
  }
  check_hashable(key);
  add_work(items.size());
  for (const auto& kv : items)
    if (equals(kv.first, key)) return &kv.second;
  return nullptr;
}

void DictObj::set(const Value& key, Value v) {
  if (const Value* cur = find(key)) {
    *const_cast<Value*>(cur) = std::move(v);
    return;
  }
  items.emplace_back(key, std::move(v));
  if (index_.empty() && items.size() > 8) {
    for (size_t i = 0; i < items.size(); ++i)
      if (items[i].first.is_string()) index_.emplace(std::string_view(items[i].first.str()), i);
  } else if (!index_.empty() && key.is_string()) {
    index_.emplace(std::string_view(items.back().first.str()), items.size() - 1);
  }
}

const Value* NamespaceObj::get(std::string_view name) const {
  for (const auto& kv : attrs)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

void NamespaceObj::set(std::string_view name, Value v) {
  for (auto& kv : attrs)
    if (kv.first == name) {
      kv.second = std::move(v);
      return;
    }
  attrs.emplace_back(std::string(name), std::move(v));
}

ListObj* Heap::new_list(ListFlavor f, size_t reserve) {
  charge(reserve);
  ListObj* l = make<ListObj>();
  l->flavor = f;
  l->items.reserve(reserve);
  return l;
}

void Heap::charge(size_t cells) {
  cells_ += cells;
  if (cells_ > max_cells_) fail("template exceeded its memory budget (%zu values)", max_cells_);
}

const char* type_name(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return "str";
    case Kind::List:
      if (v.list()->is_range) return "range";
      switch (v.list()->flavor) {
        case ListFlavor::List: return "list";
        case ListFlavor::Tuple: return "tuple";
        case ListFlavor::Keys: return "dict_keys";
        case ListFlavor::Values: return "dict_values";
        case ListFlavor::Items: return "dict_items";
      }
      return "list";
    case Kind::Dict: return "dict";
    case Kind::Iterator: return v.iter()->type_name;
    case Kind::Namespace: return "Namespace";
    case Kind::Callable: return "function";
    case Kind::Loop: return "LoopContext";
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return v.as_bool();
    case Kind::Int: return v.as_int() != 0;
    case Kind::Float: return v.as_double() != 0.0;
    case Kind::String: return !v.str().empty();
    case Kind::List: return !v.list()->items.empty();
    case Kind::Dict: return !v.dict()->items.empty();
    default: return true;
  }
}

void append_str(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined: return;
    case Kind::String: out += v.str(); return;
    default: append_repr(out, v); return;
  }
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.str();
  std::string s;
  append_str(s, v);
  return s;
}

void append_repr(std::string& out, const Value& v, int depth) {
  check_depth(depth);
  switch (v.kind()) {
    case Kind::Undefined: out += "Undefined"; return;
    case Kind::None: out += "None"; return;
    case Kind::Bool: out += v.as_bool() ? "True" : "False"; return;
    case Kind::Int: out += std::to_string(v.as_int()); return;
    case Kind::Float: out += py::float_repr(v.as_double()); return;
    case Kind::String:
      add_work(v.str().size() / 16);
      if (v.safe()) {
        out += "Markup(";
        py::repr_str(out, v.str());
        out += ")";
      } else {
        py::repr_str(out, v.str());
      }
      return;
    case Kind::List: {
      const ListObj* l = v.list();
      if (l->is_range) {
        out += "range(" + std::to_string(l->range_start) + ", " + std::to_string(l->range_stop);
        if (l->range_step != 1) out += ", " + std::to_string(l->range_step);
        out += ")";
        return;
      }
      const char* open = "[";
      const char* close = "]";
      switch (l->flavor) {
        case ListFlavor::Tuple: open = "("; close = ")"; break;
        case ListFlavor::Keys: open = "dict_keys(["; close = "])"; break;
        case ListFlavor::Values: open = "dict_values(["; close = "])"; break;
        case ListFlavor::Items: open = "dict_items(["; close = "])"; break;
        default: break;
      }
      out += open;
      for (size_t i = 0; i < l->items.size(); ++i) {
        if (i) out += ", ";
        append_repr(out, l->items[i], depth + 1);
      }
      if (l->flavor == ListFlavor::Tuple && l->items.size() == 1) out += ",";
      out += close;
      return;
    }
    case Kind::Dict: {
      out += "{";
      bool first = true;
      for (const auto& kv : v.dict()->items) {
        if (!first) out += ", ";
        first = false;
        append_repr(out, kv.first, depth + 1);
        out += ": ";
        append_repr(out, kv.second, depth + 1);
      }
      out += "}";
      return;
    }
    case Kind::Iterator:
      out += "<";
      out += v.iter()->type_name;
      out += " object>";
      return;
    case Kind::Namespace: {
      out += "<Namespace {";
      bool first = true;
      for (const auto& kv : v.ns()->attrs) {
        if (!first) out += ", ";
        first = false;
        py::repr_str(out, kv.first);
        out += ": ";
        append_repr(out, kv.second, depth + 1);
      }
      out += "}>";
      return;
    }
    case Kind::Callable: out += v.callable()->repr(); return;
    case Kind::Loop: out += "<LoopContext>"; return;
  }
}

bool equals(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) return num_eq(a, b);
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String:
      add_work(a.str().size() / 16);
      return a.str_ptr() == b.str_ptr() || a.str() == b.str();
    case Kind::List: {
      if (a.list() == b.list()) return true;
      if (!same_seq_type(a, b)) return false;
      const auto& x = a.list()->items;
      const auto& y = b.list()->items;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equals(x[i], y[i], depth + 1)) return false;
      return true;
    }
    case Kind::Dict: {
      if (a.dict() == b.dict()) return true;
      const auto& x = a.dict()->items;
      if (x.size() != b.dict()->items.size()) return false;
      for (const auto& kv : x) {
        const Value* o = b.dict()->find(kv.first);
        if (!o || !equals(kv.second, *o, depth + 1)) return false;
      }
      return true;
    }
    default: return a.obj() == b.obj();
  }
}

bool compare(const Value& a, const Value& b, std::string_view op, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) return num_cmp(a, b, op);
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;
  }
  if (same_seq_type(a, b) &&
      (a.list()->flavor == ListFlavor::List || a.list()->flavor == ListFlavor::Tuple)) {
    const auto& x = a.list()->items;
    const auto& y = b.list()->items;
    size_t n = std::min(x.size(), y.size());
    for (size_t i = 0; i < n; ++i) {
      if (!equals(x[i], y[i], depth + 1)) return compare(x[i], y[i], op, depth + 1);
    }
    size_t p = x.size(), q = y.size();
    if (op == "<") return p < q;
    if (op == "<=") return p <= q;
    if (op == ">") return p > q;
    return p >= q;
  }
  if (a.is_undefined() || b.is_undefined()) {
    fail("%s", (a.is_undefined() ? a : b).str().empty() ? "value is undefined"
                                                          : (a.is_undefined() ? a : b).str().c_str());
  }
  fail("'%.*s' not supported between instances of '%s' and '%s'", static_cast<int>(op.size()), op.data(),
       type_name(a), type_name(b));
}

void check_hashable(const Value& v) {
  if (v.is_list()) {
    if (v.list()->flavor != ListFlavor::Tuple) fail("unhashable type: '%s'", type_name(v));
    for (const auto& x : v.list()->items) check_hashable(x);
  } else if (v.is_dict()) {
    fail("unhashable type: 'dict'");
  }
}

namespace {

void json_newline(std::string& out, const JsonFormat& fmt, int level) {
  out.push_back('\n');
  for (int i = 0; i < level; ++i) out += fmt.indent_str;
}

void json_key(std::string& out, const Value& k, const JsonFormat& fmt) {
  switch (k.kind()) {
    case Kind::String: py::json_str(out, k.str(), fmt.ensure_ascii); return;
    case Kind::Int: out += '"' + std::to_string(k.as_int()) + '"'; return;
    case Kind::Bool: out += k.as_bool() ? "\"true\"" : "\"false\""; return;
    case Kind::None: out += "\"null\""; return;
    case Kind::Float: {
      double d = k.as_double();
      std::string s = std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : py::float_repr(d);
      out += '"' + s + '"';
      return;
    }
    default: fail("keys must be str, int, float, bool or None, not %s", type_name(k));
  }
}

void json_value(std::string& out, const Value& v, const JsonFormat& fmt, int depth) {
  check_depth(depth);
  switch (v.kind()) {
    case Kind::None: out += "null"; return;
    case Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Kind::Int: out += std::to_string(v.as_int()); return;
    case Kind::Float: {
      double d = v.as_double();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        out += py::float_repr(d);
      }
      return;
    }
    case Kind::String:
      add_work(v.str().size() / 16);
      py::json_str(out, v.str(), fmt.ensure_ascii);
      return;
    case Kind::List: {
      const ListObj* l = v.list();
      if ((l->flavor != ListFlavor::List && l->flavor != ListFlavor::Tuple) || l->is_range)
        fail("Object of type %s is not JSON serializable", type_name(v));
      if (l->items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < l->items.size(); ++i) {
        if (i) out += fmt.item_sep;
        if (fmt.indent) json_newline(out, fmt, depth + 1);
        json_value(out, l->items[i], fmt, depth + 1);
      }
      if (fmt.indent) json_newline(out, fmt, depth);
      out += ']';
      return;
    }
    case Kind::Dict: {
      const auto& items = v.dict()->items;
      if (items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> order;
      order.reserve(items.size());
      for (const auto& kv : items) order.push_back(&kv);
      if (fmt.sort_keys) {
        std::stable_sort(order.begin(), order.end(),
                         [](const auto* x, const auto* y) { return compare(x->first, y->first, "<"); });
      }
      out += '{';
      bool first = true;
      for (const auto* kv : order) {
        if (!first) out += fmt.item_sep;
        first = false;
        if (fmt.indent) json_newline(out, fmt, depth + 1);
        json_key(out, kv->first, fmt);
        out += fmt.key_sep;
        json_value(out, kv->second, fmt, depth + 1);
      }
      if (fmt.indent) json_newline(out, fmt, depth);
      out += '}';
      return;
    }
    default: fail("Object of type %s is not JSON serializable", type_name(v));
  }
}

}  // namespace

void append_json(std::string& out, const Value& v, const JsonFormat& fmt, int depth) {
  json_value(out, v, fmt, depth);
}

Value from_json(const nlohmann::ordered_json& j, Heap& heap, int depth) {
  if (depth > kMaxValueDepth) fail("JSON input nested deeper than %d levels", kMaxValueDepth);
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ListObj* l = heap.new_list(ListFlavor::List, j.size());
      for (const auto& e : j) l->items.push_back(from_json(e, heap, depth + 1));
      return Value::object(Kind::List, l);
    }
    case nlohmann::ordered_json::value_t::object: {
      DictObj* d = heap.make<DictObj>();
      heap.charge(j.size());
      for (const auto& [k, e] : j.items()) d->set(Value::string(k), from_json(e, heap, depth + 1));
      return Value::object(Kind::Dict, d);
    }
    default: fail("unsupported JSON value type '%s' in template context", j.type_name());
  }
}

}  // namespace spool::tmpl
