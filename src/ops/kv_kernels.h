// Attention kernels over f16 and int8 KV caches (the f32 ones are in vec.h): scores against
// transposed keys and the P.V accumulation, dequantizing in registers. Layouts: kv_cache.h.
#pragma once

#include <cstdint>

namespace spool::ops {

/// out[r * ldo + p] = sum_d q[r * ldq + d] * kt[d * ldk + p], kt in f16 bits.
void scores_kt_f16(const float* q, int64_t ldq, int64_t m, const uint16_t* kt, int64_t ldk, int64_t n, int64_t dim,
                   float* out, int64_t ldo);
/// Same with int8 keys: k = kt[d * ldk + p] * ks[(d / group_dim) * ldk + p].
void scores_kt_i8(const float* q, int64_t ldq, int64_t m, const int8_t* kt, const float* ks, int64_t ldk, int group_dim,
                  int64_t n, int64_t dim, float* out, int64_t ldo);
/// out[r, :] += sum_p p[r * ldp + p] * v[p * ldv + :] with v in f16 bits.
void accumulate_rows_f16(const float* p, int64_t ldp, int64_t m, const uint16_t* v, int64_t ldv, int64_t n, int64_t vd,
                         float* out, int64_t ldo);
/// Same with int8 values: v = v[p * ldv + d] * vs[p * groups + d / group_dim].
void accumulate_rows_i8(const float* p, int64_t ldp, int64_t m, const int8_t* v, const float* vs, int64_t ldv, int groups,
                        int group_dim, int64_t n, int64_t vd, float* out, int64_t ldo);

}  // namespace spool::ops
