#include "ops/lora.h"

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

namespace {

void check_rows(const LoraRowScales* rs, int64_t T) {
  if (rs != nullptr && rs->rows != T)
    fail("LoRA: the per-row adapter scales cover %lld rows, the product has %lld", (long long)rs->rows, (long long)T);
}

// y1 += s1(t) B1 (A x_t) for the T rows of x, and the same into y2 with t2's B and scale when t2
// is set (a term with t1's A, rank, adapter and default: A x_t is computed once for both). Rows
// whose user scale is 0 are skipped. Each output gets u = s (A x), then B u column by column.
void add_term(const LoraTerm& t1, float* y1, const LoraTerm* t2, float* y2, const float* x, int64_t T, int64_t cols, int64_t rows,
              int64_t ldy, const LoraRowScales* rs) {
  if (rs != nullptr && (t1.adapter < 0 || t1.adapter >= rs->n_adapters))
    fail("LoRA: a term of adapter %d, but the per-row scales cover %d adapters", t1.adapter, rs->n_adapters);
  thread_local std::vector<float> ax, u;
  const float deflt = t1.user != nullptr ? *t1.user : 1.0f;
  const int64_t r = t1.rank;
  ax.resize(static_cast<size_t>(r));
  u.resize(static_cast<size_t>(r));
  const LoraTerm* terms[2] = {&t1, t2};
  float* ys[2] = {y1, y2};
  for (int64_t t = 0; t < T; ++t) {  // rows grouped by whether this adapter is on for them
    const float user = rs != nullptr ? rs->scales[t * rs->n_adapters + t1.adapter] : deflt;
    if (user == 0.0f) continue;  // off for this row: no A x product
    const float* xt = x + t * cols;
    for (int64_t k = 0; k < r; ++k) ax[k] = dot(t1.a + k * cols, xt, cols);  // A x
    for (int h = 0; h < 2 && terms[h] != nullptr; ++h) {
      const LoraTerm& term = *terms[h];
      const float s = term.scale * user;
      const int64_t ld = term.ldbt > 0 ? term.ldbt : rows;
      for (int64_t k = 0; k < r; ++k) u[k] = s * ax[k];  // s (A x)
      for (int64_t k = 0; k < r; ++k) axpy(u[k], term.bt + k * ld, rows, ys[h] + t * ldy);  // + B (s A x)
    }
  }
}

}  // namespace

void lora_add(const LoraDelta& d, const float* x, int64_t T, int64_t cols, float* y, int64_t rows, int64_t ldy,
              const LoraRowScales* rs) {
  check_rows(rs, T);
  for (const LoraTerm& term : d.terms) add_term(term, y, nullptr, nullptr, x, T, cols, rows, ldy, rs);
}

void lora_add_pair(const LoraDelta& d1, float* y1, const LoraDelta& d2, float* y2, const float* x, int64_t T, int64_t cols,
                   int64_t rows, int64_t ldy, const LoraRowScales* rs) {
  bool shared = d1.terms.size() == d2.terms.size();
  for (size_t i = 0; shared && i < d1.terms.size(); ++i) {
    const LoraTerm &a = d1.terms[i], &b = d2.terms[i];
    shared = a.a == b.a && a.rank == b.rank && a.adapter == b.adapter && a.user == b.user;
  }
  if (!shared) {  // different A matrices: two products
    lora_add(d1, x, T, cols, y1, rows, ldy, rs);
    lora_add(d2, x, T, cols, y2, rows, ldy, rs);
    return;
  }
  check_rows(rs, T);
  for (size_t i = 0; i < d1.terms.size(); ++i) add_term(d1.terms[i], y1, &d2.terms[i], y2, x, T, cols, rows, ldy, rs);
}

void lora_add(const WeightView& w, const float* x, int64_t T, float* y, int64_t ldy, const LoraRowScales* rs) {
  lora_add(*w.lora, x, T, w.cols, y, w.rows, ldy, rs);
}

void lora_add(const WeightView& w, const float* x, int64_t T, float* y, int64_t ldy) {
  lora_add(*w.lora, x, T, w.cols, y, w.rows, ldy, lora_rows());
}

}  // namespace spool::ops
