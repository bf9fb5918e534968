// libFuzzer target for the server's model-output parser (src/server/output_parser.h): reasoning,
// tool calls of every registered output format (src/server/chat_format.h: Qwen3 JSON, Qwen3.5
// XML, DeepSeek-V3, Kimi-K2, GLM-4.5, MiniMax-M2, gpt-oss harmony, Mistral, ERNIE-4.5, Gemma 4),
// stop strings and in_markup().
//
// Input layout: byte 0 = options (bit 0 tool calls off, bit 2 starts_in_reasoning, bit 3
// parse_reasoning off, bits 4-6 length of a stop string taken from the following bytes, 0 = no
// stop), byte 1 = seed of the split into pieces, byte 2 = the format (index into chat_formats(),
// modulo their number), then the stop string, then the generated text. The format's markup
// strings are a useful fuzzing dictionary. Bytes that are not well-formed UTF-8 are replaced by '?' (the parser's contract is
// complete UTF-8 pieces, which the server's streaming decoder guarantees).
//
// Invariants checked (any violation aborts): every delta is valid UTF-8; the deltas of a split
// feed add up to the aggregated result; the aggregated result of the split feed equals the
// one-piece feed; every tool call's arguments parse as a JSON object; in_markup() is false after
// finish(). An invalid stop string must be rejected with spool::Error.
//
// Build by hand from the repository root:
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
//     -I src fuzz/output_parser_fuzz.cpp src/server/{output_parser,stop_strings,tool_calls,chat_format}.cpp \
//     src/server/formats/*.cpp src/common/json_string.cpp \
//     -o output_parser_fuzz
// or with cmake -DSPOOL_FUZZ=ON; run e.g.: ./output_parser_fuzz -max_len=2048 corpus/
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "server/chat_format.h"
#include "server/output_parser.h"
#include "server/stop_strings.h"

namespace {

using spool::server::OutputDelta;
using spool::server::OutputParser;
using spool::server::ToolCall;
using spool::server::ToolSyntax;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "output_parser_fuzz: invariant violated: %s\n", what);
    std::abort();
  }
}

// Length of the well-formed UTF-8 character at s[i], or 0 if none starts there.
size_t char_len(std::string_view s, size_t i) {
  for (size_t n = 1; n <= 4 && i + n <= s.size(); ++n)
    if (spool::server::valid_utf8(s.substr(i, n))) return n;
  return 0;
}

// `s` with every byte that does not start a well-formed character replaced by '?'.
std::string repair_utf8(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    size_t n = char_len(s, i);
    if (n == 0) {
      out += '?';
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

struct Agg {
  std::string content, reasoning;
  std::vector<ToolCall> calls;
};

// Feeds `pieces`; checks the per-delta invariants and returns the aggregated result.
Agg feed(const OutputParser::Options& opt, const std::vector<std::string>& pieces) {
  OutputParser p(opt);
  Agg cat;
  auto absorb = [&](const OutputDelta& d) {
    check(spool::server::valid_utf8(d.content), "content delta is not UTF-8");
    check(spool::server::valid_utf8(d.reasoning), "reasoning delta is not UTF-8");
    cat.content += d.content;
    cat.reasoning += d.reasoning;
    for (const auto& tc : d.tool_calls) {
      check(spool::server::valid_utf8(tc.arguments), "arguments delta is not UTF-8");
      if (!tc.id.empty()) {
        check(tc.index == static_cast<int>(cat.calls.size()), "call index out of order");
        cat.calls.push_back(ToolCall{tc.id, tc.name, tc.arguments, true});
      } else {
        check(tc.index >= 0 && tc.index < static_cast<int>(cat.calls.size()), "delta for an unknown call");
        cat.calls[static_cast<size_t>(tc.index)].arguments += tc.arguments;
      }
    }
  };
  for (const auto& piece : pieces) absorb(p.push(piece));
  absorb(p.finish());
  check(!p.in_markup(), "in_markup after finish");
  check(cat.content == p.content() && cat.reasoning == p.reasoning(), "deltas do not add up");
  check(cat.calls.size() == p.tool_calls().size(), "call count differs from the aggregate");
  for (size_t i = 0; i < cat.calls.size(); ++i) {
    const ToolCall& a = p.tool_calls()[i];
    check(cat.calls[i].arguments == a.arguments && cat.calls[i].name == a.name && cat.calls[i].id == a.id,
          "call deltas do not add up");
    auto j = nlohmann::json::parse(a.arguments, nullptr, /*allow_exceptions=*/false);
    check(j.is_object(), "arguments are not a JSON object");
  }
  return cat;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const uint8_t flags = data[0], seed = data[1];
  const auto& formats = spool::server::chat_formats();
  std::string_view rest(reinterpret_cast<const char*>(data + 3), size - 3);
  OutputParser::Options opt;
  opt.syntax = formats[data[2] % formats.size()].id;
  opt.tool_calls = !(flags & 1);
  opt.starts_in_reasoning = flags & 4;
  opt.parse_reasoning = !(flags & 8);
  opt.tools = nlohmann::json::parse(R"([{"type": "function", "function": {"name": "f", "parameters":
      {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"},
      "d": {"type": ["string", "null"]}, "e": {"type": "object"}}}}}])");
  const size_t stop_len = std::min<size_t>((flags >> 4) & 7, rest.size());
  if (stop_len > 0) {
    std::string stop(rest.substr(0, stop_len));
    rest.remove_prefix(stop_len);
    opt.stop = {stop};
    if (!spool::server::valid_utf8(stop)) {
      try {
        OutputParser p(opt);
        check(false, "an invalid stop string was accepted");
      } catch (const spool::Error&) {
      }
      return 0;
    }
  }
  const std::string text = repair_utf8(rest);
  // Split at character boundaries into pieces of 1..8 characters.
  std::mt19937 rng(seed);
  std::vector<std::string> pieces;
  for (size_t i = 0; i < text.size();) {
    size_t chars = 1 + rng() % 8, j = i;
    while (chars-- > 0 && j < text.size()) j += char_len(text, j);
    pieces.emplace_back(text.substr(i, j - i));
    i = j;
  }
  Agg split = feed(opt, pieces);
  Agg whole = feed(opt, {text});
  check(split.content == whole.content && split.reasoning == whole.reasoning, "result depends on the split");
  check(split.calls.size() == whole.calls.size(), "call count depends on the split");
  for (size_t i = 0; i < split.calls.size(); ++i)
    check(split.calls[i].arguments == whole.calls[i].arguments && split.calls[i].name == whole.calls[i].name,
          "call depends on the split");
  return 0;
}
