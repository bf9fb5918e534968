#include "server/chat_prompt.h"

#include "server/chat_format.h"

#include <optional>

#include "common/error.h"
#include "server/api_error.h"
#include "server/json_body.h"

namespace spool::server {

namespace {

// Content as the templates expect it: a string (text parts joined with "\n") or null.
json normalize_content(const json& c, const std::string& where) {
  if (c.is_null() || c.is_string()) return c;
  if (!c.is_array()) throw bad_request(where + ".content must be a string, null or an array of text parts", where + ".content");
  std::string text;
  for (size_t i = 0; i < c.size(); ++i) {
    const json& part = c[i];
    const std::string pw = where + ".content[" + std::to_string(i) + "]";
    if (!part.is_object()) throw bad_request(pw + " must be an object", pw);
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) throw bad_request(pw + ".type must be a string", pw + ".type");
    if (*type != "text") throw bad_request(pw + ": only \"text\" content parts are supported (got \"" + type->get<std::string>() + "\")", pw + ".type");
    auto t = part.find("text");
    if (t == part.end() || !t->is_string()) throw bad_request(pw + ".text must be a string", pw + ".text");
    if (i > 0) text += "\n";
    text += t->get<std::string>();
  }
  return text;
}

json normalize_tool_calls(const json& calls, const std::string& where, bool parse_arguments) {
  if (!calls.is_array()) throw bad_request(where + ".tool_calls must be an array", where + ".tool_calls");
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string cw = where + ".tool_calls[" + std::to_string(i) + "]";
    const json& call = calls[i];
    if (!call.is_object()) throw bad_request(cw + " must be an object", cw);
    auto fn = call.find("function");
    if (fn == call.end() || !fn->is_object()) throw bad_request(cw + ".function must be an object", cw + ".function");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) throw bad_request(cw + ".function.name must be a string", cw + ".function.name");
    json c = call;
    auto args = fn->find("arguments");
    if (args != fn->end() && !args->is_string() && !args->is_object())
      throw bad_request(cw + ".function.arguments must be a JSON string", cw + ".function.arguments");
    if (parse_arguments && args != fn->end() && args->is_string()) {
      // The XML templates iterate arguments|items: give them the object the string encodes.
      json parsed = json::parse(args->get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (!parsed.is_object()) throw bad_request(cw + ".function.arguments must encode a JSON object", cw + ".function.arguments");
      c["function"]["arguments"] = parsed;
    }
    out.push_back(std::move(c));
  }
  return out;
}

json normalize_messages(const json& req, bool parse_arguments) {
  auto it = req.find("messages");
  if (it == req.end() || it->is_null()) throw bad_request("'messages' is required", "messages");
  if (!it->is_array()) throw bad_request("'messages' must be an array", "messages");
  if (it->empty()) throw bad_request("'messages' must not be empty", "messages");
  json out = json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json& m = (*it)[i];
    if (!m.is_object()) throw bad_request(where + " must be an object", where);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) throw bad_request(where + ".role must be a string", where + ".role");
    static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool"};
    bool known = false;
    for (const char* r : kRoles) known = known || *role == r;
    if (!known) throw bad_request(where + ".role \"" + role->get<std::string>() + "\" is not one of system, developer, user, assistant, tool", where + ".role");
    json n = m;
    if (*role == "developer") n["role"] = "system";  // OpenAI's newer name for the system role
    auto content = m.find("content");
    auto calls = m.find("tool_calls");
    const bool has_content = content != m.end() && !content->is_null();
    const bool has_calls = calls != m.end() && calls->is_array() && !calls->empty();
    // A turn with nothing in it would render as an empty turn and the model would generate to
    // the end of the context: refused, as OpenAI refuses it.
    if (!has_content && !has_calls)
      throw bad_request(where + " has neither 'content' nor 'tool_calls': give the message's text (assistant turns may "
                        "instead carry tool_calls, with null content)", where + ".content");
    // null / missing content (assistant tool-call turns) becomes "": templates test it with `in`
    // and string operations (Qwen3's fails on None, as it does in transformers).
    n["content"] = content == m.end() || content->is_null() ? json("") : normalize_content(*content, where);
    if (auto r = m.find("reasoning_content"); r != m.end() && !r->is_null() && !r->is_string())
      throw bad_request(where + ".reasoning_content must be a string", where + ".reasoning_content");
    if (auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null()) n["tool_calls"] = normalize_tool_calls(*tc, where, parse_arguments);
    out.push_back(std::move(n));
  }
  return out;
}

json normalize_tools(const json& req) {
  auto it = req.find("tools");
  if (it == req.end() || it->is_null()) return json();
  if (!it->is_array()) throw bad_request("'tools' must be an array", "tools");
  for (size_t i = 0; i < it->size(); ++i) {
    const std::string w = "tools[" + std::to_string(i) + "]";
    const json& t = (*it)[i];
    if (!t.is_object()) throw bad_request(w + " must be an object", w);
    auto type = t.find("type");
    if (type != t.end() && *type != "function") throw bad_request(w + ".type must be \"function\"", w + ".type");
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) throw bad_request(w + ".function must be an object", w + ".function");
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get_ref<const std::string&>().empty())
      throw bad_request(w + ".function.name must be a non-empty string", w + ".function.name");
    auto params = fn->find("parameters");
    if (params != fn->end() && !params->is_null() && !params->is_object())
      throw bad_request(w + ".function.parameters must be an object", w + ".function.parameters");
  }
  return it->empty() ? json() : *it;
}

// tool_choice: "auto" (default), "none", "required" (a call of one of the tools is forced) or
// {"type": "function", "function": {"name": N}} (a call of N is forced). Sets the forced call
// in `out`; returns false for "none" (tool calls are not parsed).
bool parse_tool_choice(const json& req, const json& tools, ChatPrompt& out) {
  auto it = req.find("tool_choice");
  if (it == req.end() || it->is_null() || *it == "auto") return true;
  if (*it == "none") return false;
  if (*it == "required") {
    if (tools.is_null()) throw bad_request("tool_choice \"required\" needs 'tools'", "tool_choice");
    out.force_tool = true;
    return true;
  }
  if (it->is_object()) {
    auto type = it->find("type");
    auto fn = it->find("function");
    auto name = fn != it->end() && fn->is_object() ? fn->find("name") : it->end();
    if (type == it->end() || *type != "function" || fn == it->end() || !fn->is_object() || name == fn->end() || !name->is_string())
      throw bad_request("'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice");
    const std::string n = name->get<std::string>();
    bool known = false;
    if (tools.is_array())
      for (const auto& t : tools) known = known || t["function"]["name"] == n;
    if (!known) throw bad_request("tool_choice names function '" + n + "', which is not in 'tools'", "tool_choice.function.name");
    out.force_tool = true;
    out.forced_tool = n;
    return true;
  }
  throw bad_request("'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    "tool_choice");
}


}  // namespace

ChatPrompt render_chat(const json& req, const ChatTemplateInfo& info, bool allow_template_override) {
  std::optional<tmpl::Template> override_tmpl;
  const tmpl::Template* t = info.tmpl;
  std::optional<std::string> override_text = get_string(req, "chat_template");
  if (override_text && !allow_template_override) throw bad_request("'chat_template' is only accepted by /apply-template", "chat_template");
  ToolSyntax syntax = info.tool_syntax;
  if (override_text) {
    try {
      override_tmpl.emplace(tmpl::Template::parse(*override_text, "request chat_template"));
    } catch (const Error& e) {
      throw bad_request(std::string("chat_template: ") + e.what(), "chat_template");
    }
    t = &*override_tmpl;
    syntax = detect_tool_syntax(*override_text);
  }
  if (t == nullptr) throw bad_request("the model has no chat template; use /v1/completions with a raw prompt");
  ChatPrompt out;
  // Templates other than Qwen3's JSON one iterate or tojson the arguments: they get objects.
  json messages = normalize_messages(req, syntax != ToolSyntax::kQwen3Json && syntax != ToolSyntax::kNone);
  out.tools = normalize_tools(req);
  const bool enabled = parse_tool_choice(req, out.tools, out);
  tmpl::ChatOptions opt;
  opt.add_generation_prompt = get_bool(req, "add_generation_prompt").value_or(true);
  opt.tools = out.tools;
  json kwargs = info.default_kwargs.is_object() ? info.default_kwargs : json::object();
  if (auto it = req.find("chat_template_kwargs"); it != req.end() && !it->is_null()) {
    if (!it->is_object()) throw bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    for (const auto& [k, v] : it->items()) kwargs[k] = v;
  }
  opt.extra_kwargs = kwargs;
  try {
    out.text = tmpl::apply_chat_template(*t, messages, opt, info.special_tokens);
  } catch (const Error& e) {
    throw bad_request(std::string("chat template: ") + e.what(), "messages");
  }
  // tool_choice "none": the Qwen formats parse as kNone (as before); the family formats keep
  // their reasoning syntax with tool calls off.
  const bool qwen = syntax == ToolSyntax::kNone || syntax == ToolSyntax::kQwen3Json || syntax == ToolSyntax::kQwen35Xml;
  out.syntax = enabled || !qwen ? syntax : ToolSyntax::kNone;
  out.tool_calls = enabled;
  out.starts_in_reasoning = opt.add_generation_prompt && prompt_opens_reasoning(syntax, out.text);
  return out;
}

}  // namespace spool::server
