// Router top-k selection of Mixture-of-Experts layers (host code shared by every backend).
#pragma once

namespace spool::ops {

/// Selects the top-k experts of one token from router logits [n_experts] (overwritten with
/// softmax numerators). Ties go to the lower expert id (as torch.topk in practice). Writes k
/// ids (best first) and their softmax probabilities, renormalised over the k kept when
/// `renormalize`. The result does not depend on how experts are numbered.
/// If `margin` is not null it receives p_k - p_{k+1} (full-softmax probabilities; 1 when
/// k == n_experts). HF Qwen3MoeSparseMoeBlock: softmax(router_logits, f32), topk, norm_topk_prob.
void route_top_k(float* logits, int n_experts, int k, bool renormalize, int* ids, float* weights, float* margin = nullptr);

}  // namespace spool::ops
