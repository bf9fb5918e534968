// libFuzzer target for the chat-template engine: parses arbitrary bytes as a template and
// renders it against a small fixed chat context under tight limits. Any spool::Error is an
// accepted outcome; crashes, sanitizer reports, other exception types, hangs and unbounded
// memory are bugs. Build by hand from the repository root:
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
//     -I src fuzz/template_fuzz.cpp $(ls src/template/*.cpp | grep -v _test) -lutf8proc -o template_fuzz
// and run e.g.: ./template_fuzz -max_len=4096 -timeout=10 corpus/ seeds/
// (seeding with real chat templates and a dictionary of Jinja keywords helps coverage).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/error.h"
#include "template/chat_template.h"

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true, "enable_thinking": false,
    "documents": null,
    "messages": [
      {"role": "system", "content": "You are helpful. Ünïcødé ✓"},
      {"role": "user", "content": "Hi <think>x</think> there"},
      {"role": "assistant", "content": "", "reasoning_content": "hmm",
       "tool_calls": [{"id": "c1", "type": "function",
                       "function": {"name": "f", "arguments": {"a": 1, "b": [true, null, 2.5], "c": {"d": "e"}}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"},
      {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
               "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}]
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view src(reinterpret_cast<const char*>(data), size);
  spool::tmpl::RenderLimits limits;
  limits.max_output_bytes = 1 << 20;
  limits.max_steps = 300000;
  limits.max_call_depth = 40;
  limits.max_nesting = 600;
  limits.max_heap_cells = 1 << 18;
  try {
    spool::tmpl::Template t = spool::tmpl::Template::parse(src, "fuzz");
    (void)t.render(context(), limits);
  } catch (const spool::Error&) {
    // rejected template or runtime error: fine
  }
  return 0;
}
