#include "server/responses_format.h"

#include <algorithm>

#include "server/json_body.h"

namespace spool::server {

namespace {

json message_item(const std::string& id, const std::string& status, const std::string& text) {
  return json{{"id", id}, {"type", "message"}, {"status", status}, {"role", "assistant"},
              {"content", json::array({json{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}}})}};
}

json reasoning_item(const std::string& id, const std::string& text) {
  return json{{"id", id}, {"type", "reasoning"}, {"summary", json::array()},
              {"content", json::array({json{{"type", "reasoning_text"}, {"text", text}}})}};
}

json call_item(const std::string& id, const std::string& call_id, const std::string& name, const std::string& args,
               const std::string& status) {
  return json{{"id", id}, {"type", "function_call"}, {"status", status}, {"arguments", args}, {"call_id", call_id}, {"name", name}};
}

}  // namespace

json response_object(const ResponsesEcho& e, const std::string& status, const json& output, const json& usage) {
  json j;
  j["id"] = e.id;
  j["object"] = "response";
  j["created_at"] = e.created_at;
  j["status"] = status;
  j["background"] = false;
  j["error"] = nullptr;
  j["incomplete_details"] = status == "incomplete" ? json{{"reason", "max_output_tokens"}} : json();
  j["instructions"] = e.instructions;
  j["max_output_tokens"] = e.max_output_tokens;
  j["model"] = e.model;
  j["output"] = output;
  j["parallel_tool_calls"] = e.parallel_tool_calls;
  j["previous_response_id"] = e.previous_response_id;
  j["reasoning"] = e.reasoning;
  j["store"] = e.store;
  j["temperature"] = e.temperature;
  j["text"] = json{{"format", json{{"type", "text"}}}};
  j["tool_choice"] = e.tool_choice;
  j["tools"] = e.tools;
  j["top_p"] = e.top_p;
  j["truncation"] = "disabled";
  j["usage"] = usage;
  j["user"] = nullptr;
  j["metadata"] = e.metadata;
  return j;
}

json responses_usage(const GenResult& r, int64_t reasoning_tokens) {
  json u;
  u["input_tokens"] = r.prompt_tokens;
  u["input_tokens_details"] = json{{"cached_tokens", r.cached_tokens}};
  u["output_tokens"] = r.completion_tokens;
  u["output_tokens_details"] = json{{"reasoning_tokens", std::clamp<int64_t>(reasoning_tokens, 0, r.completion_tokens)}};
  u["total_tokens"] = r.prompt_tokens + r.completion_tokens;
  return u;
}

json output_items(const GenResult& r, const ItemIdSource& ids) {
  json out = json::array();
  if (!r.reasoning.empty()) out.push_back(reasoning_item(ids("rs_"), r.reasoning));
  if (!r.content.empty() || r.tool_calls.empty()) out.push_back(message_item(ids("msg_"), "completed", r.content));
  for (const ToolCall& c : r.tool_calls)
    out.push_back(call_item(ids("fc_"), c.id, c.name, c.arguments, c.complete ? "completed" : "incomplete"));
  if (r.finish_reason == "length" && !out.empty() && out.back().contains("status")) out.back()["status"] = "incomplete";
  return out;
}

json finished_response(const ResponsesEcho& e, const GenResult& r, const json& output, int64_t reasoning_tokens) {
  return response_object(e, r.finish_reason == "length" ? "incomplete" : "completed", output, responses_usage(r, reasoning_tokens));
}

std::string sse_event(const json& event) {
  return "event: " + event["type"].get<std::string>() + "\ndata: " + dump_json(event) + "\n\n";
}

ResponsesStream::ResponsesStream(ResponsesEcho echo, ItemIdSource ids) : echo_(std::move(echo)), ids_(std::move(ids)) {}

void ResponsesStream::emit(json ev) {
  json e;
  e["type"] = std::move(ev["type"]);
  e["sequence_number"] = seq_++;
  for (auto& [k, v] : ev.items())
    if (k != "type") e[k] = std::move(v);
  out_.push_back(std::move(e));
}

std::vector<json> ResponsesStream::start() {
  out_.clear();
  const json r = response_object(echo_, "in_progress", json::array(), nullptr);
  emit(json{{"type", "response.created"}, {"response", r}});
  emit(json{{"type", "response.in_progress"}, {"response", r}});
  return std::move(out_);
}

void ResponsesStream::open(Kind k, const ToolCallDelta* call) {
  const int index = static_cast<int>(output_.size());
  json item;
  if (k == Kind::kReasoning) {
    item = reasoning_item(ids_("rs_"), "");
    item["content"] = json::array();
  } else if (k == Kind::kMessage) {
    item = message_item(ids_("msg_"), "in_progress", "");
    item["content"] = json::array();
  } else {
    item = call_item(ids_("fc_"), call->id, call->name, "", "in_progress");
    if (call_item_.size() <= static_cast<size_t>(call->index)) call_item_.resize(call->index + 1, -1);
    call_item_[call->index] = index;
  }
  output_.push_back(item);
  open_ = k;
  text_.clear();
  emit(json{{"type", "response.output_item.added"}, {"output_index", index}, {"item", item}});
  const std::string& id = item["id"].get_ref<const std::string&>();
  if (k == Kind::kReasoning)
    emit(json{{"type", "response.content_part.added"}, {"item_id", id}, {"output_index", index}, {"content_index", 0},
              {"part", json{{"type", "reasoning_text"}, {"text", ""}}}});
  else if (k == Kind::kMessage)
    emit(json{{"type", "response.content_part.added"}, {"item_id", id}, {"output_index", index}, {"content_index", 0},
              {"part", json{{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
}

void ResponsesStream::close(const std::string& status) {
  if (open_ == Kind::kNone) return;
  const int index = static_cast<int>(output_.size()) - 1;
  json& item = output_.back();
  const std::string id = item["id"];
  if (open_ == Kind::kReasoning) {
    const json part{{"type", "reasoning_text"}, {"text", text_}};
    emit(json{{"type", "response.reasoning_text.done"}, {"item_id", id}, {"output_index", index}, {"content_index", 0}, {"text", text_}});
    emit(json{{"type", "response.content_part.done"}, {"item_id", id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
    item["content"] = json::array({part});
  } else if (open_ == Kind::kMessage) {
    const json part{{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}};
    emit(json{{"type", "response.output_text.done"}, {"item_id", id}, {"output_index", index}, {"content_index", 0}, {"text", text_},
              {"logprobs", json::array()}});
    emit(json{{"type", "response.content_part.done"}, {"item_id", id}, {"output_index", index}, {"content_index", 0}, {"part", part}});
    item["content"] = json::array({part});
    item["status"] = status;
  } else {
    item["arguments"] = text_;
    emit(json{{"type", "response.function_call_arguments.done"}, {"item_id", id}, {"output_index", index}, {"name", item["name"]},
              {"arguments", text_}});
    if (item["status"] == "in_progress") item["status"] = status;
  }
  emit(json{{"type", "response.output_item.done"}, {"output_index", index}, {"item", item}});
  open_ = Kind::kNone;
  text_.clear();
}

std::vector<json> ResponsesStream::on_delta(const OutputDelta& d) {
  out_.clear();
  auto text_delta = [&](Kind k, const std::string& s) {
    if (s.empty()) return;
    if (open_ != k) {
      close("completed");
      open(k, nullptr);
    }
    text_ += s;
    const int index = static_cast<int>(output_.size()) - 1;
    emit(json{{"type", k == Kind::kReasoning ? "response.reasoning_text.delta" : "response.output_text.delta"},
              {"item_id", output_.back()["id"]}, {"output_index", index}, {"content_index", 0}, {"delta", s}}
         );
    if (k == Kind::kMessage) out_.back()["logprobs"] = json::array();
  };
  auto args_delta = [&](const ToolCallDelta& c) {
    if (c.arguments.empty()) return;
    const int index = static_cast<size_t>(c.index) < call_item_.size() ? call_item_[c.index] : -1;
    if (index < 0) return;  // arguments of a call never announced: cannot happen (the parser announces first)
    if (open_ == Kind::kCall && index == static_cast<int>(output_.size()) - 1) text_ += c.arguments;
    else output_[index]["arguments"] = output_[index]["arguments"].get<std::string>() + c.arguments;
    emit(json{{"type", "response.function_call_arguments.delta"}, {"item_id", output_[index]["id"]}, {"output_index", index},
              {"delta", c.arguments}});
  };
  text_delta(Kind::kReasoning, d.reasoning);
  // Within one delta the order of content and call pieces is not recorded: arguments of the
  // call already open come first (its end), then content, then newly announced calls.
  size_t i = 0;
  for (; i < d.tool_calls.size() && d.tool_calls[i].id.empty(); ++i) args_delta(d.tool_calls[i]);
  text_delta(Kind::kMessage, d.content);
  for (; i < d.tool_calls.size(); ++i) {
    const ToolCallDelta& c = d.tool_calls[i];
    if (!c.id.empty()) {
      close("completed");
      open(Kind::kCall, &c);
    }
    args_delta(c);
  }
  return std::move(out_);
}

std::vector<json> ResponsesStream::finish(const GenResult& r, int64_t reasoning_tokens) {
  out_.clear();
  const bool incomplete = r.finish_reason == "length";
  // A call the parser closed as incomplete keeps that status.
  for (size_t c = 0; c < r.tool_calls.size() && c < call_item_.size(); ++c)
    if (call_item_[c] >= 0 && !r.tool_calls[c].complete) output_[call_item_[c]]["status"] = "incomplete";
  close(incomplete ? "incomplete" : "completed");
  if (output_.empty()) {  // nothing was generated: an empty message, as the non-streamed response has
    open(Kind::kMessage, nullptr);
    close(incomplete ? "incomplete" : "completed");
  }
  const json resp = finished_response(echo_, r, output_, reasoning_tokens);
  emit(json{{"type", incomplete ? "response.incomplete" : "response.completed"}, {"response", resp}});
  return std::move(out_);
}

std::vector<json> ResponsesStream::error(const std::string& message, const std::string& param) {
  out_.clear();
  emit(json{{"type", "error"}, {"code", nullptr}, {"message", message}, {"param", param.empty() ? json() : json(param)}});
  return std::move(out_);
}

}  // namespace spool::server
