// The Hugging Face config.json a GGUF file's metadata stands for (the GGUF notes (ggml
// docs/gguf.md) section 2.3; llama.cpp's convert_hf_to_gguf.py for the keys each architecture
// writes). The generic fields are read here; each architecture's own part (MoE fields, rope
// scaling, layer kinds) is its family's GgufArch::config hook (src/models/<family>.cpp), which
// reads the metadata through GgufMeta. The family's config reader then reads the result as it
// reads a safetensors checkpoint's config.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/gguf.h"
#include "io/gguf_names.h"

namespace spool::io {

/// Typed reads of a GGUF file's "{arch}.KEY" metadata and tensor list, with errors naming the
/// file and key (spool::Error).
class GgufMeta {
 public:
  /// `g`'s metadata under "{arch.name}."; `layers` = block_count - nextn_predict_layers.
  GgufMeta(const GgufFile& g, const GgufArch& arch, int64_t layers, int64_t nextn);

  const GgufFile& file() const { return g_; }
  const GgufArch& arch() const { return arch_; }
  /// "{arch}." (the key prefix).
  const std::string& prefix() const { return p_; }
  /// The file's path (for errors).
  const std::string& label() const { return label_; }
  /// Main-stack layers (block_count minus the MTP blocks).
  int64_t layers() const { return layers_; }
  /// nextn_predict_layers (MTP blocks after the main stack; 0 when absent).
  int64_t nextn() const { return nextn_; }
  /// Layers without a router (blk.N.ffn_gate_inp.weight), ascending.
  const std::vector<int64_t>& dense_layers() const { return dense_; }

  /// An integer key that must be present.
  int64_t need(const std::string& k) const;
  std::optional<int64_t> opt(const std::string& k) const;
  std::optional<double> optf(const std::string& k) const;
  std::optional<bool> optb(const std::string& k) const;
  /// A scalar or a per-layer array whose entries are all equal.
  int64_t first_int(const std::string& k) const;
  /// True if tensor "blk.{layer}.{suffix}" exists.
  bool has_tensor(int64_t layer, const char* suffix) const;
  /// Width of one routed expert: {arch}.expert_feed_forward_length, else the rows of the first
  /// merged expert tensor (llama and olmoe files need not carry the key).
  int64_t expert_ff() const;
  /// Checks {arch}.expert_gating_func (llama.cpp: 1 softmax, 2 sigmoid) when present.
  void require_gating(int64_t want, const char* what) const;
  /// Fails unless every layer has a router (`family` names the model in the error).
  void require_all_moe(const char* family) const;
  /// A per-layer flag array (bool or integer entries, at least layers() of them) or nullopt
  /// when the key is absent or a scalar.
  std::optional<std::vector<int64_t>> layer_flags(const std::string& k) const;
  /// DeepSeek-style MoE fields (glm4moe, deepseek2): routed and shared experts, the first
  /// leading_dense_block_count layers dense (checked against the routers present), the
  /// routed-weight scale and renormalisation (llama.cpp's defaults when absent: 1, false).
  void deepseek_style_moe(nlohmann::json& j) const;
  /// Qwen-style MoE fields (qwen3moe, qwen3next, qwen35moe): num_experts, num_experts_per_tok,
  /// moe_intermediate_size (expert_feed_forward_length), norm_topk_prob true (llama.cpp's graphs
  /// renormalise the top-k weights), mlp_only_layers = the layers without a router,
  /// decoder_sparse_step 1.
  void qwen_style_moe(nlohmann::json& j) const;

 private:
  const GgufFile& g_;
  const GgufArch& arch_;
  std::string p_, label_;
  int64_t layers_, nextn_;
  std::vector<int64_t> dense_;
};

/// The config.json fields `a`'s family reads, from `g`'s `{arch}.*` metadata, tokenizer ids and
/// tensor list: the generic fields here (sizes, heads, head_dim, rms eps, context, rope theta and
/// partial rotary factor, tied embeddings from a missing output.weight, vocab_size from
/// token_embd, eos/bos, the hybrid archs' ssm.* keys and layer_types), then `a.config` (MoE,
/// rope scaling, what the arch cannot represent). Throws spool::Error naming the file and key for
/// a missing or inconsistent key or a rope scaling spool does not run.
nlohmann::json gguf_config_json(const GgufFile& g, const GgufArch& a);

}  // namespace spool::io
