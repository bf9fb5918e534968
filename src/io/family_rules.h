// What a model family tells the checkpoint readers, as data and callbacks defined here so that
// io/ does not depend on models/: the family (src/models/<family>.cpp, models::Family) fills
// these structs and the models layer hands them to io::Checkpoint through a RulesResolver
// (models::checkpoint_rules()). io/ itself names no family.
//  * TensorNameRules: renames of normalised safetensors names ("{L}" / "{E}" placeholders),
//    a reader for stored layouts the generic rules do not cover (e.g. gpt-oss's fused MXFP4
//    experts) and the quantization_config method the family reads natively.
//  * GgufArch: a llama.cpp architecture (general.architecture): its tensor-name rows, per-arch
//    flags and the hook that writes the family's part of config.json from the metadata
//    (io/gguf_config.h: GgufMeta).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/gguf_names.h"

namespace spool::io {

struct TensorRef;

/// A rename of a normalised tensor name. `from` and `to` are dot-separated patterns in which the
/// segments "{L}" and "{E}" stand for a decimal index (no leading zeros, < 2^24) carried over.
struct TensorRename {
  std::string from;  ///< e.g. "layers.{L}.block_sparse_moe.experts.{E}.w1.weight"
  std::string to;    ///< e.g. "layers.{L}.mlp.experts.{E}.gate_proj.weight"
  /// Drops a leading dimension of 1 ([1, N] -> [N], ERNIE-4.5's moe_statics bias).
  bool squeeze_leading_one = false;
};

/// Applies the first rule of `rules` whose `from` matches `name`: the renamed name, or "" when no
/// rule matches. *squeeze is set to the matching rule's squeeze_leading_one (false if none).
std::string apply_renames(const std::vector<TensorRename>& rules, std::string_view name, bool* squeeze);

/// Where a family's tensor reader puts the tensors it makes of one stored tensor
/// (implemented by io::Checkpoint).
class TensorSink {
 public:
  virtual ~TensorSink() = default;
  /// Adds `t` (name normalised; expert_layer / expert_id / expert_proj / expert_part set for a
  /// routed expert). Throws spool::Error for a duplicate name.
  virtual void add(TensorRef t) = 0;
  /// Adds `t` (shape [out, in]) whose bytes are the float matrix [in, out] at `src`
  /// (elements of t.dtype): the checkpoint writes it transposed into an in-memory shard once
  /// every tensor is read. `src` must stay valid until then (a mapped shard).
  virtual void add_transposed(TensorRef t, const uint8_t* src, int64_t in, int64_t out) = 0;
  /// Records that the routed experts came from fused [E, ...] tensors (ExpertLayout::kFused).
  virtual void set_fused_experts() = 0;
};

/// A family's reader for stored tensors that the generic rules do not cover.
struct TensorReader {
  /// How many tensors read() makes of a stored tensor of normalised name `name` and shape
  /// `shape`; 0 when the reader does not take it (a reservation hint: no errors).
  size_t (*count)(std::string_view name, const std::vector<int64_t>& shape) = nullptr;
  /// Reads `t` (normalised name, shape, dtype, bytes of one stored tensor; `file` and `original`
  /// name it in errors) into `sink` and returns true, or returns false for a tensor it does not
  /// take. Throws spool::Error for a malformed tensor.
  bool (*read)(const TensorRef& t, const std::string& file, const std::string& original, TensorSink& sink) = nullptr;
};

/// How a family's safetensors checkpoints differ from the normalised names (io/checkpoint.h).
struct TensorNameRules {
  /// Renames applied after the generic prefix normalisation, before expert parsing.
  std::vector<TensorRename> renames;
  /// Stored layouts read by the family (tried before the generic expert rules).
  TensorReader reader;
  /// config.json quantization_config.quant_method the family's checkpoints carry and spool reads
  /// natively (gpt-oss: "mxfp4"); empty: a quantization_config is an error.
  std::string native_quant_method;
};

/// How io finds a family's rules; filled by the models layer (models::checkpoint_rules()).
/// Any member may be null (no family rules: generic names only, no GGUF architecture).
struct RulesResolver {
  /// Rules for a config.json model_type (text model_type, else top-level); nullptr if none.
  const TensorNameRules* (*by_model_type)(std::string_view model_type) = nullptr;
  /// The GGUF architecture named `arch`; nullptr if no family loads it.
  const GgufArch* (*by_gguf_arch)(std::string_view arch) = nullptr;
  /// Comma-separated supported architecture names (for errors).
  std::string (*gguf_arch_list)() = nullptr;
};

}  // namespace spool::io
