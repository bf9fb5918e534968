// libFuzzer target for config.json handling: arbitrary bytes parsed as JSON, the text config
// derived (text_config merging) and a ModelSpec built from it, with generation_config parsing.
// Every rejection must be a spool::Error (or a JSON parse error mapped to one).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "models/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return 0;
  try {
    spool::io::Config raw(j, "fuzz/config.json");
    spool::io::Config text = spool::io::text_config_of(raw, "fuzz/config.json");
    spool::io::GenerationDefaults gen = spool::io::parse_generation_config(raw);
    spool::models::ModelSpec s = spool::models::build_spec(text, gen, raw.get_bool("tie_word_embeddings", false), "fuzz");
    if (s.n_layers <= 0 || s.mixers.size() != static_cast<size_t>(s.n_layers)) __builtin_trap();
  } catch (const spool::Error&) {
  }
  return 0;
}
