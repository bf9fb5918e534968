#include "tokenizer/decoder.h"

#include "common/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace spool::tokenizer {

Decoder Decoder::from_json(const nlohmann::json& j, const std::string& label) {
  Decoder d;
  if (j.is_null()) {
    d.byte_level_ = false;
    return d;
  }
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    fail("%s: decoder must be null or an object with a string \"type\"", label.c_str());
  }
  const std::string& type = j["type"].get_ref<const std::string&>();
  if (type == "ByteLevel") return d;
  if (type == "Sequence") {
    // A Sequence holding exactly one ByteLevel decoder is the same as that decoder.
    const auto it = j.find("decoders");
    if (it != j.end() && it->is_array() && it->size() == 1 && (*it)[0].is_object() &&
        (*it)[0].contains("type") && (*it)[0]["type"] == "ByteLevel") {
      return d;
    }
    fail("%s: unsupported decoder Sequence (only a single ByteLevel decoder is supported)",
         label.c_str());
  }
  fail("%s: unsupported decoder type '%s' (supported: ByteLevel)", label.c_str(),
       utf8::clip(type).c_str());
}

std::string Decoder::token_bytes(std::string_view token) const {
  return byte_level_ ? byte_level::token_to_bytes(token) : std::string(token);
}

}  // namespace spool::tokenizer
