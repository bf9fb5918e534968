// WeightView: one weight matrix as the kernels see it, whatever its storage. Models hold
// views and never know whether a weight is resident, streamed or (later) quantized.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/ggml_types.h"
#include "ops/quant_matmul.h"

namespace spool::ops {
struct LoraDelta;  // ops/lora.h
}

namespace spool::ops {

/// Where a buffer or weight lives.
enum class Device : uint8_t { kCpu, kCuda };

/// Storage type of a weight matrix: float elements, quantized (docs/quant-format.md), or a
/// ggml block type as stored in GGUF files (kGgml: see WeightView::ggml, ops/ggml_blocks.h), or
/// MXFP4 as Hugging Face stores it (kMxfp4: gpt-oss `*_blocks` + `*_scales`, ops::Mxfp4View).
enum class WType : uint8_t { kF32, kF16, kBF16, kQuant, kGgml, kMxfp4 };

/// Bytes per element of a float WType (0 for kQuant, kGgml and kMxfp4).
inline int wtype_size(WType t) {
  return t == WType::kF32 ? 4 : (t == WType::kQuant || t == WType::kGgml || t == WType::kMxfp4) ? 0 : 2;
}

/// A row-major matrix [rows, cols] (= [out, in] of a Linear layer). Float types: `data`
/// points to rows * cols elements of `type`, rows contiguous. kQuant: `quant` describes the
/// packed codes, fp16 group scales, codebook and optional rotation signs. kGgml: `data` points
/// to rows * ggml_row_bytes(ggml, cols) bytes of ggml blocks (rows contiguous, blocks along
/// cols); `col_perm` (optional, [cols]) says the stored column c holds input feature
/// col_perm[c], i.e. y = W_stored · x[col_perm] (a GGUF converter's column reordering kept
/// in the file and undone on the activations; device-neutral: the index array is plain data).
/// kMxfp4: `data` points to the blocks [rows, cols/32, 16] and `mx_scales` to the E8M0 scales
/// [rows, cols/32] (ops::Mxfp4View), both read in place from the checkpoint or an expert slot.
struct WeightView {
  WType type = WType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  QuantView quant;  ///< kQuant only (rows/cols mirror the fields above)
  /// Where `data` / the `quant` pointers live: host memory (the checkpoint's mmap, an expert
  /// cache) or a device copy made by Backend::upload().
  Device device = Device::kCpu;
  GgmlType ggml = GgmlType::F32;       ///< kGgml only: the block type
  const int32_t* col_perm = nullptr;   ///< kGgml only: optional input permutation [cols]
  const char* name = nullptr;          ///< kGgml only: tensor name for errors (optional)
  const uint8_t* mx_scales = nullptr;  ///< kMxfp4 only: E8M0 scales [rows, cols/32]
  /// LoRA terms added unmerged after W's product (ops/lora.h; any type): borrowed from the
  /// model's lora::LoraSet. The CPU products apply them; a backend without them refuses.
  const LoraDelta* lora = nullptr;

  bool empty() const { return data == nullptr && quant.qweight == nullptr; }
  /// Bytes the kernels stream for the matrix.
  uint64_t nbytes() const {
    if (type == WType::kGgml) return static_cast<uint64_t>(rows) * ggml_row_bytes(ggml, static_cast<uint64_t>(cols));
    if (type == WType::kMxfp4) return static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols / 2 + cols / 32);
    return type == WType::kQuant ? quant.nbytes() : static_cast<uint64_t>(rows * cols) * wtype_size(type);
  }
};

/// A WeightView of a ggml-typed matrix [rows, cols] at `data` (borrowed).
inline WeightView ggml_weight_view(GgmlType t, int64_t rows, int64_t cols, const void* data, const char* name = nullptr) {
  WeightView v;
  v.type = WType::kGgml;
  v.ggml = t;
  v.rows = rows;
  v.cols = cols;
  v.data = data;
  v.name = name;
  return v;
}

/// A WeightView of an HF MXFP4 matrix [rows, cols]: blocks [rows, cols/32, 16], scales
/// [rows, cols/32] (borrowed).
inline WeightView mxfp4_weight_view(int64_t rows, int64_t cols, const void* blocks, const uint8_t* scales) {
  WeightView v;
  v.type = WType::kMxfp4;
  v.rows = rows;
  v.cols = cols;
  v.data = blocks;
  v.mx_scales = scales;
  return v;
}

/// A WeightView of a quantized matrix.
inline WeightView quant_weight_view(const QuantView& q) {
  WeightView v;
  v.type = WType::kQuant;
  v.rows = q.rows;
  v.cols = q.cols;
  v.quant = q;
  return v;
}

/// bfloat16 bits → float (exact).
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// float → bfloat16 bits, round to nearest even (NaN kept quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

/// IEEE half bits → float (exact, handles subnormals, inf, NaN).
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 112) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

#if defined(__CUDACC__)
#define SPOOL_HOST_DEVICE __host__ __device__  // also compiled for the GPU (the CUDA backend's KV writes)
#else
#define SPOOL_HOST_DEVICE
#endif

/// float -> IEEE half bits, round to nearest even; overflow gives +-inf, NaN stays NaN,
/// values below the half subnormal range flush to signed zero. Host and (under nvcc) device.
inline SPOOL_HOST_DEVICE uint16_t f32_to_f16(float f) {
#if defined(__CUDA_ARCH__)
  const uint32_t u = __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
#endif
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (abs >= 0x38800000u) {                                              // normal half
    const uint32_t mant = abs & 0x7fffffu;
    uint32_t h = ((abs >> 23) - 112) << 10 | (mant >> 13);
    const uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  if (abs < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25: zero
  // Subnormal half: value = m * 2^-24.
  const uint32_t e = abs >> 23;
  const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - e;  // 14..24
  uint32_t h = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

/// Converts n elements of a weight row of type `t` to float.
void row_to_f32(WType t, const void* src, int64_t n, float* dst);

}  // namespace spool::ops
