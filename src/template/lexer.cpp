// Jinja2-compatible lexer; see lexer.h. Mirrors jinja2/lexer.py rule by rule.
#include "template/lexer.h"

#include <cerrno>
#include <cstdlib>

#include "common/error.h"
#include "template/pystr.h"

namespace spool::tmpl {

std::string SourceInfo::where(uint32_t offset) const {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return strfmt("line %zu, column %zu", line, col);
}

void SourceInfo::error(uint32_t offset, const std::string& msg) const {
  throw Error("template '" + label + "': " + msg + " at " + where(offset));
}

std::string normalize_source(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    char c = source[i];
    if (c == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(c);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

namespace {

class Lexer {
 public:
  explicit Lexer(const SourceInfo& src) : src_(src), s_(src.text), n_(s_.size()) {}

  std::vector<Token> run() {
    if (n_ > UINT32_MAX / 2) fail("template '%s' is too large", src_.label.c_str());
    while (pos_ < n_) root();
    push(Tok::Eof, "", static_cast<uint32_t>(n_));
    return std::move(toks_);
  }

 private:
  enum class TagKind { Var, Block, Comment, Raw };

  void push(Tok t, std::string text, uint32_t off) {
    Token tok;
    tok.type = t;
    tok.text = std::move(text);
    tok.offset = off;
    toks_.push_back(std::move(tok));
  }

  /// Length of Python-regex \s* at p (Unicode whitespace).
  size_t ws_len(size_t p) const {
    size_t i = p;
    while (i < n_) {
      size_t j = i;
      if (!py::is_space(py::decode_at(s_, j))) break;
      i = j;
    }
    return i - p;
  }

  bool starts(size_t p, std::string_view lit) const { return s_.compare(p, lit.size(), lit) == 0; }

  /// Applies jinja2's OptionalLStrip to the data before a tag.
  std::string strip_data(std::string_view text, char sign, bool is_var) const {
    if (sign == '-') return py::strip(text, std::nullopt, false, true);
    if (sign != '+' && !is_var) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
      if (l_pos > 0 || line_starting_) {
        std::string_view tail = text.substr(l_pos);
        if (!tail.empty() && ws_len_view(tail) == tail.size()) return std::string(text.substr(0, l_pos));
      }
    }
    return std::string(text);
  }

  static size_t ws_len_view(std::string_view t) {
    size_t i = 0;
    while (i < t.size()) {
      size_t j = i;
      if (!py::is_space(py::decode_at(t, j))) break;
      i = j;
    }
    return i;
  }

  /// Matches `{%[-+]?\s*raw\s*(-%}\s*|%})` at p; returns the end or 0.
  size_t match_raw_begin(size_t p, char* sign) const {
    size_t i = p + 2;
    *sign = 0;
    if (i < n_ && (s_[i] == '-' || s_[i] == '+')) *sign = s_[i++];
    i += ws_len(i);
    if (!starts(i, "raw")) return 0;
    i += 3;
    i += ws_len(i);
    if (starts(i, "-%}")) return i + 3 + ws_len(i + 3);
    if (starts(i, "%}")) return i + 2;
    return 0;
  }

  void root() {
    size_t p = pos_;
    while (true) {
      p = s_.find('{', p);
      if (p == std::string_view::npos || p + 1 >= n_) {
        // trailing data
        push(Tok::Data, std::string(s_.substr(pos_)), static_cast<uint32_t>(pos_));
        pos_ = n_;
        return;
      }
      char c = s_[p + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++p;
    }
    char raw_sign = 0;
    size_t raw_end = s_[p + 1] == '%' ? match_raw_begin(p, &raw_sign) : 0;
    TagKind kind = raw_end ? TagKind::Raw
                   : s_[p + 1] == '{' ? TagKind::Var
                   : s_[p + 1] == '%' ? TagKind::Block
                                      : TagKind::Comment;
    char sign = 0;
    size_t after = p + 2;
    if (kind == TagKind::Raw) {
      sign = raw_sign;
    } else if (after < n_ && (s_[after] == '-' || s_[after] == '+')) {
      sign = s_[after++];
    }
    std::string data = strip_data(s_.substr(pos_, p - pos_), sign, kind == TagKind::Var);
    if (!data.empty()) push(Tok::Data, std::move(data), static_cast<uint32_t>(pos_));
    line_starting_ = false;
    switch (kind) {
      case TagKind::Raw:
        line_starting_ = s_[raw_end - 1] == '\n';
        pos_ = raw_end;
        raw_body(p);
        return;
      case TagKind::Comment:
        pos_ = after;
        comment(p);
        return;
      case TagKind::Block:
        push(Tok::BlockBegin, "", static_cast<uint32_t>(p));
        pos_ = after;
        tag(false);
        return;
      case TagKind::Var:
        push(Tok::VarBegin, "", static_cast<uint32_t>(p));
        pos_ = after;
        tag(true);
        return;
    }
  }

  void comment(size_t begin) {
    size_t q = pos_;
    while (true) {
      q = s_.find("#}", q);
      if (q == std::string_view::npos) src_.error(static_cast<uint32_t>(begin), "Missing end of comment tag");
      if (q > pos_ && s_[q - 1] == '-') {
        pos_ = q + 2 + ws_len(q + 2);
      } else if (q > pos_ && s_[q - 1] == '+') {
        pos_ = q + 2;
      } else {
        pos_ = q + 2;
        if (pos_ < n_ && s_[pos_] == '\n') ++pos_;  // trim_blocks
      }
      break;
    }
    line_starting_ = s_[pos_ - 1] == '\n';
  }

  void raw_body(size_t begin) {
    size_t q = pos_;
    while (true) {
      q = s_.find("{%", q);
      if (q == std::string_view::npos) src_.error(static_cast<uint32_t>(begin), "Missing end of raw directive");
      size_t i = q + 2;
      char sign = 0;
      if (i < n_ && (s_[i] == '-' || s_[i] == '+')) sign = s_[i++];
      i += ws_len(i);
      if (!starts(i, "endraw")) {
        ++q;
        continue;
      }
      i += 6;
      i += ws_len(i);
      size_t end = 0;
      if (starts(i, "+%}")) {
        end = i + 3;
      } else if (starts(i, "-%}")) {
        end = i + 3 + ws_len(i + 3);
      } else if (starts(i, "%}")) {
        end = i + 2;
        if (end < n_ && s_[end] == '\n') ++end;
      } else {
        ++q;
        continue;
      }
      std::string data = strip_data(s_.substr(pos_, q - pos_), sign, false);
      if (!data.empty()) push(Tok::Data, std::move(data), static_cast<uint32_t>(pos_));
      pos_ = end;
      line_starting_ = s_[end - 1] == '\n';
      return;
    }
  }

  static bool is_digit(char c) { return c >= '0' && c <= '9'; }
  static bool is_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
  }
  static bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

  /// Matches `(\d+_)*\d+` at p; returns end or p when no match.
  size_t digits_us(size_t p) const {
    if (p >= n_ || !is_digit(s_[p])) return p;
    size_t i = p;
    while (true) {
      while (i < n_ && is_digit(s_[i])) ++i;
      if (i + 1 < n_ && s_[i] == '_' && is_digit(s_[i + 1])) {
        ++i;
        continue;
      }
      return i;
    }
  }

  /// Float literal per jinja2's float_re; returns end or 0.
  size_t match_float(size_t p) const {
    if (p > 0 && s_[p - 1] == '.') return 0;
    size_t e1 = digits_us(p);
    if (e1 == p) return 0;
    size_t e2 = e1;
    if (e1 < n_ && s_[e1] == '.') {
      size_t f = digits_us(e1 + 1);
      if (f > e1 + 1) e2 = f;
    }
    if (e2 < n_ && (s_[e2] == 'e' || s_[e2] == 'E')) {
      size_t x = e2 + 1;
      if (x < n_ && (s_[x] == '+' || s_[x] == '-')) ++x;
      size_t xe = digits_us(x);
      if (xe > x) return xe;
    }
    return e2 > e1 ? e2 : 0;
  }

  /// Integer literal per jinja2's integer_re; returns end or 0, sets base.
  size_t match_int(size_t p, int* base) const {
    if (p >= n_ || !is_digit(s_[p])) return 0;
    auto prefixed = [&](char lo, auto ok) -> size_t {
      if (s_[p] != '0' || p + 1 >= n_ || (s_[p + 1] | 0x20) != lo) return 0;
      size_t i = p + 2, last = 0;
      while (i < n_) {
        size_t j = i;
        if (s_[j] == '_') ++j;
        if (j < n_ && ok(s_[j])) {
          i = j + 1;
          last = i;
        } else {
          break;
        }
      }
      return last;
    };
    size_t e;
    if ((e = prefixed('b', [](char c) { return c == '0' || c == '1'; }))) {
      *base = 2;
      return e;
    }
    if ((e = prefixed('o', [](char c) { return c >= '0' && c <= '7'; }))) {
      *base = 8;
      return e;
    }
    if ((e = prefixed('x', [](char c) { return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); }))) {
      *base = 16;
      return e;
    }
    *base = 10;
    char want_any = s_[p] != '0';
    size_t i = p + 1;
    while (i < n_) {
      size_t j = i;
      if (s_[j] == '_') ++j;
      if (j < n_ && (want_any ? is_digit(s_[j]) : s_[j] == '0')) {
        i = j + 1;
      } else {
        break;
      }
    }
    return i;
  }

  /// String literal at p (quote char at p); returns end or 0 when unterminated.
  size_t match_string(size_t p) const {
    char q = s_[p];
    size_t i = p + 1;
    while (i < n_) {
      if (s_[i] == '\\') {
        if (i + 1 >= n_) return 0;
        i += 2;
        continue;
      }
      if (s_[i] == q) return i + 1;
      ++i;
    }
    return 0;
  }

  void tag(bool is_var) {
    std::vector<char> balance;
    while (true) {
      if (pos_ >= n_) return;  // parser reports the unexpected end
      if (balance.empty()) {
        size_t end = 0;
        if (is_var) {
          if (starts(pos_, "-}}")) {
            end = pos_ + 3 + ws_len(pos_ + 3);
          } else if (starts(pos_, "}}")) {
            end = pos_ + 2;
          }
        } else {
          if (starts(pos_, "+%}")) {
            end = pos_ + 3;
          } else if (starts(pos_, "-%}")) {
            end = pos_ + 3 + ws_len(pos_ + 3);
          } else if (starts(pos_, "%}")) {
            end = pos_ + 2;
            if (end < n_ && s_[end] == '\n') ++end;
          }
        }
        if (end) {
          push(is_var ? Tok::VarEnd : Tok::BlockEnd, "", static_cast<uint32_t>(pos_));
          line_starting_ = s_[end - 1] == '\n';
          pos_ = end;
          return;
        }
      }
      size_t w = ws_len(pos_);
      if (w) {
        pos_ += w;
        continue;
      }
      uint32_t off = static_cast<uint32_t>(pos_);
      char c = s_[pos_];
      if (size_t e = match_float(pos_)) {
        std::string t;
        for (size_t i = pos_; i < e; ++i)
          if (s_[i] != '_') t.push_back(s_[i]);
        push(Tok::Float, t, off);
        toks_.back().fval = std::strtod(t.c_str(), nullptr);
        pos_ = e;
        continue;
      }
      int base = 10;
      if (size_t e = match_int(pos_, &base)) {
        std::string t;
        for (size_t i = pos_ + (base == 10 ? 0 : 2); i < e; ++i)
          if (s_[i] != '_') t.push_back(s_[i]);
        errno = 0;
        char* endp = nullptr;
        unsigned long long v = std::strtoull(t.c_str(), &endp, base);
        if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX))
          src_.error(off, "integer literal too large");
        push(Tok::Integer, std::string(s_.substr(pos_, e - pos_)), off);
        toks_.back().ival = static_cast<int64_t>(v);
        pos_ = e;
        continue;
      }
      if (is_name_start(c)) {
        size_t e = pos_ + 1;
        while (e < n_ && is_name_char(s_[e])) ++e;
        push(Tok::Name, std::string(s_.substr(pos_, e - pos_)), off);
        pos_ = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        if (size_t e = match_string(pos_)) {
          std::string body;
          try {
            body = py::unescape_literal(s_.substr(pos_ + 1, e - pos_ - 2));
          } catch (const Error& err) {
            src_.error(off, err.what());
          }
          push(Tok::String, std::move(body), off);
          pos_ = e;
          continue;
        }
      }
      static const char* two[] = {"**", "//", "==", "!=", ">=", "<="};
      std::string op;
      for (const char* t : two)
        if (starts(pos_, t)) op = t;
      if (op.empty() && std::string_view("+-/*%~[](){}><=.:|,;").find(c) != std::string_view::npos) op = c;
      if (op.empty()) {
        std::string shown;
        py::repr_str(shown, s_.substr(pos_, 1));
        src_.error(off, "unexpected char " + shown);
      }
      if (op == "{" || op == "(" || op == "[") {
        balance.push_back(op == "{" ? '}' : op == "(" ? ')' : ']');
      } else if (op == "}" || op == ")" || op == "]") {
        if (balance.empty()) src_.error(off, "unexpected '" + op + "'");
        char want = balance.back();
        balance.pop_back();
        if (want != op[0]) src_.error(off, "unexpected '" + op + "', expected '" + std::string(1, want) + "'");
      }
      push(Tok::Op, op, off);
      pos_ += op.size();
    }
  }

  const SourceInfo& src_;
  std::string_view s_;
  size_t n_;
  size_t pos_ = 0;
  bool line_starting_ = true;
  std::vector<Token> toks_;
};

}  // namespace

std::vector<Token> tokenize(const SourceInfo& src) { return Lexer(src).run(); }

}  // namespace spool::tmpl
