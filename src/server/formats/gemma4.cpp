// Gemma 4 tool calls and reasoning (as its chat template renders them):
//   <|tool_call>call:NAME{key:value,...}<tool_call|>
// with Gemma's value syntax: strings between <|"|> quotes, bare keys, numbers, true/false/null,
// {..} objects (keys bare or <|"|>-quoted) and [..] lists. Reasoning: <|channel>thought\n...
// <channel|> (the prompt without thinking ends with an empty, closed one). End of turn <turn|>.
// Arguments are streamed once `call:NAME{` is there, one complete top-level member at a time.
#include <cstdlib>

#include "server/formats/family.h"

namespace spool::server::formats {

namespace {

constexpr std::string_view kOpen = "<|tool_call>";
constexpr std::string_view kClose = "<tool_call|>";
constexpr std::string_view kQuote = "<|\"|>";

enum class R { kOk, kNeed, kBad };

// Parses one Gemma value at s[p] into `out`; advances p.
R value(std::string_view s, size_t& p, nlohmann::ordered_json& out, int depth);

R key(std::string_view s, size_t& p, std::string& out) {
  if (match_lit(s.substr(p), kQuote) == 1) {
    size_t e = s.find(kQuote, p + kQuote.size());
    if (e == std::string_view::npos) return R::kNeed;
    out = std::string(s.substr(p + kQuote.size(), e - p - kQuote.size()));
    p = e + kQuote.size();
    return R::kOk;
  }
  size_t q = p;
  while (q < s.size() && s[q] != ':' && s[q] != '}' && s[q] != ',' && s[q] != '<') ++q;
  if (q == s.size()) return R::kNeed;
  if (s[q] != ':' || q == p) return R::kBad;
  out = std::string(trim(s.substr(p, q - p)));
  p = q;
  return R::kOk;
}

// The step before an item of a {..} object or [..] list (p after the opening bracket or the
// previous item): white space, then `close` (consumed; `closed` set) or, before any item but the
// first, ',' (consumed, with the white space after it). kNeed where the text ends first, kBad on
// anything else.
R list_step(std::string_view s, size_t& p, bool first, char close, bool& closed) {
  closed = false;
  while (p < s.size() && is_ws(s[p])) ++p;
  if (p == s.size()) return R::kNeed;
  if (s[p] == close) {
    ++p;
    closed = true;
    return R::kOk;
  }
  if (!first) {
    if (s[p] != ',') return R::kBad;
    ++p;
    while (p < s.size() && is_ws(s[p])) ++p;
    if (p == s.size()) return R::kNeed;
  }
  return R::kOk;
}

R object(std::string_view s, size_t& p, nlohmann::ordered_json& out, int depth) {
  out = nlohmann::ordered_json::object();
  ++p;  // '{'
  for (bool first = true;; first = false) {
    bool closed;
    if (R r = list_step(s, p, first, '}', closed); r != R::kOk || closed) return r;
    std::string k;
    if (R r = key(s, p, k); r != R::kOk) return r;
    if (p == s.size()) return R::kNeed;
    if (s[p] != ':') return R::kBad;
    ++p;
    nlohmann::ordered_json v;
    if (R r = value(s, p, v, depth + 1); r != R::kOk) return r;
    out[k] = std::move(v);
  }
}

R value(std::string_view s, size_t& p, nlohmann::ordered_json& out, int depth) {
  if (depth > 64) return R::kBad;
  while (p < s.size() && is_ws(s[p])) ++p;
  if (p == s.size()) return R::kNeed;
  int mq = match_lit(s.substr(p), kQuote);
  if (mq == 1) {
    size_t e = s.find(kQuote, p + kQuote.size());
    if (e == std::string_view::npos) return R::kNeed;
    out = std::string(s.substr(p + kQuote.size(), e - p - kQuote.size()));
    p = e + kQuote.size();
    return R::kOk;
  }
  if (mq == 0) return R::kNeed;
  if (s[p] == '{') return object(s, p, out, depth);
  if (s[p] == '[') {
    out = nlohmann::ordered_json::array();
    ++p;
    for (bool first = true;; first = false) {
      bool closed;
      if (R r = list_step(s, p, first, ']', closed); r != R::kOk || closed) return r;
      nlohmann::ordered_json v;
      if (R r = value(s, p, v, depth + 1); r != R::kOk) return r;
      out.push_back(std::move(v));
    }
  }
  size_t q = p;
  while (q < s.size() && s[q] != ',' && s[q] != '}' && s[q] != ']' && s[q] != '<' && !is_ws(s[q])) ++q;
  if (q == s.size()) return R::kNeed;
  auto j = nlohmann::ordered_json::parse(s.substr(p, q - p), nullptr, false);
  if (j.is_discarded() || j.is_object() || j.is_array() || j.is_string()) return R::kBad;
  out = std::move(j);
  p = q;
  return R::kOk;
}

BlockParse parse(std::string_view b, bool, const nlohmann::json&) {
  BlockParse r;
  size_t p = kOpen.size();
  while (p < b.size() && is_ws(b[p])) ++p;
  int mc = match_lit(b.substr(p), "call:");
  if (mc == 0) return r;
  if (mc < 0) {
    r.kind = BlockParse::kFail;
    return r;
  }
  p += 5;
  size_t o = b.find('{', p);
  if (o == std::string_view::npos) {
    if (b.size() - p > 256) r.kind = BlockParse::kFail;
    return r;
  }
  std::string name(trim(b.substr(p, o - p)));
  if (!valid_name(name)) {
    r.kind = BlockParse::kFail;
    return r;
  }
  nlohmann::ordered_json args;
  size_t q = o;
  R res = object(b, q, args, 0);
  if (res == R::kNeed) {
    // Stream the members complete so far: the final arguments are args.dump() of all of them.
    std::string d = args.is_object() ? args.dump() : "{}";
    d.pop_back();  // its '}'
    r.partial_name = name;
    r.partial_args = std::move(d);
    return r;
  }
  if (res == R::kBad) {
    r.kind = BlockParse::kFail;
    return r;
  }
  while (q < b.size() && is_ws(b[q])) ++q;
  int m = match_lit(b.substr(q), kClose);
  if (m == 0) return r;
  if (m < 0) {
    r.kind = BlockParse::kFail;
    return r;
  }
  r.calls.push_back(Call{name, args.dump(), ""});
  r.kind = BlockParse::kDone;
  r.end = q + kClose.size();
  return r;
}

// Inside a <|"|>-quoted string of the arguments (an odd number of quotes after the '{').
bool in_value(std::string_view b) {
  size_t o = b.find('{');
  if (o == std::string_view::npos) return false;
  size_t n = 0;
  for (size_t i = b.find(kQuote, o); i != std::string_view::npos; i = b.find(kQuote, i + kQuote.size())) ++n;
  return n % 2 == 1 && !ends_with_prefix(b, kQuote);
}

}  // namespace

const BlockSpec& gemma4_spec() {
  static const BlockSpec s{"<|channel>thought", "<channel|>", {kOpen}, true, {}, parse, in_value};
  return s;
}

}  // namespace spool::server::formats
