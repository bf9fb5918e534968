// Streaming matcher for OpenAI `stop` strings over generated text fed in pieces.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace spool::server {

/// Cuts generated text at the first occurrence of any stop string, holding back text that may
/// still become (the start of) a match. The result does not depend on how the text is split:
/// the output is the text before the *earliest* position at which any stop string occurs (a
/// complete match is not final while an earlier position may still start a longer stop string,
/// e.g. stops {"abcd", "bc"} on "abc" wait for the next byte). The stop string and everything
/// after it are discarded (vLLM's include_stop_str_in_output=false).
class StopMatcher {
 public:
  /// Throws spool::Error for an empty stop string or one that is not valid UTF-8 (so a match
  /// always starts on a character boundary and held-back text never splits a character).
  explicit StopMatcher(std::vector<std::string> stops);

  /// Appends `text`; returns the text that is now known not to be part of a stop string.
  /// Returns "" once stopped().
  std::string push(std::string_view text);

  /// End of input: returns all held-back text before a match (if any).
  std::string finish();

  /// True once a stop string matched.
  bool stopped() const { return stopped_; }

  /// Index into the stop list of the string that matched (-1 before a match).
  int matched() const { return matched_; }

 private:
  std::string release(bool eof);
  size_t earliest_partial(size_t limit) const;

  std::vector<std::string> stops_;
  size_t max_len_ = 0;
  std::string held_;
  bool stopped_ = false;
  int matched_ = -1;
};

/// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or values past U+10FFFF).
bool valid_utf8(std::string_view s);

}  // namespace spool::server
