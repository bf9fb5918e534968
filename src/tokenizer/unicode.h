// Unicode character predicates with the exact meanings the Hugging Face tokenizers
// library (Rust) gives them, used for added-token flags and the Digits pre-tokenizer.
#pragma once

#include <cstdint>

namespace spool::tokenizer::unicode {

/// Unicode White_Space property (Rust char::is_whitespace, regex \s).
bool is_white_space(uint32_t cp);

/// Rust regex's Unicode \w: Alphabetic, marks, decimal digits, connector punctuation,
/// join controls (Alphabetic approximated by letters, Nl and the circled letters).
bool is_word_char(uint32_t cp);

/// Rust char::is_numeric: general category Nd, Nl or No.
bool is_numeric(uint32_t cp);

}  // namespace spool::tokenizer::unicode
