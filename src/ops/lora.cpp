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
