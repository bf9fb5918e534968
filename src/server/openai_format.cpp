#include "server/openai_format.h"

#include <random>

#include "server/json_body.h"
#include "server/stop_strings.h"

namespace spool::server {

using json = nlohmann::ordered_json;

namespace {

// A token's raw bytes and its text (valid UTF-8; partial characters become U+FFFD).
std::pair<std::string, std::string> token_text(const tokenizer::Tokenizer& tok, int32_t id) {
  std::string bytes = tok.id_to_bytes(id);
  std::string text = valid_utf8(bytes) ? bytes : tok.decode(std::vector<int32_t>{id});
  return {bytes, text};
}

json bytes_json(const std::string& b) {
  json a = json::array();
  for (unsigned char c : b) a.push_back(static_cast<int>(c));
  return a;
}

json chat_logprob_entry(const TokenLogprob& t, const tokenizer::Tokenizer& tok) {
  auto [bytes, text] = token_text(tok, t.id);
  json e;
  e["token"] = text;
  e["logprob"] = t.logprob;
  e["bytes"] = bytes_json(bytes);
  json top = json::array();
  for (auto [id, lp] : t.top) {
    auto [b2, t2] = token_text(tok, id);
    top.push_back(json{{"token", t2}, {"logprob", lp}, {"bytes", bytes_json(b2)}});
  }
  e["top_logprobs"] = top;
  return e;
}

json chat_logprobs(const std::vector<TokenLogprob>& v, const tokenizer::Tokenizer& tok) {
  json content = json::array();
  for (const auto& t : v) content.push_back(chat_logprob_entry(t, tok));
  return json{{"content", content}};
}

// Legacy completions logprobs: tokens, token_logprobs, top_logprobs (token -> logprob maps).
json completion_logprobs(const std::vector<TokenLogprob>& v, const tokenizer::Tokenizer& tok) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offs = json::array();
  size_t off = 0;
  for (const auto& t : v) {
    auto [bytes, text] = token_text(tok, t.id);
    tokens.push_back(text);
    lps.push_back(t.logprob);
    offs.push_back(off);
    off += text.size();
    json m = json::object();
    for (auto [id, lp] : t.top) m[token_text(tok, id).second] = lp;
    tops.push_back(m);
  }
  return json{{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

json tool_calls_json(const std::vector<ToolCall>& calls) {
  json a = json::array();
  for (const auto& c : calls)
    a.push_back(json{{"id", c.id}, {"type", "function"}, {"function", json{{"name", c.name}, {"arguments", c.arguments}}}});
  return a;
}

json nullable(const std::string& s) { return s.empty() ? json() : json(s); }

// A choice: its leading fields (`head`, e.g. index and message) then logprobs and finish_reason.
json choice_json(json head, json logprobs, json finish_reason) {
  head["logprobs"] = std::move(logprobs);
  head["finish_reason"] = std::move(finish_reason);
  return head;
}

// The fields every response object has (id, object, created, model, choices), then `usage`
// when given.
json response_json(const ResponseMeta& m, const char* object, json choices, const GenResult* usage = nullptr) {
  json j;
  j["id"] = m.id;
  j["object"] = object;
  j["created"] = m.created;
  j["model"] = m.model;
  j["choices"] = std::move(choices);
  if (usage) j["usage"] = usage_json(*usage);
  return j;
}

}  // namespace

json usage_json(const GenResult& r) {
  json u;
  u["prompt_tokens"] = r.prompt_tokens;
  u["completion_tokens"] = r.completion_tokens;
  u["total_tokens"] = r.prompt_tokens + r.completion_tokens;
  u["prompt_tokens_details"] = json{{"cached_tokens", r.cached_tokens}};
  return u;
}

json chat_completion_json(const ResponseMeta& m, const GenResult& r, bool logprobs, const tokenizer::Tokenizer& tok) {
  json msg;
  msg["role"] = "assistant";
  msg["content"] = r.content.empty() && !r.tool_calls.empty() ? json() : json(r.content);
  if (!r.reasoning.empty()) msg["reasoning_content"] = r.reasoning;
  if (!r.tool_calls.empty()) msg["tool_calls"] = tool_calls_json(r.tool_calls);
  json choice = choice_json(json{{"index", 0}, {"message", msg}}, logprobs ? chat_logprobs(r.logprobs, tok) : json(), r.finish_reason);
  return response_json(m, "chat.completion", json::array({choice}), &r);
}

json delta_json(const OutputDelta& d) {
  json delta = json::object();
  if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
  if (!d.content.empty()) delta["content"] = d.content;
  if (!d.tool_calls.empty()) {
    json calls = json::array();
    for (const auto& tc : d.tool_calls) {
      json c;
      c["index"] = tc.index;
      if (!tc.id.empty()) {
        c["id"] = tc.id;
        c["type"] = "function";
        c["function"] = json{{"name", tc.name}, {"arguments", tc.arguments}};
      } else {
        c["function"] = json{{"arguments", tc.arguments}};
      }
      calls.push_back(c);
    }
    delta["tool_calls"] = calls;
  }
  return delta;
}

json chat_chunk_json(const ResponseMeta& m, const json& delta, const std::string& finish_reason, const std::vector<TokenLogprob>* logprobs,
                     const tokenizer::Tokenizer& tok) {
  json choice = choice_json(json{{"index", 0}, {"delta", delta}}, logprobs ? chat_logprobs(*logprobs, tok) : json(), nullable(finish_reason));
  return response_json(m, "chat.completion.chunk", json::array({choice}));
}

json usage_chunk_json(const ResponseMeta& m, const GenResult& r, bool chat) {
  return response_json(m, chat ? "chat.completion.chunk" : "text_completion", json::array(), &r);
}

json completion_json(const ResponseMeta& m, const GenResult& r, bool logprobs, const tokenizer::Tokenizer& tok) {
  json choice =
      choice_json(json{{"text", r.content}, {"index", 0}}, logprobs ? completion_logprobs(r.logprobs, tok) : json(), r.finish_reason);
  return response_json(m, "text_completion", json::array({choice}), &r);
}

json completion_chunk_json(const ResponseMeta& m, const std::string& text, const std::string& finish_reason,
                           const std::vector<TokenLogprob>* logprobs, const tokenizer::Tokenizer& tok) {
  json choice =
      choice_json(json{{"text", text}, {"index", 0}}, logprobs ? completion_logprobs(*logprobs, tok) : json(), nullable(finish_reason));
  return response_json(m, "text_completion", json::array({choice}));
}

std::string sse_data(const json& j) {
  return "data: " + dump_json(j) + "\n\n";
}

std::string new_response_id(const std::string& prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx%08llx", (unsigned long long)rng(), (unsigned long long)(rng() & 0xffffffffu));
  return prefix + buf;
}

}  // namespace spool::server
