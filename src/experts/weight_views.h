// Building WeightViews from checkpoint tensors, float or quantized (docs/quant-format.md),
// with every shape checked: one place for the dense binders (models/bind.h) and both expert
// providers.
#pragma once

#include <string>

#include "experts/provider.h"
#include "io/checkpoint.h"
#include "ops/weights.h"

namespace spool::experts {

/// A float tensor as a WeightView [shape[0], prod(rest)] (no copy). Throws for non-float
/// dtypes or a checkpoint opened without data.
ops::WeightView view_of(const io::TensorRef& t);

/// The quantized matrix [rows, cols] made of `qweight` U8 [rows, row_bytes], `scales` F16
/// [rows, G], `codebook` F32 [levels] and optional `signs` I8 [cols]: type from the codebook
/// length, group = cols / G. A null `codebook` is q8 with its fixed grid (ops::q8_grid()); the
/// codes must then be one byte each (else: "missing codebook"). Data pointers are those of the tensors (nullptr-safe: a
/// header-only checkpoint gives a view for shape checks only). With `check_data`, the
/// codebook (finite, ascending) and signs (+-1) are read and checked too. Throws spool::Error
/// naming `what` for any inconsistency.
ops::WeightView quant_view_of(const io::TensorRef& qweight, const io::TensorRef& scales, const io::TensorRef* codebook,
                              const io::TensorRef* signs, int64_t rows, int64_t cols, const std::string& what,
                              bool check_data = true);

/// The sign vector `name` of a quantized matrix, enforcing the quantization block: required
/// when it says rotation "hadamard" (nullptr never returned then), absent for "none". Throws
/// spool::Error when the checkpoint has quantized tensors but no block, or the rule is broken.
const io::TensorRef* signs_of(const io::Checkpoint& ck, const std::string& name);

/// True if the `levels` codebook entries are finite and strictly ascending (a corrupt file
/// must be rejected before it reaches the kernels).
bool codebook_ok(const float* cb, int levels);

/// The weight `{base}.weight` [rows, cols], or its quantized form `{base}.qweight/.scales/
/// .codebook` (+ `{base}.signs`; no `.codebook` for q8). Throws naming the tensor when missing or mis-shaped.
ops::WeightView bind_weight(const io::Checkpoint& ck, const std::string& base, int64_t rows, int64_t cols);

/// Views of expert `e` of `layer` (gate/up [inter, hidden], down [hidden, inter]), float or
/// quantized (signs: layers.{L}.mlp.experts.{gate_up,down}.signs), pointing into the mapping.
/// gpt-oss (no up projection in the checkpoint): gate is the fused gate_up [2 * inter, hidden]
/// with interleaved rows and up is empty; its matrices may be MXFP4 (WType::kMxfp4).
/// `check_data` = false checks shapes from the headers only, touching none of the expert's bytes
/// (the streaming provider checks them after reading).
ExpertWeights expert_views(const io::Checkpoint& ck, int layer, int expert, int hidden, int inter, bool check_data = true);


}  // namespace spool::experts
