// Thin RAII wrapper over PCRE2 (UTF + UCP, JIT when available) with the match iteration
// that Hugging Face tokenizers gets from Oniguruma's find_iter.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace spool::tokenizer {

/// A half-open byte range [start, end) of a string.
struct ByteRange {
  size_t start;
  size_t end;
};

/// Per-call match workspace (PCRE2 match data). Not shareable between threads; create one
/// per encode call. Works with every Regex.
class MatchScratch {
 public:
  MatchScratch();
  ~MatchScratch();
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
  /// The underlying pcre2_match_data_8* (opaque here so pcre2.h stays out of headers).
  void* data() const { return data_; }

 private:
  void* data_;
};

/// A compiled, immutable regular expression; safe to use from several threads at once.
class Regex {
 public:
  /// Compiles `pattern` (PCRE2 syntax, UTF-8). With `literal`, the pattern is matched as a
  /// plain string. Throws spool::Error "<label>: invalid regex ..." on a bad pattern.
  Regex(std::string_view pattern, bool literal, const std::string& label);

  /// Appends to `out` every match in `text` (well-formed UTF-8), left to right and
  /// non-overlapping. An empty match directly after the previous match is skipped and the
  /// search moves on one character, as Oniguruma's find_iter does. Throws spool::Error if
  /// PCRE2 gives up (match/heap limits of a pathological pattern).
  void find_all(std::string_view text, MatchScratch& scratch, std::vector<ByteRange>& out) const;

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string label_;
};

}  // namespace spool::tokenizer
