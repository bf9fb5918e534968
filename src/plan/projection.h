// The planner's projection: components of the peak resident memory of a run, the verdict
// (resident / stream / does not fit) for a memory size, the command line to use and decode
// speed bounds from memory and disk bandwidth. Pure arithmetic over a header-only
// checkpoint; the loader uses base_needs() for its own decisions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "models/spec.h"
#include "plan/budget.h"
#include "plan/footprint.h"
#include "plan/placement.h"

namespace spool::plan {

/// The shape of a run: context, prompt chunking, sequences run together, KV storage, threads.
struct RunShape {
  int64_t ctx = 4096;            // tokens of context the KV cache must hold (per sequence)
  int64_t prefill_step = 512;    // --prefill-step-size (tokens per forward pass)
  int parallel = 1;              // --parallel: sequences run together (serve's slots), each with its own KV/state
  int kv_bits = 32;              // --kv-bits
  int threads = 1;
  uint64_t tokenizer_json_bytes = 0;  // 0 when the model has no tokenizer.json
  uint64_t start_rss = 0;             // resident bytes of the process before loading (0 = typical)
  int draft_max = 0;                  // --spec mtp --draft-max: each sequence keeps that many copies of its
                                      // Gated DeltaNet state (State::keep_step_trail); 0 without speculation
};

/// Token rows of the largest forward step with `parallel` sequences: one prefill chunk of
/// `chunk` tokens plus one decode token of each other sequence (serve's schedule,
/// server/batch_engine.h).
inline int64_t step_rows(int64_t chunk, int parallel) { return chunk + (parallel > 1 ? parallel - 1 : 0); }

/// Resident needs besides the routed experts (see BaseNeeds) of a run of `shape`: per sequence
/// KV and recurrent state times shape.parallel (one growth transient: the engine grows one
/// layer's cache at a time), the workspace of a step of step_rows(chunk, parallel) rows over
/// `parallel` sequences plus each further sequence's logits and sampler buffers.
BaseNeeds base_needs(const WeightBytes& w, const models::ModelSpec& spec, const RunShape& shape);

/// Inputs of a projection beyond the checkpoint.
struct PlanInputs {
  RunShape shape;
  uint64_t available = 0;          // bytes of memory the run may use
  std::optional<double> mem_gbps;  // memory read bandwidth, GB/s (1e9 bytes)
  std::optional<double> disk_gbps; // direct-read disk bandwidth, GB/s
  std::string model_arg;           // what --model should be in the printed command
  bool kv_bits_given = false;      // the user chose --kv-bits (otherwise 8 may be suggested)
  std::optional<bool> stream;      // --stream / --no-stream; nullopt = decide as the loader does
  std::optional<uint64_t> cache_budget;  // --cache-budget-gb in bytes; nullopt = auto
  std::optional<uint64_t> vram_budget;   // plan a GPU run with this VRAM budget in bytes; nullopt = a CPU run
  uint64_t lora_bytes = 0;               // --lora: the adapters' resident bytes (lora::Adapter::run_bytes), counted as dense
  std::vector<std::string> lora_args;    // --lora FILE[:SCALE] flags, repeated in the printed command
  int ranks = 1;                         // --ranks: expert parallelism over this many ranks (mpirun -n), each with `available`
  std::optional<double> link_latency_us; // --link-latency-us: one MoE layer's exchange between the ranks (spool doctor)
  std::optional<double> link_gbps;       // --link-gbps: GB/s one rank receives from the others in a large exchange
  std::string expert_owners;             // --expert-owners FILE (with ranks > 1): the experts placed on the ranks balanced
                                         // by FILE's routing (experts::routing_load, dist::ExpertOwners::balanced)
};

enum class Verdict { kResident, kStream, kNoFit };
/// "resident", "stream" or "no_fit".
const char* verdict_name(Verdict v);

/// Everything `spool plan` prints.
struct Projection {
  models::ModelSpec spec;
  std::string architecture;      // what the KV / expert figures assume (Family::describe)
  WeightBytes weights;
  StateBytes state;
  int64_t kv_capacity = 0;       // KV positions allocated at shape.ctx by a layer that keeps every position
  int64_t kv_capacity_windowed = 0;  // by a sliding-window layer (models::State::kv_window); 0: none
  BaseNeeds base;                // (base.dense includes lora_bytes)
  uint64_t lora_bytes = 0;       // LoRA adapters held resident (PlanInputs::lora_bytes)
  RunShape shape;
  uint64_t available = 0, reserve = 0;
  uint64_t slot_bytes = 0;       // one expert cache slot (default page-cache policy)
  uint64_t expert_count = 0;     // routed experts in the model (layers x experts)
  Placement placement;           // plan::decide_placement's decision (what engine::load would do)
  Verdict verdict = Verdict::kNoFit;
  uint64_t cache_budget = 0;     // bytes (stream verdict)
  uint64_t cache_bytes = 0;      // cache when full (slot-rounded)
  uint64_t peak = 0;             // predicted VmHWM, bytes
  bool use_page_cache = false;
  uint64_t active_bytes_per_token = 0;  // bytes read per decoded token: resident dense (with lm_head) + one row of an
                                        // untied embedding + top-k experts + KV over the context
  uint64_t expert_bytes_per_token = 0;  // top-k experts' bytes per token over all MoE layers
  double expected_hit_rate = 0;  // cache / experts (uniform routing; real routing is skewed higher)
  std::optional<double> mem_gbps, disk_gbps;
  std::optional<double> tok_s_mem_bound, tok_s_disk_bound;  // decode tokens/s upper bounds
  // Expert parallelism (PlanInputs::ranks > 1; docs/distributed.md). The memory figures above are
  // then one rank's, the rank with the largest share of the routed experts (plan::rank_facts).
  int ranks = 1;
  uint64_t rank_experts = 0;            // routed-expert bytes that rank holds (rank_expert_share of weights.experts)
  uint64_t rank_active_bytes_per_token = 0;  // bytes a rank reads per decoded token: active_bytes_per_token with
                                             // top_k / ranks of the experts (uniform routing)
  uint64_t net_bytes_per_token = 0;     // bytes the ranks receive from each other per decoded token, all ranks together
                                        // (what `spool bench` prints under mpirun): per MoE layer top_k rows of hidden_size
                                        // floats, each rank receiving the (ranks - 1) / ranks from the others
  int exchanges_per_token = 0;          // one per MoE layer (Comm::allgather_rows_in_place: the row counts, then the rows);
                                        // two for a server (PlanInputs::shape.parallel > 1: rank 0 first broadcasts the
                                        // layer's rows and routing to the other ranks, which hold no sequence state)
  std::optional<double> link_latency_us, link_gbps;
  // --expert-owners: the mean over the file's MoE layers of the busiest rank's share of a layer's
  // routings, with the experts balanced by the file and with contiguous blocks (1 / ranks is
  // even). With it, rank_active_bytes_per_token reads the busiest rank's share of the experts.
  std::optional<double> rank_load_share, contiguous_load_share;
  bool leader_broadcasts = false;       // a server over ranks: rank 0 broadcasts each MoE layer's rows (exchanges_per_token)
  std::optional<double> tok_s_ranks;    // decode estimate: 1 / (rank_active_bytes / mem_gbps + exchanges x latency +
                                        // net_bytes_per_token / ranks / link_gbps), when all three are known
  std::vector<std::string> notes;
  std::string command;           // "" when the model does not fit
};

/// The GPU part of `spool plan`: which device (or a stated one), the placement, and the
/// host-to-device traffic per decoded token when the experts stay in host memory.
struct GpuProjection {
  std::string device;        // "cuda:0", or "stated" for --vram-gb without a device
  std::string name;          // the GPU's name ("" when stated)
  uint64_t vram_total = 0;   // the card's memory (0 when stated)
  GpuPlacement placement;
  VramTier vram = VramTier::kNone;  // where the routed experts live (Placement::vram)
  uint64_t vram_slots = 0;        // experts the VRAM share or slots hold when not all fit (Placement::vram_slots; 0
                                  // when they all fit, or slots that would hold fewer than one token's top-k)
  double vram_hit_rate = 0;       // vram_slots / routed experts (uniform routing; real routing is skewed higher)
  uint64_t h2d_bytes_per_token = 0;  // expert bytes crossing to the GPU per decoded token: the top-k experts' bytes
                                     // times the share not in VRAM (0 with every expert in VRAM)
  std::optional<double> h2d_gbps;    // pinned host-to-device bandwidth, GB/s (1e9 bytes)
  std::optional<double> tok_s_h2d_bound;  // decode tokens/s upper bound from h2d_gbps (experts in host memory)
};

/// The projection of a GPU placement (`placement.gpu` set: PlanInputs::vram_budget): when the
/// experts stay in host memory, h2d_bytes_per_token = `expert_bytes_per_token` (the top-k experts
/// of every MoE layer) times the share of the `expert_count` routed experts not in VRAM, and the
/// bound h2d_gbps * 1e9 / h2d_bytes_per_token when both are known.
GpuProjection project_gpu(const Placement& placement, uint64_t expert_bytes_per_token, uint64_t expert_count,
                          std::optional<double> h2d_gbps);

/// Projects a run of the model in `ck` (header-only is enough). Throws spool::Error for a
/// model_type no family registers or an inconsistent config (via plan_model / models::build_spec).
Projection project(const io::Checkpoint& ck, const PlanInputs& in);

}  // namespace spool::plan
