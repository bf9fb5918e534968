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
/// num_attention_heads, num_key_value_heads, head_dim (null: hidden / heads); rejects
/// attention_bias=true.
void read_attention(const io::Config& c, AttentionSpec* a, int hidden);
/// num_experts / num_local_experts.
int experts_count(const io::Config& c);
/// Qwen2-MoE-style FFN kinds: layer i is MoE unless in mlp_only_layers or off decoder_sparse_step.
std::vector<FfnKind> sparse_layers(const io::Config& c, int n_layers);
/// Rejects a hidden_act other than silu / swish.
void check_act(const io::Config& c);
/// Reads num_experts_per_tok and checks it against s->moe.n_experts (already set).
void read_top_k(const io::Config& c, ModelSpec* s);

}  // namespace spool::models::cfg
