// Runtime values of the template interpreter, modelled on the Python objects jinja2 sees:
// None/bool/int/float/str scalars, list/tuple/dict containers, one-shot generators,
// namespaces, callables and loop contexts, plus jinja2's Undefined.
//
// Scalars live inside Value (strings are shared immutable buffers). Containers and other
// objects are owned by a per-render Heap (arena) and referenced by raw pointer, so object
// cycles (a namespace holding itself) cannot leak and nothing is refcounted per access;
// everything is freed when the render ends. The Heap also enforces a memory budget.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace spool::tmpl {

class Interp;

/// Dynamic type of a Value.
enum class Kind : uint8_t {
  Undefined,  ///< jinja2 Undefined: prints empty, falsy, raises when used as an object
  None,
  Bool,
  Int,
  Float,
  String,
  List,       ///< list, tuple or dict view (see ListFlavor)
  Dict,
  Iterator,   ///< one-shot generator (select/map/reverse results)
  Namespace,  ///< jinja2 namespace() object, the only mutable attribute holder
  Callable,   ///< macro, builtin function or bound method
  Loop,       ///< the `loop` variable of a for loop
};

/// Which Python sequence type a ListObj stands for (affects repr, equality, mutability).
enum class ListFlavor : uint8_t { List, Tuple, Keys, Values, Items };

/// Base of heap-allocated objects.
struct Object {
  virtual ~Object() = default;
};

struct ListObj;
struct DictObj;
struct IterObj;
struct NamespaceObj;
struct CallableObj;

/// Shared immutable string buffer.
using Str = std::shared_ptr<const std::string>;

/// A template runtime value (cheap to copy: 32 bytes, no deep copies).
class Value {
 public:
  /// Undefined with an empty hint.
  Value() noexcept : kind_(Kind::Undefined), safe_(false), i_(0) {}
  /// Undefined carrying the message raised when it is used as an object.
  static Value undefined(std::string hint);
  /// Python None.
  static Value none() { return Value(Kind::None); }
  /// Python bool.
  static Value boolean(bool b) {
    Value v(Kind::Bool);
    v.b_ = b;
    return v;
  }
  /// Python int (64-bit).
  static Value integer(int64_t i) {
    Value v(Kind::Int);
    v.i_ = i;
    return v;
  }
  /// Python float.
  static Value number(double d) {
    Value v(Kind::Float);
    v.f_ = d;
    return v;
  }
  /// Python str; `safe` marks a markupsafe.Markup string.
  static Value string(std::string s, bool safe = false);
  /// Python str sharing an existing buffer.
  static Value string(Str s, bool safe = false);
  /// A heap object of kind k.
  static Value object(Kind k, Object* o) {
    Value v(k);
    v.o_ = o;
    return v;
  }

  /// Dynamic type.
  Kind kind() const { return kind_; }
  /// Kind predicates.
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  /// Python None.
  bool is_none() const { return kind_ == Kind::None; }
  /// Python bool.
  bool is_bool() const { return kind_ == Kind::Bool; }
  /// Python int that is not a bool.
  bool is_int() const { return kind_ == Kind::Int; }
  /// Python float.
  bool is_float() const { return kind_ == Kind::Float; }
  /// bool, int or float (Python numbers.Number).
  bool is_number() const { return kind_ == Kind::Bool || kind_ == Kind::Int || kind_ == Kind::Float; }
  /// bool or int (Python int instances).
  bool is_integral() const { return kind_ == Kind::Bool || kind_ == Kind::Int; }
  /// Python str.
  bool is_string() const { return kind_ == Kind::String; }
  /// list, tuple or dict view.
  bool is_list() const { return kind_ == Kind::List; }
  /// Python dict.
  bool is_dict() const { return kind_ == Kind::Dict; }

  /// Value of a bool.
  bool as_bool() const { return b_; }
  /// Integer value of a bool or int.
  int64_t as_int() const { return kind_ == Kind::Bool ? (b_ ? 1 : 0) : i_; }
  /// Numeric value of a bool, int or float.
  double as_double() const { return kind_ == Kind::Float ? f_ : static_cast<double>(as_int()); }
  /// String contents (String) or the hint (Undefined).
  const std::string& str() const;
  /// Shared buffer of a String.
  const Str& str_ptr() const { return s_; }
  /// True for markupsafe.Markup strings.
  bool safe() const { return safe_; }

  /// Typed object pointers (valid only for the matching kind).
  ListObj* list() const;
  DictObj* dict() const;
  IterObj* iter() const;
  NamespaceObj* ns() const;
  CallableObj* callable() const;
  /// Heap object of any object kind.
  Object* obj() const { return o_; }

 private:
  explicit Value(Kind k) noexcept : kind_(k), safe_(false), i_(0) {}
  Kind kind_;
  bool safe_;
  union {
    bool b_;
    int64_t i_;
    double f_;
    Object* o_;
  };
  Str s_;
};

/// Python list / tuple / dict view (see ListFlavor).
struct ListObj : Object {
  std::vector<Value> items;
  ListFlavor flavor = ListFlavor::List;
  bool named_group = false;  ///< groupby() result tuple with .grouper / .list attributes
  bool is_range = false;     ///< a range() object (immutable, prints as range(a, b[, s]))
  int64_t range_start = 0, range_stop = 0, range_step = 1;
};

/// Insertion-ordered dict with Python key semantics (1 == 1.0 == True).
struct DictObj : Object {
  std::vector<std::pair<Value, Value>> items;
  /// Value for key, or nullptr. Throws spool::Error for unhashable keys.
  const Value* find(const Value& key) const;
  /// Inserts or replaces (keeping the original position, like Python).
  void set(const Value& key, Value v);

 private:
  std::unordered_map<std::string_view, size_t> index_;  // string keys, built past 8 items
};

/// One-shot iterator: iterating consumes it, like a Python generator.
struct IterObj : Object {
  std::vector<Value> items;
  size_t pos = 0;
  const char* type_name = "generator";
  /// Deferred generator body: like Python, it runs (and may fail) only when first consumed.
  std::function<std::vector<Value>()> pending;
};

/// jinja2 namespace(): attributes assignable with {% set ns.x = ... %}.
struct NamespaceObj : Object {
  std::vector<std::pair<std::string, Value>> attrs;
  /// Attribute value or nullptr.
  const Value* get(std::string_view name) const;
  /// Sets an attribute (insertion-ordered).
  void set(std::string_view name, Value v);
};

/// Positional and keyword call arguments.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

/// Something callable from a template: macro, builtin function or bound method.
struct CallableObj : Object {
  /// Invokes it.
  virtual Value call(Interp& in, CallArgs& args) = 0;
  /// Python-ish repr, e.g. <Macro 'name'>.
  virtual std::string repr() const = 0;
};

inline ListObj* Value::list() const { return static_cast<ListObj*>(o_); }
inline DictObj* Value::dict() const { return static_cast<DictObj*>(o_); }
inline IterObj* Value::iter() const { return static_cast<IterObj*>(o_); }
inline NamespaceObj* Value::ns() const { return static_cast<NamespaceObj*>(o_); }
inline CallableObj* Value::callable() const { return static_cast<CallableObj*>(o_); }

/// Arena owning every heap object of one render, with a budget on allocated cells.
class Heap {
 public:
  /// `max_cells` bounds the number of objects plus container elements ever allocated.
  explicit Heap(size_t max_cells) : max_cells_(max_cells) {}
  Heap(const Heap&) = delete;
  Heap& operator=(const Heap&) = delete;

  /// Allocates an object owned by the heap.
  template <typename T, typename... A>
  T* make(A&&... a) {
    charge(1);
    auto p = std::make_unique<T>(std::forward<A>(a)...);
    T* raw = p.get();
    objs_.push_back(std::move(p));
    return raw;
  }
  /// New empty list of the given flavor; charges `reserve` cells.
  ListObj* new_list(ListFlavor f = ListFlavor::List, size_t reserve = 0);
  /// Accounts for `cells` more container elements; throws spool::Error over budget.
  void charge(size_t cells);

 private:
  std::vector<std::unique_ptr<Object>> objs_;
  size_t cells_ = 0, max_cells_;
};

/// Python type name used in error messages ('str', 'int', 'dict', 'Undefined', ...).
const char* type_name(const Value& v);
/// Python truthiness (Undefined is falsy; generators and callables are truthy).
bool truthy(const Value& v);
/// Appends Python str(v) (Undefined prints as empty).
void append_str(std::string& out, const Value& v);
/// Python str(v).
std::string to_str(const Value& v);
/// Appends Python repr(v); `depth` guards against cycles.
void append_repr(std::string& out, const Value& v, int depth = 0);
/// Python ==.
bool equals(const Value& a, const Value& b, int depth = 0);
/// Python ordering comparison; op is one of "<", "<=", ">", ">=". Throws on mismatched types.
bool compare(const Value& a, const Value& b, std::string_view op, int depth = 0);
/// Throws spool::Error when v cannot be a dict key / set member.
void check_hashable(const Value& v);

/// Options of json.dumps as exposed by transformers' tojson filter.
struct JsonFormat {
  bool ensure_ascii = false;
  bool indent = false;       ///< pretty-print with `indent_str`
  std::string indent_str;    ///< one level of indentation
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};
/// Appends json.dumps(v) with the given options; throws for non-serializable values.
void append_json(std::string& out, const Value& v, const JsonFormat& fmt, int depth = 0);

/// Converts parsed JSON (keeping key order) into heap values.
Value from_json(const nlohmann::ordered_json& j, Heap& heap, int depth = 0);

/// Work units done by value operations on this thread (elements visited, bytes / 16 scanned).
/// The interpreter adds it to its step count so that loops of expensive builtins stay bounded.
uint64_t& work_counter();
/// Adds work units.
inline void add_work(uint64_t units) { work_counter() += units; }

/// Maximum nesting of values for repr/json/equality/conversion (guards cycles and stack).
constexpr int kMaxValueDepth = 400;

}  // namespace spool::tmpl
