// Vector primitives on f32 arrays, SIMD via Highway with runtime dispatch. The kernels of
// attention, Gated DeltaNet, norms and sampling are built from these.
#pragma once

#include <cstdint>

namespace spool::ops {

/// sum_i a[i] * b[i].
float dot(const float* a, const float* b, int64_t n);
/// y[i] += a * x[i].
void axpy(float a, const float* x, int64_t n, float* y);
/// x[i] *= a.
void scale(float a, float* x, int64_t n);
/// sum_i x[i]^2, accumulated in double precision per lane block.
double sum_squares(const float* x, int64_t n);
/// In-place softmax (max-subtracted); returns the normaliser sum of exp(x - max).
/// exp has at most 1 ulp error (Highway contrib/math).
float softmax_inplace(float* x, int64_t n);
/// out[r, :] += sum_p p[r * ldp + p] * v[p * ldv + :] for r < m rows, p < n, d < vd columns
/// (the P.V product of attention: each V row is loaded once for all m rows).
void accumulate_rows(const float* p, int64_t ldp, int64_t m, const float* v, int64_t ldv, int64_t n, int64_t vd,
                     float* out, int64_t ldo);

/// out[r * ldo + p] = sum_d q[r * ldq + d] * kt[d * ldk + p] for r < m, p < n, d < dim:
/// attention scores against keys stored transposed (one row per dimension), so every
/// FMA covers several positions and no horizontal sums are needed.
void scores_kt(const float* q, int64_t ldq, int64_t m, const float* kt, int64_t ldk, int64_t n, int64_t dim, float* out,
               int64_t ldo);

}  // namespace spool::ops
