#include "server/responses_request.h"

#include <limits>

#include "server/api_error.h"
#include "server/json_body.h"

namespace spool::server {

namespace {

std::string at(const std::string& where, size_t i) { return where + "[" + std::to_string(i) + "]"; }

const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::string need_string(const json& obj, const char* key, const std::string& where) {
  const json* v = field(obj, key);
  if (!v || !v->is_string()) throw bad_request(where + "." + key + " must be a string", where + "." + key);
  return v->get<std::string>();
}

// Text of content parts [{type, text}] of the given types, joined with "\n" (as chat joins them).
std::string part_text(const json& part, const std::string& pw) {
  if (!part.is_object()) throw bad_request(pw + " must be an object", pw);
  const json* type = field(part, "type");
  if (!type || !type->is_string()) throw bad_request(pw + ".type must be a string", pw + ".type");
  const std::string t = type->get<std::string>();
  if (t == "input_text" || t == "output_text" || t == "text") return need_string(part, "text", pw);
  if (t == "refusal") return need_string(part, "refusal", pw);
  if (t == "input_image" || t == "input_file" || t == "input_audio")
    throw bad_request(pw + ": \"" + t + "\" content is not supported (spool serves text-only models)", pw + ".type");
  throw bad_request(pw + ".type \"" + t + "\" is not one of input_text, output_text, refusal", pw + ".type");
}

json normalize_message(const json& m, const std::string& w) {
  const std::string role = need_string(m, "role", w);
  if (role != "user" && role != "assistant" && role != "system" && role != "developer")
    throw bad_request(w + ".role \"" + role + "\" is not one of user, assistant, system, developer", w + ".role");
  const json* c = field(m, "content");
  if (!c) throw bad_request(w + ".content is required", w + ".content");
  const char* kind = role == "assistant" ? "output_text" : "input_text";
  json parts = json::array();
  if (c->is_string()) {
    parts.push_back(json{{"type", kind}, {"text", c->get<std::string>()}});
  } else if (c->is_array()) {
    for (size_t i = 0; i < c->size(); ++i)
      parts.push_back(json{{"type", kind}, {"text", part_text((*c)[i], at(w + ".content", i))}});
  } else {
    throw bad_request(w + ".content must be a string or an array of content parts", w + ".content");
  }
  return json{{"type", "message"}, {"role", role}, {"content", parts}};
}

json normalize_item(const json& item, const std::string& w) {
  if (!item.is_object()) throw bad_request(w + " must be an object", w);
  const json* type = field(item, "type");
  if (type && !type->is_string()) throw bad_request(w + ".type must be a string", w + ".type");
  const std::string t = type ? type->get<std::string>() : "message";  // EasyInputMessage has no type
  if (t == "message") return normalize_message(item, w);
  if (t == "function_call") {
    json out{{"type", t}, {"call_id", need_string(item, "call_id", w)}, {"name", need_string(item, "name", w)}};
    const std::string args = need_string(item, "arguments", w);
    const json parsed = json::parse(args, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_object()) throw bad_request(w + ".arguments must be a JSON object encoded as a string", w + ".arguments");
    out["arguments"] = args;
    return out;
  }
  if (t == "function_call_output") {
    json out{{"type", t}, {"call_id", need_string(item, "call_id", w)}};
    const json* o = field(item, "output");
    if (!o) throw bad_request(w + ".output is required", w + ".output");
    if (o->is_string()) {
      out["output"] = *o;
    } else if (o->is_array()) {
      std::string text;
      for (size_t i = 0; i < o->size(); ++i) {
        if (i) text += '\n';
        text += part_text((*o)[i], at(w + ".output", i));
      }
      out["output"] = text;
    } else {
      throw bad_request(w + ".output must be a string or an array of content parts", w + ".output");
    }
    return out;
  }
  if (t == "reasoning") {
    // The reasoning text (content), else its summary: what the next assistant turn thought.
    std::string text;
    for (const char* key : {"content", "summary"}) {
      const json* parts = field(item, key);
      if (!parts) continue;
      if (!parts->is_array()) throw bad_request(w + "." + key + " must be an array", w + "." + key);
      std::string s;
      for (size_t i = 0; i < parts->size(); ++i) {
        const std::string pw = at(w + "." + key, i);
        if (!(*parts)[i].is_object()) throw bad_request(pw + " must be an object", pw);
        if (i) s += "\n";
        s += need_string((*parts)[i], "text", pw);
      }
      if (text.empty()) text = s;
    }
    return json{{"type", t}, {"content", json::array({json{{"type", "reasoning_text"}, {"text", text}}})}};
  }
  throw bad_request(w + ".type \"" + t + "\" is not supported (supported: message, function_call, function_call_output, reasoning)",
                    w + ".type");
}

json parse_tools(const json& body) {
  const json* tools = field(body, "tools");
  if (!tools) return json::array();
  if (!tools->is_array()) throw bad_request("'tools' must be an array", "tools");
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string w = at("tools", i);
    const json& t = (*tools)[i];
    if (!t.is_object()) throw bad_request(w + " must be an object", w);
    const std::string type = need_string(t, "type", w);
    if (type != "function")
      throw bad_request(w + ".type \"" + type + "\" is not supported: only function tools are (spool runs no hosted tools)", w + ".type");
    if (field(t, "function") && !field(t, "name"))
      throw bad_request(w + ".name must be a string (the Responses API's tools are flat: {\"type\": \"function\", \"name\", "
                        "\"parameters\"}, not chat's {\"function\": {...}})", w + ".name");
    if (need_string(t, "name", w).empty()) throw bad_request(w + ".name must not be empty", w + ".name");
    if (const json* d = field(t, "description"); d && !d->is_string()) throw bad_request(w + ".description must be a string", w + ".description");
    if (const json* p = field(t, "parameters"); p && !p->is_object()) throw bad_request(w + ".parameters must be an object", w + ".parameters");
    if (const json* s = field(t, "strict"); s && !s->is_boolean()) throw bad_request(w + ".strict must be a boolean", w + ".strict");
  }
  return *tools;
}

// tool_choice: "auto", "none", "required" (a call to one of the tools, forced by constrained
// decoding) or {"type": "function", "name"} (that call). allowed_tools and other types: 400.
json parse_tool_choice(const json& body, const json& tools) {
  const json* c = field(body, "tool_choice");
  if (!c) return "auto";
  if (*c == "auto" || *c == "none") return *c;
  if (*c == "required") {
    if (tools.empty()) throw bad_request("tool_choice \"required\" needs 'tools'", "tool_choice");
    return *c;
  }
  if (c->is_object()) {
    const json* type = field(*c, "type");
    const std::string t = type && type->is_string() ? type->get<std::string>() : "";
    if (t == "function") {
      const std::string name = need_string(*c, "name", "tool_choice");
      bool found = false;
      for (const json& tool : tools) found = found || (tool.contains("name") && tool["name"] == name);
      if (!found) throw bad_request("tool_choice.name \"" + name + "\" is not among 'tools'", "tool_choice.name");
      return json{{"type", "function"}, {"name", name}};
    }
    if (t == "allowed_tools") throw bad_request("tool_choice of type \"allowed_tools\" is not supported", "tool_choice");
    throw bad_request("tool_choice of type \"" + t + "\" is not supported: only function tools are", "tool_choice");
  }
  throw bad_request("'tool_choice' must be \"auto\", \"none\", \"required\" or an object", "tool_choice");
}

json parse_metadata(const json& body) {
  const json* m = field(body, "metadata");
  if (!m) return json::object();
  if (!m->is_object()) throw bad_request("'metadata' must be an object of string values", "metadata");
  if (m->size() > 16) throw bad_request("'metadata' has more than 16 keys", "metadata");
  for (const auto& [k, v] : m->items()) {
    if (k.size() > 64) throw bad_request("'metadata' keys must be at most 64 characters", "metadata");
    if (!v.is_string() || v.get_ref<const std::string&>().size() > 512)
      throw bad_request("'metadata' values must be strings of at most 512 characters", "metadata");
  }
  return *m;
}

bool contains(std::string_view text, std::string_view what) { return text.find(what) != std::string_view::npos; }

}  // namespace

ResponsesRequest parse_responses_request(const json& body) {
  if (!body.is_object()) throw bad_request("the body must be a JSON object");
  ResponsesRequest r;
  const json* input = field(body, "input");
  if (!input) throw bad_request("'input' is required", "input");
  if (input->is_string()) {
    r.input.push_back(json{{"type", "message"}, {"role", "user"}, {"content", json::array({json{{"type", "input_text"}, {"text", *input}}})}});
  } else if (input->is_array()) {
    for (size_t i = 0; i < input->size(); ++i) r.input.push_back(normalize_item((*input)[i], at("input", i)));
  } else {
    throw bad_request("'input' must be a string or an array of input items", "input");
  }
  r.instructions = get_string(body, "instructions");
  r.tools = parse_tools(body);
  r.tool_choice = parse_tool_choice(body, r.tools);
  r.previous_response_id = get_string(body, "previous_response_id");
  if (r.previous_response_id && r.previous_response_id->empty()) throw bad_request("'previous_response_id' must not be empty", "previous_response_id");
  r.store = get_bool(body, "store").value_or(true);
  r.stream = get_bool(body, "stream").value_or(false);
  r.parallel_tool_calls = get_bool(body, "parallel_tool_calls").value_or(true);
  r.metadata = parse_metadata(body);
  r.max_output_tokens = get_int(body, "max_output_tokens", 1, std::numeric_limits<int32_t>::max());
  r.temperature = get_number(body, "temperature", 0, 2);
  r.top_p = get_number(body, "top_p", 0, 1);
  if (r.top_p && *r.top_p <= 0) throw bad_request("'top_p' must be in (0, 1]", "top_p");
  if (const json* re = field(body, "reasoning")) {
    if (!re->is_object()) throw bad_request("'reasoning' must be an object", "reasoning");
    if (const json* e = field(*re, "effort")) {
      static const char* kEfforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
      bool ok = false;
      for (const char* k : kEfforts) ok = ok || *e == k;
      if (!ok) throw bad_request("reasoning.effort must be one of none, minimal, low, medium, high, xhigh", "reasoning.effort");
      r.reasoning_effort = e->get<std::string>();
    }
    if (const json* s = field(*re, "summary")) {
      if (!s->is_string()) throw bad_request("reasoning.summary must be a string", "reasoning.summary");
      r.reasoning_summary = s->get<std::string>();
    }
  }
  if (const json* t = field(body, "text")) {
    if (!t->is_object()) throw bad_request("'text' must be an object", "text");
    if (const json* f = field(*t, "format")) {
      // {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "name", "schema", "strict"}:
      // the last two become the chat path's response_format (constrained decoding; checked there).
      const std::string type = f->is_object() && f->contains("type") && (*f)["type"].is_string() ? (*f)["type"].get<std::string>() : "";
      if (type == "json_object") {
        r.response_format = json{{"type", "json_object"}};
      } else if (type == "json_schema") {
        json js = json::object();
        for (const char* k : {"name", "schema", "strict", "description"})
          if (f->contains(k)) js[k] = (*f)[k];
        r.response_format = json{{"type", "json_schema"}, {"json_schema", js}};
      } else if (type != "text") {
        throw bad_request("text.format.type must be \"text\", \"json_object\" or \"json_schema\"", "text.format.type");
      }
    }
  }
  if (get_bool(body, "background").value_or(false)) throw bad_request("'background' responses are not supported", "background");
  if (field(body, "conversation")) throw bad_request("'conversation' is not supported; use previous_response_id", "conversation");
  if (field(body, "prompt")) throw bad_request("prompt templates ('prompt') are not supported", "prompt");
  if (field(body, "max_tool_calls")) throw bad_request("'max_tool_calls' is not supported", "max_tool_calls");
  if (auto k = get_int(body, "top_logprobs", 0, 20); k && *k > 0) throw bad_request("'top_logprobs' is not supported by /v1/responses", "top_logprobs");
  if (const json* inc = field(body, "include"); inc && !inc->is_array()) throw bad_request("'include' must be an array of strings", "include");
  for (const char* k : {"stop", "seed", "logit_bias", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"})
    if (const json* v = field(body, k)) r.extensions[k] = *v;
  return r;
}

json reasoning_kwargs(std::string_view text, const std::string& effort) {
  const bool off = effort == "none" || effort == "minimal";
  json k = json::object();
  if (contains(text, "reasoning_effort")) k["reasoning_effort"] = off ? "low" : effort == "xhigh" ? "high" : effort;
  if (contains(text, "enable_thinking")) k["enable_thinking"] = !off;
  else if (contains(text, "thinking is defined")) k["thinking"] = !off;
  return k;
}

int reasoning_effort_budget(std::string_view text, const std::string& effort) {
  if (contains(text, "reasoning_effort")) return -1;  // the template takes the effort itself (gpt-oss)
  if (effort == "none" || effort == "minimal") return 0;
  if (effort == "low") return kLowEffortBudget;
  if (effort == "medium") return kMediumEffortBudget;
  return -1;  // high, xhigh
}

json responses_chat_body(const ResponsesRequest& r, const json& history, std::string_view template_text) {
  json messages = json::array();
  if (r.instructions) messages.push_back(json{{"role", "system"}, {"content", *r.instructions}});
  std::string reasoning;  // reasoning items waiting for the assistant turn they belong to
  bool last_is_assistant = false;
  auto add_items = [&](const json& items) {
    for (const json& it : items) {
      const std::string& type = it["type"].get_ref<const std::string&>();
      if (type == "reasoning") {
        const std::string& t = it["content"][0]["text"].get_ref<const std::string&>();
        if (!reasoning.empty() && !t.empty()) reasoning += '\n';
        reasoning += t;
        continue;
      }
      if (type == "message") {
        std::string text;
        for (size_t i = 0; i < it["content"].size(); ++i) {
          if (i) text += '\n';
          text += it["content"][i]["text"].get_ref<const std::string&>();
        }
        json m{{"role", it["role"]}, {"content", text}};
        last_is_assistant = it["role"] == "assistant";
        if (last_is_assistant && !reasoning.empty()) m["reasoning_content"] = reasoning;
        if (last_is_assistant) reasoning.clear();
        messages.push_back(std::move(m));
      } else if (type == "function_call") {
        json call{{"id", it["call_id"]}, {"type", "function"}, {"function", json{{"name", it["name"]}, {"arguments", it["arguments"]}}}};
        if (!last_is_assistant) {
          json m{{"role", "assistant"}, {"content", ""}};
          if (!reasoning.empty()) m["reasoning_content"] = reasoning;
          reasoning.clear();
          messages.push_back(std::move(m));
          last_is_assistant = true;
        }
        messages.back()["tool_calls"].push_back(std::move(call));
      } else {  // function_call_output
        messages.push_back(json{{"role", "tool"}, {"tool_call_id", it["call_id"]}, {"content", it["output"]}});
        last_is_assistant = false;
      }
    }
  };
  add_items(history);
  add_items(r.input);
  if (messages.empty()) throw bad_request("'input' has no items (and there are no instructions or earlier turns)", "input");
  json body{{"messages", messages}};
  if (r.tool_choice != "none" && !r.tools.empty()) {
    json tools = json::array();
    for (const json& t : r.tools) {
      json fn{{"name", t["name"]}};
      if (t.contains("description") && !t["description"].is_null()) fn["description"] = t["description"];
      fn["parameters"] = t.contains("parameters") && !t["parameters"].is_null() ? t["parameters"] : json{{"type", "object"}, {"properties", json::object()}};
      tools.push_back(json{{"type", "function"}, {"function", fn}});
    }
    body["tools"] = tools;
  }
  if (r.tool_choice == "required") {
    body["tool_choice"] = "required";
  } else if (r.tool_choice.is_object()) {
    body["tool_choice"] = json{{"type", "function"}, {"function", {{"name", r.tool_choice["name"]}}}};
  }
  if (!r.response_format.is_null()) body["response_format"] = r.response_format;
  if (r.max_output_tokens) body["max_completion_tokens"] = *r.max_output_tokens;
  if (r.temperature) body["temperature"] = *r.temperature;
  if (r.top_p) body["top_p"] = *r.top_p;
  body["stream"] = r.stream;
  for (const auto& [k, v] : r.extensions.items()) body[k] = v;
  if (r.reasoning_effort) {
    json k = reasoning_kwargs(template_text, *r.reasoning_effort);
    if (!k.empty()) body["chat_template_kwargs"] = k;
    if (auto b = reasoning_effort_budget(template_text, *r.reasoning_effort); b >= 0 && !body.contains("thinking_budget_tokens"))
      body["thinking_budget_tokens"] = b;
  }
  return body;
}

}  // namespace spool::server
