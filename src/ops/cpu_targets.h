// Restricting the CPU kernels to some SIMD targets at run time: SPOOL_HWY_TARGETS=AVX2 makes an
// AVX-512 machine run the AVX2 kernels (a laptop-class x86 CPU) for tests and benchmarks
// (bench/cpu_peers.sh AVX2=1). Every kernel dispatches through Highway, so this is
// hwy::SetSupportedTargetsForTest over the named targets.
#pragma once

#include <cstdint>
#include <string>

namespace spool::ops {

/// Highway target bits for a comma-separated list of Highway target names ("AVX2", "AVX3",
/// "AVX3_DL", "SSE4", "SSSE3", "NEON", "SVE", "SVE2", "EMU128", "SCALAR"; case-insensitive, as
/// hwy::TargetName spells them). Throws spool::Error
/// naming an unknown name, or when none of the named targets is both compiled in and supported
/// by this CPU (listing those that are).
int64_t parse_cpu_targets(const std::string& names);

/// Reads SPOOL_HWY_TARGETS and, when set and not empty, restricts kernel dispatch to those
/// targets (hwy::SetSupportedTargetsForTest). Returns the restriction's target bits (0: not set).
/// Errors as parse_cpu_targets, naming the variable.
int64_t restrict_cpu_targets_from_env();

}  // namespace spool::ops
