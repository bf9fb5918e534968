// Tree-walking evaluator: executes an ast::Program against a context with jinja2's runtime
// semantics (scoping per for-iteration / macro / block, Undefined, loop variables, macros
// and callers) and the resource limits of RenderLimits. One Interp per render.
#pragma once

#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "template/ast.h"
#include "template/chat_template.h"
#include "template/value.h"

namespace spool::tmpl {

/// Error thrown by raise_exception(); what() is exactly the template's message.
class RaisedError : public Error {
 public:
  using Error::Error;
};

/// A variable scope. Frames are heap objects because macros capture them.
struct Frame : Object {
  Frame* parent = nullptr;
  std::vector<std::pair<int, Value>> vars;
  bool captured = false;  ///< referenced by a macro closure: must not be recycled

  /// Variable in this frame only, or nullptr.
  Value* find_local(int sym) {
    for (auto& kv : vars)
      if (kv.first == sym) return &kv.second;
    return nullptr;
  }
  /// Sets a variable in this frame.
  void set(int sym, Value v) {
    if (Value* cur = find_local(sym)) {
      *cur = std::move(v);
    } else {
      vars.emplace_back(sym, std::move(v));
    }
  }
};

/// State of one for loop, exposed to templates as `loop`.
struct LoopObj : Object {
  std::vector<Value> src;      ///< items before the loop filter
  size_t src_pos = 0;
  const ast::For* node = nullptr;
  Frame* scope = nullptr;      ///< frame enclosing the loop (for the filter test)
  std::deque<Value> ahead;     ///< filtered items pulled ahead (for last/length/nextitem)
  int64_t index0 = -1;
  Value cur, prev;
  int depth0 = 0;
  bool has_changed = false;
  Value last_changed;
};

/// The interpreter for one render.
class Interp {
 public:
  /// Prepares a render of `prog` under `limits`.
  Interp(const ast::Program& prog, const RenderLimits& limits);
  /// Renders the whole template with the given context variables.
  std::string render(const nlohmann::ordered_json& context);
  /// Source offset of the statement or expression evaluated last (for error positions).
  uint32_t offset() const { return cur_offset_; }

  // ---- services for builtins ----
  /// The per-render heap.
  Heap& heap() { return heap_; }
  /// Resource limits of this render.
  const RenderLimits& limits() const { return limits_; }
  /// Calls any callable value.
  Value call(const Value& callee, CallArgs& args);
  /// Python-style attribute access with jinja2's sandbox rules (obj.name).
  Value getattr(const Value& obj, std::string_view name);
  /// jinja2 subscript (obj[key]): item first, then attribute; missing gives Undefined.
  Value getitem(const Value& obj, const Value& key);
  /// Python iteration: items of a list, keys of a dict, characters of a string; consumes
  /// one-shot iterators; Undefined iterates as empty. Throws for non-iterables.
  std::vector<Value> iterate(const Value& v);
  /// Applies filter `name` (used by map()); throws for unknown names.
  Value apply_filter(std::string_view name, const Value& input, CallArgs& args);
  /// Applies test `name` (used by select()); throws for unknown names.
  bool apply_test(std::string_view name, const Value& v, CallArgs& args);
  /// Throws when a string of n bytes would exceed the output limit.
  void check_size(size_t n) const;
  /// New list (or tuple/view) value.
  Value make_list(std::vector<Value> items, ListFlavor f = ListFlavor::List);
  /// New one-shot iterator value.
  Value make_iter(std::vector<Value> items, const char* type_name);
  /// New one-shot iterator whose items are computed when it is first consumed.
  Value make_lazy_iter(std::function<std::vector<Value>()> body, const char* type_name);
  /// Runs a lazy iterator's deferred body (no-op when already done).
  void force(IterObj* it);
  /// Throws the error an Undefined raises when used as an object.
  [[noreturn]] void fail_undefined(const Value& u) const;
  /// Invokes a macro definition with a closure frame (used by macro objects).
  Value invoke_macro(const ast::MacroDef& def, Frame* closure, CallArgs& args);
  /// Attribute of a loop object.
  Value loop_attr(LoopObj* loop, std::string_view name);
  /// Calls a loop's method (cycle / changed) or the recursive loop itself.
  Value loop_call(LoopObj* loop, std::string_view method, CallArgs& args);

 private:
  enum class Flow { Normal, Break, Continue };

  struct Nest {  // guards C++ recursion depth
    Interp& in;
    explicit Nest(Interp& i) : in(i) {
      if (++in.nesting_ > in.limits_.max_nesting) in.fail_nesting();
    }
    ~Nest() { --in.nesting_; }
  };
  [[noreturn]] void fail_nesting() const;

  void step() {
    if (++steps_ + work_counter() > limits_.max_steps) fail_steps();
  }
  [[noreturn]] void fail_steps() const;

  struct Capture;  // redirects output into a fresh buffer for its lifetime
  Frame* new_frame(Frame* parent);
  void emit(std::string_view s);
  std::string render_body(const ast::Body& body, Frame* f);

  Flow exec_body(const ast::Body& body, Frame* f);
  Flow exec(const ast::Stmt* s, Frame* f);
  Flow exec_for(const ast::For* s, Frame* f, const Value& iterable, int depth0);
  void assign(const ast::Expr* target, const Value& v, Frame* f);
  bool loop_pull(LoopObj* loop, Value* out);
  bool loop_peek(LoopObj* loop);

  Value eval(const ast::Expr* e, Frame* f);
  Value lookup(int sym, Frame* f);
  Value eval_call(const ast::Call* c, Frame* f, const Value& caller);
  void eval_args(const ast::Args& a, Frame* f, CallArgs* out);
  Value eval_slice(const Value& obj, const ast::Slice* s, Frame* f, bool folded);
  Value binop(ast::BinOp op, const Value& a, const Value& b);
  bool compare_op(ast::CmpOp op, const Value& a, const Value& b);
  bool contains(const Value& container, const Value& item);

  const ast::Program& prog_;
  RenderLimits limits_;
  Heap heap_;
  std::string* out_ = nullptr;
  std::deque<std::string> capture_stack_;  ///< buffers of macro bodies, set blocks, ...
  std::vector<Value> input_stack_;
  uint64_t steps_ = 0;
  uint32_t cur_offset_ = 0;  ///< source position of the node being evaluated (for errors)
  int nesting_ = 0;
  int call_depth_ = 0;
  int loop_sym_ = -1, caller_sym_ = -1, varargs_sym_ = -1, kwargs_sym_ = -1;
  Frame* globals_ = nullptr;
  std::vector<Frame*> free_frames_;
};

}  // namespace spool::tmpl
