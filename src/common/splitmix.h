// splitmix64: a tiny, fast 64-bit generator step (Steele, Lea and Flood), shared by the quant
// format's rotation signs and the server's request seeds.
#pragma once

#include <cstdint>

namespace spool {

/// splitmix64 step: state += 0x9e3779b97f4a7c15, returns the mixed state
/// (z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27; z *= 0x94d049bb133111eb; z ^= z >> 31).
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace spool
