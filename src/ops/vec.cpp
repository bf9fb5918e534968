#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/vec.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include <algorithm>
#include <cmath>

#include "ops/vec.h"

HWY_BEFORE_NAMESPACE();
namespace spool::ops {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

float Dot(const float* a, const float* b, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 2 * N <= n; i += 2 * N) {
    acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
    acc1 = hn::MulAdd(hn::LoadU(df, a + i + N), hn::LoadU(df, b + i + N), acc1);
  }
  for (; i + N <= n; i += N) acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void DeltaRuleStep(float* S, int64_t dk, int64_t dv, float decay, const float* k, const float* q, const float* v,
                   float beta, float* u, float* o) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  std::fill(u, u + dv, 0.0f);
  std::fill(o, o + dv, 0.0f);
  const auto vdecay = hn::Set(df, decay);
  for (int64_t i = 0; i < dk; ++i) {  // S_i *= decay; u += k_i S_i
    float* r = S + i * dv;
    const auto vk = hn::Set(df, k[i]);
    int64_t j = 0;
    for (; j + N <= dv; j += N) {
      const auto s = hn::Mul(hn::LoadU(df, r + j), vdecay);
      hn::StoreU(s, df, r + j);
      hn::StoreU(hn::MulAdd(vk, s, hn::LoadU(df, u + j)), df, u + j);
    }
    for (; j < dv; ++j) {
      r[j] *= decay;
      u[j] += k[i] * r[j];
    }
  }
  for (int64_t j = 0; j < dv; ++j) u[j] = (v[j] - u[j]) * beta;
  for (int64_t i = 0; i < dk; ++i) {  // S_i += k_i u; o += q_i S_i
    float* r = S + i * dv;
    const auto vk = hn::Set(df, k[i]), vq = hn::Set(df, q[i]);
    int64_t j = 0;
    for (; j + N <= dv; j += N) {
      const auto s = hn::MulAdd(vk, hn::LoadU(df, u + j), hn::LoadU(df, r + j));
      hn::StoreU(s, df, r + j);
      hn::StoreU(hn::MulAdd(vq, s, hn::LoadU(df, o + j)), df, o + j);
    }
    for (; j < dv; ++j) {
      r[j] += k[i] * u[j];
      o[j] += q[i] * r[j];
    }
  }
}

void Axpy(float a, const float* x, int64_t n, float* y) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto va = hn::Set(df, a);
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::MulAdd(va, hn::LoadU(df, x + i), hn::LoadU(df, y + i)), df, y + i);
  for (; i < n; ++i) y[i] += a * x[i];
}

void Scale(float a, float* x, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  const auto va = hn::Set(df, a);
  int64_t i = 0;
  for (; i + N <= n; i += N) hn::StoreU(hn::Mul(va, hn::LoadU(df, x + i)), df, x + i);
  for (; i < n; ++i) x[i] *= a;
}

uint64_t ReadSum(const uint64_t* p, int64_t n) {
  const hn::ScalableTag<uint64_t> du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(du));
  auto s0 = hn::Zero(du), s1 = s0, s2 = s0, s3 = s0;  // four independent streams of loads
  int64_t i = 0;
  for (; i + 4 * N <= n; i += 4 * N) {
    s0 = hn::Add(s0, hn::LoadU(du, p + i));
    s1 = hn::Add(s1, hn::LoadU(du, p + i + N));
    s2 = hn::Add(s2, hn::LoadU(du, p + i + 2 * N));
    s3 = hn::Add(s3, hn::LoadU(du, p + i + 3 * N));
  }
  uint64_t s = hn::GetLane(hn::SumOfLanes(du, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < n; ++i) s += p[i];
  return s;
}

double SumSquares(const float* x, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  double total = 0.0;
  int64_t i = 0;
  // f32 lanes over blocks of 256 elements, each block summed into a double.
  while (i + N <= n) {
    auto acc = hn::Zero(df);
    const int64_t end = std::min(n, i + 256);
    for (; i + N <= end; i += N) {
      const auto v = hn::LoadU(df, x + i);
      acc = hn::MulAdd(v, v, acc);
    }
    total += hn::GetLane(hn::SumOfLanes(df, acc));
  }
  for (; i < n; ++i) total += static_cast<double>(x[i]) * x[i];
  return total;
}

float SoftmaxInplace(float* x, int64_t n) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  float m = -INFINITY;
  int64_t i = 0;
  if (n >= N) {
    auto vm = hn::Set(df, -INFINITY);
    for (; i + N <= n; i += N) vm = hn::Max(vm, hn::LoadU(df, x + i));
    m = hn::GetLane(hn::MaxOfLanes(df, vm));
  }
  for (; i < n; ++i) m = std::max(m, x[i]);
  const auto vmax = hn::Set(df, m);
  auto vs = hn::Zero(df);
  i = 0;
  for (; i + N <= n; i += N) {
    const auto e = hn::Exp(df, hn::Sub(hn::LoadU(df, x + i), vmax));
    hn::StoreU(e, df, x + i);
    vs = hn::Add(vs, e);
  }
  float s = hn::GetLane(hn::SumOfLanes(df, vs));
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  Scale(1.0f / s, x, n);
  return s;
}

void AccumulateRows(const float* p, int64_t ldp, int64_t m, const float* v, int64_t ldv, int64_t n, int64_t vd, float* out,
                    int64_t ldo) {
  const DF df;
  const int64_t N = static_cast<int64_t>(hn::Lanes(df));
  for (int64_t r0 = 0; r0 < m; r0 += 4) {
    const int64_t mr = std::min<int64_t>(4, m - r0);
    int64_t d0 = 0;
    if (mr == 4) {
      // Full groups of 4 rows: 2 vectors of columns at a time, 8 independent FMA chains (4
      // chains of 4-cycle FMAs would cap the core at one FMA per cycle). Each output element
      // still sums over j in order, as below.
      const float* p0 = p + r0 * ldp;
      for (; d0 + 2 * N <= vd; d0 += 2 * N) {
        float* o = out + r0 * ldo + d0;
        auto a0 = hn::LoadU(df, o), b0 = hn::LoadU(df, o + N);
        auto a1 = hn::LoadU(df, o + ldo), b1 = hn::LoadU(df, o + ldo + N);
        auto a2 = hn::LoadU(df, o + 2 * ldo), b2 = hn::LoadU(df, o + 2 * ldo + N);
        auto a3 = hn::LoadU(df, o + 3 * ldo), b3 = hn::LoadU(df, o + 3 * ldo + N);
        for (int64_t j = 0; j < n; ++j) {
          const auto va = hn::LoadU(df, v + j * ldv + d0), vb = hn::LoadU(df, v + j * ldv + d0 + N);
          const auto p0j = hn::Set(df, p0[j]), p1j = hn::Set(df, p0[ldp + j]);
          const auto p2j = hn::Set(df, p0[2 * ldp + j]), p3j = hn::Set(df, p0[3 * ldp + j]);
          a0 = hn::MulAdd(p0j, va, a0);
          b0 = hn::MulAdd(p0j, vb, b0);
          a1 = hn::MulAdd(p1j, va, a1);
          b1 = hn::MulAdd(p1j, vb, b1);
          a2 = hn::MulAdd(p2j, va, a2);
          b2 = hn::MulAdd(p2j, vb, b2);
          a3 = hn::MulAdd(p3j, va, a3);
          b3 = hn::MulAdd(p3j, vb, b3);
        }
        hn::StoreU(a0, df, o);
        hn::StoreU(b0, df, o + N);
        hn::StoreU(a1, df, o + ldo);
        hn::StoreU(b1, df, o + ldo + N);
        hn::StoreU(a2, df, o + 2 * ldo);
        hn::StoreU(b2, df, o + 2 * ldo + N);
        hn::StoreU(a3, df, o + 3 * ldo);
        hn::StoreU(b3, df, o + 3 * ldo + N);
      }
    }
    for (int64_t d = d0; d < vd; d += N) {
      if (d + N > vd) {  // ragged tail: scalar
        for (int64_t r = r0; r < r0 + mr; ++r)
          for (int64_t j = 0; j < n; ++j)
            for (int64_t k = d; k < vd; ++k) out[r * ldo + k] += p[r * ldp + j] * v[j * ldv + k];
        break;
      }
      auto a0 = hn::LoadU(df, out + r0 * ldo + d);
      auto a1 = mr > 1 ? hn::LoadU(df, out + (r0 + 1) * ldo + d) : hn::Zero(df);
      auto a2 = mr > 2 ? hn::LoadU(df, out + (r0 + 2) * ldo + d) : hn::Zero(df);
      auto a3 = mr > 3 ? hn::LoadU(df, out + (r0 + 3) * ldo + d) : hn::Zero(df);
      const float* p0 = p + r0 * ldp;
      for (int64_t j = 0; j < n; ++j) {
        const auto vv = hn::LoadU(df, v + j * ldv + d);
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
  }
}

void ScoresKt(const float* q, int64_t ldq, int64_t m, const float* kt, int64_t ldk, int64_t n, int64_t dim, float* out,
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
        const auto k = hn::LoadU(df, kt + d * ldk + p);
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
        for (int64_t d = 0; d < dim; ++d) acc += q[r * ldq + d] * kt[d * ldk + p];
        out[r * ldo + p] = acc;
      }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace spool::ops
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace spool::ops {
HWY_EXPORT(Dot);
HWY_EXPORT(Axpy);
HWY_EXPORT(DeltaRuleStep);
HWY_EXPORT(Scale);
HWY_EXPORT(SumSquares);
HWY_EXPORT(ReadSum);
HWY_EXPORT(SoftmaxInplace);
HWY_EXPORT(AccumulateRows);
HWY_EXPORT(ScoresKt);

float dot(const float* a, const float* b, int64_t n) { return HWY_DYNAMIC_DISPATCH(Dot)(a, b, n); }
void axpy(float a, const float* x, int64_t n, float* y) { HWY_DYNAMIC_DISPATCH(Axpy)(a, x, n, y); }
void delta_rule_step(float* S, int64_t dk, int64_t dv, float decay, const float* k, const float* q, const float* v,
                     float beta, float* u, float* o) {
  HWY_DYNAMIC_DISPATCH(DeltaRuleStep)(S, dk, dv, decay, k, q, v, beta, u, o);
}
void scale(float a, float* x, int64_t n) { HWY_DYNAMIC_DISPATCH(Scale)(a, x, n); }
double sum_squares(const float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(SumSquares)(x, n); }
uint64_t read_sum(const uint64_t* p, int64_t n) { return HWY_DYNAMIC_DISPATCH(ReadSum)(p, n); }
float softmax_inplace(float* x, int64_t n) { return HWY_DYNAMIC_DISPATCH(SoftmaxInplace)(x, n); }
void accumulate_rows(const float* p, int64_t ldp, int64_t m, const float* v, int64_t ldv, int64_t n, int64_t vd, float* out,
                     int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(AccumulateRows)(p, ldp, m, v, ldv, n, vd, out, ldo);
}
void scores_kt(const float* q, int64_t ldq, int64_t m, const float* kt, int64_t ldk, int64_t n, int64_t dim, float* out,
               int64_t ldo) {
  HWY_DYNAMIC_DISPATCH(ScoresKt)(q, ldq, m, kt, ldk, n, dim, out, ldo);
}
}  // namespace spool::ops
#endif  // HWY_ONCE
