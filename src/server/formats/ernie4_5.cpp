// ERNIE-4.5 (the -Thinking models' format, as vLLM's ernie45 parsers read it):
//   reasoning\n</think>\n\n<response>\nanswer\n</response>   or   ...</think>\n\n<tool_call>\n{"name": ..,
//   "arguments": {..}}\n</tool_call>
// <response> / </response> are dropped from content. The base ERNIE-4.5 templates have no tool
// syntax; their output is plain content. A call's arguments object is streamed one complete
// member at a time once "name" is complete (passed through as written).
#include "server/formats/family.h"

namespace spool::server::formats {

namespace {

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";

// Value extent [first, second) of the top-level member `key` of the JSON object at b[p] ('{'),
// scanning members as far as they are complete; {npos, npos} when not (yet) there. With
// `open_ok`, a value that has begun but not ended gives {start, npos}.
std::pair<size_t, size_t> member(std::string_view b, size_t p, std::string_view key, bool open_ok) {
  constexpr auto npos = std::string_view::npos;
  if (p >= b.size() || b[p] != '{') return {npos, npos};
  size_t i = p + 1;
  auto skip_ws = [&] {
    while (i < b.size() && is_ws(b[i])) ++i;
  };
  for (bool first = true;; first = false) {
    skip_ws();
    if (i >= b.size() || b[i] == '}') return {npos, npos};
    if (!first) {
      if (b[i] != ',') return {npos, npos};
      ++i;
      skip_ws();
    }
    size_t k = json_value_end(b, i);
    if (i >= b.size() || b[i] != '"' || k == kJsonIncomplete || k == kJsonBad) return {npos, npos};
    const auto name = nlohmann::json::parse(b.substr(i, k - i), nullptr, false);
    i = k;
    skip_ws();
    if (i >= b.size() || b[i] != ':') return {npos, npos};
    ++i;
    skip_ws();
    if (i >= b.size()) return {npos, npos};
    size_t v = json_value_end(b, i);
    const bool hit = name.is_string() && name.get<std::string>() == key;
    if (v == kJsonIncomplete || v == kJsonBad) return hit && open_ok ? std::pair{i, npos} : std::pair{npos, npos};
    if (hit) return {i, v};
    i = v;
  }
}

BlockParse parse(std::string_view b, bool, const nlohmann::json&) {
  BlockParse r;
  size_t p = kOpen.size();
  while (p < b.size() && is_ws(b[p])) ++p;
  if (p == b.size()) return r;
  size_t e = json_value_end(b, p);
  if (e == kJsonIncomplete) {
    // Stream the arguments object once the name is complete and the arguments have begun.
    auto [n0, n1] = member(b, p, "name", false);
    auto [a0, a1] = member(b, p, "arguments", true);
    if (n0 == std::string_view::npos || a0 == std::string_view::npos || b[a0] != '{') return r;
    const auto name = nlohmann::json::parse(b.substr(n0, n1 - n0), nullptr, false);
    if (!name.is_string()) return r;
    return stream(r, name.get<std::string>(), "", b, a0);
  }
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
  // An arguments object is passed through as written (what was streamed is a prefix of it);
  // arguments written as a JSON string are decoded.
  std::string text = args.dump();
  if (j.contains("arguments") && j["arguments"].is_object()) {
    auto [a0, a1] = member(b, p, "arguments", false);
    if (a0 != std::string_view::npos && a1 != std::string_view::npos) {
      std::string written = json_object_text(b.substr(a0, a1 - a0));
      if (!written.empty()) text = std::move(written);
    }
  }
  r.calls.push_back(Call{j["name"].get<std::string>(), text, ""});
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
