#include "tokenizer/tokenizer.h"

#include <algorithm>
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

  std::optional<int32_t> lookup(std::string_view token) const {
    if (auto id = added.token_to_id(token)) return id;
    return model.token_to_id(token);
  }
};

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

std::shared_ptr<const Tokenizer::Impl> Tokenizer::build(const std::string& json_text,
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

Tokenizer Tokenizer::from_gguf(const GgufVocab& v) {
  if (v.model != "gpt2")
    fail("%s: tokenizer.ggml.model '%s' is not supported (byte-level BPE 'gpt2' only)", v.label.c_str(), v.model.c_str());
  // llama.cpp's pre-tokenizer ids (llama-vocab.cpp) -> the Split regex of the HF tokenizer.json.
  std::string regex;
  if (v.pre == "qwen2" || v.pre == "deepseek-r1-qwen" || v.pre == "default")
    regex = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  else if (v.pre == "qwen35")
    regex = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  else
    fail("%s: tokenizer.ggml.pre '%s' is not supported (qwen2, qwen35)", v.label.c_str(), v.pre.c_str());
  const std::string& pattern = regex;  // as tokenizer.json holds it after JSON decoding
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
    const int32_t type = i < v.token_types.size() ? v.token_types[i] : 1;
    if (type == 3 || type == 4)
      added.push_back({{"id", i}, {"content", v.tokens[i]}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                       {"normalized", false}, {"special", type == 3}});
    vocab[v.tokens[i]] = i;  // a duplicated string: the last id, as llama.cpp's token_to_id
  }
  j["version"] = "1.0";
  j["added_tokens"] = added;
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                {"vocab", vocab}, {"merges", v.merges}};
  nlohmann::json cfg;
  auto tok = [&](const std::optional<int64_t>& id) -> nlohmann::json {
    if (!id || *id < 0 || *id >= static_cast<int64_t>(v.tokens.size())) return nullptr;
    return v.tokens[*id];
  };
  cfg["add_bos_token"] = v.add_bos;
  cfg["bos_token"] = v.add_bos ? tok(v.bos) : nlohmann::json(nullptr);
  cfg["eos_token"] = tok(v.eos);
  cfg["pad_token"] = tok(v.pad);
  if (!v.chat_template.empty()) cfg["chat_template"] = v.chat_template;
  return from_json(j.dump(), cfg.dump(), v.label);
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
  for (const TextSegment& seg : raw_segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    std::string_view piece = text.substr(seg.start, seg.end - seg.start);
    if (piece.empty()) continue;
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
