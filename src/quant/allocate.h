// Bit allocation for a target size (`spool convert --target-bpw`): every quantizable matrix (or
// every routed-expert projection of a layer, which share one format) gets the format, from bf16
// down to ternary, that minimizes the estimated loss of the whole model within the byte budget.
//
// The estimate follows the linearity view of quantization error (D. Malinovskii et al., "Pushing
// the Limits of Large Language Model Quantization via the Linearity Theorem", NAACL 2025 —
// HIGGS): for small errors the loss increase is close to a weighted sum over matrices,
//     loss(quantized) - loss(float) ~ sum_s alpha_s * t_s,
// t_s = ||W_s - Q(W_s)||^2 / ||W_s||^2 the relative squared error of slot s. t_s is measured, per
// candidate format, by quantizing a deterministic sample of the slot's rows exactly as convert
// will (same rotation, fitted codebook and scale search); alpha_s is the slot's sensitivity.
// Data-free, alpha_s is a constant of its class (AllocWeights: fitted once on the trained
// models' quality tables, docs/quantization.md); with a calibration text it is measured per slot.
// The budget is then spent greedily on the lower convex hull of each slot's (bytes, alpha * t)
// points — the Lagrangian solution of the knapsack, exact up to the last step.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "ops/thread_pool.h"
#include "ops/weights.h"
#include "quant/fit.h"
#include "quant/recipe.h"

namespace spool::quant {

/// The data-free sensitivity proxy: slot s's alpha is its share of the weights a token reads,
///     alpha_s = kTotal * c_class(s) * u_s * params_s / sum_s' (c_class(s') * u_s' * params_s'),
/// u = top_k / n_experts for routed experts and 1 otherwise, c_class these per-class factors and
/// kTotal = total_loss (the estimated loss, in nats of KL, when every slot has relative error 1).
struct AllocWeights {
  double dense = 0.64;    ///< attention / DeltaNet / shared-expert / dense-MLP matrices
  double gate_up = 0.35;  ///< routed experts' gate and up projections
  double down = 0.50;     ///< routed experts' down projections
  double lm_head = 0.79;  ///< the output projection
  double embed = 0.79;    ///< the token embedding table
  double total_loss = 7.0;  ///< kTotal above
  /// The defaults of `spool convert --target-bpw` (see the .cpp for where they come from).
  static AllocWeights defaults();
  /// The factor c of class c (kKeep: 0).
  double of(TensorClass c) const;
};

/// One unit of allocation and what each candidate format would cost and lose.
struct AllocSlot {
  std::string key;        ///< normalised tensor name, or "layers.L.mlp.experts.gate_up" / ".down"
  TensorClass cls = TensorClass::kDense;
  int64_t params = 0;     ///< weights in the slot
  double weight = 0;      ///< alpha: estimated loss per unit relative squared error
  std::vector<ClassSpec> candidates;  ///< formats considered (bf16 = keep), cheapest first
  std::vector<uint64_t> bytes;        ///< bytes each candidate writes (codes, scales, codebooks; bf16 data)
  std::vector<double> rel_err;        ///< measured relative squared error of each candidate
  int chosen = -1;                    ///< index into candidates after allocate()
};

/// What to allocate for.
struct AllocOptions {
  double target_bpw = 0;            ///< bits per weight over every tensor written (signs, kept tensors included)
  bool rotate = true;               ///< as ConvertOptions::rotate
  uint64_t rotation_seed = 42;      ///< as ConvertOptions::rotation_seed
  QuantOptions quant;               ///< as ConvertOptions::quant (the errors are measured with it)
  AllocWeights weights = AllocWeights::defaults();
  double expert_usage = 1.0;        ///< top_k / n_experts: the share of a layer's experts a token reads
  /// --calibration: per MoE layer, each expert's share of the layer's sensitivity (n_experts values
  /// summing to 1, from the routing of a calibration text: mean squared gate weight). When given
  /// for a layer, its experts are allocated one by one ("layers.L.mlp.experts.E.gate_up" /
  /// ".down" keys, quantized formats only) instead of as one slot, the layer's alpha split by
  /// these shares; the relative errors measured for the layer serve each of its experts.
  const std::map<int, std::vector<double>>* expert_shares = nullptr;
  bool (*keep_float)(std::string_view name) = nullptr;  ///< as ConvertOptions::keep_float
};

/// The result: a format per slot and the totals.
struct Allocation {
  std::vector<AllocSlot> slots;       ///< every slot with its measurements and choice
  std::map<std::string, ClassSpec> specs;  ///< key -> chosen format (Recipe::tensor_specs)
  uint64_t fixed_bytes = 0;           ///< bytes outside the slots (kept tensors, sign vectors)
  uint64_t bytes = 0;                 ///< fixed_bytes + the chosen candidates' bytes
  int64_t params = 0;                 ///< every weight written
  double estimated_loss = 0;          ///< sum of weight * rel_err over the slots
  /// bits per weight of the allocation.
  double bpw() const { return params > 0 ? 8.0 * static_cast<double>(bytes) / static_cast<double>(params) : 0.0; }
};

/// The weight type of a float source tensor (F32/F16/BF16); throws spool::Error for any other dtype.
ops::WType source_wtype(const io::TensorRef& t);

/// The formats a matrix with `cols` input columns may take: ternary (group 64), 2-4 bits at groups
/// 128, 64 and 32, 5, 6 and 8 bits at groups 64 and 32, and bf16 (keep); a group that does not divide cols is
/// narrowed (effective_group) and duplicates dropped.
std::vector<ClassSpec> alloc_candidates(int64_t cols);

/// Key of one expert's projections in an allocation: "layers.L.mlp.experts.E.gate_up" or ".down".
std::string expert_slot_key(int layer, int expert, bool down);

/// Bytes one [rows, cols] matrix takes in format s: codes + fp16 scales + codebook (when q
/// stores one: QuantOptions::stores_codebook), or bf16.
uint64_t matrix_bytes(const ClassSpec& s, int64_t rows, int64_t cols, const QuantOptions& q);

/// Relative squared error ||W - Q(W)||^2 / ||W||^2 of quantizing the rows `sample` ([n, cols],
/// original basis, f32) in format s with rotation `signs` (nullptr: none) and options q: the
/// codebook fitted on the sample when q says so, then every group coded as convert does. bf16:
/// the rounding error. 0 for an all-zero sample.
double sample_error(const std::vector<float>& sample, int64_t cols, const ClassSpec& s, const int8_t* signs,
                    const QuantOptions& q);

/// Chooses the cheapest-loss candidate of every slot within `budget_bytes` (greedy on the convex
/// hulls, see the file comment); sets AllocSlot::chosen and returns the slots' total bytes.
/// Throws spool::Error when even the cheapest candidates exceed the budget.
uint64_t choose(std::vector<AllocSlot>* slots, uint64_t budget_bytes);

/// Measures every slot of checkpoint `ck` (float weights) and allocates for o.target_bpw.
/// Throws spool::UsageError for a target outside (0, 16.5], spool::Error when the target is
/// below what the smallest formats reach (the message gives that minimum).
Allocation allocate(const io::Checkpoint& ck, const AllocOptions& o, ops::ThreadPool* pool);

}  // namespace spool::quant
