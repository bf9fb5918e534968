// DeepSeek-V3 / V3.1 / R1 tool calls and reasoning.
//   V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   V3/R1: <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{json}\n```<｜tool▁call▁end｜>
// Reasoning: <think>...</think> (V3.1 thinking mode: the prompt ends with <think>; non-thinking
// prompts end with <think></think>).
#include "server/formats/family.h"

namespace spool::server::formats {

namespace {

constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";

BlockParse parse(std::string_view b, bool eof, const nlohmann::json&) {
  BlockParse r;
  size_t p = kCallsBegin.size();
  for (;;) {
    while (p < b.size() && is_ws(b[p])) ++p;
    if (p == b.size()) return r.need();
    auto rest = b.substr(p);
    if (match_lit(rest, kCallsEnd) == 1) {
      r.kind = BlockParse::kDone;
      r.end = p + kCallsEnd.size();
      return r;
    }
    if (match_lit(rest, kCallBegin) != 1) {
      if (match_lit(rest, kCallsEnd) == 0 || match_lit(rest, kCallBegin) == 0) return r.need();
      return r.fail();
    }
    size_t q = p + kCallBegin.size();
    size_t sep = b.find(kSep, q);
    size_t cend = b.find(kCallEnd, q);
    if (sep == std::string_view::npos || (cend != std::string_view::npos && cend < sep)) {
      if (cend != std::string_view::npos || b.size() - q > 512) return r.fail();
      return r.need();
    }
    std::string name(trim(b.substr(q, sep - q)));
    size_t a = sep + kSep.size();
    std::string args;
    if (name == "function") {  // V3 / R1: NAME\n```json\n{...}\n```
      size_t nl = b.find('\n', a);
      if (nl == std::string_view::npos) return b.size() - a > 512 ? r.fail() : r.need();
      name = std::string(trim(b.substr(a, nl - a)));
      size_t f = nl + 1;
      while (f < b.size() && is_ws(b[f])) ++f;
      int m = match_lit(b.substr(f), "```json");
      if (m == 0) return r.need();
      if (m < 0) return r.fail();
      size_t j = f + 7;
      while (j < b.size() && is_ws(b[j])) ++j;
      size_t e = json_value_end(b, j);
      if (e == kJsonIncomplete) return stream(r, name, "", b, j);
      if (e == kJsonBad) return r.fail();
      args = json_object_text(b.substr(j, e - j));
      size_t k = e;
      while (k < b.size() && is_ws(b[k])) ++k;
      int m2 = match_lit(b.substr(k), "```");
      if (m2 == 0) return r.need();
      if (m2 < 0) return r.fail();
      k += 3;
      while (k < b.size() && is_ws(b[k])) ++k;
      int m3 = match_lit(b.substr(k), kCallEnd);
      if (m3 == 0) return r.need();
      if (m3 < 0) return r.fail();
      cend = k;
    } else {
      if (cend == std::string_view::npos) {
        size_t j = a;
        while (j < b.size() && is_ws(b[j])) ++j;
        return stream(r, name, "", b, j);
      }
      args = json_object_text(b.substr(a, cend - a));
    }
    if (!valid_name(name) || args.empty()) return r.fail();
    r.calls.push_back(Call{name, args, ""});
    p = r.end = cend + kCallEnd.size();
  }
  (void)eof;
}

bool in_value(std::string_view b) {
  size_t sep = b.rfind(kSep);
  if (sep == std::string_view::npos || b.find(kCallEnd, sep) != std::string_view::npos) return false;
  auto args = b.substr(sep + kSep.size());
  size_t o = args.find('{');
  if (o == std::string_view::npos) return false;
  return json_args_in_value(args.substr(o));
}

}  // namespace

const BlockSpec& deepseek_v3_spec() {
  static const BlockSpec s{"<think>", "</think>", {kCallsBegin}, true, {}, parse, in_value};
  return s;
}

}  // namespace spool::server::formats
