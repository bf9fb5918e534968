// Loading a model for use: checkpoint, thread pool, model, tokenizer and — when asked, or
// when the model does not fit in the memory available — the streaming expert provider with
// its cache budget and page-cache policy decided here (and logged).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "experts/streaming.h"
#include "io/checkpoint.h"
#include "models/model.h"
#include "ops/thread_pool.h"
#include "tokenizer/tokenizer.h"

namespace spool::engine {

/// Settings shared by every command that runs a model.
struct LoadOptions {
  std::string model_dir;
  int threads = 1;
  std::optional<bool> stream;          // --stream; nullopt = automatic (stream if it does not fit)
  std::string cache_budget = "auto";   // --cache-budget-gb: a number of GB or "auto"
  int prefetch_workers = 8;            // --prefetch-workers
  std::string io_engine = "pread";     // --io-engine pread|uring
  std::optional<bool> page_cache;      // --use-page-cache / --no-page-cache; nullopt = auto
  int prefetch_ahead = 0;              // --prefetch-ahead
  std::string pin_file;                // --pin-file
  int max_active_experts = 0;          // --max-active-experts (0 = native top-k)
  int kv_bits = 32;                    // --kv-bits: 32 (f32, exact), 16 (f16) or 8 (int8 + scales)
  int64_t ctx_size = 4096;             // context the KV estimate assumes (bytes kept out of the cache budget)
  int64_t prefill_step = 512;          // --prefill-step-size: tokens per forward pass (sizes the workspace estimate)
  int64_t state_copies = 0;            // extra copies of the recurrent (GDN) state the caller keeps, e.g. serve's
                                       // prompt-cache checkpoints (bytes kept out of the cache budget)
};

/// Everything a command needs, loaded together.
struct LoadedModel {
  std::shared_ptr<io::Checkpoint> ckpt;
  std::unique_ptr<ops::ThreadPool> pool;
  std::unique_ptr<models::Model> model;
  std::optional<tokenizer::Tokenizer> tok;       // absent without tokenizer.json
  std::shared_ptr<experts::StreamingExperts> streaming;  // null when experts are resident
  double load_s = 0;
};

/// Loads per `opt`. Throws spool::Error (bad files, streaming requested on a model without
/// experts) or spool::UsageError (bad option values).
LoadedModel load(const LoadOptions& opt);

/// Parses a pin file {"pin": [[layer, expert], ...]}.
std::vector<std::pair<int, int>> read_pin_file(const std::string& path);

/// Bytes of the model files resident in the page cache (mincore over the shard mappings).
uint64_t page_cache_resident_bytes(const io::Checkpoint& ckpt);

/// Bytes of one sequence's KV cache and recurrent state at `ctx` tokens with --kv-bits.
uint64_t state_bytes(const models::ModelSpec& spec, int64_t ctx, int kv_bits);

}  // namespace spool::engine
