#include "ops/cpu_targets.h"

#include <hwy/highway.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>

#include "common/error.h"

namespace spool::ops {

namespace {

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Targets compiled into this binary and supported by the CPU (before any restriction).
int64_t available_targets() {
  hwy::SetSupportedTargetsForTest(0);  // 0: back to what the CPU supports
  return hwy::SupportedTargets() & HWY_TARGETS;
}

std::string names_of(int64_t bits) {
  std::string out;
  for (int64_t bit = 1; bit != 0 && bit <= bits; bit <<= 1)
    if (bits & bit) out += std::string(out.empty() ? "" : ", ") + hwy::TargetName(bit);
  return out;
}

}  // namespace

int64_t parse_cpu_targets(const std::string& names) {
  const int64_t avail = available_targets();
  int64_t wanted = 0;
  std::stringstream ss(names);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const std::string name = upper(trim(item));
    if (name.empty()) continue;
    int64_t bit = 0;
    for (int64_t b = 1; b != 0 && bit == 0; b <<= 1)
      if (upper(hwy::TargetName(b)) == name) bit = b;
    if (bit == 0) fail("unknown SIMD target '%s' (Highway target names, e.g. AVX2, AVX3, AVX3_DL, NEON)", trim(item).c_str());
    wanted |= bit;
  }
  if (wanted == 0) fail("no SIMD target named in '%s'", names.c_str());
  if ((wanted & avail) == 0)
    fail("none of the SIMD targets %s is compiled in and supported by this CPU (available: %s)", names_of(wanted).c_str(),
         names_of(avail).c_str());
  return wanted & avail;
}

int64_t restrict_cpu_targets_from_env() {
  const char* v = std::getenv("SPOOL_HWY_TARGETS");
  if (v == nullptr || *v == '\0') return 0;
  int64_t bits = 0;
  try {
    bits = parse_cpu_targets(v);
  } catch (const Error& e) {
    fail("SPOOL_HWY_TARGETS: %s", e.what());
  }
  hwy::SetSupportedTargetsForTest(bits);
  return bits;
}

}  // namespace spool::ops
