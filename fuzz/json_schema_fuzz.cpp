// libFuzzer target for the JSON Schema -> grammar compiler (src/constrain/json_schema.h), which
// compiles the schemas requests carry (tools' `parameters`, response_format json_schema).
//
// Invariants checked (any violation aborts): an unsupported or malformed schema only ever throws
// SchemaError; a compiled schema builds a grammar whose matcher is not dead at the start; a short
// random walk of it that ends in a complete sentence is JSON that validate() accepts under the
// same schema (what the server relies on: a forced call parses and validates); the XML-parameter
// form of an object schema compiles or throws SchemaError too.
//
// Build with cmake -DSPOOL_FUZZ=ON (clang); run e.g.: ./json_schema_fuzz -max_len=4096 corpus/
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "constrain/grammar.h"
#include "constrain/json_schema.h"
#include "support/grammar_walk.h"

using nlohmann::ordered_json;
using namespace spool::constrain;

namespace {

[[noreturn]] void die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "json_schema_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const ordered_json schema = ordered_json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded() || !(schema.is_object() || schema.is_boolean())) return 0;
  std::shared_ptr<const Grammar> grammar;
  try {
    GrammarBuilder g;
    SchemaCompiler c(g, schema);
    grammar = g.build(c.value(schema, "schema"));
  } catch (const SchemaError&) {
    return 0;
  } catch (const spool::Error& e) {
    die("a spool::Error other than SchemaError", e.what());
  }
  Matcher start(grammar);
  if (start.dead()) die("the grammar of an accepted schema matches nothing", schema.dump());
  std::mt19937_64 rng(size);
  const auto text = spool::test_support::random_walk(grammar, rng, "\"{}[],:0", 4, 2000);
  if (text) {
    const ordered_json value = ordered_json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) die("a sentence of the grammar is not JSON", *text);
    std::string why;
    try {
      if (!validate(schema, value, &why)) die("a sentence of the grammar does not validate", *text + " : " + why + " under " + schema.dump());
    } catch (const SchemaError&) {
      die("validate() refuses a schema the compiler accepted", schema.dump());
    }
  }
  if (schema.is_object() && schema.value("type", ordered_json()) == "object") {
    try {
      GrammarBuilder g;
      SchemaCompiler c(g, schema);
      g.build(c.xml_arguments(schema, XmlParams{}, "schema"));
    } catch (const SchemaError&) {
    } catch (const spool::Error& e) {
      die("xml_arguments: a spool::Error other than SchemaError", e.what());
    }
  }
  return 0;
}
