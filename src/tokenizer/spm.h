// SentencePiece BPE as llama.cpp runs a GGUF vocabulary of tokenizer.ggml.model "llama"
// (Llama 1/2, Mistral, Mixtral): tokens with scores, no merge list. The text of one segment
// (already prefixed and with spaces written as U+2581 "▁" by the caller) is split into UTF-8
// characters; the adjacent pair whose concatenation is a vocabulary token with the highest
// score merges first (ties: the leftmost pair), until no pair is a token. A piece that is
// not a token is written as byte-fallback tokens "<0xXX>" (else the one-byte token; without
// those, one unknown token for the character). Source of the rules: SentencePiece's bpe_model.cc and llama.cpp's
// llm_tokenizer_spm (src/llama-vocab.cpp), read for facts only.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace spool::tokenizer {

/// An immutable SentencePiece-BPE vocabulary; encode() is thread-safe.
class Spm {
 public:
  /// `tokens[i]` and `scores[i]` are id i's string and score (`scores` may be shorter: missing
  /// scores are 0). `unk_id` is the unknown token (-1: none). A duplicated string maps to its
  /// last id, as llama.cpp's token_to_id. `label` names the source in error messages.
  Spm(const std::vector<std::string>& tokens, const std::vector<float>& scores, int32_t unk_id,
      const std::string& label);

  /// Appends the ids of `text` (well-formed UTF-8 with spaces already written as "▁"; may be
  /// empty). Throws spool::Error naming the source when a byte has neither a byte-fallback
  /// token nor a one-byte token and the vocabulary has no unknown token.
  void encode(std::string_view text, std::vector<int32_t>& out) const;

  /// Id of `token`, -1 if absent.
  int32_t lookup(std::string_view token) const;

 private:
  // Appends the tokens of a piece (one character) that is no token: its bytes' byte-fallback
  // tokens if all have one, else the unknown token (SentencePiece's rule), else spool::Error.
  void fallback(std::string_view piece, std::vector<int32_t>& out) const;

  std::string label_;
  std::vector<std::string> strings_;                     // id -> string
  std::unordered_map<std::string_view, int32_t> ids_;    // views into strings_
  std::vector<float> scores_;                            // id -> score
  std::array<int32_t, 256> byte_ids_{};                  // "<0xXX>" else the one-byte token, -1 if none
  int32_t unk_id_ = -1;
};

}  // namespace spool::tokenizer
