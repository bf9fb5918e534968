// The registry of output formats (chat_format.h).
#include "server/chat_format.h"

#include <algorithm>

#include "common/error.h"
#include "models/family.h"

namespace spool::server {

namespace {

bool has(std::string_view t, std::string_view m) { return t.find(m) != std::string_view::npos; }

std::vector<ChatFormat> make_formats() {
  std::vector<ChatFormat> v;
  auto add = [&](ToolSyntax id, std::string_view name, std::string_view desc, std::string_view ro,
                 std::string_view rc, std::vector<std::string> eot, std::vector<std::string> markup, bool special) {
    ChatFormat f;
    f.id = id;
    f.name = name;
    f.description = desc;
    f.reasoning_open = ro;
    f.reasoning_close = rc;
    f.end_of_turn = std::move(eot);
    f.markup = std::move(markup);
    f.keep_special_tokens = special;
    v.push_back(std::move(f));
  };
  add(ToolSyntax::kNone, "none", "no tool calls; Qwen <think> reasoning", "<think>", "</think>", {}, {"<think>", "</think>"},
      false);
  add(ToolSyntax::kQwen3Json, "qwen3_json", "Qwen3, Qwen3-Next, Hermes-style JSON <tool_call>", "<think>", "</think>",
      {"<|im_end|>", "<|endoftext|>"}, {"<think>", "</think>", "<tool_call>", "</tool_call>"}, false);
  add(ToolSyntax::kQwen35Xml, "qwen3_xml", "Qwen3.5/3.6, Qwen3-Coder XML <tool_call><function=...>", "<think>", "</think>",
      {"<|im_end|>", "<|endoftext|>"},
      {"<think>", "</think>", "<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>"},
      false);
  add(ToolSyntax::kDeepSeekV3, "deepseek_v3", "DeepSeek-V3, V3.1, R1", "<think>", "</think>", {"<｜end▁of▁sentence｜>"},
      {"<think>", "</think>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
       "<｜tool▁calls▁end｜>", "<｜end▁of▁sentence｜>"},
      true);
  add(ToolSyntax::kKimiK2, "kimi_k2", "Kimi-K2 instruct and thinking", "<think>", "</think>", {"<|im_end|>"},
      {"<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
       "<|tool_call_end|>", "<|tool_calls_section_end|>", "<|im_end|>"},
      true);
  add(ToolSyntax::kGlm45, "glm4_5", "GLM-4.5, 4.6, 4.7, 4.7-Flash", "<think>", "</think>",
      {"<|user|>", "<|observation|>", "<|endoftext|>"},
      {"<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
       "<|user|>", "<|observation|>"},
      true);
  add(ToolSyntax::kMiniMaxM2, "minimax_m2", "MiniMax-M2", "<think>", "</think>", {"[e~["},
      {"<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>", "<invoke name=", "</invoke>",
       "<parameter name=", "</parameter>", "[e~["},
      true);
  add(ToolSyntax::kGptOss, "gpt_oss", "gpt-oss (harmony)", "", "", {},
      {"<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"}, true);
  add(ToolSyntax::kMistral, "mistral", "Mistral, Mixtral, Magistral, Devstral ([TOOL_CALLS])", "[THINK]", "[/THINK]",
      {"</s>"}, {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]", "</s>"}, true);
  add(ToolSyntax::kErnie45, "ernie4_5", "ERNIE-4.5 (thinking: <response>, JSON <tool_call>)", "<think>", "</think>",
      {"</s>", "<|end_of_sentence|>"},
      {"<think>", "</think>", "<response>", "</response>", "<tool_call>", "</tool_call>"}, true);
  add(ToolSyntax::kGemma4, "gemma4", "Gemma 4", "<|channel>thought", "<channel|>", {"<turn|>"},
      {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|\"|>", "<turn|>"}, true);
  // How each family's template closes reasoning (the text injected when a thinking budget runs out).
  for (auto& f : v) {
    switch (f.id) {
      case ToolSyntax::kGlm45:
      case ToolSyntax::kKimiK2:
      case ToolSyntax::kMistral:
      case ToolSyntax::kGemma4: f.reasoning_end = std::string(f.reasoning_close); break;
      case ToolSyntax::kDeepSeekV3: f.reasoning_end = "</think>\n\n"; break;
      case ToolSyntax::kGptOss: f.reasoning_end = "<|end|><|start|>assistant<|channel|>final<|message|>"; break;
      default: f.reasoning_end = "\n" + std::string(f.reasoning_close) + "\n\n"; break;
    }
  }
  return v;
}

}  // namespace

const std::vector<ChatFormat>& chat_formats() {
  static const std::vector<ChatFormat> v = make_formats();
  return v;
}

const ChatFormat& chat_format(ToolSyntax id) {
  for (const auto& f : chat_formats())
    if (f.id == id) return f;
  return chat_formats().front();
}

const ChatFormat* find_chat_format(std::string_view name) {
  static const std::pair<std::string_view, ToolSyntax> aliases[] = {
      {"qwen3", ToolSyntax::kQwen3Json},        {"hermes", ToolSyntax::kQwen3Json},
      {"qwen3_coder", ToolSyntax::kQwen35Xml},  {"qwen3_5", ToolSyntax::kQwen35Xml},
      {"deepseek_v3_1", ToolSyntax::kDeepSeekV3}, {"deepseek_r1", ToolSyntax::kDeepSeekV3},
      {"kimi_k2_thinking", ToolSyntax::kKimiK2}, {"kimi_k2_instruct", ToolSyntax::kKimiK2},
      {"glm4_6", ToolSyntax::kGlm45},           {"glm4_7", ToolSyntax::kGlm45},
      {"glm4_7_flash", ToolSyntax::kGlm45},     {"gpt-oss", ToolSyntax::kGptOss},
      {"harmony", ToolSyntax::kGptOss},         {"magistral", ToolSyntax::kMistral},
      {"mixtral", ToolSyntax::kMistral},
  };
  for (const auto& f : chat_formats())
    if (f.name == name) return &f;
  for (const auto& [a, id] : aliases)
    if (a == name) return &chat_format(id);
  return nullptr;
}

ToolSyntax detect_chat_format(std::string_view t) {
  if (has(t, "<|channel|>") && has(t, "<|message|>")) return ToolSyntax::kGptOss;
  if (has(t, "tool▁calls▁begin") && has(t, "tool▁sep")) return ToolSyntax::kDeepSeekV3;
  if (has(t, "tool_calls_section_begin") && has(t, "<|tool_call_argument_begin|>")) return ToolSyntax::kKimiK2;
  if (has(t, "<minimax:tool_call>") && has(t, "<invoke name=")) return ToolSyntax::kMiniMaxM2;
  if (has(t, "<arg_key>") && has(t, "<arg_value>")) return ToolSyntax::kGlm45;
  if ((has(t, "<|tool_call>") || has(t, "<|turn>")) && has(t, "<turn|>")) return ToolSyntax::kGemma4;
  if (has(t, "[TOOL_CALLS]") && (has(t, "[INST]") || has(t, "[AVAILABLE_TOOLS]"))) return ToolSyntax::kMistral;
  if (has(t, "<response>") && has(t, "<tool_call>")) return ToolSyntax::kErnie45;
  if (has(t, "<tool_call>") && has(t, "<function=") && has(t, "<parameter=")) return ToolSyntax::kQwen35Xml;
  if (has(t, "<tool_call>") && has(t, "</tool_call>")) return ToolSyntax::kQwen3Json;
  return ToolSyntax::kNone;
}

ToolSyntax detect_tool_syntax(std::string_view chat_template) { return detect_chat_format(chat_template); }

ToolSyntax resolve_chat_format(std::string_view chat_template, const models::Family* family, std::string* note) {
  const ToolSyntax found = detect_chat_format(chat_template);
  if (family == nullptr || family->chat_formats.empty()) return found;
  std::vector<ToolSyntax> own;
  for (const std::string& n : family->chat_formats) {
    const ChatFormat* f = find_chat_format(n);
    if (f == nullptr) fail("family %s lists chat format '%s', which the server does not know", family->name.c_str(), n.c_str());
    own.push_back(f->id);
  }
  auto say = [&](std::string s) {
    if (note != nullptr) *note = std::move(s);
  };
  if (found == ToolSyntax::kNone) {
    say("the chat template has no tool-call syntax spool recognises; using " + family->name + "'s format " +
        std::string(chat_format(own.front()).name) + " (--chat-format overrides)");
    return own.front();
  }
  if (std::find(own.begin(), own.end(), found) == own.end())
    say("the chat template writes the " + std::string(chat_format(found).name) + " format, which " + family->name +
        " checkpoints do not use; parsing replies as " + std::string(chat_format(found).name) + " (--chat-format overrides)");
  return found;
}

bool prompt_opens_reasoning(ToolSyntax id, std::string_view prompt) {
  const ChatFormat& f = chat_format(id);
  if (f.reasoning_open.empty()) return false;
  size_t open = prompt.rfind(f.reasoning_open);
  if (open == std::string_view::npos) return false;
  for (size_t i = open + f.reasoning_open.size(); i < prompt.size(); ++i)
    if (prompt[i] != ' ' && prompt[i] != '\n' && prompt[i] != '\r' && prompt[i] != '\t') return false;
  return true;
}

}  // namespace spool::server
