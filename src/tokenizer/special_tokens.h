// Special tokens from tokenizer_config.json (bos/eos) and what encode(add_special=true)
// adds around the text, following what transformers does for these files.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace spool::tokenizer {

/// Ids that encode(add_special=true) puts before and after the encoded text.
struct SpecialWrap {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
};

/// Maps a token string to its id (added tokens first, then the model vocabulary).
using TokenLookup = std::function<std::optional<int32_t>(std::string_view)>;

/// Content of a tokenizer_config.json special-token entry such as "bos_token": a string or
/// an {"__type": "AddedToken", "content": ...} object. nullopt when absent or null; throws
/// spool::Error "<config_label>: ..." for other shapes.
std::optional<std::string> config_token(const nlohmann::json& config, const char* key,
                                        const std::string& config_label);

/// Decides what add_special adds. Llama-family tokenizer classes and configs that set
/// add_bos_token / add_eos_token to true get transformers' rebuilt template (bos if
/// add_bos_token, eos if add_eos_token; Llama classes default add_bos_token to true).
/// Otherwise the tokenizer.json "post_processor" decides (TemplateProcessing "single",
/// BertProcessing / RobertaProcessing, Sequence; ByteLevel and null add nothing).
/// Throws spool::Error for unsupported or malformed post-processors.
SpecialWrap build_special_wrap(const nlohmann::json& post_processor, const nlohmann::json& config,
                               const TokenLookup& lookup, const std::string& label,
                               const std::string& config_label);

}  // namespace spool::tokenizer
