// Jinja2 lexer with the settings transformers uses (trim_blocks, lstrip_blocks,
// keep_trailing_newline=False): splits template source into data and tag tokens, applying
// whitespace control (`{%-`, `-%}`, `{%+`, `+%}`) exactly like jinja2.lexer.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace spool::tmpl {

/// Token types (operators carry their spelling in Token::text).
enum class Tok : uint8_t { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Integer, Float, Op, Eof };

/// One lexed token.
struct Token {
  Tok type = Tok::Eof;
  std::string text;   ///< data, name, decoded string literal or operator spelling
  int64_t ival = 0;   ///< Integer value
  double fval = 0;    ///< Float value
  uint32_t offset = 0;  ///< byte offset in the normalized source (for error positions)
};

/// Template source after jinja2's newline normalization, for error positions.
struct SourceInfo {
  std::string label;
  std::string text;
  /// "line L, column C" for a byte offset.
  std::string where(uint32_t offset) const;
  /// Throws spool::Error("template 'label': msg at line L, column C").
  [[noreturn]] void error(uint32_t offset, const std::string& msg) const;
};

/// Normalizes newlines (\r\n and \r become \n) and drops one trailing newline.
std::string normalize_source(std::string_view source);

/// Tokenizes normalized source; throws spool::Error on lexical errors. Ends with Eof.
std::vector<Token> tokenize(const SourceInfo& src);

}  // namespace spool::tmpl
