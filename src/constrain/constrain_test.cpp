// Constrained decoding: the grammar builder and matcher, the JSON Schema compiler (every
// supported keyword accepts what it should and rejects what it should; unsupported keywords are
// errors naming them), the validator, random walks of the grammar that always parse and
// validate, the tool-call formats, and token masks against a brute-force check of every token of
// the real Qwen3 vocabulary.
#include <gtest/gtest.h>

#include <random>

#include "common/error.h"
#include "constrain/call_format.h"
#include "constrain/grammar.h"
#include "constrain/json_schema.h"
#include "constrain/token_mask.h"
#include "tokenizer/tokenizer.h"
#include "support/grammar_walk.h"

namespace spool::constrain {
namespace {

using json = nlohmann::ordered_json;

std::shared_ptr<const Grammar> schema_grammar(const json& schema) { return compile_json(&schema, false, "")->grammar; }

// True when `text` is a complete sentence of `g`.
bool matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.advance(text) && m.accepting();
}

TEST(Grammar, LiteralRepeatUntil) {
  GrammarBuilder b;
  const int32_t rep = b.repeat("ab", b.lit("ab"), 1, 3, b.lit(","));
  auto g = b.build(rep);
  EXPECT_TRUE(matches(g, "ab"));
  EXPECT_TRUE(matches(g, "ab,ab,ab"));
  EXPECT_FALSE(matches(g, ""));
  EXPECT_FALSE(matches(g, "ab,ab,ab,ab"));
  EXPECT_FALSE(matches(g, "abab"));
  Matcher m(g);
  EXPECT_TRUE(m.advance("ab,a"));
  EXPECT_FALSE(m.accepting());
  EXPECT_EQ(m.next_bytes().count(), 1u);
  EXPECT_FALSE(m.advance(std::string_view("x")));
  EXPECT_TRUE(m.advance(std::string_view("b")));  // state unchanged by the refused byte
  EXPECT_TRUE(m.accepting());

  GrammarBuilder u;
  auto gu = u.build(u.until("r", "</think>"));
  EXPECT_TRUE(matches(gu, "</think>"));
  EXPECT_TRUE(matches(gu, "a < b </thin </think>"));
  EXPECT_TRUE(matches(gu, "<</think>"));
  EXPECT_FALSE(matches(gu, "x </think> y"));  // the first closer ends it
  EXPECT_FALSE(matches(gu, "no closer"));
  GrammarBuilder bad;
  EXPECT_THROW(bad.until("r", "abca"), Error);
}

TEST(Grammar, UnboundedRepetitionKeepsTheStateSmall) {
  GrammarBuilder b;
  auto g = b.build(b.repeat("x", {b.range('a', 'z')}, 0, -1));
  Matcher m(g);
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(m.advance(static_cast<uint8_t>('a' + i % 26)));
  EXPECT_LE(m.tops().size(), 2u);
  EXPECT_TRUE(m.accepting());
}

struct Case {
  const char* schema;
  std::vector<std::string> good, bad;
};

TEST(JsonSchema, EveryKeywordAcceptsAndRejects) {
  const std::vector<Case> cases = {
      {R"({"type": "string"})",
       {R"("")", R"("a b")", R"("\"\\\/\b\f\n\r\t")", R"("\u00e9\uD7FF")", "\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\""},
       {"\"a", R"('a')", "\"\n\"", R"("\x")", R"("\uD800")", "\"\xc3\"", "\"\xed\xa0\x80\"", " \"a\""}},
      {R"({"type": "string", "minLength": 2, "maxLength": 3})", {R"("ab")", R"("a\nc")", "\"\xc3\xa9\xc3\xa9\""}, {R"("a")", R"("abcd")"}},
      {R"({"type": "integer"})", {"0", "-7", "1234567890123456"}, {"01", "1.5", "-", "12345678901234567", "1e3", "+1"}},
      {R"({"type": "number"})", {"0", "-0.5", "3.25e-7", "1E+30", "10"}, {".5", "1.", "1e", "1e300", "NaN"}},
      {R"({"type": "boolean"})", {"true", "false"}, {"True", "1"}},
      {R"({"type": "null"})", {"null"}, {"None", ""}},
      {R"({"enum": ["red", 1, null, {"a": 1}]})", {R"("red")", "1", "null", R"({"a": 1})"}, {R"("blue")", R"({"a":1})"}},
      {R"({"const": "x"})", {R"("x")"}, {R"("y")"}},
      {R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2})", {"[1]", "[1, 2]"},
       {"[]", "[1, 2, 3]", "[1,2]", R"(["a"])"}},
      {R"({"type": "array"})", {"[]", R"([1, "a", {"b": [null]}])"}, {"[1,]"}},
      {R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}},
          "required": ["b"], "additionalProperties": false})",
       {R"({"b": "x"})", R"({"a": 1, "b": "x"})", R"({"a": 1, "b": "x", "c": true})", R"({"b": "x", "c": false})"},
       {"{}", R"({"a": 1})", R"({"b": "x", "a": 1})", R"({"b": "x", "d": 1})", R"({"b":"x"})", R"({"a": 1, , "b": "x"})"}},
      {R"({"type": "object", "properties": {"o": {"type": "object", "properties": {"x": {"type": "null"}}, "required": ["x"]}}})",
       {"{}", R"({"o": {"x": null}})"}, {R"({"o": {}})"}},
      {R"({"type": "object"})", {"{}", R"({"any": [1, {"k": "v"}]})"}, {"[]"}},
      {R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})", {"5", R"("a")"}, {R"("ab")", "true"}},
      {R"({"oneOf": [{"type": "boolean"}, {"type": "null"}]})", {"true", "null"}, {"0"}},
      {R"({"type": ["string", "null"]})", {R"("s")", "null"}, {"1"}},
      {R"({"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
          "type": "array", "items": {"$ref": "#/$defs/pt"}})",
       {R"([{"x": 1}, {"x": 2}])"}, {R"([{"y": 1}])"}},
      {R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 3},
          "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}}, "required": ["name"]})",
       {R"({"name": "a", "kids": [{"name": "b", "kids": []}]})"}, {R"({"kids": []})"}},
      {R"({"description": "anything"})", {"1", R"({"a": [true]})", R"("x")"}, {"", "tru"}},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const json schema = json::parse(cases[i].schema);
    SCOPED_TRACE("case " + std::to_string(i) + ": " + schema.dump());
    auto g = schema_grammar(schema);
    for (const auto& s : cases[i].good) {
      EXPECT_TRUE(matches(g, s)) << "should accept: " << s;
      // What the grammar accepts, the validator accepts.
      std::string why;
      EXPECT_TRUE(validate(schema, json::parse(s), &why)) << s << ": " << why;
    }
    for (const auto& s : cases[i].bad) EXPECT_FALSE(matches(g, s)) << "should reject: " << s;
  }
}

TEST(JsonSchema, UnsupportedKeywordsAreErrorsNamingThem) {
  const std::vector<std::pair<const char*, std::string>> cases = {
      {R"({"type": "string", "pattern": "^a$"})", "'pattern'"},
      {R"({"type": "string", "format": "date-time"})", "'format'"},
      {R"({"type": "integer", "minimum": 0})", "'minimum'"},
      {R"({"allOf": [{}]})", "'allOf'"},
      {R"({"type": "object", "properties": {"a": {"not": {}}}})", "'not' (at schema.properties.a)"},
      {R"({"type": "object", "additionalProperties": {"type": "string"}})", "'additionalProperties'"},
      {R"({"$ref": "http://example.com/s.json"})", "'$ref'"},
      {R"({"type": "date"})", "'type'"},
      {R"({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]})", "'b'"},
  };
  for (const auto& [text, what] : cases) {
    const json schema = json::parse(text);
    try {
      compile_json(&schema, false, "");
      ADD_FAILURE() << "no error for " << text;
    } catch (const SchemaError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
}

TEST(JsonSchema, ValidatorRejects) {
  const json s = json::parse(R"({"type": "object", "properties": {"n": {"type": "integer"},
      "t": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}}, "required": ["n"], "additionalProperties": false})");
  std::string why;
  EXPECT_TRUE(validate(s, json::parse(R"({"n": 2, "t": ["a"]})")));
  EXPECT_FALSE(validate(s, json::parse(R"({"n": 2.5})"), &why));
  EXPECT_NE(why.find("$.n"), std::string::npos) << why;
  EXPECT_FALSE(validate(s, json::parse(R"({"t": []})")));
  EXPECT_FALSE(validate(s, json::parse(R"({"n": 1, "t": ["c"]})")));
  EXPECT_FALSE(validate(s, json::parse(R"({"n": 1, "t": ["a", "a", "a"]})")));
  EXPECT_FALSE(validate(s, json::parse(R"({"n": 1, "x": 0})")));
  EXPECT_FALSE(validate(json::parse(R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})"), json(3)));  // both match
}

TEST(JsonSchema, RandomWalksParseAndValidate) {
  const json schema = json::parse(R"({"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]},
      "days": {"type": "integer"}, "ratio": {"type": "number"},
      "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
      "opt": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"deep": {"type": "boolean"}}, "required": ["deep"]}]}},
      "required": ["city", "unit", "days"]})");
  auto g = schema_grammar(schema);
  std::mt19937_64 rng(7);
  int finished = 0;
  for (int walk = 0; walk < 300; ++walk) {
    std::optional<std::string> w = test_support::random_walk(g, rng, "\"}],", 4, 2000);
    if (!w) continue;
    const std::string& text = *w;
    ++finished;
    json v = json::parse(text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << text;
    std::string why;
    EXPECT_TRUE(validate(schema, v, &why)) << text << ": " << why;
  }
  EXPECT_GT(finished, 200);
}

TEST(CallFormat, Qwen3JsonAndQwen35Xml) {
  const json params = json::parse(R"({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
      "unit": {"enum": ["c", "f"]}}, "required": ["city"]})");
  std::vector<ToolSpec> tools = {{"get_weather", params}, {"noop", json()}};
  auto j = compile_tool_call(qwen3_json_format(), tools, false)->grammar;
  EXPECT_TRUE(matches(j, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>"));
  EXPECT_TRUE(matches(j, "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(matches(j, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(matches(j, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 3}}\n</tool_call>"));
  EXPECT_FALSE(matches(j, "Sure! <tool_call>"));
  auto jr = compile_tool_call(qwen3_json_format(), tools, true)->grammar;
  EXPECT_TRUE(matches(jr, "let me think</think>\n\n<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(matches(jr, "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>"));

  auto x = compile_tool_call(qwen35_xml_format(), {tools[0]}, false)->grammar;
  EXPECT_TRUE(matches(x, "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose\n</parameter>\n<parameter=unit>\nc\n</parameter>\n"
                         "</function>\n</tool_call>"));
  EXPECT_TRUE(matches(x, "<tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n<parameter=days>\n-2\n</parameter>\n"
                         "</function>\n</tool_call>"));
  EXPECT_FALSE(matches(x, "<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(matches(x, "<tool_call>\n<function=get_weather>\n<parameter=city>\n\"X\"\n</parameter>\n<parameter=unit>\n\"c\"\n</parameter>\n"
                          "</function>\n</tool_call>"));
  const json nullable = json::parse(R"({"type": "object", "properties": {"v": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]}}})");
  auto xn = compile_tool_call(qwen35_xml_format(), {{"t", nullable}}, false)->grammar;
  EXPECT_TRUE(matches(xn, "<tool_call>\n<function=t>\n<parameter=v>\nab\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_TRUE(matches(xn, "<tool_call>\n<function=t>\n<parameter=v>\nnull\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(matches(xn, "<tool_call>\n<function=t>\n<parameter=v>\nabcd\n</parameter>\n</function>\n</tool_call>"));
  const json mixed = json::parse(R"({"type": "object", "properties": {"v": {"type": ["string", "integer"]}}})");
  EXPECT_THROW(compile_tool_call(qwen35_xml_format(), {{"t", mixed}}, false), SchemaError);
  EXPECT_THROW(compile_tool_call(qwen3_json_format(), {}, false), Error);
}

// Every other family's format accepts the call its real chat template renders (the `emitted`
// text of tests/data/chat/<name>/assistant_cases.json, which the family's parser reads back to
// the call), and rejects a wrong name, a missing required argument and a wrong argument type;
// its reasoning closer is the template's, and every special token it admits is spelled as in
// that call or the closer (a misspelled one would match no vocabulary token).
TEST(CallFormat, EachFamilyAcceptsItsTemplatesCall) {
  const json params = json::parse(R"({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
      "required": ["city"]})");
  const std::vector<ToolSpec> tools = {{"get_weather", params}};
  struct Case {
    CallFormat fmt;
    std::string good, wrong_name, missing, wrong_type;
    std::string close;  // the reasoning closer the family's template writes ("" when it has none)
  };
  const Case cases[] = {
      {deepseek_v3_format(),  // deepseek_v3_1
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\", \"days\": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"days\": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": 3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "</think>"},
      {kimi_k2_format(),
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}"
       "<|tool_call_end|><|tool_calls_section_end|>",
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}"
       "<|tool_call_end|><|tool_calls_section_end|>",
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{}"
       "<|tool_call_end|><|tool_calls_section_end|>",
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\", \"days\": \"3\"}"
       "<|tool_call_end|><|tool_calls_section_end|>",
       "</think>"},
      {glm4_5_format(),  // glm4_6
       "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
       "<tool_call>get_time\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
       "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
       "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>three</arg_value>\n</tool_call>", "</think>"},
      {minimax_m2_format(),
       "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Oslo</parameter>\n</invoke>\n</minimax:tool_call>",
       "<minimax:tool_call>\n<invoke name=\"search\">\n<parameter name=\"city\">Oslo</parameter>\n</invoke>\n</minimax:tool_call>",
       "<minimax:tool_call>\n<invoke name=\"get_weather\">\n</invoke>\n</minimax:tool_call>",
       "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Oslo</parameter>\n<parameter name=\"days\">x</parameter>\n"
       "</invoke>\n</minimax:tool_call>", "</think>"},
      {gpt_oss_format(),
       " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\", \"days\": 3}<|call|>",
       " to=functions.get_time<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>",
       " to=functions.get_weather<|channel|>commentary json<|message|>{\"days\": 3}<|call|>",
       " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": [\"Paris\"]}<|call|>", ""},
      {mistral_format(),
       "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": 3}",
       "[TOOL_CALLS]get_time[ARGS]{\"city\": \"Paris\"}",
       "[TOOL_CALLS]get_weather[ARGS]{}",
       "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": 3.5}", "[/THINK]"},
      {ernie4_5_format(),
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 3}}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": true}}\n</tool_call>", "</think>"},
      {gemma4_format(),  // gemma4 chat_cases: how the template renders a call
       "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3}<tool_call|>",
       "<|tool_call>call:get_time{city:<|\"|>Paris<|\"|>}<tool_call|>",
       "<|tool_call>call:get_weather{days:3}<tool_call|>",
       "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:<|\"|>3<|\"|>}<tool_call|>", "<channel|>"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fmt.name);
    auto g = compile_tool_call(c.fmt, tools, false)->grammar;
    EXPECT_TRUE(matches(g, c.good));
    EXPECT_FALSE(matches(g, c.wrong_name));
    EXPECT_FALSE(matches(g, c.missing));
    EXPECT_FALSE(matches(g, c.wrong_type));
    EXPECT_EQ(c.fmt.reasoning_close, c.close);
    for (const std::string& s : c.fmt.special_markup)
      EXPECT_TRUE(c.good.find(s) != std::string::npos || s == c.close) << "special markup " << s << " is in neither the call nor the closer";
    if (!c.close.empty()) {  // inside reasoning: free text up to the closer first
      auto r = compile_tool_call(c.fmt, tools, true)->grammar;
      EXPECT_TRUE(matches(r, "the user wants the weather" + c.close + "\n" + c.good));
      EXPECT_FALSE(matches(r, c.good));
    }
  }
}

const tokenizer::Tokenizer& qwen3() {
  static const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(std::string(SPOOL_TEST_DATA_DIR) + "/tokenizers/qwen3");
  return tok;
}

// The trie-walk mask equals a brute-force check of every token (advance over its bytes) at
// every state along a tool call and a JSON response, with EOS only where the text is complete
// and special tokens only where the format's markup needs them.
TEST(TokenMask, EqualsBruteForceOverTheQwen3Vocabulary) {
  const tokenizer::Tokenizer& tok = qwen3();
  auto ix = TokenIndex::from_tokenizer(tok, tok.vocab_size());
  const int32_t im_end = tok.token_to_id("<|im_end|>");
  const int32_t tool_call = tok.token_to_id("<tool_call>");
  ASSERT_GE(im_end, 0);
  const json params = json::parse(R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
      "n": {"type": "integer"}}, "required": ["city"]})");
  struct Run {
    std::shared_ptr<const Constraint> c;
    std::string text;
  };
  const std::vector<Run> runs = {
      {compile_tool_call(qwen3_json_format(), {{"f", params}}, true),
       "ok</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"city\": \"Z\xc3\xbcrich\", \"n\": 12}}\n</tool_call>"},
      {compile_json(&params, false, ""), "{\"city\": \"a\\\"b\"}"},
  };
  for (const Run& run : runs) {
    ConstraintState st(run.c, ix, {im_end});
    Matcher brute(run.c->grammar);
    std::vector<uint64_t> mask;
    for (size_t pos = 0; pos <= run.text.size(); ++pos) {
      SCOPED_TRACE("after \"" + run.text.substr(0, pos) + "\"");
      // Every third state and the last ones (the check costs the whole vocabulary).
      if (pos % 3 != 0 && pos + 3 < run.text.size()) {
        ASSERT_TRUE(st.matcher().advance(static_cast<uint8_t>(run.text[pos])));
        ASSERT_TRUE(brute.advance(static_cast<uint8_t>(run.text[pos])));
        continue;
      }
      const int64_t n = st.fill_mask(mask);
      int64_t expect_n = 0;
      const std::vector<int32_t> saved = brute.tops();
      for (int32_t id = 0; id < ix->vocab_size(); ++id) {
        const std::string& b = ix->bytes(id);
        bool ok;
        if (id == im_end) {
          ok = brute.accepting();
        } else if (tok.is_special(id) || b.empty()) {
          ok = false;
        } else {
          ok = brute.advance(b);
          brute.restore(saved);
        }
        expect_n += ok;
        const bool got = (mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1;
        if (got != ok) {
          ADD_FAILURE() << "token " << id << " \"" << b << "\": mask " << got << ", brute force " << ok;
          return;
        }
      }
      EXPECT_EQ(n, expect_n);
      if (pos == run.text.size()) break;
      ASSERT_TRUE(st.matcher().advance(static_cast<uint8_t>(run.text[pos])));
      ASSERT_TRUE(brute.advance(static_cast<uint8_t>(run.text[pos])));
    }
    EXPECT_TRUE(st.accepting());
  }
  // The <tool_call> token is allowed at the start of the call (it is not special in Qwen3).
  ConstraintState st(runs[0].c, ix, {im_end});
  ASSERT_TRUE(st.matcher().advance(std::string_view("x</think>\n")));
  std::vector<uint64_t> mask;
  st.fill_mask(mask);
  EXPECT_TRUE((mask[static_cast<size_t>(tool_call) >> 6] >> (tool_call & 63)) & 1);
  EXPECT_TRUE(st.accept(tool_call));
  EXPECT_FALSE(st.accept(im_end));
}

}  // namespace
}  // namespace spool::constrain
