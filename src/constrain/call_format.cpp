#include "constrain/call_format.h"

#include "common/json_string.h"

namespace spool::constrain {

using json = nlohmann::ordered_json;

namespace {

// A format's common fields; the XML parameter markup, the JSON dialect and name_in_json_string
// keep their defaults (the caller sets them where its format differs).
CallFormat make_format(const char* name, std::string begin, std::string after_name, ArgsSyntax args, std::string end,
                       std::string reasoning_close, std::vector<std::string> special) {
  CallFormat f;
  f.name = name;
  f.begin = std::move(begin);
  f.after_name = std::move(after_name);
  f.args = args;
  f.end = std::move(end);
  f.reasoning_close = std::move(reasoning_close);
  f.special_markup = std::move(special);
  return f;
}

CallFormat json_args_format(const char* name, std::string begin, std::string after_name, std::string end, std::string reasoning_close,
                            std::vector<std::string> special) {
  return make_format(name, std::move(begin), std::move(after_name), ArgsSyntax::kJson, std::move(end), std::move(reasoning_close),
                     std::move(special));
}

}  // namespace

CallFormat qwen3_json_format() {
  CallFormat f = json_args_format("qwen3_json", "<tool_call>\n{\"name\": \"", "\", \"arguments\": ", "}\n</tool_call>", "</think>",
                                  {"<tool_call>", "</tool_call>", "</think>"});
  f.name_in_json_string = true;
  return f;
}

CallFormat qwen35_xml_format() {
  return make_format("qwen35_xml", "<tool_call>\n<function=", ">\n", ArgsSyntax::kXml, "</function>\n</tool_call>", "</think>",
                     {"<tool_call>", "</tool_call>", "</think>"});
}

CallFormat deepseek_v3_format() {
  return json_args_format("deepseek_v3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>", "<｜tool▁sep｜>",
                          "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", "</think>",
                          {"<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "</think>"});
}

CallFormat kimi_k2_format() {
  return json_args_format("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.", ":0<|tool_call_argument_begin|>",
                          "<|tool_call_end|><|tool_calls_section_end|>", "</think>",
                          {"<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                           "<|tool_calls_section_end|>", "</think>"});
}

CallFormat glm4_5_format() {
  CallFormat f = make_format("glm4_5", "<tool_call>", "\n", ArgsSyntax::kXml, "</tool_call>", "</think>",
                             {"<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "</think>"});
  f.xml = XmlParams{"<arg_key>", "</arg_key>\n<arg_value>", "</arg_value>\n"};
  return f;
}

CallFormat minimax_m2_format() {
  CallFormat f = make_format("minimax_m2", "<minimax:tool_call>\n<invoke name=\"", "\">\n", ArgsSyntax::kXml,
                             "</invoke>\n</minimax:tool_call>", "</think>", {"<minimax:tool_call>", "</minimax:tool_call>", "</think>"});
  f.xml = XmlParams{"<parameter name=\"", "\">", "</parameter>\n"};
  return f;
}

CallFormat gpt_oss_format() {
  return json_args_format("gpt_oss", " to=functions.", "<|channel|>commentary json<|message|>", "<|call|>", "",
                          {"<|channel|>", "<|message|>", "<|call|>"});
}

CallFormat mistral_format() {
  return json_args_format("mistral", "[TOOL_CALLS]", "[ARGS]", "", "[/THINK]", {"[TOOL_CALLS]", "[ARGS]", "[/THINK]"});
}

CallFormat ernie4_5_format() {
  CallFormat f = qwen3_json_format();
  f.name = "ernie4_5";
  return f;
}

CallFormat gemma4_format() {
  CallFormat f =
      json_args_format("gemma4", "<|tool_call>call:", "", "<tool_call|>", "<channel|>", {"<|tool_call>", "<tool_call|>", "<|\"|>", "<channel|>"});
  f.dialect = JsonDialect::gemma();
  return f;
}

namespace {

// root ::= (reasoning)? body, reasoning ::= until(close) ("" | "\n" | "\n\n").
int32_t with_reasoning(GrammarBuilder& g, int32_t body, bool in_reasoning, const std::string& close) {
  if (!in_reasoning || close.empty()) return body;
  const int32_t text = g.until("reasoning", close);
  const int32_t gap = g.rule("gap", {{}, g.lit("\n"), g.lit("\n\n")});
  return g.rule("root", {{GrammarBuilder::ref(text), GrammarBuilder::ref(gap), GrammarBuilder::ref(body)}});
}

}  // namespace

std::shared_ptr<const Constraint> compile_tool_call(const CallFormat& fmt, const std::vector<ToolSpec>& tools, bool in_reasoning) {
  if (tools.empty()) fail("constrained decoding: a forced tool call needs at least one tool");
  GrammarBuilder g;
  const int32_t call = g.rule("call");
  for (const ToolSpec& t : tools) {
    const std::string path = "tools[" + t.name + "].parameters";
    // Each tool's schema resolves its own $refs.
    SchemaCompiler sc(g, t.parameters, fmt.dialect);
    int32_t args = -1;
    if (fmt.args == ArgsSyntax::kXml) {
      args = sc.xml_arguments(t.parameters, fmt.xml, path);
    } else if (t.parameters.is_null() || (t.parameters.is_object() && t.parameters.empty())) {
      args = sc.any_object();
    } else {
      const json& p = t.parameters;
      if (p.is_object() && p.contains("type") && p["type"] != "object")
        throw SchemaError(strfmt("tool '%s': parameters must be of type object", t.name.c_str()));
      args = sc.value(p, path);
    }
    std::string name = t.name;
    if (fmt.name_in_json_string) {
      name.clear();
      append_json_string(name, t.name);
      name = name.substr(1, name.size() - 2);
    }
    Seq s = g.lit(fmt.begin + name + fmt.after_name);
    s.push_back(GrammarBuilder::ref(args));
    for (auto e : g.lit(fmt.end)) s.push_back(e);
    g.alt(call, std::move(s));
  }
  auto c = std::make_shared<Constraint>();
  c->grammar = g.build(with_reasoning(g, call, in_reasoning, fmt.reasoning_close));
  c->special_texts = fmt.special_markup;
  c->what = tools.size() == 1 ? "tool call of " + tools[0].name : "tool call";
  return c;
}

std::shared_ptr<const Constraint> compile_json(const json* schema, bool in_reasoning, const std::string& reasoning_close) {
  GrammarBuilder g;
  static const json kNull;
  SchemaCompiler sc(g, schema ? *schema : kNull);
  const int32_t body = schema ? sc.value(*schema, "schema") : sc.any_object();
  auto c = std::make_shared<Constraint>();
  c->grammar = g.build(with_reasoning(g, body, in_reasoning, reasoning_close));
  if (!reasoning_close.empty() && in_reasoning) c->special_texts = {reasoning_close};
  c->what = schema ? "JSON schema" : "JSON object";
  return c;
}

}  // namespace spool::constrain
