// LoRA terms applied unmerged beside a weight's product: y = W x + sum_i s_i B_i (A_i x). A
// WeightView carries them (WeightView::lora); the CPU products (ops::matmul, matmul_multi,
// matmul_reference, CpuBackend::expert_ffn) add them after W's own product, whatever W's storage
// (float, spool-quantized, ggml blocks): the low-rank product never touches W. The adapters'
// f32 matrices are loaded and owned by src/lora (lora::LoraSet); these are borrowed views.
// PEFT's LoRA (peft/tuners/lora/layer.py, Linear.forward): result + lora_B(lora_A(x)) * scaling.
#pragma once

#include <cstdint>
#include <vector>

namespace spool::ops {

struct WeightView;

/// One adapter's low-rank term on a matrix W [rows, cols]: adds scale * B (A x) to y = W x.
/// a: A [rank, cols] f32 row-major; bt: B transposed, [rank, rows] f32 with row stride ldbt
/// (0: rows), so that B u is `rank` contiguous axpys (host memory).
struct LoraTerm {
  const float* a = nullptr;
  const float* bt = nullptr;
  int64_t rank = 0;
  float scale = 1.0f;  ///< PEFT scaling (lora_alpha / r, or / sqrt(r) with use_rslora) times the user's scale
  int64_t ldbt = 0;
};

/// The LoRA terms of one matrix (one per adapter that targets it), in adapter order.
struct LoraDelta {
  std::vector<LoraTerm> terms;
};

/// y[t, r] += sum over d's terms of scale * sum_k B[r, k] (sum_c A[k, c] x[t, c]) for t < T:
/// x [T, cols] (row stride cols), y [T, rows] with row stride ldy. f32 throughout.
void lora_add(const LoraDelta& d, const float* x, int64_t T, int64_t cols, float* y, int64_t rows, int64_t ldy);

/// The same for the matrix `w` (w.lora must be set): y [T, w.rows] row stride ldy.
void lora_add(const WeightView& w, const float* x, int64_t T, float* y, int64_t ldy);

/// Throws spool::Error when `w` carries LoRA terms: a backend without the LoRA products
/// (CUDA for now) refuses rather than silently computing W x alone. `backend` names it.
void refuse_lora(const WeightView& w, const char* backend);

}  // namespace spool::ops
