#include "common/utf8.h"

#include <cstring>

namespace spool::utf8 {

Seq examine(std::string_view s, size_t i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  const unsigned char b0 = p[i];
  if (b0 < 0x80) return {SeqStatus::kValid, b0, 1};
  size_t need = 0;
  uint32_t cp = 0;
  // Allowed range of the second byte; later continuation bytes are always 80..BF.
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0)
      lo = 0xA0;  // no overlong forms
    else if (b0 == 0xED)
      hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0)
      lo = 0x90;  // no overlong forms
    else if (b0 == 0xF4)
      hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {SeqStatus::kInvalid, 0, 1};
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= n) return {SeqStatus::kIncomplete, 0, k};
    const unsigned char b = p[i + k];
    if (b < lo || b > hi) return {SeqStatus::kInvalid, 0, k};
    lo = 0x80;
    hi = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
  }
  return {SeqStatus::kValid, cp, need + 1};
}

namespace {
// Index of the first non-ASCII byte at or after i (n if none); 8 bytes at a time.
size_t skip_ascii(std::string_view s, size_t i) {
  const size_t n = s.size();
  while (i + 8 <= n) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    if (w & 0x8080808080808080ULL) break;
    i += 8;
  }
  while (i < n && static_cast<unsigned char>(s[i]) < 0x80) ++i;
  return i;
}
}  // namespace

bool is_valid(std::string_view s) {
  size_t i = 0;
  while ((i = skip_ascii(s, i)) < s.size()) {
    const Seq q = examine(s, i);
    if (q.status != SeqStatus::kValid) return false;
    i += q.len;
  }
  return true;
}

void append_lossy(std::string_view s, std::string& out) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t j = skip_ascii(s, i);
    out.append(s.data() + i, j - i);
    i = j;
    if (i >= s.size()) break;
    const Seq q = examine(s, i);
    if (q.status == SeqStatus::kValid)
      out.append(s.data() + i, q.len);
    else
      out.append(kReplacement);
    i += q.len;
  }
}

std::string to_valid(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  append_lossy(s, out);
  return out;
}

size_t complete_prefix(std::string_view s) {
  size_t i = 0;
  while ((i = skip_ascii(s, i)) < s.size()) {
    const Seq q = examine(s, i);
    if (q.status == SeqStatus::kIncomplete) return i;
    i += q.len;
  }
  return s.size();
}

std::string clip(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return to_valid(s);
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return to_valid(s.substr(0, cut)) + "...";
}

void append_codepoint(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t next(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned char b0 = p[i];
  const size_t len = char_len(b0);
  uint32_t cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t k = 1; k < len && i + k < s.size(); ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
  i += len;
  return cp;
}

uint32_t next_escaped(std::string_view s, size_t& i) {
  const Seq q = examine(s, i);
  if (q.status == SeqStatus::kValid) {
    i += q.len;
    return q.cp;
  }
  return 0xDC00 + static_cast<unsigned char>(s[i++]);
}

}  // namespace spool::utf8
