// Abstract syntax tree of a parsed template (mirrors jinja2.nodes). Nodes are owned by
// the Program's pool and linked by raw pointers; a Program is immutable after parsing and
// shared by concurrent renders.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "template/lexer.h"
#include "template/value.h"

namespace spool::tmpl::ast {

/// Expression node kinds.
enum class EK : uint8_t {
  Const, Name, Getattr, Getitem, Slice, Call, Filter, Test, Neg, Pos, Not, Binary, Concat, Compare,
  And, Or, Cond, List, Tuple, Dict, NSRef, Input
};

/// Base of all nodes (owned by Program::pool).
struct Node {
  uint32_t offset = 0;  ///< source position, for error messages
  virtual ~Node() = default;
};

/// Expression base.
struct Expr : Node {
  EK kind;
  uint16_t depth = 1;  ///< height of the subtree (bounded to keep evaluation recursion shallow)
  explicit Expr(EK k) : kind(k) {}
};

/// Call arguments: positional, keyword, *args and **kwargs.
struct Args {
  std::vector<Expr*> pos;
  std::vector<std::pair<std::string, Expr*>> kw;
  Expr* dyn_args = nullptr;
  Expr* dyn_kwargs = nullptr;
};

/// Literal (None/bool/int/float/str).
struct Const : Expr {
  Value value;
  Const() : Expr(EK::Const) {}
};
/// Variable reference; `sym` indexes Program::symbols.
struct Name : Expr {
  int sym = -1;
  Name() : Expr(EK::Name) {}
};
/// obj.attr
struct Getattr : Expr {
  Expr* obj = nullptr;
  std::string attr;
  Getattr() : Expr(EK::Getattr) {}
};
/// obj[index] (index may be a Slice)
struct Getitem : Expr {
  Expr* obj = nullptr;
  Expr* index = nullptr;
  /// jinja2 constant-folds subscripts of constants through sandbox getitem, so a failing
  /// constant slice yields Undefined instead of raising like a runtime slice.
  bool folded = false;
  Getitem() : Expr(EK::Getitem) {}
};
/// start:stop:step inside a subscript; parts may be null.
struct Slice : Expr {
  Expr* start = nullptr;
  Expr* stop = nullptr;
  Expr* step = nullptr;
  Slice() : Expr(EK::Slice) {}
};
/// callee(args)
struct Call : Expr {
  Expr* callee = nullptr;
  Args args;
  Call() : Expr(EK::Call) {}
};
/// arg | name(args); `arg` is an Input node for filter blocks and block sets.
struct Filter : Expr {
  Expr* arg = nullptr;
  std::string name;
  int fn = -1;  ///< index into the filter table
  Args args;
  Filter() : Expr(EK::Filter) {}
};
/// arg is name(args)
struct Test : Expr {
  Expr* arg = nullptr;
  std::string name;
  int fn = -1;  ///< index into the test table
  Args args;
  Test() : Expr(EK::Test) {}
};
/// -x, +x, not x
struct Unary : Expr {
  Expr* operand = nullptr;
  explicit Unary(EK k) : Expr(k) {}
};
/// Arithmetic operator.
enum class BinOp : uint8_t { Add, Sub, Mul, Div, FloorDiv, Mod, Pow };
/// left op right
struct Binary : Expr {
  BinOp op = BinOp::Add;
  Expr* left = nullptr;
  Expr* right = nullptr;
  Binary() : Expr(EK::Binary) {}
};
/// a ~ b ~ c
struct Concat : Expr {
  std::vector<Expr*> parts;
  Concat() : Expr(EK::Concat) {}
};
/// Comparison operator.
enum class CmpOp : uint8_t { Eq, Ne, Lt, Le, Gt, Ge, In, NotIn };
/// first op1 e1 op2 e2 ... (chained like Python)
struct Compare : Expr {
  Expr* first = nullptr;
  std::vector<std::pair<CmpOp, Expr*>> ops;
  Compare() : Expr(EK::Compare) {}
};
/// left and/or right
struct Logical : Expr {
  Expr* left = nullptr;
  Expr* right = nullptr;
  explicit Logical(EK k) : Expr(k) {}
};
/// then if test else otherwise (otherwise may be null -> undefined)
struct Cond : Expr {
  Expr* test = nullptr;
  Expr* then = nullptr;
  Expr* otherwise = nullptr;
  Cond() : Expr(EK::Cond) {}
};
/// [a, b] or (a, b)
struct Seq : Expr {
  std::vector<Expr*> items;
  explicit Seq(EK k) : Expr(k) {}
};
/// {k: v}
struct DictLit : Expr {
  std::vector<std::pair<Expr*, Expr*>> items;
  DictLit() : Expr(EK::Dict) {}
};
/// ns.attr as an assignment target
struct NSRef : Expr {
  int sym = -1;
  std::string attr;
  NSRef() : Expr(EK::NSRef) {}
};
/// The value being filtered in {% filter %} / {% set x | f %} blocks.
struct Input : Expr {
  Input() : Expr(EK::Input) {}
};

/// Statement node kinds.
enum class SK : uint8_t { Output, If, For, Set, SetBlock, Macro, CallBlock, FilterBlock, With, Scope, Break, Continue };

/// Statement base.
struct Stmt : Node {
  SK kind;
  explicit Stmt(SK k) : kind(k) {}
};
using Body = std::vector<Stmt*>;

/// Template data and {{ }} expressions, in order (expr null means literal data).
struct Output : Stmt {
  struct Item {
    std::string data;
    Expr* expr = nullptr;
  };
  std::vector<Item> items;
  Output() : Stmt(SK::Output) {}
};
/// if / elif / else
struct If : Stmt {
  std::vector<std::pair<Expr*, Body>> branches;
  Body otherwise;
  If() : Stmt(SK::If) {}
};
/// for target in iter [if filter] [recursive] ... [else] ... endfor
struct For : Stmt {
  Expr* target = nullptr;
  Expr* iter = nullptr;
  Expr* filter = nullptr;
  bool recursive = false;
  Body body, otherwise;
  For() : Stmt(SK::For) {}
};
/// set target = value
struct Set : Stmt {
  Expr* target = nullptr;
  Expr* value = nullptr;
  Set() : Stmt(SK::Set) {}
};
/// set target [| filters] ... endset
struct SetBlock : Stmt {
  Expr* target = nullptr;
  Expr* filter = nullptr;
  Body body;
  SetBlock() : Stmt(SK::SetBlock) {}
};
/// Macro signature and body (also used for call-block callers).
struct MacroDef {
  std::string name;
  std::vector<int> params;        ///< parameter symbols
  std::vector<std::string> param_names;
  std::vector<Expr*> defaults;    ///< defaults of the last defaults.size() params
  Body body;
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
};
/// macro name(params) ... endmacro
struct Macro : Stmt {
  int sym = -1;
  MacroDef def;
  Macro() : Stmt(SK::Macro) {}
};
/// call[(params)] expr ... endcall
struct CallBlock : Stmt {
  Call* call = nullptr;
  MacroDef def;
  CallBlock() : Stmt(SK::CallBlock) {}
};
/// filter f ... endfilter
struct FilterBlock : Stmt {
  Expr* filter = nullptr;
  Body body;
  FilterBlock() : Stmt(SK::FilterBlock) {}
};
/// with a = 1, b = 2 ... endwith
struct With : Stmt {
  std::vector<std::pair<Expr*, Expr*>> assigns;
  Body body;
  With() : Stmt(SK::With) {}
};
/// A scoped body rendered in place ({% generation %} of transformers).
struct Scope : Stmt {
  Body body;
  Scope() : Stmt(SK::Scope) {}
};
/// break / continue
struct LoopCtl : Stmt {
  explicit LoopCtl(SK k) : Stmt(k) {}
};

/// A parsed template: the tree, its node pool and the interned variable names.
struct Program {
  SourceInfo src;
  Body body;
  std::vector<std::unique_ptr<Node>> pool;
  std::vector<std::string> symbols;
  std::unordered_map<std::string, int> sym_index;

  /// Symbol id of a name, interning it.
  int intern(const std::string& name) {
    auto it = sym_index.find(name);
    if (it != sym_index.end()) return it->second;
    int id = static_cast<int>(symbols.size());
    symbols.push_back(name);
    sym_index.emplace(name, id);
    return id;
  }
  /// Symbol id of a name or -1 when the template never mentions it.
  int lookup(const std::string& name) const {
    auto it = sym_index.find(name);
    return it == sym_index.end() ? -1 : it->second;
  }
};

}  // namespace spool::tmpl::ast
