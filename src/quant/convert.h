// spool convert: a Hugging Face checkpoint (F32/F16/BF16 safetensors) -> spool's quantized
// format (docs/quant-format.md), data-free, in bounded memory.
//
// Every 2-D projection is quantized according to its class in the recipe (quant/recipe.h);
// every other tensor is kept in bf16 under its own name. Routed experts are written per expert
// (gate, up, down, each as qweight/scales/codebook) back to back, so one expert is one
// contiguous byte range; their sign vectors are shared per layer projection. Shards hold whole
// layers. The source is read through its mmap one tensor at a time and released after use, so
// a checkpoint larger than RAM converts with memory bounded by the largest tensor's output.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "io/family_rules.h"
#include "quant/allocate.h"
#include "quant/fit.h"
#include "quant/recipe.h"

namespace spool::quant {

/// What to convert and how.
struct ConvertOptions {
  std::string in_dir;               ///< HF checkpoint directory
  std::string out_dir;              ///< created; must be absent or empty unless `force`
  Recipe recipe;                    ///< per-class quantization (recipe() + apply_overrides())
  bool rotate = true;               ///< --rotation hadamard (true) | none
  uint64_t rotation_seed = 42;      ///< --rotation-seed
  /// --scale-search / --codebook: how group scales and codebooks are chosen (quant/fit.h). The
  /// default minimizes each matrix's squared error; QuantOptions::legacy() writes the files of
  /// the format's original rules (RMS scales, N(0, 1) codebooks) bit for bit.
  QuantOptions quant;
  /// --target-bpw: > 0 replaces the recipe's classes by a per-matrix allocation for this many bits
  /// per weight (quant/allocate.h) with alloc_weights as the sensitivities.
  double target_bpw = 0;
  AllocWeights alloc_weights = AllocWeights::defaults();
  double expert_usage = 1.0;  ///< top_k / n_experts of the model (AllocOptions::expert_usage)
  /// --calibration: per MoE layer, the experts' shares (AllocOptions::expert_shares); may be null.
  const std::map<int, std::vector<double>>* expert_shares = nullptr;
  /// Recorded as quantization.calibration in config.json when set (e.g. "dev.txt, 16384 tokens").
  std::string calibration_note;
  int threads = 0;                  ///< worker threads (0 = all cores)
  uint64_t shard_bytes = 4ull << 30;  ///< start a new shard past this many bytes (whole layers)
  bool force = false;               ///< write into a non-empty directory (removes its old shards)
  /// Normalised names the model family keeps in bf16 besides the recipe's kept class
  /// (models::Family::keep_float; may be null).
  bool (*keep_float)(std::string_view name) = nullptr;
  /// The family rules to open `in_dir` with (models::checkpoint_rules(); required: without them
  /// a family's renamed or natively quantized tensors would be misread).
  const io::RulesResolver* rules = nullptr;
};

/// Parameters and bytes of one tensor class in the output.
struct ClassStats {
  int64_t tensors = 0;  ///< source matrices (one per expert projection)
  int64_t params = 0;   ///< weights (elements of the source tensors)
  uint64_t bytes = 0;   ///< bytes written for them (codes + scales + codebooks + signs, or bf16)
  std::set<int> groups; ///< group sizes used (the requested one, or smaller for narrow matrices)
  /// Bits per weight of the class (0 when empty).
  double bpw() const { return params > 0 ? 8.0 * static_cast<double>(bytes) / static_cast<double>(params) : 0.0; }
};

/// Summary of a conversion.
struct ConvertResult {
  std::map<std::string, ClassStats> classes;  ///< "dense", "lm_head", "expert_gate_up", "expert_down", "kept"
  int64_t params = 0;        ///< all weights written
  uint64_t data_bytes = 0;   ///< tensor bytes written (headers excluded; no padding tensors are written)
  uint64_t file_bytes = 0;   ///< sum of the shard file sizes
  uint64_t source_bytes = 0; ///< tensor bytes read from the source
  int shards = 0;
  int64_t tensors = 0;       ///< tensors written
  /// The --target-bpw allocation (slots, measured errors, choices); empty otherwise.
  Allocation allocation;
  /// Bits per weight over everything written (headers excluded).
  double bpw() const { return params > 0 ? 8.0 * static_cast<double>(data_bytes) / static_cast<double>(params) : 0.0; }
};

/// Converts opt.in_dir into opt.out_dir: shards, model.safetensors.index.json (when sharded),
/// config.json with a `quantization` block, and every other non-weight file copied.
/// progress(done, total) counts source bytes. Throws spool::Error for an unreadable or
/// already-quantized source, a non-finite weight, an output directory that is not empty, or
/// an I/O error (the shard being written is never left half-written under its final name).
ConvertResult convert(const ConvertOptions& opt, const std::function<void(uint64_t, uint64_t)>& progress);

}  // namespace spool::quant
