#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "common/error.h"
#include "tokenizer/utf8.h"

namespace spool::tokenizer {

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
  uint32_t options = PCRE2_UTF | PCRE2_UCP;
  if (literal) options |= PCRE2_LITERAL;
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  auto code = std::make_shared<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                             &err, &err_offset, nullptr);
  if (code->code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    fail("%s: invalid regex at offset %zu: %s (pattern: %.200s)", label.c_str(),
         static_cast<size_t>(err_offset), reinterpret_cast<const char*>(msg),
         utf8::to_valid(pattern).c_str());
  }
  code->jit = pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE) == 0;
  code_ = std::move(code);
}

void Regex::find_all(std::string_view text, MatchScratch& scratch,
                     std::vector<ByteRange>& out) const {
  auto* md = static_cast<pcre2_match_data*>(scratch.data());
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0;            // where the next search starts
  size_t last_end = SIZE_MAX;  // end of the previous reported match
  while (pos <= n) {
    // Callers guarantee well-formed UTF-8 and char-aligned offsets.
    int rc = pcre2_match(code_->code, subject, n, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code_->code, subject, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                       nullptr);
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
