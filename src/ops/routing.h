// Router top-k selection of Mixture-of-Experts layers (host code shared by every backend).
#pragma once

namespace spool::ops {

/// Router of the DeepSeek family (HF DeepseekV3TopkRouter / DeepseekV3MoE.route_tokens_to_experts,
/// DeepseekV2Moe): scores s = sigmoid(logits) (`sigmoid`) or softmax(logits); selection scores
/// s' = s + bias (bias only with sigmoid, may be null); experts fall in n_group equal groups,
/// each scored by the sum of its two best s' (`group_top2_sum`, V3) or its best s' (V2); the
/// topk_group best groups stay eligible and the others' s' become 0.0 (as HF's masked_fill in
/// DeepSeek) or -inf (`mask_neg_inf`: HF 5.17 Glm4MoeTopkRouter); the k best s' are chosen.
/// Weights are the unbiased s of the chosen experts, divided by (their sum + 1e-20) when
/// `renormalize`, times `scaling` (routed_scaling_factor).
struct RouterParams {
  bool sigmoid = false;
  const float* bias = nullptr;  // [n_experts] host (e_score_correction_bias)
  int n_group = 1, topk_group = 1;
  bool group_top2_sum = false;
  bool mask_neg_inf = false;  // dropped groups' s' = -inf instead of 0.0
  bool renormalize = false;
  float scaling = 1.0f;
};

/// One token of RouterParams routing: logits [n_experts] (not modified) -> ids [k] (best s'
/// first, ties to the lower id) and weights [k]; margin (may be null): s'_k - s'_{k+1} of the
/// masked selection scores (1 when k == n_experts or s'_{k+1} is -inf).
void route_grouped(const float* logits, int n_experts, int k, const RouterParams& r, int* ids, float* weights,
                   float* margin = nullptr);

/// Selects the top-k experts of one token from router logits [n_experts] (overwritten with
/// softmax numerators). Ties go to the lower expert id (as torch.topk in practice). Writes k
/// ids (best first) and their softmax probabilities, renormalised over the k kept when
/// `renormalize`. The result does not depend on how experts are numbered.
/// If `margin` is not null it receives p_k - p_{k+1} (full-softmax probabilities; 1 when
/// k == n_experts). HF Qwen3MoeSparseMoeBlock: softmax(router_logits, f32), topk, norm_topk_prob.
void route_top_k(float* logits, int n_experts, int k, bool renormalize, int* ids, float* weights, float* margin = nullptr);

}  // namespace spool::ops
