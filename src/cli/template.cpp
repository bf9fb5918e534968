// spool template: the chat-template command group.
//   spool template render  conversation -> the prompt text the chat template renders (stdout)
//   spool template parse   model output text (stdin) -> the assistant message the server's output
//                          parser makes of it (JSON on stdout), to see why a call did not parse
// Both take the template from --model / --template (TemplateSource).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/common.h"
#include "common/error.h"
#include "common/utf8.h"
#include "io/config.h"
#include "models/family.h"
#include "server/api_error.h"
#include "server/chat_format.h"
#include "server/chat_prompt.h"
#include "server/output_parser.h"
#include "template/chat_template.h"

namespace spool::cli {

namespace {

using nlohmann::ordered_json;

// ------------------------------------------------------------------ shared by the subcommands

/// Where a subcommand takes its chat template from: --model (a model directory or .gguf: its
/// template as serve / generate find it, chat_template.jinja before tokenizer_config.json's, and
/// its special tokens) and/or --template (a Jinja file, which replaces the model's template).
struct TemplateSource {
  std::string model;          ///< --model ("" = none)
  std::string template_file;  ///< --template ("" = none)

  /// Adds --model and --template to `c`.
  void add_to(CLI::App* c) {
    c->add_option("-m,--model", model,
                  "Model directory or .gguf: use its chat template and its special tokens (bos_token, eos_token, ...)");
    c->add_option("--template", template_file,
                  "Jinja chat template file (replaces the model's template; without --model there are no special tokens: "
                  "pass them with --kwargs, e.g. '{\"bos_token\": \"<s>\"}')");
  }
};

/// A chat template ready to render.
struct LoadedTemplate {
  std::optional<tmpl::Template> tmpl;
  std::string text;  ///< the template source (what detect_chat_format reads)
  ordered_json special_tokens = ordered_json::object();  ///< the model's (empty without --model)
  /// The model's family when --model is a directory whose config.json names a known model_type
  /// (its chat formats are the fallback, as in the server); null otherwise.
  const models::Family* family = nullptr;
};

// Writes `text` to stdout, byte for byte, and flushes; spool::Error naming `what` when it cannot.
void write_stdout(const std::string& text, const char* what) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0)
    fail("cannot write %s to stdout", what);
}

/// Loads the template `s` describes. UsageError when neither --model nor --template is given;
/// spool::Error naming the path for a missing file, a model without tokenizer or chat template,
/// and a template that does not parse.
LoadedTemplate load_template(const TemplateSource& s) {
  if (s.model.empty() && s.template_file.empty()) throw UsageError("give --model M (its chat template) or --template F");
  LoadedTemplate out;
  std::string text, label;
  if (!s.model.empty()) {
    ModelOptions mo;
    mo.model = s.model;
    const std::string dir = mo.dir();  // exists, and is a directory or a .gguf
    std::optional<tokenizer::Tokenizer> tok = engine::load_tokenizer(dir);
    if (!tok)
      fail("%s has no tokenizer (tokenizer.json, or a .gguf's tokenizer.ggml.* metadata), so no chat template and special "
           "tokens; give --template F",
           dir.c_str());
    out.special_tokens = tmpl::special_tokens_from_config(ordered_json(tok->config()));
    if (std::filesystem::is_regular_file(dir + "/config.json")) {
      const io::Config c = io::Config::load_file(dir + "/config.json");
      out.family = models::family_of_model_type(c.get_string("model_type", ""));
    }
    if (s.template_file.empty()) {
      if (tok->chat_template().empty())
        fail("%s has no chat template (chat_template.jinja, tokenizer_config.json \"chat_template\" or a .gguf's "
             "tokenizer.chat_template); give --template F",
             dir.c_str());
      text = tok->chat_template();
      label = dir + " chat template";
    }
  }
  if (!s.template_file.empty()) {
    text = read_file(s.template_file);
    label = s.template_file;
  }
  out.tmpl.emplace(tmpl::Template::parse(text, label));
  out.text = std::move(text);
  return out;
}

/// The JSON an option gives: the text itself, or with "@path" the file's contents ("@-": stdin).
/// Throws spool::Error naming the option for an unreadable file or invalid JSON.
ordered_json json_arg(const std::string& option, const std::string& value) {
  std::string text;
  if (value == "@-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else if (!value.empty() && value[0] == '@') {
    text = read_file(value.substr(1));
  } else {
    text = value;
  }
  ordered_json j = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    const std::string from = value == "@-" ? " (stdin)" : !value.empty() && value[0] == '@' ? " (" + value.substr(1) + ")" : "";
    fail("%s: not valid JSON%s", option.c_str(), from.c_str());
  }
  return j;
}

// ------------------------------------------------------------------ render

struct RenderOptions {
  TemplateSource source;
  std::string messages, tools, kwargs;  // JSON or @file ("" = not given)
  bool no_generation_prompt = false;
};

void run_render(const RenderOptions& o, bool has_messages, bool has_tools, bool has_kwargs) {
  // Usage first, then the inputs, then the template (its errors name the model or file).
  if (o.source.model.empty() && o.source.template_file.empty()) throw UsageError("give --model M (its chat template) or --template F");
  if (!has_messages && isatty(STDIN_FILENO)) throw UsageError("give --messages JSON|@file, or pipe the messages to stdin");
  const ordered_json messages = json_arg("--messages", has_messages ? o.messages : "@-");
  if (!messages.is_array()) fail("--messages must be a JSON array of messages, e.g. '[{\"role\": \"user\", \"content\": \"Hi\"}]'");
  if (messages.empty()) fail("--messages is empty: there is no conversation to render");
  for (size_t i = 0; i < messages.size(); ++i)
    if (!messages[i].is_object()) fail("--messages[%zu] must be an object like {\"role\": ..., \"content\": ...}", i);
  tmpl::ChatOptions opt;
  opt.add_generation_prompt = !o.no_generation_prompt;
  if (has_tools) {
    opt.tools = json_arg("--tools", o.tools);
    if (!opt.tools.is_array() && !opt.tools.is_null()) fail("--tools must be a JSON array of tool definitions");
  }
  if (has_kwargs) {
    opt.extra_kwargs = json_arg("--kwargs", o.kwargs);
    if (!opt.extra_kwargs.is_object()) fail("--kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'");
  }
  const LoadedTemplate t = load_template(o.source);
  const std::string text = tmpl::apply_chat_template(*t.tmpl, messages, opt, t.special_tokens);
  write_stdout(text, "the rendered prompt");
}

void register_render(CLI::App* group) {
  auto o = std::make_shared<RenderOptions>();
  CLI::App* c = group->add_subcommand(
      "render",
      "Render a conversation with a chat template and print the prompt, byte for byte (transformers' "
      "apply_chat_template(tokenize=False); strftime_now uses SOURCE_DATE_EPOCH when set)");
  o->source.add_to(c);
  CLI::Option* messages = c->add_option("--messages", o->messages,
                                        "JSON array of messages, or @file (@- = stdin); default: read it from stdin");
  CLI::Option* tools = c->add_option("--tools", o->tools, "JSON array of tool definitions (OpenAI format), or @file");
  CLI::Option* kwargs = c->add_option("--kwargs", o->kwargs,
                                      "JSON object of extra template variables, or @file, e.g. '{\"enable_thinking\": false}'");
  c->add_flag("--no-generation-prompt", o->no_generation_prompt,
              "Do not append the assistant header (add_generation_prompt=false), e.g. to render a finished conversation");
  c->callback([o, messages, tools, kwargs] { run_render(*o, messages->count() > 0, tools->count() > 0, kwargs->count() > 0); });
}

// ------------------------------------------------------------------ parse

/// The conversation `parse` renders to find the generation prompt when neither
/// --generation-prompt nor --messages is given (only the prompt's end matters: whether it opens
/// reasoning, e.g. Qwen3.5's `<think>\n`).
constexpr const char* kDefaultMessages = R"([{"role": "user", "content": "Hi"}])";

struct ParseOptions {
  TemplateSource source;
  std::string tools, messages, kwargs;  // JSON or @file ("" = not given)
  std::string chat_format;              // registry name ("" = detect from the template)
  std::string generation_prompt;        // text or @file
};

/// A text option's value: the text itself, or with "@path" the file's contents.
std::string text_arg(const std::string& value) {
  return !value.empty() && value[0] == '@' ? read_file(value.substr(1)) : value;
}

/// The assistant message as the server's non-streaming chat completion writes it
/// (openai_format.cpp): content null when empty with tool calls, reasoning_content only when
/// there is reasoning, tool_calls only when there are calls (arguments a JSON string).
ordered_json message_json(const server::OutputParser& p) {
  ordered_json m;
  m["role"] = "assistant";
  m["content"] = p.content().empty() && !p.tool_calls().empty() ? ordered_json() : ordered_json(p.content());
  if (!p.reasoning().empty()) m["reasoning_content"] = p.reasoning();
  if (!p.tool_calls().empty()) {
    ordered_json calls = ordered_json::array();
    for (const auto& c : p.tool_calls())
      calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    m["tool_calls"] = std::move(calls);
  }
  return m;
}

void run_parse(const ParseOptions& o, bool has_tools, bool has_messages, bool has_kwargs, bool has_prompt) {
  // Usage first, then the inputs, then the template (its errors name the model or file).
  if (o.source.model.empty() && o.source.template_file.empty()) throw UsageError("give --model M (its chat template) or --template F");
  if (has_prompt && (has_messages || has_kwargs))
    throw UsageError("--generation-prompt replaces rendering --messages / --kwargs: give one or the other");
  for (const auto& [flag, v] : {std::pair<const char*, const std::string&>{"--tools", o.tools}, {"--messages", o.messages},
                                {"--kwargs", o.kwargs}, {"--generation-prompt", o.generation_prompt}})
    if (v == "@-") throw UsageError(std::string(flag) + " @-: stdin carries the model output; give a file");
  if (isatty(STDIN_FILENO)) throw UsageError("pipe the model output text to stdin, e.g. spool template parse --model M < out.txt");
  const server::ChatFormat* named = nullptr;
  if (!o.chat_format.empty()) {
    named = server::find_chat_format(o.chat_format);
    if (named == nullptr) {
      std::string names;
      for (const auto& f : server::chat_formats()) names += (names.empty() ? "" : ", ") + std::string(f.name);
      fail("--chat-format: unknown format '%s' (one of: %s)", o.chat_format.c_str(), names.c_str());
    }
  }
  ordered_json tools;  // null: none
  if (has_tools) {
    tools = json_arg("--tools", o.tools);
    if (!tools.is_array() && !tools.is_null()) fail("--tools must be a JSON array of tool definitions");
  }
  ordered_json messages = ordered_json::parse(kDefaultMessages);
  if (has_messages) {
    messages = json_arg("--messages", o.messages);
    if (!messages.is_array()) fail("--messages must be a JSON array of messages, e.g. '[{\"role\": \"user\", \"content\": \"Hi\"}]'");
  }
  ordered_json kwargs;
  if (has_kwargs) {
    kwargs = json_arg("--kwargs", o.kwargs);
    if (!kwargs.is_object()) fail("--kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'");
  }
  const std::string prompt_arg = has_prompt ? text_arg(o.generation_prompt) : std::string();
  const std::string text(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>{});
  if (!utf8::is_valid(text)) {
    size_t i = 0;
    while (i < text.size() && utf8::examine(text, i).status == utf8::SeqStatus::kValid) i += utf8::examine(text, i).len;
    fail("stdin: the model output is not valid UTF-8 (at byte %zu)", i);
  }
  const LoadedTemplate t = load_template(o.source);

  // What the server does per request (serving_engine.cpp, chat_prompt.cpp: render_chat): the
  // format is --chat-format or detected from the template, and the output starts inside
  // reasoning when the rendered generation prompt ends inside an open reasoning block.
  server::OutputParser::Options po;
  std::string note;
  po.syntax = named != nullptr ? named->id : server::resolve_chat_format(t.text, t.family, &note);
  if (!note.empty()) std::fprintf(stderr, "spool: %s\n", note.c_str());
  const char* prompt_from = "--generation-prompt";
  if (has_prompt) {
    po.starts_in_reasoning = server::prompt_opens_reasoning(po.syntax, prompt_arg);
    if (!tools.is_null() && !tools.empty()) po.tools = nlohmann::json::parse(tools.dump());
  } else {
    server::ChatTemplateInfo info;
    info.tmpl = &*t.tmpl;
    info.special_tokens = t.special_tokens;
    info.tool_syntax = po.syntax;
    info.source = t.text;
    ordered_json req = {{"messages", messages}};
    if (!tools.is_null()) req["tools"] = tools;
    if (!kwargs.is_null()) req["chat_template_kwargs"] = kwargs;
    server::ChatPrompt cp;
    try {
      cp = server::render_chat(req, info, /*allow_template_override=*/false);
    } catch (const server::ApiError& e) {
      fail("rendering the generation prompt (%s): %s; give --messages or --generation-prompt",
           has_messages ? "--messages" : "a one-user-message conversation", e.what());
    }
    po.starts_in_reasoning = cp.starts_in_reasoning;
    if (!cp.tools.is_null()) po.tools = nlohmann::json::parse(cp.tools.dump());
    prompt_from = has_messages ? "--messages rendered" : "a one-user-message conversation rendered";
  }
  server::OutputParser p(po);
  p.push(text);
  p.finish();

  // The diagnosis on stderr, the message on stdout.
  const server::ChatFormat& f = server::chat_format(po.syntax);
  std::fprintf(stderr, "spool: format %s (%s); the output starts %s reasoning (%s)\n", std::string(f.name).c_str(),
               named != nullptr ? "--chat-format" : "detected from the chat template",
               po.starts_in_reasoning ? "inside" : "outside", prompt_from);
  for (size_t i = 0; i < p.tool_calls().size(); ++i)
    if (!p.tool_calls()[i].complete)
      std::fprintf(stderr, "spool: tool call %zu (%s) is incomplete: its markup broke off or went wrong; the arguments were closed "
                   "and the rest of the text is content\n", i, p.tool_calls()[i].name.c_str());
  for (const std::string& mk : f.markup)
    if (p.content().find(mk) != std::string::npos) {
      std::fprintf(stderr, "spool: the content contains the format's markup '%s': text that did not parse as %s\n",
                   mk.c_str(), f.reasoning_open == mk || f.reasoning_close == mk ? "reasoning" : "a tool call");
      break;
    }
  const std::string out = message_json(p).dump(2) + "\n";
  write_stdout(out, "the parsed message");
}

void register_parse(CLI::App* group) {
  auto o = std::make_shared<ParseOptions>();
  CLI::App* c = group->add_subcommand(
      "parse",
      "Parse model output text (stdin) as the server does and print the assistant message as JSON: content, "
      "reasoning_content and tool_calls (arguments a JSON string); stderr says which format was used and what did not parse");
  o->source.add_to(c);
  CLI::Option* tools = c->add_option("--tools", o->tools,
                                     "JSON array of tool definitions (OpenAI format), or @file: their parameter schemas type "
                                     "arguments the format writes as text (GLM, MiniMax, Qwen XML)");
  c->add_option("--chat-format", o->chat_format,
                "Output format by name, as spool serve --chat-format (default: detected from the chat template)");
  CLI::Option* prompt = c->add_option("--generation-prompt", o->generation_prompt,
                                      "The prompt the output continues, or @file: output starts inside reasoning when it ends "
                                      "inside an open one (e.g. '<think>\\n'); default: render --messages");
  CLI::Option* messages = c->add_option("--messages", o->messages,
                                        "JSON array of messages, or @file, rendered (with --tools, --kwargs) to find the "
                                        "generation prompt; default: one user message");
  CLI::Option* kwargs = c->add_option("--kwargs", o->kwargs,
                                      "JSON object of extra template variables for that render, or @file, e.g. "
                                      "'{\"enable_thinking\": false}'");
  c->callback([o, tools, messages, kwargs, prompt] {
    run_parse(*o, tools->count() > 0, messages->count() > 0, kwargs->count() > 0, prompt->count() > 0);
  });
}

}  // namespace

void register_template(CLI::App& app) {
  CLI::App* group = app.add_subcommand(
      "template", "Chat templates: render a conversation as the model's prompt, parse model output as the server does");
  group->require_subcommand(1);
  register_render(group);
  register_parse(group);
}

}  // namespace spool::cli
