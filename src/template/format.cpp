// Python %-formatting and str.format(); see format.h.
#include "template/format.h"

#include <cmath>
#include <cstdio>

#include "common/error.h"
#include "template/evaluator.h"
#include "template/pystr.h"

namespace spool::tmpl {

namespace {

/// snprintf of one double with a C conversion spec built from Python flags.
std::string c_float(double v, const std::string& flags, int precision, char type) {
  std::string spec = "%" + flags + "." + std::to_string(precision) + type;
  char buf[512];
  int n = std::snprintf(buf, sizeof buf, spec.c_str(), v);
  if (n < 0) return std::string();
  if (static_cast<size_t>(n) < sizeof buf) return std::string(buf, static_cast<size_t>(n));
  std::string out(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), spec.c_str(), v);
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string int_digits(int64_t v, int base, bool upper) {
  if (v == 0) return "0";
  uint64_t u = v < 0 ? static_cast<uint64_t>(-(v + 1)) + 1 : static_cast<uint64_t>(v);
  const char* digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  std::string s;
  while (u) {
    s.push_back(digits[u % static_cast<uint64_t>(base)]);
    u /= static_cast<uint64_t>(base);
  }
  return std::string(s.rbegin(), s.rend());
}

double to_real(const Value& v, char type) {
  if (v.is_number()) return v.as_double();
  fail("%%%c format: a real number is required, not %s", type, type_name(v));
}

int64_t to_integer(const Value& v, char type, bool allow_float) {
  if (v.is_integral()) return v.as_int();
  if (v.is_float() && allow_float) {
    double d = v.as_double();
    if (std::isnan(d) || std::isinf(d) || std::fabs(d) >= 9.2e18) fail("cannot convert float to integer");
    return static_cast<int64_t>(d);
  }
  if (v.is_float()) fail("%%%c format: an integer is required, not float", type);
  fail("%%%c format: a real number is required, not %s", type, type_name(v));
}

std::string apply_width(std::string body, int64_t width, bool left, char fill_zero_sign_aware, bool zero) {
  int64_t len = static_cast<int64_t>(py::length(body));
  if (width <= len) return body;
  size_t pad = static_cast<size_t>(width - len);
  if (left) return body + std::string(pad, ' ');
  if (zero && fill_zero_sign_aware) {
    size_t sign = (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
    size_t prefix = sign;
    if (body.size() >= sign + 2 && body[sign] == '0' &&
        (body[sign + 1] == 'x' || body[sign + 1] == 'X' || body[sign + 1] == 'o'))
      prefix += 2;
    return body.substr(0, prefix) + std::string(pad, '0') + body.substr(prefix);
  }
  return std::string(pad, ' ') + body;
}

std::string ascii_repr(const Value& v) {
  std::string r;
  append_repr(r, v);
  std::string out;
  std::u32string u = py::decode(r);
  for (char32_t c : u) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[16];
      if (c <= 0xFF) {
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      } else if (c <= 0xFFFF) {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      } else {
        std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      }
      out += buf;
    }
  }
  return out;
}

}  // namespace

std::string percent_format(Interp& in, const std::string& fmt, const Value& args) {
  std::vector<Value> items;
  const DictObj* mapping = nullptr;
  if (args.is_list() && args.list()->flavor == ListFlavor::Tuple) {
    items = args.list()->items;
  } else {
    items.push_back(args);
    if (args.is_dict()) mapping = args.dict();
  }
  bool list_like_mapping = args.is_dict() || (args.is_list() && args.list()->flavor != ListFlavor::Tuple);
  size_t argi = 0;
  std::string out;
  size_t i = 0, n = fmt.size();
  auto next_arg = [&]() -> Value {
    if (argi >= items.size()) fail("not enough arguments for format string");
    return items[argi++];
  };
  while (i < n) {
    size_t p = fmt.find('%', i);
    if (p == std::string::npos) {
      out.append(fmt, i, std::string::npos);
      break;
    }
    out.append(fmt, i, p - i);
    i = p + 1;
    if (i >= n) fail("incomplete format");
    Value arg;
    bool have_arg = false;
    if (fmt[i] == '(') {
      if (!mapping) fail("format requires a mapping");
      int depth = 1;
      size_t k = i + 1;
      while (k < n && depth) {
        if (fmt[k] == '(') ++depth;
        if (fmt[k] == ')') --depth;
        ++k;
      }
      if (depth) fail("incomplete format key");
      std::string key = fmt.substr(i + 1, k - i - 2);
      const Value* v = mapping->find(Value::string(key));
      if (!v) fail("KeyError: '%s'", key.c_str());
      arg = *v;
      have_arg = true;
      i = k;
    }
    bool left = false, plus = false, space = false, alt = false, zero = false;
    for (; i < n; ++i) {
      char c = fmt[i];
      if (c == '-') left = true;
      else if (c == '+') plus = true;
      else if (c == ' ') space = true;
      else if (c == '#') alt = true;
      else if (c == '0') zero = true;
      else break;
    }
    int64_t width = 0, prec = -1;
    if (i < n && fmt[i] == '*') {
      Value w = next_arg();
      if (!w.is_integral()) fail("* wants int");
      width = w.as_int();
      if (width < 0) {
        left = true;
        width = -width;
      }
      ++i;
    } else {
      while (i < n && fmt[i] >= '0' && fmt[i] <= '9') width = std::min<int64_t>(width * 10 + (fmt[i++] - '0'), 1 << 24);
    }
    if (i < n && fmt[i] == '.') {
      ++i;
      prec = 0;
      if (i < n && fmt[i] == '*') {
        Value w = next_arg();
        if (!w.is_integral()) fail("* wants int");
        prec = std::max<int64_t>(0, w.as_int());
        ++i;
      } else {
        while (i < n && fmt[i] >= '0' && fmt[i] <= '9') prec = std::min<int64_t>(prec * 10 + (fmt[i++] - '0'), 1 << 16);
      }
    }
    while (i < n && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= n) fail("incomplete format");
    char type = fmt[i++];
    if (type == '%') {
      out.push_back('%');
      continue;
    }
    if (!have_arg) arg = next_arg();
    if (arg.is_undefined() && type != 's') in.fail_undefined(arg);
    std::string body;
    std::string sign_flags = std::string(plus ? "+" : "") + (space && !plus ? " " : "") + (alt ? "#" : "");
    switch (type) {
      case 's': body = to_str(arg); break;
      case 'r': {
        std::string r;
        append_repr(r, arg);
        body = r;
        break;
      }
      case 'a': body = ascii_repr(arg); break;
      case 'd':
      case 'i':
      case 'u':
      case 'o':
      case 'x':
      case 'X': {
        int64_t v = to_integer(arg, type, type == 'd' || type == 'i' || type == 'u');
        int base = (type == 'o') ? 8 : (type == 'x' || type == 'X') ? 16 : 10;
        std::string digits = int_digits(v, base, type == 'X');
        if (prec > static_cast<int64_t>(digits.size())) digits = std::string(static_cast<size_t>(prec) - digits.size(), '0') + digits;
        std::string prefix;
        if (alt && base == 8) prefix = "0o";
        if (alt && base == 16) prefix = type == 'X' ? "0X" : "0x";
        std::string sign = v < 0 ? "-" : plus ? "+" : space ? " " : "";
        body = sign + prefix + digits;
        break;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        double v = to_real(arg, type);
        body = c_float(v, sign_flags, prec < 0 ? 6 : static_cast<int>(prec), type);
        break;
      }
      case 'c': {
        if (arg.is_string()) {
          if (py::length(arg.str()) != 1) fail("%%c requires int or char");
          body = arg.str();
        } else if (arg.is_integral()) {
          int64_t c = arg.as_int();
          if (c < 0 || c > 0x10FFFF) fail("%%c arg not in range(0x110000)");
          py::append_utf8(body, static_cast<char32_t>(c));
        } else {
          fail("%%c requires int or char");
        }
        break;
      }
      default: fail("unsupported format character '%c'", type);
    }
    if ((type == 's' || type == 'r' || type == 'a') && prec >= 0) {
      std::u32string u = py::decode(body);
      if (static_cast<int64_t>(u.size()) > prec) body = py::encode(u.data(), u.data() + prec);
    }
    bool numeric = std::string_view("diuoxXeEfFgG").find(type) != std::string_view::npos;
    in.check_size(out.size() + body.size() + static_cast<size_t>(width));
    out += apply_width(std::move(body), width, left, numeric, zero && !left);
  }
  if (argi < items.size() && !mapping && !list_like_mapping)
    fail("not all arguments converted during string formatting");
  return out;
}

namespace {

struct Spec {
  std::string fill = " ";
  char align = 0;
  char sign = '-';
  bool alt = false, zero = false;
  int64_t width = -1;
  char grouping = 0;
  int64_t precision = -1;
  char type = 0;
};

Spec parse_spec(const std::string& s) {
  Spec sp;
  std::u32string u = py::decode(s);
  size_t i = 0, n = u.size();
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (n >= 2 && is_align(u[1])) {
    sp.fill = py::encode(&u[0], &u[0] + 1);
    sp.align = static_cast<char>(u[1]);
    i = 2;
  } else if (n >= 1 && is_align(u[0])) {
    sp.align = static_cast<char>(u[0]);
    i = 1;
  }
  if (i < n && (u[i] == '+' || u[i] == '-' || u[i] == ' ')) sp.sign = static_cast<char>(u[i++]);
  if (i < n && u[i] == 'z') ++i;
  if (i < n && u[i] == '#') {
    sp.alt = true;
    ++i;
  }
  if (i < n && u[i] == '0') {
    sp.zero = true;
    ++i;
  }
  if (i < n && u[i] >= '0' && u[i] <= '9') {
    sp.width = 0;
    while (i < n && u[i] >= '0' && u[i] <= '9') sp.width = std::min<int64_t>(sp.width * 10 + (u[i++] - '0'), 1 << 24);
  }
  if (i < n && (u[i] == ',' || u[i] == '_')) sp.grouping = static_cast<char>(u[i++]);
  if (i < n && u[i] == '.') {
    ++i;
    if (i >= n || u[i] < '0' || u[i] > '9') fail("Format specifier missing precision");
    sp.precision = 0;
    while (i < n && u[i] >= '0' && u[i] <= '9') sp.precision = std::min<int64_t>(sp.precision * 10 + (u[i++] - '0'), 1 << 16);
  }
  if (i < n) sp.type = static_cast<char>(u[i++]);
  if (i < n) fail("Invalid format specifier '%s'", s.c_str());
  return sp;
}

std::string group_digits(const std::string& digits, char sep, int every) {
  std::string out;
  int count = 0;
  for (size_t k = digits.size(); k-- > 0;) {
    if (count && count % every == 0) out.push_back(sep);
    out.push_back(digits[k]);
    ++count;
  }
  return std::string(out.rbegin(), out.rend());
}

std::string pad_spec(const Spec& sp, const std::string& sign, const std::string& body, char default_align) {
  char align = sp.align ? sp.align : (sp.zero ? '=' : default_align);
  std::string fill = sp.align ? sp.fill : (sp.zero ? "0" : " ");
  int64_t len = static_cast<int64_t>(py::length(sign) + py::length(body));
  if (sp.width <= len) return sign + body;
  int64_t pad = sp.width - len;
  auto rep = [&](int64_t k) {
    std::string r;
    for (int64_t j = 0; j < k; ++j) r += fill;
    return r;
  };
  switch (align) {
    case '<': return sign + body + rep(pad);
    case '^': return rep(pad / 2) + sign + body + rep(pad - pad / 2);
    case '=': return sign + rep(pad) + body;
    default: return rep(pad) + sign + body;
  }
}

}  // namespace

std::string format_value(Interp& in, const Value& v, const std::string& spec) {
  if (spec.empty()) return to_str(v);
  Spec sp = parse_spec(spec);
  if (sp.width > 0) in.check_size(static_cast<size_t>(sp.width));
  if (v.is_string()) {
    if (sp.type && sp.type != 's') fail("Unknown format code '%c' for object of type 'str'", sp.type);
    if (sp.sign != '-') fail("Sign not allowed in string format specifier");
    std::string body = v.str();
    if (sp.precision >= 0) {
      std::u32string u = py::decode(body);
      if (static_cast<int64_t>(u.size()) > sp.precision) body = py::encode(u.data(), u.data() + sp.precision);
    }
    Spec s2 = sp;
    s2.zero = false;
    return pad_spec(s2, "", body, '<');
  }
  if (v.is_integral() && std::string_view("bcdoxXn").find(sp.type) != std::string_view::npos) {
    int64_t x = v.as_int();
    if (sp.type == 'c') {
      std::string body;
      py::append_utf8(body, static_cast<char32_t>(x));
      return pad_spec(sp, "", body, '<');
    }
    int base = sp.type == 'b' ? 2 : sp.type == 'o' ? 8 : (sp.type == 'x' || sp.type == 'X') ? 16 : 10;
    std::string digits = int_digits(x, base, sp.type == 'X');
    if (sp.grouping) digits = group_digits(digits, sp.grouping, base == 10 ? 3 : 4);
    std::string prefix;
    if (sp.alt && base != 10) prefix = base == 2 ? "0b" : base == 8 ? "0o" : sp.type == 'X' ? "0X" : "0x";
    std::string sign = x < 0 ? "-" : sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "";
    return pad_spec(sp, sign + prefix, digits, '>');
  }
  if (v.is_number()) {

    double x = v.as_double();
    char type = sp.type;
    if (type && std::string_view("eEfFgG%").find(type) == std::string_view::npos)
      fail("Unknown format code '%c' for object of type '%s'", type, type_name(v));
    std::string body;
    bool neg = std::signbit(x) && !std::isnan(x);
    double ax = std::fabs(x);
    if (!type && v.is_integral()) {
      body = std::to_string(std::llabs(v.as_int()));
      neg = v.as_int() < 0;
    } else if (!type && sp.precision < 0) {
      body = py::float_repr(ax);
    } else if (!type) {
      body = c_float(ax, sp.alt ? "#" : "", static_cast<int>(std::max<int64_t>(sp.precision, 1)), 'g');
      if (body.find_first_of(".eEni") == std::string::npos) body += ".0";
    } else if (type == '%') {
      body = c_float(ax * 100, sp.alt ? "#" : "", static_cast<int>(sp.precision < 0 ? 6 : sp.precision), 'f') + "%";
    } else {
      body = c_float(ax, sp.alt ? "#" : "", static_cast<int>(sp.precision < 0 ? 6 : sp.precision), type);
    }
    if (sp.grouping) {
      size_t end = body.find_first_not_of("0123456789");
      if (end == std::string::npos) end = body.size();
      body = group_digits(body.substr(0, end), sp.grouping, 3) + body.substr(end);
    }
    std::string sign = neg ? "-" : sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "";
    return pad_spec(sp, sign, body, '>');
  }
  fail("unsupported format string passed to %s.__format__", type_name(v));
}

std::string str_format(Interp& in, const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t i = 0, n = fmt.size();
  size_t auto_idx = 0;
  bool used_auto = false, used_manual = false;
  while (i < n) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < n && fmt[i + 1] == '}') {
        out.push_back('}');
        i += 2;
        continue;
      }
      fail("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      ++i;
      continue;
    }
    if (i + 1 < n && fmt[i + 1] == '{') {
      out.push_back('{');
      i += 2;
      continue;
    }
    size_t j = i + 1;
    int depth = 1;
    while (j < n && depth) {
      if (fmt[j] == '{') ++depth;
      if (fmt[j] == '}') --depth;
      if (depth) ++j;
    }
    if (j >= n) fail("expected '}' before end of string");
    std::string field = fmt.substr(i + 1, j - i - 1);
    i = j + 1;
    std::string spec, conv;
    size_t colon = std::string::npos, bang = std::string::npos;
    int br = 0;
    for (size_t k = 0; k < field.size(); ++k) {
      if (field[k] == '[') ++br;
      if (field[k] == ']') --br;
      if (br == 0 && field[k] == '!' && bang == std::string::npos && colon == std::string::npos) bang = k;
      if (br == 0 && field[k] == ':' && colon == std::string::npos) {
        colon = k;
        break;
      }
    }
    if (colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    if (bang != std::string::npos) {
      conv = field.substr(bang + 1);
      field = field.substr(0, bang);
    }
    if (spec.find('{') != std::string::npos) fail("nested replacement fields in format specs are not supported");
    // first part of the field name
    size_t k = 0;
    while (k < field.size() && field[k] != '.' && field[k] != '[') ++k;
    std::string head = field.substr(0, k);
    Value v;
    if (head.empty()) {
      if (used_manual) fail("cannot switch from manual field specification to automatic field numbering");
      used_auto = true;
      if (auto_idx >= args.pos.size()) fail("Replacement index %zu out of range for positional args tuple", auto_idx);
      v = args.pos[auto_idx++];
    } else if (head.find_first_not_of("0123456789") == std::string::npos) {
      if (used_auto) fail("cannot switch from automatic field numbering to manual field specification");
      used_manual = true;
      size_t idx = std::stoul(head.size() > 9 ? std::string("999999999") : head);
      if (idx >= args.pos.size()) fail("Replacement index %zu out of range for positional args tuple", idx);
      v = args.pos[idx];
    } else {
      bool found = false;
      for (const auto& kv : args.kw)
        if (kv.first == head) {
          v = kv.second;
          found = true;
        }
      if (!found) fail("KeyError: '%s'", head.c_str());
    }
    while (k < field.size()) {
      if (field[k] == '.') {
        size_t e = k + 1;
        while (e < field.size() && field[e] != '.' && field[e] != '[') ++e;
        v = in.getattr(v, field.substr(k + 1, e - k - 1));
        k = e;
      } else {
        size_t e = field.find(']', k);
        if (e == std::string::npos) fail("Missing ']' in format string");
        std::string key = field.substr(k + 1, e - k - 1);
        Value kv = (!key.empty() && key.find_first_not_of("0123456789") == std::string::npos)
                       ? Value::integer(std::stoll(key.size() > 15 ? std::string("999999999999999") : key))
                       : Value::string(key);
        v = in.getitem(v, kv);
        k = e + 1;
      }
    }
    if (conv == "r") {
      std::string r;
      append_repr(r, v);
      v = Value::string(r);
    } else if (conv == "s") {
      v = Value::string(to_str(v));
    } else if (conv == "a") {
      v = Value::string(ascii_repr(v));
    } else if (!conv.empty()) {
      fail("Unknown conversion specifier %s", conv.c_str());
    }
    std::string piece = format_value(in, v, spec);
    in.check_size(out.size() + piece.size());
    out += piece;
  }
  return out;
}

}  // namespace spool::tmpl
