#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/spm.h"
#include "tokenizer/utf8.h"

namespace spool::tokenizer {
namespace {

// Per-id flags.
constexpr uint8_t kValid = 1;    // the id has a token string
constexpr uint8_t kSpecial = 2;  // an added token with special=true
constexpr uint8_t kSkip = 4;     // decode(skip_special) drops it (HF: string is a special content)

// Reads a whole file; nullopt if it does not exist; spool::Error if it cannot be read.
std::optional<std::string> read_file(const std::filesystem::path& path, bool required) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    if (required) fail("%s: file not found", path.c_str());
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) fail("%s: cannot open: %s", path.c_str(), std::strerror(errno));
  std::string text(static_cast<size_t>(std::max<std::streamoff>(in.tellg(), 0)), '\0');
  in.seekg(0);
  if (!in.read(text.data(), static_cast<std::streamsize>(text.size()))) {
    fail("%s: read error", path.c_str());
  }
  return text;
}

nlohmann::json parse_json(const std::string& text, const std::string& label) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("%s: malformed JSON: %s", label.c_str(), e.what());
  }
}

const nlohmann::json& field(const nlohmann::json& j, const char* key) {
  static const nlohmann::json kNull;  // immutable
  const auto it = j.find(key);
  return it == j.end() ? kNull : *it;
}

// tokenizer_config.json "chat_template": a string, or a list of {name, template}.
std::string config_chat_template(const nlohmann::json& config, const std::string& config_label) {
  const nlohmann::json& t = field(config, "chat_template");
  if (t.is_null()) return "";
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    const nlohmann::json* chosen = nullptr;
    for (const auto& e : t) {
      if (!e.is_object() || !e.contains("template") || !e["template"].is_string()) continue;
      if (chosen == nullptr || (e.contains("name") && e["name"] == "default")) chosen = &e;
    }
    if (chosen != nullptr) return (*chosen)["template"].get<std::string>();
  }
  fail("%s: \"chat_template\" must be a string or a list of {name, template}",
       config_label.c_str());
}

}  // namespace

struct Tokenizer::Impl {
  explicit Impl(Bpe m) : model(std::move(m)) {}

  std::string label;
  Normalizer normalizer;
  PreTokenizer pre;
  Bpe model;
  AddedVocab added;
  Decoder decoder;
  SpecialWrap wrap;
  nlohmann::json config = nlohmann::json::object();
  std::string chat_template;
  std::optional<int32_t> bos;
  std::optional<int32_t> eos;
  int32_t vocab_size = 0;
  std::vector<std::string> bytes;  // [vocab_size] decoder output of each id
  std::vector<uint8_t> flags;      // [vocab_size] kValid | kSpecial | kSkip
  // SentencePiece vocabularies (from_gguf_spm): the model run between added tokens instead of
  // pre + model, and whether a space is prefixed to the text and after each added token.
  std::shared_ptr<const Spm> spm;
  bool space_prefix = false;

  std::optional<int32_t> lookup(std::string_view token) const {
    if (auto id = added.token_to_id(token)) return id;
    return model.token_to_id(token);
  }
};

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

std::shared_ptr<Tokenizer::Impl> Tokenizer::build(const std::string& json_text,
                                                        const std::string& label,
                                                        const std::string& config_text,
                                                        const std::string& config_label,
                                                        const std::string* chat_template_file) {
  try {
    const nlohmann::json j = parse_json(json_text, label);
    if (!j.is_object()) fail("%s: top level must be a JSON object", label.c_str());
    if (const nlohmann::json& v = field(j, "version"); !v.is_null() && v != "1.0") {
      fail("%s: unsupported tokenizer.json version '%s' (expected \"1.0\")", label.c_str(),
           v.is_string() ? utf8::to_valid(v.get_ref<const std::string&>().substr(0, 40)).c_str()
                         : "(not a string)");
    }
    nlohmann::json config = nlohmann::json::object();
    if (config_text.find_first_not_of(" \t\r\n") != std::string::npos) {
      config = parse_json(config_text, config_label);
      if (!config.is_object()) fail("%s: top level must be a JSON object", config_label.c_str());
    }
    const nlohmann::json& model_json = field(j, "model");
    if (model_json.is_null()) fail("%s: missing \"model\"", label.c_str());

    auto impl = std::make_shared<Impl>(Bpe::from_json(model_json, label));
    impl->label = label;
    impl->normalizer = Normalizer::from_json(field(j, "normalizer"), label);
    impl->pre = PreTokenizer::from_json(field(j, "pre_tokenizer"), label);
    impl->model.set_raw_byte_input(impl->pre.defers_byte_mapping());
    impl->decoder = Decoder::from_json(field(j, "decoder"), label);
    impl->added =
        AddedVocab::from_json(field(j, "added_tokens"), impl->model, impl->normalizer, label);

    // Per-id tables for decoding.
    int32_t max_id = impl->model.max_id();
    for (const AddedToken& t : impl->added.tokens()) max_id = std::max(max_id, t.id);
    impl->vocab_size = max_id + 1;
    impl->bytes.resize(static_cast<size_t>(impl->vocab_size));
    impl->flags.assign(static_cast<size_t>(impl->vocab_size), 0);
    for (int32_t id = 0; id < impl->vocab_size; ++id) {
      const std::string* s = impl->added.id_to_token(id);
      if (s == nullptr) s = impl->model.id_to_token(id);
      if (s == nullptr) continue;
      uint8_t f = kValid;
      const AddedToken* added = impl->added.find(id);
      if (added != nullptr && added->special) f |= kSpecial;
      if (impl->added.is_special_content(*s)) f |= kSkip;
      impl->flags[static_cast<size_t>(id)] = f;
      impl->bytes[static_cast<size_t>(id)] = impl->decoder.token_bytes(*s);
    }

    const Impl& ref = *impl;
    impl->wrap = build_special_wrap(
        field(j, "post_processor"), config, [&ref](std::string_view t) { return ref.lookup(t); },
        label, config_label);
    for (const auto* part : {&impl->wrap.prefix, &impl->wrap.suffix}) {
      for (const int32_t id : *part) {
        if (id < 0 || id >= impl->vocab_size ||
            (impl->flags[static_cast<size_t>(id)] & kValid) == 0) {
          fail("%s: post_processor special token id %d is not in the vocabulary", label.c_str(),
               id);
        }
      }
    }
    if (const auto bos = config_token(config, "bos_token", config_label))
      impl->bos = ref.lookup(*bos);
    if (const auto eos = config_token(config, "eos_token", config_label))
      impl->eos = ref.lookup(*eos);
    impl->chat_template = chat_template_file != nullptr
                              ? *chat_template_file
                              : config_chat_template(config, config_label);
    impl->config = std::move(config);
    return impl;
  } catch (const nlohmann::json::exception& e) {
    // Safety net: any JSON type mismatch not caught by an explicit check above.
    fail("%s: malformed tokenizer: %s", label.c_str(), e.what());
  }
}

Tokenizer Tokenizer::load(const std::string& dir) {
  const std::filesystem::path base(dir);
  const std::filesystem::path json_path = base / "tokenizer.json";
  const std::filesystem::path config_path = base / "tokenizer_config.json";
  const std::optional<std::string> json_text = read_file(json_path, true);
  const std::optional<std::string> config_text = read_file(config_path, false);
  const std::optional<std::string> jinja = read_file(base / "chat_template.jinja", false);
  return Tokenizer(build(*json_text, json_path.string(), config_text.value_or(""),
                         config_path.string(), jinja ? &*jinja : nullptr));
}

Tokenizer Tokenizer::from_json(const std::string& tokenizer_json_text,
                               const std::string& tokenizer_config_text, const std::string& label) {
  return Tokenizer(build(tokenizer_json_text, label, tokenizer_config_text,
                         label + " (tokenizer_config.json)", nullptr));
}

namespace {

// A tokenizer.json Split step (Isolated) of `regex`.
nlohmann::json split_step(const std::string& regex) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
}

// The normalizer and pre-tokenizer of the HF tokenizer.json that llama.cpp's converter names
// `pre` (convert_hf_to_gguf.py get_vocab_base_pre; llama.cpp's llama-vocab.cpp runs the same
// splits as its regex_exprs). Regexes are as tokenizer.json holds them after JSON decoding.
struct GgufPre {
  nlohmann::json normalizer;
  nlohmann::json pre_tokenizer;
  bool ignore_merges = false;  ///< BPE "ignore_merges": a word that is a token is that token
  bool no_bos = false;         ///< never a BOS, whatever add_bos_token says (llama.cpp: GLM-4's chat template starts with [gMASK])
};

GgufPre gguf_pre_tokenizer(const std::string& pre, const std::string& label) {
  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  auto seq = [&](std::vector<nlohmann::json> steps) {
    steps.push_back(byte_level);
    return nlohmann::json{{"type", "Sequence"}, {"pretokenizers", steps}};
  };
  const nlohmann::json nfc = {{"type", "NFC"}};
  // Qwen2 / Qwen3 (llama.cpp also maps a missing pre, "default", to this one here).
  if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "default")
    return {nfc, seq({split_step(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)")})};
  // Qwen3.5: \p{M} joins the letter runs, and no normalizer (llama.cpp's ggml-vocab-qwen35 cases:
  // a decomposed "e\u0301" stays two tokens).
  if (pre == "qwen35")
    return {nullptr, seq({split_step(R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)")})};
  // DeepSeek-V3 / R1 / Kimi-K2-style: digits in runs of up to 3, CJK/kana runs, then the word regex.
  if (pre == "deepseek-v3")
    return {nullptr, seq({split_step(R"(\p{N}{1,3})"), split_step("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"),
                          split_step(R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)")})};
  // GPT-2 and the GPT-NeoX family: ByteLevel's own regex ('s|'t|...| ?\p{L}+| ?\p{N}+|...); the
  // NeoX tokenizer of MPT normalizes with NFC.
  const nlohmann::json gpt2_bytes = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  if (pre == "gpt-2") return {nullptr, gpt2_bytes};
  if (pre == "mpt" || pre == "olmo") return {nfc, gpt2_bytes};  // OLMo(E): allenai/gpt-neox-olmo-dolma-v1_5, NFC
  // StarCoder / Refact: every digit its own word first.
  if (pre == "starcoder" || pre == "refact")
    return {nullptr, {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, gpt2_bytes}}}};
  // Llama 3 (ignore_merges: a word that is a token is that token), and GLM-4 / GLM-4.5, whose
  // regex is Llama 3's without ignore_merges (llama.cpp: "glm4" / "chatglm-bpe").
  const std::string llama3 = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") return {nullptr, seq({split_step(llama3)}), true};
  if (pre == "glm4" || pre == "chatglm-bpe") return {nullptr, seq({split_step(llama3)}), false, true};
  // o200k (GPT-4o's; gpt-oss, MiniMax-M2, Llama 4): letter runs split at case changes (upper-case
  // letters start a word, lower-case ones end it), contractions attached, digits in runs of up
  // to 3, '/' and newlines kept after punctuation runs; no normalizer.
  if (pre == "gpt-4o" || pre == "minimax-m2" || pre == "llama4")
    return {nullptr, seq({split_step(
                         R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
                         R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
                         R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)")})};
  // DeepSeek LLM (V1 / V2 / V2-Lite): newlines, then runs of cased letters, of ASCII / full-width
  // punctuation, trailing spaces, CJK / Hangul, digit runs.
  if (pre == "deepseek-llm")
    return {nullptr,
            seq({split_step("[\r\n]"),
                 split_step("\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af"
                            "\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
                            "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
                            "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
                            "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
                            "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
                            "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
                            "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
                            "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06"
                            "\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
                            "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
                            "\U0001e900-\U0001e943]+"),
                 split_step("\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"), split_step("\\s+$"),
                 split_step("[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"), split_step("\\p{N}+")})};
  // DeepSeek Coder: newlines, letter runs, punctuation runs, CJK / Hangul, single digits.
  if (pre == "deepseek-coder")
    return {nullptr, seq({split_step("[\r\n]"), split_step("\\s?\\p{L}+"), split_step("\\s?\\p{P}+"),
                          split_step("[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"), split_step("\\p{N}")})};
  fail("%s: tokenizer.ggml.pre '%s' is not supported (known: qwen2, qwen35, deepseek-r1-qwen, deepseek-v3, "
       "deepseek-llm, deepseek-coder, llama-bpe, llama3, glm4, chatglm-bpe, gpt-4o, minimax-m2, llama4, gpt-2, olmo, "
       "mpt, starcoder, refact, default)",
       label.c_str(), pre.c_str());
}

// The tokenizer_config.json facts of a GGUF vocabulary: special token strings, add_bos/eos.
nlohmann::json gguf_config(const GgufVocab& v, bool add_bos_default, bool no_bos = false) {
  nlohmann::json cfg;
  auto tok = [&](const std::optional<int64_t>& id) -> nlohmann::json {
    if (!id || *id < 0 || *id >= static_cast<int64_t>(v.tokens.size())) return nullptr;
    return v.tokens[*id];
  };
  const bool add_bos = !no_bos && v.add_bos.value_or(add_bos_default);
  const bool add_eos = v.add_eos.value_or(false);
  cfg["add_bos_token"] = add_bos;
  cfg["add_eos_token"] = add_eos;
  cfg["bos_token"] = add_bos ? tok(v.bos) : nlohmann::json(nullptr);
  cfg["eos_token"] = tok(v.eos);
  cfg["pad_token"] = tok(v.pad);
  if (!v.chat_template.empty()) cfg["chat_template"] = v.chat_template;
  return cfg;
}

constexpr int32_t kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3, kTypeUserDefined = 4, kTypeByte = 6;

// An added-token entry of tokenizer.json for GGUF token `i`.
nlohmann::json added_entry(size_t i, const std::string& content, bool special) {
  return {{"id", i}, {"content", content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
          {"normalized", false}, {"special", special}};
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const GgufVocab& v) {
  if (v.model == "llama") return from_gguf_spm(v);
  if (v.model != "gpt2")
    fail("%s: tokenizer.ggml.model '%s' is not supported (known: gpt2 = byte-level BPE, llama = SentencePiece BPE)",
         v.label.c_str(), v.model.c_str());
  const GgufPre pre = gguf_pre_tokenizer(v.pre, v.label);
  // nlohmann::json, not ordered_json: an ordered object inserts in linear time (minutes for a
  // 150k-token vocabulary); the order of keys means nothing to from_json.
  nlohmann::json j;
  nlohmann::json vocab = nlohmann::json::object(), added = nlohmann::json::array();
  // Every token is in the BPE vocabulary at its file id (a control token's string is never the
  // result of a merge, so this changes no encoding); control (3) and user-defined (4) tokens are
  // also added tokens, matched in the raw text as llama.cpp does. Were they only added tokens, HF's
  // rule "an added token missing from the model vocabulary gets the next free id" would move them
  // whenever they do not sit after the BPE vocabulary (the demo model's <|vision_pad|> is id 11).
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const int32_t type = i < v.token_types.size() ? v.token_types[i] : kTypeNormal;
    if (type == kTypeControl || type == kTypeUserDefined) added.push_back(added_entry(i, v.tokens[i], type == kTypeControl));
    vocab[v.tokens[i]] = i;  // a duplicated string: the last id, as llama.cpp's token_to_id
  }
  j["version"] = "1.0";
  j["added_tokens"] = added;
  j["normalizer"] = pre.normalizer;
  j["pre_tokenizer"] = pre.pre_tokenizer;
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", pre.ignore_merges},
                {"vocab", vocab}, {"merges", v.merges}};
  return from_json(j.dump(), gguf_config(v, false, pre.no_bos).dump(), v.label);
}

Tokenizer Tokenizer::from_gguf_spm(const GgufVocab& v) {
  if (!v.merges.empty())
    fail("%s: tokenizer.ggml.model 'llama' with tokenizer.ggml.merges (SentencePiece vocabularies merge by score)",
         v.label.c_str());
  if (!v.scores.empty() && v.scores.size() != v.tokens.size())
    fail("%s: tokenizer.ggml.scores has %zu entries for %zu tokens", v.label.c_str(), v.scores.size(), v.tokens.size());
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size())
    fail("%s: tokenizer.ggml.token_type has %zu entries for %zu tokens", v.label.c_str(), v.token_types.size(),
         v.tokens.size());
  // The vocabulary goes through the tokenizer.json path as a BPE model without merges (ids,
  // lookups, added tokens); encode() runs Spm on the text between added tokens instead.
  nlohmann::json vocab = nlohmann::json::object(), added = nlohmann::json::array();
  int32_t unk = -1;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const int32_t type = i < v.token_types.size() ? v.token_types[i] : kTypeNormal;
    if (type == kTypeControl || type == kTypeUnknown || type == kTypeUserDefined)
      added.push_back(added_entry(i, v.tokens[i], type != kTypeUserDefined));
    if (type == kTypeUnknown && unk < 0) unk = static_cast<int32_t>(i);
    vocab[v.tokens[i]] = i;
  }
  if (v.unk && *v.unk >= 0 && *v.unk < static_cast<int64_t>(v.tokens.size())) unk = static_cast<int32_t>(*v.unk);
  nlohmann::json j;
  j["version"] = "1.0";
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = nullptr;
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                {"vocab", vocab}, {"merges", nlohmann::json::array()}};
  std::shared_ptr<Impl> impl = build(j.dump(), v.label, gguf_config(v, true).dump(), v.label + " (tokenizer config)", nullptr);
  impl->spm = std::make_shared<const Spm>(v.tokens, v.scores, unk, v.label);
  impl->space_prefix = v.add_space_prefix.value_or(true);
  // Decoder output per id (llama.cpp token_to_piece for SPM, HF's Metaspace / ByteFallback
  // decoders): "▁" is a space, "<0xXX>" byte tokens are that byte, others their text.
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const int32_t type = i < v.token_types.size() ? v.token_types[i] : kTypeNormal;
    std::string& out = impl->bytes[i];
    const std::string& t = v.tokens[i];
    if (type == kTypeByte) {
      unsigned b = 0;
      if (t.size() != 6 || std::sscanf(t.c_str(), "<0x%2X>", &b) != 1)
        fail("%s: byte token %zu is '%s', expected <0xXX>", v.label.c_str(), i, utf8::clip(t).c_str());
      out.assign(1, static_cast<char>(b));
    } else if (type == kTypeNormal || type == 5) {
      out.clear();
      for (size_t k = 0; k < t.size();) {
        if (t.compare(k, 3, "\xe2\x96\x81") == 0) {
          out.push_back(' ');
          k += 3;
        } else {
          out.push_back(t[k++]);
        }
      }
    } else {
      out = t;
    }
  }
  return Tokenizer(impl);
}

std::vector<int32_t> Tokenizer::encode_prompt(std::string_view text) const {
  const std::vector<int32_t>& pre = impl_->wrap.prefix;
  std::vector<int32_t> ids = encode(text, true);
  const size_t n = pre.size();
  if (n > 0 && ids.size() >= 2 * n && std::equal(pre.begin(), pre.end(), ids.begin() + static_cast<std::ptrdiff_t>(n)))
    ids.erase(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n));
  return ids;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  const Impl& m = *impl_;
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special) ids = m.wrap.prefix;
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::to_valid(text);
    text = repaired;
  }
  PreTokenizeScratch scratch;
  std::vector<TextSegment> raw_segments;
  std::vector<TextSegment> norm_segments;
  std::vector<std::string_view> words;
  std::string normalized;
  // 1. Added tokens matched in the raw text; 2. the rest is normalized and searched for
  // normalized added tokens; 3. remaining text is pre-tokenized and BPE-encoded.
  m.added.split(text, false, raw_segments);
  bool after_added = true;  // SentencePiece: a space goes before the text and after added tokens
  std::string escaped;
  for (const TextSegment& seg : raw_segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      after_added = true;
      continue;
    }
    std::string_view piece = text.substr(seg.start, seg.end - seg.start);
    if (piece.empty()) continue;
    if (m.spm) {  // llama.cpp's SPM path: prefix space, spaces as U+2581, no normalizer
      escaped.clear();
      if (m.space_prefix && after_added) escaped += "\xe2\x96\x81";
      for (const char c : piece) {
        if (c == ' ')
          escaped += "\xe2\x96\x81";
        else
          escaped.push_back(c);
      }
      m.spm->encode(escaped, ids);
      after_added = false;
      continue;
    }
    if (!m.normalizer.is_identity()) {
      normalized = m.normalizer.normalize(piece);
      piece = normalized;
    }
    norm_segments.clear();
    m.added.split(piece, true, norm_segments);
    for (const TextSegment& sub : norm_segments) {
      if (sub.id >= 0) {
        ids.push_back(sub.id);
        continue;
      }
      words.clear();
      scratch.arena.clear();
      m.pre.run(piece.substr(sub.start, sub.end - sub.start), scratch, words);
      for (const std::string_view w : words) m.model.encode_word(w, ids);
    }
  }
  if (add_special) ids.insert(ids.end(), m.wrap.suffix.begin(), m.wrap.suffix.end());
  return ids;
}

bool Tokenizer::check_id(int32_t id, bool skip_special) const {
  const Impl& m = *impl_;
  if (id < 0 || id >= m.vocab_size || (m.flags[static_cast<size_t>(id)] & kValid) == 0) {
    fail("%s: token id %d is not in the vocabulary (size %d)", m.label.c_str(), id, m.vocab_size);
  }
  return !(skip_special && (m.flags[static_cast<size_t>(id)] & kSkip) != 0);
}

std::string Tokenizer::id_to_bytes(int32_t id) const {
  const Impl& m = *impl_;
  if (id < 0 || id >= m.vocab_size || (m.flags[static_cast<size_t>(id)] & kValid) == 0) return "";
  return m.bytes[static_cast<size_t>(id)];
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  return impl_->bytes[static_cast<size_t>(id)];
}

bool Tokenizer::joins_with_space() const { return impl_->decoder.joins_with_space(); }

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& m = *impl_;
  std::string out;
  bool first = true;
  for (const int32_t id : ids) {
    if (!check_id(id, skip_special)) continue;
    if (m.decoder.joins_with_space() && !first) out.push_back(' ');
    // SentencePiece with a prefix space: the first token's leading space is the prefix (HF's
    // Llama decoders strip it; llama.cpp's detokenize too).
    if (first && m.spm && m.space_prefix && (m.flags[static_cast<size_t>(id)] & kSpecial) == 0 &&
        m.bytes[static_cast<size_t>(id)].starts_with(' ')) {
      out.append(m.bytes[static_cast<size_t>(id)], 1);
      first = false;
      continue;
    }
    first = false;
    out.append(m.bytes[static_cast<size_t>(id)]);
  }
  if (utf8::is_valid(out)) return out;
  return utf8::to_valid(out);
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  return impl_->lookup(token).value_or(-1);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (const std::string* s = impl_->added.id_to_token(id)) return *s;
  if (const std::string* s = impl_->model.id_to_token(id)) return *s;
  return "";
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && (impl_->flags[static_cast<size_t>(id)] & kSpecial);
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }

std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }

const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

const nlohmann::json& Tokenizer::config() const { return impl_->config; }

}  // namespace spool::tokenizer
