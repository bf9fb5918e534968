// Per-request LoRA adapters in `spool serve` (server/lora_adapters.h) with the demo model's
// trained adapter (tests/data/lora/spool-demo-moe-dev: PEFT's greedy ids with and without it):
// - the batch engine runs a request with `lora: [{"id": 0, "scale": 1}]` and one without in the
//   same steps, each giving its golden greedy ids; requests for the same prompt one after the
//   other under other adapters never reuse each other's prefix (memory checkpoints and disk
//   snapshots are keyed by the adapters);
// - over HTTP: the `lora` field on /v1/completions, /v1/chat/completions, /v1/responses and
//   /v1/messages, a `model` naming an adapter, /v1/models listing the adapters, GET / POST
//   /lora-adapters, and bad `lora` fields answered 400 in each API's error shape.
#include <httplib.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include "engine/loader.h"
#include "server/batch_engine.h"
#include "server/http_server.h"
#include "server/json_body.h"
#include "server/serving_engine.h"
#include "support/golden.h"
#include "support/load.h"

namespace spool::server {
namespace {

constexpr int kWaitMs = 600000;  // deadline of one wait (a hang fails, not a clock)
const std::string kAdapter = spool::testing::data_dir() + "/lora/spool-demo-moe-dev";

nlohmann::json golden(const char* file) {
  std::ifstream f(kAdapter + "/" + file);
  return nlohmann::json::parse(f);
}

// The demo model with the adapter twice: id 0 "spool-demo-moe-dev" and id 1
// "spool-demo-moe-dev-2" (same weights), both at default scale 0 (--lora-init-without-apply).
std::unique_ptr<ServingEngine> lora_engine(int parallel, int64_t step, const std::string& disk_dir = "", engine::SpecParams spec = {},
                                           bool adapters = true) {
  engine::LoadOptions o = spool::testing::test_load_options(SPOOL_DEFAULT_MODEL_DIR, /*stream=*/false);
  o.mtp = spec.mtp;
  o.parallel = std::max(parallel, 1);
  o.prefill_step = step;
  if (adapters) o.lora = {{kAdapter, 0.0f}, {kAdapter + "/adapter_model.safetensors", 0.0f}};
  EngineOptions eo;
  eo.model_name = "demo";
  eo.ctx_size = 256;
  eo.prefill_step = step;
  eo.parallel = parallel;
  eo.disk_cache_dir = disk_dir;
  eo.spec = spec;
  return make_serving_engine(engine::load(o), eo);
}

// A greedy completion request of golden prompt `p` (48 tokens, no stop ids) with `body`'s lora /
// model fields, parsed as /v1/completions parses it.
std::shared_ptr<const GenRequest> golden_request(const ServingEngine& e, int p, nlohmann::ordered_json body) {
  const nlohmann::json g = golden("golden_prompts_base.json");
  body["prompt"] = g[p]["prompt_ids"];
  body["max_tokens"] = 48;
  body["temperature"] = 0;
  body["logprobs"] = 1;
  GenRequest r = parse_completion_request(body, e.facts, 1);
  r.stop_ids.clear();  // PEFT's goldens ran 48 tokens
  return std::make_shared<const GenRequest>(std::move(r));
}

std::vector<int32_t> run(const std::shared_ptr<GenTicket>& t) {
  std::vector<int32_t> ids;
  for (;;) {
    GenMessage m;
    if (!t->next(m, kWaitMs)) {
      ADD_FAILURE() << "no message within the deadline";
      return ids;
    }
    if (m.kind == GenMessage::kFailed) {
      ADD_FAILURE() << "failed: " << m.error;
      return ids;
    }
    if (m.kind == GenMessage::kDone) {
      for (const TokenLogprob& l : m.result.logprobs) ids.push_back(l.id);
      return ids;
    }
  }
}

std::vector<int32_t> golden_ids(const char* file, int p) { return golden(file)[p]["greedy_ids"].get<std::vector<int32_t>>(); }

// Two requests at once, one with the adapter and one without: the same steps run both (the
// step counters say so), and each gets its golden ids.
TEST(ServerLora, OneBatchServesTheAdapterAndTheBase) {
  auto e = lora_engine(/*parallel=*/2, /*step=*/512);
  nlohmann::ordered_json with;
  with["lora"] = nlohmann::ordered_json::array({{{"id", 0}, {"scale", 1}}});
  for (int p = 0; p < 3; ++p) {
    const BatchStats before = e->batch->stats();
    auto a = e->batch->submit(golden_request(*e, p, with), false);
    auto b = e->batch->submit(golden_request(*e, p, nlohmann::ordered_json::object()), false);
    EXPECT_EQ(run(a), golden_ids("golden_prompts_lora.json", p)) << "prompt " << p << " with the adapter";
    EXPECT_EQ(run(b), golden_ids("golden_prompts_base.json", p)) << "prompt " << p << " without it";
    const BatchStats after = e->batch->stats();
    EXPECT_GT(after.step_seqs - before.step_seqs, after.steps - before.steps) << "some steps ran both sequences";
  }
  // Adapter 1 (the same weights) at 0.5 plus adapter 0 at 0.5 is the whole adapter again.
  nlohmann::ordered_json halves;
  halves["lora"] = nlohmann::ordered_json::array({{{"id", 0}, {"scale", 0.5}}, {{"id", 1}, {"scale", 0.5}}});
  auto h = e->batch->submit(golden_request(*e, 1, halves), false);
  auto n = e->batch->submit(golden_request(*e, 2, nlohmann::ordered_json::object()), false);
  EXPECT_EQ(run(h), golden_ids("golden_prompts_lora.json", 1));
  EXPECT_EQ(run(n), golden_ids("golden_prompts_base.json", 2));
}

// Speculative decoding (--spec mtp): the draft head and the verify rows run with each
// sequence's own adapters; the output is still each golden's.
TEST(ServerLora, SpeculativeDecodingKeepsEachRequestsAdapters) {
  engine::SpecParams spec;
  spec.mtp = true;
  spec.draft_max = 2;
  spec.min_acceptance = 0;
  auto e = lora_engine(/*parallel=*/2, /*step=*/512, "", spec);
  nlohmann::ordered_json with;
  with["lora"] = nlohmann::ordered_json::array({{{"id", 0}, {"scale", 1}}});
  const BatchStats before = e->batch->stats();
  for (int p = 0; p < 3; ++p) {
    auto a = e->batch->submit(golden_request(*e, p, with), false);
    auto b = e->batch->submit(golden_request(*e, p, nlohmann::ordered_json::object()), false);
    EXPECT_EQ(run(a), golden_ids("golden_prompts_lora.json", p)) << "prompt " << p << " with the adapter";
    EXPECT_EQ(run(b), golden_ids("golden_prompts_base.json", p)) << "prompt " << p << " without it";
  }
  const BatchStats after = e->batch->stats();
  EXPECT_GT(after.spec_accepted, before.spec_accepted);
}

// The Generator (one request at a time on the engine's own session) runs each request's
// adapters too, and its prompt cache (chunks of 4) does not hand one adapter's prefix to another.
TEST(ServerLora, GeneratorRunsEachRequestsAdapters) {
  auto e = lora_engine(/*parallel=*/0, /*step=*/4);
  nlohmann::ordered_json with;
  with["lora"] = nlohmann::ordered_json::array({{{"id", 1}, {"scale", 1}}});
  for (int p : {0, 2, 0}) {
    for (bool on : {true, false}) {
      const GenResult r = e->gen->run(*golden_request(*e, p, on ? with : nlohmann::ordered_json::object()), {}, {});
      std::vector<int32_t> ids;
      for (const TokenLogprob& l : r.logprobs) ids.push_back(l.id);
      EXPECT_EQ(ids, golden_ids(on ? "golden_prompts_lora.json" : "golden_prompts_base.json", p)) << "prompt " << p << (on ? " with" : " without");
    }
  }
}

// One slot, chunks of 4 (checkpoints at 4 and 8 of the 10- and 12-token prompts) and a disk
// cache: the same prompt with the adapter, without, with it again, then (a new engine on the
// same disk cache) without and with: each gives its golden ids, so no prefix computed under
// other adapters was reused; the same adapter's prefix is.
TEST(ServerLora, PrefixReuseIsKeyedByTheAdapters) {
  const std::string dir = ::testing::TempDir() + "/server_lora_disk";
  std::filesystem::remove_all(dir);
  nlohmann::ordered_json with;
  with["lora"] = nlohmann::ordered_json::array({{{"id", 0}, {"scale", 1}}});
  const nlohmann::ordered_json none = nlohmann::ordered_json::object();
  for (int round = 0; round < 2; ++round) {
    auto e = lora_engine(/*parallel=*/1, /*step=*/4, dir);
    for (int p : {0, 2}) {
      const bool first = round == 0;
      auto t1 = e->batch->submit(golden_request(*e, p, first ? with : none), false);
      EXPECT_EQ(run(t1), golden_ids(first ? "golden_prompts_lora.json" : "golden_prompts_base.json", p)) << round << " " << p;
      auto t2 = e->batch->submit(golden_request(*e, p, first ? none : with), false);
      EXPECT_EQ(run(t2), golden_ids(first ? "golden_prompts_base.json" : "golden_prompts_lora.json", p)) << round << " " << p;
    }
  }
  // The same adapters reuse: a third run of prompt 0 with the adapter loads its disk snapshot.
  auto e = lora_engine(1, 4, dir);
  const uint64_t hits = e->disk->stats().hits;
  auto t = e->batch->submit(golden_request(*e, 0, with), false);
  EXPECT_EQ(run(t), golden_ids("golden_prompts_lora.json", 0));
  EXPECT_GT(e->disk->stats().hits, hits);
}

// ---- HTTP ----

struct Running {
  explicit Running(bool adapters = true) {
    HttpOptions ho;
    ho.port = 0;
    ho.parallel = 2;
    server = std::make_unique<HttpServer>(ho);
    port = server->bind();
    thread = std::thread([this] { server->listen(); });
    server->set_engine(lora_engine(2, 512, "", {}, adapters));
  }
  ~Running() {
    server->stop();
    thread.join();
  }
  httplib::Result post(const std::string& path, const nlohmann::ordered_json& body) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(kWaitMs / 1000, 0);
    return c.Post(path, body.dump(), "application/json");
  }
  httplib::Result get(const std::string& path) const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(kWaitMs / 1000, 0);
    return c.Get(path);
  }
  std::unique_ptr<HttpServer> server;
  int port = 0;
  std::thread thread;
};

nlohmann::json parsed(const httplib::Result& r) {
  EXPECT_TRUE(r);
  return r ? nlohmann::json::parse(r->body, nullptr, false) : nlohmann::json();
}

std::string text_of(const nlohmann::json& completion) { return completion["choices"][0]["text"].get<std::string>(); }

// The completion text of golden prompt p (16 greedy tokens) with `extra` fields.
std::string completion_text(const Running& s, int p, nlohmann::ordered_json extra) {
  extra["prompt"] = golden("golden_prompts_base.json")[p]["prompt_ids"];
  extra["max_tokens"] = 16;
  extra["temperature"] = 0;
  const httplib::Result r = s.post("/v1/completions", extra);
  EXPECT_TRUE(r);
  if (!r) return "";
  EXPECT_EQ(r->status, 200) << r->body;
  return text_of(nlohmann::json::parse(r->body));
}

// The detokenized first 16 golden ids.
std::string golden_text(const Running& s, const char* file, int p) {
  std::vector<int32_t> ids = golden_ids(file, p);
  ids.resize(16);
  return parsed(s.post("/detokenize", {{"tokens", ids}}))["content"].get<std::string>();
}

nlohmann::ordered_json lora_field(int id, double scale) {
  return nlohmann::ordered_json::array({{{"id", id}, {"scale", scale}}});
}

TEST(ServerLoraHttp, CompletionsChooseAdaptersPerRequest) {
  Running s;
  const std::string with = golden_text(s, "golden_prompts_lora.json", 0), base = golden_text(s, "golden_prompts_base.json", 0);
  ASSERT_NE(with, base);
  EXPECT_EQ(completion_text(s, 0, {{"lora", lora_field(0, 1)}}), with);
  EXPECT_EQ(completion_text(s, 0, {{"lora", lora_field(1, 1)}}), with);  // the copy, by id
  EXPECT_EQ(completion_text(s, 0, {}), base);                            // the defaults: 0
  EXPECT_EQ(completion_text(s, 0, {{"lora", nlohmann::ordered_json::array()}}), base);
  EXPECT_EQ(completion_text(s, 0, {{"model", "spool-demo-moe-dev"}}), with);  // a model naming an adapter
  EXPECT_EQ(completion_text(s, 0, {{"model", "spool-demo-moe-dev-2"}}), with);
  EXPECT_EQ(completion_text(s, 0, {{"model", "demo"}}), base);
  // The field wins over the model.
  EXPECT_EQ(completion_text(s, 0, {{"model", "spool-demo-moe-dev"}, {"lora", nlohmann::ordered_json::array()}}), base);
}

TEST(ServerLoraHttp, LoraAdaptersEndpointsSetTheDefaults) {
  Running s;
  const nlohmann::json list = parsed(s.get("/lora-adapters"));
  ASSERT_EQ(list.size(), 2u) << list.dump();
  EXPECT_EQ(list[0]["id"], 0);
  EXPECT_EQ(list[0]["path"], kAdapter);
  EXPECT_EQ(list[0]["scale"], 0.0);
  EXPECT_EQ(list[1]["id"], 1);
  EXPECT_EQ(list[1]["path"], kAdapter + "/adapter_model.safetensors");
  const std::string with = golden_text(s, "golden_prompts_lora.json", 2), base = golden_text(s, "golden_prompts_base.json", 2);
  EXPECT_EQ(completion_text(s, 2, {}), base);
  const httplib::Result set = s.post("/lora-adapters", nlohmann::ordered_json::array({{{"id", 1}, {"scale", 1}}}));
  ASSERT_TRUE(set);
  EXPECT_EQ(set->status, 200) << set->body;
  EXPECT_EQ(parsed(set)["success"], true);
  const nlohmann::json now = parsed(s.get("/lora-adapters"));
  EXPECT_EQ(now[0]["scale"], 0.0);
  EXPECT_EQ(now[1]["scale"], 1.0);
  EXPECT_EQ(completion_text(s, 2, {}), with);  // requests without a lora field take the new defaults
  EXPECT_EQ(completion_text(s, 2, {{"lora", lora_field(0, 0)}}), base);
  // Bad bodies: 400 (OpenAI error object), the defaults unchanged.
  for (const char* bad : {R"({"id": 0, "scale": 1})", R"([{"id": 2, "scale": 1}])", R"([{"id": "0", "scale": 1}])",
                          R"([{"id": 0, "scale": "1"}])", R"([3])", "[{"}) {
    httplib::Client c("127.0.0.1", s.port);
    const httplib::Result r = c.Post("/lora-adapters", bad, "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << bad << ": " << r->body;
    const nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r->body;
  }
  {  // nested past the limit every request body has (json_body.h kMaxJsonDepth): refused while parsing
    httplib::Client c("127.0.0.1", s.port);
    const httplib::Result r = c.Post("/lora-adapters", std::string(200, '[') + std::string(200, ']'), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_NE(r->body.find("deeper than"), std::string::npos) << r->body;
  }
  EXPECT_EQ(parsed(s.get("/lora-adapters"))[1]["scale"], 1.0);
}

TEST(ServerLoraHttp, ModelsListTheAdapters) {
  Running s;
  const nlohmann::json m = parsed(s.get("/v1/models"));
  ASSERT_EQ(m["data"].size(), 3u) << m.dump();
  EXPECT_EQ(m["data"][0]["id"], "demo");
  EXPECT_EQ(m["data"][1]["id"], "spool-demo-moe-dev");
  EXPECT_EQ(m["data"][2]["id"], "spool-demo-moe-dev-2");
  EXPECT_EQ(m["data"][1]["parent"], "demo");
  const httplib::Result one = s.get("/v1/models/spool-demo-moe-dev-2");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->status, 200);
  EXPECT_EQ(parsed(one)["id"], "spool-demo-moe-dev-2");
  const httplib::Result none = s.get("/v1/models/no-such-adapter");
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 404);
}

// Chat completions, the Responses API and Anthropic messages with the same conversation: the
// adapter (by `lora` or by `model`) gives one text on all three, without it another.
TEST(ServerLoraHttp, ChatResponsesAndMessagesTakeTheLoraField) {
  Running s;
  const nlohmann::ordered_json msgs = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "The state of the Union is"}}});
  auto chat = [&](nlohmann::ordered_json extra) {
    extra["messages"] = msgs;
    extra["max_tokens"] = 12;
    extra["temperature"] = 0;
    const httplib::Result r = s.post("/v1/chat/completions", extra);
    EXPECT_EQ(r->status, 200) << r->body;
    return parsed(r)["choices"][0]["message"]["content"].get<std::string>();
  };
  auto messages = [&](nlohmann::ordered_json extra) {
    extra["messages"] = msgs;
    extra["max_tokens"] = 12;
    extra["temperature"] = 0;
    if (!extra.contains("model")) extra["model"] = "demo";
    const httplib::Result r = s.post("/v1/messages", extra);
    EXPECT_EQ(r->status, 200) << r->body;
    return parsed(r)["content"][0]["text"].get<std::string>();
  };
  auto responses = [&](nlohmann::ordered_json extra) {
    extra["input"] = "The state of the Union is";
    extra["max_output_tokens"] = 12;
    extra["temperature"] = 0;
    const httplib::Result r = s.post("/v1/responses", extra);
    EXPECT_EQ(r->status, 200) << r->body;
    const nlohmann::json j = parsed(r);
    for (const auto& item : j["output"])
      if (item["type"] == "message") return item["content"][0]["text"].get<std::string>();
    return std::string();
  };
  const std::string base = chat({});
  const std::string with = chat({{"lora", lora_field(0, 1)}});
  EXPECT_NE(with, base) << "the adapter changes the answer";
  EXPECT_EQ(chat({{"model", "spool-demo-moe-dev"}}), with);
  EXPECT_EQ(messages({{"lora", lora_field(0, 1)}}), with);
  EXPECT_EQ(messages({{"model", "spool-demo-moe-dev-2"}}), with);
  EXPECT_EQ(messages({}), base);
  EXPECT_EQ(responses({{"lora", lora_field(1, 1)}}), with);
  EXPECT_EQ(responses({}), base);
}

// A bad `lora` field: 400 in each API's error shape, naming the field.
TEST(ServerLoraHttp, BadLoraFieldIs400InEachApisShape) {
  Running s;
  const std::vector<nlohmann::ordered_json> bad = {
      lora_field(2, 1),                                                   // no adapter 2
      lora_field(-1, 1),                                                  // negative id
      nlohmann::ordered_json::array({{{"id", 0}, {"scale", "high"}}}),    // non-numeric scale
      nlohmann::ordered_json::array({{{"id", 0}, {"scale", 1e39}}}),       // beyond float: would run at inf
      nlohmann::ordered_json::array({{{"id", "0"}, {"scale", 1}}}),       // id not an integer
      nlohmann::ordered_json::array({{{"id", 0.5}, {"scale", 1}}}),       // id not an integer
      nlohmann::ordered_json({{"id", 0}, {"scale", 1}}),                  // not an array
      nlohmann::ordered_json::array({1}),                                 // entry not an object
      "spool-demo-moe-dev"};
  const nlohmann::ordered_json msgs = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "Hi"}}});
  for (const nlohmann::ordered_json& b : bad) {
    const std::string what = b.dump();
    for (const char* path : {"/v1/chat/completions", "/v1/completions", "/v1/responses"}) {
      nlohmann::ordered_json body = {{"lora", b}, {"max_tokens", 2}};
      if (std::string(path) == "/v1/chat/completions") body["messages"] = msgs;
      if (std::string(path) == "/v1/completions") body["prompt"] = "Hi";
      if (std::string(path) == "/v1/responses") body = {{"lora", b}, {"input", "Hi"}};
      const httplib::Result r = s.post(path, body);
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 400) << path << " " << what << ": " << r->body;
      const nlohmann::json j = parsed(r);
      EXPECT_EQ(j["error"]["type"], "invalid_request_error") << path << " " << what << ": " << r->body;
      EXPECT_EQ(j["error"]["param"], "lora") << path << " " << what << ": " << r->body;
    }
    const httplib::Result r = s.post("/v1/messages", {{"model", "demo"}, {"messages", msgs}, {"max_tokens", 2}, {"lora", b}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << what << ": " << r->body;
    const nlohmann::json j = parsed(r);
    EXPECT_EQ(j["type"], "error") << r->body;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << r->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find("lora"), std::string::npos) << r->body;
  }
}

// A server without adapters: GET /lora-adapters is empty, `lora: []` is accepted, any id is a
// 400 saying so, and POST /lora-adapters takes only the empty list.
TEST(ServerLoraHttp, WithoutAdaptersTheFieldNamesNone) {
  Running s(/*adapters=*/false);
  EXPECT_EQ(parsed(s.get("/lora-adapters")), nlohmann::json::array());
  EXPECT_EQ(parsed(s.get("/v1/models"))["data"].size(), 1u);
  const nlohmann::ordered_json prompt = {{"prompt", "Hi"}, {"max_tokens", 2}};
  nlohmann::ordered_json empty = prompt, one = prompt;
  empty["lora"] = nlohmann::ordered_json::array();
  one["lora"] = lora_field(0, 1);
  const httplib::Result ok = s.post("/v1/completions", empty);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  const httplib::Result bad = s.post("/v1/completions", one);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400) << bad->body;
  EXPECT_NE(bad->body.find("no LoRA adapters"), std::string::npos) << bad->body;
  const httplib::Result set0 = s.post("/lora-adapters", nlohmann::ordered_json::array());
  ASSERT_TRUE(set0);
  EXPECT_EQ(set0->status, 200) << set0->body;
  const httplib::Result set1 = s.post("/lora-adapters", lora_field(0, 1));
  ASSERT_TRUE(set1);
  EXPECT_EQ(set1->status, 400) << set1->body;
}

}  // namespace
}  // namespace spool::server
