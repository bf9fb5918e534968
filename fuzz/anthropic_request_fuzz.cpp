// libFuzzer target for the Anthropic Messages request mapping (src/server/anthropic_request.h):
// arbitrary bytes as a request body through parse_body and parse_anthropic_request, in both
// /v1/messages and count_tokens mode.
//
// Invariants checked (any violation aborts): the only exception is ApiError, with status 400,
// type invalid_request_error, a non-empty message and a non-empty param; an accepted request
// maps to a non-empty `messages` array of objects whose role is system/user/assistant/tool and
// whose content is a string, tool messages carry a string tool_call_id, assistant tool_calls
// carry arguments that parse as a JSON object, max_tokens >= 1 outside count_tokens, and the
// mapped request serializes (dump_json) without throwing.
//
// Build: cmake -DSPOOL_FUZZ=ON (see fuzz/CMakeLists.txt); run e.g.
//   build-asan/fuzz/anthropic_request_fuzz -max_len=4096 corpus/
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "server/anthropic_request.h"
#include "server/api_error.h"
#include "server/json_body.h"

namespace {

using spool::server::json;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "anthropic_request_fuzz: invariant violated: %s\n", what);
    std::abort();
  }
}

void check_mapped(const spool::server::AnthropicRequest& r, bool count_tokens) {
  const json& msgs = r.chat.at("messages");
  check(msgs.is_array() && !msgs.empty(), "messages is a non-empty array");
  for (const json& m : msgs) {
    check(m.is_object() && m.contains("role") && m["role"].is_string(), "a message has a string role");
    const std::string role = m["role"];
    check(role == "system" || role == "user" || role == "assistant" || role == "tool", "roles are system/user/assistant/tool");
    check(m.contains("content") && m["content"].is_string(), "content is a string");
    if (role == "tool") check(m.contains("tool_call_id") && m["tool_call_id"].is_string(), "tool messages carry tool_call_id");
    if (auto tc = m.find("tool_calls"); tc != m.end())
      for (const json& c : *tc) {
        const json args = json::parse(c["function"]["arguments"].get<std::string>(), nullptr, false);
        check(args.is_object(), "tool_call arguments encode an object");
      }
  }
  if (!count_tokens) check(r.max_tokens >= 1, "max_tokens >= 1");
  (void)spool::server::dump_json(r.chat);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (bool count_tokens : {false, true}) {
    try {
      const json body = spool::server::parse_body(text);
      check_mapped(spool::server::parse_anthropic_request(body, count_tokens), count_tokens);
    } catch (const spool::server::ApiError& e) {
      check(e.status == 400 && e.type == "invalid_request_error", "errors are 400 invalid_request_error");
      check(e.what()[0] != '\0', "errors have a message");
      check(!e.param.empty() || std::string_view(e.what()).find("body") != std::string_view::npos ||
                std::string_view(e.what()).find("JSON") != std::string_view::npos,
            "field errors name their field");
    }
  }
  return 0;
}
