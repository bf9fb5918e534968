// Helpers that bind checkpoint tensors to model weights with shape checks; every error
// names the checkpoint directory, the tensor and both shapes.
#pragma once

#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "lora/lora_set.h"
#include "ops/weights.h"

namespace spool::models {

/// While alive, the bind_* functions on this thread attach `set`'s LoRA terms to the matrices
/// they bind (WeightView::lora, by normalised name and shape; lora::LoraSet::dense) and the MoE
/// blocks ask it for their routed experts' terms (lora_binding()). models::load_model opens one
/// around the family's bind when adapters are given. Scopes do not nest.
class LoraBindScope {
 public:
  explicit LoraBindScope(lora::LoraSet* set);
  ~LoraBindScope();
  LoraBindScope(const LoraBindScope&) = delete;
  LoraBindScope& operator=(const LoraBindScope&) = delete;
};
/// The LoraSet of this thread's LoraBindScope, or nullptr outside one.
lora::LoraSet* lora_binding();

/// A matrix [rows, cols] viewed in place (no copy): `name` ("X.weight"), or its quantized
/// form X.qweight/.scales/.codebook(/.signs), with the LoRA terms of a LoraBindScope for `name`.
/// Throws if missing or mis-shaped.
ops::WeightView bind_matrix(const io::Checkpoint& ck, const std::string& name, int64_t rows, int64_t cols);

/// A float (F32/F16/BF16) matrix `name` [rows, cols], no copy (LoRA terms as bind_matrix); for tensors that must never be
/// quantized (MLA's kv_b_proj, split into per-head parts; embeddings may be: bind_matrix). Throws naming the tensor when it is missing,
/// mis-shaped or quantized.
ops::WeightView bind_float_matrix(const io::Checkpoint& ck, const std::string& name, int64_t rows, int64_t cols);

/// The tensors of the token embedding table that DecoderModel::embed reads row by row:
/// {embed_tokens.weight} (float or GGUF), {embed_tokens.qweight, embed_tokens.scales}
/// (spool-quantized; the codebook and signs are tiny and read whole), or none.
std::vector<const io::TensorRef*> embed_row_tensors(const io::Checkpoint& ck);

/// A tensor of exactly `numel` elements with the given shape, converted to f32.
std::vector<float> bind_f32(const io::Checkpoint& ck, const std::string& name, const std::vector<int64_t>& shape);

/// An RMSNorm weight [n] as the effective f32 multiplier: 1 + w when `one_plus`, else w.
std::vector<float> bind_norm(const io::Checkpoint& ck, const std::string& name, int64_t n, bool one_plus);

/// A copy of the rows of `src` listed as (first row, count) ranges, in order, held in
/// `storage` (float rows, or quantized code and scale rows; codebook and signs are shared
/// since rotation acts on columns). For layout adapters that regroup fused projections.
/// Throws spool::Error when `src` carries LoRA terms (their B rows are not regrouped).
ops::WeightView gather_rows(const ops::WeightView& src, const std::vector<std::pair<int64_t, int64_t>>& ranges,
                            std::vector<uint8_t>* storage);

}  // namespace spool::models
