// The tokenizer.json "normalizer": Unicode normalization forms (utf8proc), possibly in a
// Sequence; null means identity. Other normalizer types are rejected at load time.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace spool::tokenizer {

/// An immutable normalizer pipeline.
class Normalizer {
 public:
  /// Identity normalizer.
  Normalizer() = default;

  /// Parses the tokenizer.json "normalizer" value (object or null). Supports NFC, NFD,
  /// NFKC, NFKD and Sequence of those; throws spool::Error "<label>: unsupported
  /// normalizer type ..." otherwise.
  static Normalizer from_json(const nlohmann::json& j, const std::string& label);

  /// True if normalize() never changes its input.
  bool is_identity() const { return forms_.empty(); }

  /// Normalizes well-formed UTF-8 `text`.
  std::string normalize(std::string_view text) const;

 private:
  std::vector<int> forms_;  // utf8proc option masks, applied in order
};

}  // namespace spool::tokenizer
