// The family registry: everything that differs between model families lives in one file per
// family under src/models/ (its config -> ModelSpec rules, which mixer / router / MLP each layer
// uses, its loader, how its checkpoints name and lay out tensors, its GGUF architecture, what
// `spool convert` keeps in bf16 and how `spool plan` describes its KV cache), plus its presets
// (src/models/presets/<family>.json, embedded at build time). families.cpp lists them; adding a
// family = its file, its presets, its tests and one line there (docs/adding-a-family.md).
// Nothing in io/, engine/, server/ or plan/ names a family: io/ gets the checkpoint rules through
// checkpoint_rules() / open_checkpoint().
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/checkpoint.h"
#include "io/family_rules.h"
#include "io/gguf_config.h"
#include "models/model.h"
#include "models/spec.h"
#include "ops/backend.h"

namespace spool::models {

struct Family {
  /// Registry name, stored as ModelSpec::family ("qwen3_moe", "deepseek_v3", ...).
  std::string name;
  /// config.json model_type values of this family (text model_type included).
  std::vector<std::string> model_types;
  /// The chat output formats its checkpoints' templates write (names of the server's registry,
  /// server/chat_format.h: "qwen3_json", "glm4_5", ...), most common first. The server takes the
  /// format it recognises in the template when it is one of these, and the first of them when the
  /// template has no recognisable tool syntax; empty: plain content (no tool calls). A format is
  /// shared by the families that write it, so its parser lives in server/formats/.
  std::vector<std::string> chat_formats;
  /// Fills the family-specific part of `s` from the text config `c`: attention geometry,
  /// mixers and FFN kinds per layer, MoE and routing fields. build_spec has already read the
  /// common fields (vocab_size, hidden_size, num_hidden_layers, rms_norm_eps,
  /// tie_word_embeddings, max_position_embeddings). Throws spool::Error naming the field.
  void (*configure)(const io::Config& c, ModelSpec* s) = nullptr;
  /// Loads a checkpoint of this family (all tensors bound).
  std::unique_ptr<Model> (*load)(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec,
                                 std::shared_ptr<ops::Backend> backend) = nullptr;
  /// Normalised tensor names `spool convert` keeps in bf16 besides the generic rules
  /// (quant/recipe.h); may be null.
  bool (*keep_float)(std::string_view name) = nullptr;
  /// One line for `spool plan`: what its KV and expert figures assume for `s`.
  std::string (*describe)(const ModelSpec& s) = nullptr;
  /// Planner notes about approximations for a config (may be null).
  std::vector<std::string> (*plan_notes)(const io::Config& c) = nullptr;
  /// How its safetensors checkpoints differ from the normalised names: renames, a reader for
  /// layouts only it stores, a natively read quantization_config (io/family_rules.h).
  io::TensorNameRules tensors;
  /// The llama.cpp architectures it loads from GGUF (tensor rows, flags, metadata -> config.json
  /// hook: io/gguf_names.h, io/gguf_config.h); empty if none.
  std::vector<io::GgufArch> gguf;
};

/// Every registered family (families.cpp).
const std::vector<const Family*>& families();
/// The family of a config.json model_type; nullptr if none.
const Family* family_of_model_type(std::string_view model_type);
/// The family registered as `name` (ModelSpec::family); nullptr if none.
const Family* family_named(std::string_view name);
/// The GGUF architecture (general.architecture) a family loads, with its family; nullptr if none.
const io::GgufArch* gguf_arch_named(std::string_view arch, const Family** family = nullptr);

/// The registry's rules for io::Checkpoint (by model_type and by GGUF architecture).
const io::RulesResolver& checkpoint_rules();
/// io::Checkpoint::open with the registry's rules: a checkpoint directory or a .gguf file.
io::Checkpoint open_checkpoint(const std::string& path, io::Checkpoint::Options opt);
/// open_checkpoint with default options (mapped).
io::Checkpoint open_checkpoint(const std::string& path);

// Registered families (one per family file).
const Family& qwen3_5_moe_family();
const Family& qwen3_next_family();
const Family& qwen3_moe_family();
const Family& mixtral_family();
const Family& olmoe_family();
const Family& ernie4_5_moe_family();
const Family& deepseek_v2_family();
const Family& deepseek_v3_family();
const Family& glm4_moe_family();
const Family& glm4_moe_lite_family();
const Family& minimax_m2_family();
const Family& gpt_oss_family();
const Family& gemma4_text_moe_family();

/// Generic description of a GQA attention stack with MoE FFNs (the families' describe default).
std::string describe_gqa_moe(const ModelSpec& s);
/// Description of an MLA stack (DeepSeek-V2/V3, GLM-4.7-Flash): latent KV per token and layer,
/// MoE and dense layer counts, routed and shared experts.
std::string describe_mla_moe(const ModelSpec& s);
/// Family::load of the families without Gated DeltaNet layers: a DecoderModel bound by the
/// default names (DecoderModel::bind).
std::unique_ptr<Model> load_decoder(std::shared_ptr<const io::Checkpoint> ckpt, ModelSpec spec,
                                    std::shared_ptr<ops::Backend> backend);
/// Planner note for configs with nextn multi-token-prediction layers (num_nextn_predict_layers > 0:
/// DeepSeek-V3, GLM-4.5/4.7): spool counts and runs them only with --spec mtp, which drafts with them.
std::vector<std::string> mtp_plan_notes(const io::Config& c);
/// Mixtral's tensor renames (Family::tensors), which MiniMax-M2 shares:
/// block_sparse_moe.experts.{E}.{w1, w3, w2}.weight -> mlp.experts.{E}.{gate, up, down}_proj.weight
/// and block_sparse_moe.gate.weight -> mlp.gate.weight.
std::vector<io::TensorRename> block_sparse_moe_renames();
/// Family::keep_float of the MLA families: the absorbed form reads kv_b_proj per head,
/// transposed, so `spool convert` keeps `self_attn.kv_b_proj.weight` in bf16.
bool mla_keep_float(std::string_view name);

}  // namespace spool::models
