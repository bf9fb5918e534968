#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "common/error.h"
#include "tokenizer/utf8.h"

namespace spool::tokenizer {
namespace {

constexpr int kMaxDepth = 16;  // nesting limit for Sequence normalizers

void parse(const nlohmann::json& j, const std::string& label, int depth, std::vector<int>& forms) {
  if (j.is_null()) return;
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    fail("%s: normalizer must be null or an object with a string \"type\"", label.c_str());
  }
  if (depth > kMaxDepth) fail("%s: normalizer Sequence nested too deeply", label.c_str());
  const std::string type = j["type"].get<std::string>();
  if (type == "NFC") {
    forms.push_back(UTF8PROC_STABLE | UTF8PROC_COMPOSE);
  } else if (type == "NFD") {
    forms.push_back(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
  } else if (type == "NFKC") {
    forms.push_back(UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
  } else if (type == "NFKD") {
    forms.push_back(UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
  } else if (type == "Sequence") {
    const auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array()) {
      fail("%s: normalizer Sequence needs a \"normalizers\" array", label.c_str());
    }
    for (const auto& sub : *it) parse(sub, label, depth + 1, forms);
  } else {
    fail("%s: unsupported normalizer type '%s' (supported: NFC, NFD, NFKC, NFKD, Sequence)",
         label.c_str(), utf8::clip(type).c_str());
  }
}

// Applies one utf8proc normalization to well-formed UTF-8.
void apply_form(std::string_view text, int options, std::string& out) {
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &result,
                                          static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(result, &std::free);
  if (n < 0) {
    // Only possible on ill-formed input or out of memory; keep the text unchanged.
    out.append(text);
    return;
  }
  out.append(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
}

// Normalizes `text`, passing ASCII through untouched. Splitting before any ASCII
// character is exact for all four forms: ASCII characters are starters that never
// compose with a preceding character and are their own decompositions.
std::string normalize_form(std::string_view text, int options) {
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    size_t j = i;
    while (j < n && static_cast<unsigned char>(text[j]) < 0x80) ++j;
    if (j == n) {
      out.append(text.substr(i));
      break;
    }
    // The ASCII character just before a non-ASCII run may compose with it ("e" + U+0301).
    const size_t unit_start = j > i ? j - 1 : j;
    out.append(text.substr(i, unit_start - i));
    size_t k = j;
    while (k < n && static_cast<unsigned char>(text[k]) >= 0x80) ++k;
    apply_form(text.substr(unit_start, k - unit_start), options, out);
    i = k;
  }
  return out;
}

}  // namespace

Normalizer Normalizer::from_json(const nlohmann::json& j, const std::string& label) {
  Normalizer n;
  parse(j, label, 0, n.forms_);
  return n;
}

std::string Normalizer::normalize(std::string_view text) const {
  if (forms_.empty()) return std::string(text);
  std::string cur = normalize_form(text, forms_[0]);
  for (size_t f = 1; f < forms_.size(); ++f) cur = normalize_form(cur, forms_[f]);
  return cur;
}

}  // namespace spool::tokenizer
