// Tree-walking evaluator; see evaluator.h. Statement semantics follow jinja2's compiled
// code (jinja2/compiler.py), value semantics follow jinja2.runtime / sandbox.
#include "template/evaluator.h"

#include <cmath>
#include <limits>
#include <new>

#include "common/error.h"
#include "template/builtins.h"
#include "template/format.h"
#include "template/pystr.h"

namespace spool::tmpl {

using namespace ast;

namespace {

/// A user macro or call-block caller.
struct MacroObj : CallableObj {
  const MacroDef* def = nullptr;
  Frame* closure = nullptr;
  Value call(Interp& in, CallArgs& a) override { return in.invoke_macro(*def, closure, a); }
  std::string repr() const override { return "<Macro '" + def->name + "'>"; }
};

/// A method bound to its receiver (str/dict/list methods, loop.cycle/changed).
struct MethodObj : CallableObj {
  Value self;
  std::string name;
  Value call(Interp& in, CallArgs& a) override {
    if (self.kind() == Kind::Loop) return in.loop_call(static_cast<LoopObj*>(self.obj()), name, a);
    return call_method(in, self, name, a);
  }
  std::string repr() const override {
    return "<built-in method " + name + " of " + type_name(self) + " object>";
  }
};

/// Marks a frame and its ancestors as referenced by a closure.
void capture(Frame* f) {
  for (; f && !f->captured; f = f->parent) f->captured = true;
}

bool is_unsafe_method(const Value& obj, std::string_view name) {
  if (obj.is_dict())
    return name == "pop" || name == "popitem" || name == "setdefault" || name == "update" || name == "clear";
  if (obj.is_list() && obj.list()->flavor == ListFlavor::List)
    return name == "extend" || name == "insert" || name == "pop" || name == "remove" || name == "reverse" ||
           name == "sort" || name == "clear";
  return false;
}

[[noreturn]] void overflow() { fail("integer overflow (values beyond 64 bits are not supported)"); }

int64_t py_floordiv(int64_t a, int64_t b) {
  if (b == 0) fail("integer division or modulo by zero");
  if (a == INT64_MIN && b == -1) fail("integer overflow (values beyond 64 bits are not supported)");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t py_mod(int64_t a, int64_t b) {
  if (b == 0) fail("integer division or modulo by zero");
  if (b == -1) return 0;
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

/// CPython float divmod.
void float_divmod(double vx, double wx, double* floordiv, double* modv) {
  if (wx == 0.0) fail("float modulo by zero");
  double mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  double fd;
  if (div != 0.0) {
    fd = std::floor(div);
    if (div - fd > 0.5) fd += 1.0;
  } else {
    fd = std::copysign(0.0, vx / wx);
  }
  *floordiv = fd;
  *modv = mod;
}

}  // namespace

Interp::Interp(const Program& prog, const RenderLimits& limits)
    : prog_(prog), limits_(limits), heap_(limits.max_heap_cells) {
  loop_sym_ = prog_.lookup("loop");
  caller_sym_ = prog_.lookup("caller");
  varargs_sym_ = prog_.lookup("varargs");
  kwargs_sym_ = prog_.lookup("kwargs");
}

void Interp::fail_nesting() const {
  fail("template recursion deeper than %d levels", limits_.max_nesting);
}

void Interp::fail_steps() const {
  fail("template exceeded its step limit (%llu operations)", static_cast<unsigned long long>(limits_.max_steps));
}

void Interp::check_size(size_t n) const {
  if (n > limits_.max_output_bytes) fail("string of %zu bytes exceeds the output limit (%zu)", n, limits_.max_output_bytes);
}

void Interp::fail_undefined(const Value& u) const {
  fail("%s", u.str().empty() ? "value is undefined" : u.str().c_str());
}

Value Interp::make_list(std::vector<Value> items, ListFlavor f) {
  heap_.charge(items.size());
  add_work(items.size());
  ListObj* l = heap_.make<ListObj>();
  l->flavor = f;
  l->items = std::move(items);
  return Value::object(Kind::List, l);
}

Value Interp::make_iter(std::vector<Value> items, const char* type) {
  heap_.charge(items.size());
  IterObj* it = heap_.make<IterObj>();
  it->items = std::move(items);
  it->type_name = type;
  return Value::object(Kind::Iterator, it);
}

Value Interp::make_lazy_iter(std::function<std::vector<Value>()> body, const char* type) {
  IterObj* it = heap_.make<IterObj>();
  it->pending = std::move(body);
  it->type_name = type;
  return Value::object(Kind::Iterator, it);
}

void Interp::force(IterObj* it) {
  if (!it->pending) return;
  auto body = std::move(it->pending);
  it->pending = nullptr;
  it->items = body();
  heap_.charge(it->items.size());
}

Frame* Interp::new_frame(Frame* parent) {
  Frame* f;
  if (!free_frames_.empty()) {
    f = free_frames_.back();
    free_frames_.pop_back();
    f->vars.clear();
  } else {
    f = heap_.make<Frame>();
  }
  f->parent = parent;
  return f;
}

namespace {
/// Returns a frame to the free list unless a closure holds it.
struct FrameRelease {
  std::vector<Frame*>& pool;
  Frame* f;
  ~FrameRelease() {
    if (!f->captured) pool.push_back(f);
  }
};
}  // namespace

struct Interp::Capture {
  Interp& in;
  std::string* saved;
  explicit Capture(Interp& i) : in(i), saved(i.out_) {
    in.capture_stack_.emplace_back();
    in.out_ = &in.capture_stack_.back();
  }
  /// The captured text (call once, before destruction).
  std::string take() { return std::move(in.capture_stack_.back()); }
  ~Capture() {
    in.capture_stack_.pop_back();
    in.out_ = saved;
  }
};

void Interp::emit(std::string_view s) {
  add_work(s.size() / 16);
  if (out_->size() + s.size() > limits_.max_output_bytes)
    fail("rendered output exceeds the limit of %zu bytes", limits_.max_output_bytes);
  out_->append(s);
}

std::string Interp::render_body(const Body& body, Frame* f) {
  Capture cap(*this);
  exec_body(body, f);
  return cap.take();
}

std::string Interp::render(const nlohmann::ordered_json& context) {
  work_counter() = 0;
  globals_ = heap_.make<Frame>();
  for (const std::string& name : global_names()) {
    int sym = prog_.lookup(name);
    if (sym >= 0) globals_->set(sym, make_global(*this, name));
  }
  Frame* ctx = heap_.make<Frame>();
  ctx->parent = globals_;
  if (!context.is_null()) {
    if (!context.is_object()) fail("template context must be a JSON object");
    for (const auto& [k, v] : context.items()) {
      int sym = prog_.lookup(k);
      if (sym >= 0) ctx->set(sym, from_json(v, heap_));
    }
  }
  Frame* root = heap_.make<Frame>();
  root->parent = ctx;
  capture(root);
  std::string out;
  out_ = &out;
  exec_body(prog_.body, root);
  return out;
}

// ---------------------------------------------------------------- statements

Interp::Flow Interp::exec_body(const Body& body, Frame* f) {
  for (const Stmt* s : body) {
    Flow fl = exec(s, f);
    if (fl != Flow::Normal) return fl;
  }
  return Flow::Normal;
}

Interp::Flow Interp::exec(const Stmt* s, Frame* f) {
  step();
  Nest nest(*this);
  cur_offset_ = s->offset;
  switch (s->kind) {
    case SK::Output: {
      for (const auto& it : static_cast<const Output*>(s)->items) {
        if (!it.expr) {
          emit(it.data);
          continue;
        }
        Value v = eval(it.expr, f);
        if (v.is_string()) {
          emit(v.str());
        } else {
          std::string t;
          append_str(t, v);
          emit(t);
        }
      }
      return Flow::Normal;
    }
    case SK::If: {
      auto* n = static_cast<const If*>(s);
      for (const auto& br : n->branches) {
        if (truthy(eval(br.first, f))) return exec_body(br.second, f);
      }
      return exec_body(n->otherwise, f);
    }
    case SK::For: {
      auto* n = static_cast<const For*>(s);
      Value it = eval(n->iter, f);
      return exec_for(n, f, it, 0);
    }
    case SK::Set: {
      auto* n = static_cast<const Set*>(s);
      assign(n->target, eval(n->value, f), f);
      return Flow::Normal;
    }
    case SK::SetBlock: {
      auto* n = static_cast<const SetBlock*>(s);
      Frame* bf = new_frame(f);
      FrameRelease rel{free_frames_, bf};
      Value v = Value::string(render_body(n->body, bf));
      if (n->filter) {
        input_stack_.push_back(v);
        try {
          v = eval(n->filter, f);
        } catch (...) {
          input_stack_.pop_back();
          throw;
        }
        input_stack_.pop_back();
      }
      assign(n->target, v, f);
      return Flow::Normal;
    }
    case SK::Macro: {
      auto* n = static_cast<const Macro*>(s);
      MacroObj* m = heap_.make<MacroObj>();
      m->def = &n->def;
      m->closure = f;
      capture(f);
      f->set(n->sym, Value::object(Kind::Callable, m));
      return Flow::Normal;
    }
    case SK::CallBlock: {
      auto* n = static_cast<const CallBlock*>(s);
      MacroObj* caller = heap_.make<MacroObj>();
      caller->def = &n->def;
      caller->closure = f;
      capture(f);
      Value r = eval_call(n->call, f, Value::object(Kind::Callable, caller));
      std::string t;
      append_str(t, r);
      emit(t);
      return Flow::Normal;
    }
    case SK::FilterBlock: {
      auto* n = static_cast<const FilterBlock*>(s);
      Frame* bf = new_frame(f);
      FrameRelease rel{free_frames_, bf};
      Value body = Value::string(render_body(n->body, bf));
      input_stack_.push_back(body);
      Value r;
      try {
        r = eval(n->filter, f);
      } catch (...) {
        input_stack_.pop_back();
        throw;
      }
      input_stack_.pop_back();
      std::string t;
      append_str(t, r);
      emit(t);
      return Flow::Normal;
    }
    case SK::With: {
      auto* n = static_cast<const With*>(s);
      Frame* wf = new_frame(f);
      FrameRelease rel{free_frames_, wf};
      for (const auto& a : n->assigns) assign(a.first, eval(a.second, f), wf);
      return exec_body(n->body, wf);
    }
    case SK::Scope: {
      auto* n = static_cast<const Scope*>(s);
      Frame* sf = new_frame(f);
      FrameRelease rel{free_frames_, sf};
      std::string t = render_body(n->body, sf);
      emit(t);
      return Flow::Normal;
    }
    case SK::Break: return Flow::Break;
    case SK::Continue: return Flow::Continue;
  }
  return Flow::Normal;
}

bool Interp::loop_pull(LoopObj* l, Value* out) {
  if (!l->ahead.empty()) {
    *out = std::move(l->ahead.front());
    l->ahead.pop_front();
    return true;
  }
  while (l->src_pos < l->src.size()) {
    step();
    Value v = l->src[l->src_pos++];
    if (!l->node->filter) {
      *out = std::move(v);
      return true;
    }
    Frame* tf = new_frame(l->scope);
    FrameRelease rel{free_frames_, tf};
    assign(l->node->target, v, tf);
    if (truthy(eval(l->node->filter, tf))) {
      *out = std::move(v);
      return true;
    }
  }
  return false;
}

bool Interp::loop_peek(LoopObj* l) {
  if (!l->ahead.empty()) return true;
  Value v;
  if (!loop_pull(l, &v)) return false;
  l->ahead.push_back(std::move(v));
  return true;
}

Interp::Flow Interp::exec_for(const For* n, Frame* f, const Value& iterable, int depth0) {
  LoopObj* loop = heap_.make<LoopObj>();
  loop->src = iterate(iterable);
  heap_.charge(loop->src.size());
  loop->node = n;
  loop->scope = f;
  loop->depth0 = depth0;
  if (n->filter) capture(f);
  Value loopv = Value::object(Kind::Loop, loop);
  bool any = false;
  while (true) {
    step();
    Value item;
    if (!loop_pull(loop, &item)) break;
    if (loop->index0 >= 0) loop->prev = loop->cur;
    loop->cur = item;
    ++loop->index0;
    any = true;
    Frame* bf = new_frame(f);
    FrameRelease rel{free_frames_, bf};
    if (loop_sym_ >= 0) bf->set(loop_sym_, loopv);
    assign(n->target, item, bf);
    if (exec_body(n->body, bf) == Flow::Break) break;
  }
  if (!any && !n->otherwise.empty()) {
    Frame* ef = new_frame(f);
    FrameRelease rel{free_frames_, ef};
    return exec_body(n->otherwise, ef);
  }
  return Flow::Normal;
}

void Interp::assign(const Expr* target, const Value& v, Frame* f) {
  switch (target->kind) {
    case EK::Name: f->set(static_cast<const Name*>(target)->sym, v); return;
    case EK::Tuple: {
      const auto& names = static_cast<const Seq*>(target)->items;
      std::vector<Value> items = iterate(v);
      if (items.size() > names.size()) fail("too many values to unpack (expected %zu)", names.size());
      if (items.size() < names.size())
        fail("not enough values to unpack (expected %zu, got %zu)", names.size(), items.size());
      for (size_t i = 0; i < names.size(); ++i) assign(names[i], items[i], f);
      return;
    }
    case EK::NSRef: {
      auto* r = static_cast<const NSRef*>(target);
      Value ns = lookup(r->sym, f);
      if (ns.kind() != Kind::Namespace) fail("cannot assign attribute on non-namespace object");
      ns.ns()->set(r->attr, v);
      return;
    }
    default: fail("can't assign to this expression");
  }
}

Value Interp::invoke_macro(const MacroDef& def, Frame* closure, CallArgs& args) {
  if (call_depth_ >= limits_.max_call_depth)
    fail("macro recursion deeper than %d calls in '%s'", limits_.max_call_depth, def.name.c_str());
  struct DepthGuard {
    int& d;
    explicit DepthGuard(int& x) : d(x) { ++d; }
    ~DepthGuard() { --d; }
  } guard(call_depth_);
  step();
  Frame* mf = new_frame(closure);
  FrameRelease rel{free_frames_, mf};
  size_t np = def.params.size();
  size_t npos = std::min(args.pos.size(), np);
  std::vector<bool> missing(np, false);
  for (size_t i = 0; i < npos; ++i) mf->set(def.params[i], args.pos[i]);
  auto take_kw = [&](std::string_view name, Value* out) {
    for (size_t k = 0; k < args.kw.size(); ++k) {
      if (args.kw[k].first == name) {
        *out = args.kw[k].second;
        args.kw.erase(args.kw.begin() + static_cast<std::ptrdiff_t>(k));
        return true;
      }
    }
    return false;
  };
  bool found_caller = false;
  if (npos != np) {
    for (size_t i = npos; i < np; ++i) {
      Value v;
      if (take_kw(def.param_names[i], &v)) {
        mf->set(def.params[i], v);
      } else {
        missing[i] = true;
      }
      if (def.param_names[i] == "caller") found_caller = true;
    }
  } else {
    found_caller = std::find(def.param_names.begin(), def.param_names.end(), "caller") != def.param_names.end();
  }
  if (def.uses_caller && !found_caller && caller_sym_ >= 0) {
    Value c;
    if (!take_kw("caller", &c) || c.is_none()) c = Value::undefined("No caller defined");
    mf->set(caller_sym_, c);
  }
  if (def.uses_kwargs && kwargs_sym_ >= 0) {
    DictObj* d = heap_.make<DictObj>();
    heap_.charge(args.kw.size());
    for (auto& kv : args.kw) d->set(Value::string(kv.first), kv.second);
    mf->set(kwargs_sym_, Value::object(Kind::Dict, d));
  } else if (!args.kw.empty()) {
    if (args.kw[0].first == "caller")
      fail("macro '%s' was invoked with two values for the special caller argument", def.name.c_str());
    fail("macro '%s' takes no keyword argument '%s'", def.name.c_str(), args.kw[0].first.c_str());
  }
  if (def.uses_varargs && varargs_sym_ >= 0) {
    std::vector<Value> extra;
    for (size_t i = np; i < args.pos.size(); ++i) extra.push_back(args.pos[i]);
    mf->set(varargs_sym_, make_list(std::move(extra), ListFlavor::Tuple));
  } else if (args.pos.size() > np) {
    fail("macro '%s' takes not more than %zu argument(s)", def.name.c_str(), np);
  }
  size_t first_default = np - def.defaults.size();
  // Missing parameters are locals of the macro even while defaults are evaluated (b=b sees
  // its own, still missing, parameter), like jinja2's compiled macros.
  for (size_t i = 0; i < np; ++i)
    if (missing[i]) mf->set(def.params[i], Value::undefined("parameter '" + def.param_names[i] + "' was not provided"));
  for (size_t i = 0; i < np; ++i) {
    if (!missing[i]) continue;
    if (i >= first_default) {
      mf->set(def.params[i], eval(def.defaults[i - first_default], mf));
    } else {
      mf->set(def.params[i], Value::undefined("parameter '" + def.param_names[i] + "' was not provided"));
    }
  }
  return Value::string(render_body(def.body, mf));
}

// ---------------------------------------------------------------- loop object

Value Interp::loop_attr(LoopObj* l, std::string_view name) {
  auto length = [&]() -> int64_t {
    // Pull every remaining (filtered) item into the look-ahead buffer.
    std::deque<Value> saved;
    saved.swap(l->ahead);
    std::vector<Value> more;
    Value tmp;
    while (loop_pull(l, &tmp)) more.push_back(std::move(tmp));
    saved.swap(l->ahead);
    for (Value& v : more) l->ahead.push_back(std::move(v));
    return l->index0 + 1 + static_cast<int64_t>(l->ahead.size());
  };
  if (name == "index0") return Value::integer(l->index0);
  if (name == "index") return Value::integer(l->index0 + 1);
  if (name == "first") return Value::boolean(l->index0 == 0);
  if (name == "last") return Value::boolean(!loop_peek(l));
  if (name == "length") return Value::integer(length());
  if (name == "revindex") return Value::integer(length() - l->index0);
  if (name == "revindex0") return Value::integer(length() - l->index0 - 1);
  if (name == "previtem") return l->index0 > 0 ? l->prev : Value::undefined("there is no previous item");
  if (name == "nextitem") return loop_peek(l) ? l->ahead.front() : Value::undefined("there is no next item");
  if (name == "depth") return Value::integer(l->depth0 + 1);
  if (name == "depth0") return Value::integer(l->depth0);
  if (name == "cycle" || name == "changed") {
    MethodObj* m = heap_.make<MethodObj>();
    m->self = Value::object(Kind::Loop, l);
    m->name = std::string(name);
    return Value::object(Kind::Callable, m);
  }
  return Value::undefined("'LoopContext object' has no attribute '" + std::string(name) + "'");
}

Value Interp::loop_call(LoopObj* l, std::string_view method, CallArgs& args) {
  if (method == "cycle") {
    if (args.pos.empty()) fail("no items for cycling given");
    return args.pos[static_cast<size_t>(l->index0) % args.pos.size()];
  }
  if (method == "changed") {
    Value cur = make_list(args.pos);
    if (!l->has_changed || !equals(cur, l->last_changed)) {
      l->has_changed = true;
      l->last_changed = cur;
      return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  // loop(iterable): recursive loop call
  if (!l->node->recursive) fail("The loop must have the 'recursive' marker to be called recursively.");
  if (args.pos.size() != 1 || !args.kw.empty()) fail("loop() takes exactly one argument");
  if (call_depth_ >= limits_.max_call_depth) fail("recursive loop deeper than %d levels", limits_.max_call_depth);
  ++call_depth_;
  struct Dec {
    int& d;
    ~Dec() { --d; }
  } dec{call_depth_};
  Capture cap(*this);
  exec_for(l->node, l->scope, args.pos[0], l->depth0 + 1);
  return Value::string(cap.take());
}

// ---------------------------------------------------------------- expressions

Value Interp::lookup(int sym, Frame* f) {
  for (Frame* x = f; x; x = x->parent)
    if (Value* v = x->find_local(sym)) return *v;
  return Value::undefined("'" + prog_.symbols[static_cast<size_t>(sym)] + "' is undefined");
}

std::vector<Value> Interp::iterate(const Value& v) {
  step();
  switch (v.kind()) {
    case Kind::Undefined: return {};
    case Kind::List:
      add_work(v.list()->items.size());
      return v.list()->items;
    case Kind::Dict: {
      add_work(v.dict()->items.size());
      std::vector<Value> keys;
      keys.reserve(v.dict()->items.size());
      for (const auto& kv : v.dict()->items) keys.push_back(kv.first);
      return keys;
    }
    case Kind::String: {
      std::vector<Value> chars;
      const std::string& s = v.str();
      heap_.charge(s.size());
      add_work(s.size());
      size_t i = 0;
      while (i < s.size()) {
        size_t st = i;
        py::decode_at(s, i);
        chars.push_back(Value::string(s.substr(st, i - st)));
      }
      return chars;
    }
    case Kind::Iterator: {
      IterObj* it = v.iter();
      force(it);
      std::vector<Value> rest(it->items.begin() + static_cast<std::ptrdiff_t>(it->pos), it->items.end());
      it->pos = it->items.size();
      return rest;
    }
    default: fail("'%s' object is not iterable", type_name(v));
  }
}

Value Interp::getattr(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Kind::Undefined: fail_undefined(obj);
    case Kind::Dict:
    case Kind::String:
    case Kind::List: {
      if (has_method(obj, name)) {
        if (is_unsafe_method(obj, name))
          return Value::undefined("access to attribute '" + std::string(name) + "' of '" + type_name(obj) +
                                  "' object is unsafe.");
        MethodObj* m = heap_.make<MethodObj>();
        m->self = obj;
        m->name = std::string(name);
        return Value::object(Kind::Callable, m);
      }
      if (obj.is_dict()) {
        if (const Value* v = obj.dict()->find(Value::string(std::string(name)))) return *v;
      }
      if (obj.is_list() && obj.list()->named_group) {
        if (name == "grouper") return obj.list()->items[0];
        if (name == "list") return obj.list()->items[1];
      }
      return Value::undefined("'" + std::string(type_name(obj)) + " object' has no attribute '" + std::string(name) +
                              "'");
    }
    case Kind::Namespace: {
      if (const Value* v = obj.ns()->get(name)) return *v;
      return Value::undefined("'Namespace object' has no attribute '" + std::string(name) + "'");
    }
    case Kind::Loop: return loop_attr(static_cast<LoopObj*>(obj.obj()), name);
    case Kind::None: return Value::undefined("'None' has no attribute '" + std::string(name) + "'");
    default:
      return Value::undefined("'" + std::string(type_name(obj)) + " object' has no attribute '" + std::string(name) +
                              "'");
  }
}

Value Interp::getitem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Kind::Undefined: fail_undefined(obj);
    case Kind::List: {
      const ListObj* l = obj.list();
      if ((l->flavor == ListFlavor::List || l->flavor == ListFlavor::Tuple) && key.is_integral()) {
        int64_t n = static_cast<int64_t>(l->items.size()), i = key.as_int();
        if (i < 0) i += n;
        if (i >= 0 && i < n) return l->items[static_cast<size_t>(i)];
        return Value::undefined("'" + std::string(type_name(obj)) + " object' has no element " + to_str(key));
      }
      break;
    }
    case Kind::String: {
      if (key.is_integral()) {
        const std::string& s = obj.str();
        int64_t i = key.as_int();
        if (py::is_ascii(s)) {
          int64_t n = static_cast<int64_t>(s.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value::string(s.substr(static_cast<size_t>(i), 1));
        } else {
          std::u32string u = py::decode(s);
          int64_t n = static_cast<int64_t>(u.size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value::string(py::encode(&u[static_cast<size_t>(i)], &u[static_cast<size_t>(i)] + 1));
        }
        return Value::undefined("'str object' has no element " + to_str(key));
      }
      break;
    }
    case Kind::Dict: {
      bool hashable = true;
      try {
        check_hashable(key);
      } catch (const Error&) {
        hashable = false;
      }
      if (hashable) {
        if (const Value* v = obj.dict()->find(key)) return *v;
      }
      if (key.is_string() && has_method(obj, key.str())) return getattr(obj, key.str());
      return Value::undefined("'dict object' has no attribute '" + to_str(key) + "'");
    }
    default: break;
  }
  if (key.is_string()) return getattr(obj, key.str());
  return Value::undefined("'" + std::string(type_name(obj)) + " object' has no element " + to_str(key));
}

Value Interp::eval_slice(const Value& obj, const Slice* s, Frame* f, bool folded) {
  Value parts[3] = {s->start ? eval(s->start, f) : Value::none(), s->stop ? eval(s->stop, f) : Value::none(),
                    s->step ? eval(s->step, f) : Value::none()};
  if (obj.is_undefined()) fail_undefined(obj);
  // jinja2 compiles slices to plain Python subscripts (no getitem fallback): errors propagate,
  // except for constant-folded slices, which went through the sandbox getitem (Undefined).
  bool seq = obj.is_string() ||
             (obj.is_list() && (obj.list()->flavor == ListFlavor::List || obj.list()->flavor == ListFlavor::Tuple));
  bool int_bounds = true;
  for (const Value& p : parts)
    if (!p.is_none() && !p.is_integral()) int_bounds = false;
  if (folded && (!seq || !int_bounds)) return Value::undefined("'" + std::string(type_name(obj)) + " object' has no slice");
  if (!seq) {
    if (obj.is_dict()) fail("unhashable type: 'slice'");
    fail("'%s' object is not subscriptable", type_name(obj));
  }
  for (const Value& p : parts)
    if (!p.is_none() && !p.is_integral()) fail("slice indices must be integers or None or have an __index__ method");
  int64_t step = parts[2].is_none() ? 1 : parts[2].as_int();
  if (step == 0) fail("slice step cannot be zero");
  std::u32string u;
  bool ascii = obj.is_string() && py::is_ascii(obj.str());
  if (obj.is_string() && !ascii) u = py::decode(obj.str());
  int64_t len = obj.is_string() ? (ascii ? static_cast<int64_t>(obj.str().size()) : static_cast<int64_t>(u.size()))
                                : static_cast<int64_t>(obj.list()->items.size());
  int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? len - 1 : len;
  auto adjust = [&](const Value& v, int64_t dflt) {
    if (v.is_none()) return dflt;
    int64_t x = v.as_int();
    if (x < 0) {
      x += len;
      if (x < lower) x = lower;
    } else if (x > upper) {
      x = upper;
    }
    return x;
  };
  int64_t start = adjust(parts[0], step < 0 ? upper : lower);
  int64_t stop = adjust(parts[1], step < 0 ? lower : upper);
  std::vector<int64_t> idx;
  add_work(static_cast<uint64_t>(len));
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) idx.push_back(i);
  } else {
    for (int64_t i = start; i > stop; i += step) idx.push_back(i);
  }
  if (obj.is_string()) {
    std::string out;
    const std::string& s = obj.str();
    for (int64_t i : idx) {
      if (ascii) {
        out.push_back(s[static_cast<size_t>(i)]);
      } else {
        py::append_utf8(out, u[static_cast<size_t>(i)]);
      }
    }
    return Value::string(std::move(out));
  }
  std::vector<Value> items;
  items.reserve(idx.size());
  for (int64_t i : idx) items.push_back(obj.list()->items[static_cast<size_t>(i)]);
  const ListObj* src = obj.list();
  Value r = make_list(std::move(items), src->flavor);
  if (src->is_range) {  // range(a, b, s)[i:j:k] == range(a + i*s, a + j*s, s*k)
    ListObj* l = r.list();
    l->is_range = true;
    l->range_start = src->range_start + start * src->range_step;
    l->range_stop = src->range_start + stop * src->range_step;
    l->range_step = src->range_step * step;
  }
  return r;
}

void Interp::eval_args(const Args& a, Frame* f, CallArgs* out) {
  for (const Expr* e : a.pos) out->pos.push_back(eval(e, f));
  for (const auto& kv : a.kw) out->kw.emplace_back(kv.first, eval(kv.second, f));
  if (a.dyn_args) {
    for (Value& v : iterate(eval(a.dyn_args, f))) out->pos.push_back(std::move(v));
  }
  if (a.dyn_kwargs) {
    Value d = eval(a.dyn_kwargs, f);
    if (!d.is_dict()) fail("argument after ** must be a mapping, not %s", type_name(d));
    for (const auto& kv : d.dict()->items) {
      if (!kv.first.is_string()) fail("keywords must be strings");
      out->kw.emplace_back(kv.first.str(), kv.second);
    }
  }
}

Value Interp::call(const Value& callee, CallArgs& args) {
  switch (callee.kind()) {
    case Kind::Callable: return callee.callable()->call(*this, args);
    case Kind::Loop: return loop_call(static_cast<LoopObj*>(callee.obj()), "", args);
    case Kind::Undefined: fail_undefined(callee);
    default: fail("'%s' object is not callable", type_name(callee));
  }
}

Value Interp::eval_call(const Call* c, Frame* f, const Value& caller) {
  auto finish = [&](CallArgs& a) {
    if (!caller.is_undefined()) a.kw.emplace_back("caller", caller);
  };
  if (c->callee->kind == EK::Getattr) {
    auto* g = static_cast<const Getattr*>(c->callee);
    Value obj = eval(g->obj, f);
    if ((obj.is_string() || obj.is_dict() || obj.is_list()) && has_method(obj, g->attr) &&
        !is_unsafe_method(obj, g->attr)) {
      CallArgs a;
      eval_args(c->args, f, &a);
      finish(a);
      cur_offset_ = c->offset;
      return call_method(*this, obj, g->attr, a);
    }
    Value fn = getattr(obj, g->attr);
    CallArgs a;
    eval_args(c->args, f, &a);
    finish(a);
    cur_offset_ = c->offset;
    return call(fn, a);
  }
  Value fn = eval(c->callee, f);
  CallArgs a;
  eval_args(c->args, f, &a);
  finish(a);
  cur_offset_ = c->offset;
  return call(fn, a);
}

Value Interp::apply_filter(std::string_view name, const Value& input, CallArgs& args) {
  int id = find_filter(name);
  if (id < 0) fail("no filter named '%.*s'", static_cast<int>(name.size()), name.data());
  return filter_fn(id)(*this, input, args);
}

bool Interp::apply_test(std::string_view name, const Value& v, CallArgs& args) {
  int id = find_test(name);
  if (id < 0) fail("no test named '%.*s'", static_cast<int>(name.size()), name.data());
  return test_fn(id)(*this, v, args);
}

bool Interp::contains(const Value& c, const Value& item) {
  step();
  switch (c.kind()) {
    case Kind::Undefined: return false;
    case Kind::String:
      if (!item.is_string()) fail("'in <string>' requires string as left operand, not %s", type_name(item));
      add_work(c.str().size() / 16);
      return c.str().find(item.str()) != std::string::npos;
    case Kind::List:
      for (const Value& x : c.list()->items)
        if (equals(x, item)) return true;
      return false;
    case Kind::Dict: return c.dict()->find(item) != nullptr;
    case Kind::Iterator: {
      IterObj* it = c.iter();
      force(it);
      while (it->pos < it->items.size()) {
        if (equals(it->items[it->pos++], item)) return true;
      }
      return false;
    }
    default: fail("argument of type '%s' is not iterable", type_name(c));
  }
}

bool Interp::compare_op(CmpOp op, const Value& a, const Value& b) {
  switch (op) {
    case CmpOp::Eq: return equals(a, b);
    case CmpOp::Ne: return !equals(a, b);
    case CmpOp::Lt: return compare(a, b, "<");
    case CmpOp::Le: return compare(a, b, "<=");
    case CmpOp::Gt: return compare(a, b, ">");
    case CmpOp::Ge: return compare(a, b, ">=");
    case CmpOp::In: return contains(b, a);
    case CmpOp::NotIn: return !contains(b, a);
  }
  return false;
}

Value Interp::binop(BinOp op, const Value& a, const Value& b) {
  static const char* names[] = {"+", "-", "*", "/", "//", "%", "**"};
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    bool ints = a.is_integral() && b.is_integral();
    if (ints) {
      int64_t x = a.as_int(), y = b.as_int(), r = 0;
      switch (op) {
        case BinOp::Add:
          if (__builtin_add_overflow(x, y, &r)) overflow();
          return Value::integer(r);
        case BinOp::Sub:
          if (__builtin_sub_overflow(x, y, &r)) overflow();
          return Value::integer(r);
        case BinOp::Mul:
          if (__builtin_mul_overflow(x, y, &r)) overflow();
          return Value::integer(r);
        case BinOp::Div:
          if (y == 0) fail("division by zero");
          return Value::number(static_cast<double>(x) / static_cast<double>(y));
        case BinOp::FloorDiv: return Value::integer(py_floordiv(x, y));
        case BinOp::Mod: return Value::integer(py_mod(x, y));
        case BinOp::Pow: {
          if (y < 0) {
            if (x == 0) fail("0.0 cannot be raised to a negative power");
            return Value::number(std::pow(static_cast<double>(x), static_cast<double>(y)));
          }
          int64_t res = 1, base = x;
          while (y > 0) {
            if ((y & 1) && __builtin_mul_overflow(res, base, &res)) overflow();
            y >>= 1;
            if (y && __builtin_mul_overflow(base, base, &base)) overflow();
          }
          return Value::integer(res);
        }
      }
    }
    double x = a.as_double(), y = b.as_double();
    switch (op) {
      case BinOp::Add: return Value::number(x + y);
      case BinOp::Sub: return Value::number(x - y);
      case BinOp::Mul: return Value::number(x * y);
      case BinOp::Div:
        if (y == 0) fail("float division by zero");
        return Value::number(x / y);
      case BinOp::FloorDiv: {
        double q, m;
        if (y == 0) fail("float floor division by zero");
        float_divmod(x, y, &q, &m);
        return Value::number(q);
      }
      case BinOp::Mod: {
        double q, m;
        float_divmod(x, y, &q, &m);
        return Value::number(m);
      }
      case BinOp::Pow: {
        if (x == 0 && y < 0) fail("0.0 cannot be raised to a negative power");
        if (x < 0 && y != std::floor(y)) fail("negative number raised to a fractional power (complex result)");
        double r = std::pow(x, y);
        if (std::isinf(r) && !std::isinf(x) && !std::isinf(y)) fail("numerical result out of range");
        return Value::number(r);
      }
    }
  }
  if (op == BinOp::Add) {
    if (a.is_string() && b.is_string()) {
      check_size(a.str().size() + b.str().size());
      if (a.safe() || b.safe()) {
        std::string l = a.safe() ? a.str() : py::html_escape(a.str());
        std::string r = b.safe() ? b.str() : py::html_escape(b.str());
        return Value::string(l + r, true);
      }
      std::string s;
      add_work((a.str().size() + b.str().size()) / 16);
      s.reserve(a.str().size() + b.str().size());
      s += a.str();
      s += b.str();
      return Value::string(std::move(s));
    }
    if (a.is_list() && b.is_list() && a.list()->flavor == b.list()->flavor && !a.list()->is_range &&
        !b.list()->is_range && (a.list()->flavor == ListFlavor::List || a.list()->flavor == ListFlavor::Tuple)) {
      std::vector<Value> items = a.list()->items;
      items.insert(items.end(), b.list()->items.begin(), b.list()->items.end());
      return make_list(std::move(items), a.list()->flavor);
    }
    if (a.is_string()) fail("can only concatenate str (not \"%s\") to str", type_name(b));
    if (a.is_list() && a.list()->flavor == ListFlavor::List)
      fail("can only concatenate list (not \"%s\") to list", type_name(b));
  }
  if (op == BinOp::Mul) {
    const Value* seq = nullptr;
    const Value* num = nullptr;
    if (b.is_integral() && (a.is_string() || a.is_list())) seq = &a, num = &b;
    if (a.is_integral() && (b.is_string() || b.is_list())) seq = &b, num = &a;
    if (seq && (seq->is_string() || ((seq->list()->flavor == ListFlavor::List ||
                                      seq->list()->flavor == ListFlavor::Tuple) && !seq->list()->is_range))) {
      int64_t n = std::max<int64_t>(0, num->as_int());
      if (seq->is_string()) {
        const std::string& s = seq->str();
        if (!s.empty() && static_cast<uint64_t>(n) > limits_.max_output_bytes / s.size()) check_size(SIZE_MAX);
        std::string out;
        out.reserve(s.size() * static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) out += s;
        return Value::string(std::move(out));
      }
      const auto& items = seq->list()->items;
      if (!items.empty() && static_cast<uint64_t>(n) > limits_.max_heap_cells / items.size())
        heap_.charge(SIZE_MAX / 2);
      std::vector<Value> out;
      out.reserve(items.size() * static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
      return make_list(std::move(out), seq->list()->flavor);
    }
  }
  if (op == BinOp::Mod && a.is_string()) return Value::string(percent_format(*this, a.str(), b));
  fail("unsupported operand type(s) for %s: '%s' and '%s'", names[static_cast<int>(op)], type_name(a), type_name(b));
}

Value Interp::eval(const Expr* e, Frame* f) {
  step();
  Nest nest(*this);
  cur_offset_ = e->offset;
  switch (e->kind) {
    case EK::Const: return static_cast<const Const*>(e)->value;
    case EK::Name: return lookup(static_cast<const Name*>(e)->sym, f);
    case EK::Getattr: {
      auto* g = static_cast<const Getattr*>(e);
      Value obj = eval(g->obj, f);
      cur_offset_ = e->offset;
      return getattr(obj, g->attr);
    }
    case EK::Getitem: {
      auto* g = static_cast<const Getitem*>(e);
      Value obj = eval(g->obj, f);
      if (g->index->kind == EK::Slice) return eval_slice(obj, static_cast<const Slice*>(g->index), f, g->folded);
      Value key = eval(g->index, f);
      cur_offset_ = e->offset;
      return getitem(obj, key);
    }
    case EK::Slice: fail("slice outside of a subscript");
    case EK::Call: return eval_call(static_cast<const Call*>(e), f, Value());
    case EK::Filter: {
      auto* n = static_cast<const Filter*>(e);
      Value input = eval(n->arg, f);
      CallArgs a;
      eval_args(n->args, f, &a);
      cur_offset_ = e->offset;
      if (n->fn < 0) fail("no filter named '%s'", n->name.c_str());
      return filter_fn(n->fn)(*this, input, a);
    }
    case EK::Test: {
      auto* n = static_cast<const Test*>(e);
      Value v = eval(n->arg, f);
      CallArgs a;
      eval_args(n->args, f, &a);
      cur_offset_ = e->offset;
      if (n->fn < 0) fail("no test named '%s'", n->name.c_str());
      return Value::boolean(test_fn(n->fn)(*this, v, a));
    }
    case EK::Neg:
    case EK::Pos: {
      Value v = eval(static_cast<const Unary*>(e)->operand, f);
      if (v.is_undefined()) fail_undefined(v);
      if (v.is_integral()) {
        if (e->kind == EK::Pos) return Value::integer(v.as_int());
        if (v.as_int() == INT64_MIN) fail("integer overflow (values beyond 64 bits are not supported)");
        return Value::integer(-v.as_int());
      }
      if (v.is_float()) return Value::number(e->kind == EK::Neg ? -v.as_double() : v.as_double());
      fail("bad operand type for unary %s: '%s'", e->kind == EK::Neg ? "-" : "+", type_name(v));
    }
    case EK::Not: return Value::boolean(!truthy(eval(static_cast<const Unary*>(e)->operand, f)));
    case EK::Binary: {
      auto* b = static_cast<const Binary*>(e);
      Value l = eval(b->left, f);
      Value r = eval(b->right, f);
      cur_offset_ = e->offset;
      return binop(b->op, l, r);
    }
    case EK::Concat: {
      std::string s;
      struct Charge {
        std::string& s;
        ~Charge() { add_work(s.size() / 16); }
      } charge{s};
      for (const Expr* p : static_cast<const Concat*>(e)->parts) {
        append_str(s, eval(p, f));
        check_size(s.size());
      }
      return Value::string(std::move(s));
    }
    case EK::Compare: {
      auto* c = static_cast<const Compare*>(e);
      Value left = eval(c->first, f);
      for (const auto& op : c->ops) {
        Value right = eval(op.second, f);
        cur_offset_ = e->offset;
        if (!compare_op(op.first, left, right)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case EK::And: {
      auto* l = static_cast<const Logical*>(e);
      Value a = eval(l->left, f);
      return truthy(a) ? eval(l->right, f) : a;
    }
    case EK::Or: {
      auto* l = static_cast<const Logical*>(e);
      Value a = eval(l->left, f);
      return truthy(a) ? a : eval(l->right, f);
    }
    case EK::Cond: {
      auto* c = static_cast<const Cond*>(e);
      if (truthy(eval(c->test, f))) return eval(c->then, f);
      if (c->otherwise) return eval(c->otherwise, f);
      return Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
    }
    case EK::List:
    case EK::Tuple: {
      std::vector<Value> items;
      const auto& src = static_cast<const Seq*>(e)->items;
      items.reserve(src.size());
      for (const Expr* x : src) items.push_back(eval(x, f));
      return make_list(std::move(items), e->kind == EK::List ? ListFlavor::List : ListFlavor::Tuple);
    }
    case EK::Dict: {
      DictObj* d = heap_.make<DictObj>();
      const auto& src = static_cast<const DictLit*>(e)->items;
      heap_.charge(src.size());
      for (const auto& kv : src) {
        Value k = eval(kv.first, f);
        Value v = eval(kv.second, f);
        check_hashable(k);
        d->set(k, v);
      }
      return Value::object(Kind::Dict, d);
    }
    case EK::NSRef: fail("namespace attribute reference outside of an assignment");
    case EK::Input:
      if (input_stack_.empty()) fail("filter input outside of a filter block");
      return input_stack_.back();
  }
  fail("unknown expression");
}

}  // namespace spool::tmpl
