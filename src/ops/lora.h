// LoRA terms applied unmerged beside a weight's product: y = W x + sum_i s_i B_i (A_i x). A
// WeightView carries them (WeightView::lora); the CPU products (ops::matmul, matmul_multi,
// matmul_reference, CpuBackend::expert_ffn) and the CUDA backend's (ops/cuda/cuda_lora.cu) add
// them after W's own product, whatever W's storage
// (float, spool-quantized, ggml blocks): the low-rank product never touches W. The adapters'
// f32 matrices are loaded and owned by src/lora (lora::LoraSet); these are borrowed views.
// PEFT's LoRA (peft/tuners/lora/layer.py, Linear.forward): result + lora_B(lora_A(x)) * scaling.
//
// Per-row adapters (continuous batching, `lora` per request): s_i = term.scale * u[t, a_i], with
// u the user scale of adapter a_i for token row t. A LoraRowScales table in scope on the
// calling thread (LoraRowsScope, set by the model's forward for the rows it runs) gives u per
// row; without one, u is the adapter's default (LoraTerm::user). A row whose u is 0 skips the
// term entirely (no A x product), so a row without adapters computes exactly W x.
#pragma once

#include <cstdint>
#include <vector>

namespace spool::ops {

struct WeightView;

/// One adapter's low-rank term on a matrix W [rows, cols]: adds s * B (A x) to y = W x.
/// a: A [rank, cols] f32 row-major; bt: B transposed, [rank, rows] f32 with row stride ldbt
/// (0: rows), so that B u is `rank` contiguous axpys (host memory).
struct LoraTerm {
  const float* a = nullptr;
  const float* bt = nullptr;
  int64_t rank = 0;
  float scale = 1.0f;  ///< PEFT scaling (lora_alpha / r, or / sqrt(r) with use_rslora); the user's scale multiplies it
  int64_t ldbt = 0;
  int adapter = 0;            ///< the adapter's index (lora::LoraSet order): its column in LoraRowScales
  const float* user = nullptr;  ///< the adapter's default user scale (no LoraRowScales in scope); null = 1
};

/// The LoRA terms of one matrix (one per adapter that targets it), in adapter order.
struct LoraDelta {
  std::vector<LoraTerm> terms;
  int64_t rows = 0, cols = 0;  ///< the shape [rows, cols] of the weight they are for (0: not recorded)
};

/// The user scale of every adapter for each token row of a product: scales [rows, n_adapters]
/// row-major (0 = the adapter is off for that row).
struct LoraRowScales {
  const float* scales = nullptr;
  int64_t rows = 0;
  int n_adapters = 0;
};

/// Puts `rows` in scope for the LoRA products run on this thread while the scope lives (null:
/// the adapters' defaults); the previous scope comes back at the end. Not owned.
class LoraRowsScope {
 public:
  explicit LoraRowsScope(const LoraRowScales* rows);
  ~LoraRowsScope();
  LoraRowsScope(const LoraRowsScope&) = delete;
  LoraRowsScope& operator=(const LoraRowsScope&) = delete;

 private:
  const LoraRowScales* prev_;
};

/// The LoraRowScales in scope on this thread, or null.
const LoraRowScales* lora_rows();

/// y[t, r] += sum over d's terms of s(t) * sum_k B[r, k] (sum_c A[k, c] x[t, c]) for t < T:
/// x [T, cols] (row stride cols), y [T, rows] with row stride ldy. f32 throughout. s(t) =
/// term.scale * (rs ? rs->scales[t * n_adapters + term.adapter] : *term.user); terms whose s(t)
/// is 0 are skipped for that row. Throws spool::Error when rs covers another number of rows
/// than T or fewer adapters than a term's index.
void lora_add(const LoraDelta& d, const float* x, int64_t T, int64_t cols, float* y, int64_t rows, int64_t ldy,
              const LoraRowScales* rs);

/// The same with the row scales in scope on this thread (lora_rows()).
inline void lora_add(const LoraDelta& d, const float* x, int64_t T, int64_t cols, float* y, int64_t rows, int64_t ldy) {
  lora_add(d, x, T, cols, y, rows, ldy, lora_rows());
}

/// lora_add() of two deltas on the same input x [T, cols] (an expert's gate and up, y1 and y2
/// [T, rows] with row stride ldy): a term of d2 with the same adapter, A and rank as d1's term at
/// the same position (PEFT's gate_up_proj wrapper: one A for both halves) reuses its A x products,
/// so A is read once. The results are bit for bit those of two lora_add() calls.
void lora_add_pair(const LoraDelta& d1, float* y1, const LoraDelta& d2, float* y2, const float* x, int64_t T, int64_t cols,
                   int64_t rows, int64_t ldy, const LoraRowScales* rs);

/// The same for the matrix `w` (w.lora must be set): y [T, w.rows] row stride ldy; `rs` as above.
void lora_add(const WeightView& w, const float* x, int64_t T, float* y, int64_t ldy, const LoraRowScales* rs);

/// The same with the row scales in scope on this thread.
void lora_add(const WeightView& w, const float* x, int64_t T, float* y, int64_t ldy);

}  // namespace spool::ops
