#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/kv_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>

#include "ops/kv_kernels.h"
#include "ops/weights.h"

HWY_BEFORE_NAMESPACE();
namespace spool::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

HWY_INLINE hn::Vec<DF> LoadF16(DF df, const uint16_t* p) {
  const hn::Rebind<hwy::float16_t, DF> d16;
  return hn::PromoteTo(df, hn::LoadU(d16, reinterpret_cast<const hwy::float16_t*>(p)));
}
HWY_INLINE hn::Vec<DF> LoadI8(DF df, const int8_t* p) {
  const hn::Rebind<int8_t, DF> d8;
  const hn::Rebind<int32_t, DF> d32;
  return hn::ConvertTo(df, hn::PromoteTo(d32, hn::LoadU(d8, p)));
}

void ScoresKtF16(const float* q, int64_t ldq, int64_t m, const uint16_t* kt, int64_t ldk, int64_t n, int64_t dim, float* out,
                 int64_t ldo) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r0 = 0; r0 < m; r0 += 4) {
    const int64_t mr = std::min<int64_t>(4, m - r0);
    const float* q0 = q + r0 * ldq;
    int64_t p = 0;
    for (; p + N <= n; p += N) {
      auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
      for (int64_t d = 0; d < dim; ++d) {
        const auto k = LoadF16(df, kt + d * ldk + p);
        a0 = hn::MulAdd(hn::Set(df, q0[d]), k, a0);
        if (mr > 1) a1 = hn::MulAdd(hn::Set(df, q0[ldq + d]), k, a1);
        if (mr > 2) a2 = hn::MulAdd(hn::Set(df, q0[2 * ldq + d]), k, a2);
        if (mr > 3) a3 = hn::MulAdd(hn::Set(df, q0[3 * ldq + d]), k, a3);
      }
      hn::StoreU(a0, df, out + r0 * ldo + p);
      if (mr > 1) hn::StoreU(a1, df, out + (r0 + 1) * ldo + p);
      if (mr > 2) hn::StoreU(a2, df, out + (r0 + 2) * ldo + p);
      if (mr > 3) hn::StoreU(a3, df, out + (r0 + 3) * ldo + p);
    }
    for (; p < n; ++p)
      for (int64_t r = r0; r < r0 + mr; ++r) {
        float acc = 0.0f;
        for (int64_t d = 0; d < dim; ++d) acc += q[r * ldq + d] * f16_to_f32(kt[d * ldk + p]);
        out[r * ldo + p] = acc;
      }
  }
}

void ScoresKtI8(const float* q, int64_t ldq, int64_t m, const int8_t* kt, const float* ks, int64_t ldk, int group_dim,
                int64_t n, int64_t dim, float* out, int64_t ldo) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r0 = 0; r0 < m; r0 += 4) {
    const int64_t mr = std::min<int64_t>(4, m - r0);
    const float* q0 = q + r0 * ldq;
    int64_t p = 0;
    for (; p + N <= n; p += N) {
      auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
      for (int64_t g0 = 0; g0 < dim; g0 += group_dim) {
        auto b0 = hn::Zero(df), b1 = hn::Zero(df), b2 = hn::Zero(df), b3 = hn::Zero(df);
        for (int64_t d = g0; d < g0 + group_dim; ++d) {
          const auto k = LoadI8(df, kt + d * ldk + p);
          b0 = hn::MulAdd(hn::Set(df, q0[d]), k, b0);
          if (mr > 1) b1 = hn::MulAdd(hn::Set(df, q0[ldq + d]), k, b1);
          if (mr > 2) b2 = hn::MulAdd(hn::Set(df, q0[2 * ldq + d]), k, b2);
          if (mr > 3) b3 = hn::MulAdd(hn::Set(df, q0[3 * ldq + d]), k, b3);
        }
        const auto s = hn::LoadU(df, ks + (g0 / group_dim) * ldk + p);
        a0 = hn::MulAdd(b0, s, a0);
        a1 = hn::MulAdd(b1, s, a1);
        a2 = hn::MulAdd(b2, s, a2);
        a3 = hn::MulAdd(b3, s, a3);
      }
      hn::StoreU(a0, df, out + r0 * ldo + p);
      if (mr > 1) hn::StoreU(a1, df, out + (r0 + 1) * ldo + p);
      if (mr > 2) hn::StoreU(a2, df, out + (r0 + 2) * ldo + p);
      if (mr > 3) hn::StoreU(a3, df, out + (r0 + 3) * ldo + p);
    }
    for (; p < n; ++p)
      for (int64_t r = r0; r < r0 + mr; ++r) {
        float acc = 0.0f;
        for (int64_t d = 0; d < dim; ++d) acc += q[r * ldq + d] * kt[d * ldk + p] * ks[(d / group_dim) * ldk + p];
        out[r * ldo + p] = acc;
      }
  }
}

// out rows r0..r0+mr += sum_j p[r][j] * row_j, where row_j(d) is produced by `load(j, d)` for
// a vector of lanes starting at d and `scalar(j, d)` for tails.
template <class Load, class Scalar>
HWY_INLINE void AccumulateRowsT(const float* p, int64_t ldp, int64_t m, int64_t n, int64_t vd, float* out, int64_t ldo,
                                const Load& load, const Scalar& scalar) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r0 = 0; r0 < m; r0 += 4) {
    const int64_t mr = std::min<int64_t>(4, m - r0);
    int64_t d = 0;
    for (; d + N <= vd; d += N) {
      auto a0 = hn::LoadU(df, out + r0 * ldo + d);
      auto a1 = mr > 1 ? hn::LoadU(df, out + (r0 + 1) * ldo + d) : hn::Zero(df);
      auto a2 = mr > 2 ? hn::LoadU(df, out + (r0 + 2) * ldo + d) : hn::Zero(df);
      auto a3 = mr > 3 ? hn::LoadU(df, out + (r0 + 3) * ldo + d) : hn::Zero(df);
      const float* p0 = p + r0 * ldp;
      for (int64_t j = 0; j < n; ++j) {
        const auto vv = load(df, j, d);
        a0 = hn::MulAdd(hn::Set(df, p0[j]), vv, a0);
        if (mr > 1) a1 = hn::MulAdd(hn::Set(df, p0[ldp + j]), vv, a1);
        if (mr > 2) a2 = hn::MulAdd(hn::Set(df, p0[2 * ldp + j]), vv, a2);
        if (mr > 3) a3 = hn::MulAdd(hn::Set(df, p0[3 * ldp + j]), vv, a3);
      }
      hn::StoreU(a0, df, out + r0 * ldo + d);
      if (mr > 1) hn::StoreU(a1, df, out + (r0 + 1) * ldo + d);
      if (mr > 2) hn::StoreU(a2, df, out + (r0 + 2) * ldo + d);
      if (mr > 3) hn::StoreU(a3, df, out + (r0 + 3) * ldo + d);
    }
    for (; d < vd; ++d)
      for (int64_t r = r0; r < r0 + mr; ++r)
        for (int64_t j = 0; j < n; ++j) out[r * ldo + d] += p[r * ldp + j] * scalar(j, d);
  }
}

void AccumulateRowsF16(const float* p, int64_t ldp, int64_t m, const uint16_t* v, int64_t ldv, int64_t n, int64_t vd, float* out,
                       int64_t ldo) {
  AccumulateRowsT(
      p, ldp, m, n, vd, out, ldo, [&](DF df, int64_t j, int64_t d) { return LoadF16(df, v + j * ldv + d); },
      [&](int64_t j, int64_t d) { return f16_to_f32(v[j * ldv + d]); });
}

void AccumulateRowsI8(const float* p, int64_t ldp, int64_t m, const int8_t* v, const float* vs, int64_t ldv, int groups,
                      int group_dim, int64_t n, int64_t vd, float* out, int64_t ldo) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  // A vector of lanes must not straddle two scale groups; otherwise use the scalar path.
  if (group_dim % N != 0) {
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t d = 0; d < vd; ++d) out[r * ldo + d] += p[r * ldp + j] * v[j * ldv + d] * vs[j * groups + d / group_dim];
    return;
  }
  AccumulateRowsT(
      p, ldp, m, n, vd, out, ldo,
      [&](DF d_, int64_t j, int64_t d) { return hn::Mul(LoadI8(d_, v + j * ldv + d), hn::Set(d_, vs[j * groups + d / group_dim])); },
      [&](int64_t j, int64_t d) { return v[j * ldv + d] * vs[j * groups + d / group_dim]; });
}

}  // namespace HWY_NAMESPACE
}  // namespace spool::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace spool::ops {
HWY_EXPORT(ScoresKtF16);
HWY_EXPORT(ScoresKtI8);
HWY_EXPORT(AccumulateRowsF16);
HWY_EXPORT(AccumulateRowsI8);

void scores_kt_f16(const float* q, int64_t ldq, int64_t m, const uint16_t* kt, int64_t ldk, int64_t n, int64_t dim, float* out,
                   int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(ScoresKtF16)(q, ldq, m, kt, ldk, n, dim, out, ldo);
}
void scores_kt_i8(const float* q, int64_t ldq, int64_t m, const int8_t* kt, const float* ks, int64_t ldk, int group_dim,
                  int64_t n, int64_t dim, float* out, int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(ScoresKtI8)(q, ldq, m, kt, ks, ldk, group_dim, n, dim, out, ldo);
}
void accumulate_rows_f16(const float* p, int64_t ldp, int64_t m, const uint16_t* v, int64_t ldv, int64_t n, int64_t vd,
                         float* out, int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(AccumulateRowsF16)(p, ldp, m, v, ldv, n, vd, out, ldo);
}
void accumulate_rows_i8(const float* p, int64_t ldp, int64_t m, const int8_t* v, const float* vs, int64_t ldv, int groups,
                        int group_dim, int64_t n, int64_t vd, float* out, int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(AccumulateRowsI8)(p, ldp, m, v, vs, ldv, groups, group_dim, n, vd, out, ldo);
}
}  // namespace spool::ops
#endif  // HWY_ONCE
