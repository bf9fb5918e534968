// Bit packing of the quantized format (docs/quant-format.md, step 4). Per row, group by group;
// every group starts on a byte boundary. One rule for every b (8 bits = one byte per code).
//   b-bit (2, 3, 4, 5, 6, 8): ceil(g*b/8) bytes; code j occupies bits [j*b, j*b + b) of the group's
//     little-endian bit string (bit k is bit k % 8 of byte k / 8); unused trailing bits are 0.
//   ternary: ceil(g/5) bytes, byte = c0 + 3 c1 + 9 c2 + 27 c3 + 81 c4 for the group's codes
//     5i .. 5i+4; slots past the group's end hold code 1 (the zero centroid).
#pragma once

#include <cstdint>

#include "quant/codebook.h"

namespace spool::quant {

/// Bytes of one packed group of g codes (g >= 1).
int64_t group_bytes(QType t, int g);

/// Bytes of one packed row: (cols / g) * group_bytes(t, g). Throws spool::Error unless g >= 1
/// divides cols.
int64_t row_bytes(QType t, int64_t cols, int g);

/// Packs g codes (each < levels(t)) into group_bytes(t, g) bytes at out.
/// Throws spool::Error for a code out of range.
void pack_group(QType t, const uint8_t* codes, int g, uint8_t* out);

/// Unpacks the g codes of one group. Throws spool::Error for a ternary byte > 242 (not a
/// valid 5-digit base-3 number); padding slots and bits are not checked.
void unpack_group(QType t, const uint8_t* in, int g, uint8_t* codes);

}  // namespace spool::quant
