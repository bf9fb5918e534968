// ERNIE-4.5 (the -Thinking models' format, as vLLM's ernie45 parsers read it):
//   reasoning\n</think>\n\n<response>\nanswer\n</response>   or   ...</think>\n\n<tool_call>\n{"name": ..,
//   "arguments": {..}}\n</tool_call>
// <response> / </response> are dropped from content. The base ERNIE-4.5 templates have no tool
// syntax; their output is plain content.
#include "server/formats/family.h"

namespace spool::server::formats {

namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

BlockParse parse(std::string_view b, bool, const nlohmann::json&) {
  BlockParse r;
  size_t p = kOpen.size();
  while (p < b.size() && is_ws(b[p])) ++p;
  if (p == b.size()) return r;
  size_t e = json_value_end(b, p);
  if (e == kJsonIncomplete) return r;
  if (e == kJsonBad) {
    r.kind = BlockParse::kFail;
    return r;
  }
  auto j = nlohmann::ordered_json::parse(b.substr(p, e - p), nullptr, false);
  size_t q = e;
  while (q < b.size() && is_ws(b[q])) ++q;
  int m = match_lit(b.substr(q), kClose);
  if (m == 0) return r;
  bool ok = m == 1 && j.is_object() && j.contains("name") && j["name"].is_string();
  nlohmann::ordered_json args = ok && j.contains("arguments") ? j["arguments"] : nlohmann::ordered_json::object();
  if (args.is_string()) args = nlohmann::ordered_json::parse(args.get<std::string>(), nullptr, false);
  if (!ok || !args.is_object() || !valid_name(j["name"].get<std::string>())) {
    r.kind = BlockParse::kFail;
    return r;
  }
  r.calls.push_back(Call{j["name"].get<std::string>(), args.dump(), ""});
  r.kind = BlockParse::kDone;
  r.end = q + kClose.size();
  return r;
}

bool in_value(std::string_view b) {
  size_t k = b.find("\"arguments\"");
  if (k == std::string_view::npos) return false;
  size_t o = b.find('{', k);
  return o != std::string_view::npos && json_args_in_value(b.substr(o));
}

}  // namespace

const BlockSpec& ernie4_5_spec() {
  static const BlockSpec s{"<think>", "</think>", {kOpen}, false, {"<response>", "</response>"}, parse, in_value};
  return s;
}

}  // namespace spool::server::formats
