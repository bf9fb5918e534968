// A Hugging Face checkpoint directory: config.json (+ text_config), generation_config.json,
// one or more safetensors shards (model.safetensors or model.safetensors.index.json), with
// tensor names normalised and routed experts exposed one (layer, expert, projection) at a time.
//
// Name normalisation: the text-model prefixes "model.language_model.", "language_model.model.",
// "model." are stripped ("lm_head.weight" stays); "model.visual.*", "visual.*" and "mtp.*" are
// dropped; then the family's renames apply (io::TensorNameRules, found through the
// RulesResolver the caller passes: models::checkpoint_rules()). Routed experts always appear as
//   layers.{L}.mlp.experts.{e}.{gate_proj,up_proj,down_proj}.weight   [out, in]
// whatever the file layout: per-expert tensors keep their names; the fused layout
// (experts.gate_up_proj [E, 2I, H] with gate rows first, experts.down_proj [E, H, I]) is split
// into per-expert byte ranges of the same file (no copy); a family's TensorReader takes the
// layouts only it stores (gpt-oss's interleaved gate_up, MXFP4 blocks, [E, in, out] floats
// transposed into an in-memory shard: models/gpt_oss.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/ggml_types.h"
#include "io/config.h"
#include "io/family_rules.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "io/tensor_names.h"

namespace spool::io {


/// One logical tensor of the checkpoint: a contiguous byte range of one shard.
struct TensorRef {
  std::string name;  // normalised name
  int shard = -1;    // index into Checkpoint::shards()
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // absolute file offset
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // inside the shard's mmap (nullptr when opened header-only)
  // Routed-expert identity (expert_layer < 0 for non-expert tensors).
  int expert_layer = -1;
  int expert_id = -1;
  ExpertProj expert_proj = ExpertProj::kGate;
  ExpertPart expert_part = ExpertPart::kWeight;
  // GGUF tensors in a ggml block type (not F32/F16/BF16): `dtype` is U8, `shape` is the logical
  // HF shape in elements, the bytes are ggml blocks along the last dimension.
  bool ggml = false;
  GgmlType ggml_type = GgmlType::F32;
  /// Optional input-column permutation [shape.back()] of a ggml matrix (ops::WeightView::col_perm):
  /// a converter's column reordering kept in the file. Owned by the Checkpoint.
  const int32_t* col_perm = nullptr;
  int64_t numel() const;
  /// Shape as "[a, b]".
  std::string shape_str() const;
};

/// Layout in which a checkpoint stores routed experts.
enum class ExpertLayout { kNone, kPerExpert, kFused };

/// An opened checkpoint. Movable, not copyable. Keeps shards mmap'd for its lifetime.
class Checkpoint {
 public:
  struct Options {
    bool map = true;  // mmap shards (false: headers only, e.g. for planning)
    /// Keep the multi-token-prediction head (Qwen3.5 / Qwen3-Next `mtp.*`) instead of dropping
    /// it: `mtp.layers.{k}.X` becomes `layers.{num_hidden_layers + k}.X` (the DeepSeek-V3
    /// nextn numbering, so its routed experts are indexed like any layer's) and the head's own
    /// tensors keep their names (`mtp.fc.weight`, `mtp.norm.weight`, ...). A nextn layer's copy
    /// of the embedding table (`layers.{n}.embed_tokens.weight`, DeepSeek-V3) is dropped: the
    /// head reads `embed_tokens.weight`. GGUF files (open_gguf):
    /// the last nextn_predict_layers blocks, their `blk.N.nextn.*` head under the same HF names
    /// (io::map_gguf_tensor).
    bool mtp = false;
  };
  /// Opens `dir`, or a GGUF file (a path ending in .gguf, single or one shard of a split set:
  /// see open_gguf), with the family rules `rules` finds for its model_type or architecture.
  /// Throws spool::Error for: missing config.json, malformed JSON, missing shard, invalid
  /// safetensors header, a tensor dtype other than F32/F16/BF16, duplicate names.
  static Checkpoint open(const std::string& dir, const RulesResolver& rules, Options opt);
  static Checkpoint open(const std::string& dir, const RulesResolver& rules) { return open(dir, rules, Options{}); }
  /// Opens a GGUF file (io/gguf.h) of an architecture `rules` knows (io::GgufArch) as a
  /// checkpoint with HF names: config from the `{arch}.*` metadata, llama.cpp's converter
  /// transforms undone (norms stored as 1 + w, A = -exp(A_log), Qwen3.5's tiled V heads; small
  /// converted tensors live in an anonymous in-memory shard), merged expert tensors exposed as
  /// per-expert byte ranges of the file, block-quantized matrices (the token embedding included:
  /// it is read and dequantized by row) kept in their ggml type; a split_gate_up arch's
  /// ffn_gate_exps / ffn_up_exps (gpt-oss: split out of the interleaved gate_up by llama.cpp's converter) re-interleaved
  /// by whole rows per expert into the in-memory shard (block types kept). The multi-token-
  /// prediction blocks (the last {arch}.nextn_predict_layers) are dropped, or kept with
  /// Options::mtp; mtp_bytes() counts them either way. Throws spool::Error
  /// naming the file and the tensor for unknown architectures, tensors or types and bad shapes.
  static Checkpoint open_gguf(const std::string& path, const RulesResolver& rules, Options opt);
  /// A GGUF file or split set whose headers were read elsewhere (GgufFile::from_headers, e.g.
  /// over HTTP Range by the planner) as a header-only checkpoint: the names, shapes, sizes and
  /// errors of open_gguf; nothing is mapped or readable.
  static Checkpoint from_gguf(std::shared_ptr<GgufFile> g, const RulesResolver& rules);
  /// Builds a checkpoint from parts already read elsewhere (e.g. headers fetched over HTTP by
  /// the planner): config.json, generation_config.json (nullptr when absent) and the shards'
  /// parsed headers (SafetensorsFile::parse_header; nothing mapped). `label` stands for the
  /// directory in errors. Same validation and name handling as open().
  static Checkpoint from_parts(const std::string& label, const Config& raw_config, const Config* generation_config,
                               std::vector<SafetensorsFile> shards, const RulesResolver& rules);

  const std::string& dir() const { return dir_; }
  /// The text model's config: `text_config` merged over the top level when present.
  const Config& config() const { return config_; }
  /// config.json as written.
  const Config& raw_config() const { return raw_config_; }
  /// Text model_type (e.g. "qwen3_5_moe_text"), else the top-level model_type.
  const std::string& model_type() const { return model_type_; }
  /// Top-level model_type (e.g. "qwen3_5_moe" for a multimodal checkpoint).
  const std::string& top_model_type() const { return top_model_type_; }
  /// generation_config.json (empty defaults when absent).
  const GenerationDefaults& generation() const { return generation_; }

  /// The open shards: path, fd, mapping, sizes, metadata. Their own tensor tables are
  /// dropped once indexed (SafetensorsFile::drop_tensor_table): tensors() is the one table.
  const std::vector<SafetensorsFile>& shards() const { return shards_; }
  const std::vector<TensorRef>& tensors() const { return tensors_; }
  /// Finds a tensor by normalised name; nullptr if absent.
  const TensorRef* find(std::string_view name) const;
  /// Finds a tensor or throws spool::Error "<dir>: missing tensor '<name>'".
  const TensorRef& tensor(std::string_view name) const;
  /// Routed expert tensor: the float weight, or the packed codes of a quantized expert;
  /// throws if absent.
  const TensorRef& expert(int layer, int expert, ExpertProj proj) const;
  /// True if the expert's projection is present (float or quantized).
  bool has_expert(int layer, int expert, ExpertProj proj) const;
  /// One part of an expert projection; nullptr if absent.
  const TensorRef* expert_part(int layer, int expert, ExpertProj proj, ExpertPart part) const;
  /// Every tensor of one expert (all projections and parts).
  std::vector<const TensorRef*> expert_tensors(int layer, int expert) const;
  /// True if the routed experts are stored quantized.
  bool experts_quantized() const { return experts_quantized_; }
  /// For a spool-quantized checkpoint (config.json has a `quantization` block): true when it
  /// says rotation "hadamard" (every quantized matrix then needs its sign vector), false for
  /// "none" (no sign vectors allowed). nullopt for checkpoints without the block.
  std::optional<bool> quant_rotated() const { return quant_rotated_; }
  ExpertLayout expert_layout() const { return expert_layout_; }
  /// The GGUF file (headers and metadata) when opened from one; nullptr otherwise.
  const GgufFile* gguf() const { return gguf_.get(); }
  /// A stored tensor name as this checkpoint names it: normalize_tensor_name, then the family's
  /// renames (TensorNameRules::renames); "" for a dropped tensor. `squeeze` (optional) is set
  /// when the matching rename drops a leading dimension of 1.
  std::string normalized_name(std::string_view stored, bool* squeeze = nullptr) const;
  /// Number of tensors dropped by name (vision tower, MTP head).
  int dropped_tensors() const { return dropped_; }
  /// Bytes of the multi-token-prediction head's tensors (`mtp.*`, and layers numbered from
  /// num_hidden_layers on: DeepSeek-V3 nextn), kept (Options::mtp) or dropped.
  uint64_t mtp_bytes() const { return mtp_bytes_; }
  /// Multi-token-prediction layers kept (Options::mtp): layers num_hidden_layers .. + n - 1.
  int mtp_layers() const { return mtp_layers_; }
  /// Total bytes of kept tensors, and of routed experts among them.
  uint64_t total_bytes() const;
  /// Sum of the shard file sizes (headers included).
  uint64_t file_bytes() const;
  uint64_t expert_bytes() const;
  /// Heap bytes of this object's tensor tables, which a loaded model holds for its lifetime:
  /// the TensorRef array (capacity), each name's and shape's own heap block, the nodes and
  /// buckets of the name and expert indexes, and the column permutations; each block counted
  /// as glibc malloc hands it out (8-byte header, 16-byte rounding, 32 at least). The same
  /// with or without mapped shards, so `spool plan` (headers only) counts what a run holds.
  /// Not counted: config JSON, the shards' metadata, a GGUF file's own tables.
  uint64_t table_bytes() const;

 private:
  class Sink;  // the TensorSink a family's TensorReader fills (checkpoint.cpp)
  // Indexes the tensors of `shards` (names normalised, `rules` applied, experts resolved);
  // takes ownership. `rules` may be null (generic names only).
  void index_shards(std::vector<SafetensorsFile> shards, const TensorNameRules* rules);
  // open_gguf / from_gguf: `local` shards are opened (and mapped when `map`), remote ones are
  // header-only stand-ins; `keep_mtp`: Options::mtp.
  static Checkpoint gguf_checkpoint(std::shared_ptr<GgufFile> file, const std::string& path, const RulesResolver& rules, bool map,
                                    bool local, bool keep_mtp);
  void add(TensorRef t);
  void add_fused(const TensorRef& t, const ExpertName& n, const std::string& file, const std::string& original);
  // A float matrix [in, out] at src, to be written transposed ([out, in]) for tensors_[index]
  // (TensorSink::add_transposed); elem = bytes per element.
  struct Transposed {
    size_t index;
    const uint8_t* src;
    int64_t in, out;
    uint64_t elem;
  };
  void write_transposed(const std::vector<Transposed>& items);
  std::string dir_;
  Config config_, raw_config_;
  std::string model_type_, top_model_type_;
  GenerationDefaults generation_;
  std::vector<SafetensorsFile> shards_;
  std::vector<TensorRef> tensors_;
  // Name -> position in tensors_; the keys view the TensorRef names (rebuilt when tensors_
  // reallocates, see add()).
  std::unordered_map<std::string_view, size_t> index_;
  std::unordered_map<uint64_t, size_t> expert_index_;
  ExpertLayout expert_layout_ = ExpertLayout::kNone;
  bool experts_quantized_ = false;
  std::optional<bool> quant_rotated_;
  int dropped_ = 0;
  int n_main_layers_ = 0;    // config num_hidden_layers: `mtp.layers.0` becomes this layer (0: unknown)
  bool keep_mtp_ = false;    // Options::mtp
  uint64_t mtp_bytes_ = 0;   // bytes of the MTP tensors seen
  int mtp_layers_ = 0;       // MTP layers kept
  // Whether a stored name is a multi-token-prediction tensor (mtp.*, or a layer >= n_main_layers_).
  bool is_mtp_tensor(std::string_view stored) const;
  std::shared_ptr<GgufFile> gguf_;
  const TensorNameRules* name_rules_ = nullptr;  // the family's (static storage), or null
  std::vector<std::vector<int32_t>> perms_;  // storage of TensorRef::col_perm
};

/// The text model's config of a config.json: `text_config` merged over the top level
/// (text_config wins) when present, else the whole object. `label` names the source.
Config text_config_of(const Config& raw, const std::string& label);

/// Normalises a checkpoint tensor name (see file comment). Returns "" for dropped tensors.
std::string normalize_tensor_name(std::string_view name);

}  // namespace spool::io
