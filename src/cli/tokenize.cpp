// spool tokenize: text -> token ids with the model's tokenizer.json.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "common/error.h"

namespace spool::cli {

namespace {

struct TokenizeOptions {
  ModelOptions model;
  std::string text;
  bool add_special = false;
  bool json = false;
};

void run(const TokenizeOptions& o) {
  const std::string dir = o.model.dir();
  tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(dir);
  std::vector<int32_t> ids = tok.encode(o.text, o.add_special);
  if (o.json) {
    nlohmann::json j;
    j["ids"] = ids;
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  for (size_t i = 0; i < ids.size(); ++i) std::printf(i ? " %d" : "%d", ids[i]);
  std::printf("\n");
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* c = app.add_subcommand("tokenize", "Encode text into token ids (a directory with only tokenizer files is fine)");
  o->model.add_to(c, /*runs_model=*/false);
  c->add_option("--text", o->text, "Text to encode, as is")->required();
  c->add_flag("--add-special", o->add_special, "Add what transformers adds with add_special_tokens=True (e.g. a BOS)");
  c->add_flag("--json", o->json, "Print {\"ids\": [...]}");
  c->callback([o] { run(*o); });
}

}  // namespace spool::cli
