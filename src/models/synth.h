// Synthetic checkpoints: a Hugging Face-layout checkpoint with a preset's exact shapes and
// random weights, for scale tests and benchmarks (spool synth). Weights are scaled so the
// residual stream stays O(1): projections ~ N(0, 1/fan_in), output projections further
// divided by sqrt(2 * layers), embeddings ~ N(0, 1), norms at their identity value.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "models/presets.h"

namespace spool::models {

struct SynthOptions {
  std::string preset;
  int layers = 0;             // 0 = the preset's depth
  std::string out_dir;
  std::string dtype = "bf16";  // bf16 | f16 | f32
  std::string layout;          // "" = the preset's; "fused" | "per-expert"
  uint64_t seed = 42;
  uint64_t shard_bytes = 4ull << 30;
  std::string tokenizer_dir;   // tokenizer files copied from here ("" = none)
  bool force = false;          // allow writing into a non-empty directory
  /// Also write a random multi-token-prediction head (one layer; config mtp_num_hidden_layers or
  /// num_nextn_predict_layers = 1): Qwen3.5 / Qwen3-Next mtp.* tensors, DeepSeek-V3 / GLM-4.5
  /// nextn tensors under layers.{num_hidden_layers}. Its drafts are random (acceptance near 0).
  /// UsageError for other families, or a depth without an attention layer for the head to copy.
  bool mtp = false;
};

struct SynthResult {
  uint64_t bytes = 0;          // tensor bytes written
  int shards = 0;
  int64_t tensors = 0;
  std::string model_type;
};

/// Writes the checkpoint. progress(done_bytes, total_bytes) is called as data is written.
/// Throws spool::Error if the directory is not empty (without force), the disk is too small
/// (with the size needed and the free space), or a write fails.
SynthResult write_synthetic(const SynthOptions& opt, const std::function<void(uint64_t, uint64_t)>& progress);

/// A synthetic checkpoint as headers only: what write_synthetic(opt) would write, without the
/// weights (for `spool plan --preset`). out_dir, seed, shard size and tokenizer are not used.
struct SynthHeaders {
  nlohmann::ordered_json config;   ///< config.json as write_synthetic writes it (depth and dtype applied)
  std::string safetensors_header;  ///< JSON header of one safetensors file holding every tensor, in order
  uint64_t bytes = 0;              ///< tensor bytes (the data region of that file)
};
/// Throws spool::UsageError for an unknown preset, dtype, layout or depth, like write_synthetic.
SynthHeaders synthetic_headers(const SynthOptions& opt);

}  // namespace spool::models
