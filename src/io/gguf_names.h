// GGUF -> Hugging Face tensor names and value transforms (the GGUF notes (ggml docs/gguf.md)
// sections 3 and 5; llama.cpp's convert_hf_to_gguf.py and gguf-py tensor_mapping.py). The
// generic machinery: the names every architecture shares (token_embd, output, output_norm, the
// merged ffn_*_exps experts, attn_q/k/v/output, ffn_gate_inp, dense ffn_*) and the transform
// kinds the loader undoes. Each architecture's own rows and flags are a GgufArch that its family
// fills (src/models/<family>.cpp, models::Family::gguf). A GGUF name maps to the normalised HF
// name the model code binds (checkpoint.h). The metadata -> config.json half is io/gguf_config.h.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/tensor_names.h"

namespace spool::io {

class GgufMeta;

/// What the loader does with a GGUF tensor to get the HF tensor back.
enum class GgufTransform {
  kNone,        ///< same values (shape reversed to HF order)
  kNormMinus1,  ///< llama.cpp stored 1 + w (zero-centred RMSNorm of Qwen3-Next / 3.5): w = stored - 1
  kALog,        ///< llama.cpp stored A = -exp(A_log): A_log = log(-A) (and V heads, for tiled archs)
  kVRows,       ///< V-head-indexed rows (tiled archs): back to grouped order; `v_offset` rows are not V
  kVCols,       ///< V-head-indexed columns (ssm_out of tiled archs)
  kBaSplitB,    ///< qwen3next ssm_ba rows grouped per k-head [b_g (R), a_g (R)]: the b rows
  kBaSplitA,    ///< ... the a rows
  kUnpermuteQ,  ///< llama arch: rows of each of the n_head heads stored interleaved (llama.cpp's
                ///< LlamaModel.permute: HF row s * hd/2 + k of a head is stored at 2k + s); undone
  kUnpermuteK,  ///< the same over the n_head_kv heads of attn_k
  kKvbFromKb,   ///< deepseek2 attn_k_b {nope, kv_lora, n_head} (kv_b's K rows, transposed per head)
                ///< with its sibling attn_v_b {kv_lora, v, n_head}: kv_b_proj [n_head * (nope + v), kv_lora], F32
  kWithKb,      ///< deepseek2 attn_v_b: consumed by kKvbFromKb (not a tensor of its own)
  kInterleaveUp,  ///< ffn_gate_exps of a GgufArch::split_gate_up arch (gpt-oss) (weight {H, I, E} or bias {I, E}) with its sibling
                  ///< ffn_up_exps: llama.cpp's GptOssModel split HF's fused gate_up rows (gate =
                  ///< even, up = odd); re-interleaved into gate_up [2I, H] per expert (whole rows:
                  ///< block types stay) / gate_up_proj_bias [E, 2I]
  kWithGate,      ///< ffn_up_exps of a split_gate_up arch: consumed by kInterleaveUp (not a tensor of its own)
};

/// Which HF shape a GGUF tensor takes (GGUF ne is reversed HF order, with these exceptions).
enum class GgufShape {
  kReversed,   ///< HF shape = reversed ne (trailing 1 dims dropped)
  kConv1d,     ///< ne {K, C} -> HF conv1d weight [C, 1, K]
  kRowVector,  ///< ne {H} or {H, 1} -> HF [1, H] (shared_expert_gate)
};

/// One GGUF tensor's HF identity.
struct GgufTensorMap {
  std::string hf_name;  ///< normalised HF name; for merged experts the per-expert name is made by the loader
  GgufTransform transform = GgufTransform::kNone;
  GgufShape shape = GgufShape::kReversed;
  int v_block = 1;        ///< kVRows / kVCols / kALog: elements per V head along the axis (d_v or 1)
  bool v_after_qk = false;  ///< kVRows: the first 2 * n_k * d_k rows (q and k) are not V rows
  bool merged_experts = false;  ///< ffn_{gate,up,down,gate_up}_exps [E, out, in]
  ExpertProj proj = ExpertProj::kGate;  ///< merged experts: which projection
  bool gate_up = false;   ///< merged experts: ffn_gate_up_exps (gate rows then up rows per expert)
  int layer = -1;         ///< blk.N, or -1
  bool nextn = false;     ///< a `blk.N.nextn.*` tensor (multi-token-prediction head)
  bool as_float = false;  ///< a block-typed tensor is dequantized to F32 (see GgufRow::as_float)
};

/// One GGUF per-layer tensor row: suffix after "blk.N." -> HF suffix after "layers.N.".
struct GgufRow {
  std::string gguf;
  std::string hf;
  GgufTransform transform = GgufTransform::kNone;
  GgufShape shape = GgufShape::kReversed;
  int v_block = 0;          ///< 0: none; -1: d_v (filled by the loader); 1: one element per head
  bool v_after_qk = false;  ///< kVRows: the first 2 * n_k * d_k rows are not V rows
  /// Bound as floats by the model code (routers, MLA's kv_b_proj read per head, bias tables):
  /// a block-typed tensor is dequantized to F32 on load.
  bool as_float = false;
};

/// The four RMSNorm rows of a block with q/k norms, in this order: attn_norm <- input_layernorm,
/// `post_norm` <- post_attention_layernorm (llama.cpp's name for it in the arch: "ffn_norm" in
/// qwen3moe, olmoe, minimax-m2; "post_attention_norm" in glm4moe, qwen3next, qwen35moe),
/// attn_q_norm <- self_attn.q_norm, attn_k_norm <- self_attn.k_norm (all ".weight"); every row
/// with transform `t` and the default shape.
std::vector<GgufRow> qk_norm_block_rows(const std::string& post_norm = "ffn_norm",
                                        GgufTransform t = GgufTransform::kNone);

/// How a checkpoint stores its multi-token-prediction (MTP) head; set by the family
/// (GgufArch::mtp, models::ModelSpec::mtp_layout).
enum class MtpLayout {
  kNone,  ///< no MTP head spool writes or maps by name
  /// One stacked `mtp.*` module: mtp.fc [H, 2H], mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden,
  /// mtp.norm and its layers mtp.layers.{k}.*; config key mtp_num_hidden_layers (Qwen3.5, Qwen3-Next).
  kMtpPrefix,
  /// Whole decoder layers after the stack, layers.{n_layers + k}.*, each with eh_proj [H, 2H],
  /// enorm, hnorm, shared_head.norm and shared_head.head; config key num_nextn_predict_layers
  /// (DeepSeek-V3, GLM-4.5).
  kNextnLayer,
};

/// A llama.cpp architecture a family loads from GGUF, and the converter conventions to undo.
struct GgufArch {
  /// general.architecture ("qwen3moe", "llama", "gpt-oss", ...).
  std::string name;
  /// HF model_type written into the config (the config hook may change it, e.g. deepseek2's
  /// deepseek_v2 / deepseek_v3 by its router).
  std::string model_type;
  /// Gated DeltaNet layers: (1 + w) norms (output_norm too), the ssm.* keys and layer_types
  /// (io/gguf_config.cpp), default partial rotary factor 0.25.
  bool hybrid = false;
  /// V heads stored in llama.cpp's tiled order (qwen35*).
  bool v_tiled = false;
  /// attention.key_length / value_length describe MLA's latent: no head_dim is derived from them.
  bool mla = false;
  /// The converter split HF's row-interleaved gate_up (gate = even rows, up = odd) into
  /// ffn_gate_exps / ffn_up_exps: the loader re-interleaves them (GgufTransform::kInterleaveUp).
  bool split_gate_up = false;
  /// The config hook reads {arch}.rope.scaling.* itself; otherwise a scaling other than "none"
  /// is an error.
  bool reads_rope_scaling = false;
  /// partial_rotary_factor when rope.dimension_count is absent.
  double partial_rotary_default = 1.0;
  /// The HF layout of the multi-token-prediction block's `blk.{N}.nextn.*` tensors. kMtpPrefix:
  /// they are an `mtp.*` head renamed by llama.cpp's converter (_QwenMtpMixin: fc -> eh_proj,
  /// pre_fc_norm_embedding -> enorm, pre_fc_norm_hidden -> hnorm, norm -> shared_head_norm),
  /// mapped back to `mtp.fc.weight`, `mtp.pre_fc_norm_embedding.weight`, ... Otherwise they keep
  /// the nextn-layer names `layers.{N}.eh_proj.weight`, ... (map_gguf_tensor).
  MtpLayout mtp = MtpLayout::kNone;
  /// attention.head_count_kv may differ per layer (gemma4: sliding and full layers): the generic
  /// reader takes layer 0's value and the config hook writes the per-layer-kind fields.
  bool per_layer_kv_heads = false;
  /// Tensors outside the blocks besides token_embd / output / output_norm, by exact GGUF name ->
  /// the name the family's loader reads (gemma4: rope_freqs.weight, kept under its GGUF name).
  std::vector<GgufRow> globals;
  /// Per-layer rows, searched before the common rows (attn_q/k/v/output, ffn_gate_inp, dense
  /// ffn_gate/up/down) so that they can override them.
  std::vector<GgufRow> rows;
  /// Writes the family's part of config.json (MoE fields, rope scaling, layer kinds) into `j`
  /// after the generic fields (io/gguf_config.h). Throws spool::Error naming the file and key.
  void (*config)(const GgufMeta& m, nlohmann::json& j) = nullptr;
};

/// Maps one GGUF tensor name of architecture `a`; nullopt for a name spool does not know (an
/// error the caller reports, except `*.nextn.*` names, which it drops). The multi-token-
/// prediction block N (the last nextn_predict_layers blocks, as llama.cpp's converter writes
/// them) maps like any block, plus its head (norms are 1 + w where `a.hybrid`, as every norm):
///   blk.N.nextn.eh_proj.weight          ne {2H, H}  -> layers.N.eh_proj.weight [H, 2H]
///                                                      (MtpLayout::kMtpPrefix: mtp.fc.weight)
///   blk.N.nextn.enorm.weight            ne {H}      -> layers.N.enorm.weight (mtp.pre_fc_norm_embedding.weight)
///   blk.N.nextn.hnorm.weight            ne {H}      -> layers.N.hnorm.weight (mtp.pre_fc_norm_hidden.weight)
///   blk.N.nextn.shared_head_norm.weight ne {H}      -> layers.N.shared_head.norm.weight (mtp.norm.weight)
///   blk.N.nextn.shared_head_head.weight ne {H, V}   -> layers.N.shared_head.head.weight
///   blk.N.nextn.embed_tokens.weight     ne {H, V}   -> layers.N.embed_tokens.weight
/// Whether block N is kept is the caller's choice (Checkpoint::Options::mtp).
std::optional<GgufTensorMap> map_gguf_tensor(const GgufArch& a, std::string_view gguf_name);

// The orders llama.cpp's converter gives rows (or columns) and the loaders undo (the GGUF
// checkpoint on weights, lora/gguf_adapter.cpp on LoRA's B rows / A columns): out[i] is the
// stored index of HF index i.

/// kUnpermuteQ / kUnpermuteK over n rows of n_heads heads (n / n_heads even; the caller checks):
/// HF row s * hd/2 + k of head h (s = 0, 1) is stored at h * hd + 2k + s (LlamaModel.permute).
std::vector<int64_t> gguf_unpermute_order(int64_t n, int64_t n_heads);
/// A tiled V-head axis of n_v heads (n_v = r * n_k): HF (grouped) head g * r + q is stored at
/// q * n_k + g (llama.cpp's _reorder_v_heads). Indices of heads, not of rows.
std::vector<int64_t> gguf_tiled_of_grouped(int64_t n_k, int64_t n_v);
/// qwen3next ssm_ba: 2 n_v stored rows grouped per k-head [b_g (R) | a_g (R)], R = n_v / n_k: the
/// stored rows of in_proj_b (first) and of in_proj_a (second).
std::pair<std::vector<int64_t>, std::vector<int64_t>> gguf_ba_split_rows(int64_t n_k, int64_t n_v);

}  // namespace spool::io
