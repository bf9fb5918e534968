// The Anthropic Messages API over loopback with the demo model: message and SSE shapes, stop
// sequences, prompt-cache usage, count_tokens (tools, tool_choice none, thinking), a
// tool_use -> tool_result round trip, x-api-key and Bearer authentication, and Anthropic error
// objects with their statuses on every failure path of /v1/messages.
#include <httplib.h>
#include <gtest/gtest.h>

#include <sstream>
#include <thread>

#include "support/demo_server.h"
#include "server/http_server.h"
#include "server/json_body.h"

namespace spool::server {
namespace {

// Seconds a test client waits for a response before failing (a deadline for hangs only).
constexpr int kReadTimeoutS = 600;
const char* kKey = "test-key";

// A server with the demo model and an API key on a free loopback port, serving until destroyed;
// its clients send the key and anthropic-version.
struct Running : test_support::DemoServer {
  explicit Running(bool with_engine = true) : DemoServer(with_key(), with_engine) {}
  static HttpOptions with_key() {
    HttpOptions ho;
    ho.api_key = kKey;
    return ho;
  }
  httplib::Client client(bool with_key = true) const {
    httplib::Client c = DemoServer::client(kReadTimeoutS);
    if (with_key) c.set_default_headers({{"x-api-key", kKey}, {"anthropic-version", "2023-06-01"}});
    return c;
  }
};

json body_json(const httplib::Result& r) { return json::parse(r->body, nullptr, false); }

json request(const std::string& text, int max_tokens = 12) {
  return json{{"model", "claude-test"}, {"max_tokens", max_tokens}, {"temperature", 0},
              {"messages", json::array({json{{"role", "user"}, {"content", text}}})}};
}

// An Anthropic error response: `status`, {"type": "error", "error": {"type": `type`, "message"}}.
void expect_error(const httplib::Result& r, int status, const std::string& type, const std::string& what) {
  ASSERT_TRUE(r) << what;
  EXPECT_EQ(r->status, status) << what << ": " << r->body;
  const json j = body_json(r);
  ASSERT_TRUE(j.is_object()) << what << ": " << r->body;
  EXPECT_EQ(j["type"], "error") << what << ": " << r->body;
  EXPECT_EQ(j["error"]["type"], type) << what << ": " << r->body;
  EXPECT_TRUE(j["error"]["message"].is_string() && !j["error"]["message"].get<std::string>().empty()) << what;
  EXPECT_FALSE(j.contains("choices"));
}

httplib::Result post(httplib::Client& c, const json& body, const char* path = "/v1/messages") {
  return c.Post(path, dump_json(body), "application/json");
}

// The text of a message's text and thinking blocks, in order.
std::string all_text(const json& msg) {
  std::string s;
  for (const auto& b : msg["content"]) s += b.value("text", std::string()) + b.value("thinking", std::string());
  return s;
}

void expect_message_shape(const json& m) {
  EXPECT_EQ(m["type"], "message") << m.dump();
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["model"], "demo");
  EXPECT_EQ(m["id"].get<std::string>().rfind("msg_", 0), 0u);
  ASSERT_TRUE(m["content"].is_array());
  for (const auto& b : m["content"]) {
    const std::string t = b["type"];
    EXPECT_TRUE(t == "text" || t == "thinking" || t == "tool_use") << t;
    if (t == "tool_use") {
      EXPECT_EQ(b["id"].get<std::string>().rfind("toolu_", 0), 0u);
      EXPECT_TRUE(b["input"].is_object());
    }
  }
  EXPECT_TRUE(m.contains("stop_sequence"));
  for (const char* k : {"input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"})
    EXPECT_TRUE(m["usage"][k].is_number_integer()) << k;
}

// Long enough for the prompt cache: it reuses whole prefill chunks (32 tokens here).
const char* kSea =
    "Tell me about the sea, the whales that swim in it, the ships that sail on it and the storms that rise over it in winter, "
    "and about the lighthouse keepers who watch the coast through the long nights.";

TEST(AnthropicHttp, MessageStreamAndCacheUsage) {
  Running s;
  auto c = s.client();
  auto r = post(c, request(kSea));
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json m = body_json(r);
  expect_message_shape(m);
  EXPECT_EQ(m["stop_reason"], "max_tokens") << m.dump();
  EXPECT_EQ(m["usage"]["output_tokens"], 12);
  const int64_t prompt = m["usage"]["input_tokens"].get<int64_t>() + m["usage"]["cache_read_input_tokens"].get<int64_t>();

  // count_tokens counts the same prompt.
  auto ct = post(c, request(kSea), "/v1/messages/count_tokens");
  ASSERT_TRUE(ct);
  ASSERT_EQ(ct->status, 200) << ct->body;
  EXPECT_EQ(body_json(ct), (json{{"input_tokens", prompt}}));

  // The same request again reads its prompt from the cache.
  auto again = post(c, request(kSea));
  ASSERT_TRUE(again);
  const json m2 = body_json(again);
  EXPECT_GT(m2["usage"]["cache_read_input_tokens"].get<int64_t>(), 0) << m2.dump();
  EXPECT_EQ(m2["usage"]["input_tokens"].get<int64_t>() + m2["usage"]["cache_read_input_tokens"].get<int64_t>(), prompt);
  EXPECT_EQ(m2["content"], m["content"]);

  // Streamed: every event has event: and data: lines of the same type, in Anthropic's order,
  // and the deltas add up to the non-streamed blocks.
  json sreq = request(kSea);
  sreq["stream"] = true;
  auto st = post(c, sreq);
  ASSERT_TRUE(st);
  ASSERT_EQ(st->status, 200) << st->body;
  EXPECT_EQ(st->get_header_value("Content-Type").rfind("text/event-stream", 0), 0u);
  std::istringstream in(st->body);
  std::string line;
  std::vector<json> ev;
  while (std::getline(in, line)) {
    ASSERT_EQ(line.rfind("event: ", 0), 0u) << st->body;
    std::string data;
    ASSERT_TRUE(std::getline(in, data));
    ASSERT_EQ(data.rfind("data: ", 0), 0u) << st->body;
    const json j = json::parse(data.substr(6));
    EXPECT_EQ(line.substr(7), j["type"]);
    ev.push_back(j);
    ASSERT_TRUE(std::getline(in, line));
    EXPECT_EQ(line, "");
  }
  ASSERT_GE(ev.size(), 4u);
  EXPECT_EQ(ev.front()["type"], "message_start");
  EXPECT_EQ(ev[1]["type"], "ping");
  EXPECT_EQ(ev[ev.size() - 2]["type"], "message_delta");
  EXPECT_EQ(ev.back()["type"], "message_stop");
  EXPECT_EQ(ev[ev.size() - 2]["delta"]["stop_reason"], "max_tokens");
  EXPECT_EQ(ev[ev.size() - 2]["usage"]["output_tokens"], 12);
  json blocks = json::array();
  int open = -1;
  for (const auto& e : ev) {
    if (e["type"] == "content_block_start") {
      EXPECT_EQ(open, -1);
      open = e["index"];
      EXPECT_EQ(open, static_cast<int>(blocks.size()));
      blocks.push_back(e["content_block"]);
    } else if (e["type"] == "content_block_delta") {
      ASSERT_EQ(e["index"], open);
      json& b = blocks[static_cast<size_t>(open)];
      if (e["delta"]["type"] == "text_delta") b["text"] = b["text"].get<std::string>() + e["delta"]["text"].get<std::string>();
      else if (e["delta"]["type"] == "thinking_delta") b["thinking"] = b["thinking"].get<std::string>() + e["delta"]["thinking"].get<std::string>();
      else ADD_FAILURE() << e.dump();
    } else if (e["type"] == "content_block_stop") {
      EXPECT_EQ(e["index"], open);
      open = -1;
    }
  }
  EXPECT_EQ(open, -1);
  EXPECT_EQ(blocks, m["content"]);

  // A stop sequence taken from the middle of that output ends it there.
  const std::string text = all_text(m);
  ASSERT_GE(text.size(), 4u) << m.dump();
  size_t at = text.size() / 2;  // one whole UTF-8 character from the middle
  while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
  size_t end = at + 1;
  while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
  const std::string stop = text.substr(at, end - at);
  json sq = request(kSea);
  sq["stop_sequences"] = json::array({stop});
  auto sr = post(c, sq);
  ASSERT_TRUE(sr);
  const json sm = body_json(sr);
  EXPECT_EQ(sm["stop_reason"], "stop_sequence") << sm.dump() << " stop " << stop;
  EXPECT_EQ(sm["stop_sequence"], stop);
  EXPECT_EQ(all_text(sm).find(stop), std::string::npos);
  // Streamed, message_delta names the stop sequence too.
  sq["stream"] = true;
  auto ss = post(c, sq);
  ASSERT_TRUE(ss);
  const size_t md = ss->body.find("event: message_delta\ndata: ");
  ASSERT_NE(md, std::string::npos) << ss->body;
  const size_t data = md + std::string("event: message_delta\ndata: ").size();
  const json delta = json::parse(ss->body.substr(data, ss->body.find('\n', data) - data))["delta"];
  EXPECT_EQ(delta, (json{{"stop_reason", "stop_sequence"}, {"stop_sequence", stop}})) << ss->body;
}

TEST(AnthropicHttp, ToolsThinkingAndRoundTrip) {
  Running s;
  auto c = s.client();
  auto count = [&](const json& body) {
    auto r = post(c, body, "/v1/messages/count_tokens");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no response");
    return r ? body_json(r)["input_tokens"].get<int64_t>() : -1;
  };
  json plain = request("What is the weather in Paris?");
  plain.erase("max_tokens");
  json tools = plain;
  tools["tools"] = json::parse(R"([{"name": "get_weather", "description": "Current weather",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}])");
  const int64_t n_plain = count(plain), n_tools = count(tools);
  EXPECT_GT(n_tools, n_plain + 20) << "the tools are rendered into the prompt";
  tools["tool_choice"] = {{"type", "none"}};
  EXPECT_EQ(count(tools), n_plain) << "tool_choice none leaves them out";
  tools["tool_choice"] = {{"type", "tool"}, {"name", "get_weather"}};
  EXPECT_EQ(count(tools), n_tools) << "tool_choice tool renders the tools (the call is forced while decoding)";
  {
    // tool_choice tool: the demo model answers with exactly that call (constrained decoding), at
    // temperature 1, and stop_reason tool_use; the input validates against the schema.
    json forced = tools;
    forced["max_tokens"] = 160;  // the demo vocabulary spells JSON markup in many tokens
    forced["temperature"] = 1.0;
    forced["tools"][0]["input_schema"]["properties"]["city"]["enum"] = {"Paris", "Rome"};
    auto r = post(c, forced);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json m = body_json(r);
    expect_message_shape(m);  // tool_use ids are toolu_..., input an object
    EXPECT_EQ(m["stop_reason"], "tool_use") << m.dump();
    int calls = 0;
    for (const json& b : m["content"])
      if (b["type"] == "tool_use") {
        ++calls;
        EXPECT_EQ(b["name"], "get_weather");
        EXPECT_TRUE(b["input"]["city"] == "Paris" || b["input"]["city"] == "Rome") << b.dump();
      }
    EXPECT_EQ(calls, 1) << m.dump();
  }
  json think = plain;
  think["thinking"] = {{"type", "disabled"}};
  EXPECT_GT(count(think), n_plain) << "thinking disabled closes an empty <think> in the prompt";
  think["thinking"] = {{"type", "enabled"}, {"budget_tokens", 1024}};
  EXPECT_EQ(count(think), n_plain);

  // The client sends the tool_result of an earlier tool_use: the server renders the turn (more
  // tokens than without the result) and answers with a message.
  json trip = json::parse(R"({"model": "claude-test", "max_tokens": 8, "temperature": 0,
    "system": "You are a weather bot.",
    "tools": [{"name": "get_weather", "description": "Current weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "messages": [
      {"role": "user", "content": "What is the weather in Paris?"},
      {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "sunny, 21 C"}]}]})");
  json shorter = trip;
  shorter["messages"][2]["content"][0]["content"] = "sunny";
  EXPECT_GT(count(trip), count(shorter));
  auto r = post(c, trip);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  expect_message_shape(body_json(r));
  trip["stream"] = true;
  auto st = post(c, trip);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->status, 200);
  EXPECT_NE(st->body.find("event: message_stop\n"), std::string::npos) << st->body;
}

TEST(AnthropicHttp, AuthenticationHeaders) {
  Running s;
  auto none = s.client(false);
  expect_error(post(none, request("hi")), 401, "authentication_error", "no key");
  none.set_default_headers({{"x-api-key", "wrong"}});
  expect_error(post(none, request("hi")), 401, "authentication_error", "wrong x-api-key");
  auto keyed = s.client();
  auto ok = post(keyed, request("hi", 2), "/v1/messages/count_tokens");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  httplib::Client bearer("127.0.0.1", s.port);
  bearer.set_read_timeout(kReadTimeoutS, 0);
  bearer.set_default_headers({{"Authorization", std::string("Bearer ") + kKey}});
  auto b = post(bearer, request("hi", 2), "/v1/messages/count_tokens");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->status, 200) << b->body;
  // x-api-key works on the OpenAI routes too; their errors stay OpenAI objects.
  auto models = keyed.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  auto oa = none.Get("/v1/models");
  ASSERT_TRUE(oa);
  EXPECT_EQ(oa->status, 401);
  EXPECT_TRUE(body_json(oa).contains("error") && !body_json(oa).contains("type"));
}

TEST(AnthropicHttp, ErrorsAreAnthropicObjects) {
  Running s(/*with_engine=*/false);
  auto c = s.client();
  expect_error(post(c, request("hi")), 529, "overloaded_error", "loading");
  s.load();
  expect_error(c.Post("/v1/messages", "", "application/json"), 400, "invalid_request_error", "empty body");
  expect_error(c.Post("/v1/messages", "{\"model\":", "application/json"), 400, "invalid_request_error", "bad JSON");
  expect_error(c.Post("/v1/messages", "[1]", "application/json"), 400, "invalid_request_error", "not an object");
  json b = request("hi");
  b.erase("max_tokens");
  expect_error(post(c, b), 400, "invalid_request_error", "no max_tokens");
  b = request("hi");
  b["messages"][0]["content"] = json::parse(R"([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}])");
  auto img = post(c, b);
  expect_error(img, 400, "invalid_request_error", "image");
  EXPECT_NE(body_json(img)["error"]["message"].get<std::string>().find("image"), std::string::npos);
  b = request("hi");
  b["messages"][0]["content"] = std::string(3000, 'a') + " b";
  for (int i = 0; i < 3; ++i) b["messages"][0]["content"] = b["messages"][0]["content"].get<std::string>() + b["messages"][0]["content"].get<std::string>();
  expect_error(post(c, b), 400, "invalid_request_error", "prompt longer than the context");
  b = request("hi");
  b["temperature"] = 3;
  expect_error(post(c, b), 400, "invalid_request_error", "temperature");
  expect_error(post(c, request("hi"), "/v1/messages/batches"), 404, "not_found_error", "unknown route");
  expect_error(c.Get("/v1/messages"), 404, "not_found_error", "GET");
  expect_error(c.Post("/v1/messages", std::string(kMaxBodyBytes + 1, ' '), "application/json"), 413, "request_too_large", "too large");
  json ct = request("hi");
  ct["tools"] = "x";
  expect_error(post(c, ct, "/v1/messages/count_tokens"), 400, "invalid_request_error", "count_tokens tools");
  // The server still answers.
  auto ok = post(c, request("hi", 2));
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
}

}  // namespace
}  // namespace spool::server
