// ggml's i-quant and ternary block types as stored in GGUF files: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS,
// IQ2_S, IQ3_XXS, IQ3_S (256-element super-blocks decoded through lattice grids, tables in
// ops/ggml_iquant_tables.h) and TQ1_0, TQ2_0 (ternary, base-3 / 2-bit codes). Scalar block
// decoders, bit-identical to gguf-py's gguf.quants.dequantize (and ggml's dequantize_row_*);
// ops/ggml_blocks routes these types here (its dequantize-row and its matmul kernels).
#pragma once

#include <cstdint>

#include "common/ggml_types.h"

namespace spool::ops {

/// True for the nine block types decoded here (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
/// IQ3_S, TQ1_0, TQ2_0).
bool iquant_type(GgmlType t);

/// Dequantizes one block of type t (iquant_type(t) must hold) at `block` (ggml_type_traits(t).size
/// bytes, no alignment required) into y[0, 256). Every bit pattern decodes to defined values: the
/// grid and sign indices are as wide as their tables, so no field is out of range; f16 scales that
/// are inf / NaN give inf / NaN weights, as in ggml. Throws spool::Error for other types.
void iquant_dequantize_block(GgmlType t, const uint8_t* block, float* y);

/// Dequantizes `nblocks` consecutive blocks of type t (iquant_type(t)) at src into dst[0, 256 *
/// nblocks) with the SIMD decoders (ggml_iquant_kernels.cpp, runtime dispatch): bit-identical to
/// iquant_dequantize_block per block (groups of 8 weights per vector operation for the grid types,
/// a vector of digits / codes for TQ1_0 / TQ2_0). Thread-safe.
void iquant_decode_row(GgmlType t, const uint8_t* src, int64_t nblocks, float* dst);

/// The f16 super-block scale d of an IQ1_M block (56 bytes): ggml stores its 16 bits as the top
/// nibbles of the four u16 sub-block scale words at bytes 48..55 (word 0 holds bits 0..3).
uint16_t iq1m_get_d(const uint8_t* block);

/// Writes the f16 bits `d` into an IQ1_M block's four scale words, leaving their 3-bit sub-block
/// scales as they were (tools and tests that build or rescale blocks).
void iq1m_set_d(uint8_t* block, uint16_t d);

}  // namespace spool::ops
