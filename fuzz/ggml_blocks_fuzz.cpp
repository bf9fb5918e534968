// libFuzzer target for the GGUF block decoders and kernels: byte 0 picks a ggml type id, the rest
// are its blocks (any bit pattern, as a corrupt or hostile file would hold). For every supported
// type, the scalar dequantization and the SIMD matmul (one row of all the blocks, 1 and 3 tokens)
// must read only their blocks and tables (ASan) and never crash; unsupported types must be a
// spool::Error. Values are not checked: any bit pattern is a valid block of these formats.
#include <cstdint>
#include <vector>

#include "common/error.h"
#include "common/ggml_types.h"
#include "ops/ggml_blocks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using spool::GgmlType;
  if (size < 1) return 0;
  const uint32_t id = data[0] % spool::kGgmlTypeCount;
  const spool::GgmlTypeTraits tr = spool::ggml_type_traits(id);
  if (tr.blck == 0) return 0;
  const auto t = static_cast<GgmlType>(id);
  const size_t blocks = (size - 1) / tr.size;
  if (blocks == 0 || blocks > 64) return 0;
  // A copy of exactly the blocks: reads past them are heap overflows ASan reports.
  const std::vector<uint8_t> bytes(data + 1, data + 1 + blocks * tr.size);
  const int64_t n = static_cast<int64_t>(blocks * tr.blck);
  std::vector<float> row(static_cast<size_t>(n));
  try {
    spool::ops::ggml_dequantize_row(t, bytes.data(), n, row.data());
  } catch (const spool::Error&) {
    return 0;  // unsupported type
  }
  spool::ops::GgmlView w{t, 1, n, bytes.data(), "fuzz"};
  for (int64_t T : {1, 3}) {
    std::vector<float> x(static_cast<size_t>(T * n), 0.5f), y(static_cast<size_t>(T));
    try {
      spool::ops::ggml_matmul(w, x.data(), T, y.data(), nullptr);
    } catch (const spool::Error&) {
    }
  }
  return 0;
}
