// The tokenizer.json "added_tokens": tokens matched in the raw (or normalized) text before
// pre-tokenization, with HF tokenizers' id assignment, leftmost-longest matching and
// single_word / lstrip / rstrip / normalized semantics.
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace spool::tokenizer {

class Bpe;
class Normalizer;

/// One added token (tokenizer.json "added_tokens" entry) with the id HF assigns it.
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;  ///< only match when not inside a word
  bool lstrip = false;       ///< also swallow whitespace on the left
  bool rstrip = false;       ///< also swallow whitespace on the right
  bool normalized = true;    ///< match against normalized text (else raw text)
  bool special = false;      ///< special token (skipped by decode(skip_special))
};

/// A segment of text produced by AddedVocab::split: an added token (id >= 0) or plain
/// text (id == -1) covering bytes [start, end).
struct TextSegment {
  size_t start;
  size_t end;
  int32_t id;
};

/// The set of added tokens and their two matchers (raw-text and normalized-text).
class AddedVocab {
 public:
  /// No added tokens.
  AddedVocab() = default;

  /// Registers the "added_tokens" array in order, as HF add_tokens does: a token whose
  /// content is already in the vocabulary (added or model) keeps that id, others get the
  /// next id after the model vocabulary; normalized tokens are matched in their normalized
  /// form. The file's own ids are only checked (a mismatch logs a warning). Throws
  /// spool::Error "<label>: ..." on malformed entries.
  static AddedVocab from_json(const nlohmann::json& added_tokens, const Bpe& model,
                              const Normalizer& normalizer, const std::string& label);

  /// Splits `text` around the added tokens of one kind (normalized == false: tokens
  /// matched in raw text; true: tokens matched in normalized text) and appends segments in
  /// order. With lstrip/rstrip, token segments include the swallowed whitespace.
  void split(std::string_view text, bool normalized, std::vector<TextSegment>& out) const;

  /// True if some token is matched against normalized text.
  bool has_normalized() const { return !norm_.terminal.empty(); }

  /// The token registered with `id`, or nullptr.
  const AddedToken* find(int32_t id) const;

  /// Id of the added token whose content is `content`.
  std::optional<int32_t> token_to_id(std::string_view content) const;

  /// The string HF uses for `id` when decoding: the normalized content for normalized
  /// tokens, else the content; nullptr if `id` is not an added token.
  const std::string* id_to_token(int32_t id) const;

  /// True if `content` is the content of a special added token.
  bool is_special_content(std::string_view content) const;

  /// All registered tokens, in registration order.
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // Byte trie for leftmost-longest matching.
  struct Trie {
    std::unordered_map<uint64_t, int32_t> edges;  // (node << 8 | byte) -> child node
    std::vector<int32_t> terminal;                // node -> token id, -1 if none
    std::array<bool, 256> first{};                // bytes that start some pattern
    void insert(std::string_view pattern, int32_t id);
    // Longest pattern starting at text[pos]: its length and id, or {0, -1}.
    std::pair<size_t, int32_t> longest_at(std::string_view text, size_t pos) const;
  };

  void rebuild_matchers(const Normalizer& normalizer);

  std::vector<AddedToken> tokens_;                               // registration order
  std::unordered_map<int32_t, size_t> by_id_;                    // id -> index in tokens_
  std::unordered_map<std::string, int32_t> by_content_;          // content -> id
  std::unordered_map<int32_t, std::string> normalized_content_;  // only where it differs
  std::unordered_set<std::string> special_contents_;
  Trie raw_;
  Trie norm_;
};

}  // namespace spool::tokenizer
