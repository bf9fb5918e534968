// Quantization recipes: which tensors are quantized how (docs/quant-format.md). Classes:
//   dense           every other 2-D projection: attention, Gated DeltaNet in/out projections,
//                   shared experts (and dense MLP layers)
//   lm_head         the output projection
//   expert_gate_up  routed experts' gate_proj and up_proj
//   expert_down     routed experts' down_proj
//   embed_tokens    the token embedding table (embed_tokens.weight); bf16 in every named recipe,
//                   quantized only by --embed-bits (RecipeOverrides::embed_bits)
// Kept in bf16: routers, shared_expert_gate, in_proj_a/b (in_proj_ba), conv1d, norms, other
// embedding tables (MTP copies, per-layer embeddings), and every 1-D tensor (A_log, dt_bias, biases).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ops/quant_matmul.h"

namespace spool::quant {

/// How one class is stored: kept (bf16) or quantized to `type` with group size `group`.
struct ClassSpec {
  bool keep = true;                   ///< stored in bf16 (type and group unused)
  ops::QType type = ops::QType::kQ4;  ///< code type when quantized
  int group = 64;                     ///< requested group size (effective_group() narrows it per matrix)
  /// "q3 g64", "q8 g64", "ternary g32" or "bf16".
  std::string describe() const;
};

/// Tensor classes of a recipe (see the file comment).
enum class TensorClass { kKeep, kDense, kLmHead, kExpertGateUp, kExpertDown, kEmbed };

/// "dense", "lm_head", "expert_gate_up", "expert_down", "embed_tokens" or "kept": the class's key
/// in convert's summary and config.json.
const char* class_name(TensorClass c);

/// A named recipe: one ClassSpec per tensor class (the recipe table of docs/quantization.md, quant_reference.json).
struct Recipe {
  std::string name;  ///< e.g. "tq3a-tqTe-down4"
  ClassSpec dense, lm_head, expert_gate_up, expert_down;
  ClassSpec embed;  ///< embed_tokens: kept (bf16) unless overridden (--embed-bits)
  /// Per-matrix formats over the class specs (the --target-bpw allocation, quant/allocate.h):
  /// keys are normalised tensor names ("layers.3.self_attn.q_proj.weight") or, for one layer's
  /// routed experts, "layers.L.mlp.experts.gate_up" / "layers.L.mlp.experts.down". Empty for
  /// named recipes.
  std::map<std::string, ClassSpec> tensor_specs;
  /// The spec of class `c` (kKeep gives a bf16 spec).
  const ClassSpec& spec(TensorClass c) const;
  /// The spec of the matrix (or expert slot) `key` of class `c`: tensor_specs[key] when present,
  /// else spec(c).
  const ClassSpec& spec_for(const std::string& key, TensorClass c) const;
};

/// The named recipes: q4, tq3 (3-bit g32), tq3-g64, q2, tq3a-tqTe, tq3a-tqTe-down3,
/// tq3a-tqTe-down4; for 4-8 bits per weight q8, q6, q5 (every class), q4-hi8 / q4-hi6 (dense and
/// lm_head q8 / q6, routed experts q4), q4-hi8-down6 (q4-hi8 with experts' down_proj q6) and
/// q5-hi8 (dense and lm_head q8, routed experts q5); all g64 (see the recipe table of
/// docs/quantization.md). Throws spool::UsageError listing them if unknown.
Recipe recipe(const std::string& name);
/// Names of all recipes.
const std::vector<std::string>& recipe_names();

/// Command-line overrides applied over a recipe (unset = keep the recipe's value).
struct RecipeOverrides {
  std::optional<int> bits;                      ///< --bits 2|3|4|5|6|8: every quantized class
  std::optional<int> group_size;                ///< --group-size 32|64|128: every quantized class
  std::optional<std::string> attn_bits;         ///< --attn-bits: dense class
  std::optional<std::string> expert_bits;       ///< --expert-bits N|ternary: expert gate/up (and down unless --expert-down-bits)
  std::optional<std::string> expert_down_bits;  ///< --expert-down-bits N|ternary
  std::optional<std::string> lm_head_bits;      ///< --lm-head-bits N|ternary
  /// --embed-bits N|ternary|bf16: embed_tokens (llama-quantize's --token-embedding-type); its
  /// group size is the dense class's (after --group-size). bf16 keeps it (the default).
  std::optional<std::string> embed_bits;
};
/// Applies overrides; throws spool::UsageError for bad values.
void apply_overrides(Recipe* r, const RecipeOverrides& o);

/// The class of a normalised tensor name with `shape`.
TensorClass classify(std::string_view name, const std::vector<int64_t>& shape);

/// The group size actually used for a matrix with `cols` columns: the requested one if it
/// divides cols, else the largest of 128/64/32 not above it that does, else cols.
int effective_group(int requested, int64_t cols);

}  // namespace spool::quant
