// Sparse MoE block: softmax router, top-k experts (optionally renormalised), SwiGLU experts
// from an ExpertProvider, optional shared expert with a sigmoid gate.
// HF Qwen3_5MoeSparseMoeBlock / Qwen3NextSparseMoeBlock / Qwen3MoeSparseMoeBlock:
// p = softmax(x W_r^T) (f32); top-k of p; w /= sum(w) when norm_topk_prob;
// y = sum_k w_k * down_k(silu(gate_k x) * up_k x), accumulated in routing-rank order;
// y += sigmoid(x . w_sg) * shared(x).
// The router's mechanisms are MoeSpec fields: RouterScore (softmax / sigmoid), RouterSelection
// (top-k / group-limited top-k), score_bias (moves the choice only), routed_scaling_factor: any
// of them beyond softmax top-k routes through ops::RouterParams (MoeSpec::general_router:
// DeepSeek, GLM, MiniMax-M2, ERNIE-4.5). router_bias (HF GptOssTopKRouter): z = W_r x + b_r, then
// softmax, top-k, renormalise (= top-k of z, softmax over the k). expert_bias and
// GateUpLayout::kFusedInterleaved with ActivationKind::kClampedSwiGLU (HF GptOssExperts): the
// clamped SwiGLU over interleaved gate/up rows (ops::Activation::kClampedSwiGLU).
// Gemma 4 (HF Gemma4TextRouter / Gemma4TextExperts): the router reads the residual stream r as
// u = RMSNorm_noweight(r) * router.scale * H^-1/2 (MoeSpec::router_input_scale); softmax, top-k,
// renormalise, then w_e *= router.per_expert_scale[e] (MoeSpec::per_expert_scale); tanh-GELU
// experts (ModelSpec::activation).
#pragma once

#include <exception>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "experts/provider.h"
#include "io/checkpoint.h"
#include "lora/lora_set.h"
#include "models/layer.h"
#include "models/mlp.h"
#include "models/spec.h"
#include "ops/backend.h"
#include "ops/routing.h"
#include "ops/weights.h"
#include "ops/workspace.h"

namespace spool::dist {
struct ExpertParallel;
struct ExpertStep;
}

namespace spool::models {


/// The distinct experts of per-row rankings ranked [T, m] (each row best first), best first:
/// every row's first choice, then every row's second, ... (ids outside [0, n_experts) skipped).
/// The order prefetch reads its guesses in.
std::vector<int> best_first_union(std::span<const int> ranked, int64_t T, int m, int n_experts);

/// Router top-k selection (ops/routing.h), named here for model code and tests.
using ops::route_top_k;

class MoeBlock {
 public:
  /// Scratch of one forward over T tokens with `top_k` experts per token (H hidden, E
  /// experts): router logits [T, E], ids [T, k] (host ints), weights [T, k], margins [T],
  /// expert outputs y [T*k, H] and, with a shared expert, its output [T, H] and scratch (y then has
  /// T more rows: the shared expert's output where it runs with the routed experts, see forward()).
  struct Scratch {
    float* logits;
    int* ids;         // host-visible (Workspace::ints)
    int* ids_device;  // in the workspace's own memory (the device on a GPU): expert_ffn_routed's ids
    float *weights, *margins, *y, *shared = nullptr;
    float* router_in = nullptr;  // [T, H] the router's input (MoeSpec::router_input_scale)
    DenseMlp::Scratch shared_mlp{};
    static Scratch take(ops::Workspace& ws, const MoeSpec& m, int64_t H, int64_t T, int top_k);
  };

  /// Binds `{prefix}gate.weight` [E, H], `{prefix}gate.e_score_correction_bias` [E] when the
  /// spec routes with a score bias, and, when the spec has one, the shared expert
  /// `{prefix}{shared_name}.*` and `{prefix}shared_expert_gate.weight` [1, H]. With
  /// MoeSpec::router_bias the router's bias [E] (its weight's name with .bias), with
  /// MoeSpec::expert_bias `{prefix}experts.gate_up_proj_bias` [E, 2I] and
  /// `{prefix}experts.down_proj_bias` [E, H]. Throws spool::Error when the activation and the
  /// gate/up layout do not fit (clamped SwiGLU <=> interleaved fused gate_up).
  /// The router weight is `{prefix}{MoeSpec::router_weight}` (default gate.weight); with
  /// MoeSpec::router_input_scale also `{prefix}router.scale` [H], with MoeSpec::per_expert_scale
  /// `{prefix}router.per_expert_scale` [E].
  /// Inside a LoraBindScope, also the routed experts' LoRA terms (module `{prefix}experts`);
  /// spool::Error for LoRA on experts whose gate_up is interleaved (gpt-oss).
  void bind(const io::Checkpoint& ck, const std::string& prefix, const ModelSpec& spec);
  /// Moves the router, the shared expert and its gate to where `be` reads them (a no-op on
  /// host backends). Routed experts come from the ExpertProvider, not from here.
  void place(ops::Backend& be);
  /// x: [T, H] (normed input); out: [T, H]. `top_k` experts per token (<= native; the caller
  /// applies K-reduction), renormalised when the model renormalises its native top-k.
  /// Scratch from `ws` (the shared expert's too). `between` (may be empty) runs after the
  /// routed experts' reads were started (ExpertProvider::prepare) and before they are
  /// acquired: DecoderModel hands the CPU to another group of sequences there, so their
  /// compute hides these reads. `residual` [T, H]: the layer's residual stream, which the
  /// router reads instead of x with MoeSpec::router_input_scale (required then).
  /// `within` (may be null; used when within->layer == layer): each row routes among its
  /// within->k listed experts only (--route-by-predictor): the router's logits of every other
  /// expert are masked before the family's own selection and weighting run. CPU backends.
  /// `route_override` (may be null or empty) replaces each row's experts and weights after
  /// routing (RouteOverride; its rows are numbered from `row0`, as the observers' are); the
  /// observers see the replaced choice. Throws spool::Error for an overridden id outside
  /// [0, n_experts) or listed twice in a row. `ep` (may be null): expert parallelism
  /// (Model::set_expert_parallel): this rank runs its own experts' rows and gathers the others'
  /// before the combine (the same bits as one process; on a GPU backend with a device-memory
  /// communicator, NcclComm, the rows stay on the device); with ep->lead (CPU only) it first announces the
  /// layer's rows and routing to the following ranks (serve_step). A rank that fails computing
  /// its experts still takes part in the gather (with no rows), so every rank throws spool::Error
  /// for that layer and none is left waiting.
  void forward(const float* x, int64_t T, int layer, int top_k, experts::ExpertProvider& provider,
               const RouteObserver& observer, const MarginObserver& margins, float* out, ops::Backend& be,
               ops::Workspace& ws, const std::function<void()>& between = {}, const float* residual = nullptr,
               const RouteOverride* route_override = nullptr, int64_t row0 = 0,
               const std::function<void()>* after_prepare = nullptr, const RouteWithin* within = nullptr,
               const dist::ExpertParallel* ep = nullptr) const;
  /// A following rank's part of one MoE layer led by rank 0 (ExpertParallel::lead): x [T, H]
  /// (host) and ids [T, K] the leader's input rows and routing, lora [T, lora_n] its rows' LoRA
  /// scales (null: the defaults). Runs this rank's experts' rows and takes part in the gather;
  /// throws spool::Error after the gather when this rank or another failed.
  void serve_step(const float* x, const int* ids, int64_t T, int K, const float* lora, int lora_n, int layer,
                  experts::ExpertProvider& provider, ops::Backend& be, ops::Workspace& ws, const dist::ExpertParallel& ep) const;
  /// Next-layer prefetch guesses: the experts this block's router ranks among the m best for any
  /// row of x [T, H] (the router's input: this layer's normed FFN input, in host memory on a CPU
  /// backend), distinct, best first (best_first_union). Selection scores as routing ranks them (logits, + router
  /// bias; sigmoid + score bias for sigmoid routers), without groups. Empty for a router that
  /// reads the residual stream (MoeSpec::router_input_scale). Never changes routing.
  std::vector<int> predict(const float* x, int64_t T, int m, ops::Backend& be) const;
  /// The router's selection scores of rows x [T, H] (as predict() ranks them) into out [T, E],
  /// host memory (x and out on a CPU backend). Empty router input (router_input_scale): throws.
  void selection_scores(const float* x, int64_t T, ops::Backend& be, float* out) const;
  /// The router's logits (x W_r^T + router bias, before softmax or sigmoid) of rows x [T, H]
  /// into out [T, E]; CPU backends (host memory).
  void router_logits(const float* x, int64_t T, ops::Backend& be, float* out) const;
  /// True when the router reads the layer's normed FFN input (not the residual stream).
  bool routes_normed_input() const { return !m_.router_input_scale; }
  /// True when forward() can restrict routing to listed experts (RouteWithin): a router of the
  /// normed FFN input without a selection bias (a bias would let a masked expert win) and without
  /// group-limited selection (the listed experts may span more groups than it keeps).
  bool can_route_within() const {
    const bool grouped = m_.selection == RouterSelection::kGroupedTopK && m_.topk_group < m_.n_group;
    return !m_.router_input_scale && score_bias_.empty() && !grouped;
  }
  /// True for a sigmoid-scored router (selection_scores differ from router_logits).
  bool sigmoid_router() const { return m_.general_router() && m_.score == RouterScore::kSigmoid; }
  /// The general router's parameters (ops::RouterParams) for route_grouped_top_k; the selection
  /// bias where place() put it.
  ops::RouterParams router_params() const;

 private:
  // Expert parallelism: runs the pairs of `groups` (all of the layer's) whose experts ep gives
  // this rank, then gathers every rank's rows into y [T*K, H] in groups' order. `while_reading`
  // runs once the first batch's reads are started. `failed`: this rank already failed (it sends
  // no rows). Throws after the gather when any rank failed. With `rank_order` (a communicator on
  // device memory, dist::Comm::device_memory): y is gathered in place in rank order (each rank's
  // experts ascending) whatever the owners, and *rank_order gets groups rearranged to that order
  // (rows, first, row_of; active in that order) for the combine, which then reads each pair's row
  // where the gather left it: no reorder copy, the same sums.
  void run_owned(const ops::ExpertGroups& groups, const float* x, int layer, experts::ExpertProvider& provider, ops::Backend& be,
                 float* y, const dist::ExpertParallel& ep, const std::function<void()>& while_reading, std::exception_ptr failed,
                 ops::ExpertGroups* rank_order = nullptr) const;

  MoeSpec m_;
  int hidden_ = 0;
  float eps_ = 1e-6f;  // rms_norm_eps (the router input's norm)
  ops::WeightView router_;
  DenseMlp shared_;
  std::vector<float> shared_gate_;  // [H]
  const float* shared_gate_p_ = nullptr;  // shared_gate_ where the backend reads it (null: no gate)
  std::vector<float> score_bias_;   // [E] e_score_correction_bias (DeepSeek-V3)
  const float* score_bias_p_ = nullptr;  // score_bias_ where the backend reads it (null: none)
  ops::Activation act_ = ops::Activation::kSwiGLU;  // of the routed experts
  // router_input_scale: router.scale * H^-1/2 [H], the weight of the router input's RMSNorm.
  std::vector<float> router_norm_;
  const float* router_norm_p_ = nullptr;
  std::vector<float> expert_scale_;  // [E] router.per_expert_scale (host: Backend::mul_indexed)
  // router_bias / expert_bias: router bias [E], expert biases gate_up [E, 2I] and down [E, H]
  // (f32), and where the backend reads them.
  // LoRA on the routed experts (lora::LoraSet::experts, bound while a LoraBindScope is open):
  // attached to the views the provider hands out, so resident and streamed experts alike.
  const lora::ExpertDeltas* expert_lora_ = nullptr;
  std::vector<float> router_bias_, gate_up_bias_, down_bias_;
  const float *router_bias_p_ = nullptr, *gate_up_bias_p_ = nullptr, *down_bias_p_ = nullptr;
};

}  // namespace spool::models
