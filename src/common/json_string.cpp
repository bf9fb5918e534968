#include "common/json_string.h"

#include <cstdint>

#include "common/utf8.h"

namespace spool {

namespace {

// "\uXXXX" with lowercase hex digits.
void append_u_escape(std::string& out, uint32_t v) {
  static const char kHex[] = "0123456789abcdef";
  out += "\\u";
  for (int k = 3; k >= 0; --k) out.push_back(kHex[(v >> (4 * k)) & 0xF]);
}

}  // namespace

void append_json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b >= 0x80) {
      if (!ensure_ascii) {
        out.push_back(s[i++]);
        continue;
      }
      const uint32_t c = utf8::next_escaped(s, i);
      if (c >= 0x10000) {
        const uint32_t v = c - 0x10000;
        append_u_escape(out, 0xD800 + (v >> 10));
        append_u_escape(out, 0xDC00 + (v & 0x3FF));
      } else {
        append_u_escape(out, c);
      }
      continue;
    }
    ++i;
    switch (b) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (b < 0x20 || (ensure_ascii && b == 0x7F)) {
          append_u_escape(out, b);
        } else {
          out.push_back(static_cast<char>(b));
        }
    }
  }
  out.push_back('"');
}

}  // namespace spool
