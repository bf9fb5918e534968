// Data-driven tests of the family output formats (chat_format.h, formats/):
//  * tests/data/chat/<family>/assistant_cases.json: what the real chat template renders for an
//    assistant turn (transformers 5.17) parses back to that turn (content, reasoning_content,
//    tool-call names and arguments as JSON), fed whole and in random UTF-8-safe chunks (several
//    seeds): the streamed deltas add up to the complete parse and no delta carries markup;
//  * tests/data/chat/llama_cpp_cases.json: model outputs → expected messages ported from
//    llama.cpp's tests/test-chat.cpp as data (see tests/data/MANIFEST.md);
//  * detection from the real templates, explicit selection by name, prompt_opens_reasoning,
//    --tool-syntax-greedy's in_markup per format.
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/family.h"
#include "server/chat_format.h"
#include "server/output_parser.h"
#include "server/stop_strings.h"

namespace spool::server {
namespace {

using json = nlohmann::json;

json load(const std::string& rel) {
  std::ifstream f(std::string(SPOOL_TEST_DATA_DIR) + "/" + rel);
  if (!f) ADD_FAILURE() << "cannot open " << rel;
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

std::string read_text(const std::string& rel) {
  std::ifstream f(std::string(SPOOL_TEST_DATA_DIR) + "/" + rel);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct Parsed {
  std::string content, reasoning;
  std::vector<ToolCall> calls;
  std::vector<int> arg_deltas;  // per call: pushes whose delta carried some of its arguments
};

// Parses `text` in pieces; checks that no delta carries the format's markup (when
// `check_markup`) and that the deltas add up to the aggregates.
Parsed run(const OutputParser::Options& opt, const std::vector<std::string>& pieces, bool finish,
           bool check_markup) {
  OutputParser p(opt);
  OutputDelta all;
  std::vector<int> arg_deltas;
  const auto& markup = chat_format(opt.syntax).markup;
  auto absorb = [&](OutputDelta d) {
    std::set<int> with_args;
    for (const auto& t : d.tool_calls)
      if (!t.arguments.empty()) with_args.insert(t.index);
    for (int i : with_args) {
      if (arg_deltas.size() <= static_cast<size_t>(i)) arg_deltas.resize(i + 1);
      ++arg_deltas[i];
    }
    if (check_markup) {
      for (const auto& m : markup) {
        EXPECT_EQ(d.content.find(m), std::string::npos) << "markup " << m << " in content delta: " << d.content;
        EXPECT_EQ(d.reasoning.find(m), std::string::npos) << "markup " << m << " in reasoning delta: " << d.reasoning;
      }
    }
    all.append(std::move(d));
  };
  for (const auto& s : pieces) absorb(p.push(s));
  if (finish) absorb(p.finish());
  EXPECT_EQ(all.content, p.content());
  EXPECT_EQ(all.reasoning, p.reasoning());
  // The call deltas rebuild the calls.
  std::vector<ToolCall> rebuilt;
  for (const auto& d : all.tool_calls) {
    if (!d.id.empty()) rebuilt.push_back(ToolCall{d.id, d.name, "", true});
    if (!rebuilt.empty()) rebuilt.back().arguments += d.arguments;
  }
  EXPECT_EQ(rebuilt.size(), p.tool_calls().size());
  for (size_t i = 0; i < rebuilt.size() && i < p.tool_calls().size(); ++i) {
    EXPECT_EQ(rebuilt[i].name, p.tool_calls()[i].name);
    EXPECT_EQ(rebuilt[i].arguments, p.tool_calls()[i].arguments);
  }
  arg_deltas.resize(p.tool_calls().size());
  return Parsed{p.content(), p.reasoning(), p.tool_calls(), arg_deltas};
}

// Random pieces of 1..8 bytes that never split a UTF-8 character.
std::vector<std::string> chunks(const std::string& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t n = 1 + rng() % 8, e = std::min(s.size(), i + n);
    while (e < s.size() && (static_cast<unsigned char>(s[e]) & 0xC0) == 0x80) ++e;
    out.push_back(s.substr(i, e - i));
    i = e;
  }
  return out;
}

void expect_same(const Parsed& a, const Parsed& b, const std::string& what) {
  EXPECT_EQ(a.content, b.content) << what;
  EXPECT_EQ(a.reasoning, b.reasoning) << what;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << what;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << what;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << what;
    EXPECT_EQ(a.calls[i].id, b.calls[i].id) << what;
  }
}

// `got` equals the expected message `m` (OpenAI shape; arguments as objects or JSON text).
void expect_message(const Parsed& got, const json& m, const std::string& what) {
  std::string content = m.contains("content") && m["content"].is_string() ? m["content"].get<std::string>() : "";
  std::string reasoning = m.contains("reasoning_content") && m["reasoning_content"].is_string()
                              ? m["reasoning_content"].get<std::string>()
                              : "";
  EXPECT_EQ(got.content, content) << what;
  EXPECT_EQ(got.reasoning, reasoning) << what;
  json calls = m.contains("tool_calls") && m["tool_calls"].is_array() ? m["tool_calls"] : json::array();
  ASSERT_EQ(got.calls.size(), calls.size()) << what;
  for (size_t i = 0; i < calls.size(); ++i) {
    const json& fn = calls[i].contains("function") ? calls[i]["function"] : calls[i];
    EXPECT_EQ(got.calls[i].name, fn["name"].get<std::string>()) << what;
    if (fn.contains("arguments_so_far")) {  // an unfinished output: the arguments streamed so far
      EXPECT_EQ(got.calls[i].arguments, fn["arguments_so_far"].get<std::string>()) << what;
      continue;
    }
    json want = fn["arguments"].is_string() ? json::parse(fn["arguments"].get<std::string>()) : fn["arguments"];
    json have = json::parse(got.calls[i].arguments, nullptr, false);
    EXPECT_EQ(have, want) << what << " call " << i << ": " << got.calls[i].arguments;
    if (calls[i].value("check_id", false)) {
      EXPECT_EQ(got.calls[i].id, calls[i]["id"].get<std::string>()) << what;
    }
  }
}

const std::pair<const char*, ToolSyntax> kFamilies[] = {
    {"glm4_6", ToolSyntax::kGlm45},          {"glm4_7_flash", ToolSyntax::kGlm45},
    {"gpt_oss", ToolSyntax::kGptOss},        {"deepseek_v3_1", ToolSyntax::kDeepSeekV3},
    {"kimi_k2_instruct", ToolSyntax::kKimiK2}, {"kimi_k2_thinking", ToolSyntax::kKimiK2},
    {"minimax_m2", ToolSyntax::kMiniMaxM2},  {"qwen3_coder", ToolSyntax::kQwen35Xml},
};

TEST(ChatFormat, DetectedFromTheRealTemplates) {
  for (const auto& [name, id] : kFamilies) {
    std::string t = read_text(std::string("chat/") + name + "/chat_template.jinja");
    ASSERT_FALSE(t.empty()) << name;
    EXPECT_EQ(detect_chat_format(t), id) << name;
    EXPECT_EQ(detect_tool_syntax(t), id) << name;
  }
  // A single stray marker does not decide.
  EXPECT_EQ(detect_chat_format("{{ '<arg_key>' }}"), ToolSyntax::kNone);
  EXPECT_EQ(detect_chat_format("{{ '<|channel|>' }}"), ToolSyntax::kNone);
  EXPECT_EQ(detect_chat_format("<tool_call></tool_call>"), ToolSyntax::kQwen3Json);
}

// The family owns its formats (Family::chat_formats): every name it lists is a registered format,
// every registered format but "none" is some family's, and each real template resolves to its
// own format for its family without a note; a template without tool syntax falls back to the
// family's first format, and one the family does not write is used with a note.
TEST(ChatFormat, FamiliesOwnTheirFormats) {
  std::set<ToolSyntax> used;
  for (const models::Family* f : models::families())
    for (const std::string& n : f->chat_formats) {
      const ChatFormat* cf = find_chat_format(n);
      ASSERT_NE(cf, nullptr) << f->name << " lists " << n;
      EXPECT_EQ(cf->name, n) << f->name << ": list the registry name, not an alias";
      used.insert(cf->id);
    }
  for (const auto& cf : chat_formats())
    if (cf.id != ToolSyntax::kNone) EXPECT_TRUE(used.count(cf.id)) << cf.name << " is no family's format";

  const std::pair<const char*, const char*> kTemplateFamily[] = {
      {"glm4_6", "glm4_moe"},          {"glm4_7_flash", "glm4_moe_lite"}, {"gpt_oss", "gpt_oss"},
      {"deepseek_v3_1", "deepseek_v3"}, {"kimi_k2_instruct", "deepseek_v3"}, {"kimi_k2_thinking", "deepseek_v3"},
      {"minimax_m2", "minimax_m2"},    {"qwen3_coder", "qwen3_moe"},      {"gemma4", "gemma4_text_moe"},
      {"mistral_small_3_2", "mixtral"}};
  for (const auto& [tname, fname] : kTemplateFamily) {
    const models::Family* f = models::family_named(fname);
    ASSERT_NE(f, nullptr) << fname;
    const std::string t = read_text(std::string("chat/") + tname + "/chat_template.jinja");
    ASSERT_FALSE(t.empty()) << tname;
    std::string note;
    EXPECT_EQ(resolve_chat_format(t, f, &note), detect_chat_format(t)) << tname;
    EXPECT_NE(detect_chat_format(t), ToolSyntax::kNone) << tname;
    EXPECT_EQ(note, "") << tname << " (" << fname << ")";
  }
  const std::string plain = "{% for m in messages %}{{ m.content }}{% endfor %}";
  std::string note;
  EXPECT_EQ(resolve_chat_format(plain, models::family_named("glm4_moe"), &note), ToolSyntax::kGlm45);
  EXPECT_NE(note.find("glm4_5"), std::string::npos) << note;
  note.clear();
  EXPECT_EQ(resolve_chat_format(plain, models::family_named("qwen3_moe"), &note), ToolSyntax::kQwen3Json);
  note.clear();
  EXPECT_EQ(resolve_chat_format(plain, models::family_named("olmoe"), &note), ToolSyntax::kNone) << "no formats: plain content";
  EXPECT_EQ(note, "");
  EXPECT_EQ(resolve_chat_format(plain, nullptr, &note), ToolSyntax::kNone);
  const std::string qwen_json = "<tool_call>{{ x }}</tool_call>";
  EXPECT_EQ(resolve_chat_format(qwen_json, models::family_named("glm4_moe"), &note), ToolSyntax::kQwen3Json);
  EXPECT_NE(note.find("do not use"), std::string::npos) << note;
}

TEST(ChatFormat, SelectableByName) {
  for (const auto& f : chat_formats()) {
    const ChatFormat* g = find_chat_format(f.name);
    ASSERT_NE(g, nullptr) << f.name;
    EXPECT_EQ(g->id, f.id);
  }
  EXPECT_EQ(find_chat_format("qwen3_coder")->id, ToolSyntax::kQwen35Xml);
  EXPECT_EQ(find_chat_format("kimi_k2_thinking")->id, ToolSyntax::kKimiK2);
  EXPECT_EQ(find_chat_format("harmony")->id, ToolSyntax::kGptOss);
  EXPECT_EQ(find_chat_format("nope"), nullptr);
}

TEST(ChatFormat, ReasoningStartFollowsThePrompt) {
  EXPECT_TRUE(prompt_opens_reasoning(ToolSyntax::kGlm45, "<|assistant|><think>"));
  EXPECT_FALSE(prompt_opens_reasoning(ToolSyntax::kGlm45, "<|assistant|>"));
  EXPECT_FALSE(prompt_opens_reasoning(ToolSyntax::kDeepSeekV3, "<｜Assistant｜><think></think>"));
  EXPECT_TRUE(prompt_opens_reasoning(ToolSyntax::kDeepSeekV3, "<｜Assistant｜><think>"));
  EXPECT_TRUE(prompt_opens_reasoning(ToolSyntax::kMiniMaxM2, "]~b]ai\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning(ToolSyntax::kGemma4, "<|turn>model\n<|channel>thought\n<channel|>"));
  EXPECT_TRUE(prompt_opens_reasoning(ToolSyntax::kGemma4, "<|turn>model\n<|channel>thought\n"));
  EXPECT_FALSE(prompt_opens_reasoning(ToolSyntax::kGptOss, "<|start|>assistant"));
}

OutputParser::Options options_for(ToolSyntax id, const json& tools, bool starts_in_reasoning) {
  OutputParser::Options o;
  o.syntax = id;
  o.tools = tools;
  o.starts_in_reasoning = starts_in_reasoning;
  o.id_seed = 7;
  return o;
}

TEST(ChatFormat, AssistantCasesParseBack) {
  int n = 0;
  std::map<std::string, int> multi;  // multi-parameter calls checked per family
  for (const auto& [name, id] : kFamilies) {
    json cases = load(std::string("chat/") + name + "/assistant_cases.json");
    for (size_t k = 0; k < cases.size(); ++k) {
      const json& c = cases[k];
      std::string what = std::string(name) + " case " + std::to_string(k);
      const std::string gp = c["generation_prompt"].get<std::string>();
      auto opt = options_for(id, c["tools"], prompt_opens_reasoning(id, gp));
      const std::string text = c["emitted"].get<std::string>();
      Parsed whole = run(opt, {text}, true, true);
      expect_message(whole, c["message"], what + " (whole)");
      for (uint32_t seed = 1; seed <= 6; ++seed) {
        Parsed s = run(opt, chunks(text, seed), true, true);
        expect_same(s, whole, what + " seed " + std::to_string(seed));
        // Arguments are streamed: a call of several parameters comes in several deltas (and
        // run() checked that they add up to the final arguments).
        for (size_t i = 0; i < s.calls.size(); ++i) {
          const json args = json::parse(s.calls[i].arguments, nullptr, false);
          if (!args.is_object() || args.size() < 2) continue;
          EXPECT_GE(s.arg_deltas[i], 2) << what << " seed " << seed << " call " << i << ": " << s.calls[i].arguments;
          if (seed == 1) ++multi[name];
        }
      }
      ++n;
    }
  }
  EXPECT_EQ(n, 16);
  std::printf("assistant cases passed: %d\n", n);
  for (const auto& [name, k] : multi) std::printf("streamed multi-parameter calls: %s %d\n", name.c_str(), k);
}

ToolSyntax syntax_named(const std::string& name) {
  const ChatFormat* f = find_chat_format(name);
  EXPECT_NE(f, nullptr) << name;
  return f ? f->id : ToolSyntax::kNone;
}

TEST(ChatFormat, LlamaCppCases) {
  json cases = load("chat/llama_cpp_cases.json");
  std::map<std::string, int> per, total;
  for (const auto& c : cases["cases"]) {
    const std::string what = c["format"].get<std::string>() + ": " + c["name"].get<std::string>();
    ToolSyntax id = syntax_named(c["format"].get<std::string>());
    auto opt = options_for(id, c.value("tools", json()), c.value("starts_in_reasoning", false));
    opt.parse_reasoning = c.value("parse_reasoning", true);
    opt.tool_calls = c.value("tool_calls", true);
    const bool partial = c.value("is_partial", false);
    const std::string text = c["input"].get<std::string>();
    const bool markup_free = c.value("markup_free", true);
    const int parts_before = ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count();
    Parsed whole = run(opt, {text}, !partial, markup_free);
    expect_message(whole, c["expect"], what);
    for (uint32_t seed = 1; seed <= 4; ++seed) {
      Parsed s = run(opt, chunks(text, seed), !partial, markup_free);
      if (!partial) expect_same(s, whole, what + " seed " + std::to_string(seed));
    }
    ++total[c["format"].get<std::string>()];
    if (::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count() == parts_before)
      ++per[c["format"].get<std::string>()];
  }
  for (const auto& [f, k] : total) std::printf("llama.cpp cases passed: %s %d/%d\n", f.c_str(), per[f], k);
  EXPECT_EQ(cases["cases"].size(), 66u);
}

// Formats without goldens here (Gemma 4, ERNIE-4.5, Magistral reasoning, DeepSeek truncation):
// outputs written after the syntax their chat templates render (llama.cpp models/templates/
// gemma4.jinja; vLLM's ernie45 parsers' documented format) → expected messages.
TEST(ChatFormat, OwnCases) {
  const json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"},"opts":{"type":"object"}}}}}])");
  struct Case {
    ToolSyntax id;
    bool starts_in_reasoning;
    std::string input;
    json expect;
  };
  const Case cases[] = {
      {ToolSyntax::kGemma4, false,
       "<|channel>thought\nThe user wants the weather.<channel|><|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3,"
       "opts:{units:<|\"|>metric<|\"|>,tags:[<|\"|>a<|\"|>,true,null]}}<tool_call|><|tool_call>call:get_weather{city:<|\"|>Oslo, "
       "Norway<|\"|>}<tool_call|><turn|>",
       json::parse(R"({"content": "", "reasoning_content": "The user wants the weather.", "tool_calls": [
          {"function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "opts": {"units": "metric", "tags": ["a", true, null]}}}},
          {"function": {"name": "get_weather", "arguments": {"city": "Oslo, Norway"}}}]})")},
      {ToolSyntax::kGemma4, false, "It will be sunny.<turn|>", json::parse(R"({"content": "It will be sunny."})")},
      {ToolSyntax::kGemma4, true, "Thinking here.<channel|>Answer.", json::parse(R"({"content": "Answer.", "reasoning_content": "Thinking here."})")},
      {ToolSyntax::kErnie45, true, "The user wants the weather.\n</think>\n\n<response>\nIt will be sunny.\n</response>\n",
       json::parse(R"({"content": "It will be sunny.", "reasoning_content": "The user wants the weather."})")},
      {ToolSyntax::kErnie45, true,
       "Need a tool.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n",
       json::parse(R"({"content": "", "reasoning_content": "Need a tool.", "tool_calls": [
          {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]})")},
      {ToolSyntax::kMistral, false, "[THINK]Let me see.[/THINK]It is sunny.</s>",
       json::parse(R"({"content": "It is sunny.", "reasoning_content": "Let me see."})")},
      // A truncated second call: the complete first call stays; the second was announced (its
      // arguments had begun), so it stays too, closed with what was streamed ({}), and the rest
      // is content verbatim.
      {ToolSyntax::kDeepSeekV3, false,
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜>"
       "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Os",
       json::parse(R"({"content": "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Os", "tool_calls": [
          {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
          {"function": {"name": "get_weather", "arguments": {}}}]})")},
      // Cut off after a complete member: the streamed call keeps it.
      {ToolSyntax::kGlm45, false,
       "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_val",
       json::parse(R"({"content": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_val",
          "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]})")},
      // Malformed markup that never became a call is content, verbatim.
      {ToolSyntax::kGlm45, false, "<tool_call>bad name here", json::parse(R"({"content": "<tool_call>bad name here"})")},
      {ToolSyntax::kMiniMaxM2, false, "a<minimax:tool_call>\n<oops/>", json::parse(R"({"content": "a<minimax:tool_call>\n<oops/>"})")},
  };
  for (size_t k = 0; k < std::size(cases); ++k) {
    const Case& c = cases[k];
    const std::string what = std::string(chat_format(c.id).name) + " own case " + std::to_string(k);
    auto opt = options_for(c.id, tools, c.starts_in_reasoning);
    Parsed whole = run(opt, {c.input}, true, false);
    expect_message(whole, c.expect, what);
    for (uint32_t seed = 1; seed <= 4; ++seed) expect_same(run(opt, chunks(c.input, seed), true, false), whole, what);
  }
}

// --tool-syntax-greedy: in_markup() is true on tags / names / keys and false inside values.
// Formats whose goldens have no call of several parameters (Kimi, Mistral [ARGS], ERNIE, Gemma 4): such a
// call, streamed in random chunks, comes in several argument deltas that add up to the final
// arguments (run() checks the sum); JSON arguments are passed through as written.
TEST(ChatFormat, MultiParameterCallsStreamInEveryFormat) {
  const json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",
      "properties":{"city":{"type":"string"},"days":{"type":"integer"},"unit":{"type":"string"}}}}}])");
  const std::string args = "{\"city\": \"Paris\", \"days\": 3, \"unit\": \"celsius\"}";
  struct Case {
    ToolSyntax id;
    std::string text, args;  // args: the final arguments
  };
  const Case cases[] = {
      {ToolSyntax::kKimiK2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" + args +
                                "<|tool_call_end|><|tool_calls_section_end|>", args},
      {ToolSyntax::kMistral, "[TOOL_CALLS]get_weather[ARGS]" + args + "</s>", args},
      {ToolSyntax::kErnie45, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args + "}\n</tool_call>\n", args},
      // Gemma's own value syntax, as JSON (compact).
      {ToolSyntax::kGemma4, "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3,unit:<|\"|>celsius<|\"|>}<tool_call|><turn|>",
       "{\"city\":\"Paris\",\"days\":3,\"unit\":\"celsius\"}"},
  };
  for (const auto& [id, text, want] : cases) {
    const std::string what(chat_format(id).name);
    auto opt = options_for(id, tools, false);
    Parsed whole = run(opt, {text}, true, true);
    ASSERT_EQ(whole.calls.size(), 1u) << what;
    EXPECT_EQ(whole.calls[0].arguments, want) << what;
    EXPECT_EQ(whole.content, "") << what;
    for (uint32_t seed = 1; seed <= 6; ++seed) {
      Parsed s = run(opt, chunks(text, seed), true, true);
      expect_same(s, whole, what + " seed " + std::to_string(seed));
      ASSERT_EQ(s.calls.size(), 1u) << what;
      EXPECT_GE(s.arg_deltas[0], 2) << what << " seed " << seed;
    }
  }
}

TEST(ChatFormat, InMarkupPerFormat) {
  struct Probe {
    ToolSyntax id;
    std::string text;
    bool markup;
  };
  const json tools = json::parse(R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
      "properties":{"a":{"type":"string"}}}}}])");
  const Probe probes[] = {
      {ToolSyntax::kGlm45, "<tool_call>f\n<arg_key>a", true},
      {ToolSyntax::kGlm45, "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>xy", false},
      {ToolSyntax::kGlm45, "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>xy</arg", true},
      {ToolSyntax::kGlm45, "hello", false},
      {ToolSyntax::kMiniMaxM2, "<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"a\">x", false},
      {ToolSyntax::kMiniMaxM2, "<minimax:tool_call>\n<invoke name=\"f", true},
      {ToolSyntax::kDeepSeekV3, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": \"x", false},
      {ToolSyntax::kDeepSeekV3, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a", true},
      {ToolSyntax::kKimiK2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": \"x", false},
      {ToolSyntax::kKimiK2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.f", true},
      {ToolSyntax::kGptOss, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": \"x", false},
      {ToolSyntax::kGptOss, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a", true},
      {ToolSyntax::kGptOss, "<|channel|>final<|message|>hi", false},
      {ToolSyntax::kGptOss, "<|channel|>fin", true},
      {ToolSyntax::kMistral, "[TOOL_CALLS]f[ARGS]{\"a\": \"x", false},
      {ToolSyntax::kMistral, "[TOOL_CALLS]f[AR", true},
      {ToolSyntax::kGemma4, "<|tool_call>call:f{a:<|\"|>x", false},
      {ToolSyntax::kGemma4, "<|tool_call>call:f{a:", true},
      {ToolSyntax::kErnie45, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"x", false},
      {ToolSyntax::kErnie45, "<tool_call>\n{\"name\": \"f", true},
  };
  for (const auto& pr : probes) {
    OutputParser p(options_for(pr.id, tools, false));
    p.push(pr.text);
    EXPECT_EQ(p.in_markup(), pr.markup) << chat_format(pr.id).name << ": " << pr.text;
    p.finish();
    EXPECT_FALSE(p.in_markup());
  }
}

// tool_choice "none": the family's calls stay content, its reasoning is still parsed.
TEST(ChatFormat, ToolCallsOffKeepsMarkupAsContent) {
  OutputParser::Options o = options_for(ToolSyntax::kGlm45, json(), false);
  o.tool_calls = false;
  OutputParser p(o);
  p.push("<think>r</think>\n<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>");
  p.finish();
  EXPECT_EQ(p.reasoning(), "r");
  EXPECT_EQ(p.content(), "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>");
  EXPECT_TRUE(p.tool_calls().empty());
}

}  // namespace
}  // namespace spool::server
