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
#include "io/family_rules.h"

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
  /// Which projection it targets. PEFT wrappers are told apart by their shapes (kByShape: the
  /// fused gate_up_proj or down_proj); a GGUF adapter names it (ffn_gate_exps, ffn_up_exps,
  /// ffn_down_exps; ffn_gate_up_exps is kGateUp).
  enum class Target { kByShape, kGateUp, kGate, kUp, kDown } target = Target::kByShape;
  /// Rank per expert and scaling when the file gives them (GGUF: alpha / r); 0: from the PEFT config.
  int64_t rank = 0;
  float scale = 0;
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
  /// Bytes a run holds for it once its terms are bound: A, B and the transposed copy of B that
  /// lora::LoraSet makes for the products (what the loader and `spool plan --lora` count).
  uint64_t run_bytes() const;
};

/// Loads a LoRA adapter from `path`: a llama.cpp GGUF adapter (a path ending in .gguf:
/// load_gguf_adapter, with `rules` to resolve its architecture) or a PEFT adapter: its directory (adapter_config.json,
/// adapter_model.safetensors) or its .safetensors file (adapter_config.json beside it), with names
/// normalised for `base`. A/B may be F32, F16 or BF16 (kept as f32). Throws spool::Error naming
/// the file and tensor for: a missing file, an unsupported PEFT type or variant, a key that is
/// not a LoRA A/B weight (DoRA magnitudes, embedding LoRA, LoRA biases), an A without its B (or
/// the reverse), mismatched A/B shapes, a rank other than the config's, a module spool does not
/// load.
Adapter load_adapter(const std::string& path, const io::Checkpoint& base, const io::RulesResolver& rules);

/// Loads a llama.cpp GGUF LoRA adapter (convert_lora_to_gguf.py; llama-adapter.cpp reads the same):
/// general.type "adapter", adapter.type "lora", general.architecture one the base's family loads,
/// adapter.lora.alpha (absent or 0: scaling 1, else alpha / r per tensor, r = lora_b's ne[0]);
/// tensors "<base GGUF tensor>.lora_a" ne {in, r} and ".lora_b" ne {r, out} (row-major: PEFT's
/// A [r, in] and B [out, r]); merged experts "blk.N.ffn_{gate,up,down,gate_up}_exps.weight.lora_a"
/// ne {in, r, E} and ".lora_b" ne {r, out, E}. Names map to `base`'s through the architecture's
/// GGUF table (io::map_gguf_tensor), and the converter's row and column transforms are undone on
/// B's rows / A's columns as on the base weight (llama arch's q/k row permutation, Qwen3.5's tiled
/// V heads, Qwen3-Next's ssm_ba split). A and B may be any type spool reads (kept as f32). Throws
/// spool::Error naming the file (and tensor) for: not an adapter, not a LoRA (control vectors),
/// activated LoRA (invocation tokens), another architecture, a lora_a without its lora_b (or the
/// reverse), shapes that disagree, a tensor spool cannot apply LoRA to (embeddings, norms, MLA's
/// split attn_k_b / attn_v_b, gpt-oss's split experts, MTP blocks).
Adapter load_gguf_adapter(const std::string& path, const io::Checkpoint& base, const io::RulesResolver& rules);

}  // namespace spool::lora
