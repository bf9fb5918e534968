// The tokenizer.json "decoder": how token strings become output bytes. Supports ByteLevel
// (also inside a Sequence) and null (HF then joins token strings with spaces).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace spool::tokenizer {

/// An immutable token-string -> bytes decoder.
class Decoder {
 public:
  /// ByteLevel decoder.
  Decoder() = default;

  /// Parses the tokenizer.json "decoder" value (object or null). Throws spool::Error
  /// "<label>: unsupported decoder type ..." for other decoders.
  static Decoder from_json(const nlohmann::json& j, const std::string& label);

  /// The bytes one token string contributes (ByteLevel rule, or the string itself).
  std::string token_bytes(std::string_view token) const;

  /// True for a null decoder: HF joins the token strings with single spaces.
  bool joins_with_space() const { return !byte_level_; }

 private:
  bool byte_level_ = true;
};

}  // namespace spool::tokenizer
