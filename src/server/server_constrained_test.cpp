// Constrained decoding through the server on the demo model (qwen3_5_moe, Qwen3 JSON tool-call
// template): the acceptance metric — 200 seeded requests at temperature 1 with a forced tool call
// (tool_choice "required" over two tools and a named function), run through the BatchEngine (4
// slots, continuous batching, one mask per sequence), each parsed by the normal output parser
// into one call whose arguments validate against the tool's schema; response_format json_schema
// and json_object; the Qwen3.5 XML format (the Qwen3.5 template from tests/data); request
// errors (unknown function, unsupported keyword, bad response_format) are 400s naming the field.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>

#include "common/error.h"
#include "constrain/json_schema.h"
#include "engine/loader.h"
#include "server/api_error.h"
#include "server/batch_engine.h"
#include "server/chat_format.h"
#include "server/constrained.h"
#include "server/request.h"
#include "server/serving_engine.h"
#include "support/grammar_walk.h"

namespace spool::server {
namespace {

using ojson = nlohmann::ordered_json;

constexpr int kWaitMs = 300000;  // deadline of any one wait for a message (a hang fails, not a clock)

std::unique_ptr<ServingEngine> make_engine(int parallel, const std::string& chat_template = "") {
  engine::LoadOptions o;
  o.model_dir = SPOOL_DEFAULT_MODEL_DIR;
  o.threads = 2;
  o.parallel = std::max(parallel, 1);
  o.prefill_step = 64;
  EngineOptions eo;
  eo.model_name = "demo";
  eo.prefill_step = 64;
  eo.parallel = parallel;
  eo.chat_template_file = chat_template;
  return make_serving_engine(engine::load(o), eo);
}

const char* kTools = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
   "parameters": {"type": "object", "properties": {
     "city": {"type": "string", "maxLength": 16},
     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
     "days": {"type": "integer"},
     "hourly": {"type": "boolean"},
     "spots": {"type": "array", "items": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                                         "required": ["lat", "lon"], "additionalProperties": false}, "maxItems": 2},
     "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 8}]}},
     "required": ["city", "unit", "days"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "send_mail", "parameters": {"type": "object", "properties": {
     "to": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3},
     "urgent": {"type": "boolean"}}, "required": ["to", "urgent"]}}}
])";

ojson chat_body(const std::string& tool_choice_json, uint64_t seed) {
  ojson b;
  b["messages"] = ojson::parse(R"([{"role": "user", "content": "What is the weather in Paris for the next three days?"}])");
  b["tools"] = ojson::parse(kTools);
  b["tool_choice"] = ojson::parse(tool_choice_json);
  b["temperature"] = 1.0;
  b["top_p"] = 1.0;
  b["top_k"] = 0;
  b["min_p"] = 0.0;
  b["seed"] = seed;
  b["max_tokens"] = 400;
  return b;
}

const ojson* tool_schema(const ojson& tools, const std::string& name) {
  for (const auto& t : tools)
    if (t["function"]["name"] == name) return &t["function"]["parameters"];
  return nullptr;
}

// Runs `reqs` through the BatchEngine; returns the results in order.
std::vector<GenResult> run_batch(ServingEngine& e, const std::vector<GenRequest>& reqs) {
  std::vector<std::shared_ptr<GenTicket>> tickets;
  for (const auto& r : reqs) tickets.push_back(e.batch->submit(std::make_shared<GenRequest>(r), false));
  std::vector<GenResult> out;
  for (auto& t : tickets) {
    GenMessage m;
    for (;;) {
      if (!t->next(m, kWaitMs)) {
        ADD_FAILURE() << "no message within the deadline";
        return out;
      }
      if (m.kind == GenMessage::kDone || m.kind == GenMessage::kFailed) break;
    }
    EXPECT_EQ(m.kind, GenMessage::kDone) << m.error;
    out.push_back(m.result);
  }
  return out;
}

// One forced-call result: exactly one complete call of an expected tool whose arguments parse
// and validate. Returns "" when valid, else what is wrong.
std::string check_call(const GenResult& r, const ojson& tools, const std::string& want_name) {
  if (r.finish_reason != "tool_calls") return "finish_reason " + r.finish_reason + ", content: " + r.content;
  if (r.tool_calls.size() != 1) return std::to_string(r.tool_calls.size()) + " calls";
  const ToolCall& c = r.tool_calls[0];
  if (!c.complete) return "incomplete call";
  if (!want_name.empty() && c.name != want_name) return "called " + c.name;
  const ojson* schema = tool_schema(tools, c.name);
  if (!schema) return "unknown tool " + c.name;
  const ojson args = ojson::parse(c.arguments, nullptr, false);
  if (args.is_discarded()) return "arguments do not parse: " + c.arguments;
  std::string why;
  if (!constrain::validate(*schema, args, &why)) return "arguments " + c.arguments + " invalid: " + why;
  return "";
}

// The acceptance metric: 200 sampled forced calls, 100% parse and validate.
TEST(ServerConstrained, TwoHundredForcedCallsAtTemperatureOneAllValidate) {
  auto e = make_engine(4);
  const ojson tools = ojson::parse(kTools);
  std::vector<GenRequest> reqs;
  std::vector<std::string> want;
  for (uint64_t i = 0; i < 200; ++i) {
    const bool named = i % 2 == 1;
    const std::string choice = named ? (i % 4 == 1 ? R"({"type": "function", "function": {"name": "send_mail"}})"
                                                   : R"({"type": "function", "function": {"name": "get_weather"}})")
                                     : R"("required")";
    reqs.push_back(parse_chat_request(chat_body(choice, 1000 + i), e->facts, i));
    ASSERT_TRUE(reqs.back().constraint);
    want.push_back(named ? (i % 4 == 1 ? "send_mail" : "get_weather") : "");
  }
  const std::vector<GenResult> res = run_batch(*e, reqs);
  ASSERT_EQ(res.size(), reqs.size());
  int valid = 0, weather = 0;
  int64_t tokens = 0;
  for (size_t i = 0; i < res.size(); ++i) {
    const std::string bad = check_call(res[i], tools, want[i]);
    if (bad.empty()) {
      ++valid;
      weather += res[i].tool_calls[0].name == "get_weather";
    } else {
      ADD_FAILURE() << "request " << i << ": " << bad;
    }
    tokens += res[i].completion_tokens;
  }
  std::printf("constrained forced calls (Qwen3 JSON, temperature 1): %d/%zu parse and validate (%d get_weather), %lld tokens\n", valid,
              res.size(), weather, (long long)tokens);
  EXPECT_EQ(valid, 200);
  // "required" picked either tool over the 100 unnamed requests (the grammar offers both).
  EXPECT_GT(weather, 50);
  EXPECT_LT(weather, 150);
}

TEST(ServerConstrained, ResponseFormatJsonSchemaAndJsonObject) {
  auto e = make_engine(4);
  const ojson schema = ojson::parse(R"({"type": "object", "properties": {"answer": {"type": "string", "maxLength": 10},
      "score": {"type": "number"}, "ok": {"type": "boolean"}}, "required": ["answer", "score", "ok"], "additionalProperties": false})");
  std::vector<GenRequest> reqs;
  for (uint64_t i = 0; i < 20; ++i) {
    ojson b = chat_body(R"("auto")", 50 + i);
    b.erase("tools");
    b.erase("tool_choice");
    if (i % 2 == 0) {
      b["response_format"] = ojson::parse(R"({"type": "json_schema", "json_schema": {"name": "r", "strict": true}})");
      b["response_format"]["json_schema"]["schema"] = schema;
    } else {
      b["response_format"] = ojson::parse(R"({"type": "json_object"})");
      b["max_tokens"] = 1500;
    }
    reqs.push_back(parse_chat_request(b, e->facts, i));
  }
  const auto res = run_batch(*e, reqs);
  ASSERT_EQ(res.size(), reqs.size());
  int valid = 0;
  for (size_t i = 0; i < res.size(); ++i) {
    const ojson v = ojson::parse(res[i].content, nullptr, false);
    if (i % 2 == 0) {
      std::string why;
      const bool ok = !v.is_discarded() && constrain::validate(schema, v, &why);
      EXPECT_TRUE(ok) << res[i].content << ": " << why;
      valid += ok;
    } else if (res[i].finish_reason == "stop") {  // any object may nest deep: only complete ones are judged
      EXPECT_TRUE(v.is_object()) << res[i].content;
      valid += v.is_object();
    }
    EXPECT_TRUE(res[i].finish_reason == "stop" || i % 2 == 1) << res[i].finish_reason;
  }
  std::printf("constrained response_format: %d valid of 20 (json_schema 10, json_object complete ones)\n", valid);
}

// The Qwen3.5 template (XML parameters; thinking off so the prompt does not open <think>).
TEST(ServerConstrained, Qwen35XmlForcedCallsValidate) {
  auto e = make_engine(4, std::string(SPOOL_TEST_DATA_DIR) + "/tokenizers/qwen3_5/chat_template.jinja");
  ASSERT_EQ(e->facts.chat.tool_syntax, ToolSyntax::kQwen35Xml);
  const ojson tools = ojson::parse(kTools);
  std::vector<GenRequest> reqs;
  for (uint64_t i = 0; i < 40; ++i) {
    ojson b = chat_body(i % 2 ? R"({"type": "function", "function": {"name": "get_weather"}})" : R"("required")", 7000 + i);
    b["chat_template_kwargs"] = ojson::parse(R"({"enable_thinking": false})");
    reqs.push_back(parse_chat_request(b, e->facts, i));
  }
  const auto res = run_batch(*e, reqs);
  ASSERT_EQ(res.size(), reqs.size());
  int valid = 0;
  for (size_t i = 0; i < res.size(); ++i) {
    const std::string bad = check_call(res[i], tools, i % 2 ? "get_weather" : "");
    EXPECT_EQ(bad, "") << "request " << i;
    valid += bad.empty();
  }
  std::printf("constrained forced calls (Qwen3.5 XML, temperature 1): %d/%zu parse and validate\n", valid, res.size());
}

// Every family with a CallFormat: random walks of its forced-call grammar (any byte the grammar
// allows, markup bytes preferred so walks end) are read back by that family's output parser as
// exactly one call of the tool, with arguments that validate against its schema.
TEST(ServerConstrained, EveryFamilysForcedCallParsesBackAndValidates) {
  const ojson tools = ojson::parse(kTools);
  std::vector<constrain::ToolSpec> specs;
  for (const auto& t : tools) specs.push_back({t["function"]["name"].get<std::string>(), t["function"]["parameters"]});
  int families = 0;
  for (const ChatFormat& f : chat_formats()) {
    const constrain::CallFormat* cf = call_format_for(f.id);
    if (!cf) continue;
    if (f.id == ToolSyntax::kErnie45 || f.id == ToolSyntax::kGemma4) ++families;  // the two added last
    SCOPED_TRACE(std::string(f.name));
    auto g = constrain::compile_tool_call(*cf, specs, false)->grammar;
    std::mt19937_64 rng(11);
    int finished = 0;
    for (int walk = 0; walk < 60; ++walk) {
      std::optional<std::string> w = test_support::random_walk(g, rng, "\"}],<", 1, 4000);
      if (!w) continue;
      const std::string& text = *w;
      ++finished;
      OutputParser::Options po;
      po.syntax = f.id;
      po.parse_reasoning = false;
      po.tools = nlohmann::json::parse(tools.dump());
      OutputParser p(po);
      p.push(text);
      p.finish();
      ASSERT_EQ(p.tool_calls().size(), 1u) << text;
      EXPECT_EQ(p.content(), "") << text;
      const ToolCall& c = p.tool_calls()[0];
      const ojson* schema = tool_schema(tools, c.name);
      ASSERT_NE(schema, nullptr) << c.name;
      std::string why;
      EXPECT_TRUE(constrain::validate(*schema, ojson::parse(c.arguments), &why)) << text << "\n-> " << c.arguments << ": " << why;
    }
    EXPECT_GT(finished, 40);
  }
  EXPECT_EQ(families, 2);
}

TEST(ServerConstrained, RequestErrorsAre400sNamingTheField) {
  auto e = make_engine(0);
  auto expect_400 = [&](const ojson& b, const std::string& param, const std::string& text) {
    try {
      parse_chat_request(b, e->facts, 1);
      ADD_FAILURE() << "accepted: " << b.dump();
    } catch (const ApiError& err) {
      EXPECT_EQ(err.status, 400);
      EXPECT_EQ(err.param, param) << err.what();
      EXPECT_NE(std::string(err.what()).find(text), std::string::npos) << err.what();
    }
  };
  expect_400(chat_body(R"({"type": "function", "function": {"name": "nope"}})", 1), "tool_choice.function.name", "nope");
  expect_400(chat_body(R"({"type": "function"})", 1), "tool_choice", "object");
  ojson b = chat_body(R"("required")", 1);
  b["tools"][0]["function"]["parameters"]["properties"]["days"]["minimum"] = 1;
  expect_400(b, "tool_choice", "'minimum'");
  ojson nt = chat_body(R"("required")", 1);
  nt.erase("tools");
  expect_400(nt, "tool_choice", "tools");
  ojson rf = chat_body(R"("auto")", 1);
  rf["response_format"] = ojson::parse(R"({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a"}}})");
  expect_400(rf, "response_format", "'pattern'");
  rf["response_format"] = ojson::parse(R"({"type": "xml"})");
  expect_400(rf, "response_format.type", "json_schema");
  // Unconstrained requests carry no constraint.
  EXPECT_FALSE(parse_chat_request(chat_body(R"("auto")", 1), e->facts, 1).constraint);
}

}  // namespace
}  // namespace spool::server
