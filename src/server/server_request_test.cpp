// Request parsing and validation of the HTTP API: bad bodies, wrong types, template
// rendering, sampling fields, limits. Every bad input must be a 400 ApiError naming the field.
#include <gtest/gtest.h>

#include "common/files.h"
#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/json_body.h"
#include "server/request.h"

namespace spool::server {
namespace {

struct Fixture {
  tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(SPOOL_DEFAULT_MODEL_DIR);
  tmpl::Template t = tmpl::Template::parse(tok.chat_template(), "demo");
  ModelFacts facts;
  Fixture() {
    facts.name = "demo";
    facts.tok = &tok;
    facts.chat.tmpl = &t;
    facts.chat.special_tokens = tmpl::special_tokens_from_config(nlohmann::ordered_json(tok.config()));
    facts.chat.tool_syntax = detect_tool_syntax(tok.chat_template());
    facts.defaults.temperature = 0.7f;
    facts.ctx_size = 64;
    facts.vocab_size = tok.vocab_size();
    facts.stop_ids = {0};
  }
};

json chat(const std::string& extra = "") {
  return json::parse(R"({"model": "x", "messages": [{"role": "user", "content": "Hello"}])" + extra + "}");
}

// Status and param of the ApiError `f` throws (0 / "" when it does not throw).
template <class F>
std::pair<int, std::string> error_of(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    return {e.status, e.param};
  }
  return {0, ""};
}

TEST(ServerRequest, BadBodies) {
  EXPECT_EQ(error_of([] { parse_body(""); }).first, 400);
  EXPECT_EQ(error_of([] { parse_body("{"); }).first, 400);
  EXPECT_EQ(error_of([] { parse_body("[1, 2]"); }).first, 400);
  EXPECT_EQ(error_of([] { parse_body("{\"a\": \"\xff\"}"); }).first, 400);
  EXPECT_EQ(error_of([] { parse_body(std::string("{}\0{", 4)); }).first, 400);
  EXPECT_EQ(error_of([] { parse_body("{\"a\": 1} trailing"); }).first, 400);
  EXPECT_EQ(parse_body(" {\"a\": 1} ")["a"], 1);
}

TEST(ServerRequest, NestingAndKeysAreBounded) {
  // kMaxJsonDepth levels of arrays and objects (the body object is the first) are accepted.
  auto nested = [](int levels) {
    return "{\"a\": " + std::string(levels - 1, '[') + std::string(levels - 1, ']') + "}";
  };
  EXPECT_NO_THROW(parse_body(nested(kMaxJsonDepth)));
  EXPECT_EQ(error_of([&] { parse_body(nested(kMaxJsonDepth + 1)); }).first, 400);
  EXPECT_EQ(error_of([] { parse_body("{\"a\": " + std::string(200000, '[') + std::string(200000, ']') + "}"); }).first, 400);
  EXPECT_EQ(error_of([] { parse_body(std::string(200000, '[')); }).first, 400);
  auto wide = [](size_t keys) {
    std::string b = "{\"o\": {";
    for (size_t i = 0; i < keys; ++i) b += (i ? ",\"k" : "\"k") + std::to_string(i) + "\": [{}]";
    return b + "}}";
  };
  EXPECT_EQ(parse_body(wide(kMaxJsonKeys))["o"].size(), kMaxJsonKeys);
  EXPECT_EQ(error_of([&] { parse_body(wide(kMaxJsonKeys + 1)); }).first, 400);
}

TEST(ServerRequest, LogitBiasAndLargeSeeds) {
  Fixture f;
  for (const char* extra : {R"(, "logit_bias": [1])", R"(, "logit_bias": {"x": 1})", R"(, "logit_bias": {"-1": 1})",
                            R"(, "logit_bias": {"1.5": 1})", R"(, "logit_bias": {" 1": 1})", R"(, "logit_bias": {"99999999": 1})",
                            R"(, "logit_bias": {"1": 100.5})", R"(, "logit_bias": {"1": "5"})", R"(, "logit_bias": {"1": 1, "01": 2})",
                            // above INT64_MAX: once read as -1 (is_number_integer() holds for unsigned values too)
                            R"(, "seed": 18446744073709551615)", R"(, "seed": 9223372036854775808)"}) {
    auto [status, param] = error_of([&] { parse_chat_request(chat(extra), f.facts, 1); });
    EXPECT_EQ(status, 400) << extra;
    EXPECT_TRUE(param == "logit_bias" || param == "seed") << extra << " " << param;
  }
  GenRequest r = parse_chat_request(chat(R"(, "logit_bias": {"7": -100, "3": 2.5}, "seed": 9223372036854775807)"), f.facts, 1);
  ASSERT_EQ(r.logit_bias.size(), 2u);
  EXPECT_EQ(r.logit_bias[0], std::make_pair(int32_t{3}, 2.5f));
  EXPECT_EQ(r.logit_bias[1], std::make_pair(int32_t{7}, -100.0f));
  EXPECT_EQ(r.sampling.seed, 9223372036854775807ull);
  EXPECT_EQ(parse_chat_request(chat(R"(, "seed": -1)"), f.facts, 1).sampling.seed, ~0ull);
}

TEST(ServerRequest, MessagesValidation) {
  Fixture f;
  auto err = [&](const std::string& body) { return error_of([&] { parse_chat_request(json::parse(body), f.facts, 1); }); };
  EXPECT_EQ(err(R"({"model": "x"})"), std::make_pair(400, std::string("messages")));
  EXPECT_EQ(err(R"({"messages": "hi"})"), std::make_pair(400, std::string("messages")));
  EXPECT_EQ(err(R"({"messages": []})"), std::make_pair(400, std::string("messages")));
  EXPECT_EQ(err(R"({"messages": [1]})"), std::make_pair(400, std::string("messages[0]")));
  EXPECT_EQ(err(R"({"messages": [{"content": "x"}]})"), std::make_pair(400, std::string("messages[0].role")));
  EXPECT_EQ(err(R"({"messages": [{"role": "wizard", "content": "x"}]})"), std::make_pair(400, std::string("messages[0].role")));
  EXPECT_EQ(err(R"({"messages": [{"role": "user", "content": 5}]})"), std::make_pair(400, std::string("messages[0].content")));
  EXPECT_EQ(err(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})").first, 400);
  EXPECT_EQ(err(R"({"messages": [{"role": "assistant", "content": "", "tool_calls": {}}]})").second, "messages[0].tool_calls");
  EXPECT_EQ(err(R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})").second, "tools");
  EXPECT_EQ(err(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})").second, "tools[0].function");
  EXPECT_EQ(err(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})").second, "tool_choice");
  EXPECT_EQ(err(R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 3})").second, "chat_template_kwargs");
  EXPECT_EQ(err(R"({"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ x }}"})").second, "chat_template");
}

TEST(ServerRequest, MessageNeedsContentOrToolCalls) {
  Fixture f;
  auto err = [&](const std::string& body) { return error_of([&] { parse_chat_request(json::parse(body), f.facts, 1); }); };
  // Neither content nor tool_calls: a 400 naming the message, not an empty turn.
  for (const char* m : {R"({"role": "user"})", R"({"role": "user", "content": null})", R"({"role": "assistant"})",
                        R"({"role": "assistant", "content": null, "tool_calls": []})", R"({"role": "tool", "tool_call_id": "c1"})",
                        R"({"role": "system", "content": null, "tool_calls": null})"})
    EXPECT_EQ(err(std::string(R"({"messages": [{"role": "user", "content": "hi"}, )") + m + "]}"),
              std::make_pair(400, std::string("messages[1].content")))
        << m;
  // The error reaches the client as an OpenAI error object.
  try {
    parse_chat_request(json::parse(R"({"messages": [{"role": "user"}]})"), f.facts, 1);
    FAIL() << "expected an ApiError";
  } catch (const ApiError& e) {
    const auto j = error_json(e);
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["param"], "messages[0].content");
    EXPECT_NE(j["error"]["message"].get<std::string>().find("neither 'content' nor 'tool_calls'"), std::string::npos) << j.dump();
  }
  // Assistant tool-call turns with null or missing content stay valid; empty text is content.
  for (const char* content : {R"("content": null, )", "", R"("content": "", )"}) {
    const std::string body = std::string(R"({"messages": [{"role": "user", "content": "Weather?"}, {"role": "assistant", )") + content +
                             R"("tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]})";
    EXPECT_EQ(err(body).first, 0) << body;
  }
  EXPECT_EQ(err(R"({"messages": [{"role": "user", "content": ""}]})").first, 0);
}

TEST(ServerRequest, SamplingFieldsAreTypedAndRanged) {
  Fixture f;
  for (const char* extra : {R"(, "temperature": "hot")", R"(, "temperature": -1)", R"(, "top_p": 0)", R"(, "top_p": 1.5)",
                            R"(, "top_k": 1.5)", R"(, "min_p": 2)", R"(, "presence_penalty": 3)", R"(, "frequency_penalty": "x")",
                            R"(, "seed": "s")", R"(, "max_tokens": 0)", R"(, "max_tokens": -5)", R"(, "max_completion_tokens": "9")",
                            R"(, "stop": 5)", R"(, "stop": [""])", R"(, "stop": ["a", 1])", R"(, "n": 2)", R"(, "stream": "yes")",
                            R"(, "stream_options": 1)", R"(, "logprobs": 1)", R"(, "top_logprobs": 3)", R"(, "top_logprobs": 21, "logprobs": true)",
                            R"(, "response_format": {"type": "xml"})", R"(, "response_format": 5)", R"(, "repetition_penalty": 0)"}) {
    auto [status, param] = error_of([&] { parse_chat_request(chat(extra), f.facts, 1); });
    EXPECT_EQ(status, 400) << extra;
  }
  GenRequest r = parse_chat_request(chat(R"(, "temperature": 0.2, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "presence_penalty": 1,
      "frequency_penalty": -1, "seed": 42, "stop": "END", "stream": true, "stream_options": {"include_usage": true},
      "logprobs": true, "top_logprobs": 2, "max_tokens": 5)"),
                                    f.facts, 1);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.2f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 1.0f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -1.0f);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_TRUE(r.seeded);
  EXPECT_EQ(r.parser.stop, std::vector<std::string>{"END"});
  EXPECT_TRUE(r.stream && r.include_usage && r.logprobs);
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_EQ(r.max_tokens, 5);
  // Defaults come from the model (generation_config.json).
  EXPECT_FLOAT_EQ(parse_chat_request(chat(), f.facts, 1).sampling.temperature, 0.7f);
}

TEST(ServerRequest, ContextLimits) {
  Fixture f;
  GenRequest r = parse_chat_request(chat(R"(, "max_tokens": 100000)"), f.facts, 1);
  EXPECT_EQ(static_cast<int64_t>(r.prompt.size()) + r.max_tokens, f.facts.ctx_size);  // capped by the context
  json long_prompt = chat();
  long_prompt["messages"][0]["content"] = std::string(400, 'a') + " b c d e f g h i j k l m n o p q r s t u v w x y z";
  auto [status, param] = error_of([&] { parse_chat_request(long_prompt, f.facts, 1); });
  EXPECT_EQ(status, 400);
  EXPECT_EQ(param, "messages");
  // Completions: ids outside the vocabulary, wrong types, unsupported options.
  auto cerr = [&](const std::string& body) { return error_of([&] { parse_completion_request(json::parse(body), f.facts, 1); }).first; };
  EXPECT_EQ(cerr(R"({"prompt": [1, -1]})"), 400);
  EXPECT_EQ(cerr(R"({"prompt": [1, 99999999]})"), 400);
  EXPECT_EQ(cerr(R"({"prompt": {"a": 1}})"), 400);
  EXPECT_EQ(cerr(R"({"prompt": ""})"), 400);
  EXPECT_EQ(cerr(R"({})"), 400);
  EXPECT_EQ(cerr(R"({"prompt": "x", "echo": true})"), 400);
  EXPECT_EQ(cerr(R"({"prompt": "x", "logprobs": 9})"), 400);
  GenRequest c = parse_completion_request(json::parse(R"({"prompt": [5, 6, 7], "max_tokens": 3, "logprobs": 2})"), f.facts, 1);
  EXPECT_EQ(c.prompt, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_TRUE(c.logprobs);
  EXPECT_EQ(c.top_logprobs, 2);
  EXPECT_EQ(c.parser.syntax, ToolSyntax::kNone);
}

// A text prompt of /v1/completions is encoded with the tokenizer's special tokens, as HF's
// tokenizer(text), vLLM and llama-server do: DeepSeek-V3's BOS (id 0) first; Qwen adds nothing.
TEST(ServerRequest, CompletionTextPromptGetsTheTokenizersBos) {
  Fixture f;
  const json body = json::parse(R"({"prompt": "Hello world", "max_tokens": 1})");
  EXPECT_EQ(parse_completion_request(body, f.facts, 1).prompt, f.tok.encode("Hello world", false));
  const tokenizer::Tokenizer ds = tokenizer::Tokenizer::load(std::string(SPOOL_TEST_DATA_DIR) + "/tokenizers/deepseek_v3");
  ModelFacts facts = f.facts;
  facts.tok = &ds;
  facts.vocab_size = ds.vocab_size();
  const std::vector<int32_t> ids = parse_completion_request(body, facts, 1).prompt;
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 19923, 2058}));
  const json one = json::parse(R"({"prompt": ["Hello world"], "max_tokens": 1})");
  EXPECT_EQ(parse_completion_request(one, facts, 1).prompt, ids);
  // A text that writes its own BOS (a rendered chat) does not get a second one.
  const json own = json::parse(R"({"prompt": "<｜begin▁of▁sentence｜>Hello world", "max_tokens": 1})");
  EXPECT_EQ(parse_completion_request(own, facts, 1).prompt, ids);
}

TEST(ServerRequest, RendersTemplatesWithToolsAndThinking) {
  Fixture f;
  json req = json::parse(R"({"messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
         "properties": {"city": {"type": "string"}}}}}]})");
  // The demo model's template is Qwen3's: JSON tool calls, arguments re-inserted verbatim.
  ChatPrompt p = render_chat(req, f.facts.chat, false);
  EXPECT_EQ(p.syntax, ToolSyntax::kQwen3Json);
  EXPECT_NE(p.text.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"), std::string::npos)
      << p.text;
  EXPECT_NE(p.text.find("Be brief."), std::string::npos);
  EXPECT_TRUE(p.text.ends_with("<|im_start|>assistant\n")) << p.text;
  // tool_choice none: tools are rendered, calls are not parsed.
  json none = req;
  none["tool_choice"] = "none";
  EXPECT_EQ(render_chat(none, f.facts.chat, false).syntax, ToolSyntax::kNone);
  // A request template (apply-template only): Qwen3.5's, XML calls, generation prompt opens <think>.
  json over = req;
  over["chat_template"] = read_whole_file(std::string(SPOOL_TEST_DATA_DIR) + "/tokenizers/qwen3_5/chat_template.jinja");
  EXPECT_EQ(error_of([&] { render_chat(over, f.facts.chat, false); }).first, 400);
  ChatPrompt x = render_chat(over, f.facts.chat, true);
  EXPECT_EQ(x.syntax, ToolSyntax::kQwen35Xml);
  EXPECT_NE(x.text.find("<function=get_weather>\n<parameter=city>\nParis\n</parameter>"), std::string::npos) << x.text;
  EXPECT_TRUE(x.starts_in_reasoning);
  over["chat_template_kwargs"] = json{{"enable_thinking", false}};
  ChatPrompt y = render_chat(over, f.facts.chat, true);
  EXPECT_FALSE(y.starts_in_reasoning);
  EXPECT_TRUE(y.text.ends_with("<think>\n\n</think>\n\n")) << y.text;
  // XML templates need arguments that encode an object.
  over["messages"][2]["tool_calls"][0]["function"]["arguments"] = "[1]";
  EXPECT_EQ(error_of([&] { render_chat(over, f.facts.chat, true); }).second, "messages[2].tool_calls[0].function.arguments");
  // raise_exception in the template is a 400 with the template's message.
  json sys_late = json::parse(R"({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}],
                                  "chat_template": ")" + std::string("{{ raise_exception('System message must be at the beginning.') }}") + R"("})");
  try {
    render_chat(sys_late, f.facts.chat, true);
    FAIL() << "expected an ApiError";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("System message must be at the beginning."), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace spool::server
