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
#include "engine/loader.h"
#include "engine/speculative.h"
#include "experts/routing_trace.h"
#include "tokenizer/tokenizer.h"
#include <nlohmann/json.hpp>

namespace spool::cli {

/// --model, --threads and the expert-streaming flags, common to commands that run a model.
struct ModelOptions {
  std::string model;  // "" = the demo model unpacked by the build
  int threads = 0;    // 0 = all hardware threads
  bool stream = false, no_stream = false;
  std::string cache_budget = "auto";
  std::string cache_policy = "lru";  // --cache-policy lru|lfu
  double cache_half_life = 100000;   // --cache-half-life TOKENS
  bool no_hits_first = false;        // --no-hits-first
  int prefetch_workers = 8;
  std::string io_engine = "pread";
  bool use_page_cache = false, no_page_cache = false;
  int prefetch_ahead = 0;
  int prefetch_next = 0;  // --prefetch-next
  std::string predictor;        // --predictor
  bool route_by_predictor = false;  // --route-by-predictor
  std::string pin_file;
  std::string expert_owners;  // --expert-owners (under mpirun)
  std::string comm = "auto";  // --comm auto|mpi|nccl (under mpirun)
  int max_active_experts = 0;
  int kv_bits = 32;
  std::string act_bits = "auto";  // --act-bits: 8, 32 or auto
  std::string device = "auto";
  std::string vram_budget = "auto";
  std::string vram_experts = "auto";
  bool strict_device = false;  // --strict-device (LoadOptions::strict_device)
  std::string spec = "none";   // --spec: none or mtp (speculative decoding with the model's MTP head)
  int draft_max = 1;           // --draft-max
  int64_t draft_vocab = 0;     // --draft-vocab
  double spec_min_acceptance = engine::SpecParams{}.min_acceptance;  // --spec-min-acceptance (auto-off)
  /// Adds --spec, --draft-max, --spec-min-acceptance (commands that decode with speculation).
  void add_spec_to(CLI::App* app);
  /// The speculative decoding settings of --spec / --draft-max / --spec-min-acceptance
  /// (UsageError for bad values).
  engine::SpecParams spec_params() const;
  std::vector<std::string> lora;  // --lora FILE[:SCALE] (repeatable)
  bool lora_init_without_apply = false;  // --lora-init-without-apply (serve): every adapter's default scale 0
  /// Adds --lora FILE[:SCALE] (commands that run a model for text: generate, perplexity, serve)
  /// and, with `server`, llama-server's --lora-init-without-apply.
  void add_lora_to(CLI::App* app, bool server = false);
  std::string expert_profile;  // --expert-profile FILE
  double expert_profile_half_life = experts::kDefaultProfileHalfLife;  // --expert-profile-half-life TOKENS
  bool warm_page_cache = false;  // --warm-page-cache
  /// Adds --expert-profile, --expert-profile-half-life and --warm-page-cache (the commands that
  /// serve or measure traffic: serve, generate, bench; docs/streaming.md#warm-starts).
  void add_warm_start_to(CLI::App* app);
  int host_expert_slots = 0;  // tests: --host-expert-slots (hidden)
  /// Adds --model (and --threads, streaming and K-reduction flags when `runs_model`).
  void add_to(CLI::App* app, bool runs_model = true);
  /// The model directory to use (resolves the default; checks it exists).
  std::string dir() const;
  /// --threads resolved (0 = all hardware threads); UsageError outside 0..1024.
  int thread_count() const;
  /// The loader settings these flags describe.
  engine::LoadOptions load_options() const;
};

using Loaded = engine::LoadedModel;

/// Loads everything from `opt`. Logs a summary to stderr.
Loaded load_model(const ModelOptions& opt);

/// Counters of the expert tiers: the RAM tier (the streaming cache, with disk behind it) and the
/// VRAM tier (experts::DeviceExpertCache slots, on a GPU run whose experts do not all fit, or
/// host slots with --host-expert-slots). Zeros for a tier the run does not have.
struct TierStats {
  experts::StreamingStats ram;
  experts::DeviceExpertCache::Stats vram;
  TierStats operator-(const TierStats& o) const { return {ram - o.ram, vram - o.vram}; }
};

/// The `stats` object of --json output: expert cache and disk counters over `window`
/// (a difference of two snapshots) for `tokens` tokens, page-cache residency now, and the
/// loader's memory decision (`memory`: engine::memory_json, with the cache budget). With expert
/// slots, `vram_tier` {slots, slot_bytes, hits, misses, hit_rate, early_copies, bytes_copied,
/// bytes_copied_per_token, stall_s}; when streaming, `ram_tier` {requests, hits, misses,
/// hit_rate, bytes_read, bytes_read_per_token, stall_s, pinned_bytes, preloaded (experts read at start from
/// --expert-profile)}.
nlohmann::ordered_json stats_json(const Loaded& l, const TierStats& window, int64_t tokens);
/// The same as one human-readable line.
std::string stats_line(const Loaded& l, const TierStats& window, int64_t tokens);
/// Current counters of the tiers (zeros for those the run does not have).
TierStats stats_snapshot(const Loaded& l);

using engine::moe_layers_of;   // (engine/loader.h)
using engine::trace_shape_of;

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
void register_synth(CLI::App& app);
void register_calibrate(CLI::App& app);
void register_repack(CLI::App& app);
void register_plan(CLI::App& app);
void register_doctor(CLI::App& app);
void register_bench(CLI::App& app);
void register_convert(CLI::App& app);
void register_serve(CLI::App& app);
/// `template` group: render (and the chat-template tools beside it).
void register_template(CLI::App& app);

}  // namespace spool::cli
