// ggml tensor types as stored in GGUF files: ids, names, block sizes and bytes per block
// (docs: the GGUF notes (ggml docs/gguf.md) section 4.1, from ggml's type traits table and gguf-py's
// GGML_QUANT_SIZES). Header-only, shared by the GGUF reader (src/io/gguf) and the block
// kernels (src/ops/ggml_blocks) without a link dependency between them.
#pragma once

#include <vector>

#include <cstdint>

namespace spool {

/// ggml_type ids (the i32 stored in a GGUF tensor-info record). Ids 4, 5, 31-33 and 36-38 are
/// retired (block size 0); ids >= 43 are unknown.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
  Q2_0 = 42,
};

/// One row of the type table: name, elements per block, bytes per block.
struct GgmlTypeTraits {
  const char* name;  ///< ggml's name ("Q4_K"); nullptr for retired or unknown ids
  uint32_t blck;     ///< elements per block (0: retired / unknown)
  uint32_t size;     ///< bytes per block
};

/// Number of ids in the table (one past the largest known id).
constexpr uint32_t kGgmlTypeCount = 43;

/// Traits of type id `id`; {nullptr, 0, 0} for retired or unknown ids.
constexpr GgmlTypeTraits ggml_type_traits(uint32_t id) {
  constexpr GgmlTypeTraits kTable[kGgmlTypeCount] = {
      {"F32", 1, 4},        {"F16", 1, 2},       {"Q4_0", 32, 18},     {"Q4_1", 32, 20},   {nullptr, 0, 0},
      {nullptr, 0, 0},      {"Q5_0", 32, 22},    {"Q5_1", 32, 24},     {"Q8_0", 32, 34},   {"Q8_1", 32, 36},
      {"Q2_K", 256, 84},    {"Q3_K", 256, 110},  {"Q4_K", 256, 144},   {"Q5_K", 256, 176}, {"Q6_K", 256, 210},
      {"Q8_K", 256, 292},   {"IQ2_XXS", 256, 66}, {"IQ2_XS", 256, 74}, {"IQ3_XXS", 256, 98}, {"IQ1_S", 256, 50},
      {"IQ4_NL", 32, 18},   {"IQ3_S", 256, 110}, {"IQ2_S", 256, 82},   {"IQ4_XS", 256, 136}, {"I8", 1, 1},
      {"I16", 1, 2},        {"I32", 1, 4},       {"I64", 1, 8},        {"F64", 1, 8},      {"IQ1_M", 256, 56},
      {"BF16", 1, 2},       {nullptr, 0, 0},     {nullptr, 0, 0},      {nullptr, 0, 0},    {"TQ1_0", 256, 54},
      {"TQ2_0", 256, 66},   {nullptr, 0, 0},     {nullptr, 0, 0},      {nullptr, 0, 0},    {"MXFP4", 32, 17},
      {"NVFP4", 64, 36},    {"Q1_0", 128, 18},   {"Q2_0", 64, 18},
  };
  return id < kGgmlTypeCount ? kTable[id] : GgmlTypeTraits{nullptr, 0, 0};
}

/// Traits of a GgmlType.
constexpr GgmlTypeTraits ggml_type_traits(GgmlType t) { return ggml_type_traits(static_cast<uint32_t>(t)); }

/// True when `id` names a current (not retired, not unknown) ggml type.
constexpr bool ggml_type_known(uint32_t id) { return ggml_type_traits(id).blck != 0; }

/// ggml's name of a type, or "?" for retired / unknown ids.
constexpr const char* ggml_type_name(GgmlType t) {
  const char* n = ggml_type_traits(t).name;
  return n != nullptr ? n : "?";
}

/// Bytes of one row of `n` elements (n must be a multiple of the block size); 0 if unknown.
constexpr uint64_t ggml_row_bytes(GgmlType t, uint64_t n) {
  const GgmlTypeTraits tr = ggml_type_traits(t);
  return tr.blck == 0 ? 0 : n / tr.blck * tr.size;
}


/// Byte offsets of the f16 scale fields (d, and dmin where the type has one) inside one block
/// of type t (gguf.md block layouts); empty for float types, MXFP4 (e8m0 scale) and IQ1_M (its f16
/// d is spread over the top nibbles of four words: ops::iq1m_get_d / iq1m_set_d). For tools
/// and tests that build or rescale blocks.
inline std::vector<int> ggml_half_fields(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: case GgmlType::IQ4_NL: case GgmlType::IQ4_XS:
      return {0};
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: return {0, 2};
    case GgmlType::Q2_K: return {80, 82};
    case GgmlType::Q3_K: return {108};
    case GgmlType::Q6_K: return {208};
    case GgmlType::IQ2_XXS: case GgmlType::IQ2_XS: case GgmlType::IQ2_S: case GgmlType::IQ3_XXS: case GgmlType::IQ3_S:
    case GgmlType::IQ1_S:
      return {0};
    case GgmlType::TQ1_0: return {52};
    case GgmlType::TQ2_0: return {64};
    default: return {};  // (IQ1_M: its d is split over 4 words, ops::iq1m_get_d / iq1m_set_d)
  }
}

}  // namespace spool
