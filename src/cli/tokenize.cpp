// spool tokenize: text -> token ids with the model's tokenizer (tokenizer.json of a directory, or
// the tokenizer.ggml.* metadata of a .gguf file).
#include <cstdio>
#include <fstream>
#include <iterator>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "common/error.h"

namespace spool::cli {

namespace {

struct TokenizeOptions {
  ModelOptions model;
  std::string text, text_file;
  bool add_special = false;
  bool json = false;
};

void run(const TokenizeOptions& o) {
  const std::string dir = o.model.dir();
  std::optional<tokenizer::Tokenizer> tok = engine::load_tokenizer(dir);
  if (!tok) fail("%s: no tokenizer (neither tokenizer.json nor tokenizer.ggml.* metadata)", dir.c_str());
  std::string text = o.text;
  if (!o.text_file.empty()) {
    std::ifstream in(o.text_file, std::ios::binary);
    if (!in) fail("%s: cannot open --text-file", o.text_file.c_str());
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::vector<int32_t> ids = tok->encode(text, o.add_special);
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
  CLI::Option* text = c->add_option("--text", o->text, "Text to encode, as is");
  CLI::Option* file = c->add_option("--text-file", o->text_file, "File whose bytes to encode (any text, newlines included)");
  text->excludes(file);
  file->excludes(text);

  c->add_flag("--add-special", o->add_special, "Add what transformers adds with add_special_tokens=True (e.g. a BOS)");
  c->add_flag("--json", o->json, "Print {\"ids\": [...]}");
  c->callback([o, text, file] {
    if (text->count() + file->count() == 0) throw UsageError("tokenize: give --text or --text-file");
    run(*o);
  });
}

}  // namespace spool::cli
