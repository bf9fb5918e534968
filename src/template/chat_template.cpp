// Public chat-template API; see chat_template.h.
#include "template/chat_template.h"

#include <new>
#include <stdexcept>

#include "common/error.h"
#include "template/ast.h"
#include "template/evaluator.h"
#include "template/parser.h"

namespace spool::tmpl {

Template Template::parse(std::string_view source, const std::string& label) {
  Template t;
  try {
    t.prog_ = parse_program(source, label);
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw Error("template '" + label + "': out of memory while parsing");
  } catch (const std::exception& e) {
    throw Error("template '" + label + "': internal error: " + e.what());
  }
  return t;
}

const std::string& Template::label() const {
  static const std::string empty;
  return prog_ ? prog_->src.label : empty;
}

std::string Template::render(const nlohmann::ordered_json& context) const { return render(context, RenderLimits()); }

std::string Template::render(const nlohmann::ordered_json& context, const RenderLimits& limits) const {
  if (!prog_) throw Error("render() called on an empty Template");
  Interp in(*prog_, limits);
  try {
    return in.render(context);
  } catch (const RaisedError&) {
    throw;
  } catch (const Error& e) {
    throw Error("template '" + prog_->src.label + "': " + e.what() + " at " + prog_->src.where(in.offset()));
  } catch (const nlohmann::json::exception& e) {
    throw Error("template '" + prog_->src.label + "': bad context: " + e.what());
  } catch (const std::bad_alloc&) {
    throw Error("template '" + prog_->src.label + "': out of memory while rendering");
  } catch (const std::length_error& e) {
    throw Error("template '" + prog_->src.label + "': value too large (" + e.what() + ")");
  } catch (const std::exception& e) {
    throw Error("template '" + prog_->src.label + "': internal error: " + e.what());
  }
}

std::string apply_chat_template(const Template& t, const nlohmann::ordered_json& messages, const ChatOptions& opt,
                                const nlohmann::ordered_json& special_tokens) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  if (special_tokens.is_object()) {
    for (const auto& [k, v] : special_tokens.items()) ctx[k] = v;
  } else if (!special_tokens.is_null()) {
    throw Error("special_tokens must be a JSON object");
  }
  if (opt.extra_kwargs.is_object()) {
    for (const auto& [k, v] : opt.extra_kwargs.items()) ctx[k] = v;
  } else if (!opt.extra_kwargs.is_null()) {
    throw Error("chat template extra_kwargs must be a JSON object");
  }
  if (!messages.is_array()) throw Error("chat messages must be a JSON array");
  if (messages.empty()) throw Error("Cannot apply chat template to an empty conversation");
  if (!opt.tools.is_null() && !opt.tools.is_array()) throw Error("chat template tools must be a JSON array or null");
  ctx["messages"] = messages;
  ctx["tools"] = opt.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = opt.add_generation_prompt;
  return t.render(ctx, opt.limits);
}

nlohmann::json special_tokens_from_config(const nlohmann::ordered_json& cfg) {
  nlohmann::json out = nlohmann::json::object();
  if (!cfg.is_object()) return out;
  static const char* names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                "pad_token", "cls_token", "mask_token"};
  for (const char* name : names) {
    auto it = cfg.find(name);
    if (it == cfg.end() || it->is_null()) continue;
    if (it->is_string()) {
      out[name] = it->get<std::string>();
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      out[name] = (*it)["content"].get<std::string>();
    }
  }
  return out;
}

}  // namespace spool::tmpl
