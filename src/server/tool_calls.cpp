#include "server/tool_calls.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

namespace spool::server {

using ojson = nlohmann::ordered_json;

namespace {

void dump_py(std::string& out, const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        append_json_string(out, it.key());
        out += ": ";
        dump_py(out, it.value());
      }
      out += '}';
      break;
    }
    case ojson::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        dump_py(out, e);
      }
      out += ']';
      break;
    }
    case ojson::value_t::string: append_json_string(out, v.get_ref<const std::string&>()); break;
    default: out += v.dump(); break;  // numbers, booleans, null
  }
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return r;
}

bool is_null_word(std::string_view v) {
  std::string l = lower(trim(v));
  return l == "null" || l == "none";
}

// Bracket nesting depth of JSON-ish text outside strings (bounds the recursion of dump_py).
size_t nesting_depth(std::string_view s) {
  size_t depth = 0, max_depth = 0;
  bool in_str = false, esc = false;
  for (char c : s) {
    if (in_str) {
      if (esc) esc = false;
      else if (c == '\\') esc = true;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return max_depth;
}

constexpr size_t kMaxValueNesting = 128;

std::optional<ojson> parse_json(std::string_view v) {
  if (nesting_depth(v) > kMaxValueNesting) return std::nullopt;
  // nlohmann's lexer reads a NUL byte as the end of input ("5\0junk" would parse as 5).
  if (v.find('\0') != std::string_view::npos) return std::nullopt;
  ojson j = ojson::parse(v.begin(), v.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

std::string as_string(std::string_view v) {
  std::string out;
  append_json_string(out, v);
  return out;
}

std::string json_or_string(std::string_view v) {
  auto j = parse_json(v);
  return j ? dump_json_py(*j) : as_string(v);
}

struct ParamType {
  std::string type;  // lowercased; empty: unknown
  bool allows_null = false;
};

ParamType schema_type(const nlohmann::json& s) {
  ParamType t;
  if (!s.is_object()) return t;
  auto type_name = [](const nlohmann::json& v) -> std::string {
    return v.is_string() ? lower(trim(v.get_ref<const std::string&>())) : std::string();
  };
  if (auto it = s.find("type"); it != s.end()) {
    if (it->is_string()) {
      t.type = type_name(*it);
      t.allows_null = t.type == "null";
      return t;
    }
    if (it->is_array()) {
      for (const auto& e : *it) {
        std::string n = type_name(e);
        if (n == "null") t.allows_null = true;
        else if (t.type.empty()) t.type = n;
      }
      if (t.type.empty() && t.allows_null) t.type = "null";
      return t;
    }
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    auto it = s.find(key);
    if (it == s.end() || !it->is_array()) continue;
    for (const auto& opt : *it) {
      if (!opt.is_object()) continue;
      auto ot = opt.find("type");
      if (ot == opt.end()) continue;
      std::string n = type_name(*ot);
      if (n == "null") t.allows_null = true;
      else if (t.type.empty()) t.type = n;
    }
    if (t.type.empty() && t.allows_null) t.type = "null";
    return t;
  }
  if (auto it = s.find("enum"); it != s.end() && it->is_array() && !it->empty()) {
    bool all_strings = true;
    for (const auto& e : *it) all_strings = all_strings && e.is_string();
    if (all_strings) t.type = "string";
  }
  return t;
}

bool starts_with_any(std::string_view s, std::initializer_list<std::string_view> prefixes) {
  for (auto p : prefixes) {
    if (s.substr(0, p.size()) == p) return true;
  }
  return false;
}

}  // namespace

std::string dump_json_py(const nlohmann::ordered_json& v) {
  std::string out;
  dump_py(out, v);
  return out;
}

const nlohmann::json* find_tool_properties(const nlohmann::json& tools, std::string_view name) {
  if (!tools.is_array()) return nullptr;
  for (const auto& t : tools) {
    if (!t.is_object()) continue;
    const nlohmann::json* fn = &t;
    if (auto it = t.find("function"); it != t.end() && it->is_object()) fn = &*it;
    auto n = fn->find("name");
    if (n == fn->end() || !n->is_string() || n->get_ref<const std::string&>() != name) continue;
    auto params = fn->find("parameters");
    if (params == fn->end() || !params->is_object()) return nullptr;
    auto props = params->find("properties");
    if (props == params->end() || !props->is_object()) return nullptr;
    return &*props;
  }
  return nullptr;
}

std::string typed_param_json(const nlohmann::json* props, std::string_view param,
                             std::string_view value) {
  if (props == nullptr || !props->is_object()) return json_or_string(value);
  auto it = props->find(std::string(param));
  if (it == props->end()) return json_or_string(value);
  ParamType pt = schema_type(*it);
  const std::string& t = pt.type;
  if (pt.allows_null && is_null_word(value)) return "null";
  if (t == "string" || t == "str" || t == "text" || t == "varchar" || t == "char" ||
      t == "enum") {
    return as_string(value);
  }
  if (t.empty()) return json_or_string(value);
  if (is_null_word(value)) return "null";
  std::string_view v = trim(value);
  if (starts_with_any(t, {"int", "uint", "long", "short", "unsigned"})) {
    auto j = parse_json(v);
    if (j && (j->is_number_integer() || j->is_number_unsigned())) return std::string(v);
    if (j && j->is_number_float()) {
      double d = j->get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.0f", d);
        return buf;
      }
    }
    return as_string(value);
  }
  if (starts_with_any(t, {"num", "float", "double", "decimal"})) {
    auto j = parse_json(v);
    if (j && j->is_number()) return std::string(v);
    return as_string(value);
  }
  if (t == "boolean" || t == "bool" || t == "binary") {
    std::string l = lower(v);
    if (l == "true" || l == "false") return l;
    return as_string(value);
  }
  // object, array, null and unrecognized types: JSON if it parses.
  return json_or_string(value);
}

std::string make_tool_call_id(std::string_view prefix, uint64_t seed, int index) {
  auto splitmix = [](uint64_t& x) {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  // Two draws per index from a stream keyed by the seed and the index.
  uint64_t state = seed ^ (0xD1B54A32D192ED03ull * (static_cast<uint64_t>(index) + 1));
  uint64_t a = splitmix(state), b = splitmix(state);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%08llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b >> 32));
  std::string id(prefix);
  id += buf;
  return id;
}

// ---------------------------------------------------------------------------------------------
// JsonArgsStreamer

namespace {
constexpr size_t kMaxArgsDepth = 128;
}

JsonArgsStreamer::JsonArgsStreamer(size_t start_raw) {
  stack_.push_back('{');
  out_.push_back('{');
  mark_safe(start_raw, false);
}

void JsonArgsStreamer::mark_safe(size_t raw_after, bool in_string) {
  safe_len_ = out_.size();
  safe_raw_ = raw_after;
  safe_in_string_ = in_string;
}

std::string JsonArgsStreamer::take_safe() {
  std::string r = out_.substr(0, safe_len_);
  out_.erase(0, safe_len_);
  safe_len_ = 0;
  return r;
}

std::string JsonArgsStreamer::healing() const {
  std::string h;
  if (safe_in_string_) h += '"';
  for (auto it = stack_.rbegin(); it != stack_.rend(); ++it) h += (*it == '{') ? '}' : ']';
  return h;
}

bool JsonArgsStreamer::in_value() const {
  if (stack_.size() != 1) return !stack_.empty();
  if (just_colon_) return false;  // the byte after ':' (space, quote) is still punctuation
  switch (mode_) {
    case Mode::kKeyOrClose:
    case Mode::kKey:
    case Mode::kInKey:
    case Mode::kColon:
    case Mode::kAfterValue:
      return false;
    default:
      return true;
  }
}

JsonArgsStreamer::Status JsonArgsStreamer::close(char c, size_t raw_pos) {
  out_ += c;
  stack_.pop_back();
  mode_ = Mode::kAfterValue;
  mark_safe(raw_pos + 1, false);
  return stack_.empty() ? Status::kDone : Status::kOk;
}

JsonArgsStreamer::Status JsonArgsStreamer::value_start(char c, size_t raw_pos) {
  switch (c) {
    case '"':
      out_ += c;
      mode_ = Mode::kInString;
      esc_ = 0;
      want_low_ = false;
      utf8_rem_ = 0;
      mark_safe(raw_pos + 1, true);
      return Status::kOk;
    case '{':
    case '[':
      if (stack_.size() >= kMaxArgsDepth) return Status::kError;
      out_ += c;
      stack_.push_back(c);
      mode_ = c == '{' ? Mode::kKeyOrClose : Mode::kValueOrClose;
      mark_safe(raw_pos + 1, false);
      return Status::kOk;
    case 't': lit_ = "true"; break;
    case 'f': lit_ = "false"; break;
    case 'n': lit_ = "null"; break;
    default:
      if (c == '-' || (c >= '0' && c <= '9')) {
        out_ += c;
        mode_ = Mode::kInNumber;
        num_ = c == '-' ? Num::kMinus : c == '0' ? Num::kZero : Num::kInt;
        return Status::kOk;
      }
      return Status::kError;
  }
  out_ += c;
  mode_ = Mode::kInLiteral;
  lit_pos_ = 1;
  return Status::kOk;
}

// Advances the number grammar by `c`; false when `c` cannot continue the number.
bool JsonArgsStreamer::number_byte(char c) {
  bool digit = c >= '0' && c <= '9';
  switch (num_) {
    case Num::kMinus:
      if (c == '0') num_ = Num::kZero;
      else if (digit) num_ = Num::kInt;
      else return false;
      return true;
    case Num::kZero:
    case Num::kInt:
      if (digit && num_ == Num::kInt) return true;
      if (c == '.') { num_ = Num::kDot; return true; }
      if (c == 'e' || c == 'E') { num_ = Num::kE; return true; }
      return false;
    case Num::kDot:
      if (digit) { num_ = Num::kFrac; return true; }
      return false;
    case Num::kFrac:
      if (digit) return true;
      if (c == 'e' || c == 'E') { num_ = Num::kE; return true; }
      return false;
    case Num::kE:
      if (c == '+' || c == '-') { num_ = Num::kESign; return true; }
      if (digit) { num_ = Num::kExp; return true; }
      return false;
    case Num::kESign:
      if (digit) { num_ = Num::kExp; return true; }
      return false;
    case Num::kExp:
      return digit;
  }
  return false;
}

JsonArgsStreamer::Status JsonArgsStreamer::string_byte(char c, size_t raw_pos, bool key) {
  auto u = static_cast<unsigned char>(c);
  if (esc_ == 1) {
    if (want_low_ && c != 'u') return Status::kError;
    if (c == 'u') {
      esc_ = 2;
      hex_ = 0;
    } else if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
               c == 'r' || c == 't') {
      esc_ = 0;
    } else {
      return Status::kError;
    }
    out_ += c;
  } else if (esc_ >= 2) {
    unsigned d;
    if (c >= '0' && c <= '9') d = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f') d = static_cast<unsigned>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') d = static_cast<unsigned>(c - 'A' + 10);
    else return Status::kError;
    hex_ = hex_ * 16 + d;
    out_ += c;
    if (++esc_ == 6) {
      esc_ = 0;
      bool high = hex_ >= 0xD800 && hex_ <= 0xDBFF, low = hex_ >= 0xDC00 && hex_ <= 0xDFFF;
      if (want_low_) {
        if (!low) return Status::kError;
        want_low_ = false;
      } else if (high) {
        want_low_ = true;
      } else if (low) {
        return Status::kError;
      }
    }
  } else if (want_low_) {
    if (c != '\\') return Status::kError;
    esc_ = 1;
    out_ += c;
  } else if (c == '\\') {
    esc_ = 1;
    out_ += c;
  } else if (c == '"') {
    out_ += c;
    if (key) {
      mode_ = Mode::kColon;
    } else {
      mode_ = Mode::kAfterValue;
      mark_safe(raw_pos + 1, false);
    }
    return Status::kOk;
  } else if (u < 0x20) {
    // A raw control character is invalid JSON; keep the text by escaping it.
    std::string esc;
    append_json_string(esc, std::string_view(&c, 1));
    out_.append(esc, 1, esc.size() - 2);  // without the quotes
  } else {
    out_ += c;
    if (u >= 0xC0) utf8_rem_ = u >= 0xF0 ? 3 : u >= 0xE0 ? 2 : 1;
    else if (u >= 0x80 && utf8_rem_ > 0) --utf8_rem_;
  }
  if (!key && esc_ == 0 && !want_low_ && utf8_rem_ == 0) mark_safe(raw_pos + 1, true);
  return Status::kOk;
}

JsonArgsStreamer::Status JsonArgsStreamer::feed(char c, size_t raw_pos) {
  just_colon_ = false;
  switch (mode_) {
    case Mode::kKeyOrClose:
    case Mode::kKey:
      if (is_space(c)) { out_ += c; return Status::kOk; }
      if (c == '"') {
        out_ += c;
        mode_ = Mode::kInKey;
        esc_ = 0;
        want_low_ = false;
        utf8_rem_ = 0;
        return Status::kOk;
      }
      if (c == '}' && mode_ == Mode::kKeyOrClose) return close(c, raw_pos);
      return Status::kError;
    case Mode::kInKey:
      return string_byte(c, raw_pos, true);
    case Mode::kColon:
      if (is_space(c)) { out_ += c; return Status::kOk; }
      if (c == ':') { out_ += c; mode_ = Mode::kValue; just_colon_ = true; return Status::kOk; }
      return Status::kError;
    case Mode::kValue:
    case Mode::kValueOrClose:
      if (is_space(c)) { out_ += c; return Status::kOk; }
      if (c == ']' && mode_ == Mode::kValueOrClose) return close(c, raw_pos);
      return value_start(c, raw_pos);
    case Mode::kInString:
      return string_byte(c, raw_pos, false);
    case Mode::kInNumber:
      if (number_byte(c)) { out_ += c; return Status::kOk; }
      if (num_ != Num::kZero && num_ != Num::kInt && num_ != Num::kFrac && num_ != Num::kExp) {
        return Status::kError;
      }
      mode_ = Mode::kAfterValue;
      mark_safe(raw_pos, false);
      return feed(c, raw_pos);
    case Mode::kInLiteral:
      if (c != lit_[lit_pos_]) return Status::kError;
      out_ += c;
      if (lit_[++lit_pos_] == '\0') {
        mode_ = Mode::kAfterValue;
        mark_safe(raw_pos + 1, false);
      }
      return Status::kOk;
    case Mode::kAfterValue:
      if (is_space(c)) { out_ += c; return Status::kOk; }
      if (c == ',') {
        out_ += c;
        mode_ = stack_.back() == '{' ? Mode::kKey : Mode::kValue;
        return Status::kOk;
      }
      if ((c == '}' && stack_.back() == '{') || (c == ']' && stack_.back() == '[')) {
        return close(c, raw_pos);
      }
      return Status::kError;
  }
  return Status::kError;
}

}  // namespace spool::server
