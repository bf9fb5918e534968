// NEON int8-activation kernels (aarch64; see ggml_q8.h and ggml_q8_neon-inl.h): the kernel
// templates compiled twice, for baseline Armv8-A and with the dot-product extension enabled for
// those functions only (a pragma over their namespace), and the CPU check that picks one.
#include "ops/ggml_q8_panel.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>

#include <algorithm>

namespace spool::ops::q8 {

namespace neon_base {
#define SPOOL_Q8_DOTPROD 0
#include "ops/ggml_q8_neon-inl.h"  // IWYU pragma: keep
#undef SPOOL_Q8_DOTPROD
}  // namespace neon_base

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("dotprod"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")  // (arm_neon.h defines vdotq_s32 for this target)
#endif
namespace neon_dot {
#define SPOOL_Q8_DOTPROD 1
#include "ops/ggml_q8_neon-inl.h"  // IWYU pragma: keep
#undef SPOOL_Q8_DOTPROD
}  // namespace neon_dot
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

void neon_rows(const GgmlView& w, const Q8Acts& a, float* y, int64_t ldy, int64_t r0, int64_t r1, bool dotprod) {
  if (dotprod) return neon_dot::Rows(w, a, y, ldy, r0, r1);
  neon_base::Rows(w, a, y, ldy, r0, r1);
}

bool cpu_has_dotprod() {
  static const bool has = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
  return has;
}

}  // namespace spool::ops::q8

#else  // not aarch64: no NEON kernels

namespace spool::ops::q8 {
bool cpu_has_dotprod() { return false; }
}  // namespace spool::ops::q8

#endif
