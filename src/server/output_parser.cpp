#include "server/output_parser.h"

#include <algorithm>
#include <cassert>
#include <optional>
#include <utility>

#include "server/chat_format.h"
#include "server/formats/family.h"
#include "server/stop_strings.h"
#include "server/tool_calls.h"

namespace spool::server {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kToolOpen = "<tool_call>";
constexpr std::string_view kToolClose = "</tool_call>";
constexpr std::string_view kFuncOpen = "<function=";
constexpr std::string_view kFuncClose = "</function>";
constexpr std::string_view kParamOpen = "<parameter=";
constexpr std::string_view kParamClose = "</parameter>";

// Longest whitespace run that is held back / skipped while waiting for markup; longer runs
// are text. Bounds how long output is held and keeps rescans linear.
constexpr size_t kMaxWs = 64;
// Longest function / parameter name accepted in markup.
constexpr size_t kMaxName = 256;

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// 1: `text` starts with `lit`; 0: `text` is a proper prefix of `lit` (may still match);
// -1: mismatch.
int match_lit(std::string_view text, std::string_view lit) {
  if (text.size() >= lit.size()) return text.compare(0, lit.size(), lit) == 0 ? 1 : -1;
  return lit.compare(0, text.size(), text) == 0 ? 0 : -1;
}

// Outcome of matching the opening markup of a tool call up to its announcement point.
struct OpenMatch {
  enum Kind { kMatch, kPartial, kFail } kind = kPartial;
  size_t pos = 0;     // kMatch: end of the markup; kFail: start of the element that failed
  std::string name;   // kMatch: the function name
};

}  // namespace

struct OutputParser::Impl {
  enum class St {
    kStart,           // output start: a leading <think> may follow
    kReasoningStart,  // right after <think>: one newline is dropped
    kReasoning,
    kAfterThink,      // right after </think>: newlines are dropped
    kContent,
    kToolPre,         // <tool_call> seen, call not announced yet (markup held back)
    kXmlBody,         // between parameters
    kXmlValue,        // inside a parameter value
    kXmlAfterFunc,    // after </function>, expecting </tool_call>
    kJsonArgs,        // inside the arguments object
    kJsonAfterArgs,   // after the arguments object, expecting } and </tool_call>
    kJsonAfterObj,    // after the outer }, expecting </tool_call>
  };

  Options opt;
  StopMatcher stop;
  bool xml;
  std::string raw;  // all text released by the stop matcher; positions below index it
  size_t pos = 0;   // first unprocessed byte
  bool eof = false;
  bool finished = false;
  St st;

  OutputDelta cur;
  std::string content, reasoning;
  std::vector<ToolCall> calls;
  bool after_call = false;  // nothing but whitespace since the last tool call

  // tool-call state
  size_t pre_start = 0;  // start of held-back markup (incl. the whitespace before <tool_call>)
  size_t tag_pos = 0;    // the <tool_call>
  size_t unrep = 0;      // raw text from here on is not represented in the call (XML)
  size_t tool_end = 0;   // end of the closed function / arguments
  bool args_open = false;  // XML: "{" emitted
  const nlohmann::json* props = nullptr;
  std::string param_name;
  size_t value_start = 0, value_scan = 0;
  bool value_lookahead = false;  // a </parameter> waits for what follows it
  std::optional<JsonArgsStreamer> json;

  explicit Impl(Options o)
      : opt(std::move(o)), stop(opt.stop), xml(opt.syntax == ToolSyntax::kQwen35Xml) {
    if (!opt.tool_calls) opt.syntax = ToolSyntax::kNone;
    st = opt.parse_reasoning ? St::kStart : St::kContent;
  }

  std::string_view view(size_t a, size_t b) const {
    return std::string_view(raw).substr(a, b - a);
  }
  std::string_view from(size_t a) const { return std::string_view(raw).substr(a); }

  // ---- emission
  void emit_content(size_t a, size_t b) {
    if (b <= a) return;
    auto t = view(a, b);
    cur.content += t;
    content += t;
    after_call = false;
  }
  void emit_reasoning(size_t a, size_t b) {
    if (b <= a) return;
    auto t = view(a, b);
    cur.reasoning += t;
    reasoning += t;
  }
  void announce(std::string name) {
    int idx = static_cast<int>(calls.size());
    ToolCall c;
    c.id = make_tool_call_id(opt.id_prefix, opt.id_seed, idx);
    c.name = std::move(name);
    c.complete = false;
    cur.tool_calls.push_back(ToolCallDelta{idx, c.id, c.name, ""});
    calls.push_back(std::move(c));
  }
  void emit_args(std::string_view t) {
    if (t.empty()) return;
    int idx = static_cast<int>(calls.size()) - 1;
    calls.back().arguments += t;
    // One entry per call and delta: the arguments join the announcement (id and name) when
    // that is in this delta too, as OpenAI streams a call's first piece.
    auto& v = cur.tool_calls;
    if (!v.empty() && v.back().index == idx) {
      v.back().arguments += t;
    } else {
      v.push_back(ToolCallDelta{idx, "", "", std::string(t)});
    }
  }
  void end_call() {
    after_call = true;
    json.reset();
    st = St::kContent;
  }
  // The announced call broke (bad markup or end of output): close its arguments into valid
  // JSON and go on as content from `unrep_from`, the first raw byte the arguments do not
  // represent (so that text is emitted, or starts a new call, but is never lost).
  void broken_call(size_t unrep_from) {
    if (xml) {
      emit_args(args_open ? "}" : "{}");
    } else {
      emit_args(json->take_safe());
      emit_args(json->healing());
    }
    calls.back().complete = false;
    end_call();
    pos = unrep_from;
  }

  // Start of the trailing whitespace run of [a, b), at most kMaxWs bytes long.
  size_t ws_start(size_t a, size_t b) const {
    size_t w = b;
    while (w > a && b - w < kMaxWs && is_ws(raw[w - 1])) --w;
    return w;
  }

  // ---- matchers on raw text from a position; decisions use only the bytes present
  // `<tool_call>` ws* `<function=` at raw[i]: 1 / 0 (could still) / -1.
  int implicit_tool_call(size_t i) const {
    int m = match_lit(from(i), kToolOpen);
    if (m != 1) return m;
    size_t p = i + kToolOpen.size(), s = p;
    while (p < raw.size() && is_ws(raw[p])) {
      if (p - s >= kMaxWs) return -1;
      ++p;
    }
    if (p == raw.size()) return 0;
    return match_lit(from(p), kFuncOpen);
  }

  OpenMatch match_xml_open() const {
    OpenMatch r;
    size_t n = raw.size(), p = tag_pos + kToolOpen.size(), s = p;
    while (p < n && is_ws(raw[p])) {
      if (p - s >= kMaxWs) return {OpenMatch::kFail, s, {}};
      ++p;
    }
    int m = match_lit(from(p), kFuncOpen);
    if (m < 0) return {OpenMatch::kFail, p, {}};
    if (m == 0) return r;
    size_t name0 = p + kFuncOpen.size(), q = name0;
    for (; q < n && raw[q] != '>'; ++q) {
      char c = raw[q];
      if (q - name0 >= kMaxName || c == '<' || c == '{' || c == '}' || c == '"' || c == '\'' ||
          is_ws(c)) {
        return {OpenMatch::kFail, p, {}};
      }
    }
    if (q == n) return r;
    if (q == name0) return {OpenMatch::kFail, p, {}};
    return {OpenMatch::kMatch, q + 1, std::string(view(name0, q))};
  }

  OpenMatch match_json_open() const {
    size_t n = raw.size(), p = tag_pos + kToolOpen.size();
    OpenMatch partial;
    auto fail = [](size_t at) { return OpenMatch{OpenMatch::kFail, at, {}}; };
    // Each step returns 1 (matched, p advanced), 0 (needs more text) or -1 (failed at p).
    auto ws = [&]() {
      size_t s = p;
      while (p < n && is_ws(raw[p])) {
        if (p - s >= kMaxWs) {
          p = s;
          return -1;
        }
        ++p;
      }
      return p < n ? 1 : 0;
    };
    auto lit = [&](std::string_view l) {
      int m = match_lit(from(p), l);
      if (m == 1) p += l.size();
      return m;
    };
    std::string name;
    auto str = [&]() {
      if (raw[p] != '"') return -1;
      size_t q = p + 1;
      while (q < n && raw[q] != '"') {
        if (q - p > kMaxName || static_cast<unsigned char>(raw[q]) < 0x20) return -1;
        q += raw[q] == '\\' ? 2 : 1;
      }
      if (q >= n) return 0;
      auto j = nlohmann::json::parse(view(p, q + 1), nullptr, /*allow_exceptions=*/false);
      if (!j.is_string() || j.get_ref<const std::string&>().empty()) return -1;
      name = j.get<std::string>();
      p = q + 1;
      return 1;
    };
    const std::string_view steps[] = {"{", "\"name\"", ":", "", ",", "\"arguments\"", ":", "{"};
    for (std::string_view step : steps) {
      int m = ws();
      if (m <= 0) return m < 0 ? fail(p) : partial;
      size_t at = p;
      m = step.empty() ? str() : lit(step);
      if (m < 0) return fail(at);
      if (m == 0) return partial;
    }
    return {OpenMatch::kMatch, p, std::move(name)};
  }

  // ---- states; each returns false when it needs more text (or, at eof, when done)
  bool step() {
    const size_t n = raw.size();
    switch (st) {
      case St::kStart: {
        size_t p = pos;
        while (p < n && is_ws(raw[p]) && p - pos <= kMaxWs) ++p;
        int m = p - pos > kMaxWs ? -1 : match_lit(from(p), kThinkOpen);
        if (m == 1) {
          pos = p + kThinkOpen.size();
          st = St::kReasoningStart;
          return true;
        }
        if (m == 0 && !eof) return false;
        st = opt.starts_in_reasoning ? St::kReasoningStart : St::kContent;
        return true;
      }

      case St::kReasoningStart:
        if (pos < n) {
          if (raw[pos] == '\n') ++pos;
        } else if (!eof) {
          return false;
        }
        st = St::kReasoning;
        return true;

      case St::kReasoning: {
        // One newline right before </think> (or the implicit end) is dropped, so it is held.
        auto strip_nl = [&](size_t e) { return e > pos && raw[e - 1] == '\n' ? e - 1 : e; };
        size_t i = raw.find('<', pos);
        if (i == std::string::npos) {
          size_t e = eof ? n : strip_nl(n);
          emit_reasoning(pos, e);
          pos = e;
          return false;
        }
        int mc = match_lit(from(i), kThinkClose);
        if (mc == 1) {
          emit_reasoning(pos, strip_nl(i));
          pos = i + kThinkClose.size();
          st = St::kAfterThink;
          return true;
        }
        int mt = xml ? implicit_tool_call(i) : -1;
        if (mt == 1) {
          emit_reasoning(pos, strip_nl(i));
          pos = i;
          st = St::kContent;
          return true;
        }
        if (!eof && (mc == 0 || mt == 0)) {
          size_t e = strip_nl(i);
          emit_reasoning(pos, e);
          pos = e;
          return false;
        }
        emit_reasoning(pos, i + 1);
        pos = i + 1;
        return true;
      }

      case St::kAfterThink:
        while (pos < n && raw[pos] == '\n') ++pos;
        if (pos == n && !eof) return false;
        st = St::kContent;
        return true;

      case St::kContent: {
        if (opt.syntax == ToolSyntax::kNone) {
          emit_content(pos, n);
          pos = n;
          return false;
        }
        size_t i = raw.find('<', pos);
        if (i == std::string::npos) {
          size_t w = ws_start(pos, n);
          emit_content(pos, w);
          if (eof && !after_call) emit_content(w, n);  // whitespace after the last call: dropped
          pos = eof ? n : w;
          return false;
        }
        int m = match_lit(from(i), kToolOpen);
        if (m == 1 || (m == 0 && !eof)) {
          size_t w = ws_start(pos, i);
          emit_content(pos, w);
          if (m == 0) {
            pos = w;
            return false;
          }
          pre_start = w;
          tag_pos = pos = i;
          st = St::kToolPre;
          return true;
        }
        emit_content(pos, i + 1);
        pos = i + 1;
        return true;
      }

      case St::kToolPre: {
        OpenMatch m = xml ? match_xml_open() : match_json_open();
        if (m.kind == OpenMatch::kMatch) {
          announce(std::move(m.name));
          pos = unrep = m.pos;
          args_open = false;
          if (xml) {
            props = find_tool_properties(opt.tools, calls.back().name);
            st = St::kXmlBody;
          } else {
            json.emplace(pos);
            emit_args(json->take_safe());
            st = St::kJsonArgs;
          }
          return true;
        }
        if (m.kind == OpenMatch::kPartial && !eof) return false;
        size_t f = m.kind == OpenMatch::kPartial ? n : m.pos;
        emit_content(pre_start, f);  // not a tool call: the markup is text
        pos = f;
        st = St::kContent;
        return true;
      }

      case St::kXmlBody: {
        while (pos < n && is_ws(raw[pos])) ++pos;
        auto rest = from(pos);
        int mp = match_lit(rest, kParamOpen), mf = match_lit(rest, kFuncClose),
            mt = match_lit(rest, kToolClose);
        if (mp == 1) {
          size_t name0 = pos + kParamOpen.size(), q = name0;
          bool bad = false;
          for (; q < n && raw[q] != '>'; ++q) {
            if (q - name0 >= kMaxName || raw[q] == '<' || raw[q] == '\n') {
              bad = true;
              break;
            }
          }
          if (!bad && q == n && !eof) return false;
          if (bad || q == n || q == name0) {
            broken_call(unrep);
            return true;
          }
          param_name.assign(view(name0, q));
          pos = value_start = value_scan = q + 1;
          value_lookahead = false;
          st = St::kXmlValue;
          return true;
        }
        if (mf == 1 || mt == 1) {
          emit_args(args_open ? "}" : "{}");
          calls.back().complete = true;
          if (mt == 1) {  // </tool_call> without </function>: accepted
            pos += kToolClose.size();
            end_call();
          } else {
            pos = tool_end = pos + kFuncClose.size();
            st = St::kXmlAfterFunc;
          }
          return true;
        }
        if (!eof && (mp == 0 || mf == 0 || mt == 0)) return false;
        broken_call(unrep);
        return true;
      }

      case St::kXmlValue:
        for (;;) {
          size_t j = raw.find(kParamClose, value_scan);
          if (j == std::string::npos) {
            value_lookahead = false;
            if (eof) {
              broken_call(unrep);
              return true;
            }
            size_t keep = kParamClose.size() - 1;
            value_scan = std::max(value_scan, n > value_start + keep ? n - keep : value_start);
            return false;
          }
          size_t a = j + kParamClose.size(), q = a;
          while (q < n && is_ws(raw[q]) && q - a <= kMaxWs) ++q;
          bool structural = false, need_more = false;
          if (q - a <= kMaxWs) {
            if (q == n) {
              structural = eof;
              need_more = !eof;
            } else {
              auto rest = from(q);
              int m1 = match_lit(rest, kParamOpen), m2 = match_lit(rest, kFuncClose),
                  m3 = match_lit(rest, kToolClose);
              structural = m1 == 1 || m2 == 1 || m3 == 1;
              need_more = !structural && !eof && (m1 == 0 || m2 == 0 || m3 == 0);
            }
          }
          if (need_more) {
            value_scan = j;
            value_lookahead = true;
            return false;
          }
          if (!structural) {  // literal "</parameter>" inside the value
            value_scan = j + 1;
            continue;
          }
          std::string_view v = view(value_start, j);
          if (!v.empty() && v.front() == '\n') v.remove_prefix(1);
          if (!v.empty() && v.back() == '\n') v.remove_suffix(1);
          std::string frag = args_open ? ", " : "{";
          append_json_string(frag, param_name);
          frag += ": ";
          frag += typed_param_json(props, param_name, v);
          emit_args(frag);
          args_open = true;
          pos = unrep = a;
          value_lookahead = false;
          st = St::kXmlBody;
          return true;
        }

      case St::kJsonArgs:
        while (pos < n) {
          auto s = json->feed(raw[pos], pos);
          if (s == JsonArgsStreamer::Status::kError) {
            emit_args(json->take_safe());
            broken_call(json->safe_raw_end());
            return true;
          }
          ++pos;
          if (s == JsonArgsStreamer::Status::kDone) {
            emit_args(json->take_safe());
            calls.back().complete = true;
            json.reset();
            tool_end = pos;
            st = St::kJsonAfterArgs;
            return true;
          }
        }
        emit_args(json->take_safe());
        if (eof) {
          broken_call(json->safe_raw_end());
          return true;
        }
        return false;

      case St::kXmlAfterFunc:
      case St::kJsonAfterArgs:
      case St::kJsonAfterObj: {
        // The call's arguments are complete; only closing markup may follow. Anything else
        // ends the call and is content from the end of the arguments on.
        size_t p = pos;
        while (p < n && is_ws(raw[p]) && p - pos <= kMaxWs) ++p;
        if (p - pos <= kMaxWs) {
          if (p == n && !eof) return false;
          if (p < n && st == St::kJsonAfterArgs && raw[p] == '}') {
            pos = tool_end = p + 1;
            st = St::kJsonAfterObj;
            return true;
          }
          int m = match_lit(from(p), kToolClose);
          if (m == 1) {
            pos = p + kToolClose.size();
            end_call();
            return true;
          }
          if (m == 0 && p < n && !eof) return false;
        }
        end_call();
        pos = tool_end;
        return true;
      }
    }
    return false;
  }

  void run() {
    while (step()) {
    }
  }

  OutputDelta take() { return std::exchange(cur, OutputDelta{}); }

  void finalize() {
    eof = true;
    run();
    assert(pos == raw.size());
    finished = true;
  }

  bool in_markup() const {
    if (finished) return false;
    switch (st) {
      case St::kToolPre:
      case St::kXmlBody:
      case St::kXmlAfterFunc:
      case St::kJsonAfterArgs:
      case St::kJsonAfterObj:
        return true;
      case St::kJsonArgs:
        return !json->in_value();
      case St::kXmlValue: {
        if (value_lookahead) return true;
        size_t n = raw.size(), avail = n - value_start;
        for (size_t k = std::min(avail, kParamClose.size() - 1); k >= 2; --k) {
          if (raw.compare(n - k, k, kParamClose.substr(0, k)) == 0) return true;
        }
        return false;
      }
      default:
        return false;
    }
  }
};

void OutputDelta::append(OutputDelta d) {
  content += d.content;
  reasoning += d.reasoning;
  for (auto& tc : d.tool_calls) {
    if (!tool_calls.empty() && tool_calls.back().index == tc.index && tc.id.empty()) {
      tool_calls.back().arguments += tc.arguments;
    } else {
      tool_calls.push_back(std::move(tc));
    }
  }
}

namespace {
bool qwen_engine(ToolSyntax s) {
  return s == ToolSyntax::kNone || s == ToolSyntax::kQwen3Json || s == ToolSyntax::kQwen35Xml;
}
}  // namespace

OutputParser::OutputParser(Options opt) {
  const ChatFormat& f = chat_format(opt.syntax);
  if (qwen_engine(opt.syntax)) {
    for (const auto& s : f.end_of_turn) opt.stop.push_back(s);
    impl_ = std::make_unique<Impl>(std::move(opt));
  } else if (opt.syntax == ToolSyntax::kGptOss) {
    fam_ = formats::make_harmony_parser(std::move(opt));
  } else {
    const formats::BlockSpec* spec = nullptr;
    switch (opt.syntax) {
      case ToolSyntax::kDeepSeekV3: spec = &formats::deepseek_v3_spec(); break;
      case ToolSyntax::kKimiK2: spec = &formats::kimi_k2_spec(); break;
      case ToolSyntax::kGlm45: spec = &formats::glm4_5_spec(); break;
      case ToolSyntax::kMiniMaxM2: spec = &formats::minimax_m2_spec(); break;
      case ToolSyntax::kMistral: spec = &formats::mistral_spec(); break;
      case ToolSyntax::kErnie45: spec = &formats::ernie4_5_spec(); break;
      case ToolSyntax::kGemma4: spec = &formats::gemma4_spec(); break;
      default: break;
    }
    fam_ = formats::make_block_parser(*spec, std::move(opt), f.end_of_turn);
  }
}
OutputParser::~OutputParser() = default;
OutputParser::OutputParser(OutputParser&&) noexcept = default;
OutputParser& OutputParser::operator=(OutputParser&&) noexcept = default;

OutputDelta OutputParser::push(std::string_view text) {
  if (fam_) return fam_->push(text);
  Impl& s = *impl_;
  if (s.finished) return {};
  s.raw += s.stop.push(text);
  s.run();
  if (s.stop.stopped()) s.finalize();
  return s.take();
}

OutputDelta OutputParser::finish() {
  if (fam_) return fam_->finish();
  Impl& s = *impl_;
  if (s.finished) return {};
  s.raw += s.stop.finish();
  s.finalize();
  return s.take();
}

bool OutputParser::stopped() const { return fam_ ? fam_->stopped() : impl_->stop.stopped(); }
bool OutputParser::finished() const { return fam_ ? fam_->finished() : impl_->finished; }
bool OutputParser::in_markup() const { return fam_ ? fam_->in_markup() : impl_->in_markup(); }
bool OutputParser::in_reasoning() const {
  if (fam_) return !fam_->finished() && fam_->in_reasoning();
  if (impl_->finished || !impl_->opt.parse_reasoning) return false;
  using St = Impl::St;
  return impl_->st == St::kReasoningStart || impl_->st == St::kReasoning ||
         (impl_->st == St::kStart && impl_->opt.starts_in_reasoning);
}
const std::string& OutputParser::content() const { return fam_ ? fam_->content() : impl_->content; }
const std::string& OutputParser::reasoning() const { return fam_ ? fam_->reasoning() : impl_->reasoning; }
const std::vector<ToolCall>& OutputParser::tool_calls() const { return fam_ ? fam_->tool_calls() : impl_->calls; }

}  // namespace spool::server
