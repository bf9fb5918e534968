// Tests of the server's model-output parser on hand-written model outputs that follow the
// Qwen3 / Qwen3.5 chat templates (tests/data/tokenizers/*), including the split-invariance
// property: any split of the same text into pieces gives the same deltas' concatenation,
// aggregated result and one-piece result.
#include "server/output_parser.h"

#include <fstream>
#include <random>
#include <sstream>

#include <gtest/gtest.h>

#include "common/error.h"
#include "server/stop_strings.h"
#include "server/tool_calls.h"

namespace spool::server {
namespace {

using Options = OutputParser::Options;

// ---------------------------------------------------------------------------------------------
// Harness

struct Result {
  std::string content, reasoning;
  std::vector<ToolCall> calls;
  bool stopped = false;
  bool operator==(const Result& o) const {
    if (content != o.content || reasoning != o.reasoning || stopped != o.stopped ||
        calls.size() != o.calls.size()) {
      return false;
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      if (calls[i].id != o.calls[i].id || calls[i].name != o.calls[i].name ||
          calls[i].arguments != o.calls[i].arguments || calls[i].complete != o.calls[i].complete) {
        return false;
      }
    }
    return true;
  }
};

std::ostream& operator<<(std::ostream& os, const Result& r) {
  os << "{content=" << nlohmann::json(r.content).dump() << ", reasoning="
     << nlohmann::json(r.reasoning).dump() << ", stopped=" << r.stopped << ", calls=[";
  for (const auto& c : r.calls) {
    os << "{" << c.id << " " << c.name << " " << c.arguments << (c.complete ? "" : " INCOMPLETE")
       << "}";
  }
  return os << "]}";
}

// Pushes `pieces`, checks the per-delta invariants and that the deltas' concatenation equals
// the aggregated result, and returns that result.
Result run_pieces(const Options& opt, const std::vector<std::string>& pieces) {
  OutputParser p(opt);
  Result cat;
  auto absorb = [&](const OutputDelta& d) {
    EXPECT_TRUE(valid_utf8(d.content)) << d.content;
    EXPECT_TRUE(valid_utf8(d.reasoning)) << d.reasoning;
    cat.content += d.content;
    cat.reasoning += d.reasoning;
    for (const auto& tc : d.tool_calls) {
      if (!tc.id.empty()) {  // the announcement, with the call's first arguments when they are known
        EXPECT_EQ(tc.index, static_cast<int>(cat.calls.size()));
        EXPECT_FALSE(tc.name.empty());
        EXPECT_TRUE(valid_utf8(tc.arguments)) << tc.arguments;
        cat.calls.push_back(ToolCall{tc.id, tc.name, tc.arguments, true});
      } else {
        EXPECT_TRUE(tc.name.empty());
        EXPECT_FALSE(tc.arguments.empty());
        EXPECT_GE(tc.index, 0);
        EXPECT_LT(tc.index, static_cast<int>(cat.calls.size()));
        if (tc.index >= 0 && tc.index < static_cast<int>(cat.calls.size())) {
          cat.calls[static_cast<size_t>(tc.index)].arguments += tc.arguments;
        }
        EXPECT_TRUE(valid_utf8(tc.arguments)) << tc.arguments;
      }
    }
  };
  auto absorb_delta = [&](const OutputDelta& d) {
    // At most one entry per call in a delta.
    for (size_t i = 1; i < d.tool_calls.size(); ++i) EXPECT_NE(d.tool_calls[i].index, d.tool_calls[i - 1].index);
    absorb(d);
  };
  for (const auto& piece : pieces) {
    absorb_delta(p.push(piece));
    if (p.stopped()) {
      EXPECT_TRUE(p.push("ignored").empty());
    }
  }
  absorb_delta(p.finish());
  EXPECT_TRUE(p.finish().empty());
  EXPECT_FALSE(p.in_markup());
  Result agg{p.content(), p.reasoning(), p.tool_calls(), p.stopped()};
  cat.stopped = agg.stopped;
  for (size_t i = 0; i < cat.calls.size() && i < agg.calls.size(); ++i) {
    cat.calls[i].complete = agg.calls[i].complete;
  }
  EXPECT_EQ(cat, agg) << "deltas do not add up to the aggregated result";
  for (const auto& c : agg.calls) {
    auto j = nlohmann::json::parse(c.arguments, nullptr, false);
    EXPECT_TRUE(j.is_object()) << "arguments are not a JSON object: " << c.arguments;
  }
  return agg;
}

// Splits into UTF-8 characters.
std::vector<std::string> chars(std::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    out.emplace_back(s.substr(i, len));
    i += len;
  }
  return out;
}

// Random split at character boundaries into pieces of 1..max_chars characters.
std::vector<std::string> random_split(std::string_view s, std::mt19937& rng, int max_chars) {
  auto cs = chars(s);
  std::vector<std::string> out;
  std::uniform_int_distribution<int> len(1, max_chars);
  for (size_t i = 0; i < cs.size();) {
    size_t k = std::min(cs.size() - i, static_cast<size_t>(len(rng)));
    std::string piece;
    for (size_t j = 0; j < k; ++j) piece += cs[i + j];
    out.push_back(std::move(piece));
    i += k;
  }
  return out;
}

// Parses `text` whole, char by char and with random splits; all must agree. Returns the result.
Result parse_all_ways(const Options& opt, std::string_view text) {
  Result whole = run_pieces(opt, {std::string(text)});
  EXPECT_EQ(run_pieces(opt, chars(text)), whole) << "char-by-char split differs";
  std::mt19937 rng(12345);
  for (int round = 0; round < 12; ++round) {
    auto pieces = random_split(text, rng, round < 6 ? 3 : 12);
    EXPECT_EQ(run_pieces(opt, pieces), whole) << "random split " << round << " differs";
  }
  return whole;
}

Options qwen3_opts() {
  Options o;
  o.syntax = ToolSyntax::kQwen3Json;
  o.id_seed = 7;
  return o;
}

Options qwen35_opts() {
  Options o;
  o.syntax = ToolSyntax::kQwen35Xml;
  o.starts_in_reasoning = true;
  o.id_seed = 7;
  return o;
}

nlohmann::json weather_tools() {
  return nlohmann::json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
      "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "book_flight", "description": "Books a flight",
      "parameters": {"type": "object", "properties": {
        "destination": {"type": "string"},
        "zip": {"type": "string"},
        "passengers": {"type": "integer"},
        "max_price": {"type": "number"},
        "refundable": {"type": "boolean"},
        "options": {"type": "object"},
        "stops": {"type": "array", "items": {"type": "string"}},
        "note": {"type": ["string", "null"]},
        "seat": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}}}
  ])");
}

// ---------------------------------------------------------------------------------------------
// Plain content and reasoning

TEST(OutputParser, PlainContentAllSyntaxes) {
  const std::string text = "Hello! Paris is the capital of France.\n\nAnything else? a < b > c";
  for (auto syntax : {ToolSyntax::kNone, ToolSyntax::kQwen3Json, ToolSyntax::kQwen35Xml}) {
    Options o;
    o.syntax = syntax;
    Result r = parse_all_ways(o, text);
    EXPECT_EQ(r.content, text);
    EXPECT_EQ(r.reasoning, "");
    EXPECT_TRUE(r.calls.empty());
    EXPECT_FALSE(r.stopped);
  }
}

TEST(OutputParser, Qwen3ThinkingThenContent) {
  const std::string text =
      "<think>\nThe user says hello. I should greet them back.\n\nKeep it short.\n</think>\n\n"
      "Hello! How can I help you today?";
  Result r = parse_all_ways(qwen3_opts(), text);
  EXPECT_EQ(r.reasoning, "The user says hello. I should greet them back.\n\nKeep it short.");
  EXPECT_EQ(r.content, "Hello! How can I help you today?");
}

TEST(OutputParser, EmptyThinkBlock) {
  // Qwen3 with /no_think writes an empty block itself.
  Result r = parse_all_ways(qwen3_opts(), "<think>\n\n</think>\n\nHi there.");
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Hi there.");
}

TEST(OutputParser, StartsInReasoning) {
  // Qwen3.5/3.6 generation prompt ends with "<think>\n": the output opens inside reasoning.
  const std::string text =
      "The user wants a haiku about autumn.\nFive, seven, five syllables.\n</think>\n\n"
      "Crimson leaves drifting\nwhispers of the cooling wind\nthe year exhales slow";
  Result r = parse_all_ways(qwen35_opts(), text);
  EXPECT_EQ(r.reasoning, "The user wants a haiku about autumn.\nFive, seven, five syllables.");
  EXPECT_EQ(r.content,
            "Crimson leaves drifting\nwhispers of the cooling wind\nthe year exhales slow");
}

TEST(OutputParser, StartsInReasoningToleratesRepeatedThinkTag) {
  Result r = parse_all_ways(qwen35_opts(), "<think>\nHmm.\n</think>\n\nOK.");
  EXPECT_EQ(r.reasoning, "Hmm.");
  EXPECT_EQ(r.content, "OK.");
}

TEST(OutputParser, UnclosedReasoningIsAllReasoning) {
  Options o = qwen35_opts();
  Result r = parse_all_ways(o, "Still thinking about </thi");
  EXPECT_EQ(r.reasoning, "Still thinking about </thi");
  EXPECT_EQ(r.content, "");
  r = parse_all_ways(o, "Line one\n");  // held-back newline is flushed at the end
  EXPECT_EQ(r.reasoning, "Line one\n");
}

TEST(OutputParser, OnlyOneNewlineStrippedAroundReasoning) {
  Result r = parse_all_ways(qwen3_opts(), "<think>\n\nA\n\n</think>\n\n\nB\n");
  EXPECT_EQ(r.reasoning, "\nA\n");
  EXPECT_EQ(r.content, "B\n");
}

TEST(OutputParser, ThinkTagsOutsideReasoningAreContent) {
  Options o = qwen3_opts();
  Result r = parse_all_ways(o, "Use <think> and </think> tags.");
  EXPECT_EQ(r.content, "Use <think> and </think> tags.");
  EXPECT_EQ(r.reasoning, "");
  o.parse_reasoning = false;
  r = parse_all_ways(o, "<think>\nx\n</think>\n\ny");
  EXPECT_EQ(r.content, "<think>\nx\n</think>\n\ny");
  EXPECT_EQ(r.reasoning, "");
  // After reasoning ended, another <think> is content too.
  r = parse_all_ways(qwen3_opts(), "<think>a</think>b<think>c</think>");
  EXPECT_EQ(r.reasoning, "a");
  EXPECT_EQ(r.content, "b<think>c</think>");
}

TEST(OutputParser, ToolCallTagInsideReasoningStaysReasoning) {
  Options o = qwen3_opts();
  o.starts_in_reasoning = true;
  const std::string text =
      "I could write <tool_call>\n{\"name\": \"x\", \"arguments\": {}}\n</tool_call> here.\n"
      "</think>\n\nDone.";
  Result r = parse_all_ways(o, text);
  EXPECT_EQ(r.reasoning,
            "I could write <tool_call>\n{\"name\": \"x\", \"arguments\": {}}\n</tool_call> here.");
  EXPECT_EQ(r.content, "Done.");
  EXPECT_TRUE(r.calls.empty());
}

// ---------------------------------------------------------------------------------------------
// Qwen3 JSON tool calls

TEST(OutputParser, Qwen3JsonSingleCall) {
  const std::string text =
      "<think>\nThe user wants the weather in Paris. I'll call get_weather.\n</think>\n\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
      "</tool_call>";
  Result r = parse_all_ways(qwen3_opts(), text);
  EXPECT_EQ(r.reasoning, "The user wants the weather in Paris. I'll call get_weather.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_TRUE(r.calls[0].complete);
  EXPECT_EQ(r.calls[0].id.substr(0, 5), "call_");
  EXPECT_EQ(r.calls[0].id.size(), 5u + 24u);
}

TEST(OutputParser, Qwen3JsonMultipleCallsAfterContent) {
  const std::string text =
      "Let me check both cities for you.\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n"
      "</tool_call>\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tokyo\", \"days\": 3, "
      "\"extra\": {\"hourly\": [true, false, null], \"x\": -1.5e3}}}\n</tool_call>\n";
  Result r = parse_all_ways(qwen3_opts(), text);
  EXPECT_EQ(r.content, "Let me check both cities for you.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"Paris\", \"unit\": \"c\"}");
  EXPECT_EQ(r.calls[1].arguments,
            "{\"city\": \"Tokyo\", \"days\": 3, \"extra\": {\"hourly\": [true, false, null], "
            "\"x\": -1.5e3}}");
  EXPECT_NE(r.calls[0].id, r.calls[1].id);
}

TEST(OutputParser, DeltasAppendOneEntryPerCall) {
  OutputDelta a;
  a.content = "x";
  a.tool_calls.push_back(ToolCallDelta{0, "call_a", "f", "{"});
  OutputDelta b;
  b.content = "y";
  b.tool_calls.push_back(ToolCallDelta{0, "", "", "\"k\": 1}"});
  b.tool_calls.push_back(ToolCallDelta{1, "call_b", "g", "{}"});
  a.append(std::move(b));
  EXPECT_EQ(a.content, "xy");
  ASSERT_EQ(a.tool_calls.size(), 2u);
  EXPECT_EQ(a.tool_calls[0].id, "call_a");
  EXPECT_EQ(a.tool_calls[0].arguments, "{\"k\": 1}");
  EXPECT_EQ(a.tool_calls[1].name, "g");
}

TEST(OutputParser, Qwen3JsonStreamsHeaderThenArgumentFragments) {
  OutputParser p(qwen3_opts());
  OutputDelta d = p.push("<tool_call>\n{\"name\": \"get_weather\", \"arg");
  EXPECT_TRUE(d.tool_calls.empty());  // not announced before "arguments": {
  EXPECT_TRUE(p.in_markup());
  d = p.push("uments\": {\"city\": \"Par");
  // One entry per call in a delta: the announcement carries the first arguments (two entries
  // with the same index in one chunk confuse clients).
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].index, 0);
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_FALSE(d.tool_calls[0].id.empty());
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"city\": \"Par");
  EXPECT_FALSE(p.in_markup());  // inside a value
  d = p.push("is\"");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "is\"");
  EXPECT_TRUE(p.in_markup());
  d = p.push(", \"days\": 1");
  EXPECT_TRUE(d.tool_calls.empty());  // a number is complete only when something follows it
  d = p.push("0}}\n</tool_call>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, ", \"days\": 10}");
  d = p.finish();
  EXPECT_TRUE(d.empty());
  EXPECT_EQ(p.tool_calls()[0].arguments, "{\"city\": \"Paris\", \"days\": 10}");
}

TEST(OutputParser, Qwen3JsonArgumentsKeptAsWritten) {
  const std::string text =
      "<tool_call>\n{\"name\":\"f\",\"arguments\":{\n  \"a\":1,\n  \"b\" : \"x\\ny\\u00e9\"\n}}\n"
      "</tool_call>";
  Result r = parse_all_ways(qwen3_opts(), text);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\n  \"a\":1,\n  \"b\" : \"x\\ny\\u00e9\"\n}");
  EXPECT_EQ(nlohmann::json::parse(r.calls[0].arguments)["b"], "x\ny\xC3\xA9");
}

TEST(OutputParser, Qwen3JsonRawControlCharactersEscaped) {
  Result r = parse_all_ways(qwen3_opts(),
                            "<tool_call>\n{\"name\": \"write\", \"arguments\": {\"text\": \"a\nb\tc\"}}"
                            "\n</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"text\": \"a\\nb\\tc\"}");
}

TEST(OutputParser, Qwen3JsonWithoutClosingTagOrOuterBrace) {
  Result r = parse_all_ways(
      qwen3_opts(), "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"a\": 1}");
  EXPECT_EQ(r.content, "");
  r = parse_all_ways(qwen3_opts(), "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_TRUE(r.calls[0].complete);
  EXPECT_EQ(r.content, "");
}

// ---------------------------------------------------------------------------------------------
// Qwen3.5 XML tool calls

const char* kBookFlight =
    "The user wants to fly to Paris. I have all the details.\n</think>\n\n"
    "I'll book that for you.\n\n"
    "<tool_call>\n<function=book_flight>\n"
    "<parameter=destination>\nParis\n</parameter>\n"
    "<parameter=zip>\n07030\n</parameter>\n"
    "<parameter=passengers>\n2\n</parameter>\n"
    "<parameter=max_price>\n499.5\n</parameter>\n"
    "<parameter=refundable>\nTrue\n</parameter>\n"
    "<parameter=options>\n{\"seat\": \"aisle\", \"meal\": null}\n</parameter>\n"
    "<parameter=stops>\n[\"LHR\", \"AMS\"]\n</parameter>\n"
    "<parameter=note>\nNone\n</parameter>\n"
    "<parameter=seat>\n12\n</parameter>\n"
    "</function>\n</tool_call>";

TEST(OutputParser, Qwen35XmlTypedParameters) {
  Options o = qwen35_opts();
  o.tools = weather_tools();
  Result r = parse_all_ways(o, kBookFlight);
  EXPECT_EQ(r.reasoning, "The user wants to fly to Paris. I have all the details.");
  EXPECT_EQ(r.content, "I'll book that for you.");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "book_flight");
  EXPECT_TRUE(r.calls[0].complete);
  EXPECT_EQ(r.calls[0].arguments,
            "{\"destination\": \"Paris\", \"zip\": \"07030\", \"passengers\": 2, "
            "\"max_price\": 499.5, \"refundable\": true, "
            "\"options\": {\"seat\": \"aisle\", \"meal\": null}, \"stops\": [\"LHR\", \"AMS\"], "
            "\"note\": null, \"seat\": 12}");
}

TEST(OutputParser, Qwen35XmlWithoutSchemaTriesJson) {
  Options o = qwen35_opts();  // no tools: every value is JSON if it parses, else a string
  Result r = parse_all_ways(o, kBookFlight);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments,
            "{\"destination\": \"Paris\", \"zip\": \"07030\", \"passengers\": 2, "
            "\"max_price\": 499.5, \"refundable\": \"True\", "
            "\"options\": {\"seat\": \"aisle\", \"meal\": null}, \"stops\": [\"LHR\", \"AMS\"], "
            "\"note\": \"None\", \"seat\": 12}");
}

TEST(OutputParser, Qwen35XmlStreamsPerParameter) {
  Options o = qwen35_opts();
  o.starts_in_reasoning = false;
  o.tools = weather_tools();
  OutputParser p(o);
  OutputDelta d = p.push("<tool_call>\n<function=get_wea");
  EXPECT_TRUE(d.empty());
  EXPECT_TRUE(p.in_markup());
  d = p.push("ther>\n<parameter=city>\nPar");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].arguments, "");
  EXPECT_FALSE(p.in_markup());
  // "<param" may still become literal value text ("</parameter>\n<paramX"): a </parameter>
  // ends the value only once "<parameter=" (or </function>, </tool_call>) is complete.
  d = p.push("is\n</parameter>\n<param");
  EXPECT_TRUE(d.tool_calls.empty());
  EXPECT_TRUE(p.in_markup());
  d = p.push("eter=unit>\nc\n</parameter>\n");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"city\": \"Paris\"");
  d = p.push("</function>\n</tool_call>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, ", \"unit\": \"c\"}");
  EXPECT_TRUE(p.finish().empty());
}

TEST(OutputParser, Qwen35XmlMultipleCallsMultilineAndLiteralClosingTag) {
  Options o = qwen35_opts();
  o.tools = weather_tools();
  const std::string text =
      "Two lookups.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
      "New\nYork\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/t.xml\n</parameter>\n"
      "<parameter=content>\n<a>\n</parameter> is literal\n</a>\n\n</parameter>\n</function>\n"
      "</tool_call>";
  Result r = parse_all_ways(o, text);
  EXPECT_EQ(r.reasoning, "Two lookups.");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"New\\nYork\", \"days\": 3}");
  EXPECT_EQ(r.calls[1].name, "write_file");
  EXPECT_EQ(r.calls[1].arguments,
            "{\"path\": \"/tmp/t.xml\", \"content\": \"<a>\\n</parameter> is literal\\n</a>\\n\"}");
}

TEST(OutputParser, Qwen35ToolCallEndsUnclosedReasoning) {
  Options o = qwen35_opts();
  o.tools = weather_tools();
  const std::string text =
      "I need the weather.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n"
      "</parameter>\n</function>\n</tool_call>";
  Result r = parse_all_ways(o, text);
  EXPECT_EQ(r.reasoning, "I need the weather.\n");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"Oslo\"}");
}

TEST(OutputParser, Qwen35NoParameters) {
  Options o = qwen35_opts();
  o.starts_in_reasoning = false;
  Result r = parse_all_ways(o, "<tool_call>\n<function=list_files>\n</function>\n</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
  EXPECT_TRUE(r.calls[0].complete);
}

TEST(OutputParser, ContentAfterToolCallIsKept) {
  Options o = qwen35_opts();
  o.starts_in_reasoning = false;
  Result r = parse_all_ways(
      o, "A\n<tool_call>\n<function=f>\n</function>\n</tool_call>\n\nB <b>bold</b>\n");
  EXPECT_EQ(r.content, "A\n\nB <b>bold</b>\n");
  ASSERT_EQ(r.calls.size(), 1u);
}

// ---------------------------------------------------------------------------------------------
// Malformed markup: text is never lost

TEST(OutputParser, MalformedBeforeAnnouncementIsContent) {
  Options o = qwen3_opts();
  for (const std::string& text : {
           std::string("Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"argu"),  // unterminated
           std::string("<tool_call>\n{'name': 'f', 'arguments': {}}\n</tool_call>"),  // bad JSON
           std::string("<tool_call>\nnot json at all\n</tool_call> after"),
           std::string("<tool_call>\n{\"arguments\": {}, \"name\": \"f\"}\n</tool_call>"),
           std::string("<tool_call"),
       }) {
    Result r = parse_all_ways(o, text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty());
  }
  Options x = qwen35_opts();
  x.starts_in_reasoning = false;
  for (const std::string& text : {
           std::string("<tool_call>\n<function=get weather>\n</function>\n</tool_call>"),
           std::string("<tool_call>\n<parameter=a>\n1\n</parameter>\n</tool_call>"),
           std::string("Calling <tool_call>\n<function=get_wea"),
       }) {
    Result r = parse_all_ways(x, text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty());
  }
}

TEST(OutputParser, BrokenAfterAnnouncementKeepsCallAndText) {
  // Truncated inside a JSON string value: the call keeps what was streamed, closed validly.
  Result r = parse_all_ways(qwen3_opts(),
                            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": \"hel");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"a\": 1, \"b\": \"hel\"}");
  EXPECT_FALSE(r.calls[0].complete);
  EXPECT_EQ(r.content, "");
  // Bad JSON inside the arguments: the unrepresented text becomes content.
  r = parse_all_ways(qwen3_opts(),
                     "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1,}}\n</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"a\": 1}");
  EXPECT_FALSE(r.calls[0].complete);
  EXPECT_EQ(r.content, ",}}\n</tool_call>");
  // Truncated key.
  r = parse_all_ways(qwen3_opts(), "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2], \"ke");
  EXPECT_EQ(r.calls[0].arguments, "{\"a\": [1, 2]}");
  EXPECT_EQ(r.content, ", \"ke");
  // XML: <function= without </function>.
  Options x = qwen35_opts();
  x.starts_in_reasoning = false;
  r = parse_all_ways(x, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                        "<parameter=unit>\nc");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_FALSE(r.calls[0].complete);
  EXPECT_EQ(r.content, "\n<parameter=unit>\nc");
  r = parse_all_ways(x, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_FALSE(r.calls[0].complete);
  EXPECT_EQ(r.content, "");
  // Stray text inside the function body.
  r = parse_all_ways(x, "<tool_call>\n<function=f>\noops\n</function>\n</tool_call>");
  EXPECT_EQ(r.calls[0].arguments, "{}");
  EXPECT_FALSE(r.calls[0].complete);
  EXPECT_EQ(r.content, "\noops\n</function>\n</tool_call>");
}

TEST(OutputParser, BrokenCallFollowedByAnotherCall) {
  Options x = qwen35_opts();
  x.starts_in_reasoning = false;
  Result r = parse_all_ways(x,
                            "<tool_call>\n<function=a>\n</tool_call>\n<tool_call>\n<function=b>\n"
                            "<parameter=k>\nv\n</parameter>\n</function>\n</tool_call>");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "a");
  EXPECT_EQ(r.calls[0].arguments, "{}");
  EXPECT_EQ(r.calls[1].arguments, "{\"k\": \"v\"}");
  EXPECT_EQ(r.content, "");
}

// ---------------------------------------------------------------------------------------------
// Stop strings

Result run_split_by(const Options& o, std::vector<std::string> pieces) {
  return run_pieces(o, pieces);
}

TEST(OutputParser, StopStringSpanningPieces) {
  Options o;
  o.stop = {"END"};
  Result r = run_split_by(o, {"Hello world. E", "N", "D and more"});
  EXPECT_EQ(r.content, "Hello world. ");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(parse_all_ways(o, "Hello world. END and more"), r);
  // A partial stop string at the end is released by finish().
  r = parse_all_ways(o, "Almost EN");
  EXPECT_EQ(r.content, "Almost EN");
  EXPECT_FALSE(r.stopped);
}

TEST(OutputParser, StopStringPrefixOfAnother) {
  Options o;
  o.stop = {"abcd", "bc"};
  Result r = parse_all_ways(o, "xabcx");
  EXPECT_EQ(r.content, "xa");
  EXPECT_TRUE(r.stopped);
  r = parse_all_ways(o, "xabcd");
  EXPECT_EQ(r.content, "x");
  r = parse_all_ways(o, "xabc");
  EXPECT_EQ(r.content, "xa");
  EXPECT_TRUE(r.stopped);
  o.stop = {"foo", "foobar"};
  r = parse_all_ways(o, "a foobar b");
  EXPECT_EQ(r.content, "a ");
}

TEST(OutputParser, StopStringMatchedWhenCompletedEvenIfLongerCouldFollow) {
  StopMatcher m({"ab", "abcdef"});
  EXPECT_EQ(m.push("xa"), "x");
  EXPECT_EQ(m.push("b"), "");
  EXPECT_TRUE(m.stopped());  // "ab" at the earliest position: nothing earlier can match
  EXPECT_EQ(m.matched(), 0);
}

TEST(OutputParser, StopInsideReasoning) {
  Options o = qwen35_opts();
  o.stop = {"Answer:"};
  Result r = parse_all_ways(o, "Let me think.\nAnswer: 42\n</think>\n\nThe answer is 42.");
  EXPECT_EQ(r.reasoning, "Let me think.\n");
  EXPECT_EQ(r.content, "");
  EXPECT_TRUE(r.stopped);
}

TEST(OutputParser, StopInsideToolCall) {
  Options o = qwen3_opts();
  o.stop = {"Tokyo"};
  Result r = parse_all_ways(
      o, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tokyo\"}}\n</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"\"}");
  EXPECT_FALSE(r.calls[0].complete);
  EXPECT_TRUE(r.stopped);
}

TEST(OutputParser, StopStringsUnicode) {
  Options o;
  o.stop = {"。", "🛑"};
  Result r = parse_all_ways(o, "你好世界。再见");
  EXPECT_EQ(r.content, "你好世界");
  r = parse_all_ways(o, "emoji 😀🛑 after");
  EXPECT_EQ(r.content, "emoji 😀");
}

TEST(OutputParser, InvalidStopStringsRejected) {
  Options o;
  o.stop = {""};
  EXPECT_THROW(OutputParser{o}, Error);
  o.stop = {"\xC3"};
  EXPECT_THROW(OutputParser{o}, Error);
}

TEST(OutputParser, PushAfterStopIsIgnored) {
  Options o;
  o.stop = {"\n\n"};
  OutputParser p(o);
  OutputDelta d = p.push("Line 1\n\nLine 2");
  EXPECT_EQ(d.content, "Line 1");
  EXPECT_TRUE(p.stopped());
  EXPECT_TRUE(p.finished());
  EXPECT_TRUE(p.push("more").empty());
  EXPECT_TRUE(p.finish().empty());
  EXPECT_EQ(p.content(), "Line 1");
}

// ---------------------------------------------------------------------------------------------
// Unicode

TEST(OutputParser, UnicodeContentAndArguments) {
  Options o = qwen35_opts();
  o.tools = weather_tools();
  const std::string text =
      "用户想知道东京的天气。🌦️\n</think>\n\n好的，我来查一下 🗼\n\n<tool_call>\n"
      "<function=get_weather>\n<parameter=city>\n東京 🗼\n</parameter>\n</function>\n</tool_call>";
  Result r = parse_all_ways(o, text);
  EXPECT_EQ(r.reasoning, "用户想知道东京的天气。🌦️");
  EXPECT_EQ(r.content, "好的，我来查一下 🗼");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"東京 🗼\"}");

  const std::string json_text =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"城市\": \"北京 😀\", "
      "\"e\": \"caf\\u00e9 \\ud83d\\ude00\"}}\n</tool_call>";
  r = parse_all_ways(qwen3_opts(), json_text);
  ASSERT_EQ(r.calls.size(), 1u);
  auto args = nlohmann::json::parse(r.calls[0].arguments);
  EXPECT_EQ(args["城市"], "北京 😀");
  EXPECT_EQ(args["e"], "café 😀");
}

TEST(OutputParser, UnpairedSurrogateEscapeBreaksCallButStaysValid) {
  Result r = parse_all_ways(
      qwen3_opts(), "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"x\\ud83dy\"}}\n</tool_call>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_FALSE(r.calls[0].complete);
  EXPECT_EQ(r.calls[0].arguments, "{\"a\": \"x\"}");
  EXPECT_EQ(r.content, "\\ud83dy\"}}\n</tool_call>");
}

// ---------------------------------------------------------------------------------------------
// in_markup

// in_markup() after each character of `text`, as a string of '1'/'0' aligned with the text.
std::string markup_trace(const Options& o, std::string_view text) {
  OutputParser p(o);
  std::string trace;
  for (char c : text) {
    p.push(std::string_view(&c, 1));
    trace += p.in_markup() ? '1' : '0';
  }
  return trace;
}

// in_markup() right after the prefix of `text` ending with `marker` (first occurrence).
bool markup_after(const Options& o, const std::string& text, const std::string& marker) {
  size_t at = text.find(marker);
  EXPECT_NE(at, std::string::npos) << marker;
  return markup_trace(o, text)[at + marker.size() - 1] == '1';
}

TEST(OutputParser, InMarkupXml) {
  Options o = qwen35_opts();
  o.tools = weather_tools();
  std::string t = kBookFlight;
  EXPECT_FALSE(markup_after(o, t, "I have all the details."));
  EXPECT_FALSE(markup_after(o, t, "I'll book that"));
  EXPECT_TRUE(markup_after(o, t, "<tool_call>"));
  EXPECT_TRUE(markup_after(o, t, "<function=book_fl"));
  EXPECT_TRUE(markup_after(o, t, "<parameter=destina"));
  EXPECT_FALSE(markup_after(o, t, "<parameter=destination>"));
  EXPECT_FALSE(markup_after(o, t, "<parameter=destination>\nPar"));
  EXPECT_TRUE(markup_after(o, t, "<parameter=destination>\nParis\n</"));
  EXPECT_TRUE(markup_after(o, t, "<parameter=destination>\nParis\n</parameter>"));
  EXPECT_TRUE(markup_after(o, t, "<parameter=destination>\nParis\n</parameter>\n"));
  EXPECT_TRUE(markup_after(o, t, "</function>"));
  EXPECT_FALSE(markup_after(o, t, "</tool_call>"));
  // Every byte of a value's text (after its first character) is free text.
  std::string trace = markup_trace(o, t);
  size_t v = t.find("{\"seat\"");
  for (size_t i = v; i < v + 30; ++i) EXPECT_EQ(trace[i], '0') << i;
}

TEST(OutputParser, InMarkupJson) {
  Options o = qwen3_opts();
  const std::string t =
      "<think>\nweather\n</think>\n\nChecking.\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Paris\", \"days\": 3, \"opts\": {\"k\": [1]}}}\n</tool_call>";
  EXPECT_FALSE(markup_after(o, t, "<think>\nweat"));
  EXPECT_FALSE(markup_after(o, t, "Checking."));
  EXPECT_TRUE(markup_after(o, t, "<tool_call>"));
  EXPECT_TRUE(markup_after(o, t, "{\"na"));
  EXPECT_TRUE(markup_after(o, t, "\"get_wea"));  // the name is markup
  EXPECT_TRUE(markup_after(o, t, "\"arguments\": {"));
  EXPECT_TRUE(markup_after(o, t, "{\"ci"));
  EXPECT_TRUE(markup_after(o, t, "\"city\":"));
  EXPECT_FALSE(markup_after(o, t, "\"city\": "));
  EXPECT_FALSE(markup_after(o, t, "\"city\": \"Pa"));
  EXPECT_TRUE(markup_after(o, t, "\"Paris\""));
  EXPECT_TRUE(markup_after(o, t, "\"Paris\", \"da"));
  EXPECT_FALSE(markup_after(o, t, "\"days\": 3"));
  EXPECT_TRUE(markup_after(o, t, "\"days\": 3,"));
  EXPECT_FALSE(markup_after(o, t, "\"opts\": {\"k"));  // nested objects are a value
  EXPECT_TRUE(markup_after(o, t, "[1]}}"));
  EXPECT_TRUE(markup_after(o, t, "[1]}}}"));
  EXPECT_FALSE(markup_after(o, t, "</tool_call>"));
}

TEST(OutputParser, InMarkupFalseWithoutToolSyntax) {
  Options o;
  std::string trace = markup_trace(o, "<tool_call>\n<function=f>\n</function>\n</tool_call>");
  EXPECT_EQ(trace.find('1'), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// Split invariance over all samples, with stop strings added

TEST(OutputParser, SplitInvarianceOverSamples) {
  const std::vector<std::string> samples = {
      kBookFlight,
      "<think>\nA\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>",
      "Text <tool_call> <tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n"
      "</tool_call> tail </tool_call> <function=x> </parameter>",
      "<think>\n\n</think>\n\n  \n<tool_call>\n{\"name\": \"h\", \"arguments\": {\"a\": \"\\\"q\\\"\"}}"
      "   }  \n  </tool_call>  \n  ",
      "reason <tool_call>\n<function=f>\n<parameter=p>\nv</parameter>x</parameter>\n</function>",
      "你好 <tool_call>\n{\"name\": \"测试\", \"arguments\": {\"键\": \"值🙂\", \"n\": -0.5e-3}}",
      "<<<<tool_call>>>> <<think>> </think></think>\n\n\n<tool_call>\n<function=a>\n</function>x",
  };
  std::vector<Options> variants;
  for (auto syntax : {ToolSyntax::kNone, ToolSyntax::kQwen3Json, ToolSyntax::kQwen35Xml}) {
    for (int flags = 0; flags < 4; ++flags) {
      Options o;
      o.syntax = syntax;
      o.starts_in_reasoning = flags & 1;
      o.parse_reasoning = !(flags & 2);
      o.tools = weather_tools();
      variants.push_back(o);
    }
  }
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    for (const auto& s : samples) {
      SCOPED_TRACE("variant " + std::to_string(vi) + " sample " + s.substr(0, 30));
      parse_all_ways(variants[vi], s);
      Options with_stop = variants[vi];
      with_stop.stop = {"</tool_call>\n<", "arguments\": {}", "param", "🙂"};
      parse_all_ways(with_stop, s);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Building blocks

TEST(ToolCalls, TypedParamJson) {
  auto tools = weather_tools();
  const nlohmann::json* props = find_tool_properties(tools, "book_flight");
  ASSERT_NE(props, nullptr);
  EXPECT_EQ(typed_param_json(props, "destination", "42"), "\"42\"");
  EXPECT_EQ(typed_param_json(props, "destination", "null"), "\"null\"");
  EXPECT_EQ(typed_param_json(props, "passengers", " 3 "), "3");
  EXPECT_EQ(typed_param_json(props, "passengers", "5.0"), "5");
  EXPECT_EQ(typed_param_json(props, "passengers", "five"), "\"five\"");
  EXPECT_EQ(typed_param_json(props, "passengers", "None"), "null");
  EXPECT_EQ(typed_param_json(props, "max_price", "1e3"), "1e3");
  EXPECT_EQ(typed_param_json(props, "max_price", "cheap"), "\"cheap\"");
  EXPECT_EQ(typed_param_json(props, "refundable", "FALSE"), "false");
  EXPECT_EQ(typed_param_json(props, "refundable", "maybe"), "\"maybe\"");
  EXPECT_EQ(typed_param_json(props, "options", "{\"b\": 1, \"a\": [2]}"), "{\"b\": 1, \"a\": [2]}");
  EXPECT_EQ(typed_param_json(props, "options", "{'a': 1}"), "\"{'a': 1}\"");
  EXPECT_EQ(typed_param_json(props, "stops", "[]"), "[]");
  EXPECT_EQ(typed_param_json(props, "note", "none"), "null");
  EXPECT_EQ(typed_param_json(props, "note", "text"), "\"text\"");
  EXPECT_EQ(typed_param_json(props, "seat", "null"), "null");
  EXPECT_EQ(typed_param_json(props, "seat", "7"), "7");
  EXPECT_EQ(typed_param_json(props, "unknown", "[1,2]"), "[1, 2]");
  EXPECT_EQ(typed_param_json(props, "unknown", "hello \"x\"\n"), "\"hello \\\"x\\\"\\n\"");
  EXPECT_EQ(typed_param_json(nullptr, "x", "true"), "true");
  EXPECT_EQ(typed_param_json(nullptr, "x", std::string(200, '[')), "\"" + std::string(200, '[') + "\"");
  // A NUL byte is text, not the end of the value (nlohmann's lexer would stop there; found
  // by fuzz/output_parser_fuzz.cpp).
  using namespace std::string_literals;
  EXPECT_EQ(typed_param_json(props, "passengers", "5\0x"s), "\"5\\u0000x\"");
  EXPECT_EQ(typed_param_json(nullptr, "x", "[1]\0]"s), "\"[1]\\u0000]\"");
  EXPECT_EQ(find_tool_properties(tools, "nope"), nullptr);
  EXPECT_EQ(find_tool_properties(nlohmann::json(), "get_weather"), nullptr);
}

TEST(ToolCalls, DumpJsonPyMatchesPythonSeparators) {
  auto j = nlohmann::ordered_json::parse(R"({"z": [1, 2.5, "é\u0001"], "a": {"k": null, "t": true}})");
  EXPECT_EQ(dump_json_py(j), "{\"z\": [1, 2.5, \"é\\u0001\"], \"a\": {\"k\": null, \"t\": true}}");
}

TEST(ToolCalls, IdsAreDeterministicAndDistinct) {
  EXPECT_EQ(make_tool_call_id("call_", 1, 0), make_tool_call_id("call_", 1, 0));
  EXPECT_NE(make_tool_call_id("call_", 1, 0), make_tool_call_id("call_", 1, 1));
  EXPECT_NE(make_tool_call_id("call_", 1, 0), make_tool_call_id("call_", 2, 0));
  std::string id = make_tool_call_id("chatcmpl-tool-", 99, 3);
  EXPECT_EQ(id.rfind("chatcmpl-tool-", 0), 0u);
  EXPECT_EQ(id.size(), 14u + 24u);
}

TEST(ToolCalls, JsonArgsStreamerHealsEveryPrefix) {
  const std::string args =
      "{\"a\": [1, -2.5e+3, {\"b\": \"x\\\"y\\u00e9\\ud83d\\ude00z\"}], \"c\": true, \"d\": null, "
      "\"e\": {}, \"f\": [], \"g\": \"日本\"}";
  for (size_t cut = 1; cut <= args.size(); ++cut) {
    JsonArgsStreamer s(1);
    std::string out = s.take_safe();
    JsonArgsStreamer::Status st = JsonArgsStreamer::Status::kOk;
    for (size_t i = 1; i < cut; ++i) {
      st = s.feed(args[i], i);
      ASSERT_NE(st, JsonArgsStreamer::Status::kError) << args.substr(0, i + 1);
    }
    out += s.take_safe();
    if (st != JsonArgsStreamer::Status::kDone) out += s.healing();
    auto j = nlohmann::json::parse(out, nullptr, false);
    EXPECT_TRUE(j.is_object()) << "cut " << cut << ": " << out;
  }
}

TEST(OutputParser, DetectToolSyntaxFromRealTemplates) {
  auto read = [](const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  std::string dir = std::string(SPOOL_TEST_DATA_DIR) + "/tokenizers/";
  std::string qwen35 = read(dir + "qwen3_5/chat_template.jinja");
  ASSERT_FALSE(qwen35.empty());
  EXPECT_EQ(detect_tool_syntax(qwen35), ToolSyntax::kQwen35Xml);
  auto cfg = nlohmann::json::parse(read(dir + "qwen3/tokenizer_config.json"));
  EXPECT_EQ(detect_tool_syntax(cfg["chat_template"].get<std::string>()), ToolSyntax::kQwen3Json);
  EXPECT_EQ(detect_tool_syntax("{{ messages }}"), ToolSyntax::kNone);
}

}  // namespace
}  // namespace spool::server
