// Kimi-K2 (instruct and thinking) tool calls and reasoning:
//   <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}
//   <|tool_call_end|>...<|tool_calls_section_end|>
// The id the model writes (functions.NAME:IDX) is the call's id, as the template renders it back.
// Reasoning (K2-Thinking): <think>...</think>.
#include "server/formats/family.h"

namespace spool::server::formats {

namespace {

constexpr std::string_view kSectionBegin = "<|tool_calls_section_begin|>";
constexpr std::string_view kSectionBegin1 = "<|tool_call_section_begin|>";
constexpr std::string_view kSectionEnd = "<|tool_calls_section_end|>";
constexpr std::string_view kSectionEnd1 = "<|tool_call_section_end|>";
constexpr std::string_view kCallBegin = "<|tool_call_begin|>";
constexpr std::string_view kArgBegin = "<|tool_call_argument_begin|>";
constexpr std::string_view kCallEnd = "<|tool_call_end|>";

BlockParse parse(std::string_view b, bool, const nlohmann::json&) {
  BlockParse r;
  size_t p = match_lit(b, kSectionBegin) == 1 ? kSectionBegin.size() : kSectionBegin1.size();
  auto need = [&]() {
    r.kind = BlockParse::kNeedMore;
    return r;
  };
  auto fail = [&]() {
    r.kind = BlockParse::kFail;
    return r;
  };
  for (;;) {
    while (p < b.size() && is_ws(b[p])) ++p;
    if (p == b.size()) return need();
    auto rest = b.substr(p);
    for (auto e : {kSectionEnd, kSectionEnd1}) {
      if (match_lit(rest, e) == 1) {
        r.kind = BlockParse::kDone;
        r.end = p + e.size();
        return r;
      }
    }
    if (match_lit(rest, kCallBegin) != 1) {
      if (match_lit(rest, kSectionEnd) == 0 || match_lit(rest, kSectionEnd1) == 0 || match_lit(rest, kCallBegin) == 0)
        return need();
      return fail();
    }
    size_t q = p + kCallBegin.size();
    size_t ab = b.find(kArgBegin, q), ce = b.find(kCallEnd, q);
    if (ab == std::string_view::npos || (ce != std::string_view::npos && ce < ab)) {
      if (ce != std::string_view::npos || b.size() - q > 512) return fail();
      return need();
    }
    std::string id(trim(b.substr(q, ab - q)));
    if (ce == std::string_view::npos) return need();
    std::string name = id;
    if (name.rfind("functions.", 0) == 0) name.erase(0, 10);
    if (size_t c = name.rfind(':'); c != std::string::npos) name.erase(c);
    std::string args = json_object_text(b.substr(ab + kArgBegin.size(), ce - ab - kArgBegin.size()));
    if (!valid_name(name) || args.empty()) return fail();
    r.calls.push_back(Call{name, args, id});
    p = r.end = ce + kCallEnd.size();
  }
}

bool in_value(std::string_view b) {
  size_t a = b.rfind(kArgBegin);
  if (a == std::string_view::npos || b.find(kCallEnd, a) != std::string_view::npos) return false;
  auto args = b.substr(a + kArgBegin.size());
  return json_args_in_value(args);
}

}  // namespace

const BlockSpec& kimi_k2_spec() {
  static const BlockSpec s{"<think>", "</think>", {kSectionBegin, kSectionBegin1}, true, {}, parse, in_value};
  return s;
}

}  // namespace spool::server::formats
