// Model: a loaded decoder-only MoE language model. forward() runs a chunk of tokens through
// every layer, updating a State, and returns logits.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "experts/provider.h"
#include "io/checkpoint.h"
#include "lora/lora_set.h"
#include "models/moe.h"
#include "models/spec.h"
#include "models/state.h"
#include "ops/backend.h"
#include "ops/thread_pool.h"

namespace spool::experts {
class ExpertPredictor;
}
namespace spool::dist {
class Comm;
struct ExpertParallel;
}

namespace spool::models {

/// Which logits forward() writes.
enum class LogitsMode {
  kNone,  // none (e.g. prefill chunks before the last)
  kLast,  // [1, vocab] for the last token of the chunk
  kAll,   // [T, vocab] for every token (perplexity, tests)
};

/// One sequence's part of a batched forward step (Model::forward_batch).
struct SeqStep {
  std::span<const int32_t> ids;       ///< new tokens of this sequence (at least one)
  State* state = nullptr;             ///< its state: positions [state->pos, state->pos + ids.size())
  LogitsMode mode = LogitsMode::kLast;
  float* logits = nullptr;            ///< [ids.size() or 1, vocab] per mode (host memory)
  /// [ids.size(), hidden] (host memory): every row's hidden state after the final norm, the
  /// multi-token-prediction head's input (MtpStep::hidden); null = not wanted.
  float* hidden = nullptr;
  /// The user scale of each of the model's LoRA adapters for this sequence (Model::lora order;
  /// 0 = off; ops/lora.h), so that sequences of one step run different adapters; empty = the
  /// adapters' default scales. Throws spool::Error in forward_batch for another count.
  std::span<const float> lora;
};

/// One call of the multi-token-prediction head (Model::mtp_forward) over T rows of one sequence.
/// Row t sits at position pos0 + t of the head's own cache and predicts the token at
/// pos0 + t + 2 from the hidden state at pos0 + t and the token at pos0 + t + 1:
///   u_t = fc([norm_e(embed(ids[t])) ; norm_h(hidden[t])]), v = mtp layers(u), logits = head(norm(v))
/// (Qwen3.5/Qwen3-Next `mtp.*`; DeepSeek-V3 `eh_proj`, `enorm`, `hnorm`, `shared_head`: the
/// reference forward is at the top of make_fixtures_mtp.py and in DeepSeek-V3's inference code).
struct MtpStep {
  std::span<const int32_t> ids;    ///< [T] ids[t] = the token at position pos0 + t + 1
  const float* hidden = nullptr;   ///< [T, hidden] (host): SeqStep::hidden rows, or a previous call's hidden_out
  State* state = nullptr;          ///< the sequence's state (its MTP layers' caches)
  int64_t pos0 = 0;                ///< first position written in the head's cache
  LogitsMode mode = LogitsMode::kLast;
  float* logits = nullptr;         ///< [T or 1, vocab] per mode (host)
  float* hidden_out = nullptr;     ///< [T, hidden] (host): the head's output after its final norm, to draft further (optional)
  /// Logits only for ids [0, vocab_limit) (a draft vocabulary: the head's output rows are read
  /// for those ids alone); the others get kNoLogit. 0 = every id.
  int64_t vocab_limit = 0;
  /// LoRA user scales of this sequence, as SeqStep::lora (empty = the defaults).
  std::span<const float> lora;
  /// The logit of an id outside vocab_limit: finite (samplers refuse non-finite logits), never
  /// chosen (exp(kNoLogit - max) is 0).
  static constexpr float kNoLogit = -1e30f;
};

/// Optional observers for tests and tools (calibration, debugging).
struct ForwardHooks {
  RouteObserver on_route;     // per (MoE layer, token) chosen experts
  /// on_route takes its calls in any order of (layer, row) (it only counts, e.g. the loader's
  /// --expert-profile recorder), so a step of several streamed sequences still runs as two
  /// pipelined groups; their calls never overlap (the groups take turns). False: a hooked step
  /// runs unpipelined, its calls layer by layer over all rows.
  bool on_route_any_order = false;
  MarginObserver on_margin;   // per (MoE layer, token) routing margin
  /// Forces routing (RouteOverride); runs before on_route, which sees the forced choice.
  RouteOverride route_override;
  /// Replaces the next-layer prefetch's guesses for one row (with a forced routing, the guesses
  /// that go with it: `spool bench --routing-trace` of a trace with guesses): fills up to
  /// guesses.size() expert ids of MoE layer `layer`, best first, and returns how many (0: no
  /// guess for this row). `row` counts as RouteOverride's.
  std::function<int(int layer, int64_t row, std::span<int> guesses)> guess_override;
  /// hidden[T, H] entering layer `index` (index == n_layers: after the final norm).
  std::function<void(int index, const float* hidden, int64_t T)> on_hidden;
  /// residual[T, H] entering layer `index`'s FFN block (after the token mixer's residual add):
  /// what next-layer prefetch and the expert predictor read (host memory).
  std::function<void(int index, const float* residual, int64_t T)> on_ffn_input;
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
  /// One step over several sequences, each with its own state and position (ragged): the
  /// token rows of all go through the norms, projections and MoE together (an expert routed
  /// to by several sequences is acquired once), attention and the Gated DeltaNet recurrence
  /// run per sequence on its own state. Each sequence gets what forward() would give it alone,
  /// up to float rounding of row-blocked kernels. States must be distinct. Errors as forward():
  /// a bad id throws before any state changes; a failure part-way poisons every state.
  virtual void forward_batch(std::span<const SeqStep> seqs) = 0;
  /// Caps routed experts per token to k (0 = native top-k). k > native is an error.
  virtual void set_max_active_experts(int k) = 0;
  /// Next-layer prefetch (exact): inside each MoE layer, once its reads are started, the next MoE
  /// layer's router (after that layer's FFN norm) is applied to this layer's residual stream and
  /// its m best experts per row are passed to ExpertProvider::hint(). Routing and outputs do not
  /// change. 0 = off (the default). Models that cannot (a GPU backend) ignore it.
  virtual void set_next_layer_prefetch(int m) { (void)m; }
  /// Expert parallelism (docs/distributed.md): with a communicator of several ranks, this
  /// process computes only the routed experts dist::expert_owner() gives its rank, and each MoE
  /// layer's expert outputs are gathered from every rank (Comm::allgather_rows) before they are
  /// combined, so every rank gets the single-process result bit for bit. Every rank must make the
  /// same forward calls (lockstep: the same command and inputs on each). nullptr or one rank: all
  /// experts here. Throws spool::Error for several ranks on a GPU backend (MPI moves host memory)
  /// or a model type without routed experts.
  virtual void set_comm(dist::Comm* comm);
  /// set_comm() with the owners of the experts (dist::ExpertOwners: null = contiguous blocks) and
  /// the mode: ep.lead makes rank 0 announce each MoE layer's input rows and routing to the other
  /// ranks, which run serve_experts() instead of the model (`spool serve` over ranks). Throws as
  /// set_comm(), and for owners of another expert or rank count.
  virtual void set_expert_parallel(const dist::ExpertParallel& ep);
  /// A following rank's loop under a leading rank 0 (set_expert_parallel with lead): waits for
  /// each announced MoE layer (dist::ExpertStep), runs this rank's experts' rows of it and takes
  /// part in the gather, until rank 0 announces the end; returns the exit status it sent. An
  /// error computing one layer is logged and the loop goes on (rank 0's step fails with it); an
  /// error that leaves the ranks out of step (a malformed descriptor, an MPI error) throws
  /// spool::Error: the caller must end every rank then (Comm::abort). Throws spool::Error
  /// without a leading communicator.
  virtual int serve_experts();
  /// A trained expert predictor (experts::ExpertPredictor, --predictor): where it has a head
  /// for the next MoE layer, the next-layer prefetch reads the head's m best experts instead of
  /// the next router's. With `route_by` (--route-by-predictor, not exact), each MoE layer with a
  /// head routes among the head's top-k only (its router weighs them), so its experts are known
  /// one layer ahead. Throws spool::Error when the predictor does not fit the model or the
  /// model cannot use it (a GPU backend, a router with a selection bias). nullptr: none.
  virtual void set_expert_predictor(std::shared_ptr<const experts::ExpertPredictor> p, bool route_by);
  /// The MoE layer before `layer` whose FFN input a predictor for `layer` reads, or -1 when
  /// `layer` is not a MoE layer, has none before it, or its router cannot be read early.
  virtual int predictor_source(int layer) const {
    (void)layer;
    return -1;
  }
  /// The next-layer prefetch's guess as a linear map: w [E, H], b [E] such that layer `layer`'s
  /// router logits of the FFN input that predictor_source(layer) sees equal w u + b, where u is
  /// that residual row normalised to unit RMS (ExpertPredictor::normalise with the model's
  /// rms_norm_eps). The initial head of `spool calibrate --train-predictor`. Throws spool::Error
  /// where predictor_source(layer) < 0.
  virtual void router_as_linear(int layer, std::vector<float>* w, std::vector<float>* b);
  /// Replaces the expert provider (e.g. a streaming one); nullptr restores resident experts.
  virtual void set_expert_provider(std::shared_ptr<experts::ExpertProvider> provider) = 0;
  /// The provider serving routed experts now.
  virtual experts::ExpertProvider& expert_provider() = 0;
  /// The same, shared (to put a provider in front of it, e.g. experts::DeviceExpertCache).
  virtual std::shared_ptr<experts::ExpertProvider> shared_expert_provider() = 0;
  /// Sizes the forward-pass workspace for steps of up to `max_tokens` token rows over up to
  /// `max_seqs` sequences (workspace_arena_bytes); forward() grows it when a larger step comes.
  virtual void reserve_workspace(int64_t max_tokens, int max_seqs = 1) = 0;
  /// Bytes of the workspace arena now (its pages become resident only as they are used).
  virtual uint64_t workspace_capacity() const = 0;
  /// The backend every op of forward() runs on.
  virtual ops::Backend& backend() = 0;
  /// Multi-token-prediction layers loaded (ModelSpec::mtp_layers; 0 = no head, mtp_forward()
  /// unavailable).
  virtual int mtp_layers() const { return 0; }
  /// Runs the multi-token-prediction head (MtpStep). Throws spool::Error when the model has no
  /// head, for ids outside the vocabulary or a poisoned state; writes only the head's cache rows.
  virtual void mtp_forward(const MtpStep& step);

  ForwardHooks hooks;
  /// The LoRA adapters the model's weights point to (load_model with adapters; null: none).
  /// Held here so that they live as long as the model.
  std::shared_ptr<const lora::LoraSet> lora;
};

/// Loads the model of a checkpoint (family chosen by model_type), running on `backend`.
/// Throws spool::Error for an unknown model_type, missing/mis-shaped tensors.
std::unique_ptr<Model> load_model(std::shared_ptr<const io::Checkpoint> ckpt, std::shared_ptr<ops::Backend> backend);
/// The same with LoRA adapters applied unmerged (ops/lora.h): every matrix and routed expert an
/// adapter targets gets its terms while the family binds (models/bind.h LoraBindScope). Throws
/// spool::Error when a target matches no weight the model runs (LoraSet::check_all_bound), for
/// mismatched shapes, and on a backend without LoRA products (other than the CPU and CUDA).
/// `adapters` may be null or empty (no adapters).
std::unique_ptr<Model> load_model(std::shared_ptr<const io::Checkpoint> ckpt, std::shared_ptr<ops::Backend> backend,
                                  std::shared_ptr<lora::LoraSet> adapters);
/// The same on a CpuBackend over `pool` (which must outlive the model; null = one thread).
std::unique_ptr<Model> load_model(std::shared_ptr<const io::Checkpoint> ckpt, ops::ThreadPool* pool);

/// Bytes of the forward-pass workspace arena for steps of up to T token rows over up to
/// `max_seqs` sequences: the residual stream h, the normed input and the layer output [T, H]
/// each, plus the largest scratch any one layer takes (its Scratch::take), plus with several
/// sequences their last rows' normed input and logits [max_seqs, H + vocab]. The engine allocates exactly this (Model::
/// reserve_workspace) and the planner counts exactly this: one function, measured by running
/// the layers' own take() code on a measuring ops::Workspace.
uint64_t workspace_arena_bytes(const ModelSpec& spec, int64_t T, int max_seqs = 1);

}  // namespace spool::models
