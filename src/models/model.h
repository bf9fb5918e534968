// Model: a loaded decoder-only MoE language model. forward() runs a chunk of tokens through
// every layer, updating a State, and returns logits.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "experts/provider.h"
#include "io/checkpoint.h"
#include "models/moe.h"
#include "models/spec.h"
#include "models/state.h"
#include "ops/backend.h"
#include "ops/thread_pool.h"

namespace spool::models {

/// Which logits forward() writes.
enum class LogitsMode {
  kNone,  // none (e.g. prefill chunks before the last)
  kLast,  // [1, vocab] for the last token of the chunk
  kAll,   // [T, vocab] for every token (perplexity, tests)
};

/// Optional observers for tests and tools (calibration, debugging).
struct ForwardHooks {
  RouteObserver on_route;     // per (MoE layer, token) chosen experts
  MarginObserver on_margin;   // per (MoE layer, token) routing margin
  /// hidden[T, H] entering layer `index` (index == n_layers: after the final norm).
  std::function<void(int index, const float* hidden, int64_t T)> on_hidden;
};

class Model {
 public:
  virtual ~Model() = default;
  /// The configuration the model was built from.
  virtual const ModelSpec& spec() const = 0;
  /// Fresh, empty state for one sequence (KV entries of the type set by set_kv_type).
  virtual State new_state() const = 0;
  /// KV-cache element type of states made from now on (default f32).
  virtual void set_kv_type(ops::KvType type) = 0;
  /// Runs ids[0..T) at positions [state.pos, state.pos + T), then advances state.pos by T.
  /// logits: [T or 1, vocab] f32 per `mode`. Throws spool::Error for an id outside the
  /// vocabulary (state unchanged). Any other failure part-way (e.g. an expert read error)
  /// leaves `state.poisoned` set: later calls refuse it until state.reset().
  virtual void forward(std::span<const int32_t> ids, State& state, LogitsMode mode, float* logits) = 0;
  /// Caps routed experts per token to k (0 = native top-k). k > native is an error.
  virtual void set_max_active_experts(int k) = 0;
  /// Replaces the expert provider (e.g. a streaming one); nullptr restores resident experts.
  virtual void set_expert_provider(std::shared_ptr<experts::ExpertProvider> provider) = 0;
  /// The provider serving routed experts now.
  virtual experts::ExpertProvider& expert_provider() = 0;
  /// Sizes the forward-pass workspace for chunks of up to `max_tokens` tokens
  /// (workspace_arena_bytes); forward() grows it when a longer chunk comes.
  virtual void reserve_workspace(int64_t max_tokens) = 0;
  /// Bytes of the workspace arena now (its pages become resident only as they are used).
  virtual uint64_t workspace_capacity() const = 0;
  /// The backend every op of forward() runs on.
  virtual ops::Backend& backend() = 0;

  ForwardHooks hooks;
};

/// Loads the model of a checkpoint (family chosen by model_type), running on `backend`.
/// Throws spool::Error for an unknown model_type, missing/mis-shaped tensors.
std::unique_ptr<Model> load_model(std::shared_ptr<const io::Checkpoint> ckpt, std::shared_ptr<ops::Backend> backend);
/// The same on a CpuBackend over `pool` (which must outlive the model; null = one thread).
std::unique_ptr<Model> load_model(std::shared_ptr<const io::Checkpoint> ckpt, ops::ThreadPool* pool);

/// Bytes of the forward-pass workspace arena for chunks of up to T tokens: the residual
/// stream h, the normed input and the layer output [T, H] each, plus the largest scratch any
/// one layer takes (its Scratch::take). The engine allocates exactly this (Model::
/// reserve_workspace) and the planner counts exactly this: one function, measured by running
/// the layers' own take() code on a measuring ops::Workspace.
uint64_t workspace_arena_bytes(const ModelSpec& spec, int64_t T);

}  // namespace spool::models
