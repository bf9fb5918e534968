#include "quant/hadamard.h"

#include "common/error.h"
#include "ops/quant_matmul.h"

namespace spool::quant {

void fwht(float* x, int64_t n) {
  if (n < 0) fail("fwht: negative length %lld", static_cast<long long>(n));
  spool::ops::hadamard_transform(x, n);
}

void rotate_input(const int8_t* signs, const float* x, int64_t n, float* out) {
  if (n < 0) fail("rotate_input: negative length %lld", static_cast<long long>(n));
  spool::ops::hadamard_rotate(signs, x, n, out);
}

void unrotate(const int8_t* signs, const float* x, int64_t n, float* out) {
  if (n < 0) fail("unrotate: negative length %lld", static_cast<long long>(n));
  spool::ops::hadamard_rotate(nullptr, x, n, out);
  if (signs != nullptr)
    for (int64_t i = 0; i < n; ++i) out[i] *= static_cast<float>(signs[i]);
}

uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::vector<int8_t> rotation_signs(uint64_t seed, std::string_view name, int64_t n) {
  if (n < 0) fail("rotation_signs: negative length %lld", static_cast<long long>(n));
  std::vector<int8_t> s(static_cast<size_t>(n));
  uint64_t state = seed ^ fnv1a64(name);
  uint64_t z = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i % 64 == 0) z = splitmix64(state);
    s[static_cast<size_t>(i)] = ((z >> (i % 64)) & 1u) ? -1 : 1;
  }
  return s;
}

}  // namespace spool::quant
