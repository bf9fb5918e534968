// UTF-8 helpers shared by every module (tokenizer, chat templates, server): validation, lossy
// repair (U+FFFD for ill-formed bytes, following Unicode's "maximal subpart" practice exactly
// like Rust's String::from_utf8_lossy and Python's errors="replace"), encoding, decoding
// (strict, and Python's "surrogateescape"), and incremental-decode support.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace spool::utf8 {

/// The replacement character U+FFFD, UTF-8 encoded.
inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

/// Outcome of examining the byte sequence that starts at one offset.
enum class SeqStatus {
  kValid,       ///< a complete, well-formed character
  kInvalid,     ///< an ill-formed subpart: becomes one U+FFFD
  kIncomplete,  ///< the input ends inside an otherwise well-formed character
};

/// One examined sequence. `len` is its length in bytes (>= 1); `cp` is the code point
/// when status is kValid (0 otherwise).
struct Seq {
  SeqStatus status;
  uint32_t cp;
  size_t len;
};

/// Examines the sequence starting at s[i]; requires i < s.size().
Seq examine(std::string_view s, size_t i);

/// True if `s` is entirely well-formed UTF-8.
bool is_valid(std::string_view s);

/// Appends `s` to `out`, replacing each ill-formed subpart and a truncated final
/// character with U+FFFD.
void append_lossy(std::string_view s, std::string& out);

/// Returns `s` with ill-formed bytes replaced by U+FFFD (see append_lossy).
std::string to_valid(std::string_view s);

/// Length of the longest prefix of `s` that can be emitted now: all of `s` except a trailing
/// character that is well-formed so far but incomplete (0 to 3 bytes held back).
size_t complete_prefix(std::string_view s);

/// At most `max_bytes` of `s` (cut at a character boundary, repaired), for error messages.
std::string clip(std::string_view s, size_t max_bytes = 100);

/// Appends the UTF-8 encoding of code point `cp` (at most U+10FFFF; a surrogate gets its
/// 3-byte form).
void append_codepoint(uint32_t cp, std::string& out);

/// Decodes the code point at s[i] of a well-formed string and advances i past it.
uint32_t next(std::string_view s, size_t& i);

/// Decodes the code point at s[i] (requires i < s.size()) and advances i past it; a byte b
/// that does not start a well-formed character becomes U+DC00+b and i advances by one
/// (Python's "surrogateescape").
uint32_t next_escaped(std::string_view s, size_t& i);

/// Byte length of the character whose lead byte is `lead` in well-formed UTF-8.
inline size_t char_len(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

}  // namespace spool::utf8
