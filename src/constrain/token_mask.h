// Token masks for constrained decoding: which vocabulary tokens keep the output a valid prefix
// of a grammar.
//
// TokenIndex is a byte trie of every token's decoded bytes (built once per tokenizer). A mask is
// a depth-first walk of the trie that advances the matcher's stack set one byte per trie edge and
// prunes a subtree as soon as no stack survives, so its cost is the number of trie nodes whose
// bytes are still a valid continuation (in a JSON punctuation state a few dozen; inside a free
// string most of the trie) instead of vocabulary size times token length. Masks are cached per
// matcher state (a string's repeated state costs one walk).
//
// Assumption: the text of a token sequence is the concatenation of the tokens' bytes
// (Tokenizer::id_to_bytes), true of byte-level BPE (Qwen, DeepSeek, GLM, ...); SentencePiece's
// dropped leading space on the first token is not modelled.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "constrain/grammar.h"

namespace spool::tokenizer {
class Tokenizer;
}

namespace spool::constrain {

/// Byte trie over a vocabulary's decoded tokens. Immutable after construction; thread-safe to share.
class TokenIndex {
 public:
  /// `bytes[id]`: the bytes token `id` decodes to; `special[id]`: a special token (left out of
  /// the trie: only a Constraint's special_texts admit one). Empty tokens are left out.
  TokenIndex(std::vector<std::string> bytes, std::vector<char> special);
  /// Index of `tok`'s vocabulary, ids [0, vocab_size) (ids the tokenizer does not know are
  /// never allowed).
  static std::shared_ptr<const TokenIndex> from_tokenizer(const tokenizer::Tokenizer& tok, int64_t vocab_size);

  int64_t vocab_size() const { return static_cast<int64_t>(bytes_.size()); }
  /// Decoded bytes of `id` ("" when out of range).
  const std::string& bytes(int32_t id) const;
  /// True for a special token.
  bool special(int32_t id) const { return id >= 0 && id < vocab_size() && special_[static_cast<size_t>(id)]; }
  /// Trie nodes (for tests and reports).
  size_t nodes() const { return first_child_.size(); }

 private:
  friend class ConstraintState;
  std::vector<std::string> bytes_;
  std::vector<char> special_;
  // CSR trie: node i's children are child_byte_/child_node_[first_child_[i] .. first_child_[i+1]);
  // its tokens token_ids_[first_token_[i] .. first_token_[i+1]). Node 0 is the root.
  std::vector<uint32_t> first_child_, first_token_;
  std::vector<uint8_t> child_byte_;
  std::vector<uint32_t> child_node_;
  std::vector<int32_t> token_ids_;
};

/// A TokenIndex built on first use (a vocabulary trie costs tens of milliseconds and memory, so
/// servers that never constrain never pay for it). Thread-safe. `tok` must outlive it.
class LazyTokenIndex {
 public:
  LazyTokenIndex(const tokenizer::Tokenizer& tok, int64_t vocab_size) : tok_(tok), vocab_(vocab_size) {}
  /// The index (built by the first caller).
  std::shared_ptr<const TokenIndex> get();

 private:
  const tokenizer::Tokenizer& tok_;
  int64_t vocab_;
  std::once_flag once_;
  std::shared_ptr<const TokenIndex> ix_;
};

/// A compiled constraint (vocabulary-independent), shared by the requests that use it.
struct Constraint {
  std::shared_ptr<const Grammar> grammar;
  /// Special tokens whose text the grammar's markup needs (e.g. a family's tool-call
  /// delimiters when they are special tokens); every other special token is masked.
  std::vector<std::string> special_texts;
  std::string what;  ///< for messages, e.g. "tool call of get_weather"
};

/// One sequence's constraint state: the matcher and its masks. Not thread-safe.
class ConstraintState {
 public:
  /// `end_ids`: tokens that end generation (EOS, <|im_end|>): allowed only where the grammar
  /// accepts. Throws spool::Error when the grammar admits no first byte.
  ConstraintState(std::shared_ptr<const Constraint> c, std::shared_ptr<const TokenIndex> index, std::vector<int32_t> end_ids);
  /// Sets `mask` to ceil(vocab/64) words, bit id set when token id is allowed now; returns how
  /// many are allowed.
  int64_t fill_mask(std::vector<uint64_t>& mask);
  /// Advances over token `id`. False (state unchanged) when the token is not allowed.
  bool accept(int32_t id);
  /// True when the output so far is complete.
  bool accepting() const { return m_.accepting(); }
  /// The matcher (tests).
  Matcher& matcher() { return m_; }

 private:
  bool walk(const std::string& bytes, std::vector<int32_t>& tmp);
  void visit(uint32_t node, size_t begin, size_t end, uint64_t* mask, int64_t& count);

  std::shared_ptr<const Constraint> c_;
  std::shared_ptr<const TokenIndex> ix_;
  std::vector<int32_t> end_ids_, special_ok_;
  Matcher m_;
  std::vector<int32_t> pool_;
  std::map<std::vector<int32_t>, std::pair<std::vector<uint64_t>, int64_t>> cache_;
};

}  // namespace spool::constrain
