#include "ops/lora.h"

#include <algorithm>
#include <vector>

#include "common/error.h"
#include "ops/vec.h"
#include "ops/weights.h"

namespace spool::ops {

namespace {
thread_local const LoraRowScales* t_rows = nullptr;  // LoraRowsScope
}  // namespace

LoraRowsScope::LoraRowsScope(const LoraRowScales* rows) : prev_(t_rows) { t_rows = rows; }
LoraRowsScope::~LoraRowsScope() { t_rows = prev_; }
const LoraRowScales* lora_rows() { return t_rows; }

void lora_add(const LoraDelta& d, const float* x, int64_t T, int64_t cols, float* y, int64_t rows, int64_t ldy,
              const LoraRowScales* rs) {
  if (rs != nullptr && rs->rows != T)
    fail("LoRA: the per-row adapter scales cover %lld rows, the product has %lld", (long long)rs->rows, (long long)T);
  thread_local std::vector<float> u;
  for (const LoraTerm& term : d.terms) {
    if (rs != nullptr && (term.adapter < 0 || term.adapter >= rs->n_adapters))
      fail("LoRA: a term of adapter %d, but the per-row scales cover %d adapters", term.adapter, rs->n_adapters);
    const float deflt = term.user != nullptr ? *term.user : 1.0f;
    const int64_t r = term.rank;
    u.resize(static_cast<size_t>(r));
    const int64_t ld = term.ldbt > 0 ? term.ldbt : rows;
    for (int64_t t = 0; t < T; ++t) {  // rows grouped by whether this adapter is on for them
      const float user = rs != nullptr ? rs->scales[t * rs->n_adapters + term.adapter] : deflt;
      if (user == 0.0f) continue;  // off for this row: no A x product
      const float s = term.scale * user;
      const float* xt = x + t * cols;
      for (int64_t k = 0; k < r; ++k) u[k] = s * dot(term.a + k * cols, xt, cols);  // s (A x)
      float* yt = y + t * ldy;
      for (int64_t k = 0; k < r; ++k) axpy(u[k], term.bt + k * ld, rows, yt);  // + B (s A x), column by column
    }
  }
}

void lora_add_pair(const LoraDelta& d1, float* y1, const LoraDelta& d2, float* y2, const float* x, int64_t T, int64_t cols,
                   int64_t rows, int64_t ldy, const LoraRowScales* rs) {
  const size_t n = std::min(d1.terms.size(), d2.terms.size());
  bool shared = d1.terms.size() == d2.terms.size();
  for (size_t i = 0; shared && i < n; ++i) {
    const LoraTerm &a = d1.terms[i], &b = d2.terms[i];
    shared = a.a == b.a && a.rank == b.rank && a.adapter == b.adapter && a.user == b.user;
  }
  if (!shared) {  // different A matrices: two products
    lora_add(d1, x, T, cols, y1, rows, ldy, rs);
    lora_add(d2, x, T, cols, y2, rows, ldy, rs);
    return;
  }
  if (rs != nullptr && rs->rows != T)
    fail("LoRA: the per-row adapter scales cover %lld rows, the product has %lld", (long long)rs->rows, (long long)T);
  thread_local std::vector<float> ax, u;
  for (size_t i = 0; i < n; ++i) {
    const LoraTerm &t1 = d1.terms[i], &t2 = d2.terms[i];
    if (rs != nullptr && (t1.adapter < 0 || t1.adapter >= rs->n_adapters))
      fail("LoRA: a term of adapter %d, but the per-row scales cover %d adapters", t1.adapter, rs->n_adapters);
    const float deflt = t1.user != nullptr ? *t1.user : 1.0f;
    const int64_t r = t1.rank;
    ax.resize(static_cast<size_t>(r));
    u.resize(static_cast<size_t>(r));
    const int64_t ld1 = t1.ldbt > 0 ? t1.ldbt : rows, ld2 = t2.ldbt > 0 ? t2.ldbt : rows;
    for (int64_t t = 0; t < T; ++t) {
      const float user = rs != nullptr ? rs->scales[t * rs->n_adapters + t1.adapter] : deflt;
      if (user == 0.0f) continue;
      const float* xt = x + t * cols;
      for (int64_t k = 0; k < r; ++k) ax[k] = dot(t1.a + k * cols, xt, cols);  // A x, once
      // Each half as lora_add computes it: u = s (A x), then + B u column by column.
      const float s1 = t1.scale * user, s2 = t2.scale * user;
      for (int64_t k = 0; k < r; ++k) u[k] = s1 * ax[k];
      for (int64_t k = 0; k < r; ++k) axpy(u[k], t1.bt + k * ld1, rows, y1 + t * ldy);
      for (int64_t k = 0; k < r; ++k) u[k] = s2 * ax[k];
      for (int64_t k = 0; k < r; ++k) axpy(u[k], t2.bt + k * ld2, rows, y2 + t * ldy);
    }
  }
}

void lora_add(const WeightView& w, const float* x, int64_t T, float* y, int64_t ldy, const LoraRowScales* rs) {
  lora_add(*w.lora, x, T, w.cols, y, w.rows, ldy, rs);
}

void lora_add(const WeightView& w, const float* x, int64_t T, float* y, int64_t ldy) {
  lora_add(*w.lora, x, T, w.cols, y, w.rows, ldy, lora_rows());
}

void refuse_lora(const WeightView& w, const char* backend) {
  if (w.lora != nullptr)
    fail("LoRA adapters are CPU-only for now: the %s backend has no LoRA products (run with --device cpu)", backend);
}

}  // namespace spool::ops
