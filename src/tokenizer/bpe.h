// The tokenizer.json "model" of type BPE: vocabulary, merges by rank, and the word-level
// merge loop of Hugging Face tokenizers (same priority order, unk / byte_fallback /
// fuse_unk / continuing_subword_prefix / end_of_word_suffix / ignore_merges handling),
// with a thread-safe cache of recently seen words.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace spool::tokenizer {

/// A loaded BPE model. Immutable after set_raw_byte_input(); encode_word is thread-safe.
class Bpe {
 public:
  /// Parses the tokenizer.json "model" object. Throws spool::Error "<label>: ..." for a
  /// non-BPE type ("unsupported model type"), a malformed vocab or merges that name
  /// tokens missing from the vocab.
  static Bpe from_json(const nlohmann::json& model, const std::string& label);

  ~Bpe();
  Bpe(Bpe&&) noexcept;
  Bpe& operator=(Bpe&&) noexcept;

  /// Declares that words handed to encode_word are raw bytes still to be written in the
  /// ByteLevel alphabet (each byte is one initial symbol). Default: words are already in
  /// model alphabet and each UTF-8 character is one initial symbol.
  void set_raw_byte_input(bool raw);

  /// Appends the token ids of one pre-tokenized word (non-empty, well-formed UTF-8 unless
  /// raw byte input is set). Throws spool::Error if the file's unk_token is needed but is
  /// not in the vocab.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  /// Vocabulary id of `token`, if present.
  std::optional<int32_t> token_to_id(std::string_view token) const;

  /// Vocabulary string of `id`, or nullptr if no vocab entry has that id.
  const std::string* id_to_token(int32_t id) const;

  /// Number of vocabulary entries (HF get_vocab_size).
  size_t vocab_count() const { return vocab_.size(); }

  /// Largest id in the vocabulary (-1 if empty).
  int32_t max_id() const { return static_cast<int32_t>(id_index_.size()) - 1; }

 private:
  Bpe();

  // One merge rule: the merged token id and the rule's rank (lower merges first).
  struct MergeRule {
    uint32_t rank;
    int32_t new_id;
  };
  // Open-addressing hash map (left id, right id) -> MergeRule.
  class PairMap {
   public:
    void reserve(size_t n);
    void insert_or_assign(int32_t a, int32_t b, MergeRule rule);
    const MergeRule* find(int32_t a, int32_t b) const;

   private:
    struct Slot {
      uint64_t key;
      MergeRule rule;
    };
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    std::vector<Slot> slots_;
    uint64_t mask_ = 0;
    size_t size_ = 0;
  };
  struct Cache;

  void merge_word(std::string_view word, std::vector<int32_t>& out) const;
  int32_t lookup(std::string_view s) const;  // -1 if absent

  std::vector<std::string> strings_;                     // vocab keys, stable storage
  std::unordered_map<std::string_view, int32_t> vocab_;  // views into strings_
  std::vector<int32_t> id_index_;                        // id -> index in strings_, -1 if none
  PairMap merges_;
  std::optional<std::string> unk_token_;
  int32_t unk_id_ = -1;
  std::optional<std::string> prefix_;  // continuing_subword_prefix
  std::optional<std::string> suffix_;  // end_of_word_suffix
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool raw_bytes_ = false;
  std::array<int32_t, 256> byte_ids_{};           // id of each byte's alphabet char, -1 if absent
  std::array<int32_t, 256> byte_fallback_ids_{};  // id of "<0xXX>", -1 if absent
  std::unique_ptr<Cache> cache_;
};

}  // namespace spool::tokenizer
