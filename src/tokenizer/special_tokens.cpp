#include "tokenizer/special_tokens.h"

#include <array>

#include "common/error.h"
#include "common/log.h"
#include "tokenizer/utf8.h"

namespace spool::tokenizer {
namespace {

constexpr int kMaxDepth = 16;  // nesting limit for Sequence post-processors

// Tokenizer classes whose transformers implementation rebuilds the post-processor from
// add_bos_token (default true) / add_eos_token (default false).
constexpr std::array<std::string_view, 6> kLlamaClasses = {
    "LlamaTokenizer",         "LlamaTokenizerFast", "CodeLlamaTokenizer",
    "CodeLlamaTokenizerFast", "GemmaTokenizer",     "GemmaTokenizerFast"};

std::optional<bool> config_bool(const nlohmann::json& config, const char* key,
                                const std::string& config_label) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) fail("%s: \"%s\" must be a boolean", config_label.c_str(), key);
  return it->get<bool>();
}

// Ids of a TemplateProcessing special token entry.
std::vector<int32_t> template_ids(const nlohmann::json& specials, const std::string& name,
                                  const std::string& label) {
  const auto it = specials.find(name);
  if (it == specials.end() || !it->is_object()) {
    fail("%s: TemplateProcessing uses special token '%s' missing from special_tokens",
         label.c_str(), utf8::clip(name).c_str());
  }
  const auto ids = it->find("ids");
  if (ids == it->end() || !ids->is_array()) {
    fail("%s: TemplateProcessing special token '%s' needs an \"ids\" array", label.c_str(),
         utf8::clip(name).c_str());
  }
  std::vector<int32_t> out;
  for (const auto& id : *ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
      fail("%s: TemplateProcessing special token '%s' has a bad id", label.c_str(),
           utf8::clip(name).c_str());
    }
    out.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return out;
}

// The "single" template of a TemplateProcessing.
SpecialWrap parse_template(const nlohmann::json& j, const std::string& label) {
  SpecialWrap w;
  const auto single = j.find("single");
  const auto specials_it = j.find("special_tokens");
  const nlohmann::json specials =
      specials_it != j.end() && specials_it->is_object() ? *specials_it : nlohmann::json::object();
  if (single == j.end() || !single->is_array()) {
    fail("%s: TemplateProcessing needs a \"single\" array", label.c_str());
  }
  bool seen_sequence = false;
  for (const auto& piece : *single) {
    std::string special;  // name of a special token piece; empty for a sequence piece
    if (piece.is_object() && piece.contains("SpecialToken") && piece["SpecialToken"].is_object() &&
        piece["SpecialToken"].contains("id") && piece["SpecialToken"]["id"].is_string()) {
      special = piece["SpecialToken"]["id"].get<std::string>();
    } else if (piece.is_object() && piece.contains("Sequence")) {
      // the text itself
    } else if (piece.is_string()) {
      // String form: "$A", "$B", "$0", "<s>", optionally with ":type_id".
      std::string s = piece.get<std::string>();
      if (const size_t colon = s.find(':'); colon != std::string::npos) s.resize(colon);
      if (s.empty()) fail("%s: empty TemplateProcessing piece", label.c_str());
      if (s[0] != '$') special = s;
    } else {
      fail("%s: bad TemplateProcessing piece in \"single\"", label.c_str());
    }
    if (special.empty()) {
      seen_sequence = true;
      continue;
    }
    const std::vector<int32_t> ids = template_ids(specials, special, label);
    auto& dst = seen_sequence ? w.suffix : w.prefix;
    dst.insert(dst.end(), ids.begin(), ids.end());
  }
  return w;
}

// [token, id] pair of BertProcessing / RobertaProcessing.
int32_t pair_id(const nlohmann::json& j, const char* key, const std::string& label) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer() ||
      (*it)[1].get<int64_t>() < 0 || (*it)[1].get<int64_t>() > INT32_MAX) {
    fail("%s: post_processor \"%s\" must be a [token, id] pair", label.c_str(), key);
  }
  return static_cast<int32_t>((*it)[1].get<int64_t>());
}

void parse_post_processor(const nlohmann::json& j, const std::string& label, int depth,
                          SpecialWrap& w) {
  if (j.is_null()) return;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    fail("%s: post_processor must be null or an object with a string \"type\"", label.c_str());
  }
  if (depth > kMaxDepth) fail("%s: post_processor Sequence nested too deeply", label.c_str());
  const std::string& type = j["type"].get_ref<const std::string&>();
  SpecialWrap add;
  if (type == "ByteLevel") {
    return;
  } else if (type == "TemplateProcessing") {
    add = parse_template(j, label);
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    add.prefix.push_back(pair_id(j, "cls", label));
    add.suffix.push_back(pair_id(j, "sep", label));
  } else if (type == "Sequence") {
    const auto it = j.find("processors");
    if (it == j.end() || !it->is_array()) {
      fail("%s: post_processor Sequence needs a \"processors\" array", label.c_str());
    }
    for (const auto& sub : *it) parse_post_processor(sub, label, depth + 1, w);
    return;
  } else {
    fail("%s: unsupported post_processor type '%s'", label.c_str(), utf8::clip(type).c_str());
  }
  // A later processor wraps the output of the earlier ones.
  add.prefix.insert(add.prefix.end(), w.prefix.begin(), w.prefix.end());
  w.prefix = std::move(add.prefix);
  w.suffix.insert(w.suffix.end(), add.suffix.begin(), add.suffix.end());
}

}  // namespace

std::optional<std::string> config_token(const nlohmann::json& config, const char* key,
                                        const std::string& config_label) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  fail("%s: \"%s\" must be a string, an AddedToken object or null", config_label.c_str(), key);
}

SpecialWrap build_special_wrap(const nlohmann::json& post_processor, const nlohmann::json& config,
                               const TokenLookup& lookup, const std::string& label,
                               const std::string& config_label) {
  bool llama = false;
  if (const auto cls = config.find("tokenizer_class"); cls != config.end() && cls->is_string()) {
    for (const std::string_view name : kLlamaClasses) llama = llama || *cls == name;
  }
  const std::optional<bool> add_bos = config_bool(config, "add_bos_token", config_label);
  const std::optional<bool> add_eos = config_bool(config, "add_eos_token", config_label);
  if (llama || add_bos.value_or(false) || add_eos.value_or(false)) {
    SpecialWrap w;
    auto resolve = [&](const char* key, std::vector<int32_t>& dst) {
      const std::optional<std::string> content = config_token(config, key, config_label);
      if (!content) {
        log_warn("%s: add_%s is set but %s is not", config_label.c_str(), key, key);
        return;
      }
      if (const std::optional<int32_t> id = lookup(*content)) {
        dst.push_back(*id);
      } else {
        log_warn("%s: %s '%s' is not in the vocabulary", config_label.c_str(), key,
                 utf8::clip(*content).c_str());
      }
    };
    if (add_bos.value_or(llama)) resolve("bos_token", w.prefix);
    if (add_eos.value_or(false)) resolve("eos_token", w.suffix);
    return w;
  }
  SpecialWrap w;
  parse_post_processor(post_processor, label, 0, w);
  return w;
}

}  // namespace spool::tokenizer
