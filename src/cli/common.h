// Shared pieces of the spool subcommands: model options, loading, output helpers.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/model.h"
#include "ops/thread_pool.h"
#include "tokenizer/tokenizer.h"

namespace spool::cli {

/// --model and --threads, common to every command that runs a model.
struct ModelOptions {
  std::string model;  // "" = the demo model unpacked by the build
  int threads = 0;    // 0 = all hardware threads
  void add_to(CLI::App* app, bool with_threads = true);
  /// The model directory to use (resolves the default; checks it exists).
  std::string dir() const;
  int thread_count() const;
};

/// A checkpoint, thread pool, model and (if present) tokenizer, loaded together.
struct Loaded {
  std::shared_ptr<io::Checkpoint> ckpt;
  std::unique_ptr<ops::ThreadPool> pool;
  std::unique_ptr<models::Model> model;
  std::optional<tokenizer::Tokenizer> tok;  // absent when the directory has no tokenizer.json
  double load_s = 0;
};

/// Loads everything from `opt`. Logs a one-line summary to stderr.
Loaded load_model(const ModelOptions& opt);

/// True if `dir` has a tokenizer.json.
bool has_tokenizer(const std::string& dir);

/// Parses "1,2,3" (spaces allowed) into ids; throws UsageError on bad input.
std::vector<int32_t> parse_id_list(const std::string& s);

/// Reads a whole file; throws spool::Error naming it.
std::string read_file(const std::string& path);

// Subcommand registration: each adds its subcommand to `app` and sets its callback.
void register_generate(CLI::App& app);
void register_perplexity(CLI::App& app);
void register_tokenize(CLI::App& app);
void register_info(CLI::App& app);

}  // namespace spool::cli
