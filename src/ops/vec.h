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
/// sum_i p[i] (mod 2^64) with the widest vector loads in four independent streams: the inner loop
/// of the memory read probes (spool plan's, quant_bench's BM_MemoryRead), as fast as the kernels read.
uint64_t read_sum(const uint64_t* p, int64_t n);
/// In-place softmax (max-subtracted); returns the normaliser sum of exp(x - max).
/// exp has at most 1 ulp error (Highway contrib/math).
float softmax_inplace(float* x, int64_t n);
/// out[r, :] += sum_p p[r * ldp + p] * v[p * ldv + :] for r < m rows, p < n, d < vd columns
/// (the P.V product of attention: each V row is loaded once for all m rows).
void accumulate_rows(const float* p, int64_t ldp, int64_t m, const float* v, int64_t ldv, int64_t n, int64_t vd,
                     float* out, int64_t ldo);

/// One token of the delta rule on one head's state S [dk, dv] (row-major), as Gated DeltaNet's
/// recurrent form (arXiv 2412.06464; HF transformers torch_recurrent_gated_delta_rule):
///   S = decay * S;  u = (v - S^T k) * beta;  S += k u^T;  o = S^T q
/// k, q [dk], v [dv] in; u [dv] scratch; o [dv] out. Two passes over S (decay with S^T k, then the
/// update with S^T q), each element seeing the same operations in the same order as four separate
/// passes (scale, then one axpy per row for each product), so the results are identical to those.
/// o is zeroed before v is read: o must not alias S, u, v, k or q.
void delta_rule_step(float* S, int64_t dk, int64_t dv, float decay, const float* k, const float* q, const float* v,
                     float beta, float* u, float* o);

/// out[r * ldo + p] = sum_d q[r * ldq + d] * kt[d * ldk + p] for r < m, p < n, d < dim:
/// attention scores against keys stored transposed (one row per dimension), so every
/// FMA covers several positions and no horizontal sums are needed.
void scores_kt(const float* q, int64_t ldq, int64_t m, const float* kt, int64_t ldk, int64_t n, int64_t dim, float* out,
               int64_t ldo);

}  // namespace spool::ops
