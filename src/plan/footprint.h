// Peak-memory accounting of one spool process, from a ModelSpec and a checkpoint's tensor
// table alone (no weights read): what each component costs in resident bytes. The planner
// (`spool plan`) and the loader's cache-budget rule both use these numbers, so the command
// plan prints and the budget the engine picks agree.
//
// Each formula mirrors the buffers the engine allocates (file:member named beside it);
// footprint_test.cpp checks them against the process's measured heap growth.
#pragma once

#include <cstdint>

#include "io/checkpoint.h"
#include "models/spec.h"

namespace spool::plan {

/// Weight bytes of a checkpoint, split by how the engine holds them.
struct WeightBytes {
  uint64_t total = 0;          // every kept tensor
  uint64_t experts = 0;        // routed experts (streamable)
  uint64_t dense = 0;          // total - experts
  uint64_t embed_on_demand = 0;  // embedding table read row by row (not resident); 0 when tied to lm_head
  uint64_t resident_dense = 0;   // dense - embed_on_demand: mapped and touched every token
  uint64_t f32_copies = 0;     // copies made at bind time (norms, conv1d, A_log, dt_bias, Qwen3-Next regroups)
  uint64_t file_bytes = 0;     // shard files (headers included)
  uint64_t tables = 0;         // heap of the checkpoint's tensor tables (io::Checkpoint::table_bytes)
  int shards = 0;
  bool experts_quantized = false;
  bool any_quantized = false;  // some weight is in spool's quantized format (.qweight)
};

/// Classifies the tensors of `ck` (opened header-only or mapped).
WeightBytes weight_bytes(const io::Checkpoint& ck, const models::ModelSpec& spec);

/// Bytes of one expert cache slot (io::ExpertStore's layout) for O_DIRECT (`direct`) or
/// page-cache reads; 0 when the model has no routed experts.
uint64_t expert_slot_bytes(const io::Checkpoint& ck, const models::ModelSpec& spec, bool direct);

/// KV capacity (positions) an attention cache reaches when `prompt` tokens are prefilled in
/// chunks of `step` and then `total - prompt` tokens are decoded one by one: ops::kv_capacity_for,
/// i.e. ops::KvCache::reserve itself (unbounded: max(needed, 2 x capacity, 256) rounded up to
/// 256; bounded by a sliding `window` > 0: at most KvCache::window_rows(window, step)).
int64_t kv_capacity(int64_t prompt, int64_t total, int64_t step, int64_t window = 0);

/// KV capacities of one sequence's caches: `full` for the attention layers that keep every
/// position, `windowed` for the sliding-window layers (models::State::kv_window > 0).
struct KvCapacity {
  int64_t full = 0, windowed = 0;
};
/// kv_capacity() of both kinds of layer of `spec` for the same run (windowed = full when the
/// model has no bounded window).
KvCapacity kv_capacities(const models::ModelSpec& spec, int64_t prompt, int64_t total, int64_t step);

/// Per-sequence state at `capacity` KV positions with --kv-bits `kv_bits`: KV caches of the
/// attention layers (each at the capacity of its kind, as models::State configures it) and
/// Gated DeltaNet conv + recurrent state, in bytes. For the planner-only geometries: an MLA
/// cache (attn.kv_latent_dim) holds one latent vector per position and layer.
struct StateBytes {
  uint64_t kv = 0;             // all attention layers at their capacity
  uint64_t kv_per_token = 0;   // bytes per position over all attention layers
  uint64_t recurrent = 0;      // Gated DeltaNet conv + recurrent state
  uint64_t grow_transient = 0; // one layer's old buffers alive while it grows
  uint64_t snapshot = 0;       // a KV-less models::StateSnapshot: recurrent + each sliding-window layer's window - 1 rows
};
StateBytes state_bytes(const models::ModelSpec& spec, const KvCapacity& capacity, int kv_bits);

/// Scratch of a forward pass over `T` tokens: the workspace arena the engine maps
/// (models::workspace_arena_bytes: one arena shared by every layer), per-thread kernel scratch
/// for `threads` threads (expert rows, matmul rows, attention scores over `ctx` positions,
/// rotated inputs when weights are `quantized`), plus logits and sampler buffers, in bytes.
uint64_t workspace_bytes(const models::ModelSpec& spec, int64_t T, int64_t ctx, int threads, bool quantized = false);

/// Memory the tokenizer holds after loading a tokenizer.json of `json_bytes` bytes.
uint64_t tokenizer_bytes(uint64_t json_bytes);

/// The planner's stand-in for the tokenizer.json size of a GGUF's tokenizer metadata: the size
/// of a tokenizer.json whose load peaks as high as Tokenizer::from_gguf on this metadata
/// (calibrated on Qwen3's vocabulary; see footprint.cpp); 0 without tokenizer.ggml.tokens.
uint64_t gguf_tokenizer_json_bytes(const io::GgufFile& g);

/// The process without a model: executable, shared libraries, heap of the command line,
/// thread stacks. `start_rss` is the resident size of this same binary measured before it
/// loads anything (current_rss_bytes() early in the command; 0 = use a typical 15 MiB); a
/// run adds about 1 MiB of code pages (kernels) and `threads` stacks.
uint64_t runtime_base_bytes(int threads, uint64_t start_rss);

}  // namespace spool::plan
