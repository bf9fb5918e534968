// PEFT LoRA adapters (adapter_config.json + adapter_model.safetensors, PEFT 0.21) loaded for
// unmerged application (ops/lora.h): y = W x + s B (A x) per targeted matrix, s = lora_alpha / r
// (lora_alpha / sqrt(r) with use_rslora), r and alpha per module from rank_pattern / alpha_pattern.
//
// Keys PEFT writes (peft/utils/save_and_load.py, the adapter name stripped):
//   base_model.model.<module>.lora_A.weight [r, in], .lora_B.weight [out, r]   (target_modules: nn.Linear)
//   base_model.model.<...>.experts[.base_layer]*.lora_{A,B}.weight               (target_parameters)
// target_parameters wrap the routed experts' 3D parameters (transformers 5: experts.gate_up_proj
// [E, 2I, H] gate rows first, experts.down_proj [E, H, I]) with lora.ParamWrapper
// (peft/tuners/lora/layer.py): lora_A [E*r, in], lora_B [out, E*r], and expert e's delta is
//   dW_e[o, i] = s * sum_k B[o, k*E + e] * A[e*r + k, i]       (get_delta_weight, einsum "o r e, e r i")
// i.e. A's rows are expert-major and B's columns rank-major. Two parameters of one module nest:
// the first wrapper (gate_up_proj, registered first) is `experts.base_layer`, the second
// (down_proj) is `experts`; spool tells them apart by their shapes (in/out widths), not the order.
// Names map onto spool's normalised tensor names through the base checkpoint
// (io::Checkpoint::normalized_name): module M -> "<normalised M>.weight".
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "io/checkpoint.h"

namespace spool::lora {

/// The adapter_config.json fields spool reads (PEFT LoraConfig).
struct PeftConfig {
  int64_t r = 0;
  double lora_alpha = 0;
  bool use_rslora = false;
  std::vector<std::pair<std::string, int64_t>> rank_pattern;  ///< regex -> r (PEFT get_pattern_key order)
  std::vector<std::pair<std::string, double>> alpha_pattern;  ///< regex -> alpha
  std::vector<std::string> target_modules, target_parameters;
  /// The rank and scaling PEFT gives the module or parameter `key` (its path in the base model,
  /// e.g. "model.layers.0.self_attn.q_proj" or "model.layers.1.mlp.experts.gate_up_proj"): the
  /// first rank_pattern / alpha_pattern regex R with `key` matching (.*\.)?(R)$, else r / lora_alpha.
  /// Throws spool::Error for a pattern that is not a valid regex.
  std::pair<int64_t, float> rank_and_scaling(const std::string& key) const;
};

/// Parses adapter_config.json text (`where` names it in errors). Throws spool::Error for a
/// peft_type other than LORA, LoRA variants spool does not run (DoRA, aLoRA, QA-LoRA, LoRA
/// biases, fan_in_fan_out, modules_to_save, trainable tokens, layer replication, ...), each
/// named, and for a missing or non-positive r / lora_alpha.
PeftConfig parse_peft_config(const std::string& json_text, const std::string& where);

/// One targeted dense matrix (a target_modules Linear).
struct DenseLora {
  std::string name;    ///< spool's normalised tensor name ("layers.0.self_attn.q_proj.weight")
  std::string module;  ///< PEFT's module path ("model.layers.0.self_attn.q_proj")
  int64_t rank = 0, in = 0, out = 0;
  float scale = 0;          ///< PEFT scaling (the user's scale is applied by lora::LoraSet)
  std::vector<float> a, b;  ///< A [rank, in], B [out, rank], f32
};

/// One ParamWrapper of a MoE layer's routed experts, as stored (resolved against the layer's
/// shapes when the model binds it: lora::LoraSet::experts).
struct ExpertWrapper {
  std::string module;   ///< PEFT's path of the key ("model.layers.1.mlp.experts.base_layer")
  int depth = 0;        ///< number of ".base_layer" segments (nesting)
  int64_t rows_a = 0, in = 0, out = 0;  ///< A [rows_a, in] (rows_a = E * r), B [out, rows_a]
  std::vector<float> a, b;
};

/// The wrappers of one experts module ("layers.1.mlp.experts", normalised).
struct ExpertLora {
  std::string name;         ///< normalised module name: "layers.{L}.mlp.experts"
  std::string module;       ///< PEFT's module path without ".base_layer" ("model.layers.1.mlp.experts")
  std::vector<ExpertWrapper> wrappers;
};

/// A loaded adapter.
struct Adapter {
  std::string path;  ///< as given (directory or safetensors file)
  std::string name;  ///< its name (the directory's last component unless set)
  PeftConfig config;
  std::vector<DenseLora> dense;
  std::vector<ExpertLora> experts;
  /// Bytes of f32 A and B matrices held.
  uint64_t bytes() const;
};

/// Loads a PEFT LoRA adapter from `path`: its directory (adapter_config.json,
/// adapter_model.safetensors) or its .safetensors file (adapter_config.json beside it), with names
/// normalised for `base`. A/B may be F32, F16 or BF16 (kept as f32). Throws spool::Error naming
/// the file and tensor for: a missing file, an unsupported PEFT type or variant, a key that is
/// not a LoRA A/B weight (DoRA magnitudes, embedding LoRA, LoRA biases), an A without its B (or
/// the reverse), mismatched A/B shapes, a rank other than the config's, a module spool does not
/// load; a .gguf path (llama.cpp LoRA files: not supported yet).
Adapter load_adapter(const std::string& path, const io::Checkpoint& base);

}  // namespace spool::lora
