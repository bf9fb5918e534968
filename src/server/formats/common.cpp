// FamilyParser's shared part and the helpers of family.h.
#include <utility>

#include "common/json_string.h"
#include "server/formats/family.h"
#include "server/tool_calls.h"

namespace spool::server::formats {

namespace {
std::vector<std::string> with_extra(std::vector<std::string> stops, const std::vector<std::string>& extra) {
  for (const auto& s : extra) stops.push_back(s);
  return stops;
}
}  // namespace

FamilyParser::FamilyParser(OutputParser::Options opt, const std::vector<std::string>& extra_stops)
    : opt_(std::move(opt)), stop_(with_extra(opt_.stop, extra_stops)) {}

FamilyParser::~FamilyParser() = default;

void FamilyParser::emit_content(std::string_view t) {
  if (t.empty()) return;
  cur_.content += t;
  content_ += t;
}

void FamilyParser::emit_reasoning(std::string_view t) {
  if (t.empty()) return;
  cur_.reasoning += t;
  reasoning_ += t;
}

void FamilyParser::emit_call(const Call& c) {
  if (open_) {  // complete the streamed call
    open_ = false;
    ToolCall& tc = calls_.back();
    const int idx = static_cast<int>(calls_.size()) - 1;
    // The family guarantees that the final arguments extend what was streamed.
    if (c.arguments.compare(0, tc.arguments.size(), tc.arguments) == 0 && c.arguments.size() > tc.arguments.size())
      cur_.tool_calls.push_back(ToolCallDelta{idx, "", "", c.arguments.substr(tc.arguments.size())});
    tc.arguments = c.arguments;
    tc.complete = true;
    return;
  }
  const int idx = static_cast<int>(calls_.size());
  ToolCall tc;
  tc.id = c.id.empty() ? make_tool_call_id(opt_.id_prefix, opt_.id_seed, idx) : c.id;
  tc.name = c.name;
  tc.arguments = c.arguments;
  tc.complete = true;
  cur_.tool_calls.push_back(ToolCallDelta{idx, tc.id, tc.name, tc.arguments});
  calls_.push_back(std::move(tc));
}

void FamilyParser::open_call(const std::string& name, const std::string& id, const std::string& args_prefix) {
  if (!open_) {
    const int idx = static_cast<int>(calls_.size());
    ToolCall tc;
    tc.id = id.empty() ? make_tool_call_id(opt_.id_prefix, opt_.id_seed, idx) : id;
    tc.name = name;
    tc.complete = false;
    cur_.tool_calls.push_back(ToolCallDelta{idx, tc.id, tc.name, ""});
    calls_.push_back(std::move(tc));
    open_ = true;
  }
  ToolCall& tc = calls_.back();
  if (args_prefix.size() > tc.arguments.size() && args_prefix.compare(0, tc.arguments.size(), tc.arguments) == 0) {
    cur_.tool_calls.push_back(ToolCallDelta{static_cast<int>(calls_.size()) - 1, "", "", args_prefix.substr(tc.arguments.size())});
    tc.arguments = args_prefix;
  }
}

void FamilyParser::abandon_call() {
  if (!open_) return;
  open_ = false;
  ToolCall& tc = calls_.back();
  const std::string close = tc.arguments.empty() ? "{}" : "}";
  cur_.tool_calls.push_back(ToolCallDelta{static_cast<int>(calls_.size()) - 1, "", "", close});
  tc.arguments += close;
  tc.complete = false;
}

void FamilyParser::finalize() {
  eof_ = true;
  while (step()) {
  }
  finished_ = true;
}

OutputDelta FamilyParser::push(std::string_view text) {
  if (finished_) return {};
  raw_ += stop_.push(text);
  while (step()) {
  }
  if (stop_.stopped()) finalize();
  return std::exchange(cur_, OutputDelta{});
}

OutputDelta FamilyParser::finish() {
  if (finished_) return {};
  raw_ += stop_.finish();
  finalize();
  return std::exchange(cur_, OutputDelta{});
}

// ---- helpers

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

int match_lit(std::string_view s, std::string_view lit) {
  if (s.size() >= lit.size()) return s.compare(0, lit.size(), lit) == 0 ? 1 : -1;
  return lit.compare(0, s.size(), s) == 0 ? 0 : -1;
}

size_t json_value_end(std::string_view s, size_t p) {
  constexpr size_t kMaxDepth = 128;
  if (p >= s.size()) return kJsonIncomplete;
  std::vector<char> stack;
  size_t i = p;
  auto scalar_end = [&](size_t q) {
    while (q < s.size() && !is_ws(s[q]) && s[q] != ',' && s[q] != ']' && s[q] != '}' && s[q] != '<' &&
           s[q] != '[' && s[q] != '{' && s[q] != '"')
      ++q;
    return q;
  };
  for (;;) {
    if (i >= s.size()) return kJsonIncomplete;
    char c = s[i];
    if (c == '"') {
      size_t q = i + 1;
      while (q < s.size() && s[q] != '"') q += s[q] == '\\' ? 2 : 1;
      if (q >= s.size()) return kJsonIncomplete;
      i = q + 1;
    } else if (c == '{' || c == '[') {
      if (stack.size() >= kMaxDepth) return kJsonBad;
      stack.push_back(c == '{' ? '}' : ']');
      ++i;
    } else if (c == '}' || c == ']') {
      if (stack.empty() || stack.back() != c) return kJsonBad;
      stack.pop_back();
      ++i;
    } else if (is_ws(c) || c == ',' || c == ':') {
      if (stack.empty()) return kJsonBad;
      ++i;
      continue;
    } else {
      size_t q = scalar_end(i);
      if (q == i) return kJsonBad;
      if (q == s.size()) return kJsonIncomplete;  // a number may go on
      i = q;
    }
    if (stack.empty()) return i;
  }
}

std::string json_object_text(std::string_view text) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return "";
  return std::string(trim(text));
}

std::string json_members_prefix(std::string_view s, size_t p) {
  if (p >= s.size() || s[p] != '{') return "";
  size_t last = p + 1, i = p + 1;
  auto skip_ws = [&] {
    while (i < s.size() && is_ws(s[i])) ++i;
  };
  for (bool first = true;; first = false) {
    skip_ws();
    if (i >= s.size() || s[i] == '}') break;
    if (!first) {
      if (s[i] != ',') break;
      ++i;
      skip_ws();
    }
    if (i >= s.size() || s[i] != '"') break;
    size_t k = json_value_end(s, i);
    if (k == kJsonIncomplete || k == kJsonBad) break;
    i = k;
    skip_ws();
    if (i >= s.size() || s[i] != ':') break;
    ++i;
    skip_ws();
    size_t v = json_value_end(s, i);
    if (v == kJsonIncomplete || v == kJsonBad) break;
    i = last = v;
  }
  return std::string(s.substr(p, last - p));
}

BlockParse stream(const BlockParse& r, const std::string& name, const std::string& id, std::string_view b, size_t j) {
  BlockParse n = r.need();
  std::string args = json_members_prefix(b, j);
  if (valid_name(name) && !args.empty()) {
    n.partial_name = name;
    n.partial_id = id;
    n.partial_args = std::move(args);
  }
  return n;
}

std::string typed_args_prefix(const nlohmann::json& tools, std::string_view tool,
                              const std::vector<std::pair<std::string, std::string>>& kv, bool strip_nl) {
  if (kv.empty()) return "";
  std::string s = typed_args_json(tools, tool, kv, strip_nl);
  s.pop_back();  // the closing '}'
  return s;
}

bool json_args_in_value(std::string_view args) {
  while (!args.empty() && is_ws(args.front())) args.remove_prefix(1);
  if (args.empty() || args[0] != '{') return false;
  JsonArgsStreamer js(1);
  for (size_t i = 1; i < args.size(); ++i) {
    auto st = js.feed(args[i], i);
    if (st != JsonArgsStreamer::Status::kOk) return false;
  }
  return js.in_value();
}

std::string typed_args_json(const nlohmann::json& tools, std::string_view tool,
                            const std::vector<std::pair<std::string, std::string>>& kv, bool strip_nl) {
  const nlohmann::json* props = find_tool_properties(tools, tool);
  std::string out = "{";
  for (size_t i = 0; i < kv.size(); ++i) {
    std::string_view v = kv[i].second;
    if (strip_nl) {
      if (!v.empty() && v.front() == '\n') v.remove_prefix(1);
      if (!v.empty() && v.back() == '\n') v.remove_suffix(1);
    }
    if (i > 0) out += ", ";
    append_json_string(out, kv[i].first);
    out += ": ";
    out += typed_param_json(props, kv[i].first, v);
  }
  out += "}";
  return out;
}

bool valid_name(std::string_view s) {
  if (s.empty() || s.size() > 256) return false;
  for (char c : s)
    if (is_ws(c) || c == '"' || c == '\'' || c == '<' || c == '>' || c == '{' || c == '}' || c == '[') return false;
  return true;
}

bool ends_with_prefix(std::string_view s, std::string_view lit) {
  for (size_t k = std::min(s.size(), lit.size() - 1); k >= 2; --k)
    if (s.substr(s.size() - k) == lit.substr(0, k)) return true;
  return false;
}

}  // namespace spool::server::formats
