// libFuzzer target for the Responses API request parser (src/server/responses_request.h): the
// HTTP body through parse_body, parse_responses_request and responses_chat_body (with the
// request's own items as the stored history too), then the chat request path's render_chat.
//
// Invariants checked (any violation aborts): bad input only ever throws ApiError with a 4xx
// status; an accepted request converts into a chat body whose messages render_chat accepts
// (every message has a role and string content; tool-call arguments are JSON objects), and the
// body serializes (dump_json).
//
// Build with cmake -DSPOOL_FUZZ=ON (clang); run e.g.: ./responses_request_fuzz -max_len=65536 corpus/
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/json_body.h"
#include "server/responses_request.h"

using namespace spool::server;

namespace {

[[noreturn]] void die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "responses_request_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

const spool::tmpl::Template& tiny_template() {
  static const spool::tmpl::Template t = spool::tmpl::Template::parse(
      "{% for m in messages %}{{ m.role }}: {{ m.content }}{% if m.tool_calls %}{% for c in m.tool_calls %}"
      "[{{ c.function.name }} {{ c.function.arguments }}]{% endfor %}{% endif %}\n{% endfor %}"
      "{% if enable_thinking is defined %}t{% endif %}",
      "fuzz template");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ResponsesRequest r;
  try {
    const json body = parse_body(text);
    r = parse_responses_request(body);
  } catch (const ApiError& e) {
    if (e.status < 400 || e.status >= 500) die("parse: not a 4xx", e.what());
    return 0;
  }
  json chat;
  try {
    chat = responses_chat_body(r, r.input, "enable_thinking reasoning_effort");
  } catch (const ApiError& e) {
    if (e.status != 400) die("chat body: not a 400", e.what());
    return 0;
  }
  (void)dump_json(chat);
  ChatTemplateInfo info;
  info.tmpl = &tiny_template();
  try {
    (void)render_chat(chat, info, /*allow_template_override=*/false);
  } catch (const ApiError& e) {
    die("render_chat refused a converted request", std::string(e.what()) + " in " + dump_json(chat));
  }
  return 0;
}
