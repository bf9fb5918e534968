// The Responses API (/v1/responses): request parsing and its 400s, the conversion to chat
// messages and tools, reasoning-effort kwargs, output items and usage, the SSE event sequence
// of ResponsesStream (fed synthetic parser deltas: reasoning, text, tool calls), the LRU store,
// and the routes over loopback with the demo model (plain, streamed, previous_response_id,
// GET/DELETE, store: false, errors).
#include <httplib.h>
#include <gtest/gtest.h>

#include <thread>

#include "support/demo_server.h"
#include "server/api_error.h"
#include "server/http_server.h"
#include "server/json_body.h"
#include "server/responses_format.h"
#include "server/responses_request.h"
#include "server/responses_store.h"

namespace spool::server {
namespace {

using ojson = nlohmann::ordered_json;

ojson J(const std::string& s) { return ojson::parse(s); }

// The 400 of parse_responses_request for `body`, with its param.
std::string bad_param(const char* body) {
  try {
    parse_responses_request(J(body));
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.type, "invalid_request_error") << body;
    return e.param.empty() ? "<none>" : e.param;
  }
  ADD_FAILURE() << "accepted: " << body;
  return "";
}

TEST(ResponsesRequest, EveryMalformedFieldIs400NamingIt) {
  EXPECT_EQ(bad_param(R"({})"), "input");
  EXPECT_EQ(bad_param(R"({"input": 5})"), "input");
  EXPECT_EQ(bad_param(R"({"input": [5]})"), "input[0]");
  EXPECT_EQ(bad_param(R"({"input": [{"role": "tool", "content": "x"}]})"), "input[0].role");
  EXPECT_EQ(bad_param(R"({"input": [{"role": 1, "content": "x"}]})"), "input[0].role");
  EXPECT_EQ(bad_param(R"({"input": [{"role": "user"}]})"), "input[0].content");
  EXPECT_EQ(bad_param(R"({"input": [{"role": "user", "content": 3}]})"), "input[0].content");
  EXPECT_EQ(bad_param(R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})"), "input[0].content[0].type");
  EXPECT_EQ(bad_param(R"({"input": [{"role": "user", "content": [{"type": "bogus"}]}]})"), "input[0].content[0].type");
  EXPECT_EQ(bad_param(R"({"input": [{"role": "user", "content": [{"type": "input_text"}]}]})"), "input[0].content[0].text");
  EXPECT_EQ(bad_param(R"({"input": [{"role": "user", "content": ["x"]}]})"), "input[0].content[0]");
  EXPECT_EQ(bad_param(R"({"input": [{"type": 7}]})"), "input[0].type");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "web_search_call"}]})"), "input[0].type");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "item_reference", "id": "x"}]})"), "input[0].type");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})"), "input[0].call_id");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "function_call", "call_id": "c", "arguments": "{}"}]})"), "input[0].name");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]})"), "input[0].arguments");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1"}]})"), "input[0].arguments");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "function_call_output", "output": "x"}]})"), "input[0].call_id");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "function_call_output", "call_id": "c"}]})"), "input[0].output");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "function_call_output", "call_id": "c", "output": 5}]})"), "input[0].output");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "reasoning", "content": 5}]})"), "input[0].content");
  EXPECT_EQ(bad_param(R"({"input": [{"type": "reasoning", "summary": [{"type": "summary_text"}]}]})"), "input[0].summary[0].text");
  EXPECT_EQ(bad_param(R"({"input": "x", "instructions": 5})"), "instructions");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": {}})"), "tools");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": [5]})"), "tools[0]");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": [{"type": "web_search"}]})"), "tools[0].type");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": [{"name": "f"}]})"), "tools[0].type");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": [{"type": "function", "function": {"name": "f"}}]})"), "tools[0].name");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": [{"type": "function", "name": ""}]})"), "tools[0].name");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": 1}]})"), "tools[0].parameters");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": [{"type": "function", "name": "f", "description": 1}]})"), "tools[0].description");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": [{"type": "function", "name": "f", "strict": "yes"}]})"), "tools[0].strict");
  EXPECT_EQ(bad_param(R"({"input": "x", "tool_choice": "required"})"), "tool_choice");
  EXPECT_EQ(bad_param(R"({"input": "x", "tool_choice": {"type": "function", "name": "f"}})"), "tool_choice.name");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}})"),
            "tool_choice.name");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function"}})"),
            "tool_choice.name");
  EXPECT_EQ(bad_param(R"({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "allowed_tools"}})"),
            "tool_choice");
  EXPECT_EQ(bad_param(R"({"input": "x", "tool_choice": {"type": "file_search"}})"), "tool_choice");
  EXPECT_EQ(bad_param(R"({"input": "x", "tool_choice": "always"})"), "tool_choice");
  EXPECT_EQ(bad_param(R"({"input": "x", "previous_response_id": 5})"), "previous_response_id");
  EXPECT_EQ(bad_param(R"({"input": "x", "previous_response_id": ""})"), "previous_response_id");
  EXPECT_EQ(bad_param(R"({"input": "x", "store": "no"})"), "store");
  EXPECT_EQ(bad_param(R"({"input": "x", "stream": 1})"), "stream");
  EXPECT_EQ(bad_param(R"({"input": "x", "parallel_tool_calls": "no"})"), "parallel_tool_calls");
  EXPECT_EQ(bad_param(R"({"input": "x", "metadata": []})"), "metadata");
  EXPECT_EQ(bad_param(R"({"input": "x", "metadata": {"k": 1}})"), "metadata");
  EXPECT_EQ(bad_param(R"({"input": "x", "max_output_tokens": 0})"), "max_output_tokens");
  EXPECT_EQ(bad_param(R"({"input": "x", "max_output_tokens": "5"})"), "max_output_tokens");
  EXPECT_EQ(bad_param(R"({"input": "x", "temperature": 3})"), "temperature");
  EXPECT_EQ(bad_param(R"({"input": "x", "top_p": 0})"), "top_p");
  EXPECT_EQ(bad_param(R"({"input": "x", "reasoning": "high"})"), "reasoning");
  EXPECT_EQ(bad_param(R"({"input": "x", "reasoning": {"effort": "max"}})"), "reasoning.effort");
  EXPECT_EQ(bad_param(R"({"input": "x", "reasoning": {"summary": 1}})"), "reasoning.summary");
  EXPECT_EQ(bad_param(R"({"input": "x", "text": {"format": {"type": "xml"}}})"), "text.format.type");
  EXPECT_EQ(bad_param(R"({"input": "x", "text": {"format": 5}})"), "text.format.type");
  EXPECT_EQ(bad_param(R"({"input": "x", "text": 1})"), "text");
  EXPECT_EQ(bad_param(R"({"input": "x", "background": true})"), "background");
  EXPECT_EQ(bad_param(R"({"input": "x", "conversation": "conv_1"})"), "conversation");
  EXPECT_EQ(bad_param(R"({"input": "x", "prompt": {"id": "p"}})"), "prompt");
  EXPECT_EQ(bad_param(R"({"input": "x", "max_tool_calls": 2})"), "max_tool_calls");
  EXPECT_EQ(bad_param(R"({"input": "x", "top_logprobs": 2})"), "top_logprobs");
  EXPECT_EQ(bad_param(R"({"input": "x", "include": "x"})"), "include");
  // 17 metadata keys.
  ojson m = ojson::object();
  for (int i = 0; i < 17; ++i) m["k" + std::to_string(i)] = "v";
  EXPECT_THROW(parse_responses_request(ojson{{"input", "x"}, {"metadata", m}}), ApiError);
}

TEST(ResponsesRequest, AcceptsTheDocumentedShapes) {
  const ResponsesRequest r = parse_responses_request(J(R"({
    "model": "m", "instructions": "Be brief.", "input": [
      {"role": "developer", "content": "dev"},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "I'll call", "annotations": []}]},
      {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{\"x\": 1}", "status": "completed"},
      {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "one"},
      {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "two"}]}],
    "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": true},
              {"type": "function", "name": "g"}],
    "tool_choice": "auto", "max_output_tokens": 20, "temperature": 0.5, "top_p": 0.9, "store": false, "stream": true,
    "metadata": {"k": "v"}, "parallel_tool_calls": false, "reasoning": {"effort": "low", "summary": "auto"},
    "include": ["reasoning.encrypted_content"], "text": {"format": {"type": "text"}, "verbosity": "low"},
    "prompt_cache_key": "abc", "truncation": "disabled", "user": "u"})"));
  EXPECT_EQ(r.input.size(), 8u);
  EXPECT_EQ(*r.instructions, "Be brief.");
  EXPECT_FALSE(r.store);
  EXPECT_TRUE(r.stream);
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_EQ(*r.max_output_tokens, 20);
  EXPECT_EQ(*r.reasoning_effort, "low");
  EXPECT_EQ(r.input[7]["output"], "two");

  const ojson body = responses_chat_body(r, ojson::array(), "{% if enable_thinking %}{% endif %}");
  const ojson& msgs = body["messages"];
  ASSERT_EQ(msgs.size(), 6u) << msgs.dump();
  EXPECT_EQ(msgs[0], J(R"({"role": "system", "content": "Be brief."})"));
  EXPECT_EQ(msgs[1], J(R"({"role": "developer", "content": "dev"})"));
  EXPECT_EQ(msgs[2], J(R"({"role": "user", "content": "a\nb"})"));
  // Reasoning joins the assistant turn after it; both calls join that turn.
  EXPECT_EQ(msgs[3]["role"], "assistant");
  EXPECT_EQ(msgs[3]["content"], "I'll call");
  EXPECT_EQ(msgs[3]["reasoning_content"], "think");
  ASSERT_EQ(msgs[3]["tool_calls"].size(), 2u);
  EXPECT_EQ(msgs[3]["tool_calls"][0], J(R"({"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}})"));
  EXPECT_EQ(msgs[4], J(R"({"role": "tool", "tool_call_id": "call_1", "content": "one"})"));
  EXPECT_EQ(msgs[5], J(R"({"role": "tool", "tool_call_id": "call_2", "content": "two"})"));
  ASSERT_EQ(body["tools"].size(), 2u);
  EXPECT_EQ(body["tools"][0], J(R"({"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}})"));
  EXPECT_EQ(body["tools"][1]["function"]["parameters"], J(R"({"type": "object", "properties": {}})"));
  EXPECT_EQ(body["max_completion_tokens"], 20);
  EXPECT_EQ(body["temperature"], 0.5);
  EXPECT_EQ(body["top_p"], 0.9);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["chat_template_kwargs"], J(R"({"enable_thinking": true})"));
}

// Forced calls and text.format reach the chat path as its tool_choice / response_format, which
// the constrained decoder enforces (server/constrained.h).
TEST(ResponsesRequest, ForcedToolChoiceAndTextFormatBecomeChatFields) {
  const char* tools = R"("tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}])";
  ojson body = responses_chat_body(parse_responses_request(J(std::string(R"({"input": "x", "tool_choice": "required", )") + tools + "}")),
                                   ojson::array(), "");
  EXPECT_EQ(body["tool_choice"], "required");
  ASSERT_TRUE(body.contains("tools"));
  body = responses_chat_body(
      parse_responses_request(J(std::string(R"({"input": "x", "tool_choice": {"type": "function", "name": "f"}, )") + tools + "}")),
      ojson::array(), "");
  EXPECT_EQ(body["tool_choice"], J(R"({"type": "function", "function": {"name": "f"}})"));
  body = responses_chat_body(parse_responses_request(J(R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "n",
                                                           "schema": {"type": "object"}, "strict": true}}})")),
                             ojson::array(), "");
  EXPECT_EQ(body["response_format"], J(R"({"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}, "strict": true}})"));
  body = responses_chat_body(parse_responses_request(J(R"({"input": "x", "text": {"format": {"type": "json_object"}}})")), ojson::array(), "");
  EXPECT_EQ(body["response_format"], J(R"({"type": "json_object"})"));
  body = responses_chat_body(parse_responses_request(J(R"({"input": "x", "text": {"format": {"type": "text"}}})")), ojson::array(), "");
  EXPECT_FALSE(body.contains("response_format"));
  EXPECT_FALSE(body.contains("tool_choice"));
}

TEST(ResponsesRequest, HistoryToolChoiceNoneAndEmptyInput) {
  ResponsesRequest r = parse_responses_request(J(R"({"input": "next", "tools": [{"type": "function", "name": "f"}], "tool_choice": "none"})"));
  const ojson history = J(R"([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "first"}]},
                                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "reply"}]}])");
  ojson body = responses_chat_body(r, history, "");
  ASSERT_EQ(body["messages"].size(), 3u);
  EXPECT_EQ(body["messages"][0]["content"], "first");
  EXPECT_EQ(body["messages"][2], J(R"({"role": "user", "content": "next"})"));
  EXPECT_FALSE(body.contains("tools"));  // tool_choice "none" leaves the tools out
  EXPECT_FALSE(body.contains("chat_template_kwargs"));
  // A function_call with no assistant message before it gets one (content "", the pending reasoning).
  r = parse_responses_request(J(R"({"input": [{"role": "user", "content": "q"}, {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
                                              {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]})"));
  body = responses_chat_body(r, ojson::array(), "");
  ASSERT_EQ(body["messages"].size(), 2u);
  EXPECT_EQ(body["messages"][1], J(R"({"role": "assistant", "content": "", "reasoning_content": "s",
                                       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})"));
  r = parse_responses_request(J(R"({"input": []})"));
  try {
    responses_chat_body(r, ojson::array(), "");
    ADD_FAILURE() << "no messages accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "input");
  }
}

TEST(ResponsesRequest, ReasoningEffortKwargsPerTemplate) {
  EXPECT_EQ(reasoning_kwargs("Reasoning: {{ reasoning_effort }}", "medium"), J(R"({"reasoning_effort": "medium"})"));
  EXPECT_EQ(reasoning_kwargs("Reasoning: {{ reasoning_effort }}", "minimal"), J(R"({"reasoning_effort": "low"})"));
  EXPECT_EQ(reasoning_kwargs("Reasoning: {{ reasoning_effort }}", "xhigh"), J(R"({"reasoning_effort": "high"})"));
  EXPECT_EQ(reasoning_kwargs("{% if enable_thinking is false %}", "none"), J(R"({"enable_thinking": false})"));
  EXPECT_EQ(reasoning_kwargs("{% if enable_thinking is false %}", "high"), J(R"({"enable_thinking": true})"));
  EXPECT_EQ(reasoning_kwargs("{% if thinking is defined and thinking %}", "minimal"), J(R"({"thinking": false})"));
  EXPECT_EQ(reasoning_kwargs("plain template", "high"), ojson::object());
}

TEST(ResponsesRequest, ReasoningEffortMapsToAThinkingBudgetUnlessTheTemplateTakesIt) {
  const std::string qwen = "{% if enable_thinking is false %}";
  EXPECT_EQ(reasoning_effort_budget(qwen, "none"), 0);
  EXPECT_EQ(reasoning_effort_budget(qwen, "minimal"), 0);
  EXPECT_EQ(reasoning_effort_budget(qwen, "low"), kLowEffortBudget);
  EXPECT_EQ(reasoning_effort_budget(qwen, "medium"), kMediumEffortBudget);
  EXPECT_EQ(reasoning_effort_budget(qwen, "high"), -1);
  EXPECT_EQ(reasoning_effort_budget(qwen, "xhigh"), -1);
  EXPECT_EQ(reasoning_effort_budget("Reasoning: {{ reasoning_effort }}", "low"), -1) << "gpt-oss: the effort goes into the prompt";
  ResponsesRequest r = parse_responses_request(J(R"({"input": "hi", "reasoning": {"effort": "low"}})"));
  EXPECT_EQ(responses_chat_body(r, ojson::array(), qwen)["thinking_budget_tokens"], kLowEffortBudget);
  r = parse_responses_request(J(R"({"input": "hi", "reasoning": {"effort": "high"}})"));
  EXPECT_FALSE(responses_chat_body(r, ojson::array(), qwen).contains("thinking_budget_tokens"));
}

GenResult result(const std::string& content, const std::string& reasoning, std::vector<ToolCall> calls, const std::string& finish) {
  GenResult r;
  r.content = content;
  r.reasoning = reasoning;
  r.tool_calls = std::move(calls);
  r.finish_reason = finish;
  r.prompt_tokens = 10;
  r.cached_tokens = 4;
  r.completion_tokens = 7;
  return r;
}

ItemIdSource counter_ids() {
  auto n = std::make_shared<int>(0);
  return [n](const std::string& p) { return p + std::to_string((*n)++); };
}

ResponsesEcho echo() {
  ResponsesEcho e;
  e.id = "resp_1";
  e.created_at = 123;
  e.model = "demo";
  return e;
}

TEST(ResponsesFormat, ItemsUsageAndStatus) {
  const GenResult r = result("hi", "hmm", {ToolCall{"call_a", "f", "{\"x\": 1}", true}}, "tool_calls");
  const ojson out = output_items(r, counter_ids());
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0], J(R"({"id": "rs_0", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]})"));
  EXPECT_EQ(out[1], J(R"({"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
                          "content": [{"type": "output_text", "text": "hi", "annotations": []}]})"));
  EXPECT_EQ(out[2], J(R"({"id": "fc_2", "type": "function_call", "status": "completed", "arguments": "{\"x\": 1}", "call_id": "call_a", "name": "f"})"));
  const ojson resp = finished_response(echo(), r, out, 3);
  EXPECT_EQ(resp["object"], "response");
  EXPECT_EQ(resp["status"], "completed");
  EXPECT_TRUE(resp["incomplete_details"].is_null());
  EXPECT_EQ(resp["usage"], J(R"({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 7,
                                 "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 17})"));
  // Only tool calls: no empty message; cut by the limit: incomplete.
  const GenResult cut = result("", "", {ToolCall{"call_b", "g", "{}", false}}, "length");
  const ojson out2 = output_items(cut, counter_ids());
  ASSERT_EQ(out2.size(), 1u);
  EXPECT_EQ(out2[0]["status"], "incomplete");
  const ojson resp2 = finished_response(echo(), cut, out2, 99);
  EXPECT_EQ(resp2["status"], "incomplete");
  EXPECT_EQ(resp2["incomplete_details"], J(R"({"reason": "max_output_tokens"})"));
  EXPECT_EQ(resp2["usage"]["output_tokens_details"]["reasoning_tokens"], 7);  // capped at output_tokens
  // Nothing generated: one empty message.
  EXPECT_EQ(output_items(result("", "", {}, "stop"), counter_ids())[0]["content"][0]["text"], "");
  EXPECT_EQ(sse_event(J(R"({"type": "response.created", "sequence_number": 0})")),
            "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0}\n\n");
}

std::vector<std::string> types(const std::vector<ojson>& evs) {
  std::vector<std::string> t;
  for (const auto& e : evs) t.push_back(e["type"]);
  return t;
}

TEST(ResponsesFormat, StreamEventSequence) {
  ResponsesStream s(echo(), counter_ids());
  std::vector<ojson> all;
  auto add = [&](std::vector<ojson> v) {
    for (auto& e : v) all.push_back(std::move(e));
  };
  add(s.start());
  OutputDelta d;
  d.reasoning = "th";
  add(s.on_delta(d));
  d = {};
  d.reasoning = "ink";
  add(s.on_delta(d));
  d = {};
  d.content = "Hello";
  add(s.on_delta(d));
  d = {};
  d.content = " there";
  d.tool_calls.push_back(ToolCallDelta{0, "call_x", "f", ""});
  d.tool_calls.push_back(ToolCallDelta{0, "", "", "{\"a\": "});
  add(s.on_delta(d));
  d = {};
  d.tool_calls.push_back(ToolCallDelta{0, "", "", "1}"});
  add(s.on_delta(d));
  add(s.finish(result("Hello there", "think", {ToolCall{"call_x", "f", "{\"a\": 1}", true}}, "tool_calls"), 2));
  const std::vector<std::string> want = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta", "response.reasoning_text.delta",
      "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done", "response.completed"};
  EXPECT_EQ(types(all), want);
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i]["sequence_number"], i);
  EXPECT_EQ(all[0]["response"]["status"], "in_progress");
  EXPECT_EQ(all[2]["output_index"], 0);
  EXPECT_EQ(all[2]["item"]["type"], "reasoning");
  EXPECT_EQ(all[6]["text"], "think");
  EXPECT_EQ(all[11]["item_id"], "msg_1");
  EXPECT_EQ(all[11]["output_index"], 1);
  EXPECT_EQ(all[11]["delta"], "Hello");
  EXPECT_EQ(all[13]["text"], "Hello there");
  EXPECT_EQ(all[15]["item"]["status"], "completed");
  EXPECT_EQ(all[16]["item"], J(R"({"id": "fc_2", "type": "function_call", "status": "in_progress", "arguments": "", "call_id": "call_x", "name": "f"})"));
  EXPECT_EQ(all[19]["arguments"], "{\"a\": 1}");
  EXPECT_EQ(all[19]["name"], "f");
  EXPECT_EQ(all[20]["item"]["arguments"], "{\"a\": 1}");
  const ojson& resp = all.back()["response"];
  EXPECT_EQ(resp["status"], "completed");
  ASSERT_EQ(resp["output"].size(), 3u);
  EXPECT_EQ(resp["output"], s.output());
  EXPECT_EQ(resp["output"][1]["content"][0]["text"], "Hello there");
  EXPECT_EQ(resp["output"][2]["status"], "completed");
  EXPECT_EQ(resp["usage"]["output_tokens_details"]["reasoning_tokens"], 2);
}

TEST(ResponsesFormat, StreamIncompleteAndEmpty) {
  ResponsesStream s(echo(), counter_ids());
  s.start();
  OutputDelta d;
  d.content = "abc";
  s.on_delta(d);
  const auto end = s.finish(result("abc", "", {}, "length"), 0);
  EXPECT_EQ(types(end), (std::vector<std::string>{"response.output_text.done", "response.content_part.done", "response.output_item.done",
                                                  "response.incomplete"}));
  EXPECT_EQ(end[2]["item"]["status"], "incomplete");
  EXPECT_EQ(end.back()["response"]["incomplete_details"]["reason"], "max_output_tokens");
  ResponsesStream e(echo(), counter_ids());
  e.start();
  const auto only = e.finish(result("", "", {}, "stop"), 0);
  EXPECT_EQ(types(only).front(), "response.output_item.added");
  EXPECT_EQ(only.back()["response"]["output"].size(), 1u);
  const auto err = e.error("boom", "");
  EXPECT_EQ(err[0]["type"], "error");
  EXPECT_EQ(err[0]["sequence_number"], only.back()["sequence_number"].get<int>() + 1);
}

StoredResponse entry(const std::string& text) { return StoredResponse{ojson{{"t", text}}, ojson::array({text})}; }

TEST(ResponsesStore, LruBoundByCountAndBytes) {
  ResponsesStore s(2);
  EXPECT_TRUE(s.put("a", entry("1")));
  EXPECT_TRUE(s.put("b", entry("2")));
  ASSERT_TRUE(s.get("a"));  // a is now the most recently used
  EXPECT_TRUE(s.put("c", entry("3")));
  EXPECT_EQ(s.size(), 2u);
  EXPECT_FALSE(s.get("b"));  // the least recently used went
  EXPECT_EQ(s.get("a")->response["t"], "1");
  EXPECT_TRUE(s.get("c"));
  EXPECT_TRUE(s.erase("a"));
  EXPECT_FALSE(s.erase("a"));
  EXPECT_EQ(s.size(), 1u);
  EXPECT_TRUE(s.put("c", entry("33")));  // replaces
  EXPECT_EQ(s.size(), 1u);
  EXPECT_EQ(s.get("c")->conversation[0], "33");

  ResponsesStore none(0);
  EXPECT_FALSE(none.put("a", entry("1")));
  EXPECT_EQ(none.size(), 0u);

  // Bytes: each entry is id + {"t":"xxxxxxxxxx"} + ["xxxxxxxxxx"] = 1 + 18 + 14 = 33 bytes.
  const std::string ten(10, 'x');
  ResponsesStore small(100, 70);
  EXPECT_TRUE(small.put("a", entry(ten)));
  EXPECT_EQ(small.bytes(), 33u);
  EXPECT_TRUE(small.put("b", entry(ten)));
  EXPECT_TRUE(small.put("c", entry(ten)));  // 99 > 70: a goes
  EXPECT_EQ(small.size(), 2u);
  EXPECT_FALSE(small.get("a"));
  EXPECT_EQ(small.bytes(), 66u);
  EXPECT_FALSE(small.put("d", entry(std::string(100, 'y'))));  // larger than the bound on its own
  EXPECT_EQ(small.size(), 2u);
}

// ---- Over HTTP with the demo model ----

// A server with the demo model keeping at most `store` responses.
struct Running : test_support::DemoServer {
  explicit Running(size_t store = kDefaultResponsesStore) : DemoServer(with_store(store)) {}
  static HttpOptions with_store(size_t store) {
    HttpOptions ho;
    ho.responses_store = store;
    return ho;
  }
};

nlohmann::json body_of(const httplib::Result& r) { return nlohmann::json::parse(r->body, nullptr, false); }

void expect_error(const httplib::Result& r, int status, const std::string& param, const std::string& what) {
  ASSERT_TRUE(r) << what;
  EXPECT_EQ(r->status, status) << what << ": " << r->body;
  const auto j = body_of(r);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << what << ": " << r->body;
  EXPECT_TRUE(j["error"]["message"].is_string()) << what;
  EXPECT_EQ(j["error"]["type"], "invalid_request_error") << what;
  if (!param.empty()) {
    EXPECT_EQ(j["error"]["param"], param) << what << ": " << r->body;
  }
}

const char* kBody = R"({"model": "demo", "input": "Tell me about the sea", "max_output_tokens": 6, "temperature": 0)";

TEST(ResponsesHttp, PlainStreamedChainedStoredAndErrors) {
  Running s;
  auto c = s.client();
  auto r = c.Post("/v1/responses", std::string(kBody) + "}", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const auto j = body_of(r);
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["id"].get<std::string>().rfind("resp_", 0), 0u);
  EXPECT_TRUE(j["status"] == "completed" || j["status"] == "incomplete");
  EXPECT_EQ(j["model"], "demo");
  EXPECT_EQ(j["max_output_tokens"], 6);
  ASSERT_FALSE(j["output"].empty());
  const auto& msg = j["output"].back();
  EXPECT_EQ(msg["type"], "message");
  EXPECT_EQ(msg["role"], "assistant");
  EXPECT_EQ(msg["content"][0]["type"], "output_text");
  const std::string text = msg["content"][0]["text"];
  const auto& u = j["usage"];
  EXPECT_GT(u["input_tokens"].get<int>(), 5);
  EXPECT_GE(u["output_tokens"].get<int>(), 1);
  EXPECT_LE(u["output_tokens"].get<int>(), 6);
  EXPECT_EQ(u["total_tokens"], u["input_tokens"].get<int>() + u["output_tokens"].get<int>());
  EXPECT_TRUE(u["input_tokens_details"]["cached_tokens"].is_number());
  EXPECT_TRUE(u["output_tokens_details"]["reasoning_tokens"].is_number());
  if (j["status"] == "incomplete") EXPECT_EQ(j["incomplete_details"]["reason"], "max_output_tokens");
  else EXPECT_TRUE(j["incomplete_details"].is_null());

  // GET returns the stored object; the same text streamed (greedy), as SSE events.
  auto got = c.Get("/v1/responses/" + j["id"].get<std::string>());
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(body_of(got), j);
  auto st = c.Post("/v1/responses", std::string(kBody) + R"(, "stream": true})", "application/json");
  ASSERT_TRUE(st);
  ASSERT_EQ(st->status, 200);
  EXPECT_NE(st->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  std::vector<std::string> names;
  std::string streamed, final_id;
  size_t pos = 0;
  int64_t seq = 0;
  while ((pos = st->body.find("event: ", pos)) != std::string::npos) {
    const size_t nl = st->body.find('\n', pos);
    const std::string name = st->body.substr(pos + 7, nl - pos - 7);
    ASSERT_EQ(st->body.compare(nl + 1, 6, "data: "), 0);
    const size_t end = st->body.find("\n\n", nl);
    const auto ev = nlohmann::json::parse(st->body.substr(nl + 7, end - nl - 7));
    EXPECT_EQ(ev["type"], name);
    EXPECT_EQ(ev["sequence_number"], seq++);
    if (name == "response.output_text.delta") streamed += ev["delta"].get<std::string>();
    if (name == "response.completed" || name == "response.incomplete") final_id = ev["response"]["id"];
    names.push_back(name);
    pos = end;
  }
  ASSERT_GE(names.size(), 8u) << st->body;
  EXPECT_EQ(names[0], "response.created");
  EXPECT_EQ(names[1], "response.in_progress");
  EXPECT_EQ(names[2], "response.output_item.added");
  EXPECT_EQ(names[3], "response.content_part.added");
  EXPECT_TRUE(names.back() == "response.completed" || names.back() == "response.incomplete");
  EXPECT_EQ(streamed, text);
  auto got2 = c.Get("/v1/responses/" + final_id);  // a streamed response is stored too
  ASSERT_TRUE(got2);
  EXPECT_EQ(got2->status, 200);

  // previous_response_id: the earlier turn is in the prompt.
  auto next = c.Post("/v1/responses", R"({"input": "And then?", "max_output_tokens": 3, "previous_response_id": ")" +
                                          j["id"].get<std::string>() + "\"}", "application/json");
  ASSERT_TRUE(next);
  ASSERT_EQ(next->status, 200) << next->body;
  const auto nj = body_of(next);
  EXPECT_EQ(nj["previous_response_id"], j["id"]);
  EXPECT_GT(nj["usage"]["input_tokens"].get<int>(), u["input_tokens"].get<int>() + u["output_tokens"].get<int>());
  // A third turn chained on the second renders the whole conversation — both earlier inputs and
  // both earlier outputs, in order — exactly as the same items sent explicitly as input do.
  {
    auto third = c.Post("/v1/responses", R"({"input": "Go on.", "max_output_tokens": 1, "previous_response_id": ")" +
                                             nj["id"].get<std::string>() + "\"}", "application/json");
    ASSERT_TRUE(third);
    ASSERT_EQ(third->status, 200) << third->body;
    nlohmann::json items = nlohmann::json::array({{{"role", "user"}, {"content", "Tell me about the sea"}}});
    for (const auto& it : j["output"]) items.push_back(it);
    items.push_back({{"role", "user"}, {"content", "And then?"}});
    for (const auto& it : nj["output"]) items.push_back(it);
    items.push_back({{"role", "user"}, {"content", "Go on."}});
    auto spelled = c.Post("/v1/responses", nlohmann::json{{"input", items}, {"max_output_tokens", 1}}.dump(), "application/json");
    ASSERT_TRUE(spelled);
    ASSERT_EQ(spelled->status, 200) << spelled->body;
    EXPECT_EQ(body_of(third)["usage"]["input_tokens"], body_of(spelled)["usage"]["input_tokens"]) << third->body << "\n" << spelled->body;
  }

  // store: false keeps it out; DELETE removes; unknown ids.
  auto unstored = c.Post("/v1/responses", std::string(kBody) + R"(, "store": false})", "application/json");
  ASSERT_TRUE(unstored);
  ASSERT_EQ(unstored->status, 200);
  EXPECT_EQ(body_of(unstored)["store"], false);
  expect_error(c.Get("/v1/responses/" + body_of(unstored)["id"].get<std::string>()), 404, "", "store false");
  auto del = c.Delete("/v1/responses/" + j["id"].get<std::string>());
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 200);
  EXPECT_EQ(body_of(del)["deleted"], true);
  expect_error(c.Get("/v1/responses/" + j["id"].get<std::string>()), 404, "", "deleted");
  expect_error(c.Delete("/v1/responses/" + j["id"].get<std::string>()), 404, "", "deleted twice");
  auto missing = c.Post("/v1/responses", R"({"input": "x", "previous_response_id": "resp_nope"})", "application/json");
  expect_error(missing, 400, "previous_response_id", "unknown previous");
  EXPECT_EQ(body_of(missing)["error"]["code"], "previous_response_not_found");

  // Malformed bodies: 400 in OpenAI's shape, naming the field.
  expect_error(c.Post("/v1/responses", "{", "application/json"), 400, "", "bad json");
  expect_error(c.Post("/v1/responses", "[1]", "application/json"), 400, "", "not an object");
  expect_error(c.Post("/v1/responses", R"({"model": "demo"})", "application/json"), 400, "input", "no input");
  expect_error(c.Post("/v1/responses", R"({"input": "x", "tool_choice": "required"})", "application/json"), 400, "tool_choice",
               "required without tools");
  expect_error(c.Post("/v1/responses", R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object", "not": {}}}}})",
                      "application/json"), 400, "", "an unsupported schema keyword");
  // A forced call: the demo model must answer with exactly one function_call whose arguments
  // validate (constrained decoding), at temperature 1.
  {
    auto forced = c.Post("/v1/responses", R"({"input": "What is the weather in Paris?", "temperature": 1, "max_output_tokens": 160,
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"]}}],
        "tool_choice": {"type": "function", "name": "get_weather"}})", "application/json");
    ASSERT_TRUE(forced);
    ASSERT_EQ(forced->status, 200) << forced->body;
    const ojson fj = body_of(forced);
    int calls = 0;
    for (const ojson& item : fj["output"])
      if (item["type"] == "function_call") {
        ++calls;
        EXPECT_EQ(item["name"], "get_weather");
        const ojson args = ojson::parse(item["arguments"].get<std::string>());
        EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Rome") << args.dump();
      }
    EXPECT_EQ(calls, 1) << fj.dump();
  }
  expect_error(c.Post("/v1/responses", R"({"input": [{"role": "user", "content": [{"type": "input_image"}]}]})", "application/json"), 400,
               "input[0].content[0].type", "image");
  std::string longer;
  for (int i = 0; i < 1000; ++i) longer += "sea ";  // over 512 tokens
  expect_error(c.Post("/v1/responses", R"({"input": ")" + longer + "\"}", "application/json"), 400, "input", "prompt longer than the context");
  // Tools and a function-call round trip are accepted.
  auto tools = c.Post("/v1/responses", R"({"input": [{"role": "user", "content": "weather?"},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}],
      "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
      "max_output_tokens": 3, "reasoning": {"effort": "none"}})", "application/json");
  ASSERT_TRUE(tools);
  ASSERT_EQ(tools->status, 200) << tools->body;
  EXPECT_EQ(body_of(tools)["tools"][0]["name"], "get_weather");
  EXPECT_EQ(body_of(tools)["reasoning"]["effort"], "none");
}

TEST(ResponsesHttp, StoreBoundEvictsOldest) {
  Running s(/*store=*/1);
  auto c = s.client();
  auto a = c.Post("/v1/responses", std::string(kBody) + "}", "application/json");
  auto b = c.Post("/v1/responses", std::string(kBody) + "}", "application/json");
  ASSERT_TRUE(a && b);
  ASSERT_EQ(a->status, 200);
  ASSERT_EQ(b->status, 200);
  expect_error(c.Get("/v1/responses/" + body_of(a)["id"].get<std::string>()), 404, "", "evicted");
  auto got = c.Get("/v1/responses/" + body_of(b)["id"].get<std::string>());
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200);
}

}  // namespace
}  // namespace spool::server
