// MiniMax-M2 tool calls and reasoning:
//   <minimax:tool_call>\n<invoke name="NAME">\n<parameter name="K">V</parameter>\n</invoke>\n...
//   </minimax:tool_call>
// Values are text (strings raw, other types as JSON), typed back by the tool's schema; one
// leading and one trailing newline of a value are dropped. Reasoning <think>...</think> (the
// generation prompt ends with <think>\n, so output starts as reasoning).
#include "server/formats/family.h"

namespace spool::server::formats {

namespace {

constexpr std::string_view kOpen = "<minimax:tool_call>";
constexpr std::string_view kClose = "</minimax:tool_call>";
constexpr std::string_view kInvoke = "<invoke name=";
constexpr std::string_view kInvokeClose = "</invoke>";
constexpr std::string_view kParam = "<parameter name=";
constexpr std::string_view kParamClose = "</parameter>";

// Reads `="NAME">` style attribute value at b[p] (quotes optional); returns the position after
// '>' or npos (need more) / npos-1 (bad).
size_t attr(std::string_view b, size_t p, std::string& out) {
  size_t gt = b.find('>', p);
  if (gt == std::string_view::npos) return b.size() - p > 512 ? kJsonBad : kJsonIncomplete;
  std::string_view v = trim(b.substr(p, gt - p));
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front())
    v = v.substr(1, v.size() - 2);
  if (!valid_name(v)) return kJsonBad;
  out = std::string(v);
  return gt + 1;
}

BlockParse parse(std::string_view b, bool, const nlohmann::json& tools) {
  BlockParse r;
  size_t p = kOpen.size();
  for (;;) {
    while (p < b.size() && is_ws(b[p])) ++p;
    if (p == b.size()) return r.need();
    auto rest = b.substr(p);
    if (match_lit(rest, kClose) == 1) {
      r.kind = BlockParse::kDone;
      r.end = p + kClose.size();
      return r;
    }
    int mi = match_lit(rest, kInvoke);
    if (mi != 1) return (mi == 0 || match_lit(rest, kClose) == 0) ? r.need() : r.fail();
    std::string name;
    size_t q = attr(b, p + kInvoke.size(), name);
    if (q == kJsonIncomplete) return r.need();
    if (q == kJsonBad) return r.fail();
    r.partial_name = name;  // `<invoke name="NAME">` is well formed: streamed from here on
    r.partial_args.clear();
    std::vector<std::pair<std::string, std::string>> kv;
    for (;;) {
      while (q < b.size() && is_ws(b[q])) ++q;
      if (q == b.size()) return r.need();
      auto rr = b.substr(q);
      if (match_lit(rr, kInvokeClose) == 1) {
        r.calls.push_back(Call{name, typed_args_json(tools, name, kv, true), ""});
        r.partial_name.clear();
        r.partial_args.clear();
        p = r.end = q + kInvokeClose.size();
        break;
      }
      int mp = match_lit(rr, kParam);
      if (mp != 1) return (mp == 0 || match_lit(rr, kInvokeClose) == 0) ? r.need() : r.fail();
      std::string key;
      size_t v0 = attr(b, q + kParam.size(), key);
      if (v0 == kJsonIncomplete) return r.need();
      if (v0 == kJsonBad) return r.fail();
      size_t v1 = b.find(kParamClose, v0);
      if (v1 == std::string_view::npos) return r.need();
      kv.emplace_back(std::move(key), std::string(b.substr(v0, v1 - v0)));
      r.partial_args = typed_args_prefix(tools, name, kv, true);
      q = v1 + kParamClose.size();
    }
  }
}

bool in_value(std::string_view b) {
  size_t o = b.rfind(kParam);
  if (o == std::string_view::npos || b.find(kParamClose, o) != std::string_view::npos) return false;
  size_t gt = b.find('>', o);
  if (gt == std::string_view::npos) return false;
  return !ends_with_prefix(b.substr(gt + 1), kParamClose);
}

}  // namespace

const BlockSpec& minimax_m2_spec() {
  static const BlockSpec s{"<think>", "</think>", {kOpen}, true, {}, parse, in_value};
  return s;
}

}  // namespace spool::server::formats
