// The tokenizer.json "pre_tokenizer": splits normalized text into words before BPE.
// Supports Split (Regex or String pattern, all five behaviours, invert), ByteLevel
// (add_prefix_space, use_regex with GPT-2's regex), Digits and Sequence, with exactly the
// semantics of Hugging Face tokenizers (empty pieces are dropped after every step).
#pragma once

#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace spool::tokenizer {

/// Reusable per-call buffers for PreTokenizer::run (one per encode call).
struct PreTokenizeScratch {
  MatchScratch match;                  ///< PCRE2 match data
  std::vector<ByteRange> ranges;       ///< regex matches of the current piece
  std::vector<std::string_view> next;  ///< pieces being built by the current step
  std::deque<std::string>
      arena;  ///< storage for text created by a step (prefix space, byte mapping)
};

/// An immutable pre-tokenizer pipeline; safe to share between threads.
class PreTokenizer {
 public:
  /// No pre-tokenization: the whole text is one word.
  PreTokenizer();
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;

  /// Parses the tokenizer.json "pre_tokenizer" value (object or null). Throws spool::Error
  /// "<label>: ..." for unsupported types, bad fields or invalid regexes.
  static PreTokenizer from_json(const nlohmann::json& j, const std::string& label);

  /// True if the last step is a ByteLevel pre-tokenizer. Then run() leaves words as raw
  /// bytes and the model applies the byte alphabet itself (same result, less copying).
  bool defers_byte_mapping() const { return defer_byte_mapping_; }

  /// Splits well-formed UTF-8 `text` into non-empty words, appended to `out`. The views
  /// point into `text` or into scratch.arena, so both must outlive their use.
  void run(std::string_view text, PreTokenizeScratch& scratch,
           std::vector<std::string_view>& out) const;

 private:
  struct Step;
  static void parse_steps(const nlohmann::json& j, const std::string& label, int depth,
                          std::vector<Step>& steps);
  std::vector<Step> steps_;
  bool defer_byte_mapping_ = false;
};

}  // namespace spool::tokenizer
