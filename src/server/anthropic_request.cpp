#include "server/anthropic_request.h"

#include <limits>
#include <optional>
#include <set>

#include "server/api_error.h"
#include "server/json_body.h"
#include "server/tool_calls.h"

namespace spool::server {

namespace {

[[noreturn]] void bad(const std::string& where, const std::string& what) { throw bad_request(where + " " + what, where); }

// The block's "type" (400 unless a string).
std::string block_type(const json& b, const std::string& where) {
  if (!b.is_object()) bad(where, "must be an object (a content block)");
  auto t = b.find("type");
  if (t == b.end() || !t->is_string()) bad(where + ".type", "must be a string");
  return t->get<std::string>();
}

// A block's required string field.
const std::string& string_field(const json& b, const char* key, const std::string& where) {
  auto it = b.find(key);
  if (it == b.end() || !it->is_string()) bad(where + "." + key, "must be a string");
  return it->get_ref<const std::string&>();
}

// Blocks that carry media: refused with their type named (spool's models read text only).
bool is_media(const std::string& type) { return type == "image" || type == "document"; }

// Text of `content`: a string, or an array of text blocks joined with "\n" (`what` names the
// place for errors, e.g. "system").
std::string text_of(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(where, "must be a string or an array of text blocks");
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string bw = where + "[" + std::to_string(i) + "]";
    const std::string type = block_type(content[i], bw);
    if (is_media(type)) bad(bw + ".type", "\"" + type + "\": image and document blocks are not supported (text-only models)");
    if (type != "text") bad(bw + ".type", "\"" + type + "\" is not supported here (only \"text\" blocks)");
    if (i > 0) out += "\n";
    out += string_field(content[i], "text", bw);
  }
  return out;
}

// Calls visit(block, where, type) for each block of the array `content` in order; `where` names
// the block for errors ("messages[0].content[2]"), `type` is its block_type.
template <class Visit>
void for_each_block(const json& content, const std::string& where, Visit&& visit) {
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string bw = where + "[" + std::to_string(i) + "]";
    const json& b = content[i];
    visit(b, bw, block_type(b, bw));
  }
}

// A message's text blocks joined with "\n" in order; `any` tells an empty text block from none.
struct JoinedText {
  std::string text;
  bool any = false;
  void add(const std::string& s) {
    if (any) text += "\n";
    text += s;
    any = true;
  }
};

json user_turn(const std::string& text) { return json{{"role", "user"}, {"content", text}}; }

// One user message's blocks, appended to `out` as OpenAI messages in order (text runs as user
// messages, tool_result blocks as tool messages).
void map_user(const json& content, const std::string& where, json& out) {
  if (content.is_string()) {
    out.push_back(user_turn(content.get<std::string>()));
    return;
  }
  JoinedText text;
  auto flush = [&] {
    if (text.any) out.push_back(user_turn(text.text));
    text = JoinedText{};
  };
  for_each_block(content, where, [&](const json& b, const std::string& bw, const std::string& type) {
    if (type == "text") {
      text.add(string_field(b, "text", bw));
    } else if (type == "tool_result") {
      flush();
      const std::string& id = string_field(b, "tool_use_id", bw);
      if (id.empty()) bad(bw + ".tool_use_id", "must not be empty");
      if (auto e = b.find("is_error"); e != b.end() && !e->is_null() && !e->is_boolean()) bad(bw + ".is_error", "must be a boolean");
      std::string result;
      if (auto c = b.find("content"); c != b.end() && !c->is_null()) result = text_of(*c, bw + ".content");
      out.push_back(json{{"role", "tool"}, {"tool_call_id", id}, {"content", result}});
    } else if (is_media(type)) {
      bad(bw + ".type", "\"" + type + "\": image and document blocks are not supported (text-only models)");
    } else if (type == "tool_use" || type == "thinking" || type == "redacted_thinking") {
      bad(bw + ".type", "\"" + type + "\" blocks belong in assistant messages");
    } else {
      bad(bw + ".type", "\"" + type + "\" is not a supported content block (text, tool_result)");
    }
  });
  flush();
}

// One assistant message's blocks as one OpenAI assistant message.
json map_assistant(const json& content, const std::string& where) {
  json m{{"role", "assistant"}, {"content", ""}};
  if (content.is_string()) {
    m["content"] = content.get<std::string>();
    return m;
  }
  JoinedText text;
  std::string reasoning;
  json calls = json::array();
  for_each_block(content, where, [&](const json& b, const std::string& bw, const std::string& type) {
    if (type == "text") {
      text.add(string_field(b, "text", bw));
    } else if (type == "thinking") {
      if (!reasoning.empty()) reasoning += "\n";
      reasoning += string_field(b, "thinking", bw);
    } else if (type == "redacted_thinking") {
      string_field(b, "data", bw);  // opaque: checked, not rendered
    } else if (type == "tool_use") {
      const std::string& id = string_field(b, "id", bw);
      const std::string& name = string_field(b, "name", bw);
      if (name.empty()) bad(bw + ".name", "must not be empty");
      auto input = b.find("input");
      if (input == b.end() || !input->is_object()) bad(bw + ".input", "must be an object");
      calls.push_back(json{{"id", id}, {"type", "function"}, {"function", json{{"name", name}, {"arguments", dump_json_py(*input)}}}});
    } else if (is_media(type)) {
      bad(bw + ".type", "\"" + type + "\": image and document blocks are not supported (text-only models)");
    } else if (type == "tool_result") {
      bad(bw + ".type", "\"tool_result\" blocks belong in user messages");
    } else {
      bad(bw + ".type", "\"" + type + "\" is not a supported content block (text, thinking, redacted_thinking, tool_use)");
    }
  });
  m["content"] = text.text;
  if (!reasoning.empty()) m["reasoning_content"] = reasoning;
  if (!calls.empty()) m["tool_calls"] = calls;
  return m;
}

json map_messages(const json& body) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) throw bad_request("messages: field required", "messages");
  if (!it->is_array()) throw bad_request("messages must be an array", "messages");
  if (it->empty()) throw bad_request("messages must not be empty (at least one user message)", "messages");
  json out = json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json& m = (*it)[i];
    if (!m.is_object()) bad(where, "must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) bad(where + ".role", "must be a string");
    auto content = m.find("content");
    if (content == m.end() || !(content->is_string() || content->is_array()))
      bad(where + ".content", "must be a string or an array of content blocks");
    if (content->is_array() && content->empty()) bad(where + ".content", "must not be an empty array");
    if (*role == "user") {
      map_user(*content, where + ".content", out);
    } else if (*role == "assistant") {
      if (i + 1 == it->size())
        bad(where, "is an assistant message: a final assistant message (response prefill) is not supported; end with a user message");
      out.push_back(map_assistant(*content, where + ".content"));
    } else {
      bad(where + ".role", "\"" + role->get<std::string>() + "\" is not one of user, assistant (the system prompt goes in 'system')");
    }
  }
  return out;
}

// tools -> OpenAI function tools; the names, for tool_choice.
json map_tools(const json& body, std::set<std::string>& names) {
  auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return json();
  if (!it->is_array()) throw bad_request("tools must be an array", "tools");
  json out = json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const std::string w = "tools[" + std::to_string(i) + "]";
    const json& t = (*it)[i];
    if (!t.is_object()) bad(w, "must be an object");
    if (auto type = t.find("type"); type != t.end() && !type->is_null()) {
      if (!type->is_string()) bad(w + ".type", "must be a string");
      if (*type != "custom")
        bad(w + ".type", "\"" + type->get<std::string>() + "\": server and client tools of Anthropic's are not supported; give custom tools (name, description, input_schema)");
    }
    const std::string& name = string_field(t, "name", w);
    if (name.empty()) bad(w + ".name", "must not be empty");
    if (!names.insert(name).second) bad(w + ".name", "\"" + name + "\" names a tool twice");
    json fn{{"name", name}};
    if (auto d = t.find("description"); d != t.end() && !d->is_null()) {
      if (!d->is_string()) bad(w + ".description", "must be a string");
      fn["description"] = *d;
    }
    auto schema = t.find("input_schema");
    if (schema == t.end() || !schema->is_object()) bad(w + ".input_schema", "must be an object (a JSON schema)");
    fn["parameters"] = *schema;
    out.push_back(json{{"type", "function"}, {"function", fn}});
  }
  return out.empty() ? json() : out;
}

void map_tool_choice(const json& body, const std::set<std::string>& names, AnthropicRequest& r) {
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return;
  if (!it->is_object()) throw bad_request("tool_choice must be an object such as {\"type\": \"auto\"}", "tool_choice");
  auto type = it->find("type");
  if (type == it->end() || !type->is_string()) throw bad_request("tool_choice.type must be a string", "tool_choice.type");
  r.tool_choice = type->get<std::string>();
  if (r.tool_choice != "auto" && r.tool_choice != "any" && r.tool_choice != "tool" && r.tool_choice != "none")
    throw bad_request("tool_choice.type \"" + r.tool_choice + "\" is not one of auto, any, tool, none", "tool_choice.type");
  if (auto d = it->find("disable_parallel_tool_use"); d != it->end() && !d->is_null() && !d->is_boolean())
    throw bad_request("tool_choice.disable_parallel_tool_use must be a boolean", "tool_choice.disable_parallel_tool_use");
  if ((r.tool_choice == "any" || r.tool_choice == "tool") && names.empty())
    throw bad_request("tool_choice \"" + r.tool_choice + "\" needs 'tools'", "tool_choice");
  if (r.tool_choice == "tool") {
    auto name = it->find("name");
    if (name == it->end() || !name->is_string()) throw bad_request("tool_choice.name must be a string", "tool_choice.name");
    r.tool_name = name->get<std::string>();
    if (!names.count(r.tool_name)) throw bad_request("tool_choice.name \"" + r.tool_name + "\" is not among 'tools'", "tool_choice.name");
  }
}

// thinking -> chat_template_kwargs.enable_thinking (absent: the template's default) and
// budget_tokens -> thinking_budget_tokens (request.h: GenRequest::reasoning_budget).
void map_thinking(const json& body, AnthropicRequest& r, bool count_tokens) {
  auto it = body.find("thinking");
  if (it == body.end() || it->is_null()) return;
  if (!it->is_object()) throw bad_request("thinking must be an object such as {\"type\": \"enabled\", \"budget_tokens\": 2048}", "thinking");
  auto type = it->find("type");
  if (type == it->end() || !type->is_string()) throw bad_request("thinking.type must be a string", "thinking.type");
  if (*type == "enabled") {
    std::optional<int64_t> budget = get_int(*it, "budget_tokens", 1024, std::numeric_limits<int32_t>::max());
    if (!budget) throw bad_request("thinking.budget_tokens: field required (>= 1024) when thinking is enabled", "thinking.budget_tokens");
    if (!count_tokens && *budget >= r.max_tokens)
      throw bad_request("thinking.budget_tokens must be less than max_tokens", "thinking.budget_tokens");
    r.chat["chat_template_kwargs"] = json{{"enable_thinking", true}};
    r.chat["thinking_budget_tokens"] = *budget;  // enforced: the reasoning is ended after that many tokens
  } else if (*type == "disabled") {
    r.chat["chat_template_kwargs"] = json{{"enable_thinking", false}};
  } else if (*type != "adaptive") {
    throw bad_request("thinking.type \"" + type->get<std::string>() + "\" is not one of enabled, disabled, adaptive", "thinking.type");
  }
}

std::vector<std::string> stop_sequences(const json& body) {
  auto it = body.find("stop_sequences");
  if (it == body.end() || it->is_null()) return {};
  if (!it->is_array()) throw bad_request("stop_sequences must be an array of strings", "stop_sequences");
  std::vector<std::string> out;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& s = (*it)[i];
    const std::string w = "stop_sequences[" + std::to_string(i) + "]";
    if (!s.is_string()) bad(w, "must be a string");
    if (s.get_ref<const std::string&>().empty()) bad(w, "must not be empty");
    out.push_back(s.get<std::string>());
  }
  return out;
}

}  // namespace

AnthropicRequest parse_anthropic_request(const json& body, bool count_tokens) {
  AnthropicRequest r;
  auto model = body.find("model");
  if (model == body.end() || !model->is_string()) throw bad_request("model: field required (a string)", "model");
  if (auto v = get_int(body, "max_tokens", 1, std::numeric_limits<int32_t>::max())) r.max_tokens = *v;
  else if (!count_tokens) throw bad_request("max_tokens: field required (an integer >= 1)", "max_tokens");

  json messages = json::array();
  if (auto s = body.find("system"); s != body.end() && !s->is_null()) {
    std::string text = text_of(*s, "system");
    if (!text.empty()) messages.push_back(json{{"role", "system"}, {"content", text}});
  }
  for (auto& m : map_messages(body)) messages.push_back(std::move(m));
  r.chat["messages"] = std::move(messages);

  std::set<std::string> names;
  json tools = map_tools(body, names);
  map_tool_choice(body, names, r);
  if (r.tool_choice == "none") {
    r.chat["tool_choice"] = "none";  // no tools offered, and tool-call markup stays text
  } else if (!tools.is_null()) {
    r.chat["tools"] = std::move(tools);
    // any / tool force a call (one of the tools / the named one) by constrained decoding
    // (server/constrained.h), through the chat path's tool_choice.
    if (r.tool_choice == "any") r.chat["tool_choice"] = "required";
    else if (r.tool_choice == "tool") r.chat["tool_choice"] = json{{"type", "function"}, {"function", {{"name", r.tool_name}}}};
    else r.chat["tool_choice"] = "auto";
  }
  map_thinking(body, r, count_tokens);
  if (auto m = body.find("metadata"); m != body.end() && !m->is_null() && !m->is_object())
    throw bad_request("metadata must be an object", "metadata");
  if (count_tokens) return r;

  r.chat["max_tokens"] = r.max_tokens;
  if (auto v = get_number(body, "temperature", 0, 1)) r.chat["temperature"] = *v;
  if (auto v = get_number(body, "top_p", 0, 1)) {
    if (*v <= 0) throw bad_request("top_p must be in (0, 1]", "top_p");
    r.chat["top_p"] = *v;
  }
  if (auto v = get_int(body, "top_k", 0, std::numeric_limits<int32_t>::max())) r.chat["top_k"] = *v;
  r.stop_sequences = stop_sequences(body);
  r.stream = get_bool(body, "stream").value_or(false);
  r.chat["stream"] = r.stream;
  return r;
}

}  // namespace spool::server
