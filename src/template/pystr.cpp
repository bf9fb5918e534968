// Python str semantics on UTF-8 strings; see pystr.h.
#include "template/pystr.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "common/error.h"
#include "common/json_string.h"
#include "common/utf8.h"
#include "template/value.h"

namespace spool::tmpl::py {

namespace {

/// Decodes one code point at s[i], advancing i (surrogateescape on invalid bytes).
char32_t next_cp(std::string_view s, size_t& i) { return utf8::next_escaped(s, i); }

/// Byte length of the code point starting at s[i].
size_t cp_bytes(std::string_view s, size_t i) {
  size_t j = i;
  next_cp(s, j);
  return j - i;
}

utf8proc_category_t category(char32_t c) {
  if (c > 0x10FFFF) return UTF8PROC_CATEGORY_CN;
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

bool is_alpha_cp(char32_t c) {
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT ||
         k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO;
}
bool is_decimal_cp(char32_t c) { return category(c) == UTF8PROC_CATEGORY_ND; }
bool is_digit_cp(char32_t c) {
  // Python isdigit: Numeric_Type Decimal or Digit; approximate with Nd plus superscripts.
  if (is_decimal_cp(c)) return true;
  return c == 0xB2 || c == 0xB3 || c == 0xB9 || (c >= 0x2070 && c <= 0x2079 && c != 0x2071 && c != 0x2072 && c != 0x2073) ||
         (c >= 0x2080 && c <= 0x2089) || (c >= 0x2460 && c <= 0x2468) || (c >= 0x2474 && c <= 0x247C) ||
         (c >= 0x2488 && c <= 0x2490) || (c >= 0x24F5 && c <= 0x24FD) || c == 0x24EA || c == 0x24FF ||
         (c >= 0x2776 && c <= 0x277E) || (c >= 0x2780 && c <= 0x2788) || (c >= 0x278A && c <= 0x2792);
}
bool is_numeric_cp(char32_t c) {
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_ND || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO ||
         is_digit_cp(c);
}
bool is_upper_cp(char32_t c) { return category(c) == UTF8PROC_CATEGORY_LU; }
bool is_lower_cp(char32_t c) { return category(c) == UTF8PROC_CATEGORY_LL; }
bool is_title_cp(char32_t c) { return category(c) == UTF8PROC_CATEGORY_LT; }

/// Unconditional multi-character case mappings of Unicode SpecialCasing.txt (the ones
/// Python applies in str.upper/lower/title that simple mappings miss).
struct Special {
  char32_t cp;
  const char* lower;
  const char* title;
  const char* upper;
};
const Special kSpecial[] = {
    {0x00DF, nullptr, "Ss", "SS"},
    {0x0130, "i\xCC\x87", nullptr, nullptr},
    {0x0149, nullptr, "\xCA\xBCN", "\xCA\xBCN"},
    {0x01F0, nullptr, "J\xCC\x8C", "J\xCC\x8C"},
    {0x0587, nullptr, "\xD4\xB5\xD6\x82", "\xD4\xB5\xD5\x92"},
    {0x1E96, nullptr, "H\xCC\xB1", "H\xCC\xB1"},
    {0x1E97, nullptr, "T\xCC\x88", "T\xCC\x88"},
    {0x1E98, nullptr, "W\xCC\x8A", "W\xCC\x8A"},
    {0x1E99, nullptr, "Y\xCC\x8A", "Y\xCC\x8A"},
    {0x1E9A, nullptr, "A\xCA\xBE", "A\xCA\xBE"},
    {0xFB00, nullptr, "Ff", "FF"},
    {0xFB01, nullptr, "Fi", "FI"},
    {0xFB02, nullptr, "Fl", "FL"},
    {0xFB03, nullptr, "Ffi", "FFI"},
    {0xFB04, nullptr, "Ffl", "FFL"},
    {0xFB05, nullptr, "St", "ST"},
    {0xFB06, nullptr, "St", "ST"},
};

/// Appends the full case mapping of c (kind: 'l', 't' or 'u').
void append_cased(std::string& out, char32_t c, char kind) {
  if (c >= 0xDF) {
    for (const Special& sp : kSpecial) {
      if (sp.cp != c) continue;
      const char* m = kind == 'l' ? sp.lower : kind == 't' ? sp.title : sp.upper;
      if (m) {
        out += m;
        return;
      }
      break;
    }
  }
  append_utf8(out, kind == 'l' ? to_lower(c) : kind == 't' ? to_title(c) : to_upper(c));
}

/// Maps each code point through a full case mapping chosen per character.
template <typename F>
std::string map_case(std::string_view s, F kind_of) {
  add_work(s.size() / 16);
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    char32_t c = next_cp(s, i);
    char k = kind_of(c);
    if (k == 0) {
      append_utf8(out, c);
    } else {
      append_cased(out, c, k);
    }
  }
  return out;
}

template <typename F>
std::string map_cps(std::string_view s, F f) {
  add_work(s.size() / 16);
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      out.push_back(static_cast<char>(f(static_cast<char32_t>(b))));
      ++i;
      continue;
    }
    append_utf8(out, f(next_cp(s, i)));
  }
  return out;
}

}  // namespace

char32_t decode_at(std::string_view s, size_t& i) { return next_cp(s, i); }

std::u32string decode(std::string_view s) {
  add_work(s.size() / 16);
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) out.push_back(next_cp(s, i));
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {
    out.push_back(static_cast<char>(cp - 0xDC00));  // surrogateescape: the original byte
  } else {
    utf8::append_codepoint(cp > 0x10FFFF ? 0xFFFD : cp, out);
  }
}

std::string encode(const char32_t* first, const char32_t* last) {
  std::string out;
  out.reserve(static_cast<size_t>(last - first));
  for (; first != last; ++first) append_utf8(out, *first);
  return out;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

size_t length(std::string_view s) {
  add_work(s.size() / 16);
  size_t n = 0, i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
    } else {
      next_cp(s, i);
    }
    ++n;
  }
  return n;
}

bool is_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_cased(char32_t c) { return is_upper_cp(c) || is_lower_cp(c) || is_title_cp(c); }

bool is_printable(char32_t c) {
  if (c == ' ') return true;
  switch (category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

char32_t to_upper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c > 0x10FFFF || c == 0xDF) return c;  // utf8proc maps U+00DF to U+1E9E; Unicode does not
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c > 0x10FFFF) return c;
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
char32_t to_title(char32_t c) {
  if (c < 0x80) return to_upper(c);
  if (c > 0x10FFFF) return c;
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}

std::string upper(std::string_view s) {
  if (is_ascii(s)) return map_cps(s, to_upper);
  return map_case(s, [](char32_t) { return 'u'; });
}
std::string lower(std::string_view s) {
  if (is_ascii(s)) return map_cps(s, to_lower);
  return map_case(s, [](char32_t) { return 'l'; });
}
std::string swapcase(std::string_view s) {
  return map_cps(s, [](char32_t c) {
    if (is_upper_cp(c)) return to_lower(c);
    if (is_lower_cp(c)) return to_upper(c);
    return c;
  });
}

std::string title(std::string_view s) {
  bool prev_cased = false;
  return map_case(s, [&](char32_t c) {
    char k = prev_cased ? 'l' : 't';
    prev_cased = is_cased(c);
    return k;
  });
}

std::string capitalize(std::string_view s) {
  bool first = true;
  return map_case(s, [&](char32_t) {
    char k = first ? 't' : 'l';
    first = false;
    return k;
  });
}

bool str_is(std::string_view s, StrClass k) {
  std::u32string u = decode(s);
  if (u.empty()) return false;
  switch (k) {
    case StrClass::Alpha:
      for (char32_t c : u)
        if (!is_alpha_cp(c)) return false;
      return true;
    case StrClass::Digit:
      for (char32_t c : u)
        if (!is_digit_cp(c)) return false;
      return true;
    case StrClass::Decimal:
      for (char32_t c : u)
        if (!is_decimal_cp(c)) return false;
      return true;
    case StrClass::Numeric:
      for (char32_t c : u)
        if (!is_numeric_cp(c)) return false;
      return true;
    case StrClass::Alnum:
      for (char32_t c : u)
        if (!is_alpha_cp(c) && !is_numeric_cp(c)) return false;
      return true;
    case StrClass::Space:
      for (char32_t c : u)
        if (!is_space(c)) return false;
      return true;
    case StrClass::Upper:
    case StrClass::Lower: {
      bool cased = false;
      for (char32_t c : u) {
        if (is_lower_cp(c) || is_title_cp(c)) {
          if (k == StrClass::Upper) return false;
          cased = true;
        } else if (is_upper_cp(c)) {
          if (k == StrClass::Lower) return false;
          cased = true;
        }
      }
      return cased;
    }
    case StrClass::Title: {
      bool cased = false, prev_cased = false;
      for (char32_t c : u) {
        if (is_upper_cp(c) || is_title_cp(c)) {
          if (prev_cased) return false;
          prev_cased = cased = true;
        } else if (is_lower_cp(c)) {
          if (!prev_cased) return false;
          prev_cased = cased = true;
        } else {
          prev_cased = false;
        }
      }
      return cased;
    }
  }
  return false;
}

std::string strip(std::string_view s, const std::optional<std::string_view>& chars, bool left, bool right) {
  add_work(s.size() / 16);
  std::u32string set;
  if (chars) set = decode(*chars);
  auto strip_it = [&](char32_t c) {
    if (!chars) return is_space(c);
    return set.find(c) != std::u32string::npos;
  };
  size_t b = 0, n = s.size();
  if (left) {
    while (b < n) {
      size_t j = b;
      if (!strip_it(next_cp(s, j))) break;
      b = j;
    }
  }
  size_t e = n;
  if (right) {
    e = b;
    size_t i = b;
    while (i < n) {
      if (!strip_it(next_cp(s, i))) e = i;
    }
  }
  return std::string(s.substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string_view>& sep,
                               int64_t maxsplit) {
  add_work(s.size() / 16);
  std::vector<std::string> out;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sep) {
    if (sep->empty()) fail("empty separator");
    size_t pos = 0;
    while (maxsplit > 0) {
      size_t f = s.find(*sep, pos);
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(pos, f - pos));
      pos = f + sep->size();
      --maxsplit;
    }
    out.emplace_back(s.substr(pos));
    return out;
  }
  size_t i = 0, n = s.size();
  auto skip_ws = [&](size_t& p) {
    while (p < n) {
      size_t j = p;
      if (!is_space(next_cp(s, j))) break;
      p = j;
    }
  };
  skip_ws(i);
  while (i < n) {
    if (maxsplit == 0) {
      out.emplace_back(s.substr(i));  // Python keeps the remainder's trailing whitespace
      return out;
    }
    size_t start = i;
    while (i < n) {
      size_t j = i;
      if (is_space(next_cp(s, j))) break;
      i = j;
    }
    out.emplace_back(s.substr(start, i - start));
    --maxsplit;
    skip_ws(i);
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string_view>& sep,
                                int64_t maxsplit) {
  if (maxsplit < 0) return split(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) fail("empty separator");
    size_t end = s.size();
    while (maxsplit > 0) {
      if (end < sep->size()) break;
      size_t f = s.rfind(*sep, end - sep->size());
      if (f == std::string_view::npos) break;
      out.emplace_back(s.substr(f + sep->size(), end - f - sep->size()));
      end = f;
      --maxsplit;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::u32string u = decode(s);
  int64_t e = static_cast<int64_t>(u.size());
  while (e > 0 && is_space(u[e - 1])) --e;
  while (e > 0) {
    if (maxsplit == 0) {
      out.push_back(encode(u.data(), u.data() + e));  // leading whitespace kept
      break;
    }
    int64_t b = e;
    while (b > 0 && !is_space(u[b - 1])) --b;
    out.push_back(encode(u.data() + b, u.data() + e));
    --maxsplit;
    e = b;
    while (e > 0 && is_space(u[e - 1])) --e;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  add_work(s.size() / 16);
  std::vector<std::string> out;
  size_t i = 0, start = 0, n = s.size();
  while (i < n) {
    size_t j = i;
    char32_t c = next_cp(s, j);
    bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
               c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      i = j;
      continue;
    }
    size_t eol = j;
    if (c == '\r' && j < n && s[j] == '\n') eol = j + 1;
    out.emplace_back(s.substr(start, (keepends ? eol : i) - start));
    i = start = eol;
  }
  if (start < n) out.emplace_back(s.substr(start));
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  add_work(s.size() / 16);
  if (count < 0) count = INT64_MAX;
  std::string out;
  if (old.empty()) {
    size_t i = 0;
    while (true) {
      if (count > 0) {
        out.append(repl);
        --count;
      }
      if (i >= s.size()) break;
      size_t n = cp_bytes(s, i);
      out.append(s.substr(i, n));
      i += n;
    }
    return out;
  }
  size_t pos = 0;
  while (count > 0) {
    size_t f = s.find(old, pos);
    if (f == std::string_view::npos) break;
    out.append(s.substr(pos, f - pos));
    out.append(repl);
    pos = f + old.size();
    --count;
  }
  out.append(s.substr(pos));
  return out;
}

void clamp_range(int64_t len, const std::optional<int64_t>& start, const std::optional<int64_t>& end,
                 int64_t* lo, int64_t* hi) {
  int64_t a = start.value_or(0), b = end.value_or(len);
  if (a < 0) {
    a += len;
    if (a < 0) a = 0;
  }
  if (b > len) {
    b = len;
  } else if (b < 0) {
    b += len;
    if (b < 0) b = 0;
  }
  *lo = a;
  *hi = b;
}

size_t byte_offset(std::string_view s, int64_t cp) {
  add_work(s.size() / 16);
  size_t i = 0;
  while (cp > 0 && i < s.size()) {
    next_cp(s, i);
    --cp;
  }
  return i;
}

namespace {
int64_t cp_index_of_byte(std::string_view s, size_t byte) {
  int64_t n = 0;
  size_t i = 0;
  while (i < byte && i < s.size()) {
    next_cp(s, i);
    ++n;
  }
  return n;
}
}  // namespace

int64_t find(std::string_view s, std::string_view sub, const std::optional<int64_t>& start,
             const std::optional<int64_t>& end, bool reverse) {
  int64_t len = static_cast<int64_t>(length(s)), lo, hi;
  clamp_range(len, start, end, &lo, &hi);
  if (lo > len || hi - lo < static_cast<int64_t>(length(sub))) {
    if (!(sub.empty() && lo <= hi && lo <= len)) return -1;
  }
  size_t bl = byte_offset(s, lo), bh = byte_offset(s, hi);
  std::string_view win = s.substr(bl, bh - bl);
  size_t f = reverse ? win.rfind(sub) : win.find(sub);
  if (f == std::string_view::npos) return -1;
  return lo + cp_index_of_byte(win, f);
}

int64_t count(std::string_view s, std::string_view sub, const std::optional<int64_t>& start,
              const std::optional<int64_t>& end) {
  int64_t len = static_cast<int64_t>(length(s)), lo, hi;
  clamp_range(len, start, end, &lo, &hi);
  if (lo > len) return 0;
  if (sub.empty()) return lo <= hi ? hi - lo + 1 : 0;
  if (hi < lo) return 0;
  size_t bl = byte_offset(s, lo), bh = byte_offset(s, hi);
  std::string_view win = s.substr(bl, bh - bl);
  int64_t n = 0;
  size_t pos = 0;
  while (true) {
    size_t f = win.find(sub, pos);
    if (f == std::string_view::npos) break;
    ++n;
    pos = f + sub.size();
  }
  return n;
}

bool starts_ends_with(std::string_view s, std::string_view affix, const std::optional<int64_t>& start,
                      const std::optional<int64_t>& end, bool at_end) {
  if (!start && !end) {
    if (affix.size() > s.size()) return false;
    return at_end ? s.substr(s.size() - affix.size()) == affix : s.substr(0, affix.size()) == affix;
  }
  int64_t len = static_cast<int64_t>(length(s)), lo, hi;
  clamp_range(len, start, end, &lo, &hi);
  if (lo > len) return false;
  if (hi < lo) return affix.empty() ? false : false;
  size_t bl = byte_offset(s, lo), bh = byte_offset(s, hi);
  std::string_view win = s.substr(bl, bh - bl);
  if (affix.size() > win.size()) return false;
  return at_end ? win.substr(win.size() - affix.size()) == affix : win.substr(0, affix.size()) == affix;
}

std::string pad(std::string_view s, int64_t width, std::string_view fill, char align) {
  int64_t len = static_cast<int64_t>(length(s));
  if (width <= len) return std::string(s);
  int64_t total = width - len, left = 0;
  if (align == '^') {
    // CPython: left = marg/2 + (marg & width & 1)
    left = total / 2 + (total & width & 1);
  } else if (align == '>') {
    left = total;
  }
  int64_t right = total - left;
  std::string out;
  for (int64_t i = 0; i < left; ++i) out.append(fill);
  out.append(s);
  for (int64_t i = 0; i < right; ++i) out.append(fill);
  return out;
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, std::fabs(v), std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(r.ptr - buf));
  size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c != '.') digits.push_back(c);
  int exp10 = 0;
  std::from_chars(sci.data() + e + 1 + (sci[e + 1] == '+' ? 1 : 0), sci.data() + sci.size(), exp10);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int decpt = exp10 + 1, nd = static_cast<int>(digits.size());
  std::string out = v < 0 ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (decpt >= nd) {
      out += digits;
      out.append(static_cast<size_t>(decpt - nd), '0');
      out += ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt));
      out += '.';
      out += digits.substr(static_cast<size_t>(decpt));
    }
  } else {
    out += digits[0];
    if (nd > 1) {
      out += '.';
      out += digits.substr(1);
    }
    int x = decpt - 1;
    out += 'e';
    out += x < 0 ? '-' : '+';
    if (x < 0) x = -x;
    if (x < 10) out += '0';
    out += std::to_string(x);
  }
  return out;
}

namespace {
void hex_escape(std::string& out, char prefix, uint32_t v, int digits) {
  static const char* hex = "0123456789abcdef";
  out.push_back('\\');
  out.push_back(prefix);
  for (int i = digits - 1; i >= 0; --i) out.push_back(hex[(v >> (4 * i)) & 0xF]);
}
}  // namespace

void repr_str(std::string& out, std::string_view s) {
  bool has_sq = s.find('\'') != std::string_view::npos, has_dq = s.find('"') != std::string_view::npos;
  char q = (has_sq && !has_dq) ? '"' : '\'';
  out.push_back(q);
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    char32_t c = next_cp(s, i);
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      hex_escape(out, 'x', c, 2);
    } else if (c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else if (is_printable(c)) {
      out.append(s.substr(start, i - start));
    } else if (c <= 0xFF) {
      hex_escape(out, 'x', c, 2);
    } else if (c <= 0xFFFF) {
      hex_escape(out, 'u', c, 4);
    } else {
      hex_escape(out, 'U', c, 8);
    }
  }
  out.push_back(q);
}

void json_str(std::string& out, std::string_view s, bool ensure_ascii) { append_json_string(out, s, ensure_ascii); }

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::string unescape_literal(std::string_view body) {
  std::string out;
  out.reserve(body.size());
  size_t i = 0, n = body.size();
  auto hexval = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  while (i < n) {
    char c = body[i];
    if (c != '\\') {
      size_t j = i;
      next_cp(body, j);
      out.append(body.substr(i, j - i));
      i = j;
      continue;
    }
    if (i + 1 >= n) fail("\\ at end of string");
    unsigned char e = static_cast<unsigned char>(body[i + 1]);
    if (e >= 0x80) {
      // jinja2 backslash-replaces non-ASCII first, so "\é" decodes to the text "\xe9".
      size_t j = i + 1;
      char32_t cp = next_cp(body, j);
      out.push_back('\\');
      std::string esc;
      if (cp <= 0xFF) {
        hex_escape(esc, 'x', cp, 2);
      } else if (cp <= 0xFFFF) {
        hex_escape(esc, 'u', cp, 4);
      } else {
        hex_escape(esc, 'U', cp, 8);
      }
      out.append(esc.substr(1));
      i = j;
      continue;
    }
    i += 2;
    switch (e) {
      case '\n': break;
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x':
      case 'u':
      case 'U': {
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t v = 0;
        for (int k = 0; k < digits; ++k) {
          int h = i + k < n ? hexval(body[i + k]) : -1;
          if (h < 0) fail("truncated \\%c escape in string literal", e);
          v = v * 16 + static_cast<uint32_t>(h);
        }
        if (v > 0x10FFFF) fail("illegal Unicode character in string literal");
        i += static_cast<size_t>(digits);
        append_utf8(out, v);
        break;
      }
      case 'N':
        fail("\\N{...} escapes are not supported in string literals");
      default:
        if (e >= '0' && e <= '7') {
          uint32_t v = e - '0';
          for (int k = 0; k < 2 && i < n && body[i] >= '0' && body[i] <= '7'; ++k) v = v * 8 + (body[i++] - '0');
          append_utf8(out, v);
        } else {
          out.push_back('\\');
          out.push_back(static_cast<char>(e));
        }
    }
  }
  return out;
}

}  // namespace spool::tmpl::py
