// spool::tokenizer::Tokenizer: a Hugging Face tokenizer.json byte-level BPE tokenizer that
// produces exactly the ids of HF `tokenizers` (added tokens, normalizer, pre-tokenizer,
// BPE model, ByteLevel decoder), plus the tokenizer_config.json facts the engine needs
// (bos/eos, chat template, what add_special_tokens=True adds). A GGUF file's tokenizer.ggml.*
// vocabulary is built into the same form (from_gguf), SentencePiece ones ("llama") with the
// Spm model in place of pre-tokenizer + BPE.
//
// Thread safety: a loaded Tokenizer is immutable apart from an internal, locked word
// cache; all const methods may be called concurrently. Copies share the loaded data.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace spool::tokenizer {

class StreamDecoder;

/// A GGUF file's tokenizer metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`; see
/// the GGUF notes (ggml docs/gguf.md) section 2.4), read by the caller from the file.
struct GgufVocab {
  std::string label;                 ///< the file, for messages
  std::string model;                 ///< tokenizer.ggml.model ("gpt2" byte-level BPE, "llama" SentencePiece)
  std::string pre;                   ///< tokenizer.ggml.pre ("qwen2", "deepseek-v3", ...; gpt2 only)
  std::vector<std::string> tokens;   ///< index = id (byte-level alphabet form for gpt2, "▁" for spaces for llama)
  std::vector<float> scores;         ///< tokenizer.ggml.scores (llama: merge priority, higher first; may be empty)
  std::vector<std::string> merges;   ///< "left right", rank = index (gpt2)
  std::vector<int32_t> token_types;  ///< 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte (may be empty)
  std::optional<int64_t> bos, eos, pad, unk;
  std::optional<bool> add_bos;           ///< tokenizer.ggml.add_bos_token (unset: true for llama, false for gpt2)
  std::optional<bool> add_eos;           ///< tokenizer.ggml.add_eos_token (unset: false)
  std::optional<bool> add_space_prefix;  ///< tokenizer.ggml.add_space_prefix (unset: true for llama)
  std::string chat_template;  ///< tokenizer.chat_template ("" if absent)
};

/// A loaded tokenizer. Create with load(), from_json() or from_gguf().
class Tokenizer {
 public:
  /// Builds the tokenizer a GGUF's metadata describes, with the ids of the Hugging Face tokenizer
  /// it was converted from (and of llama.cpp):
  ///  - model "gpt2": byte-level BPE over `tokens` and `merges`, with the normalizer and the
  ///    pre-tokenizer regexes of the HF tokenizer.json that `pre` names (qwen2 and its aliases,
  ///    qwen35, deepseek-v3, llama-bpe, glm4, gpt-4o / minimax-m2, gpt-2 / olmo, ...; see
  ///    gguf_pre_tokenizer in tokenizer.cpp for the list);
  ///  - model "llama": SentencePiece BPE (class Spm) over `tokens` and `scores`, with a space
  ///    prefixed to the text and after every added token when add_space_prefix, byte-fallback
  ///    tokens, and decode() dropping the prefix space as HF's Llama tokenizers do.
  /// Control (3) and unknown (2) tokens are special added tokens, user-defined ones (4)
  /// non-special added tokens (matched in the raw text); the chat template, BOS/EOS as
  /// add_bos_token / add_eos_token say. Throws spool::Error naming the file and the value for
  /// another tokenizer model or an unknown `pre`.
  static Tokenizer from_gguf(const GgufVocab& v);

  /// Loads `dir`/tokenizer.json, plus `dir`/tokenizer_config.json and
  /// `dir`/chat_template.jinja when present. Throws spool::Error naming the file on a
  /// missing or malformed file or an unsupported tokenizer component.
  static Tokenizer load(const std::string& dir);

  /// Builds a tokenizer from the text of tokenizer.json and of tokenizer_config.json (may
  /// be empty). `label` names the source in error messages.
  static Tokenizer from_json(const std::string& tokenizer_json_text,
                             const std::string& tokenizer_config_text, const std::string& label);

  /// Token ids of `text` (UTF-8; ill-formed bytes are read as U+FFFD). With
  /// `add_special`, adds what transformers adds with add_special_tokens=True (e.g. the BOS
  /// of DeepSeek-V3; nothing for Qwen).
  std::vector<int32_t> encode(std::string_view text, bool add_special = false) const;

  /// A plain (non-chat) prompt's ids: encode(text, true), as HF's tokenizer(text), vLLM and
  /// llama.cpp do, except that when the text itself begins with the tokens add_special puts first
  /// (a rendered chat that writes its own BOS) they are not put there twice.
  std::vector<int32_t> encode_prompt(std::string_view text) const;

  /// Text of `ids`; always well-formed UTF-8 (ill-formed byte sequences become U+FFFD).
  /// With `skip_special`, special added tokens are left out. Throws spool::Error on an
  /// id that is not in the vocabulary.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  /// Id of the token string `token` (added tokens first, then the model vocabulary);
  /// -1 if unknown.
  int32_t token_to_id(std::string_view token) const;

  /// The raw vocabulary string of `id` (byte-level alphabet form, e.g. "Ġthe"); "" if out
  /// of range or unassigned.
  std::string id_to_token(int32_t id) const;

  /// The bytes the decoder produces for `id` alone (byte-level BPE: the alphabet mapped back,
  /// "Ġthe" -> " the"; SentencePiece: "▁" as a space and "<0x0A>" as its byte); "" if out of
  /// range or unassigned. May be part of a UTF-8 character.
  std::string id_to_bytes(int32_t id) const;

  /// Max id + 1 over the vocabulary and the added tokens.
  int32_t vocab_size() const;

  /// True if `id` is an added token marked special.
  bool is_special(int32_t id) const;

  /// Id of tokenizer_config.json "bos_token", if set and known.
  std::optional<int32_t> bos_id() const;

  /// Id of tokenizer_config.json "eos_token", if set and known.
  std::optional<int32_t> eos_id() const;

  /// The chat template: chat_template.jinja in the directory, else tokenizer_config.json
  /// "chat_template"; "" if none.
  const std::string& chat_template() const;

  /// tokenizer_config.json as parsed (an empty object if absent).
  const nlohmann::json& config() const;

 private:
  friend class StreamDecoder;
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  // from_gguf for tokenizer.ggml.model "llama" (SentencePiece BPE).
  static Tokenizer from_gguf_spm(const GgufVocab& v);
  // Parses and assembles everything; labels name the sources in error messages.
  static std::shared_ptr<Impl> build(const std::string& json_text, const std::string& label,
                                           const std::string& config_text,
                                           const std::string& config_label,
                                           const std::string* chat_template_file);
  // Validates `id` (spool::Error if unknown) and tells whether decode(skip_special) drops it.
  bool check_id(int32_t id, bool skip_special) const;
  // Bytes the decoder produces for `id` (valid id required).
  const std::string& token_bytes(int32_t id) const;
  // True if the decoder joins token strings with spaces (null decoder).
  bool joins_with_space() const;

  std::shared_ptr<const Impl> impl_;
};

}  // namespace spool::tokenizer
