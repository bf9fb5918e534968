// Dense matrix products against WeightViews (f32 / f16 / bf16 weights, f32 activations and
// f32 accumulation), SIMD via Highway with runtime dispatch to the best target of the CPU.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <utility>
#include <vector>

#include "ops/quant_q8.h"
#include "ops/thread_pool.h"
#include "ops/weights.h"

namespace spool::ops {

/// y[t, r] = sum_c x[t, c] * W[r, c] for t < T, r < W.rows, plus W's LoRA terms (ops/lora.h) when it has them.
/// x: [T, W.cols] f32 row-major; y: [T, W.rows] f32 row-major. Parallel over rows of W.
/// With `int8_acts` (CpuBackend's option, set from --act-bits 8, or auto on a K-quant GGUF or a spool q4 / q8 model on
/// x86) Q4_K / Q6_K weights (ops/ggml_q8.h) and spool q4 / q8 matrices with a multiple of 128 columns (ops/quant_q8.h)
/// take int8 activations quantized once per call when the CPU has the int8 kernels: not exact; matmul_reference()
/// is the f32 product. Without it, f32 activations (exact against the dequantized weights).
void matmul(const WeightView& w, const float* x, int64_t T, float* y, ThreadPool* pool, bool int8_acts = false);

/// One product of a matmul_multi(): y = x W^T with W [rows, cols] and y [T, rows].
struct MatmulOut {
  const WeightView* w = nullptr;
  float* y = nullptr;
};

/// Most tokens for which matmul_multi() runs spool q4 / q8 matrices in one job, keeping a rotated
/// copy of x and its int8 quantization per distinct sign vector at once (the caller thread's buffers,
/// grown only: plan::workspace_bytes counts them); with more tokens each matrix runs as matmul().
inline constexpr int64_t kMultiQuantRows = 64;

/// Several products of the same input in one parallel job (fewer hand-offs in decode):
/// y[i][t, r] = sum_c x[t, c] * W_i[r, c]; all W_i must have x's column count. `int8_acts` as in matmul().
/// Spool q4 / q8 matrices (up to kMultiQuantRows tokens) share one rotation of x per distinct sign
/// vector and one int8 quantization per rotation; every product has the bits of matmul() on that
/// matrix alone (LoRA terms included).
void matmul_multi(std::span<const MatmulOut> outs, const float* x, int64_t T, ThreadPool* pool, bool int8_acts = false);
inline void matmul_multi(std::initializer_list<MatmulOut> outs, const float* x, int64_t T, ThreadPool* pool,
                         bool int8_acts = false) {
  matmul_multi(std::span<const MatmulOut>(outs.begin(), outs.size()), x, T, pool, int8_acts);
}

/// Same as matmul() on one thread, for rows [r0, r1) only, without W's LoRA terms (a caller of row
/// ranges adds them over whole rows: ops::lora_add); y rows have stride `ldy`
/// (y[t * ldy + r]). For callers that parallelise at a higher level (e.g. over experts). `int8_acts` as in matmul().
void matmul_rows(const WeightView& w, const float* x, int64_t T, float* y, int64_t ldy, int64_t r0, int64_t r1,
                 bool int8_acts = false);

/// ya = A x and yb = B x for T tokens on one thread (ya [T, A.rows], yb [T, B.rows]). When A
/// and B are quantized with the same sign vector (an expert's gate and up), x is rotated once
/// for both; with `int8_acts` and two Q4_K / Q6_K weights, x is quantized once for both.
/// Same results as two matmul_rows() calls (no LoRA terms, like matmul_rows).
void matmul_rows_pair(const WeightView& a, float* ya, const WeightView& b, float* yb, const float* x, int64_t T,
                      bool int8_acts = false);

/// An input x [T, cols] made ready once for the row kernels of the matrices it serves, so that many
/// row ranges on any threads read it without redoing the work (a decode step's experts: one
/// rotation and one int8 quantization for every expert that has the token's row and the same sign
/// vector). Filled by prepare_input(); read by matmul_prepared_rows(). Reused objects keep their
/// buffers (grow only).
struct PreparedInput {
  int64_t T = 0, cols = 0;
  const int8_t* signs = nullptr;  ///< the sign vector x was rotated with (nullptr: x as given)
  bool quant = false;             ///< made for a spool q4 / q8 matrix (rotated as it says)
  bool int8 = false;              ///< q holds x's int8 quantization (quant_q8_prepare)
  std::vector<float> x;           ///< [T, cols]: x, rotated when signs != nullptr
  QuantQ8Acts q;
};

/// Fills p from x [T, w.cols] for w's products: rotated by w's signs and quantized to int8 when w
/// takes int8 activations (a spool q4 / q8 matrix; `int8_acts` as in matmul()); a copy of x for
/// every other type (their kernels prepare per call, as matmul_rows() does). T >= 1.
void prepare_input(const WeightView& w, const float* x, int64_t T, bool int8_acts, PreparedInput& p);

/// True when p (from prepare_input) serves w's products: the same column count, rotation (the
/// same signs, compared by value) and activation type as prepare_input(w, ...) would make.
bool prepared_for(const PreparedInput& p, const WeightView& w, bool int8_acts);

/// matmul_rows() of the input p was prepared from (p.T tokens): y[t * ldy + r] for rows [r0, r1)
/// of w on the calling thread, the same bits. Throws spool::Error unless prepared_for(p, w, int8_acts).
void matmul_prepared_rows(const WeightView& w, const PreparedInput& p, float* y, int64_t ldy, int64_t r0, int64_t r1,
                          bool int8_acts);

/// Scalar reference of matmul() (double accumulation; LoRA terms added in f32) for tests.
void matmul_reference(const WeightView& w, const float* x, int64_t T, float* y);

/// Name of the SIMD target chosen at runtime (e.g. "AVX3", "AVX2", "NEON").
const char* simd_target_name();

}  // namespace spool::ops
