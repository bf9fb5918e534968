// libFuzzer target for the per-request LoRA fields (src/server/lora_adapters.h): an HTTP body
// through parse_json_value (as POST /lora-adapters reads it: a server with three adapters takes
// it as new default scales) and parse_body (as every API reads a request: the server resolves
// its scales from the `lora` field, a `model` naming an adapter or the defaults; a server
// without adapters too, request_lora with none).
//
// Invariants checked (any violation aborts): bad input only ever throws ApiError 400; resolved
// scales are one finite float per adapter; a refused POST leaves the defaults unchanged.
//
// Build with cmake -DSPOOL_FUZZ=ON (clang); run e.g.: ./lora_request_fuzz -max_len=4096 corpus/
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "server/api_error.h"
#include "server/json_body.h"
#include "server/lora_adapters.h"

using namespace spool::server;

namespace {

[[noreturn]] void die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "lora_request_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

void check_scales(const std::vector<float>& s, size_t n, const char* what) {
  if (s.size() != n) die(what, "wrong number of scales");
  for (float v : s)
    if (!std::isfinite(v)) die(what, "a scale that is not finite");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto expect_400 = [](const ApiError& e, const char* what) {
    if (e.status != 400) die(what, e.what());
  };
  LoraAdapters lora({{"alpha", "/a"}, {"beta", "/b"}, {"alpha-2", "/c"}}, {1.0f, 0.0f, 0.5f});
  nlohmann::ordered_json value;
  try {
    value = parse_json_value(text);
  } catch (const ApiError& e) {
    expect_400(e, "parse_json_value: not a 400");
    return 0;
  }
  const std::vector<float> before = lora.defaults();
  try {
    lora.set_defaults(value);
    check_scales(lora.defaults(), 3, "set_defaults");
  } catch (const ApiError& e) {
    expect_400(e, "set_defaults: not a 400");
    if (lora.defaults() != before) die("set_defaults", "a refused body changed the defaults");
  }
  if (!value.is_object()) return 0;  // (parse_body refuses it)
  const nlohmann::ordered_json& body = value;
  try {
    check_scales(lora.for_request(body), 3, "for_request");
  } catch (const ApiError& e) {
    expect_400(e, "for_request: not a 400");
  }
  try {
    check_scales(request_lora(nullptr, body), 0, "request_lora without adapters");
  } catch (const ApiError& e) {
    expect_400(e, "request_lora without adapters: not a 400");
  }
  return 0;
}
