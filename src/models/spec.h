// ModelSpec: everything a model family needs from config.json, validated once at load.
// Sources: HF configuration_qwen3_5_moe.py, configuration_qwen3_next.py,
// configuration_qwen3_moe.py (docs/architecture.md, "The decoder stack", says where the tensor math is).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/checkpoint.h"

namespace spool::models {

/// Token mixer of a decoder layer.
enum class MixerKind { kAttention, kGatedDeltaNet, kMLA };
/// Feed-forward block of a decoder layer.
enum class FfnKind { kMoE, kDense };

/// Activation of the gated MLPs (dense and experts): act(gate x) * up x. HF hidden_act /
/// hidden_activation: "silu" -> kSilu, "gelu_pytorch_tanh" -> kGeluTanh (PyTorch's tanh GELU).
/// kClampedSwiGLU (HF GptOssExperts._apply_gate, llama.cpp LLM_FFN_SWIGLU_OAI_MOE): g = min(gate,
/// 7), u = clamp(up, -7, 7), (u + 1) * g * sigmoid(1.702 g); routed experts only, and only with
/// GateUpLayout::kFusedInterleaved (ops::Activation::kClampedSwiGLU reads that layout).
enum class ActivationKind { kSilu, kGeluTanh, kClampedSwiGLU };

/// How the routed experts' gate and up projections reach the MoE block. Checkpoints that fuse
/// them as halves ([2I, H]: gate rows then up rows) are split into separate views at load
/// (io::Checkpoint::add_fused), so they are kSeparate here.
enum class GateUpLayout {
  kSeparate,          ///< gate_proj [I, H] and up_proj [I, H]
  kFusedInterleaved,  ///< one gate_up [2I, H], row 2j = gate_j, row 2j + 1 = up_j (HF GptOssExperts)
};

/// Normalisation of q and k before RoPE (an RMSNorm with a learned weight).
enum class QkNorm {
  kNone,
  kPerHead,          ///< over each head's head_dim (q_norm.weight [head_dim]: Qwen3, GLM-4.5 use_qk_norm, Gemma)
  kWholeProjection,  ///< over the whole q / k projection before the head split (q_norm.weight
                     ///< [n_heads * head_dim], k_norm.weight [n_kv_heads * head_dim]: OLMoE, MiniMax-M2)
};

/// Which dims RoPE rotates together within the rotary part of a head.
enum class RopeLayout {
  /// Dim i with dim i + rotary_dim/2 (rotate_half, GPT-NeoX style; ops::Rope).
  kHalves,
  /// Adjacent pairs (2i, 2i + 1) (GPT-J / complex form: HF rope_interleave, ERNIE-4.5's rotate on
  /// even/odd). Computed as kHalves after de-interleaving q and k to [even | odd] (RoPE's pairs
  /// mode, ops::Rope::pairs): the same scores.
  kInterleavedPairs,
};

/// How a router turns its logits z = W_r x (+ router bias) into per-expert scores s.
enum class RouterScore {
  kSoftmax,  ///< s = softmax(z) over the experts
  kSigmoid,  ///< s = sigmoid(z) per expert (DeepSeek-V3, GLM-4.5, MiniMax-M2)
};

/// How a router picks the top_k experts from the scores s (and the optional selection bias b,
/// MoeSpec::score_bias: it moves the choice, never the weights).
enum class RouterSelection {
  /// The top_k of s + b; weights = s of the chosen, renormalised when norm_topk_prob, times
  /// routed_scaling_factor. Without a bias and with softmax scores this is also "top-k of the
  /// logits, softmax over the k" (gpt-oss) when renormalised.
  kTopK,
  /// Group-limited top-k (DeepSeek-V2 group_limited_greedy, DeepSeek-V3 / GLM noaux_tc): the
  /// experts fall in n_group equal groups, each scored by its best (s + b) or the sum of its two
  /// best (group_top2_sum); the top topk_group groups are kept and the top_k of s + b is taken
  /// among their experts; weights as kTopK. n_group = 1 is greedy top-k (DeepSeek-V2 "greedy").
  kGroupedTopK,
};

/// Softmax attention geometry. Query heads share KV heads in groups (GQA).
struct AttentionSpec {
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int rotary_dim = 0;        // first rotary_dim dims of each head are rotated (partial RoPE)
  RopeLayout rope_layout = RopeLayout::kHalves;  // which rotary dims rotate together
  double rope_theta = 10000.0;
  bool output_gate = false;  // q_proj emits [query | gate] per head; out *= sigmoid(gate)
  QkNorm qk_norm = QkNorm::kNone;  // RMSNorm of q and k before RoPE
  bool qkv_bias = false;     // q/k/v_proj.bias added after the projections (GLM-4.5 attention_bias, gpt-oss)
  bool o_bias = false;       // o_proj.bias added after o_proj (gpt-oss)
  std::vector<float> inv_freq;        // explicit RoPE inverse frequencies (YaRN); empty = from rope_theta
  float rope_attention_scaling = 1.0f;  // factor on cos/sin (YaRN attention_factor)
  float softmax_scale = 0.0f;         // 0 = 1/sqrt(head_dim)
  int kv_latent_dim = 0;        // MLA: elements cached per position and layer (kv_lora_rank + qk_rope_head_dim); 0 = K and V heads
  int64_t sliding_window = 0;   // attention sees at most this many positions (0 = the whole context)
  /// Whether a windowed layer's KV cache is bounded by the window (models::State::kv_window, the
  /// planner's plan/footprint.cpp): it then holds about sliding_window - 1 + the prefill chunk
  /// rows (ops::KvCache::window_rows); false: it keeps every position and attention masks.
  bool window_bounds_kv = true;
  /// Layers the sliding window applies to (HF layer_types "sliding_attention"); empty = every
  /// attention layer when sliding_window > 0.
  std::vector<bool> window_layers;
  bool sinks = false;  // per-head attention sink logits in the softmax (self_attn.sinks [n_heads], gpt-oss)
  /// The layer has no v_proj: V is the K projection (k_proj x, before the k norm and RoPE;
  /// HF Gemma 4 attention_k_eq_v on full_attention layers). With value_norm V is then the
  /// weightless RMSNorm of it, without RoPE.
  bool k_eq_v = false;
  /// V is normalised per head by a weightless RMSNorm (x / sqrt(mean(x^2) + eps)) before it is
  /// cached (HF Gemma 4 v_norm, with_scale=False).
  bool value_norm = false;
  /// Whether layer i's attention is windowed.
  bool windowed(int layer) const {
    return sliding_window > 0 && (window_layers.empty() || (layer >= 0 && layer < static_cast<int>(window_layers.size()) && window_layers[layer]));
  }
};

/// Multi-head latent attention (DeepSeek-V2/V3, HF DeepseekV3Attention).
struct MlaSpec {
  int q_lora_rank = 0;  // 0: a direct q_proj (V2-Lite)
  int kv_lora_rank = 0, qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
  /// RoPE of q_pe / k_pe: adjacent pairs (HF rope_interleave true, the default: DeepSeek's
  /// complex form) or halves.
  RopeLayout rope_layout = RopeLayout::kInterleavedPairs;
  float latent_norm_eps = 0.0f;  // eps of q_a_layernorm / kv_a_layernorm; 0 = rms_norm_eps (GLM-4.7-Flash: 1e-6)
};

/// Row layout of the Gated DeltaNet input projections in a checkpoint.
enum class GdnLayout {
  kSplit,        // in_proj_qkv [q|k|v flat], in_proj_z, in_proj_b, in_proj_a (Qwen3.5)
  kGroupedQkvz,  // in_proj_qkvz / in_proj_ba grouped per key head: [q_g|k_g|v_g|z_g], [b_g|a_g] (Qwen3-Next)
};

/// Gated DeltaNet geometry (linear_attention layers).
struct GdnSpec {
  GdnLayout layout = GdnLayout::kSplit;  // set by the family; its load() may correct it by the checkpoint
  int n_k = 0, n_v = 0;  // key heads, value heads (n_v multiple of n_k)
  int d_k = 0, d_v = 0;  // head dims
  int conv_kernel = 4;
  int64_t key_dim() const { return static_cast<int64_t>(n_k) * d_k; }
  int64_t value_dim() const { return static_cast<int64_t>(n_v) * d_v; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

/// Routed experts and the optional shared expert.
struct MoeSpec {
  int n_experts = 0, top_k = 0, intermediate = 0;
  bool norm_topk_prob = true;    // renormalise the kept top-k weights to sum to 1
  int shared_intermediate = 0;   // 0 = no shared expert
  bool shared_expert_gate = false;  // shared output *= sigmoid(x . w_gate)
  std::string shared_name = "shared_expert";  // tensor prefix of the shared expert under mlp.
  RouterScore score = RouterScore::kSoftmax;
  RouterSelection selection = RouterSelection::kTopK;
  bool score_bias = false;       // mlp.gate.e_score_correction_bias added for selection (MiniMax-M2's
                                 // block_sparse_moe.e_score_correction_bias is renamed to it by io::Checkpoint)
  /// The router has a bias: `{block_prefix}{router_weight with .bias for .weight}` [E] added to
  /// the logits before scoring (HF GptOssTopKRouter).
  bool router_bias = false;
  int n_group = 1, topk_group = 1;  // RouterSelection::kGroupedTopK
  bool group_top2_sum = false;   // group score = sum of its two best (V3) instead of its best (V2)
  bool group_mask_neg_inf = false;  // dropped groups' selection scores -inf (GLM) instead of 0.0 (DeepSeek)
  float routed_scaling_factor = 1.0f;
  /// Tensor prefix of the routed block under `layers.{i}.` ("mlp." for most families; "" when
  /// the router sits directly under the layer) and the router weight's name under it.
  std::string block_prefix = "mlp.";
  std::string router_weight = "gate.weight";
  /// The router reads the layer's residual stream r (not the FFN's normed input) as
  /// u = RMSNorm_noweight(r) * {block_prefix}router.scale [H] * H^-1/2 (HF Gemma4TextRouter); the
  /// experts still read the normed input.
  bool router_input_scale = false;
  /// The renormalised top-k weights are multiplied by {block_prefix}router.per_expert_scale[e]
  /// [E] of the chosen expert (HF Gemma4TextRouter, after the renormalisation).
  bool per_expert_scale = false;
  /// Layout of the routed experts' gate and up projections (the provider's ExpertMats).
  GateUpLayout gate_up = GateUpLayout::kSeparate;
  /// The routed experts have biases `{block_prefix}experts.gate_up_proj_bias` [E, 2I] (in the
  /// gate_up row order) and `{block_prefix}experts.down_proj_bias` [E, H] (HF GptOssExperts).
  bool expert_bias = false;

  /// Whether routing needs ops::RouterParams (Backend::route_grouped_top_k): sigmoid scores, a
  /// selection bias, group-limited selection or a scaling factor. Otherwise it is
  /// Backend::route_softmax_top_k (softmax, top-k, optional renormalisation).
  bool general_router() const {
    return score != RouterScore::kSoftmax || score_bias || selection != RouterSelection::kTopK ||
           routed_scaling_factor != 1.0f;
  }
};

/// A decoder-only MoE language model's configuration.
struct ModelSpec {
  std::string model_type;      // text model_type, e.g. "qwen3_5_moe_text"
  std::string family;          // registry name (models/family.h): "qwen3_5_moe", "mixtral", ...
  int64_t vocab_size = 0;
  int hidden_size = 0;
  int n_layers = 0;
  float rms_norm_eps = 1e-6f;
  bool norm_one_plus = false;  // Gemma-style (1 + w) RMSNorm weights (hidden and q/k norms)
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 0;
  std::vector<MixerKind> mixers;  // per layer
  std::vector<FfnKind> ffns;      // per layer
  AttentionSpec attn;
  MlaSpec mla;  // kMLA layers
  GdnSpec gdn;
  MoeSpec moe;
  int dense_intermediate = 0;     // width of dense MLP layers
  ActivationKind activation = ActivationKind::kSilu;  // of the dense MLPs, the shared and the routed experts
  /// Per-layer attention geometry (head_dim, KV heads, RoPE, k_eq_v per layer kind: HF Gemma 4's
  /// full_attention layers with global_head_dim); empty = every layer uses `attn`. See attn_of().
  std::vector<AttentionSpec> attn_layers;
  /// Sandwich norms (HF Gemma 2-4): the mixer's output passes post_attention_layernorm before the
  /// residual add; the FFN reads pre_feedforward_layernorm(h) and its output passes
  /// post_feedforward_layernorm before the add (without: post_attention_layernorm is the FFN's
  /// input norm).
  bool sandwich_norms = false;
  /// With sandwich_norms, every MoE layer also runs a dense MLP (`mlp.`, dense_intermediate) in
  /// parallel (HF Gemma 4 enable_moe_block): h += N_post(N_post1(mlp(N_pre(h))) +
  /// N_post2(moe(N_pre2(h)))), norms post_feedforward_layernorm{,_1,_2} and
  /// pre_feedforward_layernorm{,_2}.
  bool parallel_dense_ffn = false;
  /// After each layer the whole residual stream is multiplied by the layer's scalar
  /// `layers.{i}.layer_scalar` [1] (HF Gemma 4).
  bool residual_scale = false;
  /// Embedding rows are multiplied by this (HF Gemma: sqrt(hidden_size) in the activation dtype);
  /// 1 = none. A tied output head uses the unscaled table.
  float embedding_scale = 1.0f;
  /// logits = c * tanh(logits / c) (HF final_logit_softcapping); 0 = none.
  float final_logit_softcap = 0.0f;
  std::vector<int64_t> eos_token_ids;  // from generation_config.json and config.json, in vocab
  /// Multi-token-prediction layers loaded after the main stack (layers n_layers ..
  /// n_layers + mtp_layers - 1: Qwen3.5 / Qwen3-Next `mtp.layers.*`, DeepSeek-V3 nextn layers),
  /// 0 unless the checkpoint was opened keeping them (io::Checkpoint::Options::mtp) and holds
  /// them. See mtp_spec() and Model::mtp_forward().
  int mtp_layers = 0;
  /// The config's declared count (mtp_num_hidden_layers / num_nextn_predict_layers), loaded or not.
  int mtp_declared = 0;
  /// How the family's checkpoints store the MTP head (set by the family's configure; kNone: the
  /// family has none that synth writes).
  io::MtpLayout mtp_layout = io::MtpLayout::kNone;

  /// Attention geometry of layer i: attn_layers[i], or attn when attn_layers is empty.
  const AttentionSpec& attn_of(int layer) const {
    return attn_layers.empty() || layer < 0 || layer >= static_cast<int>(attn_layers.size()) ? attn : attn_layers[layer];
  }
  /// Number of layers whose mixer is `k`.
  int n_layers_of(MixerKind k) const;
  /// Parameter counts (elements): total, and active per token (top_k routed experts).
  int64_t params_total = 0, params_active = 0;
};

/// `spec` with its mtp_layers layers appended (n_layers + mtp_layers layers): each an attention
/// layer of the kind of the stack's last attention layer (Qwen3.5: gated full attention;
/// DeepSeek: MLA) with a routed MoE FFN — the geometry States and the MTP layers are built with.
ModelSpec mtp_spec(const ModelSpec& spec);

/// Builds the spec of a supported model_type from a checkpoint's config. Throws spool::Error
/// naming config.json and the field for a missing/invalid field, and for an unknown model_type
/// (listing the supported ones).
ModelSpec build_spec(const io::Checkpoint& ckpt);

/// Same from parsed config parts: `config` is the text config (see io::text_config_of),
/// `tie_default` the top-level tie_word_embeddings, `label` names the source in errors.
ModelSpec build_spec(const io::Config& config, const io::GenerationDefaults& generation, bool tie_default,
                     const std::string& label);

/// model_type values spool can run.
const std::vector<std::string>& supported_model_types();

}  // namespace spool::models
