// The Anthropic Messages API without a model: request mapping (every 400 path names its field),
// the message object, stop reasons, usage, error objects and the SSE event sequence of a stream.
#include <gtest/gtest.h>

#include <sstream>

#include "server/anthropic_format.h"
#include "server/anthropic_request.h"
#include "server/api_error.h"
#include "server/json_body.h"

namespace spool::server {
namespace {

json base() { return json::parse(R"({"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})"); }

// The 400 ApiError of parsing `body`: its param must be `param` and its message contain `text`.
void expect_400(const json& body, const std::string& param, const std::string& text, bool count_tokens = false) {
  try {
    parse_anthropic_request(body, count_tokens);
    ADD_FAILURE() << "accepted: " << body.dump();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << body.dump();
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_EQ(e.param, param) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(AnthropicRequest, MapsSystemMessagesToolsAndSampling) {
  json b = json::parse(R"({
    "model": "claude", "max_tokens": 100, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
    "stop_sequences": ["END", "###"], "stream": true, "metadata": {"user_id": "u"},
    "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
    "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "messages": [
      {"role": "user", "content": [{"type": "text", "text": "Weather in"}, {"type": "text", "text": "Paris?"}]},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Use the tool.", "signature": "x"},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "warm", "is_error": false},
        {"type": "text", "text": "Thanks"}]}
    ]})");
  const AnthropicRequest r = parse_anthropic_request(b, false);
  const json want = json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief.\nBe kind."},
      {"role": "user", "content": "Weather in\nParis?"},
      {"role": "assistant", "content": "Let me check.", "reasoning_content": "Use the tool.",
       "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
      {"role": "tool", "tool_call_id": "toolu_2", "content": "warm"},
      {"role": "user", "content": "Thanks"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
    "tool_choice": "auto", "max_tokens": 100, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "stream": true})");
  EXPECT_EQ(r.chat, want) << r.chat.dump(1);
  EXPECT_EQ(r.stop_sequences, (std::vector<std::string>{"END", "###"}));
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.max_tokens, 100);
  EXPECT_EQ(r.tool_choice, "auto");
}

TEST(AnthropicRequest, ToolChoiceAndThinking) {
  json b = base();
  b["tools"] = json::parse(R"([{"name": "f", "input_schema": {"type": "object"}}, {"name": "g", "input_schema": {}, "type": "custom"}])");
  b["tool_choice"] = {{"type", "none"}};
  AnthropicRequest r = parse_anthropic_request(b, false);
  EXPECT_FALSE(r.chat.contains("tools")) << "tool_choice none drops the tools from the prompt";
  EXPECT_EQ(r.chat["tool_choice"], "none");
  b["tool_choice"] = {{"type", "any"}, {"disable_parallel_tool_use", true}};
  r = parse_anthropic_request(b, false);
  EXPECT_EQ(r.tool_choice, "any");
  EXPECT_EQ(r.chat["tools"].size(), 2u);
  EXPECT_EQ(r.chat["tool_choice"], "required") << "any forces a call to one of the tools";
  b["tool_choice"] = {{"type", "tool"}, {"name", "g"}};
  r = parse_anthropic_request(b, false);
  EXPECT_EQ(r.tool_choice, "tool");
  EXPECT_EQ(r.tool_name, "g");
  EXPECT_EQ(r.chat["tool_choice"], (json{{"type", "function"}, {"function", {{"name", "g"}}}})) << "tool forces that call";
  b["tool_choice"] = {{"type", "auto"}};
  EXPECT_EQ(parse_anthropic_request(b, false).chat["tool_choice"], "auto");

  b = base();
  b["max_tokens"] = 4096;
  b["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
  EXPECT_EQ(parse_anthropic_request(b, false).chat["chat_template_kwargs"], (json{{"enable_thinking", true}}));
  EXPECT_EQ(parse_anthropic_request(b, false).chat["thinking_budget_tokens"], 1024) << "the budget is enforced";
  b["thinking"] = {{"type", "disabled"}};
  EXPECT_FALSE(parse_anthropic_request(b, false).chat.contains("thinking_budget_tokens"));
  EXPECT_EQ(parse_anthropic_request(b, false).chat["chat_template_kwargs"], (json{{"enable_thinking", false}}));
  b["thinking"] = {{"type", "adaptive"}};
  EXPECT_FALSE(parse_anthropic_request(b, false).chat.contains("chat_template_kwargs"));
}

TEST(AnthropicRequest, CountTokensNeedsNoMaxTokens) {
  json b = base();
  b.erase("max_tokens");
  b["thinking"] = {{"type", "enabled"}, {"budget_tokens", 2048}};
  const AnthropicRequest r = parse_anthropic_request(b, true);
  EXPECT_EQ(r.chat["messages"].size(), 1u);
  EXPECT_FALSE(r.chat.contains("max_tokens"));
  expect_400(b, "max_tokens", "field required");
}

TEST(AnthropicRequest, EveryMalformedFieldIs400NamingIt) {
  auto with = [](const char* key, json v) {
    json b = base();
    b[key] = std::move(v);
    return b;
  };
  auto msgs = [](const char* text) {
    json b = base();
    b["messages"] = json::parse(text);
    return b;
  };
  json b = base();
  b.erase("model");
  expect_400(b, "model", "required");
  b = base();
  b.erase("max_tokens");
  expect_400(b, "max_tokens", "required");
  expect_400(with("max_tokens", 0), "max_tokens", "");
  expect_400(with("max_tokens", "10"), "max_tokens", "");
  b = base();
  b.erase("messages");
  expect_400(b, "messages", "required");
  expect_400(with("messages", "hi"), "messages", "array");
  expect_400(with("messages", json::array()), "messages", "empty");
  expect_400(msgs(R"([1])"), "messages[0]", "object");
  expect_400(msgs(R"([{"content": "x"}])"), "messages[0].role", "string");
  expect_400(msgs(R"([{"role": "system", "content": "x"}])"), "messages[0].role", "\"system\"");
  expect_400(msgs(R"([{"role": "user"}])"), "messages[0].content", "string or an array");
  expect_400(msgs(R"([{"role": "user", "content": 3}])"), "messages[0].content", "string or an array");
  expect_400(msgs(R"([{"role": "user", "content": []}])"), "messages[0].content", "empty");
  expect_400(msgs(R"([{"role": "user", "content": ["x"]}])"), "messages[0].content[0]", "object");
  expect_400(msgs(R"([{"role": "user", "content": [{"text": "x"}]}])"), "messages[0].content[0].type", "string");
  expect_400(msgs(R"([{"role": "user", "content": [{"type": "text"}]}])"), "messages[0].content[0].text", "string");
  expect_400(msgs(R"([{"role": "user", "content": [{"type": "image", "source": {}}]}])"), "messages[0].content[0].type", "\"image\"");
  expect_400(msgs(R"([{"role": "user", "content": [{"type": "document", "source": {}}]}])"), "messages[0].content[0].type", "\"document\"");
  expect_400(msgs(R"([{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}])"),
             "messages[0].content[0].type", "assistant");
  expect_400(msgs(R"([{"role": "user", "content": [{"type": "server_tool_use"}]}])"), "messages[0].content[0].type", "server_tool_use");
  expect_400(msgs(R"([{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}])"), "messages[0].content[0].tool_use_id",
             "string");
  expect_400(msgs(R"([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": ""}]}])"),
             "messages[0].content[0].tool_use_id", "empty");
  expect_400(msgs(R"([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "is_error": "no"}]}])"),
             "messages[0].content[0].is_error", "boolean");
  expect_400(msgs(R"([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": 5}]}])"),
             "messages[0].content[0].content", "string or an array");
  expect_400(msgs(R"([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": [{"type": "image"}]}]}])"),
             "messages[0].content[0].content[0].type", "\"image\"");
  expect_400(msgs(R"([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": [{"type": "search_result"}]}]}])"),
             "messages[0].content[0].content[0].type", "search_result");
  const char* tail = R"(, {"role": "user", "content": "ok"}])";
  auto asst = [&](const std::string& blocks) { return msgs((R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": )" + blocks + "}" + tail).c_str()); };
  expect_400(asst(R"([{"type": "tool_use", "name": "f", "input": {}}])"), "messages[1].content[0].id", "string");
  expect_400(asst(R"([{"type": "tool_use", "id": "a", "input": {}}])"), "messages[1].content[0].name", "string");
  expect_400(asst(R"([{"type": "tool_use", "id": "a", "name": "", "input": {}}])"), "messages[1].content[0].name", "empty");
  expect_400(asst(R"([{"type": "tool_use", "id": "a", "name": "f", "input": "{}"}])"), "messages[1].content[0].input", "object");
  expect_400(asst(R"([{"type": "thinking"}])"), "messages[1].content[0].thinking", "string");
  expect_400(asst(R"([{"type": "redacted_thinking"}])"), "messages[1].content[0].data", "string");
  expect_400(asst(R"([{"type": "tool_result", "tool_use_id": "a"}])"), "messages[1].content[0].type", "user messages");
  expect_400(asst(R"([{"type": "image"}])"), "messages[1].content[0].type", "\"image\"");
  expect_400(asst(R"([{"type": "citation"}])"), "messages[1].content[0].type", "citation");
  expect_400(msgs(R"([{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer is"}])"), "messages[1]", "prefill");

  expect_400(with("system", 5), "system", "string or an array");
  expect_400(with("system", json::parse(R"([{"type": "image"}])")), "system[0].type", "\"image\"");
  expect_400(with("tools", json::object()), "tools", "array");
  expect_400(with("tools", json::parse(R"([1])")), "tools[0]", "object");
  expect_400(with("tools", json::parse(R"([{"input_schema": {}}])")), "tools[0].name", "string");
  expect_400(with("tools", json::parse(R"([{"name": "", "input_schema": {}}])")), "tools[0].name", "empty");
  expect_400(with("tools", json::parse(R"([{"name": "f"}])")), "tools[0].input_schema", "object");
  expect_400(with("tools", json::parse(R"([{"name": "f", "input_schema": {}, "description": 1}])")), "tools[0].description", "string");
  expect_400(with("tools", json::parse(R"([{"name": "f", "input_schema": {}}, {"name": "f", "input_schema": {}}])")), "tools[1].name", "twice");
  expect_400(with("tools", json::parse(R"([{"type": "web_search_20250305", "name": "web_search"}])")), "tools[0].type", "web_search_20250305");
  expect_400(with("tools", json::parse(R"([{"type": 3, "name": "f", "input_schema": {}}])")), "tools[0].type", "string");
  expect_400(with("tool_choice", "auto"), "tool_choice", "object");
  expect_400(with("tool_choice", json::object()), "tool_choice.type", "string");
  expect_400(with("tool_choice", {{"type", "required"}}), "tool_choice.type", "\"required\"");
  expect_400(with("tool_choice", {{"type", "any"}}), "tool_choice", "needs 'tools'");
  b = with("tools", json::parse(R"([{"name": "f", "input_schema": {}}])"));
  b["tool_choice"] = {{"type", "tool"}};
  expect_400(b, "tool_choice.name", "string");
  b["tool_choice"] = {{"type", "tool"}, {"name", "g"}};
  expect_400(b, "tool_choice.name", "not among");
  b["tool_choice"] = {{"type", "auto"}, {"disable_parallel_tool_use", "yes"}};
  expect_400(b, "tool_choice.disable_parallel_tool_use", "boolean");
  expect_400(with("thinking", true), "thinking", "object");
  expect_400(with("thinking", json::object()), "thinking.type", "string");
  expect_400(with("thinking", {{"type", "on"}}), "thinking.type", "\"on\"");
  expect_400(with("thinking", {{"type", "enabled"}}), "thinking.budget_tokens", "required");
  expect_400(with("thinking", {{"type", "enabled"}, {"budget_tokens", 100}}), "budget_tokens", "");
  expect_400(with("thinking", {{"type", "enabled"}, {"budget_tokens", 2048}}), "thinking.budget_tokens", "less than max_tokens");
  expect_400(with("metadata", "u"), "metadata", "object");
  expect_400(with("temperature", 1.5), "temperature", "");
  expect_400(with("temperature", "hot"), "temperature", "");
  expect_400(with("top_p", 0), "top_p", "(0, 1]");
  expect_400(with("top_p", 2), "top_p", "");
  expect_400(with("top_k", -1), "top_k", "");
  expect_400(with("stop_sequences", "END"), "stop_sequences", "array");
  expect_400(with("stop_sequences", json::parse(R"(["a", 1])")), "stop_sequences[1]", "string");
  expect_400(with("stop_sequences", json::parse(R"([""])")), "stop_sequences[0]", "empty");
  expect_400(with("stream", "yes"), "stream", "");
}

GenResult result(std::string finish, std::string content = "hello") {
  GenResult r;
  r.finish_reason = std::move(finish);
  r.content = std::move(content);
  r.prompt_tokens = 30;
  r.cached_tokens = 12;
  r.completion_tokens = 7;
  return r;
}

TEST(AnthropicFormat, MessageObjectBlocksStopReasonsAndUsage) {
  GenResult r = result("tool_calls", "Checking.");
  r.reasoning = "think";
  r.tool_calls.push_back(ToolCall{"toolu_a", "get_weather", R"({"city": "Paris"})", true});
  const json m = anthropic_message_json("msg_1", "demo", r);
  const json want = json::parse(R"({"id": "msg_1", "type": "message", "role": "assistant", "model": "demo", "content": [
      {"type": "thinking", "thinking": "think", "signature": ""},
      {"type": "text", "text": "Checking."},
      {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Paris"}}],
    "stop_reason": "tool_use", "stop_sequence": null,
    "usage": {"input_tokens": 18, "output_tokens": 7, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 12}})");
  EXPECT_EQ(m, want) << m.dump(1);

  EXPECT_EQ(anthropic_stop_reason(result("stop")), "end_turn");
  EXPECT_EQ(anthropic_stop_reason(result("length")), "max_tokens");
  GenResult s = result("stop");
  s.stop_sequence = "END";
  EXPECT_EQ(anthropic_stop_reason(s), "stop_sequence");
  EXPECT_EQ(anthropic_message_json("msg_2", "demo", s)["stop_sequence"], "END");
  const json empty = anthropic_message_json("msg_3", "demo", result("stop", ""));
  EXPECT_TRUE(empty["content"].is_array() && empty["content"].empty());
}

TEST(AnthropicFormat, ErrorsAndStatuses) {
  EXPECT_EQ(anthropic_error_json("not_found_error", "no"), json::parse(R"({"type": "error", "error": {"type": "not_found_error", "message": "no"}})"));
  EXPECT_EQ(anthropic_status(503), 529);
  EXPECT_EQ(anthropic_status(400), 400);
  EXPECT_EQ(anthropic_error_type(400), "invalid_request_error");
  EXPECT_EQ(anthropic_error_type(401), "authentication_error");
  EXPECT_EQ(anthropic_error_type(404), "not_found_error");
  EXPECT_EQ(anthropic_error_type(413), "request_too_large");
  EXPECT_EQ(anthropic_error_type(529), "overloaded_error");
  EXPECT_EQ(anthropic_error_type(500), "api_error");
  EXPECT_EQ(anthropic_error_type(422), "invalid_request_error");
  EXPECT_EQ(AnthropicStream::error(503, "busy"),
            "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n");
}

// SSE text -> (event name, data JSON) pairs; every event must have both lines, the name equal
// to data.type.
std::vector<json> parse_events(const std::string& sse) {
  std::vector<json> out;
  std::istringstream in(sse);
  std::string ev, data, blank;
  while (std::getline(in, ev)) {
    EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
    EXPECT_TRUE(std::getline(in, data));
    EXPECT_EQ(data.rfind("data: ", 0), 0u) << data;
    EXPECT_TRUE(std::getline(in, blank));
    EXPECT_EQ(blank, "");
    json j = json::parse(data.substr(6));
    EXPECT_EQ(ev.substr(7), j["type"]);
    out.push_back(j);
  }
  return out;
}

TEST(AnthropicFormat, StreamEventSequence) {
  AnthropicStream st("msg_9", "demo", 30);
  std::string sse = st.start();
  OutputDelta d1;
  d1.reasoning = "hmm";
  sse += st.delta(d1);
  OutputDelta d2;
  d2.reasoning = " ok";
  d2.content = "Hi";
  sse += st.delta(d2);
  OutputDelta d3;
  d3.tool_calls.push_back(ToolCallDelta{0, "toolu_x", "f", ""});
  d3.tool_calls.push_back(ToolCallDelta{0, "", "", "{\"a\": "});
  sse += st.delta(d3);
  OutputDelta d4;  // the rest of call 0, text after it, then call 1 in one delta
  d4.tool_calls.push_back(ToolCallDelta{0, "", "", "1}"});
  d4.content = " and";
  d4.tool_calls.push_back(ToolCallDelta{1, "toolu_y", "g", "{}"});
  sse += st.delta(d4);
  sse += st.delta(OutputDelta{});
  sse += st.finish(result("tool_calls"));
  const std::vector<json> ev = parse_events(sse);
  std::vector<std::string> types;
  for (const auto& e : ev) types.push_back(e["type"].get<std::string>() + (e.contains("index") ? std::to_string(e["index"].get<int>()) : ""));
  const std::vector<std::string> want = {"message_start", "ping",
                                         "content_block_start0", "content_block_delta0", "content_block_delta0", "content_block_stop0",
                                         "content_block_start1", "content_block_delta1", "content_block_stop1",
                                         "content_block_start2", "content_block_delta2", "content_block_delta2", "content_block_stop2",
                                         "content_block_start3", "content_block_delta3", "content_block_stop3",
                                         "content_block_start4", "content_block_delta4", "content_block_stop4",
                                         "message_delta", "message_stop"};
  EXPECT_EQ(types, want);
  ASSERT_EQ(ev.size(), want.size());
  EXPECT_EQ(ev[0]["message"]["id"], "msg_9");
  EXPECT_EQ(ev[0]["message"]["content"], json::array());
  EXPECT_TRUE(ev[0]["message"]["stop_reason"].is_null());
  EXPECT_EQ(ev[0]["message"]["usage"]["input_tokens"], 30);
  EXPECT_EQ(ev[2]["content_block"], json::parse(R"({"type": "thinking", "thinking": "", "signature": ""})"));
  EXPECT_EQ(ev[3]["delta"], json::parse(R"({"type": "thinking_delta", "thinking": "hmm"})"));
  EXPECT_EQ(ev[6]["content_block"], json::parse(R"({"type": "text", "text": ""})"));
  EXPECT_EQ(ev[7]["delta"], json::parse(R"({"type": "text_delta", "text": "Hi"})"));
  EXPECT_EQ(ev[9]["content_block"], json::parse(R"({"type": "tool_use", "id": "toolu_x", "name": "f", "input": {}})"));
  EXPECT_EQ(ev[10]["delta"], json::parse(R"({"type": "input_json_delta", "partial_json": "{\"a\": "})"));
  EXPECT_EQ(ev[11]["delta"]["partial_json"], "1}");
  EXPECT_EQ(ev[14]["delta"]["text"], " and");
  EXPECT_EQ(ev[16]["content_block"]["id"], "toolu_y");
  EXPECT_EQ(ev[17]["delta"]["partial_json"], "{}");
  EXPECT_EQ(ev[19]["delta"], json::parse(R"({"stop_reason": "tool_use", "stop_sequence": null})"));
  EXPECT_EQ(ev[19]["usage"]["output_tokens"], 7);
  EXPECT_EQ(ev[19]["usage"]["cache_read_input_tokens"], 12);
}

TEST(AnthropicFormat, EmptyStreamHasNoBlocks) {
  AnthropicStream st("msg_0", "demo", 3);
  GenResult r = result("length", "");
  const std::vector<json> ev = parse_events(st.start() + st.finish(r));
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[2]["delta"]["stop_reason"], "max_tokens");
  EXPECT_EQ(ev[3]["type"], "message_stop");
}

// A stream ended by a stop sequence names it in message_delta, as the message object does.
TEST(AnthropicFormat, StreamNamesTheStopSequence) {
  AnthropicStream st("msg_5", "demo", 3);
  GenResult r = result("stop", "");
  r.stop_sequence = "END";
  const std::vector<json> ev = parse_events(st.start() + st.finish(r));
  ASSERT_EQ(ev.size(), 4u);
  EXPECT_EQ(ev[2]["delta"], json::parse(R"({"stop_reason": "stop_sequence", "stop_sequence": "END"})"));
}

}  // namespace
}  // namespace spool::server
