// GLM-4.5 / 4.6 / 4.7 (and 4.7-Flash) tool calls and reasoning:
//   <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>
// (4.7 writes no newlines). Values are text: strings raw, other types as JSON (the template's
// `v | tojson if v is not string`), typed back by the tool's schema. Reasoning <think>...</think>;
// GLM-4.7-Flash's prompt ends with <think> (forced-open thinking), followed from the prompt.
#include "server/formats/family.h"

namespace spool::server::formats {

namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kKeyOpen = "<arg_key>";
constexpr std::string_view kKeyClose = "</arg_key>";
constexpr std::string_view kValOpen = "<arg_value>";
constexpr std::string_view kValClose = "</arg_value>";

BlockParse parse(std::string_view b, bool, const nlohmann::json& tools) {
  BlockParse r;
  size_t p = kOpen.size();
  // The name runs to the first '<' (an <arg_key> or </tool_call>).
  size_t lt = b.find('<', p);
  if (lt == std::string_view::npos) return b.size() - p > 512 ? r.fail() : r.need();
  std::string name(trim(b.substr(p, lt - p)));
  if (!valid_name(name)) return r.fail();
  p = lt;
  std::vector<std::pair<std::string, std::string>> kv;
  for (;;) {
    while (p < b.size() && is_ws(b[p])) ++p;
    if (p == b.size()) return r.need();
    auto rest = b.substr(p);
    if (match_lit(rest, kClose) == 1) {
      r.calls.push_back(Call{name, typed_args_json(tools, name, kv, false), ""});
      r.kind = BlockParse::kDone;
      r.end = p + kClose.size();
      return r;
    }
    int mk = match_lit(rest, kKeyOpen);
    if (mk != 1) return (mk == 0 || match_lit(rest, kClose) == 0) ? r.need() : r.fail();
    r.partial_name = name;  // well formed so far: streamed from here on
    size_t k0 = p + kKeyOpen.size(), k1 = b.find(kKeyClose, k0);
    if (k1 == std::string_view::npos) return b.size() - k0 > 512 ? r.fail() : r.need();
    std::string key(trim(b.substr(k0, k1 - k0)));
    if (key.empty() || key.find('<') != std::string::npos) return r.fail();
    p = k1 + kKeyClose.size();
    while (p < b.size() && is_ws(b[p])) ++p;
    int mv = match_lit(b.substr(p), kValOpen);
    if (mv == 0 || p == b.size()) return r.need();
    if (mv < 0) return r.fail();
    size_t v0 = p + kValOpen.size(), v1 = b.find(kValClose, v0);
    if (v1 == std::string_view::npos) return r.need();
    kv.emplace_back(std::move(key), std::string(b.substr(v0, v1 - v0)));
    r.partial_args = typed_args_prefix(tools, name, kv, false);
    p = v1 + kValClose.size();
  }
}

bool in_value(std::string_view b) {
  size_t o = b.rfind(kValOpen);
  if (o == std::string_view::npos || b.find(kValClose, o) != std::string_view::npos) return false;
  return !ends_with_prefix(b.substr(o + kValOpen.size()), kValClose);
}

}  // namespace

const BlockSpec& glm4_5_spec() {
  static const BlockSpec s{"<think>", "</think>", {kOpen}, false, {}, parse, in_value};
  return s;
}

}  // namespace spool::server::formats
