// spool template: the chat-template command group.
//   spool template render  conversation -> the prompt text the chat template renders (stdout)
// The group holds one subcommand per tool over a chat template (render here; the output parsers'
// `parse` goes beside it, reusing TemplateSource).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli/common.h"
#include "common/error.h"
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
  ordered_json special_tokens = ordered_json::object();  ///< the model's (empty without --model)
};

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
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0)
    fail("cannot write the rendered prompt to stdout");
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

}  // namespace

void register_template(CLI::App& app) {
  CLI::App* group = app.add_subcommand("template", "Chat templates: render a conversation as the model's prompt");
  group->require_subcommand(1);
  register_render(group);
}

}  // namespace spool::cli
