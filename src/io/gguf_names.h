// GGUF -> Hugging Face tensor names and value transforms, one table per llama.cpp architecture
// (the GGUF notes (ggml docs/gguf.md) sections 3 and 5; llama.cpp's convert_hf_to_gguf.py and
// gguf-py tensor_mapping.py for olmoe, llama, glm4moe, minimax-m2, gpt-oss). Kept apart from the loader so
// that each table can move into its family's registry entry; they stay in io/ for now because
// spool_io sits below spool_models (Checkpoint::open cannot see the family registry). A GGUF name
// maps to the normalised HF name the model code binds (checkpoint.h), plus what the loader must do
// to undo llama.cpp's converter. The metadata -> config.json half is io/gguf_config.h.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "io/tensor_names.h"

namespace spool::io {

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
  kInterleaveUp,  ///< gpt-oss ffn_gate_exps (weight {H, I, E} or bias {I, E}) with its sibling
                  ///< ffn_up_exps: llama.cpp's GptOssModel split HF's fused gate_up rows (gate =
                  ///< even, up = odd); re-interleaved into gate_up [2I, H] per expert (whole rows:
                  ///< block types stay) / gate_up_proj_bias [E, 2I]
  kWithGate,      ///< gpt-oss ffn_up_exps: consumed by kInterleaveUp (not a tensor of its own)
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
};

/// Which spool family a GGUF architecture feeds (selects its tensor table and config keys).
enum class GgufFamily { kQwen3Moe, kQwen3Next, kQwen35Moe, kOlmoe, kMixtral, kGlm4Moe, kMinimaxM2, kDeepseek2, kGptOss };

/// A supported GGUF architecture: its general.architecture string, the HF model_type the
/// loader reports, and the converter conventions to undo.
struct GgufArch {
  const char* name;        ///< "qwen3moe", "qwen3next", "qwen35moe", "olmoe", "llama", "glm4moe", "minimax-m2", "deepseek2", "gpt-oss"
  /// "qwen3_moe", "qwen3_next", "qwen3_5_moe_text", "olmoe", "mixtral", "glm4_moe", "minimax_m2", "gpt_oss",
  /// "deepseek_v3" (the config reader says deepseek_v2 for a softmax router: gguf_config_json's model_type wins)
  const char* model_type;
  GgufFamily family;
  bool hybrid;             ///< Gated DeltaNet layers, (1 + w) norms, shared expert
  bool v_tiled;            ///< V heads stored in llama.cpp's tiled order (qwen35*)
};

/// The architecture named `arch`, or nullptr if spool does not load it.
const GgufArch* find_gguf_arch(std::string_view arch);

/// Comma-separated list of supported architecture strings (for error messages).
std::string gguf_arch_list();

/// Maps one GGUF tensor name of architecture `a`; nullopt for a tensor spool does not use (MTP
/// blocks `blk.N.nextn.*` and tensors of layers >= `n_layers` are skipped by the caller; an
/// unknown name is an error the caller reports).
std::optional<GgufTensorMap> map_gguf_tensor(const GgufArch& a, std::string_view gguf_name);

}  // namespace spool::io
