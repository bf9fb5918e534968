// The HTTP API over loopback with the demo model: endpoints, SSE framing, errors (status and
// OpenAI error object), API key, /health while loading, disconnect cancellation, forced tool
// calls (tool_choice "required" and named, streamed and not), and a loop of
// ~1000 malformed requests after which the server still answers.
#include <httplib.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <thread>

#include "server/http_server.h"
#include "server/json_body.h"

namespace spool::server {
namespace {

// Seconds a test client waits for a response before failing (a deadline for hangs, not a
// performance bound).
constexpr int kReadTimeoutS = 600;

std::unique_ptr<ServingEngine> demo_engine(int64_t ctx = 256, int parallel = 1,
                                           const std::function<void(engine::LoadOptions&)>& tweak = {}) {
  engine::LoadOptions o;
  o.model_dir = SPOOL_DEFAULT_MODEL_DIR;
  o.threads = 2;
  EngineOptions eo;
  eo.model_name = "demo";
  eo.ctx_size = ctx;
  eo.prefill_step = 32;
  eo.parallel = parallel;
  o.parallel = parallel;
  if (tweak) tweak(o);
  return make_serving_engine(engine::load(o), eo);
}

// A server on a free loopback port, serving until destroyed.
struct Running {
  explicit Running(const std::string& api_key = "", bool with_engine = true, HttpOptions ho = {}, int64_t ctx = 256,
                   const std::function<void(engine::LoadOptions&)>& tweak = {}) {
    ho.port = 0;
    const int parallel = ho.parallel;
    ho.api_key = api_key;
    server = std::make_unique<HttpServer>(ho);
    port = server->bind();
    thread = std::thread([this] { server->listen(); });
    if (with_engine) {
      auto e = demo_engine(ctx, parallel, tweak);
      // "logit_bias" that bans every end-of-sequence id: generation runs to max_tokens.
      for (int32_t id : e->facts.stop_ids) no_eos[std::to_string(id)] = -100;
      server->set_engine(std::move(e));
    }
  }
  ~Running() {
    server->stop();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    // A deadline that only a hang reaches: under ASan at -O1 with one SIMD target on a loaded
    // 2-core machine, a 250-token completion has taken over a minute.
    c.set_read_timeout(kReadTimeoutS, 0);
    return c;
  }
  std::unique_ptr<HttpServer> server;
  int port = 0;
  std::thread thread;
  nlohmann::json no_eos = nlohmann::json::object();
};

nlohmann::json body_json(const httplib::Result& r) { return nlohmann::json::parse(r->body, nullptr, false); }

void expect_error(const httplib::Result& r, int status, const std::string& what) {
  ASSERT_TRUE(r) << what;
  EXPECT_EQ(r->status, status) << what << ": " << r->body;
  auto j = body_json(r);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << what << ": " << r->body;
  EXPECT_TRUE(j["error"]["message"].is_string()) << what;
  EXPECT_TRUE(j["error"]["type"].is_string()) << what;
}

const char* kChat = R"({"model": "demo", "messages": [{"role": "user", "content": "Tell me about the sea"}], "max_tokens": 12, "temperature": 0)";

TEST(HttpApi, HealthIs503WhileLoadingThen200) {
  Running s("", /*with_engine=*/false);
  auto c = s.client();
  auto r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  expect_error(c.Post("/v1/chat/completions", std::string(kChat) + "}", "application/json"), 503, "loading");
  s.server->set_engine(demo_engine());
  r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(HttpApi, EndpointsAndStreaming) {
  Running s;
  auto c = s.client();
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(body_json(models)["data"][0]["id"], "demo");
  auto one = c.Get("/v1/models/demo");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200) << one->body;
  EXPECT_EQ(body_json(one)["id"], "demo");
  EXPECT_EQ(body_json(one)["object"], "model");
  expect_error(c.Get("/v1/models/gpt-4"), 404, "unknown model");

  auto plain = c.Post("/v1/chat/completions", std::string(kChat) + "}", "application/json");
  ASSERT_TRUE(plain);
  ASSERT_EQ(plain->status, 200) << plain->body;
  auto pj = body_json(plain);
  EXPECT_EQ(pj["object"], "chat.completion");
  EXPECT_EQ(pj["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(pj["usage"]["completion_tokens"], 12);
  EXPECT_TRUE(pj["usage"]["prompt_tokens_details"]["cached_tokens"].is_number());
  const std::string text = pj["choices"][0]["message"]["content"];

  // Streaming: role chunk, content chunks, finish chunk, usage chunk, [DONE]; same text.
  auto st = c.Post("/v1/chat/completions", std::string(kChat) + R"(, "stream": true, "stream_options": {"include_usage": true}})",
                   "application/json");
  ASSERT_TRUE(st);
  EXPECT_EQ(st->status, 200);
  EXPECT_NE(st->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  std::string streamed, finish;
  bool usage = false, done = false;
  size_t pos = 0;
  while ((pos = st->body.find("data: ", pos)) != std::string::npos) {
    const size_t end = st->body.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos);
    const std::string data = st->body.substr(pos + 6, end - pos - 6);
    pos = end;
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    EXPECT_FALSE(done) << "data after [DONE]";
    auto j = nlohmann::json::parse(data);
    EXPECT_EQ(j["object"], "chat.completion.chunk");
    if (j["choices"].empty()) {
      usage = true;
      EXPECT_EQ(j["usage"]["completion_tokens"], 12);
      continue;
    }
    // With include_usage, every other chunk has "usage": null (as OpenAI sends them).
    EXPECT_TRUE(j.contains("usage") && j["usage"].is_null()) << data;
    const auto& ch = j["choices"][0];
    if (ch["delta"].contains("content")) streamed += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_TRUE(done && usage);
  EXPECT_EQ(finish, "length");
  EXPECT_EQ(streamed, text);

  // Text completions with logprobs.
  auto tc = c.Post("/v1/completions", R"({"prompt": "The whale", "max_tokens": 4, "temperature": 0, "logprobs": 2})", "application/json");
  ASSERT_TRUE(tc);
  ASSERT_EQ(tc->status, 200) << tc->body;
  auto tj = body_json(tc);
  EXPECT_EQ(tj["object"], "text_completion");
  EXPECT_EQ(tj["choices"][0]["logprobs"]["tokens"].size(), 4u);
  EXPECT_EQ(tj["choices"][0]["logprobs"]["top_logprobs"][0].size(), 2u);

  // Chat logprobs.
  auto lp = c.Post("/v1/chat/completions", std::string(kChat) + R"(, "logprobs": true, "top_logprobs": 3})", "application/json");
  ASSERT_TRUE(lp);
  auto lj = body_json(lp);
  ASSERT_EQ(lj["choices"][0]["logprobs"]["content"].size(), 12u);
  EXPECT_LE(lj["choices"][0]["logprobs"]["content"][0]["logprob"].get<double>(), 0.0);
  EXPECT_EQ(lj["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 3u);

  // tokenize / detokenize / apply-template.
  auto tk = c.Post("/tokenize", R"({"content": "Call me Ishmael."})", "application/json");
  ASSERT_TRUE(tk);
  auto ids = body_json(tk)["tokens"];
  ASSERT_TRUE(ids.is_array() && !ids.empty());
  auto dt = c.Post("/detokenize", nlohmann::json{{"tokens", ids}}.dump(), "application/json");
  ASSERT_TRUE(dt);
  EXPECT_EQ(body_json(dt)["content"], "Call me Ishmael.");
  auto at = c.Post("/apply-template", R"({"messages": [{"role": "user", "content": "Hi"}]})", "application/json");
  ASSERT_TRUE(at);
  EXPECT_EQ(body_json(at)["prompt"], "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  auto at2 = c.Post("/apply-template", R"({"messages": [{"role": "user", "content": "Hi"}], "chat_template": "[{{ messages[0].content }}]"})",
                    "application/json");
  ASSERT_TRUE(at2);
  EXPECT_EQ(body_json(at2)["prompt"], "[Hi]");

  // Metrics.
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  for (const char* name : {"spool_prompt_tokens_total", "spool_generated_tokens_total", "spool_generation_tokens_per_second",
                           "spool_expert_cache_hit_rate", "spool_disk_read_bytes_total", "spool_resident_memory_bytes",
                           "spool_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"}"})
    EXPECT_NE(m->body.find(name), std::string::npos) << name;
}

TEST(HttpApi, ErrorsAreOpenAIObjects) {
  Running s("secret");
  auto c = s.client();
  expect_error(c.Post("/v1/chat/completions", std::string(kChat) + "}", "application/json"), 401, "no key");
  httplib::Headers wrong = {{"Authorization", "Bearer nope"}};
  expect_error(c.Post("/v1/chat/completions", wrong, std::string(kChat) + "}", "application/json"), 401, "wrong key");
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);  // /health needs no key
  c.set_bearer_token_auth("secret");
  expect_error(c.Post("/v1/chat/completions", "", "application/json"), 400, "empty body");
  expect_error(c.Post("/v1/chat/completions", "{\"messages\": [", "application/json"), 400, "malformed");
  expect_error(c.Post("/v1/chat/completions", "{\"messages\": \"\xc3\x28\"}", "application/json"), 400, "invalid UTF-8");
  expect_error(c.Post("/v1/chat/completions", R"({"model": "demo"})", "application/json"), 400, "missing messages");
  expect_error(c.Post("/v1/chat/completions", R"({"messages": 5})", "application/json"), 400, "wrong type");
  expect_error(c.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "temperature": "1"})", "application/json"),
               400, "wrong type");
  std::string long_prompt = R"({"messages": [{"role": "user", "content": ")";
  for (int i = 0; i < 300; ++i) long_prompt += "word" + std::to_string(i) + " ";
  expect_error(c.Post("/v1/chat/completions", long_prompt + "\"}]}", "application/json"), 400, "prompt > ctx");
  expect_error(c.Post("/v1/completions", R"({"prompt": [1, 2, 999999]})", "application/json"), 400, "bad ids");
  expect_error(c.Get("/v1/nothing"), 404, "unknown route");
  expect_error(c.Post("/detokenize", R"({"tokens": [-1]})", "application/json"), 400, "bad detokenize");
  expect_error(c.Post("/tokenize", R"({"content": 5})", "application/json"), 400, "bad tokenize");
  // max_tokens larger than the context is capped, finish_reason "length" (end-of-sequence ids
  // are banned, so the cap is what ends it).
  nlohmann::json capped = {{"prompt", "The sea"}, {"max_tokens", 100000}, {"temperature", 0.9}, {"seed", 1}, {"logit_bias", s.no_eos}};
  auto big = c.Post("/v1/completions", capped.dump(), "application/json");
  ASSERT_TRUE(big);
  ASSERT_EQ(big->status, 200) << big->body;
  auto bj = body_json(big);
  EXPECT_EQ(bj["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(bj["usage"]["total_tokens"], 256);
}

TEST(HttpApi, LogitBiasSteersSampling) {
  Running s;
  auto c = s.client();
  // +100 on one token makes greedy decoding repeat it.
  auto r = c.Post("/v1/completions", R"({"prompt": "The whale", "max_tokens": 5, "temperature": 0, "logprobs": 0, "logit_bias": {"300": 100}})",
                  "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  auto tk = c.Post("/detokenize", R"({"tokens": [300, 300, 300, 300, 300]})", "application/json");
  ASSERT_TRUE(tk);
  EXPECT_EQ(body_json(r)["choices"][0]["text"], body_json(tk)["content"]);
  expect_error(c.Post("/v1/completions", R"({"prompt": "x", "logit_bias": {"300": 101}})", "application/json"), 400, "bias range");
  expect_error(c.Post("/v1/completions", R"({"prompt": "x", "logit_bias": {"abc": 1}})", "application/json"), 400, "bias id");
}

// tool_choice "required" and a named function on /v1/chat/completions, non-streamed and
// streamed: at temperature 1 the demo model answers with exactly one call of the tool whose
// arguments validate (constrained decoding), finish_reason "tool_calls".
TEST(HttpApi, ForcedToolCallIsOneValidCall) {
  Running s("", true, {}, /*ctx=*/1024);
  auto c = s.client();
  nlohmann::json body = nlohmann::json::parse(R"({"model": "demo", "temperature": 1, "max_tokens": 160, "seed": 7,
    "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
               "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}, "required": ["city"], "additionalProperties": false}}},
              {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]})");
  const nlohmann::json choices[] = {"required", nlohmann::json::parse(R"({"type": "function", "function": {"name": "get_weather"}})")};
  for (const auto& choice : choices) {
    for (const bool stream : {false, true}) {
      SCOPED_TRACE(choice.dump() + (stream ? " streamed" : ""));
      body["tool_choice"] = choice;
      body["stream"] = stream;
      auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
      ASSERT_TRUE(r);
      ASSERT_EQ(r->status, 200) << r->body;
      std::string finish, name, args;
      int calls = 0;
      if (!stream) {
        const auto j = body_json(r);
        finish = j["choices"][0]["finish_reason"];
        for (const auto& tc : j["choices"][0]["message"].value("tool_calls", nlohmann::json::array())) {
          ++calls;
          name = tc["function"]["name"];
          args = tc["function"]["arguments"];
        }
      } else {
        std::istringstream in(r->body);
        for (std::string line; std::getline(in, line);) {
          if (line.rfind("data: {", 0) != 0) continue;
          const auto ch = nlohmann::json::parse(line.substr(6))["choices"][0];
          if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
          for (const auto& tc : ch.value("delta", nlohmann::json::object()).value("tool_calls", nlohmann::json::array())) {
            if (tc.contains("id")) ++calls;
            const auto fn = tc.value("function", nlohmann::json::object());
            name += fn.value("name", std::string());
            args += fn.value("arguments", std::string());
          }
        }
      }
      EXPECT_EQ(finish, "tool_calls") << r->body;
      EXPECT_EQ(calls, 1) << r->body;
      if (choice.is_object() || name == "get_weather") {
        EXPECT_EQ(name, "get_weather") << r->body;
        const auto a = nlohmann::json::parse(args, nullptr, false);
        EXPECT_TRUE(a.is_object() && a.size() == 1 && (a["city"] == "Paris" || a["city"] == "Rome")) << args;
      } else {
        EXPECT_EQ(name, "get_time") << r->body;
        EXPECT_EQ(nlohmann::json::parse(args, nullptr, false), nlohmann::json::object()) << args;
      }
    }
  }
}

TEST(HttpApi, FormEncodedJsonBodiesOver8KBAreRead) {
  // `curl -d` sends application/x-www-form-urlencoded; httplib alone refuses such bodies > 8 KB.
  Running s;
  auto c = s.client();
  const nlohmann::json body = {{"content", std::string(20000, 'a')}};
  auto r = c.Post("/tokenize", body.dump(), "application/x-www-form-urlencoded");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body.substr(0, 300);
  EXPECT_TRUE(body_json(r)["tokens"].is_array());
  // The body limit still holds, whatever the Content-Type.
  expect_error(c.Post("/tokenize", std::string(kMaxBodyBytes + 1, ' '), "application/x-www-form-urlencoded"), 413, "too large");
  expect_error(c.Post("/tokenize", std::string(kMaxBodyBytes + 1, ' '), "application/json"), 413, "too large");
}

// A Prometheus text exposition line: a comment, or `name{label="value",...} number`.
bool valid_prometheus_line(const std::string& line) {
  if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) return true;
  size_t i = 0;
  auto name_char = [](char ch, bool first) { return std::isalpha(static_cast<unsigned char>(ch)) || ch == '_' || ch == ':' || (!first && std::isdigit(static_cast<unsigned char>(ch))); };
  while (i < line.size() && name_char(line[i], i == 0)) ++i;
  if (i == 0) return false;
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (i < line.size() && line[i] != '}') {
      const size_t start = i;
      while (i < line.size() && name_char(line[i], i == start)) ++i;
      if (i == start || line.compare(i, 2, "=\"") != 0) return false;
      i += 2;
      while (i < line.size() && line[i] != '"') {
        if (line[i] == '\\') {
          if (i + 1 >= line.size() || (line[i + 1] != '\\' && line[i + 1] != '"' && line[i + 1] != 'n')) return false;
          ++i;
        }
        ++i;
      }
      if (i >= line.size()) return false;
      ++i;  // closing quote
      if (i < line.size() && line[i] == ',') ++i;
    }
    if (i >= line.size()) return false;
    ++i;  // '}'
  }
  if (i >= line.size() || line[i] != ' ') return false;
  char* end = nullptr;
  std::strtod(line.c_str() + i + 1, &end);
  return end != line.c_str() + i + 1 && *end == '\0';
}

// /metrics carries the expert tiers: with slots in front of the streaming cache
// (--host-expert-slots, the VRAM tier's code on the CPU), each expert acquired is a slot hit or
// miss, each miss one request to the RAM tier and one slot's bytes copied.
TEST(HttpApi, MetricsShowTheExpertTiers) {
  Running s("", true, {}, 256, [](engine::LoadOptions& o) {
    o.stream = true;
    o.cache_budget = "1";
    o.host_expert_slots = 256;  // (fewer than 64 slots never hit: 8 layers x 8 experts a token)
  });
  auto c = s.client();
  auto scrape = [&] {
    auto m = c.Get("/metrics");
    EXPECT_TRUE(m);
    return m ? m->body : std::string();
  };
  auto value = [](const std::string& body, const std::string& name) {
    const size_t at = body.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(body.substr(at + name.size() + 2));
  };
  // Deltas over one completion (loading read expert 0 of each layer to size the slots).
  const std::string m0 = scrape();
  auto r = c.Post("/v1/completions", R"({"prompt": "Call me Ishmael.", "max_tokens": 6, "temperature": 0})", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string m1 = scrape();
  auto delta = [&](const std::string& name) { return value(m1, name) - value(m0, name); };
  EXPECT_EQ(value(m1, "spool_vram_expert_slots"), 256);
  const double hits = delta("spool_vram_expert_hits_total"), misses = delta("spool_vram_expert_misses_total");
  EXPECT_GT(hits, 0);
  EXPECT_GT(misses, 0);
  EXPECT_EQ(hits + misses, delta("spool_expert_acquisitions_total"));
  EXPECT_EQ(delta("spool_expert_cache_requests_total"), misses);  // the RAM tier serves the slots' misses
  EXPECT_EQ(delta("spool_expert_cache_hits_total") + delta("spool_expert_cache_misses_total"), misses);
  const double copied = delta("spool_vram_expert_copied_bytes_total");
  EXPECT_GT(copied, 0);
  EXPECT_EQ(std::fmod(copied, misses), 0.0);  // one slot's bytes per miss
  EXPECT_GE(value(m1, "spool_vram_expert_stall_seconds_total"), 0);
  EXPECT_GE(value(m1, "spool_expert_cache_stall_seconds_total"), 0);
  EXPECT_EQ(value(m1, "spool_expert_cache_pinned_bytes"), 0);  // the CPU pins nothing
  std::istringstream in(m1);
  for (std::string line; std::getline(in, line);) EXPECT_TRUE(valid_prometheus_line(line)) << line;
}

TEST(HttpApi, MetricsStayValidAfterOddPaths) {
  Running s;
  auto c = s.client();
  const std::string long_path = "/" + std::string(400, 'x');
  for (const std::string& path : {std::string("/v1/%22quoted%22%0Aline%5C"), long_path, std::string("/v1/models/%22%7D%20x"),
                                  std::string("/health"), std::string("/nope")})
    ASSERT_TRUE(c.Get(path)) << path;
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(c.Get("/unique-" + std::to_string(i)));
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  std::istringstream in(m->body);
  int series = 0;
  for (std::string line; std::getline(in, line);) {
    EXPECT_TRUE(valid_prometheus_line(line)) << line;
    if (line.starts_with("spool_requests_total{")) ++series;
  }
  // Labels are routes from a fixed set, not paths: no path bytes, and few series.
  EXPECT_EQ(m->body.find("quoted"), std::string::npos);
  EXPECT_EQ(m->body.find("unique-"), std::string::npos);
  EXPECT_NE(m->body.find("spool_requests_total{endpoint=\"other\",status=\"404\"} 53\n"), std::string::npos) << m->body.substr(0, 600);
  EXPECT_NE(m->body.find("spool_requests_total{endpoint=\"/health\",status=\"200\"} 1"), std::string::npos);
  EXPECT_NE(m->body.find("spool_requests_total{endpoint=\"/v1/models/{id}\",status=\"404\"}"), std::string::npos);
  EXPECT_LE(series, 4);
}

// Polls `done` every 5 ms until it is true or `seconds` have passed; returns its last value.
// A deadline for every wait (a generous one: it only bounds a hang, it asserts no speed).
template <class F>
bool wait_until(F done, double seconds = 60) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Joins the threads when the test leaves, also by a failed ASSERT (after releasing the holder).
struct JoinAll {
  std::function<void()> release;
  std::vector<std::thread*> threads;
  ~JoinAll() {
    release();
    for (std::thread* t : threads)
      if (t->joinable()) t->join();
  }
};

// /health and /metrics are answered while the engine is busy and the queue full: checked by
// order (the answer comes while the long generation is still streaming), not by a clock.
TEST(HttpApi, FullQueueIs503AndHealthAnsweredWhileBusy) {
  HttpOptions ho;
  ho.max_waiting = 2;
  ho.threads = 8;
  Running s("", true, ho, /*ctx=*/4096);
  // A long generation holds the engine until the client hangs up.
  std::atomic<bool> hang_up{false}, started{false}, holder_done{false};
  std::atomic<int> holder_chunks{0};
  std::thread holder([&] {
    httplib::Client c("127.0.0.1", s.port);
    c.set_read_timeout(kReadTimeoutS, 0);
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = nlohmann::json{{"prompt", "The sea"}, {"max_tokens", 4000}, {"temperature", 0.9}, {"stream", true}, {"logit_bias", s.no_eos}}.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      started = true;
      ++holder_chunks;
      return !hang_up;
    };
    c.send(req);
    holder_done = true;
  });
  // Six more: two wait in the queue, four are refused at once.
  constexpr int kMore = 6;
  std::vector<int> status(kMore, 0);
  std::vector<std::string> bodies(kMore);
  std::atomic<int> refused{0};
  std::vector<std::thread> more;
  JoinAll joiner{[&] { hang_up = true; }, {&holder}};
  ASSERT_TRUE(wait_until([&] { return started.load(); })) << "the long generation never streamed";
  for (int i = 0; i < kMore; ++i)
    more.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", s.port);
      c.set_read_timeout(kReadTimeoutS, 0);
      auto r = c.Post("/v1/completions", R"({"prompt": "The sea", "max_tokens": 1})", "application/json");
      status[i] = r ? r->status : -1;
      bodies[i] = r ? r->body : "";
      if (status[i] == 503) ++refused;
    });
  for (auto& t : more) joiner.threads.push_back(&t);
  EXPECT_TRUE(wait_until([&] { return refused.load() >= kMore - 2; })) << refused.load() << " refused";
  EXPECT_EQ(refused.load(), kMore - 2);
  auto c = s.client();
  c.set_read_timeout(30, 0);  // a deadline: /health behind the engine would wait for the hang-up
  const int chunks_before = holder_chunks.load();
  auto h = c.Get("/health");
  ASSERT_TRUE(h) << "no answer to /health while the engine is busy";
  EXPECT_EQ(h->status, 200);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("spool_requests_waiting 2"), std::string::npos);
  EXPECT_NE(m->body.find("spool_requests_running 1"), std::string::npos);
  // Ordering: both answers came while the long generation was still streaming.
  EXPECT_FALSE(holder_done.load()) << "/health was answered only after the generation ended";
  EXPECT_TRUE(wait_until([&] { return holder_chunks.load() > chunks_before; })) << "the generation stopped streaming";
  EXPECT_FALSE(holder_done.load());
  hang_up = true;
  holder.join();
  for (auto& t : more) t.join();
  int ok = 0;
  for (int i = 0; i < kMore; ++i) {
    if (status[i] == 200) ++ok;
    if (status[i] != 503) continue;
    auto j = nlohmann::json::parse(bodies[i], nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << bodies[i];
    EXPECT_EQ(j["error"]["type"], "server_error");
  }
  EXPECT_EQ(ok, 2);
}

TEST(HttpApi, DisconnectCancelsAndTheNextRequestRuns) {
  Running s;
  // A raw socket client that reads the first SSE bytes of a long generation and hangs up.
  {
    httplib::Client c("127.0.0.1", s.port);
    c.set_read_timeout(kReadTimeoutS, 0);
    int chunks = 0;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = R"({"prompt": "The sea", "max_tokens": 200, "temperature": 0.9, "seed": 3, "stream": true})";
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
    auto r = c.send(req);
    EXPECT_GE(chunks, 3);
  }
  // The cancelled generation stops well before 200 tokens and the engine serves the next one.
  auto c = s.client();
  auto r = c.Post("/v1/completions", R"({"prompt": "The sea", "max_tokens": 3, "temperature": 0})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  auto m = c.Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("spool_generations_cancelled_total 1"), std::string::npos) << m->body.substr(0, 2000);
  const size_t at = m->body.find("\nspool_generated_tokens_total ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_LT(std::stod(m->body.substr(at + 30)), 200.0);
}

// --parallel 4: six clients at once (streamed and not) get what each got alone, one after the
// other; /metrics shows the slots and the batched steps. Every wait has a deadline (the
// clients' read timeout); nothing is timed.
TEST(HttpApi, ConcurrentClientsGetTheOutputsOfSequentialRuns) {
  HttpOptions ho;
  ho.parallel = 4;
  ho.max_waiting = 4;
  ho.threads = 16;
  Running s("", true, ho);
  const std::vector<std::string> prompts = {"The sea", "Whales are the largest animals that ever lived, and", "Once upon a time",
                                            "Call me Ishmael. Some years ago", "The captain said", "A list: 1, 2, 3,"};
  auto body = [&](size_t i) {
    return nlohmann::json{{"prompt", prompts[i]}, {"max_tokens", 8 + static_cast<int>(i)}, {"temperature", 0}, {"stream", i % 2 == 1},
                          {"logit_bias", s.no_eos}}
        .dump();
  };
  // The text of a response: the JSON's choices[0].text, or the concatenated SSE deltas.
  auto text_of = [](const std::string& raw, bool stream) {
    if (!stream) {
      auto j = nlohmann::json::parse(raw, nullptr, false);
      return j.is_object() && j.contains("choices") ? j["choices"][0]["text"].get<std::string>() : std::string("<bad: ") + raw + ">";
    }
    std::string out;
    std::istringstream in(raw);
    for (std::string line; std::getline(in, line);) {
      if (!line.starts_with("data: {")) continue;
      auto j = nlohmann::json::parse(line.substr(6), nullptr, false);
      if (j.contains("choices") && !j["choices"].empty()) out += j["choices"][0].value("text", "");
    }
    return out;
  };
  std::vector<std::string> alone(prompts.size()), together(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto c = s.client();
    auto r = c.Post("/v1/completions", body(i), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    alone[i] = text_of(r->body, i % 2 == 1);
    EXPECT_FALSE(alone[i].empty());
  }
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i)
    clients.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", s.port);
      c.set_read_timeout(kReadTimeoutS, 0);
      auto r = c.Post("/v1/completions", body(i), "application/json");
      together[i] = r && r->status == 200 ? text_of(r->body, i % 2 == 1) : "<failed>";
    });
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(together[i], alone[i]) << "request " << i;
  auto m = s.client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("\nspool_slots 4\n"), std::string::npos);
  EXPECT_NE(m->body.find("\nspool_requests_running 0\n"), std::string::npos);
  EXPECT_NE(m->body.find("spool_batch_step_tokens_bucket{le=\"+Inf\"}"), std::string::npos);
  EXPECT_NE(m->body.find("\nspool_generations_total 12\n"), std::string::npos);
  auto value = [&](const std::string& name) {
    const size_t at = m->body.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(m->body.substr(at + name.size() + 2));
  };
  EXPECT_GT(value("spool_batch_steps_total"), 0);
  EXPECT_GT(value("spool_batch_step_sequences_total"), value("spool_batch_steps_total"));  // some steps ran several sequences
  EXPECT_GT(value("spool_expert_acquisitions_saved_total"), 0);
}

TEST(Robustness, ThousandMalformedRequestsLeaveTheServerUp) {
  Running s;
  auto c = s.client();
  std::mt19937 rng(12345);
  const std::vector<std::string> bodies = {
      "", "{", "}", "[]", "null", "42", "\"str\"", "{\"messages\": null}", "{\"messages\": {}}", "{\"messages\": [null]}",
      "{\"messages\": [{\"role\": 1}]}", "{\"messages\": [{\"role\": \"user\", \"content\": {\"a\": 1}}]}",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": -1}",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 1e400}",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stop\": [[]]}",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"function\": {\"name\": 5}}]}",
      "{\"prompt\": [[1]]}", "{\"prompt\": [1.5]}", "{\"tokens\": \"abc\"}", "{\"content\": null}",
      std::string("{\"messages\": \"\xff\xfe\"}"), std::string("{\"a\": \"\0\"}", 10), std::string(10000, '['),
      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": []}",
  };
  const std::vector<std::string> paths = {"/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize", "/apply-template"};
  int n = 0;
  for (int i = 0; i < 1000; ++i) {
    std::string body = bodies[rng() % bodies.size()];
    if (i % 3 == 0 && !body.empty()) {  // random byte damage
      for (int k = 0; k < 3; ++k) body[rng() % body.size()] = static_cast<char>(rng());
    }
    const std::string& path = paths[rng() % paths.size()];
    auto r = c.Post(path, body, "application/json");
    ASSERT_TRUE(r) << "request " << i << " got no response";
    ++n;
    if (r->status == 200 && path == "/apply-template") {  // it ignores the sampling fields
      EXPECT_TRUE(body_json(r).contains("prompt"));
      continue;
    }
    ASSERT_GE(r->status, 400) << path << " " << body;
    ASSERT_LT(r->status, 500) << path << " " << body << " -> " << r->body;
    auto j = body_json(r);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
  }
  EXPECT_EQ(n, 1000);
  // Deep nesting inside a message field (once a stack overflow when the value was copied) and
  // a very wide object (once seconds of ordered_json key scans): 400 from the parser's limits.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  for (const std::string& path : paths) {
    const std::string body = "{\"messages\": [{\"role\": \"user\", \"content\": " + deep + "}], \"content\": " + deep + "}";
    auto r = c.Post(path, body, "application/json");
    ASSERT_TRUE(r) << path << ": no response to deep nesting";
    EXPECT_EQ(r->status, 400) << path;
    EXPECT_NE(r->body.find("deeper than"), std::string::npos) << r->body;
  }
  std::string wide = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"x\": {";
  for (int i = 0; i < 100000; ++i) wide += (i ? ",\"k" : "\"k") + std::to_string(i) + "\": 0";
  wide += "}}";
  // Refused by the key limit while parsing (before the object is built), not by a later check.
  auto w = c.Post("/v1/chat/completions", wide, "application/json");
  ASSERT_TRUE(w);
  EXPECT_EQ(w->status, 400) << w->body;
  EXPECT_NE(w->body.find("more than " + std::to_string(kMaxJsonKeys) + " keys"), std::string::npos) << w->body.substr(0, 300);
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto ok = c.Post("/v1/chat/completions", std::string(kChat) + "}", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

}  // namespace
}  // namespace spool::server
