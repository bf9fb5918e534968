// Jinja2 parser; see parser.h. Method names follow jinja2/parser.py.
#include "template/parser.h"

#include <algorithm>
#include <initializer_list>

#include "common/error.h"
#include "template/builtins.h"

namespace spool::tmpl {

using namespace ast;

namespace {

/// Visits the direct sub-expressions of e.
template <typename F>
void for_children(const Expr* e, F&& f) {
  auto args = [&](const Args& a) {
    for (Expr* x : a.pos) f(x);
    for (const auto& kv : a.kw) f(kv.second);
    if (a.dyn_args) f(a.dyn_args);
    if (a.dyn_kwargs) f(a.dyn_kwargs);
  };
  switch (e->kind) {
    case EK::Getattr: f(static_cast<const Getattr*>(e)->obj); break;
    case EK::Getitem:
      f(static_cast<const Getitem*>(e)->obj);
      f(static_cast<const Getitem*>(e)->index);
      break;
    case EK::Slice: {
      auto* s = static_cast<const Slice*>(e);
      if (s->start) f(s->start);
      if (s->stop) f(s->stop);
      if (s->step) f(s->step);
      break;
    }
    case EK::Call:
      f(static_cast<const Call*>(e)->callee);
      args(static_cast<const Call*>(e)->args);
      break;
    case EK::Filter:
      f(static_cast<const Filter*>(e)->arg);
      args(static_cast<const Filter*>(e)->args);
      break;
    case EK::Test:
      f(static_cast<const Test*>(e)->arg);
      args(static_cast<const Test*>(e)->args);
      break;
    case EK::Neg:
    case EK::Pos:
    case EK::Not: f(static_cast<const Unary*>(e)->operand); break;
    case EK::Binary:
      f(static_cast<const Binary*>(e)->left);
      f(static_cast<const Binary*>(e)->right);
      break;
    case EK::Concat:
      for (Expr* x : static_cast<const Concat*>(e)->parts) f(x);
      break;
    case EK::Compare:
      f(static_cast<const Compare*>(e)->first);
      for (const auto& op : static_cast<const Compare*>(e)->ops) f(op.second);
      break;
    case EK::And:
    case EK::Or:
      f(static_cast<const Logical*>(e)->left);
      f(static_cast<const Logical*>(e)->right);
      break;
    case EK::Cond: {
      auto* c = static_cast<const Cond*>(e);
      f(c->test);
      f(c->then);
      if (c->otherwise) f(c->otherwise);
      break;
    }
    case EK::List:
    case EK::Tuple:
      for (Expr* x : static_cast<const Seq*>(e)->items) f(x);
      break;
    case EK::Dict:
      for (const auto& kv : static_cast<const DictLit*>(e)->items) {
        f(kv.first);
        f(kv.second);
      }
      break;
    default: break;
  }
}

class Parser {
 public:
  Parser(Program& prog, std::vector<Token> toks) : p_(prog), toks_(std::move(toks)) {}

  void parse() {
    p_.body = subparse({});
    if (cur().type != Tok::Eof) fail_at(cur(), "unexpected token");
    check_body(p_.body, false);
    fold_body(p_.body);
  }

 private:
  // ---- token stream ----
  const Token& cur() const { return toks_[i_]; }
  const Token& look() const { return toks_[std::min(i_ + 1, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = toks_[i_];
    if (i_ + 1 < toks_.size()) ++i_;
    return t;
  }
  bool is_name(const Token& t, std::string_view v) const { return t.type == Tok::Name && t.text == v; }
  bool is_op(const Token& t, std::string_view v) const { return t.type == Tok::Op && t.text == v; }
  bool skip_name(std::string_view v) {
    if (!is_name(cur(), v)) return false;
    next();
    return true;
  }
  bool skip_op(std::string_view v) {
    if (!is_op(cur(), v)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::Data: return "template data";
      case Tok::VarBegin: return "begin of print statement";
      case Tok::VarEnd: return "end of print statement";
      case Tok::BlockBegin: return "begin of statement block";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::Name: return "'" + t.text + "'";
      case Tok::String: return "string";
      case Tok::Integer: return "integer";
      case Tok::Float: return "float";
      case Tok::Op: return "'" + t.text + "'";
      case Tok::Eof: return "end of template";
    }
    return "token";
  }

  [[noreturn]] void fail_at(const Token& t, const std::string& msg) const { p_.src.error(t.offset, msg); }
  [[noreturn]] void fail_at(uint32_t off, const std::string& msg) const { p_.src.error(off, msg); }

  void expect_op(std::string_view v) {
    if (!is_op(cur(), v)) fail_at(cur(), "expected '" + std::string(v) + "', got " + describe(cur()));
    next();
  }
  const Token& expect_name() {
    if (cur().type != Tok::Name) fail_at(cur(), "expected name, got " + describe(cur()));
    return next();
  }
  void expect_name(std::string_view v) {
    if (!is_name(cur(), v)) fail_at(cur(), "expected '" + std::string(v) + "', got " + describe(cur()));
    next();
  }
  void expect(Tok t, const char* what) {
    if (cur().type != t) {
      if (cur().type == Tok::Eof) fail_at(cur(), std::string("unexpected end of template, expected ") + what);
      fail_at(cur(), std::string("expected ") + what + ", got " + describe(cur()));
    }
    next();
  }

  // ---- node construction ----
  template <typename T, typename... A>
  T* make(uint32_t off, A&&... a) {
    auto n = std::make_unique<T>(std::forward<A>(a)...);
    n->offset = off;
    T* raw = n.get();
    p_.pool.push_back(std::move(n));
    return raw;
  }
  /// Computes e's subtree height and rejects trees too deep to evaluate safely.
  template <typename T>
  T* done(T* e) {
    int d = 0;
    for_children(e, [&](const Expr* c) { d = std::max<int>(d, c->depth); });
    if (d + 1 > 3 * kMaxParseDepth) fail_at(e->offset, "expression nested too deeply");
    e->depth = static_cast<uint16_t>(d + 1);
    return e;
  }

  struct DepthGuard {
    Parser& p;
    DepthGuard(Parser& pp, uint32_t off) : p(pp) {
      if (++p.depth_ > kMaxParseDepth) p.fail_at(off, "template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  // ---- statements ----
  using EndTags = std::vector<std::string_view>;

  bool at_end_tag(const EndTags& ends) const {
    if (cur().type != Tok::Name) return false;
    return std::find(ends.begin(), ends.end(), cur().text) != ends.end();
  }

  Body subparse(const EndTags& ends) {
    Body body;
    Output* out = nullptr;
    auto flush = [&] { out = nullptr; };
    while (cur().type != Tok::Eof) {
      const Token& t = cur();
      if (t.type == Tok::Data) {
        if (!out) {
          out = make<Output>(t.offset);
          body.push_back(out);
        }
        out->items.push_back({t.text, nullptr});
        next();
      } else if (t.type == Tok::VarBegin) {
        next();
        Expr* e = parse_tuple(false, true, {}, false, false);
        expect(Tok::VarEnd, "end of print statement");
        if (!out) {
          out = make<Output>(t.offset);
          body.push_back(out);
        }
        out->items.push_back({std::string(), e});
      } else if (t.type == Tok::BlockBegin) {
        flush();
        next();
        if (!ends.empty() && at_end_tag(ends)) return body;
        Stmt* s = parse_statement();
        if (s) body.push_back(s);
        expect(Tok::BlockEnd, "end of statement block");
      } else {
        fail_at(t, "unexpected " + describe(t));
      }
    }
    return body;
  }

  std::string open_blocks_hint() const {
    if (tag_stack_.empty()) return "";
    return " (innermost open block: '" + tag_stack_.back().first + "' opened at " +
           p_.src.where(tag_stack_.back().second) + ")";
  }

  Body parse_statements(const EndTags& ends, bool drop_needle) {
    skip_op(":");
    expect(Tok::BlockEnd, "end of statement block");
    Body body = subparse(ends);
    if (cur().type == Tok::Eof) {
      std::string want;
      for (size_t k = 0; k < ends.size(); ++k) want += (k ? " or '" : "'") + std::string(ends[k]) + "'";
      std::string unclosed;
      if (!tag_stack_.empty())
        unclosed = "unclosed '" + tag_stack_.back().first + "' block opened at " + p_.src.where(tag_stack_.back().second) + ": ";
      fail_at(cur(), unclosed + "unexpected end of template, expected " + want);
    }
    if (drop_needle) next();
    return body;
  }

  Stmt* parse_statement() {
    const Token& t = cur();
    if (t.type != Tok::Name) fail_at(t, "tag name expected");
    static const char* unsupported[] = {"extends", "include", "import", "from", "block", "autoescape"};
    for (const char* u : unsupported)
      if (t.text == u) fail_at(t, "unsupported Jinja tag '" + t.text + "'");
    DepthGuard g(*this, t.offset);
    uint32_t tag_open = (i_ > 0 && toks_[i_ - 1].type == Tok::BlockBegin) ? toks_[i_ - 1].offset : t.offset;
    tag_stack_.emplace_back(t.text, tag_open);
    Stmt* s = nullptr;
    const std::string& k = t.text;
    if (k == "for") {
      s = parse_for();
    } else if (k == "if") {
      s = parse_if();
    } else if (k == "set") {
      s = parse_set();
    } else if (k == "macro") {
      s = parse_macro();
    } else if (k == "call") {
      s = parse_call_block();
    } else if (k == "filter") {
      s = parse_filter_block();
    } else if (k == "with") {
      s = parse_with();
    } else if (k == "print") {
      s = parse_print();
    } else if (k == "break" || k == "continue") {
      if (loop_depth_ == 0) fail_at(t, "'" + k + "' outside of a for loop");
      s = make<LoopCtl>(t.offset, k == "break" ? SK::Break : SK::Continue);
      next();
    } else if (k == "generation") {
      uint32_t off = next().offset;
      auto* sc = make<Scope>(off);
      int saved = loop_depth_;
      loop_depth_ = 0;  // the body is a caller macro in transformers: no loop controls inside
      sc->body = parse_statements({"endgeneration"}, true);
      loop_depth_ = saved;
      s = sc;
    } else {
      tag_stack_.pop_back();
      std::string msg = "Encountered unknown tag '" + k + "'";
      if (!end_stack_.empty()) {
        std::string want;
        const auto& ends = end_stack_.back();
        for (size_t j = 0; j < ends.size(); ++j) want += (j ? " or '" : "'") + std::string(ends[j]) + "'";
        msg += ", expected " + want + open_blocks_hint();
      }
      fail_at(t, msg);
    }
    tag_stack_.pop_back();
    return s;
  }

  Body parse_body(const EndTags& ends, bool drop) {
    end_stack_.push_back(ends);
    Body b = parse_statements(ends, drop);
    end_stack_.pop_back();
    return b;
  }

  Stmt* parse_for() {
    uint32_t off = next().offset;
    auto* f = make<For>(off);
    f->target = parse_assign_target(true, false, {"in"}, false);
    expect_name("in");
    f->iter = parse_tuple(false, false, {"recursive"}, false, false);
    if (skip_name("if")) f->filter = parse_expression(true);
    f->recursive = skip_name("recursive");
    ++loop_depth_;
    f->body = parse_body({"endfor", "else"}, false);
    --loop_depth_;
    if (next().text == "endfor") return f;
    f->otherwise = parse_body({"endfor"}, true);
    return f;
  }

  Stmt* parse_if() {
    uint32_t off = next().offset;
    auto* node = make<If>(off);
    while (true) {
      Expr* test = parse_tuple(false, false, {}, false, false);
      Body body = parse_body({"elif", "else", "endif"}, false);
      node->branches.emplace_back(test, std::move(body));
      const Token& t = next();
      if (t.text == "elif") continue;
      if (t.text == "else") node->otherwise = parse_body({"endif"}, true);
      break;
    }
    return node;
  }

  Stmt* parse_set() {
    uint32_t off = next().offset;
    Expr* target = parse_assign_target(true, false, {}, true);
    if (skip_op("=")) {
      auto* s = make<Set>(off);
      s->target = target;
      s->value = parse_tuple(false, true, {}, false, false);
      return s;
    }
    auto* s = make<SetBlock>(off);
    s->target = target;
    if (is_op(cur(), "|")) s->filter = parse_filter(make<Input>(cur().offset), false);
    s->body = parse_body({"endset"}, true);
    return s;
  }

  void parse_signature(MacroDef& def) {
    expect_op("(");
    while (!is_op(cur(), ")")) {
      if (!def.params.empty()) expect_op(",");
      const Token& n = expect_name();
      if (std::find(def.param_names.begin(), def.param_names.end(), n.text) != def.param_names.end())
        fail_at(n, "duplicate argument '" + n.text + "' in macro signature");
      def.params.push_back(p_.intern(n.text));
      def.param_names.push_back(n.text);
      if (skip_op("=")) {
        def.defaults.push_back(parse_expression(true));
      } else if (!def.defaults.empty()) {
        fail_at(n, "non-default argument follows default argument");
      }
    }
    expect_op(")");
  }

  /// Scans a macro body for references to caller / varargs / kwargs.
  void scan_special_names(MacroDef& def) {
    int caller = p_.lookup("caller"), varargs = p_.lookup("varargs"), kwargs = p_.lookup("kwargs");
    if (caller < 0 && varargs < 0 && kwargs < 0) return;
    auto visit_expr = [&](auto&& self, const Expr* e) -> void {
      if (!e) return;
      if (e->kind == EK::Name) {
        int s = static_cast<const Name*>(e)->sym;
        if (s == caller) def.uses_caller = true;
        if (s == varargs) def.uses_varargs = true;
        if (s == kwargs) def.uses_kwargs = true;
      }
      for_children(e, [&](const Expr* c) { self(self, c); });
    };
    auto visit_body = [&](auto&& self, const Body& body) -> void {
      for (const Stmt* s : body) {
        switch (s->kind) {
          case SK::Output:
            for (const auto& it : static_cast<const Output*>(s)->items) visit_expr(visit_expr, it.expr);
            break;
          case SK::If:
            for (const auto& br : static_cast<const If*>(s)->branches) {
              visit_expr(visit_expr, br.first);
              self(self, br.second);
            }
            self(self, static_cast<const If*>(s)->otherwise);
            break;
          case SK::For: {
            auto* f = static_cast<const For*>(s);
            visit_expr(visit_expr, f->iter);
            visit_expr(visit_expr, f->filter);
            self(self, f->body);
            self(self, f->otherwise);
            break;
          }
          case SK::Set: visit_expr(visit_expr, static_cast<const Set*>(s)->value); break;
          case SK::SetBlock:
            visit_expr(visit_expr, static_cast<const SetBlock*>(s)->filter);
            self(self, static_cast<const SetBlock*>(s)->body);
            break;
          case SK::Macro: self(self, static_cast<const Macro*>(s)->def.body); break;
          case SK::CallBlock:
            visit_expr(visit_expr, static_cast<const CallBlock*>(s)->call);
            self(self, static_cast<const CallBlock*>(s)->def.body);
            break;
          case SK::FilterBlock:
            visit_expr(visit_expr, static_cast<const FilterBlock*>(s)->filter);
            self(self, static_cast<const FilterBlock*>(s)->body);
            break;
          case SK::With:
            for (const auto& a : static_cast<const With*>(s)->assigns) visit_expr(visit_expr, a.second);
            self(self, static_cast<const With*>(s)->body);
            break;
          case SK::Scope: self(self, static_cast<const Scope*>(s)->body); break;
          default: break;
        }
      }
    };
    visit_body(visit_body, def.body);
  }

  Body parse_macro_body(const char* end) {
    int saved = loop_depth_;
    loop_depth_ = 0;
    Body b = parse_body({end}, true);
    loop_depth_ = saved;
    return b;
  }

  Stmt* parse_macro() {
    uint32_t off = next().offset;
    auto* m = make<Macro>(off);
    const Token& n = expect_name();
    m->def.name = n.text;
    m->sym = p_.intern(n.text);
    parse_signature(m->def);
    m->def.body = parse_macro_body("endmacro");
    scan_special_names(m->def);
    return m;
  }

  Stmt* parse_call_block() {
    uint32_t off = next().offset;
    auto* c = make<CallBlock>(off);
    c->def.name = "caller";
    if (is_op(cur(), "(")) parse_signature(c->def);
    Expr* e = parse_expression(true);
    if (e->kind != EK::Call) fail_at(off, "expected call");
    c->call = static_cast<Call*>(e);
    c->def.body = parse_macro_body("endcall");
    scan_special_names(c->def);
    return c;
  }

  Stmt* parse_filter_block() {
    uint32_t off = next().offset;
    auto* f = make<FilterBlock>(off);
    f->filter = parse_filter(make<Input>(off), true);
    f->body = parse_body({"endfilter"}, true);
    return f;
  }

  Stmt* parse_with() {
    uint32_t off = next().offset;
    auto* w = make<With>(off);
    while (cur().type != Tok::BlockEnd) {
      if (!w->assigns.empty()) expect_op(",");
      Expr* target = parse_assign_target(true, false, {}, false);
      expect_op("=");
      Expr* value = parse_expression(true);
      w->assigns.emplace_back(target, value);
    }
    w->body = parse_body({"endwith"}, true);
    return w;
  }

  Stmt* parse_print() {
    uint32_t off = next().offset;
    auto* o = make<Output>(off);
    while (cur().type != Tok::BlockEnd) {
      if (!o->items.empty()) expect_op(",");
      o->items.push_back({std::string(), parse_expression(true)});
    }
    return o;
  }

  // ---- assignment targets ----
  static bool can_assign(const Expr* e) {
    if (e->kind == EK::Name || e->kind == EK::NSRef) return true;
    if (e->kind == EK::Tuple) {
      for (const Expr* x : static_cast<const Seq*>(e)->items)
        if (!can_assign(x)) return false;
      return true;
    }
    return false;
  }

  Expr* parse_assign_target(bool with_tuple, bool name_only, const EndTags& extra_end, bool with_namespace) {
    Expr* target;
    if (name_only) {
      const Token& t = expect_name();
      auto* n = make<Name>(t.offset);
      n->sym = p_.intern(t.text);
      target = n;
    } else if (with_tuple) {
      target = parse_tuple(true, true, extra_end, false, with_namespace);
    } else {
      target = parse_primary(with_namespace);
    }
    if (!can_assign(target)) fail_at(target->offset, "can't assign to this expression");
    return target;
  }

  // ---- expressions ----
  bool is_tuple_end(const EndTags& extra) const {
    const Token& t = cur();
    if (t.type == Tok::VarEnd || t.type == Tok::BlockEnd || is_op(t, ")")) return true;
    return !extra.empty() && at_end_tag(extra);
  }

  Expr* parse_tuple(bool simplified, bool with_condexpr, const EndTags& extra_end, bool explicit_parens,
                    bool with_namespace) {
    uint32_t off = cur().offset;
    std::vector<Expr*> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      args.push_back(simplified ? parse_primary(with_namespace) : parse_expression(with_condexpr));
      if (is_op(cur(), ",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!args.empty()) return args[0];
      if (!explicit_parens) fail_at(cur(), "expected an expression, got " + describe(cur()));
    }
    auto* t = make<Seq>(off, EK::Tuple);
    t->items = std::move(args);
    return done(t);
  }

  Expr* parse_expression(bool with_condexpr) {
    DepthGuard g(*this, cur().offset);
    return with_condexpr ? parse_condexpr() : parse_or();
  }

  Expr* parse_condexpr() {
    Expr* e1 = parse_or();
    while (is_name(cur(), "if")) {
      uint32_t off = next().offset;
      Expr* e2 = parse_or();
      Expr* e3 = nullptr;
      if (skip_name("else")) {
        DepthGuard g(*this, off);
        e3 = parse_condexpr();
      }
      auto* c = make<Cond>(off);
      c->test = e2;
      c->then = e1;
      c->otherwise = e3;
      e1 = done(c);
    }
    return e1;
  }

  Expr* parse_or() {
    Expr* left = parse_and();
    while (is_name(cur(), "or")) {
      uint32_t off = next().offset;
      auto* l = make<Logical>(off, EK::Or);
      l->left = left;
      l->right = parse_and();
      left = done(l);
    }
    return left;
  }

  Expr* parse_and() {
    Expr* left = parse_not();
    while (is_name(cur(), "and")) {
      uint32_t off = next().offset;
      auto* l = make<Logical>(off, EK::And);
      l->left = left;
      l->right = parse_not();
      left = done(l);
    }
    return left;
  }

  Expr* parse_not() {
    if (is_name(cur(), "not")) {
      uint32_t off = next().offset;
      DepthGuard g(*this, off);
      auto* u = make<Unary>(off, EK::Not);
      u->operand = parse_not();
      return done(u);
    }
    return parse_compare();
  }

  Expr* parse_compare() {
    uint32_t off = cur().offset;
    Expr* first = parse_math1();
    std::vector<std::pair<CmpOp, Expr*>> ops;
    while (true) {
      const Token& t = cur();
      CmpOp op;
      if (t.type == Tok::Op && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" ||
                                t.text == ">" || t.text == ">=")) {
        op = t.text == "==" ? CmpOp::Eq : t.text == "!=" ? CmpOp::Ne : t.text == "<" ? CmpOp::Lt
             : t.text == "<=" ? CmpOp::Le : t.text == ">" ? CmpOp::Gt : CmpOp::Ge;
        next();
      } else if (is_name(t, "in")) {
        op = CmpOp::In;
        next();
      } else if (is_name(t, "not") && is_name(look(), "in")) {
        op = CmpOp::NotIn;
        next();
        next();
      } else {
        break;
      }
      ops.emplace_back(op, parse_math1());
    }
    if (ops.empty()) return first;
    auto* c = make<Compare>(off);
    c->first = first;
    c->ops = std::move(ops);
    return done(c);
  }

  Expr* binary(uint32_t off, BinOp op, Expr* l, Expr* r) {
    auto* b = make<Binary>(off);
    b->op = op;
    b->left = l;
    b->right = r;
    return done(b);
  }

  Expr* parse_math1() {
    Expr* left = parse_concat();
    while (is_op(cur(), "+") || is_op(cur(), "-")) {
      const Token& t = next();
      BinOp op = t.text == "+" ? BinOp::Add : BinOp::Sub;
      left = binary(t.offset, op, left, parse_concat());
    }
    return left;
  }

  Expr* parse_concat() {
    uint32_t off = cur().offset;
    std::vector<Expr*> parts{parse_math2()};
    while (is_op(cur(), "~")) {
      next();
      parts.push_back(parse_math2());
    }
    if (parts.size() == 1) return parts[0];
    auto* c = make<Concat>(off);
    c->parts = std::move(parts);
    return done(c);
  }

  Expr* parse_math2() {
    Expr* left = parse_pow();
    while (is_op(cur(), "*") || is_op(cur(), "/") || is_op(cur(), "//") || is_op(cur(), "%")) {
      const Token& t = next();
      BinOp op = t.text == "*" ? BinOp::Mul : t.text == "/" ? BinOp::Div : t.text == "//" ? BinOp::FloorDiv
                                                                                        : BinOp::Mod;
      left = binary(t.offset, op, left, parse_pow());
    }
    return left;
  }

  Expr* parse_pow() {
    Expr* left = parse_unary(true);
    while (is_op(cur(), "**")) {
      const Token& t = next();
      left = binary(t.offset, BinOp::Pow, left, parse_unary(true));
    }
    return left;
  }

  Expr* parse_unary(bool with_filter) {
    const Token& t = cur();
    Expr* node;
    if (is_op(t, "-") || is_op(t, "+")) {
      uint32_t off = next().offset;
      DepthGuard g(*this, off);
      auto* u = make<Unary>(off, t.text == "-" ? EK::Neg : EK::Pos);
      u->operand = parse_unary(false);
      node = done(u);
    } else {
      node = parse_primary(false);
    }
    node = parse_postfix(node);
    if (with_filter) node = parse_filter_expr(node);
    return node;
  }

  Expr* parse_primary(bool with_namespace) {
    const Token& t = cur();
    if (t.type == Tok::Name) {
      next();
      if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
        auto* c = make<Const>(t.offset);
        c->value = Value::boolean(t.text == "true" || t.text == "True");
        return c;
      }
      if (t.text == "none" || t.text == "None") {
        auto* c = make<Const>(t.offset);
        c->value = Value::none();
        return c;
      }
      if (with_namespace && is_op(cur(), ".")) {
        next();
        const Token& attr = expect_name();
        auto* r = make<NSRef>(t.offset);
        r->sym = p_.intern(t.text);
        r->attr = attr.text;
        return r;
      }
      auto* n = make<Name>(t.offset);
      n->sym = p_.intern(t.text);
      return n;
    }
    if (t.type == Tok::String) {
      std::string buf;
      uint32_t off = t.offset;
      while (cur().type == Tok::String) buf += next().text;
      auto* c = make<Const>(off);
      c->value = Value::string(std::move(buf));
      return c;
    }
    if (t.type == Tok::Integer || t.type == Tok::Float) {
      next();
      auto* c = make<Const>(t.offset);
      c->value = t.type == Tok::Integer ? Value::integer(t.ival) : Value::number(t.fval);
      return c;
    }
    if (is_op(t, "(")) {
      next();
      DepthGuard g(*this, t.offset);
      Expr* e = parse_tuple(false, true, {}, true, false);
      expect_op(")");
      return e;
    }
    if (is_op(t, "[")) return parse_list();
    if (is_op(t, "{")) return parse_dict();
    if (t.type == Tok::Eof) fail_at(t, "unexpected end of template");
    fail_at(t, "unexpected " + describe(t));
  }

  Expr* parse_list() {
    uint32_t off = next().offset;
    DepthGuard g(*this, off);
    auto* l = make<Seq>(off, EK::List);
    while (!is_op(cur(), "]")) {
      if (!l->items.empty()) expect_op(",");
      if (is_op(cur(), "]")) break;
      l->items.push_back(parse_expression(true));
    }
    expect_op("]");
    return done(l);
  }

  Expr* parse_dict() {
    uint32_t off = next().offset;
    DepthGuard g(*this, off);
    auto* d = make<DictLit>(off);
    while (!is_op(cur(), "}")) {
      if (!d->items.empty()) expect_op(",");
      if (is_op(cur(), "}")) break;
      Expr* k = parse_expression(true);
      expect_op(":");
      Expr* v = parse_expression(true);
      d->items.emplace_back(k, v);
    }
    expect_op("}");
    return done(d);
  }

  Expr* parse_postfix(Expr* node) {
    while (true) {
      if (is_op(cur(), ".") || is_op(cur(), "[")) {
        node = parse_subscript(node);
      } else if (is_op(cur(), "(")) {
        node = parse_call(node);
      } else {
        return node;
      }
    }
  }

  Expr* parse_filter_expr(Expr* node) {
    while (true) {
      if (is_op(cur(), "|")) {
        node = parse_filter(node, false);
      } else if (is_name(cur(), "is")) {
        node = parse_test(node);
      } else if (is_op(cur(), "(")) {
        node = parse_call(node);
      } else {
        return node;
      }
    }
  }

  Expr* parse_subscript(Expr* node) {
    const Token& t = next();
    if (t.text == ".") {
      const Token& a = next();
      if (a.type == Tok::Name) {
        auto* g = make<Getattr>(t.offset);
        g->obj = node;
        g->attr = a.text;
        return done(g);
      }
      if (a.type != Tok::Integer) fail_at(a, "expected name or number");
      auto* c = make<Const>(a.offset);
      c->value = Value::integer(a.ival);
      auto* g = make<Getitem>(t.offset);
      g->obj = node;
      g->index = c;
      return done(g);
    }
    DepthGuard dg(*this, t.offset);
    std::vector<Expr*> args;
    while (!is_op(cur(), "]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto* g = make<Getitem>(t.offset);
    g->obj = node;
    if (args.size() == 1) {
      g->index = args[0];
    } else {
      auto* tup = make<Seq>(t.offset, EK::Tuple);
      tup->items = std::move(args);
      g->index = done(tup);
    }
    return done(g);
  }

  Expr* parse_subscribed() {
    uint32_t off = cur().offset;
    Expr* parts[3] = {nullptr, nullptr, nullptr};
    if (is_op(cur(), ":")) {
      next();
    } else {
      Expr* e = parse_expression(true);
      if (!is_op(cur(), ":")) return e;
      next();
      parts[0] = e;
    }
    if (!is_op(cur(), ":") && !is_op(cur(), "]") && !is_op(cur(), ",")) parts[1] = parse_expression(true);
    if (is_op(cur(), ":")) {
      next();
      if (!is_op(cur(), "]") && !is_op(cur(), ",")) parts[2] = parse_expression(true);
    }
    auto* s = make<Slice>(off);
    s->start = parts[0];
    s->stop = parts[1];
    s->step = parts[2];
    return done(s);
  }

  Args parse_call_args() {
    const Token& open = cur();
    expect_op("(");
    DepthGuard g(*this, open.offset);
    Args a;
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) fail_at(open, "invalid syntax for function call expression");
    };
    while (!is_op(cur(), ")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(cur(), ")")) break;
      }
      if (is_op(cur(), "*")) {
        ensure(!a.dyn_args && !a.dyn_kwargs);
        next();
        a.dyn_args = parse_expression(true);
      } else if (is_op(cur(), "**")) {
        ensure(!a.dyn_kwargs);
        next();
        a.dyn_kwargs = parse_expression(true);
      } else if (cur().type == Tok::Name && is_op(look(), "=")) {
        ensure(!a.dyn_kwargs);
        std::string key = next().text;
        next();
        a.kw.emplace_back(key, parse_expression(true));
      } else {
        ensure(!a.dyn_args && !a.dyn_kwargs && a.kw.empty());
        a.pos.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
    return a;
  }

  Expr* parse_call(Expr* node) {
    uint32_t off = cur().offset;
    auto* c = make<Call>(off);
    c->callee = node;
    c->args = parse_call_args();
    return done(c);
  }

  std::string dotted_name() {
    std::string name = expect_name().text;
    while (is_op(cur(), ".")) {
      next();
      name += "." + expect_name().text;
    }
    return name;
  }

  Expr* parse_filter(Expr* node, bool start_inline) {
    while (is_op(cur(), "|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      uint32_t off = cur().offset;
      auto* f = make<Filter>(off);
      f->name = dotted_name();
      f->fn = find_filter(f->name);  // unknown names are checked by check_names()
      f->arg = node;
      if (is_op(cur(), "(")) f->args = parse_call_args();
      node = done(f);
    }
    return node;
  }

  Expr* parse_test(Expr* node) {
    uint32_t off = next().offset;
    bool negated = skip_name("not");
    uint32_t name_off = cur().offset;
    auto* t = make<Test>(off);
    t->name = dotted_name();
    t->fn = find_test(t->name);  // unknown names are checked by check_names()
    (void)name_off;
    t->arg = node;
    const Token& c = cur();
    if (is_op(c, "(")) {
      t->args = parse_call_args();
    } else if ((c.type == Tok::Name || c.type == Tok::String || c.type == Tok::Integer || c.type == Tok::Float ||
                is_op(c, "[") || is_op(c, "{")) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
      if (is_name(c, "is")) fail_at(c, "You cannot chain multiple tests with is");
      Expr* arg = parse_postfix(parse_primary(false));
      t->args.pos.push_back(arg);
    }
    Expr* result = done(t);
    if (negated) {
      auto* u = make<Unary>(off, EK::Not);
      u->operand = result;
      result = done(u);
    }
    return result;
  }

  /// Whether jinja2's optimizer could fold e to a constant (as_const() not Impossible).
  static bool is_const(const Expr* e) {
    switch (e->kind) {
      case EK::Const: return true;
      case EK::Name:
      case EK::Call:
      case EK::NSRef:
      case EK::Input: return false;
      case EK::Cond:
        if (!static_cast<const Cond*>(e)->otherwise) return false;
        break;
      case EK::Filter: {
        auto* f = static_cast<const Filter*>(e);
        if (f->fn < 0 || f->args.dyn_args || f->args.dyn_kwargs) return false;
        static const char* const context_filters[] = {"map", "select", "reject", "selectattr", "rejectattr"};
        for (const char* n : context_filters)
          if (f->name == n) return false;
        break;
      }
      case EK::Test: {
        auto* t = static_cast<const Test*>(e);
        if (t->fn < 0 || t->args.dyn_args || t->args.dyn_kwargs) return false;
        break;
      }
      default: break;
    }
    bool all = true;
    for_children(e, [&](const Expr* c) { all = all && is_const(c); });
    return all;
  }

  // ---- constant folding of slices ----
  // jinja2 folds constant expressions at compile time. A failing slice of a constant (say
  // `(2.5)[1:]`) evaluates to Undefined while folding instead of raising; the fold sticks when
  // the whole {{ }} expression is constant or when a constant ancestor (a test, comparison,
  // `not`, `~` or filter) turns the result into a plain value. Elsewhere the slice raises.
  void fold_expr(Expr* e, bool ok) {
    if (!e) return;
    bool c = is_const(e);
    if (e->kind == EK::Getitem && static_cast<Getitem*>(e)->index->kind == EK::Slice && c && ok)
      static_cast<Getitem*>(e)->folded = true;
    bool safe_result = e->kind == EK::Test || e->kind == EK::Not || e->kind == EK::Compare ||
                       e->kind == EK::Concat || e->kind == EK::Filter;
    bool child_ok = c && (ok || safe_result);
    for_children(e, [&](const Expr* ch) { fold_expr(const_cast<Expr*>(ch), child_ok); });
  }

  void fold_body(const Body& body) {
    auto args = [&](const Args& a) {
      for (Expr* x : a.pos) fold_expr(x, false);
      for (const auto& kv : a.kw) fold_expr(kv.second, false);
    };
    for (const Stmt* st : body) {
      switch (st->kind) {
        case SK::Output:
          for (const auto& it : static_cast<const Output*>(st)->items)
            if (it.expr) fold_expr(it.expr, is_const(it.expr));
          break;
        case SK::If:
          for (const auto& br : static_cast<const If*>(st)->branches) {
            fold_expr(br.first, false);
            fold_body(br.second);
          }
          fold_body(static_cast<const If*>(st)->otherwise);
          break;
        case SK::For: {
          auto* f = static_cast<const For*>(st);
          fold_expr(f->iter, false);
          fold_expr(f->filter, false);
          fold_body(f->body);
          fold_body(f->otherwise);
          break;
        }
        case SK::Set: fold_expr(static_cast<const Set*>(st)->value, false); break;
        case SK::SetBlock:
          fold_expr(static_cast<const SetBlock*>(st)->filter, false);
          fold_body(static_cast<const SetBlock*>(st)->body);
          break;
        case SK::Macro:
          for (Expr* d : static_cast<const Macro*>(st)->def.defaults) fold_expr(d, false);
          fold_body(static_cast<const Macro*>(st)->def.body);
          break;
        case SK::CallBlock: {
          auto* cb = static_cast<const CallBlock*>(st);
          fold_expr(cb->call->callee, false);
          args(cb->call->args);
          for (Expr* d : cb->def.defaults) fold_expr(d, false);
          fold_body(cb->def.body);
          break;
        }
        case SK::FilterBlock:
          fold_expr(static_cast<const FilterBlock*>(st)->filter, false);
          fold_body(static_cast<const FilterBlock*>(st)->body);
          break;
        case SK::With:
          for (const auto& a : static_cast<const With*>(st)->assigns) fold_expr(a.second, false);
          fold_body(static_cast<const With*>(st)->body);
          break;
        case SK::Scope: fold_body(static_cast<const Scope*>(st)->body); break;
        default: break;
      }
    }
  }

  // ---- unknown filters / tests ----
  // jinja2 rejects unknown filters and tests when compiling, except inside if-statements and
  // conditional expressions ("soft" frames), where the error is deferred to runtime.
  void check_expr(const Expr* e, bool soft) {
    if (!e) return;
    if (e->kind == EK::Filter) {
      auto* f = static_cast<const Filter*>(e);
      if (f->fn < 0 && !soft) fail_at(f->offset, "no filter named '" + f->name + "'");
    } else if (e->kind == EK::Test) {
      auto* t = static_cast<const Test*>(e);
      if (t->fn < 0 && !soft) fail_at(t->offset, "no test named '" + t->name + "'");
    } else if (e->kind == EK::Cond) {
      soft = true;
    }
    for_children(e, [&](const Expr* c) { check_expr(c, soft); });
  }

  void check_body(const Body& body, bool soft) {
    for (const Stmt* s : body) {
      switch (s->kind) {
        case SK::Output:
          for (const auto& it : static_cast<const Output*>(s)->items) check_expr(it.expr, soft);
          break;
        case SK::If:
          for (const auto& br : static_cast<const If*>(s)->branches) {
            check_expr(br.first, true);
            check_body(br.second, true);
          }
          check_body(static_cast<const If*>(s)->otherwise, true);
          break;
        case SK::For: {
          auto* f = static_cast<const For*>(s);
          check_expr(f->iter, soft);
          check_expr(f->filter, false);
          check_body(f->body, false);
          check_body(f->otherwise, false);
          break;
        }
        case SK::Set: check_expr(static_cast<const Set*>(s)->value, soft); break;
        case SK::SetBlock:
          check_expr(static_cast<const SetBlock*>(s)->filter, false);
          check_body(static_cast<const SetBlock*>(s)->body, false);
          break;
        case SK::Macro:
          for (const Expr* d : static_cast<const Macro*>(s)->def.defaults) check_expr(d, false);
          check_body(static_cast<const Macro*>(s)->def.body, false);
          break;
        case SK::CallBlock:
          check_expr(static_cast<const CallBlock*>(s)->call, soft);
          for (const Expr* d : static_cast<const CallBlock*>(s)->def.defaults) check_expr(d, false);
          check_body(static_cast<const CallBlock*>(s)->def.body, false);
          break;
        case SK::FilterBlock:
          check_expr(static_cast<const FilterBlock*>(s)->filter, false);
          check_body(static_cast<const FilterBlock*>(s)->body, false);
          break;
        case SK::With:
          for (const auto& a : static_cast<const With*>(s)->assigns) check_expr(a.second, soft);
          check_body(static_cast<const With*>(s)->body, false);
          break;
        case SK::Scope: check_body(static_cast<const Scope*>(s)->body, false); break;
        default: break;
      }
    }
  }

  Program& p_;
  std::vector<Token> toks_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<std::pair<std::string, uint32_t>> tag_stack_;
  std::vector<EndTags> end_stack_;
};

}  // namespace

std::unique_ptr<Program> parse_program(std::string_view source, const std::string& label) {
  auto prog = std::make_unique<Program>();
  prog->src.label = label;
  prog->src.text = normalize_source(source);
  Parser(*prog, tokenize(prog->src)).parse();
  return prog;
}

}  // namespace spool::tmpl
