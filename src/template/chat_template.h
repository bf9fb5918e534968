// Chat-template engine: a Jinja2 interpreter that renders Hugging Face chat templates
// byte-identically to transformers' apply_chat_template(tokenize=False).
//
// transformers renders with jinja2's ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True, extensions=[loopcontrols, {% generation %}]), a `tojson` filter that is
// json.dumps(ensure_ascii=False) and the globals raise_exception / strftime_now. This module
// reimplements exactly that dialect: Python value semantics (repr, int/float, slicing, str
// methods), Undefined, jinja2 scoping, macros/call blocks, loop variables and most builtin
// filters and tests.
//
// Deliberately unsupported (a spool::Error, never a wrong prompt): the extends / include /
// import / from / block / autoescape tags (rejected at parse time), the filters pprint, random,
// striptags, urlize, urlencode, wordwrap, xmlattr and filesizeformat, the globals lipsum and
// cycler, and integers beyond 64 bits. Extensions over transformers: list.append() works
// (the sandbox forbids it) and an `is startingwith` test exists.
//
// Templates come from model repositories, so rendering is bounded: recursion depth, steps,
// memory and output size are limited (RenderLimits) and every failure is a spool::Error,
// never a crash or a hang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace spool::tmpl {

namespace ast {
struct Program;
}

/// Resource bounds of one render; exceeding any of them throws spool::Error.
struct RenderLimits {
  size_t max_output_bytes = 64u << 20;  ///< rendered text and any single string value
  uint64_t max_steps = 20'000'000;      ///< evaluated expressions + executed statements
  int max_call_depth = 100;             ///< nested macro calls (recursion)
  /// Combined statement/expression recursion depth; bounds C++ stack use (about 0.35 KB per
  /// level in optimized builds, ~2.5 KB under AddressSanitizer). Lower it for small thread stacks.
  int max_nesting = 1500;
  size_t max_heap_cells = 8u << 20;     ///< objects + container elements allocated
};

/// A compiled template: parse once, render many times (render is const and thread-safe).
class Template {
 public:
  /// Parses `source`; `label` names the template in error messages (e.g. a file name).
  /// Throws spool::Error on syntax errors, unknown filters/tests and unsupported tags
  /// (extends, include, import, from, block, autoescape).
  static Template parse(std::string_view source, const std::string& label);

  /// Renders with `context` as the template variables (object keys keep their order, which
  /// tojson and items() expose). Throws spool::Error for raise_exception(...) (what() is exactly
  /// the template's message), runtime type errors and exceeded limits.
  std::string render(const nlohmann::ordered_json& context) const;
  /// render() with explicit resource limits.
  std::string render(const nlohmann::ordered_json& context, const RenderLimits& limits) const;

  /// The label given to parse().
  const std::string& label() const;

 private:
  std::shared_ptr<const ast::Program> prog_;
};

/// Options of apply_chat_template.
struct ChatOptions {
  /// Append the assistant header so the model starts a reply.
  bool add_generation_prompt = true;
  /// Tool JSON schemas (array) or null for "no tools argument".
  nlohmann::ordered_json tools;
  /// Extra template variables (enable_thinking, preserve_thinking, ...); an object or null.
  nlohmann::ordered_json extra_kwargs;
  /// Resource limits of the render.
  RenderLimits limits;
};

/// Renders a chat template like transformers' apply_chat_template(tokenize=False). The context
/// is, in increasing priority: special tokens, extra_kwargs, then messages, tools,
/// documents (always null) and add_generation_prompt. Like transformers, `tools` is passed even
/// when null (so `tools is none` holds and `tools is defined` is true), and an empty
/// conversation is an error.
std::string apply_chat_template(const Template& t, const nlohmann::ordered_json& messages, const ChatOptions& opt,
                                const nlohmann::ordered_json& special_tokens);

/// Special-token strings from a tokenizer_config.json object: bos/eos/unk/sep/pad/cls/mask
/// tokens given as a string or an AddedToken object {"content": ...}; null or absent ones are
/// omitted (transformers' special_tokens_map).
nlohmann::json special_tokens_from_config(const nlohmann::ordered_json& tokenizer_config);

}  // namespace spool::tmpl
