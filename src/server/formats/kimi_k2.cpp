// Kimi-K2 (instruct and thinking) tool calls and reasoning:
//   <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}
//   <|tool_call_end|>...<|tool_calls_section_end|>
// A bare <|tool_call_begin|> without the section (and a missing <|tool_call_end|>) is accepted.
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

BlockParse parse(std::string_view b, bool eof, const nlohmann::json&) {
  BlockParse r;
  size_t p = match_lit(b, kSectionBegin) == 1    ? kSectionBegin.size()
             : match_lit(b, kSectionBegin1) == 1 ? kSectionBegin1.size()
                                                 : 0;  // a bare <|tool_call_begin|>
  for (;;) {
    while (p < b.size() && is_ws(b[p])) ++p;
    if (p == b.size()) return r.need();
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
        return r.need();
      return r.fail();
    }
    size_t q = p + kCallBegin.size();
    size_t ab = b.find(kArgBegin, q);
    if (ab == std::string_view::npos) return b.size() - q > 512 ? r.fail() : r.need();
    std::string id(trim(b.substr(q, ab - q)));
    if (id.find('<') != std::string::npos) return r.fail();
    // The arguments run to <|tool_call_end|>, which the model sometimes leaves out (then the
    // JSON object's own end decides).
    size_t j = ab + kArgBegin.size();
    while (j < b.size() && is_ws(b[j])) ++j;
    size_t e = json_value_end(b, j);
    if (e == kJsonIncomplete) {
      std::string name = id;
      if (name.rfind("functions.", 0) == 0) name.erase(0, 10);
      if (size_t c = name.rfind(':'); c != std::string::npos) name.erase(c);
      return stream(r, name, id, b, j);
    }
    if (e == kJsonBad) return r.fail();
    size_t ce = e;
    while (ce < b.size() && is_ws(b[ce])) ++ce;
    int mce = match_lit(b.substr(ce), kCallEnd);
    if (mce == 0 && ce < b.size()) return r.need();
    if (mce == 0 && !eof) return r.need();
    size_t call_end = mce == 1 ? ce + kCallEnd.size() : e;
    std::string name = id;
    if (name.rfind("functions.", 0) == 0) name.erase(0, 10);
    if (size_t c = name.rfind(':'); c != std::string::npos) name.erase(c);
    std::string args = json_object_text(b.substr(j, e - j));
    if (!valid_name(name) || args.empty()) return r.fail();
    r.calls.push_back(Call{name, args, id});
    p = r.end = call_end;
  }
}

bool in_value(std::string_view b) {
  size_t a = b.rfind(kArgBegin);
  if (a == std::string_view::npos || b.find(kCallEnd, a) != std::string_view::npos) return false;
  if (b.find(kCallBegin, a) != std::string_view::npos) return false;
  auto args = b.substr(a + kArgBegin.size());
  return json_args_in_value(args);
}

}  // namespace

const BlockSpec& kimi_k2_spec() {
  static const BlockSpec s{"<think>", "</think>", {kSectionBegin, kSectionBegin1, kCallBegin}, true, {}, parse, in_value};
  return s;
}

}  // namespace spool::server::formats
