// Mistral / Mixtral / Magistral / Devstral tool calls and reasoning:
//   list form (v3 tokenizers): [TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "..."}, ...]
//   newer form (v11+):         [TOOL_CALLS]NAME[ARGS]{...}  (optionally NAME[CALL_ID]ID[ARGS]{...}),
//                              one marker per call.
// Reasoning (Magistral): [THINK]...[/THINK].
#include "server/formats/family.h"

namespace spool::server::formats {

namespace {

constexpr std::string_view kOpen = "[TOOL_CALLS]";
constexpr std::string_view kArgs = "[ARGS]";
constexpr std::string_view kCallId = "[CALL_ID]";

BlockParse parse(std::string_view b, bool, const nlohmann::json&) {
  BlockParse r;
  size_t p = kOpen.size();
  while (p < b.size() && is_ws(b[p])) ++p;
  if (p == b.size()) return r.need();
  if (b[p] == '[') {  // list form
    size_t e = json_value_end(b, p);
    if (e == kJsonIncomplete) return r.need();
    if (e == kJsonBad) return r.fail();
    auto j = nlohmann::ordered_json::parse(b.substr(p, e - p), nullptr, false);
    if (!j.is_array() || j.empty()) return r.fail();
    std::vector<Call> calls;
    for (const auto& c : j) {
      if (!c.is_object() || !c.contains("name") || !c["name"].is_string()) return r.fail();
      Call call;
      call.name = c["name"].get<std::string>();
      auto a = c.contains("arguments") ? c["arguments"] : nlohmann::ordered_json::object();
      if (a.is_string()) a = nlohmann::ordered_json::parse(a.get<std::string>(), nullptr, false);
      if (!a.is_object() || !valid_name(call.name)) return r.fail();
      call.arguments = a.dump();
      if (c.contains("id") && c["id"].is_string()) call.id = c["id"].get<std::string>();
      calls.push_back(std::move(call));
    }
    r.calls = std::move(calls);
    r.kind = BlockParse::kDone;
    r.end = e;
    return r;
  }
  size_t a = b.find(kArgs, p);
  if (a == std::string_view::npos) return b.size() - p > 512 ? r.fail() : r.need();
  std::string_view head = b.substr(p, a - p);
  std::string id;
  if (size_t c = head.find(kCallId); c != std::string_view::npos) {
    id = std::string(trim(head.substr(c + kCallId.size())));
    head = head.substr(0, c);
  }
  std::string name(trim(head));
  if (!valid_name(name)) return r.fail();
  size_t j = a + kArgs.size();
  while (j < b.size() && is_ws(b[j])) ++j;
  size_t e = json_value_end(b, j);
  if (e == kJsonIncomplete) return stream(r, name, id, b, j);
  if (e == kJsonBad) return r.fail();
  std::string args = json_object_text(b.substr(j, e - j));
  if (args.empty()) return r.fail();
  r.calls.push_back(Call{name, args, id});
  r.kind = BlockParse::kDone;
  r.end = e;
  return r;
}

bool in_value(std::string_view b) {
  size_t a = b.rfind(kArgs);
  if (a != std::string_view::npos) return json_args_in_value(b.substr(a + kArgs.size()));
  size_t p = kOpen.size();
  while (p < b.size() && is_ws(b[p])) ++p;
  if (p < b.size() && b[p] == '[') {
    // list form: inside the value of "arguments" (approximation: after `"arguments":`)
    size_t k = b.rfind("\"arguments\"");
    return k != std::string_view::npos && b.find('{', k) != std::string_view::npos;
  }
  return false;
}

}  // namespace

const BlockSpec& mistral_spec() {
  static const BlockSpec s{"[THINK]", "[/THINK]", {kOpen}, true, {}, parse, in_value};
  return s;
}

}  // namespace spool::server::formats
