#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "common/error.h"
#include "tokenizer/utf8.h"

namespace spool::tokenizer {

namespace {

// Oniguruma (what HF tokenizers uses) and PCRE2 disagree on a few shorthand classes:
// Onig's Unicode \s is 09-0D, 85 and Z* (PCRE2 adds U+180E), its \w is L|M|N|Pc (PCRE2
// 10.42: L|N|_), and its \h is a hex digit (PCRE2: horizontal space). These are spelled
// out explicitly. Inside a character class only the positive forms can be expanded; the
// negated ones (\S, \W, \H inside [...]) keep PCRE2's meaning.
constexpr std::string_view kSpaceSet = "\\t\\n\\x{0B}\\f\\r\\x{85}\\p{Z}";
constexpr std::string_view kWordSet = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
constexpr std::string_view kHexSet = "0-9a-fA-F";

std::string onig_to_pcre(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      if (e == 'Q') {  // \Q...\E: copied verbatim
        const size_t end = p.find("\\E", i + 2);
        const size_t stop = end == std::string_view::npos ? p.size() : end + 2;
        out.append(p.substr(i, stop - i));
        i = stop;
        continue;
      }
      std::string_view set;
      bool negated = false;
      switch (e) {
        case 's':
          set = kSpaceSet;
          break;
        case 'S':
          set = kSpaceSet;
          negated = true;
          break;
        case 'w':
          set = kWordSet;
          break;
        case 'W':
          set = kWordSet;
          negated = true;
          break;
        case 'h':
          set = kHexSet;
          break;
        case 'H':
          set = kHexSet;
          negated = true;
          break;
        default:
          break;
      }
      if (!set.empty() && !(in_class && negated)) {
        if (in_class) {
          out.append(set);
        } else {
          out.append(negated ? "[^" : "[");
          out.append(set);
          out.push_back(']');
        }
      } else {
        out.push_back(c);
        out.push_back(e);
      }
      i += 2;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      ++i;
      if (i < p.size() && p[i] == '^') out.push_back(p[i++]);
      if (i < p.size() && p[i] == ']') out.push_back(p[i++]);  // leading ']' is literal
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      const size_t end = p.find(":]", i + 2);  // POSIX class [:name:]
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 2;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out.push_back(c);
    ++i;
  }
  return out;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

MatchScratch::MatchScratch() : data_(pcre2_match_data_create(1, nullptr)) {
  if (data_ == nullptr) throw std::bad_alloc();
}

MatchScratch::~MatchScratch() { pcre2_match_data_free(static_cast<pcre2_match_data*>(data_)); }

Regex::Regex(std::string_view pattern, bool literal, const std::string& label) : label_(label) {
  // PCRE2_LITERAL admits no UCP (and needs none).
  const uint32_t options = literal ? (PCRE2_UTF | PCRE2_LITERAL) : (PCRE2_UTF | PCRE2_UCP);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  const std::string translated = literal ? std::string(pattern) : onig_to_pcre(pattern);
  auto code = std::make_shared<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                             options, &err, &err_offset, nullptr);
  if (code->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    fail("%s: invalid regex (%s at offset %zu of '%s')", label.c_str(),
         reinterpret_cast<const char*>(msg), static_cast<size_t>(err_offset),
         utf8::clip(translated, 200).c_str());
  }
  code->jit = pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE) == 0;
  code_ = std::move(code);
}

void Regex::find_all(std::string_view text, MatchScratch& scratch,
                     std::vector<ByteRange>& out) const {
  auto* md = static_cast<pcre2_match_data*>(scratch.data());
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0;              // where the next search starts
  size_t last_end = SIZE_MAX;  // end of the previous reported match
  while (pos <= n) {
    // Callers guarantee well-formed UTF-8 and char-aligned offsets.
    int rc = pcre2_match(code_->code, subject, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc =
          pcre2_match(code_->code, subject, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      fail("%s: regex matching failed: %s", label_.c_str(), reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    // \K can report a start before the search offset or an end before the start; clamp so
    // that ranges never go backwards.
    const size_t s = std::max<size_t>(ov[0], pos);
    const size_t end = std::max<size_t>(ov[1], s);
    if (s == end && last_end == s) {
      // Empty match right after the previous match: step one character and retry.
      if (s >= n) break;
      pos = s + utf8::char_len(static_cast<unsigned char>(text[s]));
      continue;
    }
    out.push_back({s, end});
    last_end = end;
    pos = end;
  }
}

}  // namespace spool::tokenizer
