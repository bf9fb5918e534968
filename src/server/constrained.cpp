#include "server/constrained.h"

#include "common/error.h"
#include "server/api_error.h"
#include "server/json_body.h"

namespace spool::server {

using ojson = nlohmann::ordered_json;

const constrain::CallFormat* call_format_for(ToolSyntax s) {
  static const constrain::CallFormat kQwen3 = constrain::qwen3_json_format();
  static const constrain::CallFormat kQwen35 = constrain::qwen35_xml_format();
  static const constrain::CallFormat kDeepSeek = constrain::deepseek_v3_format();
  static const constrain::CallFormat kKimi = constrain::kimi_k2_format();
  static const constrain::CallFormat kGlm = constrain::glm4_5_format();
  static const constrain::CallFormat kMiniMax = constrain::minimax_m2_format();
  static const constrain::CallFormat kGptOss = constrain::gpt_oss_format();
  static const constrain::CallFormat kMistral = constrain::mistral_format();
  static const constrain::CallFormat kErnie = constrain::ernie4_5_format();
  static const constrain::CallFormat kGemma = constrain::gemma4_format();
  switch (s) {
    case ToolSyntax::kQwen3Json:
      return &kQwen3;
    case ToolSyntax::kQwen35Xml:
      return &kQwen35;
    case ToolSyntax::kDeepSeekV3:
      return &kDeepSeek;
    case ToolSyntax::kKimiK2:
      return &kKimi;
    case ToolSyntax::kGlm45:
      return &kGlm;
    case ToolSyntax::kMiniMaxM2:
      return &kMiniMax;
    case ToolSyntax::kGptOss:
      return &kGptOss;
    case ToolSyntax::kMistral:
      return &kMistral;
    case ToolSyntax::kErnie45:
      return &kErnie;
    case ToolSyntax::kGemma4:
      return &kGemma;
    default:
      return nullptr;
  }
}

ForcedOutput parse_response_format(const ojson& body) {
  auto it = body.find("response_format");
  if (it == body.end() || it->is_null()) return {};
  if (!it->is_object()) throw bad_request("'response_format' must be an object", "response_format");
  auto type = it->find("type");
  if (type == it->end() || !type->is_string())
    throw bad_request("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"", "response_format.type");
  if (*type == "text") return {};
  if (*type == "json_object") return ForcedOutput{ForcedOutput::kJson, "", nullptr};
  if (*type != "json_schema")
    throw bad_request("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"", "response_format.type");
  auto js = it->find("json_schema");
  if (js == it->end() || !js->is_object())
    throw bad_request("'response_format.json_schema' must be an object with 'name' and 'schema'", "response_format.json_schema");
  auto name = js->find("name");
  if (name == js->end() || !name->is_string() || name->get_ref<const std::string&>().empty())
    throw bad_request("'response_format.json_schema.name' must be a non-empty string", "response_format.json_schema.name");
  if (auto strict = js->find("strict"); strict != js->end() && !strict->is_null() && !strict->is_boolean())
    throw bad_request("'response_format.json_schema.strict' must be a boolean", "response_format.json_schema.strict");
  auto schema = js->find("schema");
  if (schema == js->end() || schema->is_null()) return ForcedOutput{ForcedOutput::kJson, "", ojson::object()};  // any JSON value
  if (!schema->is_object() && !schema->is_boolean())
    throw bad_request("'response_format.json_schema.schema' must be a JSON Schema object", "response_format.json_schema.schema");
  return ForcedOutput{ForcedOutput::kJson, "", *schema};
}

void attach_constraint(GenRequest& r, const ModelFacts& facts, const ChatPrompt& prompt, const ForcedOutput& what,
                       const std::string& field) {
  if (what.kind == ForcedOutput::kNone) return;
  std::shared_ptr<const constrain::Constraint> c;
  try {
    if (what.kind == ForcedOutput::kToolCall) {
      const constrain::CallFormat* fmt = call_format_for(prompt.syntax);
      if (!fmt)
        throw bad_request("forcing a tool call needs a chat template with a known tool-call syntax (this model's has none "
                          "spool can constrain); use tool_choice \"auto\"",
                          field);
      if (!prompt.tools.is_array() || prompt.tools.empty()) throw bad_request("forcing a tool call needs 'tools'", field);
      std::vector<constrain::ToolSpec> tools;
      for (const auto& t : prompt.tools) {
        const ojson& fn = t["function"];
        const std::string name = fn["name"].get<std::string>();
        if (!what.tool.empty() && name != what.tool) continue;
        auto p = fn.find("parameters");
        tools.push_back({name, p == fn.end() ? ojson() : *p});
      }
      if (tools.empty()) throw bad_request("the forced function '" + what.tool + "' is not in 'tools'", field);
      c = constrain::compile_tool_call(*fmt, tools, prompt.starts_in_reasoning);
    } else {
      const constrain::CallFormat* fmt = call_format_for(prompt.syntax);
      const std::string close = fmt ? fmt->reasoning_close : "</think>";
      c = constrain::compile_json(what.schema.is_null() ? nullptr : &what.schema, prompt.starts_in_reasoning, close);
    }
  } catch (const constrain::SchemaError& e) {
    throw bad_request(std::string("constrained decoding: ") + e.what(), field);
  }
  r.constraint = std::move(c);
  r.constraint_index = facts.token_index ? facts.token_index->get() : constrain::TokenIndex::from_tokenizer(*facts.tok, facts.vocab_size);
}

}  // namespace spool::server
