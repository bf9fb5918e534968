// SPOOL_HWY_TARGETS: the named Highway targets restrict kernel dispatch; bad names are errors.
#include "ops/cpu_targets.h"

#include <gtest/gtest.h>
#include <hwy/highway.h>
#include <hwy/targets.h>

#include <cstdlib>

#include "common/error.h"

namespace spool::ops {
namespace {

// The best target this binary has for this CPU, unrestricted.
int64_t best_target() {
  hwy::SetSupportedTargetsForTest(0);
  const int64_t t = hwy::SupportedTargets() & HWY_TARGETS;
  return t & -t;
}

TEST(CpuTargets, NamesParseCaseInsensitive) {
  const int64_t best = best_target();
  const std::string name = hwy::TargetName(best);
  EXPECT_EQ(parse_cpu_targets(name), best);
  std::string lower = name;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  EXPECT_EQ(parse_cpu_targets(" " + lower + " ,"), best);
}

TEST(CpuTargets, UnknownAndUnavailableNamesAreErrors) {
  EXPECT_THROW(parse_cpu_targets("AVX9"), Error);
  EXPECT_THROW(parse_cpu_targets(""), Error);
  EXPECT_THROW(parse_cpu_targets(","), Error);
#if HWY_ARCH_X86
  EXPECT_THROW(parse_cpu_targets("NEON"), Error);  // a known name this binary/CPU cannot run
#else
  EXPECT_THROW(parse_cpu_targets("AVX2"), Error);
#endif
}

TEST(CpuTargets, EnvRestrictsDispatch) {
  // The restriction names a target below the best one where the CPU has two (AVX2 under AVX-512),
  // else the best one itself.
  const int64_t best = best_target();
  const int64_t avail = hwy::SupportedTargets() & HWY_TARGETS;
  const int64_t rest = avail & ~best & ~static_cast<int64_t>(HWY_SCALAR | HWY_EMU128);
  const int64_t want = rest ? (rest & -rest) : best;
  ::setenv("SPOOL_HWY_TARGETS", hwy::TargetName(want), 1);
  EXPECT_EQ(restrict_cpu_targets_from_env(), want);
  const int64_t now = hwy::SupportedTargets() & HWY_TARGETS;
  EXPECT_EQ(now & -now, want) << "dispatch picks " << hwy::TargetName(now & -now);
  ::setenv("SPOOL_HWY_TARGETS", "AVX9", 1);
  try {
    restrict_cpu_targets_from_env();
    ADD_FAILURE() << "no error for AVX9";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SPOOL_HWY_TARGETS"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("AVX9"), std::string::npos) << e.what();
  }
  ::unsetenv("SPOOL_HWY_TARGETS");
  EXPECT_EQ(restrict_cpu_targets_from_env(), 0);
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace
}  // namespace spool::ops
