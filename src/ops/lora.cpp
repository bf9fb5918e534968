#include "ops/lora.h"

#include <vector>

#include "common/error.h"
#include "ops/vec.h"
#include "ops/weights.h"

namespace spool::ops {

void lora_add(const LoraDelta& d, const float* x, int64_t T, int64_t cols, float* y, int64_t rows, int64_t ldy) {
  thread_local std::vector<float> u;
  for (const LoraTerm& term : d.terms) {
    const int64_t r = term.rank;
    u.resize(static_cast<size_t>(r));
    for (int64_t t = 0; t < T; ++t) {
      const float* xt = x + t * cols;
      for (int64_t k = 0; k < r; ++k) u[k] = term.scale * dot(term.a + k * cols, xt, cols);  // s (A x)
      float* yt = y + t * ldy;
      const int64_t ld = term.ldbt > 0 ? term.ldbt : rows;
      for (int64_t k = 0; k < r; ++k) axpy(u[k], term.bt + k * ld, rows, yt);  // + B (s A x), column by column
    }
  }
}

void lora_add(const WeightView& w, const float* x, int64_t T, float* y, int64_t ldy) {
  lora_add(*w.lora, x, T, w.cols, y, w.rows, ldy);
}

void refuse_lora(const WeightView& w, const char* backend) {
  if (w.lora != nullptr)
    fail("LoRA adapters are CPU-only for now: the %s backend has no LoRA products (run with --device cpu)", backend);
}

}  // namespace spool::ops
