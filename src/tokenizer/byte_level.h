// GPT-2's reversible byte <-> Unicode alphabet used by "ByteLevel" pre-tokenizers and
// decoders: the 188 printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order, so any byte string becomes printable text and back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace spool::tokenizer::byte_level {

/// Code point that stands for byte `b` (always < U+0144).
uint32_t byte_to_codepoint(uint8_t b);

/// Byte that code point `cp` stands for, or -1 if `cp` is not in the alphabet.
int codepoint_to_byte(uint32_t cp);

/// UTF-8 encoding (1 or 2 bytes) of byte_to_codepoint(b).
std::string_view byte_to_utf8(uint8_t b);

/// Appends the alphabet form of raw bytes `raw` to `out` (1-2 output bytes per input byte).
void map_bytes(std::string_view raw, std::string& out);

/// ByteLevel decoder rule for one token string: its bytes if every character is in the
/// alphabet, otherwise the token's own UTF-8 text unchanged (as HF does for added tokens
/// like "<｜begin▁of▁sentence｜>").
std::string token_to_bytes(std::string_view token);

}  // namespace spool::tokenizer::byte_level
