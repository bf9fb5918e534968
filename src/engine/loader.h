// Loading a model for use: checkpoint, thread pool, backend, model, tokenizer, and the expert
// providers that plan::decide_placement chooses from the measured facts and the options (the
// same rule `spool plan` reports): the resident mapping or the streaming cache with its budget
// and page-cache policy, and on a GPU the VRAM tier (logged).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/expert_parallel.h"
#include "engine/device.h"  // the device helpers (cuda_devices, resolve_device, gpu_info, ...)
#include "experts/routing_trace.h"
#include "experts/streaming.h"
#include "io/checkpoint.h"
#include "experts/device_experts.h"
#include "experts/expert_profile.h"
#include "io/page_cache_warmer.h"
#include "models/model.h"
#include "plan/budget.h"
#include <nlohmann/json.hpp>
#include "ops/thread_pool.h"
#include "tokenizer/tokenizer.h"

namespace spool::engine {

/// One --lora FILE[:SCALE] (llama-server's flag): a PEFT adapter directory or its
/// adapter_model.safetensors, and the user's scale (multiplies the adapter's alpha / r).
struct LoraOption {
  std::string path;
  float scale = 1.0f;
};

/// Parses FILE[:SCALE]: the text after the last ':' is the scale when it is a finite number,
/// else the whole argument is the path (scale 1). UsageError for an empty path.
LoraOption parse_lora_option(const std::string& arg);

/// Settings shared by every command that runs a model.
struct LoadOptions {
  std::string model_dir;
  int threads = 1;
  std::optional<bool> stream;          // --stream; nullopt = automatic (stream if it does not fit)
  std::string cache_budget = "auto";   // --cache-budget-gb: a number of GB or "auto"
  experts::CachePolicy cache_policy = experts::CachePolicy::kLru;  // --cache-policy (docs/streaming.md#replacement-policy)
  bool hits_first = true;              // !--no-hits-first: cached experts compute while the misses are read
  double cache_half_life = 100000;     // --cache-half-life, tokens (kLfu's decay; MoE layers x top-k requests a token)
  int prefetch_workers = 8;            // --prefetch-workers
  std::string io_engine = "pread";     // --io-engine pread|uring
  std::optional<bool> page_cache;      // --use-page-cache / --no-page-cache; nullopt = auto
  int prefetch_ahead = 0;              // --prefetch-ahead
  int prefetch_next = 0;               // --prefetch-next: next-layer router guesses per row (0 = off)
  std::string predictor;               // --predictor: a trained expert predictor (experts::ExpertPredictor file)
  bool route_by_predictor = false;     // --route-by-predictor: MoE layers with a head route among its top-k (not exact)
  std::string pin_file;                // --pin-file
  int max_active_experts = 0;          // --max-active-experts (0 = native top-k)
  int kv_bits = 32;                    // --kv-bits: 32 (f32, exact), 16 (f16) or 8 (int8 + scales)
  int act_bits = 0;                    // --act-bits: 32 (f32 activations, exact), 8 (int8 activations for Q4_K /
                                       // Q6_K GGUF weights and spool q4 / q8 matrices) or 0 = auto (8 where measured faster:
                                       // K-quant GGUF weights, spool q4 / q8 on x86; else 32); the model's CPU backend's option (ops::CpuOptions::int8_activations)
  std::string device = "auto";         // --device cpu | cuda | cuda:N | auto (cuda:0 when this build has CUDA and a GPU is present)
  std::string vram_budget = "auto";    // --vram-budget-gb: GB of GPU memory for dense weights + KV + workspace + experts, or
                                       // "auto" (90% of the GPU's memory); routed experts go to VRAM only when all fit
  std::string vram_experts = "auto";   // --vram-experts static|slots|auto: routed experts that do not all fit VRAM get a
                                       // fixed share of VRAM + mapped page-locked host memory (static), or LRU VRAM slots
                                       // over the RAM tier (slots); auto: static when every expert fits in host memory
  int64_t ctx_size = 4096;             // --ctx-size: tokens of context the run holds (sizes the KV and workspace
                                       // estimates kept out of the cache budget); commands set what they use
  int64_t prefill_step = 512;          // --prefill-step-size: tokens per forward pass (sizes the workspace estimate)
  int parallel = 1;                    // --parallel: sequences run together (serve's slots): KV/state per sequence and
                                       // the workspace of a step of prefill_step + parallel - 1 rows are kept out of the budget
  int64_t state_copies = 0;            // KV-less state snapshots the caller keeps (recurrent GDN state and the
                                       // sliding-window layers' rows), e.g. serve's prompt-cache checkpoints (bytes kept
                                       // out of the cache budget)
  int host_expert_slots = 0;           // tests only (--host-expert-slots): a CPU run puts this many expert slots in host
                                       // memory in front of its expert provider, as a GPU run's VRAM tier (0 = none)
  std::optional<uint64_t> available;   // bytes of memory available, measured by the caller before it read anything
                                       // of the model (available_memory_bytes()); nullopt = measured when load() starts
  std::optional<uint64_t> start_rss;   // resident bytes of the process measured by the caller at the same point
                                       // (current_rss_bytes(): plan::RunShape::start_rss); nullopt = when load() starts
  bool mtp = false;                    // --spec mtp: keep the multi-token-prediction layers (io::Checkpoint::Options::mtp);
                                       // a model without them is an error
  int draft_max = 0;                   // --draft-max with --spec mtp: the step trail's copies of the recurrent state
                                       // per sequence are kept out of the budget (plan::RunShape::draft_max)
  std::vector<LoraOption> lora;        // --lora FILE[:SCALE], in order: PEFT LoRA adapters applied unmerged (CPU only)
  bool strict_device = false;          // --strict-device (or SPOOL_STRICT_DEVICE=1): ops::Backend::set_strict_device on a
                                       // GPU run; the load fails when the model needs an op the GPU runs on the host
  std::string expert_profile;          // --expert-profile FILE: warm the streaming cache from it and record this run's
                                       // routing into LoadedModel::profile ("" = none; docs/streaming.md#warm-starts)
  double expert_profile_half_life = experts::kDefaultProfileHalfLife;  // --expert-profile-half-life, tokens
  std::string expert_owners;           // --expert-owners FILE: under mpirun, each MoE layer's experts placed on the ranks
                                       // balanced by the routing in FILE (an expert profile or a routing trace); "" =
                                       // contiguous blocks (docs/distributed.md)
  std::string comm = "auto";           // --comm auto|mpi|nccl: under mpirun, the communicator of the MoE exchange (auto: nccl
                                       // on a GPU when built with NCCL, else mpi; docs/distributed.md)
  bool expert_lead = false;            // under mpirun: rank 0 leads and the other ranks follow (serve over ranks:
                                       // dist::ExpertParallel::lead; they then run Model::serve_experts)
  bool warm_page_cache = false;        // --warm-page-cache: read the model files into the page cache in the background
                                       // when they fit (LoadedModel::warmer)
};

/// The memory decision of a load: what was available and what the expert cache got.
struct MemoryDecision {
  uint64_t available = 0;       // bytes (available_memory_bytes() before the model files were read)
  std::string source;           // where `available` came from: "MemAvailable" or CgroupMemory::describe()
  plan::BaseNeeds base;         // resident needs besides the experts (plan::base_needs at ctx_size / prefill_step)
  uint64_t reserve = 0;         // plan::reserve_bytes(available)
  int64_t ctx_size = 0;         // the context and prefill step the estimate used
  int64_t prefill_step = 0;
  int parallel = 1;
  bool streaming = false;
  bool budget_auto = false;     // the budget is --cache-budget-gb auto's (plan::auto_cache_budget)
  uint64_t cache_budget = 0;    // expert cache budget in bytes (0 when experts are resident)
};

/// Everything a command needs, loaded together.
struct LoadedModel {
  std::shared_ptr<io::Checkpoint> ckpt;
  std::unique_ptr<ops::ThreadPool> pool;
  std::unique_ptr<models::Model> model;
  /// --comm nccl under mpirun: the NCCL communicator of the MoE exchange (expert_parallel.comm;
  /// MPI's world still carries the host messages). Destroyed before the model and its backend.
  std::unique_ptr<dist::Comm> device_comm;
  std::optional<tokenizer::Tokenizer> tok;       // absent without tokenizer.json
  std::shared_ptr<experts::StreamingExperts> streaming;  // null when experts are resident
  double load_s = 0;
  MemoryDecision memory;
  std::string device = "cpu";     // where the model runs: "cpu" or "cuda:N"
  std::string device_name;        // the GPU's name ("" on the CPU)
  bool experts_on_device = false; // routed experts resident in VRAM (else read from host memory or disk per use)
  bool experts_static = false;    // --vram-experts static: a share in VRAM, the rest read in place from mapped host memory
  double vram_expert_share = 0;   // fraction of the routed experts in VRAM (1 when experts_on_device)
  std::shared_ptr<experts::DeviceExpertCache> expert_slots;  // the VRAM tier when experts do not all fit (else null)
  uint64_t vram_budget = 0;       // --vram-budget-gb in bytes (0 on the CPU)
  uint64_t vram_used = 0;         // bytes the backend uploaded at load (dense weights, parameters, experts when resident)
  bool int8_activations = false;  // Q4_K / Q6_K or spool q4 / q8 products take int8 activations (--act-bits 8, or auto where it applies)
  std::shared_ptr<const lora::LoraSet> lora;  // the --lora adapters (also held by the model); null without them
  /// --expert-profile: the decayed routing counts this run records (the model's hooks.on_route
  /// feeds it), seeded from the file; null when the flag is not given, the experts are not
  /// streamed through a cache, or the file belongs to another model (left untouched).
  std::shared_ptr<experts::ExpertProfile> profile;
  std::string profile_path;       // where `profile` is saved (save_expert_profile, experts::ProfileSaver)
  /// Expert parallelism under mpirun (docs/distributed.md): the communicator, the owners of the
  /// experts and the mode, as the model was given them (no comm: one process).
  dist::ExpertParallel expert_parallel;
  /// --warm-page-cache: the background reader (null when not started). Destroying it stops it.
  std::unique_ptr<io::PageCacheWarmer> warmer;
};

/// Loads per `opt`. `tok`, when given, is the model's tokenizer already loaded by the caller
/// (e.g. to count the prompt's tokens for ctx_size); otherwise tokenizer.json is loaded here.
/// Throws spool::Error (bad files, streaming requested on a model without experts) or
/// spool::UsageError (bad option values).
LoadedModel load(const LoadOptions& opt, std::optional<tokenizer::Tokenizer> tok = std::nullopt);

/// The MoE layers of `spec` (ascending decoder-layer indices).
std::vector<int> moe_layers_of(const models::ModelSpec& spec);
/// The header of a routing trace recorded from a model of `spec` routing `active_k` experts per
/// token (0 = native top-k), by `source` ("calibrate" or "serve"); also the shape fields of an
/// expert profile (open_profile).
experts::TraceShape trace_shape_of(const models::ModelSpec& spec, int active_k, const std::string& source);

/// The tokenizer of a model: `model`/tokenizer.json (+ config, chat template) for a checkpoint
/// directory, the `tokenizer.ggml.*` metadata for a .gguf file; nullopt when it has none.
std::optional<tokenizer::Tokenizer> load_tokenizer(const std::string& model);

/// The `memory` object of --json output: available bytes and their source, ctx_size and
/// prefill_step of the estimate, the components kept out of the cache and the cache budget.
nlohmann::ordered_json memory_json(const MemoryDecision& m);

/// Writes l.profile to l.profile_path (atomically) when there is one and it recorded tokens;
/// a failure is logged as a warning (the run's output stands). The end of generate and bench.
void save_expert_profile(const LoadedModel& l);

/// Parses a pin file {"pin": [[layer, expert], ...]}.
std::vector<std::pair<int, int>> read_pin_file(const std::string& path);

/// Bytes of the model files resident in the page cache (mincore over the shard mappings).
uint64_t page_cache_resident_bytes(const io::Checkpoint& ckpt);

/// Bytes of one sequence's KV cache and recurrent state at `ctx` tokens with --kv-bits, chunks of
/// `prefill_step` tokens (a sliding-window layer holds W - 1 + its largest chunk).
uint64_t state_bytes(const models::ModelSpec& spec, int64_t ctx, int kv_bits, int64_t prefill_step);

}  // namespace spool::engine
