// Config readers shared by the family files (models/family.h): validated reads of config.json
// fields with errors naming the file and field.
#pragma once

#include <vector>

#include "io/config.h"
#include "models/spec.h"

namespace spool::models::cfg {

/// A positive integer field (<= 2^24); throws spool::Error naming it when missing or invalid.
int positive(const io::Config& c, const char* key);
/// A non-negative integer field, `def` when absent.
int non_negative(const io::Config& c, const char* key, int def);
/// RoPE settings (rope_parameters / rope_theta / partial_rotary_factor / rope_scaling) for
/// rope_type "default" only; sets a->rope_theta and a->rotary_dim from a->head_dim.
void read_rope(const io::Config& c, double default_partial, AttentionSpec* a);
/// The rope parameters object (v5 rope_parameters, else v4 rope_scaling; empty object if none)
/// and its rope_type ("default" when absent).
io::Config rope_parameters(const io::Config& c, std::string* type);
/// num_attention_heads, num_key_value_heads, head_dim (null: hidden / heads); attention_bias
/// sets a->qkv_bias when `bias_ok`, else attention_bias=true is rejected.
void read_attention(const io::Config& c, AttentionSpec* a, int hidden, bool bias_ok = false);
/// RoPE of MLA's qk_rope_head_dim dims (s->mla already read): default or YaRN (HF
/// _compute_yarn_parameters: inv_freq and attention_factor), and the softmax scale
/// (qk_nope + qk_rope)^-0.5, times mscale(factor, mscale_all_dim)^2 for YaRN with mscale_all_dim.
void read_mla_rope(const io::Config& c, ModelSpec* s);
/// YaRN RoPE (HF _compute_yarn_parameters, modeling_rope_utils.py) of `dim` rotary dims at base
/// `theta`, scale `factor` over `orig` original positions, from rope_parameters `rp` (beta_fast 32,
/// beta_slow 1, truncate `truncate_default`, attention_factor or the mscale / mscale_all_dim
/// rule): sets a->inv_freq [dim/2] and a->rope_attention_scaling; returns mscale_all_dim (0 if absent).
double read_yarn(const io::Config& rp, double theta, int dim, double factor, double orig, bool truncate_default,
                 AttentionSpec* a);
/// MLA attention geometry (HF DeepseekV3Attention / Glm4MoeLiteAttention): num_attention_heads
/// (K and V per head after kv_b_proj), q_lora_rank (absent or null: no q LoRA), kv_lora_rank,
/// qk_nope_head_dim, qk_rope_head_dim (even), v_head_dim, rope_interleave (default true).
/// attention_bias=true is rejected naming `model`.
void read_mla(const io::Config& c, ModelSpec* s, const char* model);
/// The sigmoid + e_score_correction_bias router of DeepSeek-V3 / GLM-4.5 (HF noaux_tc):
/// n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts (ungated
/// mlp.shared_experts of moe_intermediate_size * n_shared_experts), n_group / topk_group
/// (n_group default 1; topk_group default 1, or n_group when `topk_group_default_all`; group
/// score = sum of its two best; dropped groups' scores -inf when `mask_neg_inf` (HF 5.17
/// Glm4MoeTopkRouter), else 0 (DeepseekV3TopkRouter)), norm_topk_prob (default `norm_default`),
/// routed_scaling_factor (default 1).
void read_noaux_tc_moe(const io::Config& c, ModelSpec* s, bool norm_default, bool topk_group_default_all = false,
                       bool mask_neg_inf = true);
/// num_experts / num_local_experts.
int experts_count(const io::Config& c);
/// Qwen2-MoE-style FFN kinds: layer i is MoE unless in mlp_only_layers or off decoder_sparse_step.
std::vector<FfnKind> sparse_layers(const io::Config& c, int n_layers);
/// Rejects a hidden_act other than silu / swish.
void check_act(const io::Config& c);
/// Reads num_experts_per_tok and checks it against s->moe.n_experts (already set).
void read_top_k(const io::Config& c, ModelSpec* s);

}  // namespace spool::models::cfg
