// Test helpers: reproducible random data and a loop over the SIMD targets.
#pragma once

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdint>
#include <random>
#include <vector>

namespace spool::testing {

/// n samples of N(0, scale^2) from mt19937_64(seed): the same values on every platform run.
inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

/// Runs fn(target) once per Highway target compiled in and supported by this CPU, with
/// dispatch forced to that target (restored afterwards); failures name the target.
template <class F>
void for_each_target(F&& fn) {
  for (int64_t t : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(t);
    SCOPED_TRACE(hwy::TargetName(t));
    fn(t);
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace spool::testing
