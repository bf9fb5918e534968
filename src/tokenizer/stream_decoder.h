// Incremental decoding for streaming generation: feed ids one at a time, get back only
// complete UTF-8 characters. The concatenation of all push() results and flush() equals
// Tokenizer::decode of the same ids.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "tokenizer/tokenizer.h"

namespace spool::tokenizer {

/// Incremental decode that never splits a UTF-8 character. Holds a copy of the tokenizer
/// (cheap: shared data), so it may outlive the Tokenizer it was made from.
class StreamDecoder {
 public:
  /// Starts an empty stream; with `skip_special`, special added tokens produce no text.
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false);

  /// Adds one token and returns the text that became complete (may be ""). A multi-byte
  /// character split across tokens is held back until it completes; bytes that can never
  /// form a character are emitted as U+FFFD. Throws spool::Error on an unknown id.
  std::string push(int32_t id);

  /// Returns the held-back rest (an incomplete character becomes U+FFFD) and resets the
  /// stream.
  std::string flush();

 private:
  Tokenizer tok_;
  bool skip_special_;
  bool any_token_ = false;  // for the null decoder's space joining
  std::string pending_;     // bytes of an incomplete trailing character (< 4 bytes)
};

}  // namespace spool::tokenizer
