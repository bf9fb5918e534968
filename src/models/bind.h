// Helpers that bind checkpoint tensors to model weights with shape checks; every error
// names the checkpoint directory, the tensor and both shapes.
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "ops/weights.h"

namespace spool::models {

/// A matrix [rows, cols] viewed in place (no copy). Throws if missing or mis-shaped.
ops::WeightView bind_matrix(const io::Checkpoint& ck, const std::string& name, int64_t rows, int64_t cols);

/// A tensor of exactly `numel` elements with the given shape, converted to f32.
std::vector<float> bind_f32(const io::Checkpoint& ck, const std::string& name, const std::vector<int64_t>& shape);

/// An RMSNorm weight [n] as the effective f32 multiplier: 1 + w when `one_plus`, else w.
std::vector<float> bind_norm(const io::Checkpoint& ck, const std::string& name, int64_t n, bool one_plus);

/// Copies rows of a matrix tensor into `dst` (same dtype as the tensor), for layout adapters.
/// Appends rows [r0, r0 + n) of `src` to `dst`.
void append_rows(const io::TensorRef& src, int64_t r0, int64_t n, std::vector<uint8_t>* dst);

}  // namespace spool::models
