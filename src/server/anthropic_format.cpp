#include "server/anthropic_format.h"

#include "server/json_body.h"

namespace spool::server {

namespace {

json thinking_block(const std::string& text) { return json{{"type", "thinking"}, {"thinking", text}, {"signature", ""}}; }

json text_block(const std::string& text) { return json{{"type", "text"}, {"text", text}}; }

json tool_use_block(const std::string& id, const std::string& name, json input) {
  return json{{"type", "tool_use"}, {"id", id}, {"name", name}, {"input", std::move(input)}};
}

json nullable(const std::string& s) { return s.empty() ? json() : json(s); }

}  // namespace

int anthropic_status(int status) { return status == 503 ? 529 : status; }

std::string anthropic_error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 529: return "overloaded_error";
    default: return status < 500 ? "invalid_request_error" : "api_error";
  }
}

json anthropic_error_json(const std::string& type, const std::string& message) {
  return json{{"type", "error"}, {"error", json{{"type", type}, {"message", message}}}};
}

std::string anthropic_stop_reason(const GenResult& r) {
  if (!r.stop_sequence.empty()) return "stop_sequence";
  if (r.finish_reason == "tool_calls") return "tool_use";
  if (r.finish_reason == "length") return "max_tokens";
  return "end_turn";
}

json anthropic_usage_json(const GenResult& r) {
  json u;
  u["input_tokens"] = r.prompt_tokens - r.cached_tokens;
  u["output_tokens"] = r.completion_tokens;
  u["cache_creation_input_tokens"] = 0;
  u["cache_read_input_tokens"] = r.cached_tokens;
  return u;
}

json anthropic_message_json(const std::string& id, const std::string& model, const GenResult& r) {
  json content = json::array();
  if (!r.reasoning.empty()) content.push_back(thinking_block(r.reasoning));
  if (!r.content.empty()) content.push_back(text_block(r.content));
  for (const ToolCall& c : r.tool_calls) {
    json input = json::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
    content.push_back(tool_use_block(c.id, c.name, input.is_object() ? input : json::object()));
  }
  json m;
  m["id"] = id;
  m["type"] = "message";
  m["role"] = "assistant";
  m["model"] = model;
  m["content"] = std::move(content);
  m["stop_reason"] = anthropic_stop_reason(r);
  m["stop_sequence"] = nullable(r.stop_sequence);
  m["usage"] = anthropic_usage_json(r);
  return m;
}

std::string anthropic_sse_event(const json& j) { return "event: " + j.value("type", std::string("message")) + "\ndata: " + dump_json(j) + "\n\n"; }

AnthropicStream::AnthropicStream(std::string id, std::string model, int64_t input_tokens)
    : id_(std::move(id)), model_(std::move(model)), input_tokens_(input_tokens) {}

std::string AnthropicStream::start() const {
  json m;
  m["id"] = id_;
  m["type"] = "message";
  m["role"] = "assistant";
  m["model"] = model_;
  m["content"] = json::array();
  m["stop_reason"] = nullptr;
  m["stop_sequence"] = nullptr;
  m["usage"] = json{{"input_tokens", input_tokens_}, {"output_tokens", 0}};
  return anthropic_sse_event(json{{"type", "message_start"}, {"message", m}}) + ping();
}

std::string AnthropicStream::open(Block kind, const json& block) {
  std::string out = close();
  open_ = kind;
  ++index_;
  return out + anthropic_sse_event(json{{"type", "content_block_start"}, {"index", index_}, {"content_block", block}});
}

std::string AnthropicStream::close() {
  if (open_ == Block::kNone) return "";
  open_ = Block::kNone;
  open_call_ = -1;
  return anthropic_sse_event(json{{"type", "content_block_stop"}, {"index", index_}});
}

std::string AnthropicStream::delta(const OutputDelta& d) {
  std::string out;
  auto emit = [&](const json& delta) { out += anthropic_sse_event(json{{"type", "content_block_delta"}, {"index", index_}, {"delta", delta}}); };
  size_t first = 0;  // pieces continuing the open tool_use block come first: they precede any text of this delta
  for (; first < d.tool_calls.size() && d.tool_calls[first].id.empty() && open_ == Block::kToolUse &&
         d.tool_calls[first].index == open_call_;
       ++first)
    if (!d.tool_calls[first].arguments.empty()) emit(json{{"type", "input_json_delta"}, {"partial_json", d.tool_calls[first].arguments}});
  if (!d.reasoning.empty()) {
    if (open_ != Block::kThinking) out += open(Block::kThinking, thinking_block(""));
    emit(json{{"type", "thinking_delta"}, {"thinking", d.reasoning}});
  }
  if (!d.content.empty()) {
    if (open_ != Block::kText) out += open(Block::kText, text_block(""));
    emit(json{{"type", "text_delta"}, {"text", d.content}});
  }
  for (size_t i = first; i < d.tool_calls.size(); ++i) {
    const ToolCallDelta& tc = d.tool_calls[i];
    if (!tc.id.empty()) {  // a new call: its first piece names it
      out += open(Block::kToolUse, tool_use_block(tc.id, tc.name, json::object()));
      open_call_ = tc.index;
    } else if (open_ != Block::kToolUse || open_call_ != tc.index) {
      continue;  // a later piece of a call whose block is closed: cannot happen with the parser's order
    }
    if (!tc.arguments.empty()) emit(json{{"type", "input_json_delta"}, {"partial_json", tc.arguments}});
  }
  return out;
}

std::string AnthropicStream::finish(const GenResult& r) {
  std::string out = close();
  json delta{{"stop_reason", anthropic_stop_reason(r)}, {"stop_sequence", nullable(r.stop_sequence)}};
  out += anthropic_sse_event(json{{"type", "message_delta"}, {"delta", delta}, {"usage", anthropic_usage_json(r)}});
  out += anthropic_sse_event(json{{"type", "message_stop"}});
  return out;
}

std::string AnthropicStream::error(int status, const std::string& message) {
  return anthropic_sse_event(anthropic_error_json(anthropic_error_type(anthropic_status(status)), message));
}

std::string AnthropicStream::ping() { return anthropic_sse_event(json{{"type", "ping"}}); }

}  // namespace spool::server
