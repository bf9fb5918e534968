// Sparse MoE block: softmax router, top-k experts (optionally renormalised), SwiGLU experts
// from an ExpertProvider, optional shared expert with a sigmoid gate.
// HF Qwen3_5MoeSparseMoeBlock / Qwen3NextSparseMoeBlock / Qwen3MoeSparseMoeBlock:
// p = softmax(x W_r^T) (f32); top-k of p; w /= sum(w) when norm_topk_prob;
// y = sum_k w_k * down_k(silu(gate_k x) * up_k x), accumulated in routing-rank order;
// y += sigmoid(x . w_sg) * shared(x).
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "experts/provider.h"
#include "io/checkpoint.h"
#include "models/mlp.h"
#include "models/spec.h"
#include "ops/thread_pool.h"
#include "ops/weights.h"

namespace spool::models {

/// Called once per token and MoE layer with the chosen experts (best first) and their weights.
using RouteObserver = std::function<void(int layer, int64_t token, std::span<const int> experts, std::span<const float> weights)>;
/// Called once per token and MoE layer with the routing margin: the softmax probability of
/// the k-th chosen expert minus that of the best expert left out. A margin near float
/// precision (~1e-7) means another implementation may legitimately route differently.
using MarginObserver = std::function<void(int layer, int64_t token, float margin)>;

/// Selects the top-k experts of one token from router logits [n_experts] (overwritten with
/// softmax numerators). Ties go to the lower expert id (as torch.topk in practice). Writes k
/// ids (best first) and their softmax probabilities, renormalised over the k kept when
/// `renormalize`. The result does not depend on how experts are numbered.
/// If `margin` is not null it receives p_k - p_{k+1} (full-softmax probabilities; 1 when
/// k == n_experts).
void route_top_k(float* logits, int n_experts, int k, bool renormalize, int* ids, float* weights, float* margin = nullptr);

class MoeBlock {
 public:
  /// Binds `{prefix}gate.weight` [E, H] and, when the spec has one, the shared expert
  /// `{prefix}shared_expert.*` and `{prefix}shared_expert_gate.weight` [1, H].
  void bind(const io::Checkpoint& ck, const std::string& prefix, const ModelSpec& spec);
  /// x: [T, H] (normed input); out: [T, H]. `top_k` experts per token (<= native; the caller
  /// applies K-reduction), renormalised when the model renormalises its native top-k.
  void forward(const float* x, int64_t T, int layer, int top_k, experts::ExpertProvider& provider,
               const RouteObserver& observer, const MarginObserver& margins, float* out, ops::ThreadPool* pool);

 private:
  MoeSpec m_;
  int hidden_ = 0;
  ops::WeightView router_;
  DenseMlp shared_;
  std::vector<float> shared_gate_;  // [H]
  // Scratch.
  std::vector<float> logits_, weights_, ybuf_, shared_out_;
  std::vector<int> ids_;
};

}  // namespace spool::models
