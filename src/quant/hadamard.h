// Randomized Hadamard rotation of the quantized format (docs/quant-format.md, step 1):
// W' = W diag(s) H_blk, and at inference x' = H_blk (s .* x), so that W' x' = W x.
// H_blk is the normalized Walsh-Hadamard transform applied blockwise with block size
// B = n & -n (the largest power of two dividing n): 2880 -> 64, 1536 -> 512, 2048 -> 2048.
// The SIMD transform itself lives in spool_ops (ops/quant_matmul.h), which the kernels use.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "common/splitmix.h"

namespace spool::quant {

/// Block size of the blockwise transform for n columns: n & -n. n >= 1.
inline int64_t hadamard_block(int64_t n) { return n & -n; }

/// In-place blockwise normalized fast Walsh-Hadamard transform of x[0, n): each block of B
/// elements becomes Sylvester(B)/sqrt(B) times itself, O(n log B). Symmetric, orthonormal, an
/// involution. (Sylvester(B)[i][j] = (-1)^popcount(i & j).)
void fwht(float* x, int64_t n);

/// out = H_blk (s .* x) for n elements; `signs` holds n values +-1 (nullptr = all +1). out may
/// equal x. This is the input rotation done once per activation row.
void rotate_input(const int8_t* signs, const float* x, int64_t n, float* out);

/// Inverse of rotate_input: out = s .* (H_blk x) (H_blk is its own inverse). Maps a row of the
/// rotated matrix W' back to the original basis. out may equal x.
void unrotate(const int8_t* signs, const float* x, int64_t n, float* out);

/// FNV-1a 64-bit hash of the bytes of `s` (offset basis 0xcbf29ce484222325, prime 0x100000001b3).
uint64_t fnv1a64(std::string_view s);

/// splitmix64 step (src/common/splitmix.h); part of the format: rotation_signs draws from it.
using spool::splitmix64;

/// The sign vector of a tensor: n values in {+1, -1}, deterministic on every platform.
/// state = seed ^ fnv1a64(name); z_k = the k-th splitmix64 output (k = 0, 1, ...);
/// s_i = -1 if bit (i % 64) of z_{i / 64} is set, else +1. `name` is used byte for byte: pass
/// the normalised tensor name (the format shares one vector per layer projection).
std::vector<int8_t> rotation_signs(uint64_t seed, std::string_view name, int64_t n);

}  // namespace spool::quant
